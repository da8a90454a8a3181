//! What an agent can reach of the gateway, and what outlives it: agents and
//! their terminal commands get a clean environment (the gateway's secrets
//! never reach them), cannot read the gateway's memory even as its own user,
//! and everything they start dies with their conversation, however it was
//! started (`setsid`, a double fork) and whenever its starter ends.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::common::*;
use acp_gateway::config::AgentProfile;
use serde_json::{json, Value};

/// Reports what the agent gets in `$REPORT_DIR` (its environment, whether it
/// could read its parent's — the gateway's — environment), with `$ESCAPE`
/// leaves processes running that left its process group or its tree (their
/// pids in `pids`), then becomes the agent (`"$@"`).
const WRAPPER: &str = r#"#!/bin/sh
report="$REPORT_DIR"
env > "$report/env"
cat "/proc/$PPID/environ" > /dev/null 2> "$report/environ.err"
echo $? > "$report/environ.status"
if [ -n "$ESCAPE" ]; then
    setsid sleep 1000 < /dev/null > /dev/null 2>&1 &
    echo $! >> "$report/pids"
    ( sleep 1000 < /dev/null > /dev/null 2>&1 & echo $! >> "$report/pids" )
    ( setsid sleep 1000 < /dev/null > /dev/null 2>&1 & echo $! >> "$report/pids" )
fi
exec "$@"
"#;

/// A terminal command leaving the same three behind, holding its output's
/// pipe open; it prints their pids and `started`, then waits for a line on
/// the FIFO `$1` if one is given, else forever.
const ESCAPING_COMMAND: &str = r#"setsid sleep 1000 &
echo $!
( sleep 1000 & echo $! )
( setsid sleep 1000 & echo $! )
echo started
if [ -n "$1" ]; then read line < "$1"; exit 0; fi
exec sleep 1000
"#;

/// Variables a shell sets itself (the wrapper's report is written by one).
const SHELL_SETS: &[&str] = &["PWD", "OLDPWD", "SHLVL", "_"];

/// A directory anyone may write in (agents may run as `nobody`).
fn report_dir() -> (tempfile::TempDir, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().canonicalize().unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777)).unwrap();
    let wrapper = path.join("wrapper.sh");
    std::fs::write(&wrapper, WRAPPER).unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    (dir, path)
}

/// The npm SDK agent (terminals offered) behind the wrapper, reporting in
/// `dir`.
fn wrapped_agent(name: &str, dir: &Path, escape: bool) -> AgentProfile {
    let node = node_sdk_profile(name);
    let mut args = vec![node.command.clone()];
    args.extend(node.args.iter().cloned());
    let mut env = BTreeMap::from([
        ("REPORT_DIR".to_owned(), dir.display().to_string()),
        ("FROM_PROFILE".to_owned(), "from the profile".to_owned()),
    ]);
    if escape {
        env.insert("ESCAPE".into(), "1".into());
    }
    AgentProfile {
        command: dir.join("wrapper.sh").display().to_string(),
        args,
        env,
        cwd: Some(dir.to_path_buf()),
        client_terminal: true,
        ..node
    }
}

