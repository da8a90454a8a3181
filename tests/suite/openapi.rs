//! The OpenAPI document: the committed `openapi/openapi.yaml` is exactly
//! what the code produces, and the gateway serves it.

use crate::common::*;
use serde_json::json;

const REGENERATE: &str = "cargo run -- openapi > openapi/openapi.yaml";

#[test]
fn the_committed_document_is_what_the_code_produces() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("openapi/openapi.yaml");
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    let produced = acp_gateway::api::openapi_yaml().unwrap();
    if committed != produced {
        let first = committed
            .lines()
            .zip(produced.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| committed.lines().count().min(produced.lines().count()));
        panic!(
            "openapi/openapi.yaml differs from what the code produces (first at line {}: \
             committed {:?}, produced {:?}); regenerate it with `{REGENERATE}`",
            first + 1,
            committed.lines().nth(first),
            produced.lines().nth(first),
        );
    }
}

/// What a YAML 1.1 parser (PyYAML, as schemathesis and Python client
/// generators use) reads in the committed document is the served document:
/// `off`, `yes`, `1_000`, `2024-01-01` and the like are quoted where they are
/// strings.
#[test]
fn the_committed_document_reads_the_same_to_a_yaml_1_1_parser() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("openapi/openapi.yaml");
    let served = serde_json::to_string(&acp_gateway::api::openapi()).unwrap();
    let python = sdk_agents_dir().join(".venv/bin/python");
    let mut child = std::process::Command::new(&python)
        .args(["-c", YAML_1_1_COMPARE])
        .arg(&path)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run {}: {e}", python.display()));
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), served.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "PyYAML reads openapi/openapi.yaml differently from the served document: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
}

/// Loads argv[1] with PyYAML's safe loader and the served document (JSON)
/// from stdin; exits 1 naming the first place where they differ (a value or
/// its type: `True` is not `"on"`, nor `1`).
const YAML_1_1_COMPARE: &str = r#"
import json, sys, yaml
committed = yaml.safe_load(open(sys.argv[1], encoding="utf-8"))
served = json.load(sys.stdin)
def kind(v):
    return "number" if type(v) in (int, float) else type(v).__name__
def first_difference(a, b, at):
    if kind(a) != kind(b):
        return f"{at}: {a!r} ({kind(a)}) where the served document has {b!r} ({kind(b)})"
    if isinstance(a, dict):
        if set(a) != set(b):
            return f"{at}: keys {sorted(map(repr, set(a) ^ set(b)))} in one only"
        return next((d for k in a if (d := first_difference(a[k], b[k], f"{at}/{k}"))), None)
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{at}: {len(a)} items where the served document has {len(b)}"
        return next((d for i, (x, y) in enumerate(zip(a, b)) if (d := first_difference(x, y, f"{at}/{i}"))), None)
    return None if a == b else f"{at}: {a!r} where the served document has {b!r}"
difference = first_difference(committed, served, "")
if difference:
    print(difference)
    sys.exit(1)
"#;

#[test]
fn every_operation_is_named_once_and_every_error_is_a_problem() {
    let doc = serde_json::to_value(acp_gateway::api::openapi()).unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    let mut ids = std::collections::HashSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let id = op["operationId"].as_str().unwrap();
            assert!(ids.insert(id.to_owned()), "{method} {path}: {id} twice");
            for (status, response) in op["responses"].as_object().unwrap() {
                if status.starts_with('4') || status.starts_with('5') {
                    let content = response["content"].as_object().unwrap();
                    assert!(
                        content.contains_key("application/problem+json")
                            || path.ends_with("/ws")
                            || path == "/readyz"
                            // A page for people, as its 200 is.
                            || (path == "/api/v1/actions/{token}" && method == "get"),
                        "{method} {path} {status}: {content:?}"
                    );
                }
            }
        }
    }
    for settings in [
        "/api/v1/conversations/{id}/mode",
        "/api/v1/conversations/{id}/config-options",
    ] {
        assert!(doc["paths"][settings]["post"].is_object(), "{settings}");
    }
    let conversation = &doc["components"]["schemas"]["Conversation"]["properties"];
    for field in ["modes", "config_options", "available_commands", "usage"] {
        assert!(conversation[field].is_object(), "Conversation.{field}");
    }
    let events: Vec<&str> = doc["components"]["schemas"]["Event"]["oneOf"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["$ref"].as_str().unwrap())
        .collect();
    assert!(events.contains(&"#/components/schemas/ModeChangedEvent"));
    assert!(events.contains(&"#/components/schemas/ConfigOptionChangedEvent"));
}

