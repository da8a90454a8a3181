//! Users, tokens and secure defaults: every endpoint checks who is calling,
//! users see only their own conversations, operators see everything, and the
//! gateway never opens itself to the network by accident.

use crate::common::*;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

/// A gateway with an operator token (made with the real CLI), user tokens for
/// alice and bob, a revoked one for carol, and a conversation of alice's with
/// a permission request pending.
struct World {
    gw: TestGateway,
    operator: String,
    alice: String,
    bob: String,
    revoked: String,
    conversation: String,
    permission: String,
    ws: Ws,
}

async fn world(db: &TestDb) -> World {
    let operator = cli_token(db, "root-op", "operator");
    let gw = TestGateway::start(db, vec![demo_profile("demo", &[])]).await;
    let (alice, _) = gw.make_token(&operator, "alice", "user").await;
    let (bob, _) = gw.make_token(&operator, "bob", "user").await;
    let (revoked, carol_id) = gw.make_token(&operator, "carol", "user").await;
    let (status, _) = gw
        .delete_as(&format!("/api/v1/tokens/{carol_id}"), Some(&operator))
        .await;
    assert_eq!(status, 204);
    let conversation = gw.with_token(&alice).create("demo").await;
    let url = gw
        .url(&format!(
            "/api/v1/conversations/{conversation}/ws?access_token={alice}"
        ))
        .replacen("http", "ws", 1);
    let (stream, _) = tokio_tungstenite::connect_async(url).await.unwrap();
    let mut ws = Ws { stream };
    gw.with_token(&alice).prompt(&conversation, "tool").await;
    let permission = ws.until_type("permission_requested").await.pop().unwrap()["data"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    World {
        gw,
        operator,
        alice,
        bob,
        revoked,
        conversation,
        permission,
        ws,
    }
}

async fn every_endpoint_checks_the_token_and_the_role(db: TestDb) {
    let w = world(&db).await;
    let c = &w.conversation;
    let p = &w.permission;
    // (method, path, body): what alice may do with her own things.
    let owned: Vec<(&str, String, Option<Value>)> = vec![
        ("GET", format!("/api/v1/conversations/{c}"), None),
        ("GET", format!("/api/v1/conversations/{c}/messages"), None),
        ("GET", format!("/api/v1/conversations/{c}/tool-calls"), None),
        ("GET", format!("/api/v1/conversations/{c}/events"), None),
        ("GET", format!("/api/v1/conversations/{c}/rules"), None),
        ("GET", format!("/api/v1/permissions/{p}"), None),
    ];
    let open: Vec<(&str, String, Option<Value>)> = vec![
        ("GET", "/api/v1/agents".into(), None),
        ("GET", "/api/v1/conversations".into(), None),
        ("GET", "/api/v1/permissions".into(), None),
        ("GET", "/api/v1/policies".into(), None),
        (
            "POST",
            "/api/v1/policies/evaluate".into(),
            Some(json!({"agent": "demo", "tool_call": {"kind": "read"}})),
        ),
    ];
    let operator_only: Vec<(&str, String, Option<Value>)> = vec![
        ("GET", "/api/v1/tokens".into(), None),
        (
            "POST",
            "/api/v1/tokens".into(),
            Some(json!({"user": "dave"})),
        ),
        ("PUT", "/api/v1/policies".into(), Some(json!({"items": []}))),
    ];
    for (method, path, body) in owned.iter().chain(&open).chain(&operator_only) {
        for token in [
            None,
            Some("acpgw_not_a_real_token"),
            Some(w.revoked.as_str()),
        ] {
            let (status, problem) = w.gw.call_as(method, path, token, body.clone()).await;
            assert_eq!(status, 401, "{method} {path} with {token:?}: {problem}");
            assert_eq!(problem["code"], "unauthorized");
        }
    }
    for (method, path, body) in &owned {
        assert_eq!(
            w.gw.call_as(method, path, Some(&w.alice), body.clone())
                .await
                .0,
            200,
            "alice {method} {path}"
        );
        assert_eq!(
            w.gw.call_as(method, path, Some(&w.operator), body.clone())
                .await
                .0,
            200,
            "operator {method} {path}"
        );
        let (status, problem) = w.gw.call_as(method, path, Some(&w.bob), body.clone()).await;
        assert_eq!(status, 404, "bob {method} {path}: {problem}");
    }
    for (method, path, body) in &open {
        for token in [&w.alice, &w.bob, &w.operator] {
            assert_eq!(
                w.gw.call_as(method, path, Some(token), body.clone())
                    .await
                    .0,
                200,
                "{method} {path}"
            );
        }
    }
    for (method, path, body) in &operator_only {
        let (status, problem) =
            w.gw.call_as(method, path, Some(&w.alice), body.clone())
                .await;
        assert_eq!(status, 403, "alice {method} {path}: {problem}");
        assert_eq!(problem["code"], "forbidden");
        let (status, _) =
            w.gw.call_as(method, path, Some(&w.operator), body.clone())
                .await;
        assert!(
            status == 200 || status == 201,
            "operator {method} {path}: {status}"
        );
    }
    // Who may do it is asked before the body is read: a body the schema
    // refuses is still 403 from a user, and 404 on another's conversation.
    let refused = Some(json!({"nonsense": true}));
    for (method, path) in [("POST", "/api/v1/tokens"), ("PUT", "/api/v1/policies")] {
        let (status, problem) =
            w.gw.call_as(method, path, Some(&w.alice), refused.clone())
                .await;
        assert_eq!(status, 403, "alice {method} {path}: {problem}");
    }
    for what in ["prompts", "mode", "config-options"] {
        let path = format!("/api/v1/conversations/{c}/{what}");
        let (status, problem) =
            w.gw.call_as("POST", &path, Some(&w.bob), refused.clone())
                .await;
        assert_eq!(status, 404, "bob POST {path}: {problem}");
        let (status, problem) =
            w.gw.call_as("POST", &path, Some(&w.alice), refused.clone())
                .await;
        assert_eq!(status, 422, "alice POST {path}: {problem}");
    }
    // Lists show a user only their own things.
    let (_, bobs) = w.gw.get_as("/api/v1/conversations", Some(&w.bob)).await;
    assert_eq!(bobs["items"], json!([]));
    let (_, alices) = w.gw.get_as("/api/v1/conversations", Some(&w.alice)).await;
    assert_eq!(alices["items"][0]["id"], c.as_str());
    let (_, bobs) =
        w.gw.get_as("/api/v1/permissions?status=all", Some(&w.bob))
            .await;
    assert_eq!(bobs["items"], json!([]));
    let (_, ops) = w.gw.get_as("/api/v1/permissions", Some(&w.operator)).await;
    assert_eq!(ops["items"][0]["id"], p.as_str());
    // Token lists never show a token or its hash.
    let (_, tokens) = w.gw.get_as("/api/v1/tokens", Some(&w.operator)).await;
    let text = tokens.to_string();
    assert!(!text.contains(&w.alice) && !text.contains("hash"), "{text}");
    // Commands on another user's conversation are not found either.
    for (method, path, body) in [
        (
            "POST",
            format!("/api/v1/conversations/{c}/prompts"),
            Some(json!({"text": "x"})),
        ),
        (
            "POST",
            format!("/api/v1/conversations/{c}/cancel"),
            Some(json!({})),
        ),
        (
            "POST",
            format!("/api/v1/conversations/{c}/mode"),
            Some(json!({"mode_id": "plan"})),
        ),
        (
            "POST",
            format!("/api/v1/conversations/{c}/config-options"),
            Some(json!({"config_id": "model", "value": "deep"})),
        ),
        ("DELETE", format!("/api/v1/conversations/{c}/rules"), None),
        ("DELETE", format!("/api/v1/conversations/{c}"), None),
        (
            "POST",
            format!("/api/v1/permissions/{p}/respond"),
            Some(json!({"option_id": "allow-once"})),
        ),
    ] {
        let (status, _) = w.gw.call_as(method, &path, Some(&w.bob), body).await;
        assert_eq!(status, 404, "bob {method} {path}");
    }
    // The owner answers, and the decision names her.
    let (status, answered) =
        w.gw.post_as(
            &format!("/api/v1/permissions/{p}/respond"),
            Some(&w.alice),
            json!({"option_id": "allow-once"}),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(answered["decision"]["decided_by"], "user:alice");
    let (status, _) =
        w.gw.delete_as(&format!("/api/v1/conversations/{c}"), Some(&w.alice))
            .await;
    assert_eq!(status, 204);
}

async fn websocket_clients_authenticate_by_header_query_or_subprotocol(db: TestDb) {
    let mut w = world(&db).await;
    let base = w.gw.base.replacen("http", "ws", 1);
    let path = format!("{base}/api/v1/conversations/{}/ws", w.conversation);
    // Header.
    let mut req = path.clone().into_client_request().unwrap();
    req.headers_mut().insert(
        "authorization",
        format!("Bearer {}", w.alice).parse().unwrap(),
    );
    let (stream, _) = tokio_tungstenite::connect_async(req).await.unwrap();
    assert_eq!(Ws { stream }.next().await["seq"], 1);
    // Query (the world's own socket uses it too).
    let (stream, _) = tokio_tungstenite::connect_async(format!("{path}?access_token={}", w.alice))
        .await
        .unwrap();
    assert_eq!(Ws { stream }.next().await["seq"], 1);
    // Subprotocol, echoed back as browsers require.
    let mut req = path.clone().into_client_request().unwrap();
    req.headers_mut().insert(
        "sec-websocket-protocol",
        format!("bearer.{}", w.alice).parse().unwrap(),
    );
    let (stream, resp) = tokio_tungstenite::connect_async(req).await.unwrap();
    assert_eq!(
        resp.headers()["sec-websocket-protocol"],
        format!("bearer.{}", w.alice).as_str()
    );
    assert_eq!(Ws { stream }.next().await["seq"], 1);
    // No token, a revoked one, someone else's conversation.
    for (url, expected) in [
        (path.clone(), 401),
        (format!("{path}?access_token={}", w.revoked), 401),
        (format!("{path}?access_token={}", w.bob), 404),
    ] {
        match tokio_tungstenite::connect_async(url.clone()).await {
            Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
                assert_eq!(resp.status(), expected, "{url}")
            }
            other => panic!("{url}: expected {expected}, got {other:?}"),
        }
    }
    // Inboxes: bob sees nothing of alice's, alice and the operator do.
    let inbox = |token: &str| format!("{base}/api/v1/ws?access_token={token}");
    let (stream, _) = tokio_tungstenite::connect_async(inbox(&w.bob))
        .await
        .unwrap();
    let mut bob = Ws { stream };
    assert_eq!(bob.next().await["pending_permissions"], json!([]));
    let (stream, _) = tokio_tungstenite::connect_async(inbox(&w.alice))
        .await
        .unwrap();
    let mut alice = Ws { stream };
    assert_eq!(
        alice.next().await["pending_permissions"][0]["id"],
        w.permission.as_str()
    );
    let (stream, _) = tokio_tungstenite::connect_async(inbox(&w.operator))
        .await
        .unwrap();
    let mut operator = Ws { stream };
    assert_eq!(
        operator.next().await["pending_permissions"][0]["id"],
        w.permission.as_str()
    );
    // Bob's own conversation shows up on bob's inbox; alice's events do not.
    let (_, conv) =
        w.gw.post_as(
            "/api/v1/conversations",
            Some(&w.bob),
            json!({"agent": "demo"}),
        )
        .await;
    let p = &w.permission;
    w.gw.post_as(
        &format!("/api/v1/permissions/{p}/respond"),
        Some(&w.alice),
        json!({"option_id": "allow-once"}),
    )
    .await;
    let resolved = alice.until_type("permission_resolved").await.pop().unwrap();
    assert_eq!(resolved["data"]["id"], p.as_str());
    operator.until_type("permission_resolved").await;
    w.ws.until_type("turn_ended").await;
    let first_for_bob = bob.next().await;
    assert_eq!(
        first_for_bob["conversation_id"], conv["id"],
        "bob only sees his own: {first_for_bob}"
    );
}

async fn rate_limits_answer_429_with_retry_after(db: TestDb) {
    let mut config = Config::for_tests(&db, vec![demo_profile("demo", &[])]);
    config.rate_limits.prompts_per_minute = 2;
    let gw = TestGateway::start_with(config).await;
    let id = gw.create_conversation("demo").await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut ws = gw.conversation_ws(&id, 0).await;
    for _ in 0..2 {
        gw.prompt(&id, "hello").await;
        ws.until_type("turn_ended").await;
    }
    let resp = gw
        .http
        .post(gw.url(&format!("/api/v1/conversations/{id}/prompts")))
        .json(&json!({"text": "one too many"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 429);
    let wait: u64 = resp.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&wait), "{wait}");
    let problem: Value = resp.json().await.unwrap();
    assert_eq!(problem["code"], "rate_limited");
}

async fn startup_refuses_a_public_address_until_a_token_exists(db: TestDb) {
    let mut config = Config::for_tests(&db, vec![]);
    config.listen = "0.0.0.0:0".into();
    let err = acp_gateway::Gateway::build(config.clone())
        .await
        .err()
        .expect("refused");
    let text = format!("{err:#}");
    assert!(text.contains("refusing to listen on 0.0.0.0"), "{text}");
    assert!(text.contains("token create"), "{text}");
    cli_token(&db, "root-op", "operator");
    let gateway = acp_gateway::Gateway::build(config)
        .await
        .expect("with a token it may listen anywhere");
    assert!(gateway.local_addr().ip().is_unspecified());
}

async fn a_token_never_appears_in_the_log(db: TestDb) {
    let operator = cli_token(&db, "root-op", "operator");
    let process = GatewayProcess::start_logging(&db, &[demo_profile("demo", &[])], "debug");
    let http = reqwest::Client::new();
    let created = process
        .post_as("/api/v1/tokens", Some(&operator), json!({"user": "alice"}))
        .await
        .1;
    let alice = created["token"].as_str().unwrap().to_owned();
    let conv = process
        .post_as(
            "/api/v1/conversations",
            Some(&alice),
            json!({"agent": "demo"}),
        )
        .await
        .1;
    let id = conv["id"].as_str().unwrap();
    let status = http
        .get(format!(
            "{}/api/v1/conversations/{id}/events?access_token={alice}",
            process.base
        ))
        .send()
        .await
        .unwrap()
        .status();
    // A token in the URL of a REST call is refused (WebSocket upgrades only),
    // and not logged either.
    assert_eq!(status, 401);
    let url = format!(
        "{}/api/v1/conversations/{id}/ws?access_token={alice}",
        process.base
    )
    .replacen("http", "ws", 1);
    let (stream, _) = tokio_tungstenite::connect_async(url).await.unwrap();
    let mut ws = Ws { stream };
    ws.next().await;
    let bad = http
        .get(format!(
            "{}/api/v1/conversations?access_token=acpgw_wrong{}",
            process.base,
            &alice[6..20]
        ))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(bad, 401);
    let log = process.stop();
    assert!(
        log.contains("token created"),
        "the log was captured:\n{log}"
    );
    for secret in [
        operator.as_str(),
        alice.as_str(),
        &alice[6..],
        &alice[6..20],
    ] {
        assert!(!log.contains(secret), "a token leaked into the log:\n{log}");
    }
}

async fn an_agent_profile_with_a_user_runs_its_process_under_that_uid(db: TestDb) {
    if !acp_gateway::sys::running_as_root() {
        eprintln!("skipping: only a root gateway can switch users");
        return;
    }
    let nobody = acp_gateway::sys::lookup_user("nobody").expect("a nobody user");
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let cwd = dir.path().canonicalize().unwrap();
    let mut profile = demo_profile("demo", &[]);
    profile.user = Some("nobody".into());
    let gw = TestGateway::start(&db, vec![profile]).await;
    let (status, conv) = gw
        .post(
            "/api/v1/conversations",
            json!({"agent": "demo", "cwd": cwd.to_str().unwrap()}),
        )
        .await;
    assert_eq!(status, 201, "{conv}");
    let pid = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|p| p == cwd))
        .expect("the agent process");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uid_line = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    let uids: Vec<u32> = uid_line
        .split_whitespace()
        .skip(1)
        .map(|u| u.parse().unwrap())
        .collect();
    assert!(uids.iter().all(|u| *u == nobody.uid), "{uid_line}");
    let gid_line = status.lines().find(|l| l.starts_with("Gid:")).unwrap();
    assert!(
        gid_line
            .split_whitespace()
            .skip(1)
            .all(|g| g == nobody.gid.to_string()),
        "{gid_line}"
    );
    let groups = status.lines().find(|l| l.starts_with("Groups:")).unwrap();
    assert!(
        !groups.split_whitespace().skip(1).any(|g| g == "0"),
        "no root group: {groups}"
    );
    // And it works as that user.
    let id = conv["id"].as_str().unwrap();
    let mut ws = gw.conversation_ws(id, 0).await;
    gw.prompt(id, "hello").await;
    let frames = ws.until_type("turn_ended").await;
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "end_turn");
}

