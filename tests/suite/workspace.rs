//! Files and terminals through the gateway (`client_fs`, `client_terminal`),
//! asked for by the agent built on the official npm ACP SDK: offered only
//! where configured, kept inside the conversation's directory, under the
//! operator's deny policies, visible as events.

use std::path::{Path, PathBuf};

use crate::common::*;
use acp_gateway::config::AgentProfile;
use acp_gateway::model::PolicyRule;
use serde_json::{json, Value};

/// The SDK agent with files and terminals offered or not, in `cwd`.
fn agent(name: &str, cwd: &Path, fs: bool, terminal: bool) -> AgentProfile {
    AgentProfile {
        cwd: Some(cwd.to_path_buf()),
        client_fs: fs,
        client_terminal: terminal,
        ..node_sdk_profile(name)
    }
}

fn deny(name: &str, rule: Value) -> PolicyRule {
    let mut rule = rule;
    rule["name"] = json!(name);
    rule["decision"] = json!("deny");
    serde_json::from_value(rule).unwrap()
}

/// A workspace directory, resolved, and one outside it.
fn dirs() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    let work = root.join("work");
    let outside = root.join("outside");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    (dir, work, outside)
}

async fn gateway(db: &TestDb, agents: Vec<AgentProfile>, policies: Vec<PolicyRule>) -> TestGateway {
    let mut config = Config::for_tests(db, agents);
    config.policies = policies;
    TestGateway::start_with(config).await
}

/// Has the agent make `calls` ([method, params] pairs) of the gateway in
/// one turn; each one's answer: `{"result"}` or `{"error": {code, message}}`.
async fn agent_calls(gw: &TestGateway, id: &str, ws: &mut Ws, calls: Value) -> Vec<Value> {
    gw.prompt(id, &format!("calls {calls}")).await;
    let frames = ws.until_type("turn_ended").await;
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "end_turn");
    streamed_text(&frames, "agent_message_chunk")
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

fn error_of(answer: &Value) -> (i64, String) {
    let error = &answer["error"];
    assert!(error.is_object(), "expected an error: {answer}");
    (
        error["code"].as_i64().unwrap_or_default(),
        error["message"].as_str().unwrap_or_default().to_owned(),
    )
}

async fn files_and_terminals_are_offered_only_where_configured(db: TestDb) {
    let (_dir, work, _) = dirs();
    let gw = gateway(
        &db,
        vec![
            agent("plain", &work, false, false),
            agent("full", &work, true, true),
        ],
        Vec::new(),
    )
    .await;

    let (id, mut ws) = gw.open_conversation("plain").await;
    gw.prompt(&id, "capabilities").await;
    let offered: Value = serde_json::from_str(&streamed_text(
        &ws.until_type("turn_ended").await,
        "agent_message_chunk",
    ))
    .unwrap();
    assert_eq!(offered["fs"]["readTextFile"], false, "{offered}");
    assert_eq!(offered["fs"]["writeTextFile"], false, "{offered}");
    assert_eq!(offered["terminal"], false, "{offered}");
    // Not offered: not served, and nothing is written.
    let target = work.join("nope.txt");
    let answers = agent_calls(
        &gw,
        &id,
        &mut ws,
        json!([
            ["fs/write_text_file", {"path": target, "content": "x"}],
            ["fs/read_text_file", {"path": target}],
            ["terminal/create", {"command": "true"}],
        ]),
    )
    .await;
    for answer in &answers {
        assert_eq!(error_of(answer).0, -32601, "{answer}");
    }
    assert!(!target.exists());

    let (id, mut ws) = gw.open_conversation("full").await;
    gw.prompt(&id, "capabilities").await;
    let offered: Value = serde_json::from_str(&streamed_text(
        &ws.until_type("turn_ended").await,
        "agent_message_chunk",
    ))
    .unwrap();
    assert_eq!(offered["fs"]["readTextFile"], true, "{offered}");
    assert_eq!(offered["fs"]["writeTextFile"], true, "{offered}");
    assert_eq!(offered["terminal"], true, "{offered}");
}

