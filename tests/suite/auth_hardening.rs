//! Authentication at its edges: revocation reaches open WebSockets, tokens in
//! URLs are for WebSocket upgrades only, unknown paths do not answer before
//! authentication, and the start-up and connection edge cases.

use crate::common::*;
use serde_json::json;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

async fn ws_with(gw: &TestGateway, path: &str, token: &str) -> Ws {
    let mut req = gw
        .url(path)
        .replacen("http", "ws", 1)
        .into_client_request()
        .unwrap();
    req.headers_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    let (stream, _) = tokio_tungstenite::connect_async(req).await.unwrap();
    Ws { stream }
}

/// Reads until the server closes the socket; returns the close code.
async fn closed_with(ws: &mut Ws) -> u16 {
    ws.until_closed().await.1
}

async fn revoking_a_token_or_removing_its_user_closes_its_open_websockets(db: TestDb) {
    let operator = cli_token(&db, "root-op", "operator");
    let gw = TestGateway::start(&db, vec![demo_profile("demo", &[])]).await;
    let (alice, alice_id) = gw.make_token(&operator, "alice", "user").await;
    let (bob, _) = gw.make_token(&operator, "bob", "user").await;
    let (carol, _) = gw.make_token(&operator, "carol", "user").await;
    let conversation = gw.with_token(&alice).create("demo").await;

    let mut alice_conv = ws_with(
        &gw,
        &format!("/api/v1/conversations/{conversation}/ws"),
        &alice,
    )
    .await;
    let mut alice_inbox = ws_with(&gw, "/api/v1/ws", &alice).await;
    let mut bob_inbox = ws_with(&gw, "/api/v1/ws", &bob).await;
    let mut carol_inbox = ws_with(&gw, "/api/v1/ws", &carol).await;
    let mut operator_inbox = ws_with(&gw, "/api/v1/ws", &operator).await;
    for ws in [
        &mut alice_inbox,
        &mut bob_inbox,
        &mut carol_inbox,
        &mut operator_inbox,
    ] {
        assert_eq!(ws.next().await["type"], "snapshot");
    }
    alice_conv.until_type("agent_status").await;

    // Revoked over the API: both of alice's sockets close with 1008.
    let (status, _) = gw
        .delete_as(&format!("/api/v1/tokens/{alice_id}"), Some(&operator))
        .await;
    assert_eq!(status, 204);
    assert_eq!(closed_with(&mut alice_conv).await, 1008);
    assert_eq!(closed_with(&mut alice_inbox).await, 1008);

    // A user removed over the API: every token of theirs stops working.
    let (status, _) = gw.delete_as("/api/v1/users/bob", Some(&operator)).await;
    assert_eq!(status, 204);
    assert_eq!(closed_with(&mut bob_inbox).await, 1008);
    let (status, _) = gw.get_as("/api/v1/conversations", Some(&bob)).await;
    assert_eq!(status, 401);
    let (status, body) = gw.delete_as("/api/v1/users/nobody", Some(&operator)).await;
    assert_eq!(status, 404, "{body}");
    let (status, _) = gw.delete_as("/api/v1/users/carol", Some(&bob)).await;
    assert_eq!(status, 401);

    // A user removed by the CLI, another process: the gateway notices too.
    cli(&db, &["token", "revoke", "--user", "carol"]);
    assert_eq!(closed_with(&mut carol_inbox).await, 1008);

    // The operator's socket was never touched: it still gets events.
    gw.with_token(&operator)
        .prompt(&conversation, "hello")
        .await;
    operator_inbox.until_type("turn_ended").await;
}

async fn tokens_in_the_url_or_subprotocol_count_only_on_websocket_upgrades(db: TestDb) {
    let operator = cli_token(&db, "root-op", "operator");
    let gw = TestGateway::start(&db, vec![demo_profile("demo", &[])]).await;
    let status = gw
        .http
        .get(gw.url(&format!("/api/v1/conversations?access_token={operator}")))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 401);
    let status = gw
        .http
        .get(gw.url("/api/v1/conversations"))
        .header("sec-websocket-protocol", format!("bearer.{operator}"))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 401);
    // On an upgrade both still work.
    let url = gw
        .url(&format!("/api/v1/ws?access_token={operator}"))
        .replacen("http", "ws", 1);
    let (stream, _) = tokio_tungstenite::connect_async(url).await.unwrap();
    assert_eq!(Ws { stream }.next().await["type"], "snapshot");

    // Unknown paths: 401 before anything else, 404 with a valid token.
    let (status, body) = gw.call("GET", "/api/v1/nothing-here", None).await;
    assert_eq!(status, 401, "{body}");
    let (status, _) = gw.get_as("/api/v2/whatever", Some("acpgw_wrong")).await;
    assert_eq!(status, 401);
    let (status, body) = gw.get_as("/api/v1/nothing-here", Some(&operator)).await;
    assert_eq!(status, 404, "{body}");
}