fn parse_env(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|line| line.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

fn allowlisted(name: &str) -> bool {
    acp_gateway::process::spawn::ALLOWED.contains(&name)
        || name.starts_with(acp_gateway::process::spawn::ALLOWED_PREFIX)
        || BOX_SETS.contains(&name)
}

/// Variables the conversation's box sets (its home's), beyond `HOME` and
/// `TMPDIR`.
const BOX_SETS: &[&str] = &[
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
    "XDG_STATE_HOME",
    "XDG_CACHE_HOME",
    "CLAUDE_CODE_TMPDIR",
];

/// The pids the wrapper left running.
fn escaped_pids(dir: &Path) -> Vec<ProcessWatch> {
    let pids = std::fs::read_to_string(dir.join("pids")).unwrap();
    let watches: Vec<ProcessWatch> = pids
        .lines()
        .map(|pid| ProcessWatch::killing(pid.trim().parse().unwrap()))
        .collect();
    assert_eq!(watches.len(), 3, "{pids}");
    watches
}

/// What a terminal printed, from the conversation's events as `ws` (opened
/// from the start) brings them, until `marker` is in it.
async fn printed_until(ws: &mut Ws, terminal: &str, marker: &str) -> String {
    let mut text = String::new();
    while !text.contains(marker) {
        let event = ws.next().await;
        if event["type"] == "terminal_output" && event["data"]["terminal_id"] == terminal {
            text.push_str(event["data"]["output"].as_str().unwrap_or_default());
        }
    }
    text
}

/// The last event of a terminal: its end.
async fn terminal_end(ws: &mut Ws, terminal: &str) -> Value {
    let frames = ws
        .until(|e| {
            e["type"] == "terminal_output"
                && e["data"]["terminal_id"] == terminal
                && e["data"]["exit_status"].is_object()
        })
        .await;
    frames.last().unwrap()["data"]["exit_status"].clone()
}

/// The answers of the agent's `calls` turn (see tests/sdk-agents).
fn answers_of(frames: &[Value]) -> Vec<Value> {
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "end_turn");
    streamed_text(frames, "agent_message_chunk")
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

async fn calls_in_process(gw: &TestGateway, id: &str, ws: &mut Ws, calls: Value) -> Vec<Value> {
    gw.prompt(id, &format!("calls {calls}")).await;
    answers_of(&ws.until_type("turn_ended").await)
}

async fn calls_in(gw: &GatewayProcess, id: &str, ws: &mut Ws, calls: Value) -> Vec<Value> {
    let (status, body) = gw.try_prompt(id, &format!("calls {calls}")).await;
    assert_eq!(status, 202, "{body}");
    answers_of(&ws.until_type("turn_ended").await)
}

/// `env` as a terminal command, with a variable of its own.
fn env_command() -> Value {
    json!([
        ["terminal/create", {"command": "env",
                             "env": [{"name": "FROM_REQUEST", "value": "from the request"}]}],
        ["terminal/wait_for_exit", {"terminalId": "$terminal"}],
        ["terminal/output", {"terminalId": "$terminal"}],
    ])
}

async fn agents_and_their_terminal_commands_get_only_what_their_profile_gives(db: TestDb) {
    let (_dir, dir) = report_dir();
    // In process, the gateway's environment is this test's own: whatever
    // it holds beyond the allowlist (cargo's variables, a DATABASE_URL…)
    // must stay out, but for the one the profile passes on.
    let outside: Vec<(String, String)> = std::env::vars()
        .filter(|(name, value)| {
            !allowlisted(name) && !SHELL_SETS.contains(&name.as_str()) && !value.contains('\n')
        })
        .filter(|(name, _)| {
            name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && !name.starts_with(|c: char| c.is_ascii_digit())
        })
        .collect();
    assert!(
        outside.len() >= 2,
        "the test runs with variables beyond the allowlist: {outside:?}"
    );
    let (passed, passed_value) = outside[0].clone();
    let mut agent = wrapped_agent("clean", &dir, false);
    agent.pass_env = vec![passed.clone()];
    let profile_env = agent.env.clone();
    let gw = TestGateway::start(&db, vec![agent]).await;
    let (id, mut ws) = gw.open_conversation("clean").await;

    let expected = |name: &str, extra: &[&str]| {
        allowlisted(name)
            || profile_env.contains_key(name)
            || name == passed
            || extra.contains(&name)
    };
    let agent_env = parse_env(&std::fs::read_to_string(dir.join("env")).unwrap());
    for name in agent_env.keys() {
        assert!(
            expected(name, SHELL_SETS),
            "{name} reached the agent: {agent_env:?}"
        );
    }
    assert_eq!(agent_env["FROM_PROFILE"], "from the profile");
    assert_eq!(agent_env[&passed], passed_value);
    assert_eq!(agent_env.get("PATH"), std::env::var("PATH").ok().as_ref());
    // Its home is its user's, for this profile, in the gateway's state.
    let home = db.state_dir().join("homes/anonymous/clean");
    assert_eq!(Path::new(&agent_env["HOME"]), home);
    assert_eq!(Path::new(&agent_env["TMPDIR"]), home.join(".tmp"));

    let answers = calls_in_process(&gw, &id, &mut ws, env_command()).await;
    assert_eq!(answers[1]["result"]["exitCode"], 0, "{answers:?}");
    let terminal_env = parse_env(answers[2]["result"]["output"].as_str().unwrap());
    for name in terminal_env.keys() {
        assert!(
            expected(name, &["FROM_REQUEST"]),
            "{name} reached a terminal command: {terminal_env:?}"
        );
    }
    assert_eq!(terminal_env["FROM_REQUEST"], "from the request");
    assert_eq!(terminal_env["FROM_PROFILE"], "from the profile");
    assert_eq!(terminal_env[&passed], passed_value);
    assert_eq!(terminal_env["HOME"], agent_env["HOME"]);
}

async fn the_gateways_secrets_never_reach_its_agents_nor_can_they_read_its_memory(db: TestDb) {
    if !acp_gateway::sys::running_as_root() {
        eprintln!("skipping: only root can run the gateway as nobody");
        return;
    }
    let nobody = acp_gateway::sys::lookup_user("nobody").expect("a user nobody");
    let (_dir, dir) = report_dir();
    let mut agent = wrapped_agent("same-user", &dir, false);
    agent.pass_env = vec!["OPENAI_API_KEY".into()];
    // Agents run as the gateway's own user: nobody, like the gateway.
    let secrets = [
        ("DATABASE_URL", db.url.as_str()),
        ("POSTGRES_PASSWORD", "postgres-secret"),
        ("ACP_GATEWAY_TOKEN", "gateway-secret"),
    ];
    let mut env = secrets.to_vec();
    env.extend([
        ("OPENAI_API_KEY", "sk-passed-on"),
        ("LANG", "C.UTF-8"),
        ("LC_TIME", "C"),
        ("TZ", "UTC"),
    ]);
    let gw = GatewayProcess::launch(
        &db,
        &[agent],
        Launch {
            env: &env,
            user: Some(&nobody),
            ..Launch::default()
        },
    );
    let gateway_pid = gw.child.id();
    let id = gw.create("same-user").await;
    let mut ws = gw.conversation_ws(&id, 0).await;

    let agent_env = parse_env(&std::fs::read_to_string(dir.join("env")).unwrap());
    for name in secrets.map(|(name, _)| name).iter().chain(&["RUST_LOG"]) {
        assert!(
            !agent_env.contains_key(*name),
            "{name} reached the agent: {agent_env:?}"
        );
    }
    assert_eq!(agent_env["OPENAI_API_KEY"], "sk-passed-on");
    assert_eq!(agent_env["LANG"], "C.UTF-8");
    assert_eq!(agent_env["LC_TIME"], "C");
    assert_eq!(agent_env["TZ"], "UTC");
    assert_eq!(agent_env["FROM_PROFILE"], "from the profile");
    // Its parent is the gateway, of its own user, and still out of reach.
    let status = std::fs::read_to_string(dir.join("environ.status")).unwrap();
    let error = std::fs::read_to_string(dir.join("environ.err")).unwrap();
    assert_ne!(status.trim(), "0", "the agent read the gateway's environ");
    assert!(error.contains("Permission denied"), "{error}");

    // The same for a terminal command.
    let mut calls = env_command();
    calls.as_array_mut().unwrap().extend([
        json!(["terminal/create", {"command": "cat",
                                   "args": [format!("/proc/{gateway_pid}/environ")]}]),
        json!(["terminal/wait_for_exit", {"terminalId": "$terminal"}]),
        json!(["terminal/output", {"terminalId": "$terminal"}]),
    ]);
    let answers = calls_in(&gw, &id, &mut ws, calls).await;
    let terminal_env = parse_env(answers[2]["result"]["output"].as_str().unwrap());
    for (name, _) in secrets {
        assert!(
            !terminal_env.contains_key(name),
            "{name} reached a terminal command: {terminal_env:?}"
        );
    }
    assert_eq!(terminal_env["OPENAI_API_KEY"], "sk-passed-on");
    assert_eq!(terminal_env["FROM_REQUEST"], "from the request");
    assert_eq!(answers[4]["result"]["exitCode"], 1, "{answers:?}");
    let refused = answers[5]["result"]["output"].as_str().unwrap();
    assert!(refused.contains("Permission denied"), "{refused}");

    // The operator was told.
    let log = gw.stop();
    let warning = log
        .lines()
        .find(|line| line.contains("run as the gateway's own user"))
        .unwrap_or_else(|| panic!("no warning about agents of the gateway's user:\n{log}"));
    assert!(warning.contains("same-user"), "{warning}");
}

async fn what_an_agent_or_terminal_command_started_dies_with_its_conversation(db: TestDb) {
    let (_dir, dir) = report_dir();
    let gw = TestGateway::start(&db, vec![wrapped_agent("escaping", &dir, true)]).await;
    let (id, mut ws) = gw.open_conversation("escaping").await;
    // The agent left three processes: in a session of their own, orphaned
    // (double fork), both.
    let mut watches = escaped_pids(&dir);
    // A terminal command does the same, and runs on.
    let answers = calls_in_process(
        &gw,
        &id,
        &mut ws,
        json!([["terminal/create", {"command": "sh", "args": ["-c", ESCAPING_COMMAND]}]]),
    )
    .await;
    let terminal = answers[0]["result"]["terminalId"].as_str().unwrap();
    let mut replay = gw.conversation_ws(&id, 0).await;
    let printed = printed_until(&mut replay, terminal, "started\n").await;
    for pid in printed.lines().filter_map(|l| l.trim().parse().ok()) {
        watches.push(ProcessWatch::killing(pid));
    }
    assert_eq!(watches.len(), 6, "{printed}");
    assert!(watches.iter().all(|w| !w.has_ended()));

    let (status, _) = gw.delete(&format!("/api/v1/conversations/{id}")).await;
    assert_eq!(status, 204);
    for watch in &watches {
        assert!(
            watch.ended().await,
            "process {} outlived its conversation",
            watch.pid
        );
    }
    // The terminal's end was published, though its pipes were held open.
    let end = terminal_end(&mut replay, terminal).await;
    assert_eq!(end["signal"], "SIGKILL", "{end}");
}

async fn what_an_agent_or_terminal_command_leaves_behind_when_it_ends_is_killed(db: TestDb) {
    let (_dir, dir) = report_dir();
    // In the gateway's own process, which adopts what its children orphan.
    let gw = GatewayProcess::start(&db, &[wrapped_agent("escaping", &dir, true)]);
    let id = gw.create("escaping").await;
    let mut ws = gw.conversation_ws(&id, 0).await;
    let agents_own = escaped_pids(&dir);

    // A terminal command that ends (once told to) and leaves three behind,
    // which hold its output's pipe open.
    let fifo = dir.join("go");
    let c_fifo = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c_fifo.as_ptr(), 0o600) }, 0);
    let answers = calls_in(
        &gw,
        &id,
        &mut ws,
        json!([["terminal/create", {"command": "sh",
                                    "args": ["-c", ESCAPING_COMMAND, "sh", fifo]}]]),
    )
    .await;
    let terminal = answers[0]["result"]["terminalId"].as_str().unwrap();
    let mut replay = gw.conversation_ws(&id, 0).await;
    let printed = printed_until(&mut replay, terminal, "started\n").await;
    let left: Vec<ProcessWatch> = printed
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .map(ProcessWatch::killing)
        .collect();
    assert_eq!(left.len(), 3, "{printed}");
    // Go: opening the FIFO waits for the command to read it.
    let go = tokio::task::spawn_blocking(move || {
        std::fs::OpenOptions::new()
            .write(true)
            .open(&fifo)
            .map(drop)
    });
    tokio::time::timeout(WAIT, go)
        .await
        .expect("the command reads the FIFO")
        .unwrap()
        .unwrap();
    // Its end is published, and what it left is killed when it ends.
    let end = terminal_end(&mut replay, terminal).await;
    assert_eq!(end["exitCode"], 0, "{end}");
    for watch in &left {
        assert!(
            watch.ended().await,
            "process {} outlived its terminal command",
            watch.pid
        );
    }

    // The agent dies (as under an OOM killer): what it started goes with it.
    let record = agent_process_records(&db)
        .await
        .into_iter()
        .find(|r| r.conversation_id.to_string() == id)
        .expect("the conversation's agent is recorded");
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(record.pid, libc::SIGKILL) };
    for watch in &agents_own {
        assert!(
            watch.ended().await,
            "process {} outlived its agent",
            watch.pid
        );
    }
    let log = gw.stop();
    assert!(
        log.contains("killed processes an agent or a terminal command left behind"),
        "{log}"
    );
}

backend_tests!(
    agents_and_their_terminal_commands_get_only_what_their_profile_gives,
    the_gateways_secrets_never_reach_its_agents_nor_can_they_read_its_memory,
    what_an_agent_or_terminal_command_started_dies_with_its_conversation,
    what_an_agent_or_terminal_command_leaves_behind_when_it_ends_is_killed,
);