async fn reads_and_writes_stay_inside_the_workspace_and_are_published(db: TestDb) {
    let (_dir, work, outside) = dirs();
    std::os::unix::fs::symlink(&outside, work.join("escape")).unwrap();
    std::fs::write(outside.join("secret.txt"), "outside\n").unwrap();
    let gw = gateway(
        &db,
        vec![agent("files", &work, true, false)],
        vec![deny(
            "no-env",
            json!({"kinds": ["edit", "read"], "paths": ["{cwd}/.env"]}),
        )],
    )
    .await;
    let (id, mut ws) = gw.open_conversation("files").await;
    let notes = work.join("notes.txt");
    let nested = work.join("src/new/mod.rs");
    let answers = agent_calls(
        &gw,
        &id,
        &mut ws,
        json!([
            ["fs/write_text_file", {"path": notes, "content": "one\ntwo\nthree\n"}],
            ["fs/write_text_file", {"path": notes, "content": "one\nTWO\nthree\n"}],
            ["fs/read_text_file", {"path": notes}],
            ["fs/read_text_file", {"path": notes, "line": 2, "limit": 1}],
            ["fs/write_text_file", {"path": nested, "content": "pub fn f() {}\n"}],
            ["fs/read_text_file", {"path": work.join("src/../notes.txt")}],
        ]),
    )
    .await;
    assert_eq!(answers[0]["result"], json!({}), "{answers:?}");
    assert_eq!(answers[1]["result"], json!({}), "{answers:?}");
    assert_eq!(answers[2]["result"]["content"], "one\nTWO\nthree\n");
    assert_eq!(answers[3]["result"]["content"], "TWO\n");
    assert_eq!(answers[4]["result"], json!({}), "{answers:?}");
    assert_eq!(answers[5]["result"]["content"], "one\nTWO\nthree\n");
    assert_eq!(std::fs::read_to_string(&nested).unwrap(), "pub fn f() {}\n");

    // Each write is an event with its diff, in order, and in the change list.
    let events = gw.events(&id).await;
    let written: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "file_written")
        .collect();
    assert_eq!(written.len(), 3, "{written:?}");
    assert_eq!(written[0]["data"]["path"], notes.display().to_string());
    let first = written[0]["data"]["diff"].as_str().unwrap();
    assert!(
        first.contains("--- /dev/null") && first.contains("+one\n+two\n+three\n"),
        "{first}"
    );
    let second = written[1]["data"]["diff"].as_str().unwrap();
    assert!(second.contains("-two\n+TWO\n"), "{second}");
    assert!(!second.contains("+one"), "{second}");
    let (status, files) = gw.get(&format!("/api/v1/conversations/{id}/files")).await;
    assert_eq!(status, 200, "{files}");
    let items = files["items"].as_array().unwrap();
    assert_eq!(items.len(), 3);
    assert_eq!(items[1]["diff"], written[1]["data"]["diff"]);
    assert_eq!(items[1]["seq"], written[1]["seq"]);
    assert_eq!(items[2]["path"], nested.display().to_string());
    let (_, page) = gw
        .get(&format!(
            "/api/v1/conversations/{id}/files?after={}&limit=1",
            items[0]["seq"]
        ))
        .await;
    assert_eq!(page["items"][0]["seq"], items[1]["seq"]);
    assert_eq!(page["next_cursor"], items[1]["seq"].to_string());

    // Escapes through `..`, through a symlink, and relative paths are refused
    // with the reason; a policy's deny too; nothing is touched.
    let answers = agent_calls(
        &gw,
        &id,
        &mut ws,
        json!([
            ["fs/read_text_file", {"path": work.join("../outside/secret.txt")}],
            ["fs/write_text_file", {"path": work.join("../outside/new.txt"), "content": "x"}],
            ["fs/read_text_file", {"path": work.join("escape/secret.txt")}],
            ["fs/write_text_file", {"path": work.join("escape/secret.txt"), "content": "pwned"}],
            ["fs/write_text_file", {"path": "relative.txt", "content": "x"}],
            ["fs/write_text_file", {"path": work.join(".env"), "content": "TOKEN=1"}],
            ["fs/read_text_file", {"path": work.join("missing.txt")}],
            ["fs/read_text_file", {"path": notes, "sessionId": "sess_someone_else"}],
        ]),
    )
    .await;
    let (code, message) = error_of(&answers[0]);
    assert_eq!(code, -32602);
    assert!(
        message.contains("outside the conversation's directory"),
        "{message}"
    );
    assert!(
        error_of(&answers[1]).1.contains("outside"),
        "{:?}",
        answers[1]
    );
    let (_, message) = error_of(&answers[2]);
    assert!(
        message.contains(&outside.join("secret.txt").display().to_string()),
        "{message}"
    );
    assert!(
        error_of(&answers[3]).1.contains("outside"),
        "{:?}",
        answers[3]
    );
    assert!(
        error_of(&answers[4]).1.contains("not an absolute path"),
        "{:?}",
        answers[4]
    );
    let (_, message) = error_of(&answers[5]);
    assert!(
        message.contains("refused by the operator's policy"),
        "{message}"
    );
    assert_eq!(error_of(&answers[6]).0, -32002, "{:?}", answers[6]);
    assert!(
        error_of(&answers[7]).1.contains("session"),
        "{:?}",
        answers[7]
    );
    assert_eq!(
        std::fs::read_to_string(outside.join("secret.txt")).unwrap(),
        "outside\n"
    );
    assert!(!outside.join("new.txt").exists());
    assert!(!work.join(".env").exists());
    let (_, files) = gw.get(&format!("/api/v1/conversations/{id}/files")).await;
    assert_eq!(files["items"].as_array().unwrap().len(), 3);
}