async fn a_cwd_outside_the_allowed_roots_gets_the_same_answer_whether_or_not_it_exists(db: TestDb) {
    let root = tempfile::tempdir().unwrap();
    let mut profile = demo_profile("demo", &[]);
    profile.allowed_roots = vec![root.path().to_path_buf()];
    let gw = TestGateway::start(&db, vec![profile]).await;
    let mut details = Vec::new();
    for cwd in ["/etc", "/nonexistent-dir-xyz", "/etc/passwd"] {
        let (status, problem) = gw
            .post(
                "/api/v1/conversations",
                json!({"agent": "demo", "cwd": cwd}),
            )
            .await;
        assert_eq!(status, 403, "{cwd}: {problem}");
        details.push(problem["detail"].as_str().unwrap().replace(cwd, "CWD"));
    }
    assert!(details.iter().all(|d| d == &details[0]), "{details:?}");
}

/// Inside the roots, no directory at `cwd` is 404 (as docs/api.md says);
/// outside them, 403 with one detail whether the path is there or not,
/// however it gets outside (`..`, a symlink, a dangling one).
async fn a_cwd_inside_the_allowed_roots_that_is_not_a_directory_is_404_and_outside_403_there_or_not(
    db: TestDb,
) {
    let root = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let r = root.path().canonicalize().unwrap();
    let o = outside.path().canonicalize().unwrap();
    std::fs::create_dir(r.join("project")).unwrap();
    std::fs::write(r.join("notes.txt"), "a file").unwrap();
    std::fs::create_dir(o.join("present")).unwrap();
    std::os::unix::fs::symlink(&o, r.join("elsewhere")).unwrap();
    std::os::unix::fs::symlink(o.join("present"), r.join("linked")).unwrap();
    std::os::unix::fs::symlink(o.join("absent"), r.join("dangling")).unwrap();
    let mut profile = demo_profile("demo", &[]);
    profile.allowed_roots = vec![r.clone()];
    let gw = TestGateway::start(&db, vec![profile]).await;
    let create = |cwd: String| {
        let gw = &gw;
        async move {
            let (status, body) = gw
                .post(
                    "/api/v1/conversations",
                    json!({"agent": "demo", "cwd": cwd}),
                )
                .await;
            (cwd, status, body)
        }
    };
    let (r, o) = (r.to_str().unwrap(), o.to_str().unwrap());
    let oname = outside.path().file_name().unwrap().to_str().unwrap();
    for cwd in [
        format!("{r}/missing"),
        format!("{r}/project/missing/deeper"),
        format!("{r}/missing/../also-missing"),
        format!("{r}/notes.txt"),
        format!("{r}/notes.txt/below"),
    ] {
        let (cwd, status, problem) = create(cwd).await;
        assert_eq!(status, 404, "{cwd}: {problem}");
        assert!(
            problem["detail"]
                .as_str()
                .unwrap()
                .contains("not a directory"),
            "{cwd}: {problem}"
        );
    }
    // Each pair: one there, one not.
    let mut details = Vec::new();
    for cwd in [
        format!("{o}/present"),
        format!("{o}/absent"),
        format!("{r}/elsewhere/present"),
        format!("{r}/elsewhere/absent"),
        format!("{r}/linked"),
        format!("{r}/dangling"),
        format!("{r}/../{oname}/present"),
        format!("{r}/missing/../../{oname}/absent"),
    ] {
        let (cwd, status, problem) = create(cwd).await;
        assert_eq!(status, 403, "{cwd}: {problem}");
        details.push(problem["detail"].as_str().unwrap().replace(&cwd, "CWD"));
    }
    assert!(details.iter().all(|d| d == &details[0]), "{details:?}");
    // `..` goes by name: back inside, into a directory that is there.
    let (cwd, status, conv) = create(format!("{r}/missing/../project")).await;
    assert_eq!(status, 201, "{cwd}: {conv}");
    assert_eq!(conv["cwd"], format!("{r}/project"));
}

async fn a_413_closes_the_connection_cleanly_and_the_next_request_succeeds(db: TestDb) {
    let gw = TestGateway::start(&db, vec![demo_profile("demo", &[])]).await;
    // One connection at most, reused whenever the server allows it.
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(1)
        .build()
        .unwrap();
    let big = "x".repeat(gw.config.max_body_bytes + 1);
    for _ in 0..3 {
        let resp = http
            .post(gw.url("/api/v1/conversations"))
            .json(&json!({"agent": "demo", "title": big}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 413);
        assert_eq!(resp.headers()["connection"], "close");
        let status = http.get(gw.url("/healthz")).send().await.unwrap().status();
        assert_eq!(status, 200);
    }
}

/// The CLI issues tokens by the API's rules: the same user names, the same
/// label limits, one clear line when they are broken.
async fn the_cli_refuses_the_user_names_and_labels_the_api_refuses(db: TestDb) {
    let operator = cli_token(&db, "root-op", "operator");
    let gw = TestGateway::start(&db, vec![demo_profile("demo", &[])]).await;
    let long = "x".repeat(65);
    for (args, field) in [
        (vec!["--user", "two words"], "user"),
        (vec!["--user", long.as_str()], "user"),
        (
            vec!["--user", "ok", "--label", "line one\nline two"],
            "label",
        ),
    ] {
        let mut argv = vec!["token", "create"];
        argv.extend(args.iter().copied());
        let out = cli_output(&db, &argv);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{argv:?} was accepted");
        assert!(out.stdout.is_empty(), "no token is printed");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.starts_with(&format!("error: {field}")), "{stderr}");
        // The API answers the same input with 422.
        let body = match field {
            "user" => json!({"user": args[1]}),
            _ => json!({"user": "ok", "label": args[3]}),
        };
        let (status, _) = gw.post_as("/api/v1/tokens", Some(&operator), body).await;
        assert_eq!(status, 422, "{argv:?}");
    }
    // Nothing was created on the way.
    let listed = cli(&db, &["token", "list"]);
    assert!(
        !listed.contains("two words") && !listed.contains(" ok "),
        "{listed}"
    );
}