async fn the_gateway_serves_its_document(db: TestDb) {
    let gw = TestGateway::start(&db, vec![demo_profile("demo", &[])]).await;
    let (status, served) = gw.get("/api/v1/openapi.json").await;
    assert_eq!(status, 200);
    assert_eq!(
        served,
        serde_json::to_value(acp_gateway::api::openapi()).unwrap()
    );
}

#[test]
fn the_reference_names_every_operation_event_and_problem_code() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let reference = std::fs::read_to_string(root.join("docs/api.md")).unwrap();
    let doc = serde_json::to_value(acp_gateway::api::openapi()).unwrap();
    let mut missing = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            let operation = format!("{} {path}", method.to_uppercase());
            if !reference.contains(&operation) {
                missing.push(operation);
            }
        }
    }
    let schemas = &doc["components"]["schemas"];
    for event in schemas["Event"]["oneOf"].as_array().unwrap() {
        let name = event["$ref"].as_str().unwrap().rsplit('/').next().unwrap();
        let kind = schemas[name]["properties"]["type"]["$ref"]
            .as_str()
            .unwrap()
            .rsplit('/')
            .next()
            .unwrap();
        let kind = schemas[kind]["enum"][0].as_str().unwrap();
        if !reference.contains(&format!("| `{kind}` |")) {
            missing.push(format!("event type {kind}"));
        }
    }
    let codes = schemas["Problem"]["properties"]["code"]["description"]
        .as_str()
        .unwrap();
    for code in codes.split('`').skip(1).step_by(2) {
        if !reference.contains(&format!("| `{code}` |")) {
            missing.push(format!("problem code {code}"));
        }
    }
    assert!(
        missing.is_empty(),
        "docs/api.md does not mention: {missing:#?}"
    );
}

/// The document's schemas, to check real answers against.
pub(crate) struct Contract {
    doc: serde_json::Value,
}

impl Contract {
    pub(crate) fn new() -> Contract {
        Contract {
            doc: serde_json::to_value(acp_gateway::api::openapi()).unwrap(),
        }
    }

    /// Why `instance` does not match `schema` (resolved in the document).
    fn violations(&self, schema: &serde_json::Value, instance: &serde_json::Value) -> Vec<String> {
        let mut root = schema.clone();
        root["components"] = self.doc["components"].clone();
        let validator = jsonschema::validator_for(&root).expect("a valid JSON Schema");
        validator
            .iter_errors(instance)
            .map(|e| e.to_string())
            .collect()
    }

    /// Asserts `instance` matches the named component schema.
    pub(crate) fn schema(&self, name: &str, instance: &serde_json::Value) {
        let schema = serde_json::json!({"$ref": format!("#/components/schemas/{name}")});
        let violations = self.violations(&schema, instance);
        assert!(
            violations.is_empty(),
            "{name}: {violations:?}\nin {instance}"
        );
    }

    /// Asserts an answer is documented for the operation, with a body that
    /// matches its schema.
    pub(crate) fn answer(
        &self,
        method: &str,
        path: &str,
        (status, body): &(u16, serde_json::Value),
    ) {
        let response = &self.doc["paths"][path][method]["responses"][status.to_string()];
        assert!(
            response.is_object(),
            "{method} {path} answered {status}, which it does not document: {body}"
        );
        match response["content"].as_object() {
            None => assert!(body.is_null(), "{method} {path} {status}: {body}"),
            Some(content) => {
                let (_, media) = content.iter().next().unwrap();
                let violations = self.violations(&media["schema"], body);
                assert!(
                    violations.is_empty(),
                    "{method} {path} {status}: {violations:?}\nin {body}"
                );
            }
        }
    }
}