/// The probe that read outside 85 times in 400 and wrote there 50 times,
/// leaving temporary files, while `file_written` named the inside path:
/// the agent reads and writes through symlinks retargeted, and through a
/// directory and a file exchanged with symlinks out, all along.
async fn a_symlink_swapped_while_the_agent_reads_and_writes_never_leads_outside(db: TestDb) {
    const ROUNDS: usize = 300;
    let (_dir, work, outside) = dirs();
    let gw = gateway(&db, vec![agent("files", &work, true, false)], Vec::new()).await;
    let (id, mut ws) = gw.open_conversation("files").await;
    let flipping = Flipping::start(&work, &outside);
    let mut calls = Vec::new();
    for round in 0..ROUNDS {
        for path in flipping.reads() {
            calls.push(json!(["fs/read_text_file", {"path": path}]));
        }
        for (path, content) in flipping.writes(round) {
            calls.push(json!(["fs/write_text_file", {"path": path, "content": content}]));
        }
    }
    // In turns of 200 calls: a prompt is a request body, bounded.
    let mut answers = Vec::new();
    for batch in calls.chunks(200) {
        answers.extend(agent_calls(&gw, &id, &mut ws, Value::Array(batch.to_vec())).await);
    }
    flipping.assert_outside_untouched();
    let outside_left = flipping.outside.clone();
    let flips = flipping.stop();

    assert_eq!(answers.len(), calls.len());
    let (mut through, mut refused, mut writes_through) = (0, 0, 0);
    for (call, answer) in calls.iter().zip(&answers) {
        if answer.get("error").is_some() {
            let (_, message) = error_of(answer);
            assert!(message.contains("outside"), "{call}: {answer}");
            refused += 1;
        } else if call[0] == "fs/read_text_file" {
            assert_eq!(
                answer["result"]["content"], "inside\n",
                "{call}: read outside"
            );
            through += 1;
        } else {
            assert_eq!(answer["result"], json!({}), "{answer}");
            through += 1;
            writes_through += 1;
        }
    }
    // Every write published names the file it wrote, inside.
    let events = gw.events(&id).await;
    let written: Vec<&str> = events
        .iter()
        .filter(|e| e["type"] == "file_written")
        .map(|e| e["data"]["path"].as_str().unwrap())
        .collect();
    assert_eq!(written.len(), writes_through);
    for path in written {
        assert!(Path::new(path).starts_with(&work), "{path}");
        assert!(!Path::new(path).starts_with(&outside_left), "{path}");
    }
    assert!(
        through > 0,
        "nothing got through ({refused} refused, {flips} flips)"
    );
}

/// The probe that wedged a conversation: a named pipe nobody writes, read
/// and written through fs/*. Refused at once, and the conversation goes on.
async fn a_fifo_is_refused_at_once_and_the_conversation_goes_on(db: TestDb) {
    let (_dir, work, _) = dirs();
    let pipe = work.join("pipe");
    let c = std::ffi::CString::new(pipe.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let gw = gateway(&db, vec![agent("files", &work, true, false)], Vec::new()).await;
    let (id, mut ws) = gw.open_conversation("files").await;
    let answers = agent_calls(
        &gw,
        &id,
        &mut ws,
        json!([
            ["fs/read_text_file", {"path": pipe}],
            ["fs/read_text_file", {"path": pipe, "line": 1, "limit": 1}],
            ["fs/write_text_file", {"path": pipe, "content": "x"}],
            ["fs/write_text_file", {"path": work.join("after.txt"), "content": "fine\n"}],
            ["fs/read_text_file", {"path": work.join("after.txt")}],
        ]),
    )
    .await;
    for answer in &answers[..3] {
        let (code, message) = error_of(answer);
        assert_eq!(code, -32602, "{answer}");
        assert!(
            message.contains("is a named pipe (FIFO): only regular files are read and written"),
            "{message}"
        );
    }
    assert_eq!(answers[4]["result"]["content"], "fine\n");
    let meta = std::fs::symlink_metadata(&pipe).unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_fifo(&meta.file_type()));
    let (status, _) = gw.delete(&format!("/api/v1/conversations/{id}")).await;
    assert_eq!(status, 204);
}

