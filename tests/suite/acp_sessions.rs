//! What an ACP client's session may carry and be given at the gateway's
//! `/api/v1/acp`, over a real WebSocket against gateways running the demo
//! agent: `initialize`'s `promptCapabilities` are the profile's agent's
//! (the gateway's own until one has started) and a block the session's
//! agent does not accept is refused; `session/list` filters by `cwd`
//! exactly, its paging unchanged; a client's `mcpServers` reach the agent
//! only where the profile lets them through (`client_mcp_servers`), and
//! the answer says what became of them.

use std::collections::HashSet;

use crate::acp_server::{agent_text, text_prompt, Acp};
use crate::common::*;
use acp_gateway::config::{AgentProfile, Config};
use serde_json::{json, Value};

async fn initialize(gw: &TestGateway, path: &str) -> (Acp, Value) {
    let mut acp = Acp::connect(gw, path).await;
    let init = acp.call("initialize", json!({"protocolVersion": 1})).await;
    (acp, init["result"].clone())
}

const NONE_ACCEPTED: &str = r#"{"image":false,"audio":false,"embeddedContext":false}"#;

async fn initialize_answers_the_profiles_prompt_capabilities_and_refuses_a_block_its_agent_does_not_take(
    db: TestDb,
) {
    let agents = vec![demo_profile("demo", &[]), demo_profile("other", &[])];
    let gw = TestGateway::start(&db, agents).await;
    let none: Value = serde_json::from_str(NONE_ACCEPTED).unwrap();
    let all = json!({"image": true, "audio": true, "embeddedContext": true});

    // No demo agent has started: nothing is started to learn it, and the
    // answer is what the gateway takes, said so.
    let (mut acp, init) = initialize(&gw, "/api/v1/acp/demo").await;
    let capabilities = &init["agentCapabilities"]["promptCapabilities"];
    assert_eq!(*capabilities, all, "{init}");
    assert_eq!(init["_meta"]["acpGateway"]["agent"], "demo");
    assert_eq!(
        init["_meta"]["acpGateway"]["promptCapabilitiesFrom"],
        "gateway"
    );
    let running = gw.get("/api/v1/conversations").await.1["items"].clone();
    assert_eq!(running, json!([]), "initialize started nothing");

    // The session's agent (the demo agent takes text and links only)
    // decides: an image block is refused, naming it; nothing reaches the
    // agent, and the session goes on.
    let session = acp.new_session().await;
    let before = gw.events(&session).await.len();
    let image = json!({"type": "image", "mimeType": "image/png", "data": "iVBORw0KGgo="});
    let text = json!({"type": "text", "text": "look"});
    let refused = acp
        .call(
            "session/prompt",
            json!({"sessionId": session, "prompt": [text, image]}),
        )
        .await;
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(message.contains("prompt[1]"), "{message}");
    assert!(message.contains("promptCapabilities.image"), "{message}");
    assert_eq!(refused["error"]["data"]["status"], 422);
    let resource = json!({"type": "resource", "resource": {"uri": "file:///a.txt", "text": "a"}});
    let refused = acp
        .call(
            "session/prompt",
            json!({"sessionId": session, "prompt": [resource]}),
        )
        .await;
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("embeddedContext"),
        "{refused}"
    );
    assert_eq!(gw.events(&session).await.len(), before, "nothing was sent");
    let link = json!({"type": "resource_link", "uri": "file:///a.txt", "name": "a.txt"});
    let ended = acp
        .call(
            "session/prompt",
            json!({"sessionId": session, "prompt": [{"type": "text", "text": "hello"}, link]}),
        )
        .await;
    assert_eq!(ended["result"]["stopReason"], "end_turn", "{ended}");

    // Learned now: the next initialize answers what the agent said.
    let (_, init) = initialize(&gw, "/api/v1/acp/demo").await;
    assert_eq!(
        init["agentCapabilities"]["promptCapabilities"], none,
        "{init}"
    );
    assert_eq!(
        init["_meta"]["acpGateway"]["promptCapabilitiesFrom"],
        "agent"
    );
    // Without a profile in the path: the default (first) profile's, named.
    let (_, init) = initialize(&gw, "/api/v1/acp").await;
    assert_eq!(
        init["agentCapabilities"]["promptCapabilities"], none,
        "{init}"
    );
    assert_eq!(init["_meta"]["acpGateway"]["agent"], "demo");
    // A profile none of whose agents has started: the gateway's again.
    let (_, init) = initialize(&gw, "/api/v1/acp/other").await;
    assert_eq!(
        init["agentCapabilities"]["promptCapabilities"], all,
        "{init}"
    );
    assert_eq!(init["_meta"]["acpGateway"]["agent"], "other");
}

