//! Each conversation in its own box: two users on one profile, their agents
//! (the npm SDK agent, reading, writing and running things *itself* with
//! its `probe` scenario) and their terminal commands confined by Landlock to
//! their own workspace, home and `TMPDIR`; `sandbox = "off"` as before; and
//! a kernel without Landlock (the kernel's answer simulated with a seccomp
//! filter) refusing `required` profiles and warning for `auto` ones.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::common::*;
use acp_gateway::config::AgentProfile;
use acp_gateway::sandbox::SandboxMode;
use serde_json::{json, Value};

/// A directory the agents' user may traverse, holding the users'
/// workspaces (`work/<user>`, made by the gateway) and a place that is no
/// one's (`outside`).
struct Ground {
    _dir: tempfile::TempDir,
    base: PathBuf,
}

impl Ground {
    fn new() -> Ground {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().canonicalize().unwrap();
        for sub in ["work", "outside", "shared"] {
            std::fs::create_dir(base.join(sub)).unwrap();
        }
        std::fs::write(base.join("shared/readme"), "for everyone\n").unwrap();
        for dir in [&base, &base.join("work"), &base.join("shared")] {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        std::fs::set_permissions(base.join("outside"), std::fs::Permissions::from_mode(0o777))
            .unwrap();
        Ground { _dir: dir, base }
    }

    fn work(&self, user: &str) -> PathBuf {
        self.base.join("work").join(user)
    }
}

/// The agents' user: `nobody` where the tests run as root, so that alice's
/// and bob's agents are one system user and only the box keeps them apart.
pub(crate) fn agents_user() -> Option<String> {
    acp_gateway::sys::running_as_root().then(|| "nobody".to_owned())
}

/// The npm SDK agent in a box per user: `cwd` and `allowed_roots` are
/// `<base>/work/{user}`.
fn boxed(name: &str, ground: &Ground, sandbox: SandboxMode) -> AgentProfile {
    let mut read_only_paths = node_sdk_profile(name).read_only_paths;
    read_only_paths.push(ground.base.join("shared"));
    AgentProfile {
        cwd: Some(ground.base.join("work/{user}")),
        allowed_roots: vec![ground.base.join("work/{user}")],
        user: agents_user(),
        client_terminal: true,
        sandbox,
        read_only_paths,
        ..node_sdk_profile(name)
    }
}

/// The JSON lines the agent says in a turn of `prompt` (its `probe` and
/// `calls` scenarios answer one per step), the turn ended `end_turn`.
pub(crate) async fn lines_of_turn(client: &Client, id: &str, prompt: &str) -> Vec<Value> {
    let mut ws = client.conversation_ws(id, 0).await;
    let turn = client.prompt(id, prompt).await;
    let ours = |e: &Value| e["turn_id"] == turn.as_str() || e["data"]["turn_id"] == turn.as_str();
    let frames: Vec<Value> = ws
        .until(|e| e["type"] == "turn_ended" && e["data"]["turn_id"] == turn.as_str())
        .await
        .into_iter()
        .filter(ours)
        .collect();
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "end_turn");
    streamed_text(&frames, "agent_message_chunk")
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// What the agent found, step by step, doing them itself (`probe`).
pub(crate) async fn probe(client: &Client, id: &str, steps: Value) -> Vec<Value> {
    let lines = lines_of_turn(client, id, &format!("probe {steps}")).await;
    assert_eq!(lines.len(), steps.as_array().unwrap().len(), "{lines:?}");
    lines
}

/// The agent's requests of the gateway (`calls`), their answers.
pub(crate) async fn calls(client: &Client, id: &str, calls: Value) -> Vec<Value> {
    lines_of_turn(client, id, &format!("calls {calls}")).await
}

pub(crate) fn allowed(line: &Value) {
    assert_eq!(line["ok"], true, "refused, but should not be: {line}");
}

pub(crate) fn denied(line: &Value) {
    assert_eq!(line["ok"], false, "allowed, but should not be: {line}");
    assert_eq!(line["code"], "EACCES", "{line}");
}

pub(crate) async fn conversation_of(client: &Client, agent: &str) -> (String, Value) {
    let (status, body) = client
        .post("/api/v1/conversations", json!({"agent": agent}))
        .await;
    assert_eq!(status, 201, "{body}");
    (body["id"].as_str().unwrap().to_owned(), body)
}

async fn one_users_agent_cannot_reach_another_users_work(db: TestDb) {
    if acp_gateway::sandbox::landlock::kernel_abi().is_none() {
        eprintln!("skipping: this kernel has no Landlock (a kernel without it is simulated below)");
        return;
    }
    let ground = Ground::new();
    std::fs::set_permissions(db.state_dir(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let alice_token = cli_token(&db, "alice", "user");
    let bob_token = cli_token(&db, "bob", "user");
    let gw = TestGateway::start(
        &db,
        vec![
            boxed("boxed", &ground, SandboxMode::Auto),
            boxed("open", &ground, SandboxMode::Off),
        ],
    )
    .await;
    let (alice, bob) = (gw.with_token(&alice_token), gw.with_token(&bob_token));

    // Each has a workspace of their own, made on first use.
    let (bobs, body) = conversation_of(&bob, "boxed").await;
    assert_eq!(body["cwd"], ground.work("bob").display().to_string());
    let (alices, body) = conversation_of(&alice, "boxed").await;
    assert_eq!(body["cwd"], ground.work("alice").display().to_string());
    let homes = db.state_dir().join("homes");
    let (alice_home, bob_home) = (homes.join("alice/boxed"), homes.join("bob/boxed"));

    // Bob's agent keeps things in his workspace and his home.
    let found = probe(
        &bob,
        &bobs,
        json!([
            ["write", ground.work("bob").join("plan.md"), "bob's plan"],
            ["env", "HOME"],
            ["write", bob_home.join("transcript.jsonl"), "bob's history"],
            ["read", ground.work("bob").join("plan.md")],
        ]),
    )
    .await;
    found.iter().for_each(allowed);
    assert_eq!(found[1]["value"], bob_home.display().to_string());
    assert_eq!(found[3]["value"], "bob's plan");

    // Alice's agent: its own box, and nothing of bob's.
    let db_file = db.url.strip_prefix("sqlite://").map(PathBuf::from);
    let tmp = alice_home.join(".tmp");
    let mut steps = vec![
        // Its workspace, its home and its TMPDIR are its own.
        json!(["write", ground.work("alice").join("notes.md"), "alice's"]),
        json!(["write", alice_home.join("settings.json"), "{}"]),
        json!(["env", "TMPDIR"]),
        json!(["write", tmp.join("scratch"), "x"]),
        // The system: read, and programs run.
        json!(["list", "/usr"]),
        json!(["read", "/etc/passwd"]),
        json!(["run", "/bin/sh", "-c", "echo ran"]),
        // A read-only path of the profile's.
        json!(["read", ground.base.join("shared/readme")]),
        // Bob's workspace and home: neither read nor listed nor written.
        json!(["read", ground.work("bob").join("plan.md")]),
        json!(["list", ground.work("bob")]),
        json!(["write", ground.work("bob").join("plan.md"), "mine now"]),
        json!(["read", bob_home.join("transcript.jsonl")]),
        json!(["list", homes.join("bob")]),
        // Nowhere else to write: not the shared /tmp, not a place that is no
        // one's, not the system, not what it may only read.
        json!(["write", "/tmp/acp-gateway-sandbox-test", "x"]),
        json!(["write", ground.base.join("outside/x"), "x"]),
        json!(["write", "/etc/acp-gateway-sandbox-test", "x"]),
        json!(["write", ground.base.join("shared/readme"), "x"]),
        // What it runs is in its box too.
        json!(["run", "/bin/cat", ground.work("bob").join("plan.md")]),
    ];
    if let Some(file) = &db_file {
        // Not the gateway's database either.
        steps.push(json!(["read", file]));
    }
    let found = probe(&alice, &alices, json!(steps)).await;
    for line in &found[..8] {
        allowed(line);
    }
    assert_eq!(found[2]["value"], tmp.display().to_string());
    assert_eq!(found[6]["value"], "ran\n");
    for line in &found[8..17] {
        denied(line);
    }
    assert_eq!(found[17]["ok"], false, "{}", found[17]);
    assert!(
        found[17]["stderr"]
            .as_str()
            .unwrap()
            .contains("Permission denied"),
        "{}",
        found[17]
    );
    if db_file.is_some() {
        denied(&found[18]);
    }
    assert_eq!(
        std::fs::read_to_string(ground.work("bob").join("plan.md")).unwrap(),
        "bob's plan"
    );
    assert!(!ground.base.join("outside/x").exists());
    assert!(!Path::new("/tmp/acp-gateway-sandbox-test").exists());

    // Its terminal commands: the same box.
    let answers = calls(
        &alice,
        &alices,
        json!([
            ["terminal/create", {"command": "cat", "args": [ground.work("bob").join("plan.md")]}],
            ["terminal/wait_for_exit", {"terminalId": "$terminal"}],
            ["terminal/output", {"terminalId": "$terminal"}],
            ["terminal/create", {"command": "sh", "args": ["-c",
                format!("echo made > {}/made-by-terminal && cat {}/notes.md && ls /usr > /dev/null && echo $HOME",
                    ground.work("alice").display(), ground.work("alice").display())]}],
            ["terminal/wait_for_exit", {"terminalId": "$terminal"}],
            ["terminal/output", {"terminalId": "$terminal"}],
            ["terminal/create", {"command": "sh", "args": ["-c",
                format!("echo x > {}/outside/from-terminal", ground.base.display())]}],
            ["terminal/wait_for_exit", {"terminalId": "$terminal"}],
        ]),
    )
    .await;
    assert_eq!(answers[1]["result"]["exitCode"], 1, "{answers:?}");
    let output = answers[2]["result"]["output"].as_str().unwrap();
    assert!(output.contains("Permission denied"), "{output}");
    assert_eq!(answers[4]["result"]["exitCode"], 0, "{answers:?}");
    assert_eq!(
        answers[5]["result"]["output"],
        format!("alice's{}\n", alice_home.display())
    );
    assert_ne!(answers[7]["result"]["exitCode"], 0, "{answers:?}");
    assert!(!ground.base.join("outside/from-terminal").exists());

    // sandbox = "off": as before boxes, it reaches what its user may.
    let (open, body) = conversation_of(&alice, "open").await;
    assert_eq!(body["cwd"], ground.work("alice").display().to_string());
    let found = probe(
        &alice,
        &open,
        json!([
            ["read", ground.work("bob").join("plan.md")],
            ["env", "HOME"],
            ["write", ground.base.join("outside/open"), "x"],
        ]),
    )
    .await;
    found.iter().for_each(allowed);
    assert_eq!(found[0]["value"], "bob's plan");
    assert!(!Path::new(found[1]["value"].as_str().unwrap()).starts_with(&homes));
    assert!(!homes.join("alice/open").exists());

    // How each profile is boxed, as clients see it.
    let shown = agents_by_name(&alice).await;
    let sandbox_of = |name: &str| shown[name]["sandbox"].clone();
    let abi = acp_gateway::sandbox::landlock::kernel_abi().unwrap();
    let boxed = sandbox_of("boxed");
    assert_eq!(
        (&boxed["mode"], &boxed["enforced"], &boxed["landlock_abi"]),
        (&json!("auto"), &json!(true), &json!(abi)),
        "{boxed}"
    );
    // What it grants: the system, the profile's paths ({user} as written),
    // and each conversation's own directory and home.
    let read_only = boxed["read_only"].as_array().unwrap();
    for path in ["/usr", "/etc", "/proc"] {
        assert!(read_only.contains(&json!(path)), "{boxed}");
    }
    assert!(
        read_only.contains(&json!(ground.base.join("shared"))),
        "{boxed}"
    );
    let read_write = boxed["read_write"].as_array().unwrap();
    assert_eq!(
        read_write[..2],
        [json!("{cwd}"), json!("{home}")],
        "{boxed}"
    );
    assert!(!read_only.contains(&json!("/tmp")) && !read_write.contains(&json!("/tmp")));
    assert_eq!(sandbox_of("open")["enforced"], false);
    // Nothing is granted where there is no box.
    assert!(sandbox_of("open").get("read_only").is_none());
    gw.stop().await;
}

/// `allowed_tcp_ports`: connections go to those ports alone (where the
/// kernel's Landlock can say so).
async fn an_agents_connections_go_only_to_its_allowed_ports(db: TestDb) {
    let Some(abi) = acp_gateway::sandbox::landlock::kernel_abi() else {
        eprintln!("skipping: this kernel has no Landlock");
        return;
    };
    if abi < acp_gateway::sandbox::NET_ABI {
        eprintln!("skipping: this kernel's Landlock cannot limit TCP ports");
        return;
    }
    let ground = Ground::new();
    std::fs::set_permissions(db.state_dir(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let open = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let (open_port, closed_port) = (
        open.local_addr().unwrap().port(),
        closed.local_addr().unwrap().port(),
    );
    let profile = AgentProfile {
        allowed_tcp_ports: Some(vec![open_port]),
        ..boxed("ported", &ground, SandboxMode::Required)
    };
    let gw = TestGateway::start(&db, vec![profile]).await;
    let (id, _) = conversation_of(&gw, "ported").await;
    let found = probe(
        &gw,
        &id,
        json!([
            ["connect", "127.0.0.1", open_port],
            ["connect", "127.0.0.1", closed_port],
        ]),
    )
    .await;
    allowed(&found[0]);
    denied(&found[1]);
    let (_, agents) = gw.get("/api/v1/agents").await;
    assert_eq!(agents["items"][0]["sandbox"]["tcp_ports_enforced"], true);
    gw.stop().await;
}

/// Every item of `GET /api/v1/agents`, by name.
pub(crate) async fn agents_by_name(client: &Client) -> std::collections::BTreeMap<String, Value> {
    let (status, agents) = client.get("/api/v1/agents").await;
    assert_eq!(status, 200, "{agents}");
    agents["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| (a["name"].as_str().unwrap().to_owned(), a.clone()))
        .collect()
}

/// On a kernel without Landlock (its answer simulated): a `required`
/// profile's agents never start, neither for a new conversation nor for a
/// prompt that would start one again, and clients are told why; an `auto`
/// profile's run unconfined, and the operator was warned.
async fn without_landlock_required_refuses_and_auto_warns(db: TestDb) {
    let ground = Ground::new();
    std::fs::set_permissions(db.state_dir(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let agents = [demo_profile("strict", &[]), demo_profile("lenient", &[])];
    let [mut strict, lenient] = agents;
    strict.sandbox = SandboxMode::Required;
    strict.cwd = Some(ground.work("any"));
    std::fs::create_dir(ground.work("any")).unwrap();
    let agents = [strict, lenient];

    // Where the kernel has Landlock, the strict profile's conversation starts.
    let mut earlier = None;
    if acp_gateway::sandbox::landlock::kernel_abi().is_some() {
        let gw = GatewayProcess::start(&db, &agents);
        let (id, _) = conversation_of(&gw, "strict").await;
        earlier = Some(id);
        let (status, _) = gw.interrupt();
        assert!(status.success());
    }

    let gw = GatewayProcess::launch(
        &db,
        &agents,
        Launch {
            no_landlock: true,
            ..Launch::default()
        },
    );
    let shown = agents_by_name(&gw).await;
    let strict = &shown["strict"];
    assert_eq!(strict["available"], false, "{strict}");
    assert!(
        strict["unavailable_reason"]
            .as_str()
            .unwrap()
            .contains("Landlock"),
        "{strict}"
    );
    assert_eq!(strict["sandbox"]["enforced"], false);
    assert!(strict["sandbox"].get("landlock_abi").is_none(), "{strict}");
    let lenient = &shown["lenient"];
    assert_eq!(lenient["available"], true, "{lenient}");
    assert_eq!(lenient["sandbox"]["enforced"], false);

    let problem = assert_problem(
        gw.post("/api/v1/conversations", json!({"agent": "strict"}))
            .await,
        502,
        "Landlock",
    );
    assert!(
        problem["detail"].as_str().unwrap().contains("required"),
        "{problem}"
    );
    if let Some(id) = earlier {
        // Its agent was stopped with the last gateway; starting it again
        // is refused the same way.
        assert_problem(gw.try_prompt(&id, "hello").await, 502, "Landlock");
    }
    // No agent of the strict profile ever started here.
    assert!(agent_process_records(&db).await.is_empty());

    // The lenient one runs, unconfined.
    let (id, _) = conversation_of(&gw, "lenient").await;
    let mut ws = gw.conversation_ws(&id, 0).await;
    gw.prompt(&id, "hello").await;
    let frames = ws.until_type("turn_ended").await;
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "end_turn");

    let (status, log) = gw.interrupt();
    assert!(status.success(), "{log}");
    let warned = |agent: &str, says: &str| {
        log.lines()
            .any(|line| line.contains(agent) && line.contains(says))
    };
    assert!(warned("strict", "will not start"), "{log}");
    assert!(warned("lenient", "not all it asks"), "{log}");
}

/// A profile's `home_template` is each user's home's first content; what
/// the agent then keeps there stays, and is that user's alone.
async fn each_users_home_starts_from_the_template(db: TestDb) {
    let ground = Ground::new();
    std::fs::set_permissions(db.state_dir(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let template = ground.base.join("template");
    std::fs::create_dir_all(template.join(".agent")).unwrap();
    std::fs::write(template.join(".agent/credentials"), "operator's key").unwrap();
    let alice_token = cli_token(&db, "alice", "user");
    let profile = AgentProfile {
        home_template: Some(template.clone()),
        ..boxed("templated", &ground, SandboxMode::Auto)
    };
    let gw = TestGateway::start(&db, vec![profile]).await;
    let alice = gw.with_token(&alice_token);
    let (id, _) = conversation_of(&alice, "templated").await;
    let home = db.state_dir().join("homes/alice/templated");
    let found = probe(
        &alice,
        &id,
        json!([
            ["read", home.join(".agent/credentials")],
            ["write", home.join(".agent/history"), "alice's"],
            ["env", "XDG_CONFIG_HOME"],
        ]),
    )
    .await;
    found.iter().for_each(allowed);
    assert_eq!(found[0]["value"], "operator's key");
    assert_eq!(
        found[2]["value"],
        home.join(".config").display().to_string()
    );
    // A second conversation finds what the first kept.
    let (second, _) = conversation_of(&alice, "templated").await;
    let found = probe(
        &alice,
        &second,
        json!([["read", home.join(".agent/history")]]),
    )
    .await;
    assert_eq!(found[0]["value"], "alice's");
    // The template itself is untouched.
    assert!(!template.join(".agent/history").exists());
    if let Some(user) = agents_user() {
        use std::os::unix::fs::MetadataExt;
        let nobody = acp_gateway::sys::lookup_user(&user).unwrap();
        assert_eq!(std::fs::metadata(&home).unwrap().uid(), nobody.uid);
        assert_eq!(
            std::fs::metadata(home.join(".agent/credentials"))
                .unwrap()
                .uid(),
            nobody.uid
        );
    }
    gw.stop().await;
}

/// Agents of the gateway's own user can reach a shim's socket (Landlock
/// covers connecting to one only from ABI 9, and `/proc/net/unix` names
/// every socket), but a shim serves only who shows the key beside it,
/// which no box reaches: an intruder is refused, and the conversation it
/// aimed at goes on undisturbed.
async fn an_agent_cannot_take_over_another_conversations_shim(db: TestDb) {
    if acp_gateway::sandbox::landlock::kernel_abi().is_none() {
        eprintln!("skipping: this kernel has no Landlock");
        return;
    }
    let ground = Ground::new();
    let alice_token = cli_token(&db, "alice", "user");
    let bob_token = cli_token(&db, "bob", "user");
    // Its agents run as the gateway's own user (no `user`).
    let profile = AgentProfile {
        user: None,
        ..boxed("same-uid", &ground, SandboxMode::Required)
    };
    let gw = TestGateway::start(&db, vec![profile]).await;
    let (alice, bob) = (gw.with_token(&alice_token), gw.with_token(&bob_token));
    let (bobs, _) = conversation_of(&bob, "same-uid").await;
    let (alices, _) = conversation_of(&alice, "same-uid").await;
    let records = agent_process_records(&db).await;
    let bobs_socket = records
        .iter()
        .find(|r| r.conversation_id.to_string() == bobs)
        .and_then(|r| r.shim_socket.clone())
        .expect("bob's agent runs under a shim");
    let bobs_key = acp_gateway::shim::key_of(Path::new(&bobs_socket));

    let found = probe(
        &alice,
        &alices,
        json!([
            ["read", "/proc/net/unix"],
            ["shim", bobs_socket],
            ["read", bobs_key],
        ]),
    )
    .await;
    allowed(&found[0]);
    assert!(found[0]["value"].as_str().unwrap().contains(&bobs_socket));
    allowed(&found[1]);
    // Said hello, then no to everything it sent; never a byte of output
    // (the shim closes while the intruder still writes, which it may see
    // as a reset or a broken pipe before the refusal).
    let kinds: Vec<&str> = found[1]["value"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap())
        .collect();
    assert_eq!(kinds.first(), Some(&"hello"), "{}", found[1]);
    assert!(
        kinds.contains(&"refused") || kinds.last().is_some_and(|k| k.starts_with("error")),
        "{}",
        found[1]
    );
    assert!(!kinds.contains(&"output"), "{}", found[1]);
    denied(&found[2]);

    // Bob's conversation never noticed.
    let mut ws = bob.conversation_ws(&bobs, 0).await;
    let turn = bob.prompt(&bobs, "still mine").await;
    let frames = ws
        .until(|e| e["type"] == "turn_ended" && e["data"]["turn_id"] == turn.as_str())
        .await;
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "end_turn");
    assert!(streamed_text(&frames, "agent_message_chunk").contains("You said: still mine"));
    gw.stop().await;
}

/// An agent that is the gateway's own child (`agent_shims = false`) is
/// boxed by the gateway itself, the same way.
async fn an_agent_without_a_shim_is_boxed_the_same(db: TestDb) {
    if acp_gateway::sandbox::landlock::kernel_abi().is_none() {
        eprintln!("skipping: this kernel has no Landlock");
        return;
    }
    let ground = Ground::new();
    std::fs::set_permissions(db.state_dir(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut config = Config::for_tests(&db, vec![boxed("direct", &ground, SandboxMode::Required)]);
    config.agent_shims = false;
    let gw = TestGateway::start_with(config).await;
    let (id, _) = conversation_of(&gw, "direct").await;
    assert!(agent_process_records(&db).await[0].shim_socket.is_none());
    let work = ground.work("anonymous");
    let found = probe(
        &gw,
        &id,
        json!([
            ["write", work.join("mine"), "x"],
            ["write", ground.base.join("outside/x"), "x"],
            ["write", "/tmp/acp-gateway-sandbox-test-direct", "x"],
            [
                "run",
                "/bin/sh",
                "-c",
                format!("cat {}/mine", work.display())
            ],
        ]),
    )
    .await;
    allowed(&found[0]);
    denied(&found[1]);
    denied(&found[2]);
    assert_eq!(found[3]["value"], "x");
    gw.stop().await;
}

/// A conversation's directory is stored resolved. An agent that swaps a
/// directory of its workspace, where another conversation of its user
/// works, for a symlink to another user's workspace leads that
/// conversation nowhere: its terminals are refused and its agent does not
/// start again, rather than boxed where the link leads.
async fn a_directory_swapped_for_a_symlink_leads_nowhere(db: TestDb) {
    if acp_gateway::sandbox::landlock::kernel_abi().is_none() {
        eprintln!("skipping: this kernel has no Landlock (the box is what keeps users apart)");
        return;
    }
    let ground = Ground::new();
    std::fs::set_permissions(db.state_dir(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let alice_token = cli_token(&db, "alice", "user");
    let bob_token = cli_token(&db, "bob", "user");
    let mut brief = boxed("brief", &ground, SandboxMode::Auto);
    brief.idle_timeout = std::time::Duration::from_millis(300);
    let gw = TestGateway::start(&db, vec![boxed("boxed", &ground, SandboxMode::Auto), brief]).await;
    let (alice, bob) = (gw.with_token(&alice_token), gw.with_token(&bob_token));
    let (bobs, _) = conversation_of(&bob, "boxed").await;
    let bobs_work = ground.work("bob");
    let found = probe(
        &bob,
        &bobs,
        json!([["write", bobs_work.join("plan.md"), "bob's"]]),
    )
    .await;
    allowed(&found[0]);

    // Alice's workspace holds `sub` and `later`, a conversation working in each.
    let (alices, _) = conversation_of(&alice, "boxed").await;
    let work = ground.work("alice");
    let (sub, later) = (work.join("sub"), work.join("later"));
    let found = probe(
        &alice,
        &alices,
        json!([["run", "/bin/mkdir", &sub, &later]]),
    )
    .await;
    allowed(&found[0]);
    let in_dir = |agent: &str, dir: &Path| json!({"agent": agent, "cwd": dir});
    let (status, body) = alice
        .post("/api/v1/conversations", in_dir("boxed", &sub))
        .await;
    assert_eq!(status, 201, "{body}");
    let in_sub = body["id"].as_str().unwrap().to_owned();
    let (status, body) = alice
        .post("/api/v1/conversations", in_dir("brief", &later))
        .await;
    assert_eq!(status, 201, "{body}");
    let in_later = body["id"].as_str().unwrap().to_owned();
    let mut later_ws = alice.conversation_ws(&in_later, 0).await;
    later_ws.until_agent_gone().await;

    // Her first agent swaps both for links to bob's workspace.
    let swap = |dir: &Path| {
        format!(
            "mv {dir} {dir}.moved && ln -s {bob} {dir}",
            dir = dir.display(),
            bob = bobs_work.display()
        )
    };
    let found = probe(
        &alice,
        &alices,
        json!([
            ["run", "/bin/sh", "-c", swap(&sub)],
            ["run", "/bin/sh", "-c", swap(&later)],
        ]),
    )
    .await;
    found.iter().for_each(allowed);

    // The running agent in `sub`: its terminals are refused, there or
    // named by the link.
    let answers = calls(
        &alice,
        &in_sub,
        json!([
            ["terminal/create", {"command": "sh", "args": ["-c", "cat plan.md; echo x > pwned"]}],
            ["terminal/create", {"command": "cat", "args": ["plan.md"], "cwd": &sub}],
        ]),
    )
    .await;
    let message = answers[0]["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("a symlink is on its path now"),
        "{answers:?}"
    );
    assert!(answers[1]["error"].is_object(), "{answers:?}");

    // The agent in `later`, stopped when idle, does not start again there.
    let (status, body) = alice
        .post(
            &format!("/api/v1/conversations/{in_later}/prompts"),
            json!({"text": "probe [[\"list\", \".\"]]"}),
        )
        .await;
    assert_ne!(status, 202, "{body}");
    assert!(
        body.to_string().contains("a symlink is on its path now"),
        "{status} {body}"
    );

    // Bob's workspace is as he left it.
    let names: Vec<_> = std::fs::read_dir(&bobs_work)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["plan.md"]);
    assert_eq!(
        std::fs::read_to_string(bobs_work.join("plan.md")).unwrap(),
        "bob's"
    );
    gw.stop().await;
}

crate::backend_tests!(one_users_agent_cannot_reach_another_users_work);

mod on_sqlite {
    use super::*;

    #[tokio::test]
    async fn a_directory_swapped_for_a_symlink_leads_nowhere() {
        super::a_directory_swapped_for_a_symlink_leads_nowhere(TestDb::sqlite().await).await
    }

    #[tokio::test]
    async fn connections_go_only_to_allowed_ports() {
        an_agents_connections_go_only_to_its_allowed_ports(TestDb::sqlite().await).await
    }

    #[tokio::test]
    async fn a_kernel_without_landlock_refuses_required_and_warns_for_auto() {
        without_landlock_required_refuses_and_auto_warns(TestDb::sqlite().await).await
    }

    #[tokio::test]
    async fn an_agent_cannot_take_over_a_shim() {
        an_agent_cannot_take_over_another_conversations_shim(TestDb::sqlite().await).await
    }

    #[tokio::test]
    async fn without_a_shim_the_agent_is_boxed_the_same() {
        an_agent_without_a_shim_is_boxed_the_same(TestDb::sqlite().await).await
    }

    #[tokio::test]
    async fn homes_start_from_the_template() {
        each_users_home_starts_from_the_template(TestDb::sqlite().await).await
    }
}