async fn real_answers_and_events_match_the_document(db: TestDb) {
    let contract = Contract::new();
    let gw = TestGateway::start(&db, vec![demo_profile("demo", &[])]).await;
    let mut inbox = gw.ws("/api/v1/ws").await;
    contract.schema("InboxSnapshot", &inbox.next().await);
    contract.answer("get", "/api/v1/agents", &gw.get("/api/v1/agents").await);

    let created = gw
        .post(
            "/api/v1/conversations",
            json!({"agent": "demo", "title": "Contract"}),
        )
        .await;
    contract.answer("post", "/api/v1/conversations", &created);
    let id = created.1["id"].as_str().unwrap().to_owned();
    let conv = |p: &str| format!("/api/v1/conversations/{id}{p}");
    let mut ws = gw.conversation_ws(&id, 0).await;

    // A turn with a permission request, answered.
    let prompted = gw.post(&conv("/prompts"), json!({"text": "tool"})).await;
    contract.answer("post", "/api/v1/conversations/{id}/prompts", &prompted);
    let request = ws.until_type("permission_requested").await.pop().unwrap();
    let permission = request["data"]["id"].as_str().unwrap().to_owned();
    contract.answer(
        "get",
        "/api/v1/permissions",
        &gw.get("/api/v1/permissions").await,
    );
    contract.answer(
        "get",
        "/api/v1/permissions/{id}",
        &gw.get(&format!("/api/v1/permissions/{permission}")).await,
    );
    let answered = gw
        .post(
            &format!("/api/v1/permissions/{permission}/respond"),
            json!({"option_id": "allow-always"}),
        )
        .await;
    contract.answer("post", "/api/v1/permissions/{id}/respond", &answered);
    ws.until_type("turn_ended").await;

    // Settings, a plan, a cancelled turn.
    let mode = gw.set_mode(&id, "plan").await;
    contract.answer("post", "/api/v1/conversations/{id}/mode", &mode);
    let option = gw.set_option(&id, "model", json!("large")).await;
    contract.answer("post", "/api/v1/conversations/{id}/config-options", &option);
    gw.prompt(&id, "plan").await;
    ws.until_type("turn_ended").await;
    gw.prompt(&id, "hang").await;
    ws.until_type("turn_started").await;
    let cancelled = gw.post(&conv("/cancel"), json!({})).await;
    contract.answer("post", "/api/v1/conversations/{id}/cancel", &cancelled);
    ws.until_type("turn_ended").await;

    // Everything read back.
    for (path, template) in [
        (conv(""), "/api/v1/conversations/{id}"),
        (conv("/events"), "/api/v1/conversations/{id}/events"),
        (conv("/messages"), "/api/v1/conversations/{id}/messages"),
        (conv("/tool-calls"), "/api/v1/conversations/{id}/tool-calls"),
        (conv("/rules"), "/api/v1/conversations/{id}/rules"),
        ("/api/v1/conversations".into(), "/api/v1/conversations"),
        (
            "/api/v1/permissions?status=all".into(),
            "/api/v1/permissions",
        ),
        ("/api/v1/policies".into(), "/api/v1/policies"),
        ("/api/v1/tokens".into(), "/api/v1/tokens"),
    ] {
        contract.answer("get", template, &gw.get(&path).await);
    }
    let (_, rules) = gw.get(&conv("/rules")).await;
    let rule = rules["items"][0]["id"].as_str().unwrap().to_owned();
    contract.answer(
        "get",
        "/api/v1/conversations/{id}/rules/{rule_id}",
        &gw.get(&conv(&format!("/rules/{rule}"))).await,
    );
    let evaluated = gw
        .post(
            "/api/v1/policies/evaluate",
            json!({"agent": "demo", "tool_call": {"kind": "read", "title": "Read x"}}),
        )
        .await;
    contract.answer("post", "/api/v1/policies/evaluate", &evaluated);
    let events = gw.events(&id).await;
    let kinds: std::collections::BTreeSet<&str> =
        events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds.into_iter().collect::<Vec<_>>(),
        [
            "agent_status",
            "config_option_changed",
            "mode_changed",
            "permission_requested",
            "permission_resolved",
            "session_update",
            "turn_ended",
            "turn_started",
        ]
    );
    // Each WebSocket frame is an Event too.
    let mut live = gw.conversation_ws(&id, 0).await;
    for _ in 0..events.len() {
        contract.schema("Event", &live.next().await);
    }
    for _ in 0..3 {
        contract.schema("Event", &inbox.next().await);
    }

    // Problems.
    let unknown = format!("/api/v1/conversations/{}", uuid::Uuid::now_v7());
    contract.answer("get", "/api/v1/conversations/{id}", &gw.get(&unknown).await);
    let invalid = gw
        .post(&conv("/prompts"), json!({"text": "a", "content": []}))
        .await;
    contract.answer("post", "/api/v1/conversations/{id}/prompts", &invalid);
    let malformed = gw
        .post_raw(&conv("/prompts"), "application/json", "{")
        .await;
    contract.answer("post", "/api/v1/conversations/{id}/prompts", &malformed);
    let not_json = gw.post_raw(&conv("/prompts"), "text/plain", "hi").await;
    contract.answer("post", "/api/v1/conversations/{id}/prompts", &not_json);
    let refused = gw.set_mode(&id, "yolo").await;
    contract.answer("post", "/api/v1/conversations/{id}/mode", &refused);
    let closed = gw.delete(&conv("")).await;
    contract.answer("delete", "/api/v1/conversations/{id}", &closed);
    let after_close = gw.post(&conv("/prompts"), json!({"text": "x"})).await;
    contract.answer("post", "/api/v1/conversations/{id}/prompts", &after_close);
    for (status, _) in [&invalid, &malformed, &not_json, &refused, &after_close] {
        assert!(*status >= 400, "{status}");
    }

    // A wrong schema is caught: the same conversation against a document
    // that says `last_seq` is a string.
    let (_, conversation) = gw.get(&conv("")).await;
    let mut wrong = Contract::new();
    wrong.doc["components"]["schemas"]["Conversation"]["properties"]["last_seq"] =
        json!({"type": "string"});
    let schema = json!({"$ref": "#/components/schemas/Conversation"});
    assert!(!wrong.violations(&schema, &conversation).is_empty());
    assert!(contract.violations(&schema, &conversation).is_empty());
}