async fn an_agent_that_takes_images_is_sent_them_and_initialize_says_so(db: TestDb) {
    let mut seeing = node_sdk_profile("seeing");
    seeing
        .env
        .insert("ACP_TEST_AGENT_IMAGES".into(), "1".into());
    let gw = TestGateway::start(&db, vec![seeing]).await;
    let (mut acp, _) = initialize(&gw, "/api/v1/acp/seeing").await;
    let session = acp.new_session().await;
    let image = json!({"type": "image", "mimeType": "image/png", "data": "iVBORw0KGgo="});
    let resource = json!({"type": "resource", "resource": {"uri": "file:///a.txt", "text": "a"}});
    let ended = acp
        .call(
            "session/prompt",
            json!({"sessionId": session, "prompt": [{"type": "text", "text": "see"}, image, resource]}),
        )
        .await;
    assert_eq!(ended["result"]["stopReason"], "end_turn", "{ended}");
    let (_, init) = initialize(&gw, "/api/v1/acp/seeing").await;
    assert_eq!(
        init["agentCapabilities"]["promptCapabilities"],
        json!({"image": true, "audio": false, "embeddedContext": true}),
        "{init}"
    );
    let audio = json!({"type": "audio", "mimeType": "audio/wav", "data": "UklGRg=="});
    let refused = acp
        .call(
            "session/prompt",
            json!({"sessionId": session, "prompt": [audio]}),
        )
        .await;
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
}

async fn session_list_keeps_only_the_exact_cwd_and_pages_as_before(db: TestDb) {
    let (a, b) = ("/srv/work/app", "/srv/work/app2");
    {
        let store = acp_gateway::store::open(&db.url).await.unwrap();
        for i in 0..63 {
            let mut conversation = idle_conversation(None);
            conversation.cwd = if i % 20 == 0 { b } else { a }.into();
            store.insert_conversation(&conversation).await.unwrap();
        }
    }
    let gw = TestGateway::start(&db, vec![demo_profile("demo", &[])]).await;
    let mut acp = Acp::open(&gw).await;
    // 59 in a (two pages of 50), 4 in b (one), none in a's parent.
    let (in_a, pages) = listed(&mut acp, a).await;
    assert_eq!((in_a.len(), pages), (59, 2));
    assert_eq!(
        in_a.iter().collect::<HashSet<_>>().len(),
        59,
        "no duplicate"
    );
    let (in_b, pages) = listed(&mut acp, b).await;
    assert_eq!((in_b.len(), pages), (4, 1));
    let (in_parent, _) = listed(&mut acp, "/srv/work").await;
    assert!(in_parent.is_empty());
    // Unfiltered: all of them, as before.
    let all = acp.call("session/list", json!({})).await;
    assert_eq!(all["result"]["sessions"].as_array().unwrap().len(), 50);
    // A cwd that is no absolute path: an error the client can show.
    let relative = acp.call("session/list", json!({"cwd": "srv/work"})).await;
    assert_eq!(relative["error"]["code"], -32602, "{relative}");
    assert!(relative["error"]["message"]
        .as_str()
        .unwrap()
        .contains("absolute"));
}

/// Every session `session/list` gives for `cwd`, page after page, and how
/// many pages.
async fn listed(acp: &mut Acp, cwd: &str) -> (Vec<String>, usize) {
    let mut seen = Vec::new();
    let mut cursor = Value::Null;
    let mut pages = 0;
    loop {
        let page = acp
            .call("session/list", json!({"cwd": cwd, "cursor": cursor}))
            .await;
        let result = &page["result"];
        let sessions = result["sessions"].as_array();
        for s in sessions.unwrap_or_else(|| panic!("{page}")) {
            assert_eq!(s["cwd"], cwd, "{s}");
            seen.push(s["sessionId"].as_str().unwrap().to_owned());
        }
        pages += 1;
        cursor = result["nextCursor"].clone();
        if cursor.is_null() {
            return (seen, pages);
        }
    }
}

fn mcp_server(name: &str) -> Value {
    json!({"name": name, "command": "/bin/true", "args": ["--stdio"], "env": []})
}

async fn mcp_names(acp: &mut Acp, session: &str) -> String {
    let ended = acp
        .call("session/prompt", text_prompt(session, "mcp"))
        .await;
    assert_eq!(ended["result"]["stopReason"], "end_turn", "{ended}");
    let frames: Vec<Value> = acp.other.drain(..).collect();
    agent_text(&frames)
}