/// What a WebSocket shows is decided by the role it was opened with: an
/// operator made a user has her sockets closed (1008), and what she opens
/// again shows only her own; a socket of the open mode closes once a token
/// exists.
async fn a_role_change_or_the_first_token_closes_the_sockets_it_affects(db: TestDb) {
    let gw = TestGateway::start(&db, vec![demo_profile("demo", &[])]).await;
    let mut open_inbox = gw.ws("/api/v1/ws").await;
    assert_eq!(open_inbox.next().await["type"], "snapshot");
    let operator = cli_token(&db, "root-op", "operator");
    assert_eq!(closed_with(&mut open_inbox).await, 1008);

    let (olga, _) = gw.make_token(&operator, "olga", "operator").await;
    let (bob, _) = gw.make_token(&operator, "bob", "user").await;
    let bobs = gw.with_token(&bob).create("demo").await;
    let mut olga_inbox = ws_with(&gw, "/api/v1/ws", &olga).await;
    assert_eq!(olga_inbox.next().await["type"], "snapshot");
    let mut olga_on_bobs = ws_with(&gw, &format!("/api/v1/conversations/{bobs}/ws"), &olga).await;
    olga_on_bobs.until_type("agent_status").await;
    let mut root_inbox = ws_with(&gw, "/api/v1/ws", &operator).await;
    assert_eq!(root_inbox.next().await["type"], "snapshot");

    // Olga becomes a user: both her sockets close.
    gw.make_token(&operator, "olga", "user").await;
    assert_eq!(closed_with(&mut olga_inbox).await, 1008);
    assert_eq!(closed_with(&mut olga_on_bobs).await, 1008);

    // Connecting again, she sees only her own (bob's prompt does not reach
    // her new inbox, though it reaches the operator's).
    let mut olga_inbox = ws_with(&gw, "/api/v1/ws", &olga).await;
    assert_eq!(olga_inbox.next().await["type"], "snapshot");
    gw.with_token(&bob).prompt(&bobs, "hello").await;
    root_inbox
        .until(|e| e["type"] == "turn_ended" && e["conversation_id"] == bobs.as_str())
        .await;
    gw.with_token(&olga).create("demo").await;
    let seen = olga_inbox.until(|e| e["type"] == "agent_status").await;
    assert!(
        seen.iter().all(|e| e["conversation_id"] != bobs.as_str()),
        "{seen:?}"
    );
}

backend_tests!(
    revoking_a_token_or_removing_its_user_closes_its_open_websockets,
    a_role_change_or_the_first_token_closes_the_sockets_it_affects,
    tokens_in_the_url_or_subprotocol_count_only_on_websocket_upgrades,
    a_cwd_outside_the_allowed_roots_gets_the_same_answer_whether_or_not_it_exists,
    a_cwd_inside_the_allowed_roots_that_is_not_a_directory_is_404_and_outside_403_there_or_not,
    the_cli_refuses_the_user_names_and_labels_the_api_refuses,
    a_413_closes_the_connection_cleanly_and_the_next_request_succeeds,
);

/// Start-up: a host name is a valid `listen`, and a failure is one line.
#[tokio::test]
async fn listen_accepts_a_host_name_and_startup_errors_are_one_clear_line() {
    let db = TestDb::sqlite().await;
    let mut config = Config::for_tests(&db, vec![demo_profile("demo", &[])]);
    config.listen = "localhost:0".into();
    let gw = TestGateway::start_with(config).await;
    let (status, _) = gw.get("/healthz").await;
    assert_eq!(status, 200);
    gw.stop().await;

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bad.toml");
    std::fs::write(
        &config,
        "[[agents]]\nname = \"x\"\ncommand = \"x\"\ncwd = \"relative\"\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_acp-gateway"))
        .args(["serve", "--config"])
        .arg(&config)
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("error: agents[0].cwd:"), "{stderr}");
    assert!(!stderr.contains("backtrace"), "{stderr}");
}