async fn a_cwd_outside_the_allowed_roots_is_rejected_however_it_is_spelled(db: TestDb) {
    let root = tempfile::tempdir().unwrap();
    let root_path = root.path().canonicalize().unwrap();
    std::fs::create_dir(root_path.join("project")).unwrap();
    std::os::unix::fs::symlink("/etc", root_path.join("sneaky")).unwrap();
    let mut profile = demo_profile("demo", &[]);
    profile.allowed_roots = vec![root_path.clone()];
    let gw = TestGateway::start(&db, vec![profile]).await;
    let r = root_path.to_str().unwrap();
    for cwd in [
        format!("{r}/../../etc"),
        format!("{r}/project/../../"),
        format!("{r}/sneaky"),
        "/etc".to_owned(),
        "/".to_owned(),
    ] {
        let (status, problem) = gw
            .post(
                "/api/v1/conversations",
                json!({"agent": "demo", "cwd": cwd}),
            )
            .await;
        assert_eq!(status, 403, "{cwd}: {problem}");
    }
    for cwd in [
        format!("{r}/project"),
        format!("{r}/project/../project"),
        r.to_owned(),
    ] {
        let (status, conv) = gw
            .post(
                "/api/v1/conversations",
                json!({"agent": "demo", "cwd": cwd}),
            )
            .await;
        assert_eq!(status, 201, "{cwd}: {conv}");
    }
}