async fn a_clients_mcp_servers_reach_the_agent_only_where_the_profile_lets_them(db: TestDb) {
    let mut open: AgentProfile = demo_profile("open", &[]);
    open.client_mcp_servers = true;
    open.mcp_servers = vec![serde_json::from_value(mcp_server("profile-fs")).unwrap()];
    let shut = demo_profile("shut", &[]);
    let config = Config::for_tests(&db, vec![shut, open]);
    let gw = TestGateway::start_with(config).await;
    let cwd = std::env::temp_dir();
    let given = json!([mcp_server("ide-tools")]);

    // Off (the default): not passed, and the answer says so.
    let (mut acp, _) = initialize(&gw, "/api/v1/acp/shut").await;
    let created = acp
        .call("session/new", json!({"cwd": cwd, "mcpServers": given}))
        .await;
    let said = &created["result"]["_meta"]["acpGateway"]["mcpServers"];
    assert_eq!(said["passed"], false, "{created}");
    assert!(said["detail"]
        .as_str()
        .unwrap()
        .contains("client_mcp_servers"));
    let session = created["result"]["sessionId"].as_str().unwrap().to_owned();
    assert_eq!(mcp_names(&mut acp, &session).await, "mcp servers: none");
    // None given: nothing said.
    let created = acp
        .call("session/new", json!({"cwd": cwd, "mcpServers": []}))
        .await;
    let said = &created["result"]["_meta"]["acpGateway"]["mcpServers"];
    assert!(said.is_null(), "{created}");

    // On: given to the agent beside the profile's, as given.
    let (mut acp, _) = initialize(&gw, "/api/v1/acp/open").await;
    let created = acp
        .call("session/new", json!({"cwd": cwd, "mcpServers": given}))
        .await;
    assert_eq!(
        created["result"]["_meta"]["acpGateway"]["mcpServers"],
        json!({"passed": true}),
        "{created}"
    );
    let session = created["result"]["sessionId"].as_str().unwrap().to_owned();
    assert_eq!(
        mcp_names(&mut acp, &session).await,
        "mcp servers: profile-fs, ide-tools"
    );

    // Resumed (a conversation started over REST, its agent started
    // without them and idle): stopped, and started again with them for
    // the next prompt.
    let (status, rest) = gw
        .post("/api/v1/conversations", json!({"agent": "open"}))
        .await;
    assert_eq!(status, 201, "{rest}");
    let id = rest["id"].as_str().unwrap().to_owned();
    let resumed = acp
        .call(
            "session/resume",
            json!({"sessionId": id, "cwd": cwd, "mcpServers": [mcp_server("ide-two")]}),
        )
        .await;
    assert_eq!(
        resumed["result"]["_meta"]["acpGateway"]["mcpServers"],
        json!({"passed": true}),
        "{resumed}"
    );
    assert_eq!(
        mcp_names(&mut acp, &id).await,
        "mcp servers: profile-fs, ide-two"
    );
    // Loaded again with the same: the agent has them, nothing restarts.
    let loaded = acp
        .call(
            "session/load",
            json!({"sessionId": id, "cwd": cwd, "mcpServers": [mcp_server("ide-two")]}),
        )
        .await;
    assert_eq!(
        loaded["result"]["_meta"]["acpGateway"]["mcpServers"]["passed"],
        true
    );
    let frames: Vec<Value> = acp.other.drain(..).collect();
    assert!(!frames.is_empty(), "the history was replayed");

    // Not ACP McpServers: an error, and the session goes on as it was.
    let bad = acp
        .call(
            "session/resume",
            json!({"sessionId": id, "cwd": cwd, "mcpServers": [{"name": 7}]}),
        )
        .await;
    assert_eq!(bad["error"]["code"], -32602, "{bad}");
    assert!(bad["error"]["message"]
        .as_str()
        .unwrap()
        .contains("mcpServers"));
    assert_eq!(
        mcp_names(&mut acp, &id).await,
        "mcp servers: profile-fs, ide-two"
    );
}

backend_tests!(
    an_agent_that_takes_images_is_sent_them_and_initialize_says_so,
    initialize_answers_the_profiles_prompt_capabilities_and_refuses_a_block_its_agent_does_not_take,
    session_list_keeps_only_the_exact_cwd_and_pages_as_before,
    a_clients_mcp_servers_reach_the_agent_only_where_the_profile_lets_them,
);