/// `peek -> secret` inside the cwd does not get a file request past a
/// `{cwd}/secret/**` deny, however the path is spelled.
async fn a_deny_on_a_directory_is_not_evaded_through_a_symlink_to_it(db: TestDb) {
    let (_dir, work, _) = dirs();
    std::fs::create_dir(work.join("secret")).unwrap();
    std::fs::write(work.join("secret/key.txt"), "KEY\n").unwrap();
    std::os::unix::fs::symlink("secret", work.join("peek")).unwrap();
    std::os::unix::fs::symlink(work.join("secret/key.txt"), work.join("key-link")).unwrap();
    std::os::unix::fs::symlink("secret/later.txt", work.join("dangling")).unwrap();
    let gw = gateway(
        &db,
        vec![agent("files", &work, true, false)],
        vec![deny("no-secrets", json!({"paths": ["{cwd}/secret/**"]}))],
    )
    .await;
    let (id, mut ws) = gw.open_conversation("files").await;
    let answers = agent_calls(
        &gw,
        &id,
        &mut ws,
        json!([
            ["fs/read_text_file", {"path": work.join("peek/key.txt")}],
            ["fs/read_text_file", {"path": work.join("key-link")}],
            ["fs/read_text_file", {"path": work.join("secret/../peek/key.txt")}],
            ["fs/write_text_file", {"path": work.join("peek/key.txt"), "content": "pwned"}],
            ["fs/write_text_file", {"path": work.join("peek/new.txt"), "content": "x"}],
            ["fs/write_text_file", {"path": work.join("dangling"), "content": "x"}],
            ["fs/write_text_file", {"path": work.join("key-link"), "content": "pwned"}],
            ["fs/write_text_file", {"path": work.join("public.txt"), "content": "ok\n"}],
        ]),
    )
    .await;
    for answer in &answers[..7] {
        let (_, message) = error_of(answer);
        assert!(
            message.contains("refused by the operator's policy"),
            "{answer}"
        );
        assert_eq!(answer["error"]["code"], -32602, "{answer}");
    }
    assert_eq!(answers[7]["result"], json!({}));
    assert_eq!(
        std::fs::read_to_string(work.join("secret/key.txt")).unwrap(),
        "KEY\n"
    );
    let mut secret: Vec<_> = std::fs::read_dir(work.join("secret"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    secret.sort();
    assert_eq!(secret, ["key.txt"]);
}

async fn terminals_run_under_policy_are_published_and_die_with_the_conversation(db: TestDb) {
    let (_dir, work, _) = dirs();
    let gw = gateway(
        &db,
        vec![agent("term", &work, false, true)],
        vec![deny(
            "no-rm",
            json!({"kinds": ["execute"], "commands": ["^rm\\b"]}),
        )],
    )
    .await;
    let (id, mut ws) = gw.open_conversation("term").await;
    let answers = agent_calls(
        &gw,
        &id,
        &mut ws,
        json!([
            ["terminal/create", {"command": "sh", "args": ["-c", "printf 'héllo wörld'; exit 3"],
                                 "outputByteLimit": 4}],
            ["terminal/wait_for_exit", {"terminalId": "$terminal"}],
            ["terminal/output", {"terminalId": "$terminal"}],
            ["terminal/release", {"terminalId": "$terminal"}],
            ["terminal/output", {"terminalId": "$terminal"}],
            ["terminal/create", {"command": "sleep", "args": ["1000"]}],
            ["terminal/kill", {"terminalId": "$terminal"}],
            ["terminal/wait_for_exit", {"terminalId": "$terminal"}],
            ["terminal/create", {"command": "rm", "args": ["-rf", work]}],
            ["terminal/create", {"command": "sh", "args": ["-c", "rm -rf /tmp/nothing-here"]}],
        ]),
    )
    .await;
    let terminal = answers[0]["result"]["terminalId"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(answers[1]["result"]["exitCode"], 3, "{answers:?}");
    // The last 4 bytes, cut forward to a character boundary: "ö" is split.
    assert_eq!(answers[2]["result"]["output"], "rld", "{answers:?}");
    assert_eq!(answers[2]["result"]["truncated"], true);
    assert_eq!(answers[2]["result"]["exitStatus"]["exitCode"], 3);
    assert_eq!(answers[3]["result"], json!({}));
    assert_eq!(
        error_of(&answers[4]).0,
        -32002,
        "released: {:?}",
        answers[4]
    );
    assert_eq!(answers[7]["result"]["signal"], "SIGKILL", "{answers:?}");
    let (_, message) = error_of(&answers[8]);
    assert!(
        message.contains("refused by the operator's policy"),
        "{message}"
    );
    assert!(work.exists());
    // Parsed as execute tool calls are: the command inside `sh -c` too.
    assert!(
        error_of(&answers[9]).1.contains("no-rm") || error_of(&answers[9]).1.contains("policy")
    );

    // The phone saw it: what ran, all its output, how it ended.
    let events = gw.events(&id).await;
    let of_first: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "terminal_output" && e["data"]["terminal_id"] == terminal)
        .collect();
    assert_eq!(
        of_first[0]["data"]["command"],
        json!(["sh", "-c", "printf 'héllo wörld'; exit 3"])
    );
    assert_eq!(of_first[0]["data"]["cwd"], work.display().to_string());
    let output: String = of_first
        .iter()
        .filter_map(|e| e["data"]["output"].as_str())
        .collect();
    assert_eq!(output, "héllo wörld");
    assert_eq!(
        of_first.last().unwrap()["data"]["exit_status"]["exitCode"],
        3
    );

    // A terminal still running when the conversation is deleted is killed.
    let (_, sleeper) = sleeping_terminal(&gw, &id, &mut ws).await;
    assert!(!sleeper.has_ended());
    let (status, _) = gw.delete(&format!("/api/v1/conversations/{id}")).await;
    assert_eq!(status, 204);
    assert!(
        sleeper.ended().await,
        "the terminal's process outlived its conversation"
    );
}

async fn a_running_terminal_dies_with_its_agent(db: TestDb) {
    let (_dir, work, _) = dirs();
    let gw = gateway(&db, vec![agent("term", &work, false, true)], vec![]).await;
    let (id, mut ws) = gw.open_conversation("term").await;
    let (terminal, sleeper) = sleeping_terminal(&gw, &id, &mut ws).await;

    // The agent dies (as under an OOM killer); its terminal goes with it.
    let record = agent_process_records(&db)
        .await
        .into_iter()
        .find(|r| r.conversation_id.to_string() == id)
        .expect("the conversation's agent is recorded");
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(record.pid, libc::SIGKILL) };
    assert!(
        sleeper.ended().await,
        "the terminal's process outlived its agent"
    );
    // Its end is published: killed.
    let ended = ws
        .until(|e| {
            e["type"] == "terminal_output"
                && e["data"]["terminal_id"] == terminal
                && e["data"]["exit_status"].is_object()
        })
        .await;
    assert_eq!(
        ended.last().unwrap()["data"]["exit_status"]["signal"],
        "SIGKILL"
    );
}

/// Has the agent start a terminal that sleeps; its id and its process.
async fn sleeping_terminal(gw: &TestGateway, id: &str, ws: &mut Ws) -> (String, ProcessWatch) {
    let answers = agent_calls(
        gw,
        id,
        ws,
        json!([["terminal/create", {"command": "sh", "args": ["-c", "echo $$; exec sleep 1000"]}]]),
    )
    .await;
    let terminal = answers[0]["result"]["terminalId"]
        .as_str()
        .unwrap()
        .to_owned();
    let pid = terminal_pid(gw, id, ws, &terminal).await;
    (terminal, ProcessWatch::new(pid))
}

/// The pid a terminal running `echo $$; exec ...` printed first, published
/// before or after its turn ended.
async fn terminal_pid(gw: &TestGateway, id: &str, ws: &mut Ws, terminal: &str) -> i32 {
    let printed = |events: &[Value]| -> String {
        events
            .iter()
            .filter(|e| e["type"] == "terminal_output" && e["data"]["terminal_id"] == terminal)
            .filter_map(|e| e["data"]["output"].as_str())
            .collect()
    };
    let mut pid = printed(&gw.events(id).await);
    if !pid.ends_with('\n') {
        let more = ws
            .until(|e| {
                e["type"] == "terminal_output"
                    && e["data"]["output"]
                        .as_str()
                        .is_some_and(|o| o.ends_with('\n'))
            })
            .await;
        pid.push_str(&printed(&more));
    }
    pid.trim().parse().unwrap()
}

backend_tests!(
    files_and_terminals_are_offered_only_where_configured,
    reads_and_writes_stay_inside_the_workspace_and_are_published,
    terminals_run_under_policy_are_published_and_die_with_the_conversation,
    a_running_terminal_dies_with_its_agent,
    a_symlink_swapped_while_the_agent_reads_and_writes_never_leads_outside,
    a_fifo_is_refused_at_once_and_the_conversation_goes_on,
    a_deny_on_a_directory_is_not_evaded_through_a_symlink_to_it,
);