async fn cors_is_off_unless_origins_are_configured(db: TestDb) {
    let preflight = |gw: &TestGateway, origin: &str| {
        gw.http
            .request(reqwest::Method::OPTIONS, gw.url("/api/v1/conversations"))
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header(
                "access-control-request-headers",
                "authorization,content-type",
            )
            .send()
    };
    let gw = TestGateway::start(&db, vec![]).await;
    let resp = preflight(&gw, "https://evil.example").await.unwrap();
    assert!(resp.headers().get("access-control-allow-origin").is_none());
    gw.stop().await;
    let mut config = Config::for_tests(&db, vec![]);
    config.cors_origins = vec!["https://app.example".into()];
    let gw = TestGateway::start_with(config).await;
    let resp = preflight(&gw, "https://app.example").await.unwrap();
    assert_eq!(
        resp.headers()["access-control-allow-origin"],
        "https://app.example"
    );
    let resp = preflight(&gw, "https://evil.example").await.unwrap();
    assert!(resp.headers().get("access-control-allow-origin").is_none());
}

async fn an_agent_its_user_cannot_run_is_reported_unavailable(db: TestDb) {
    if !acp_gateway::sys::running_as_root() {
        eprintln!("skipping: only root can make a program nobody may not run");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let open = dir.path().join("open");
    let closed = dir.path().join("closed");
    for (sub, mode) in [(&open, 0o755), (&closed, 0o700)] {
        std::fs::create_dir(sub).unwrap();
        std::fs::set_permissions(sub, std::fs::Permissions::from_mode(mode)).unwrap();
        let program = sub.join("agent");
        std::fs::write(&program, "#!/bin/sh\nexit 0\n").unwrap();
        std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let agent = |name: &str, sub: &std::path::Path| {
        let mut p = profile(name, sub.join("agent").to_str().unwrap(), &[]);
        p.user = Some("nobody".into());
        p
    };
    let gw = TestGateway::start(&db, vec![agent("open", &open), agent("closed", &closed)]).await;
    let (_, agents) = gw.get("/api/v1/agents").await;
    let by_name = |name: &str| {
        agents["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["name"] == name)
            .unwrap()
            .clone()
    };
    assert_eq!(by_name("open")["available"], true, "{agents}");
    let closed_agent = by_name("closed");
    assert_eq!(closed_agent["available"], false, "{agents}");
    let reason = closed_agent["unavailable_reason"].as_str().unwrap();
    assert!(
        reason.contains("cannot be searched by user nobody"),
        "{reason}"
    );
    // What it predicts is what happens.
    let (status, body) = gw
        .post("/api/v1/conversations", json!({"agent": "closed"}))
        .await;
    assert_eq!(status, 502, "{body}");
}

/// Found with a real Python agent in a venv made by root: the script is
/// reachable, its interpreter (the venv's python, a symlink into root's
/// home) is not.
async fn an_agent_whose_interpreter_its_user_cannot_reach_is_reported_unavailable(db: TestDb) {
    if !acp_gateway::sys::running_as_root() {
        eprintln!("skipping: only root can make an interpreter nobody may not reach");
        return;
    }
    use std::os::unix::fs::{symlink, PermissionsExt};
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
    let open = root.join("venv/bin");
    let closed = root.join("home/root");
    for (sub, mode) in [(&open, 0o755), (&closed, 0o700)] {
        std::fs::create_dir_all(sub).unwrap();
        std::fs::set_permissions(sub, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    std::fs::set_permissions(root.join("venv"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(root.join("home"), std::fs::Permissions::from_mode(0o755)).unwrap();
    // An interpreter only root reaches, and a venv's link to it.
    symlink("/bin/sh", closed.join("python3")).unwrap();
    symlink(closed.join("python3"), open.join("python")).unwrap();
    // Found by `env` in the agent's PATH only there.
    symlink("/bin/sh", closed.join("acp-test-python")).unwrap();
    let script = |name: &str, shebang: &str| {
        let path = open.join(name);
        std::fs::write(&path, format!("#!{shebang}\nexit 0\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    };
    let agent = |name: &str, program: &std::path::Path| {
        let mut p = profile(name, program.to_str().unwrap(), &[]);
        p.user = Some("nobody".into());
        p
    };
    let direct = script("direct", closed.join("python3").to_str().unwrap());
    let linked = script("linked", open.join("python").to_str().unwrap());
    let by_env = script("by-env", "/usr/bin/env acp-test-python");
    let plain = script("plain", "/bin/sh");
    // Past a directory it cannot search, env finds one it can.
    symlink("/bin/sh", open.join("acp-test-python")).unwrap();
    let second = script("second", "/usr/bin/env acp-test-python");
    let mut via_path = agent("by-env", &by_env);
    via_path
        .env
        .insert("PATH".into(), format!("{}:/usr/bin:/bin", closed.display()));
    let mut past_it = agent("second", &second);
    let path = format!("{}:{}:/usr/bin:/bin", closed.display(), open.display());
    past_it.env.insert("PATH".into(), path);
    let gw = TestGateway::start(
        &db,
        vec![
            agent("direct", &direct),
            agent("linked", &linked),
            via_path,
            past_it,
            agent("plain", &plain),
        ],
    )
    .await;
    let (_, agents) = gw.get("/api/v1/agents").await;
    let by_name = |name: &str| {
        agents["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["name"] == name)
            .unwrap()
            .clone()
    };
    assert_eq!(by_name("plain")["available"], true, "{agents}");
    assert_eq!(by_name("second")["available"], true, "{agents}");
    let unreachable = format!("{} cannot be searched by user nobody", closed.display());
    for name in ["direct", "linked", "by-env"] {
        let agent = by_name(name);
        assert_eq!(agent["available"], false, "{agent}");
        let reason = agent["unavailable_reason"].as_str().unwrap();
        assert!(reason.contains("interpreter"), "{name}: {reason}");
        assert!(reason.contains(&unreachable), "{name}: {reason}");
        // What it predicts is what happens, said the same way.
        let (status, body) = gw
            .post("/api/v1/conversations", json!({"agent": name}))
            .await;
        assert_eq!(status, 502, "{body}");
        let detail = body["detail"].as_str().unwrap();
        assert!(detail.contains(&unreachable), "{name}: {detail}");
    }
}

backend_tests!(
    an_agent_whose_interpreter_its_user_cannot_reach_is_reported_unavailable,
    cors_is_off_unless_origins_are_configured,
    an_agent_profile_with_a_user_runs_its_process_under_that_uid,
    a_cwd_outside_the_allowed_roots_is_rejected_however_it_is_spelled,
    every_endpoint_checks_the_token_and_the_role,
    websocket_clients_authenticate_by_header_query_or_subprotocol,
    rate_limits_answer_429_with_retry_after,
    startup_refuses_a_public_address_until_a_token_exists,
    a_token_never_appears_in_the_log,
    an_agent_its_user_cannot_run_is_reported_unavailable,
);
