//! The OpenAPI document: the committed `openapi/openapi.yaml` is exactly
//! what the code produces, and the gateway serves it.

mod common;

use common::*;

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
                            || path == "/readyz",
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

backend_tests!(the_gateway_serves_its_document);