/// Files and terminals served to an agent (the npm SDK agent's `calls`):
/// their events and the change list match the document too.
async fn file_and_terminal_events_match_the_document(db: TestDb) {
    let contract = Contract::new();
    let dir = tempfile::tempdir().unwrap();
    let cwd = std::fs::canonicalize(dir.path()).unwrap();
    let profile = acp_gateway::config::AgentProfile {
        cwd: Some(cwd.clone()),
        client_fs: true,
        client_terminal: true,
        ..node_sdk_profile("sdk")
    };
    let gw = TestGateway::start(&db, vec![profile]).await;
    let (id, mut ws) = gw.open_conversation("sdk").await;
    let calls = json!([
        ["fs/write_text_file", {"path": cwd.join("a.txt"), "content": "a\n"}],
        ["terminal/create", {"command": "echo", "args": ["hi"]}],
        ["terminal/wait_for_exit", {"terminalId": "$terminal"}],
    ]);
    gw.prompt(&id, &format!("calls {calls}")).await;
    ws.until_type("turn_ended").await;
    let files = gw.get(&format!("/api/v1/conversations/{id}/files")).await;
    contract.answer("get", "/api/v1/conversations/{id}/files", &files);
    assert_eq!(files.1["items"].as_array().unwrap().len(), 1);
    let events = gw.events(&id).await;
    let mut terminal = 0;
    for event in &events {
        contract.schema("Event", event);
        terminal += usize::from(event["type"] == "terminal_output");
    }
    // What ran, "hi", how it ended (the exit may come after the turn).
    if terminal < 3 {
        ws.until(|e| e["type"] == "terminal_output" && e["data"]["exit_status"].is_object())
            .await;
    }
    for event in gw.events(&id).await {
        contract.schema("Event", &event);
    }
    assert!(events.iter().any(|e| e["type"] == "file_written"));
}

backend_tests!(
    the_gateway_serves_its_document,
    real_answers_and_events_match_the_document,
    file_and_terminal_events_match_the_document,
);
