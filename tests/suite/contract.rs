//! The document says exactly what the API accepts: requests on which the
//! two could disagree (a page's cursor, a WebSocket's handshake, a cwd, a
//! setting, a prompt, an answer), each asked of both. Where the document
//! calls one invalid the API rejects it (400 or 422); where it calls it
//! valid the API accepts it, or answers with a status that depends on the
//! server's state (404, 409), which schemathesis counts as accepting too.
//! (`PUT /api/v1/policies` with `max_auto_per.count = 0`: `contract_policies`.)

use crate::common::*;
use serde_json::{json, Value};

/// The OpenAPI document, and its verdict on requests (every contract test's).
pub(crate) struct Document {
    doc: Value,
}

impl Document {
    pub(crate) fn new() -> Document {
        Document {
            doc: serde_json::to_value(acp_gateway::api::openapi()).unwrap(),
        }
    }

    fn operation(&self, method: &str, path: &str) -> &Value {
        let operation = &self.doc["paths"][path][method];
        assert!(operation.is_object(), "no {method} {path} in the document");
        operation
    }

    /// A validator of `schema`, resolved in the document, formats checked
    /// as schemathesis checks them.
    fn validator(&self, schema: &Value) -> jsonschema::Validator {
        let mut root = schema.clone();
        root["components"] = self.doc["components"].clone();
        jsonschema::options()
            .should_validate_formats(true)
            .build(&root)
            .expect("a valid JSON Schema")
    }

    /// A validator of the operation's JSON request body.
    pub(crate) fn request_body(&self, method: &str, path: &str) -> jsonschema::Validator {
        let schema =
            &self.operation(method, path)["requestBody"]["content"]["application/json"]["schema"];
        assert!(schema.is_object(), "{method} {path} takes no JSON body");
        self.validator(schema)
    }

    /// Why the document calls this JSON body invalid (nothing: valid).
    pub(crate) fn body_violations(&self, method: &str, path: &str, body: &Value) -> Vec<String> {
        self.request_body(method, path)
            .iter_errors(body)
            .map(|e| e.to_string())
            .collect()
    }

    /// Whether the document calls this JSON body valid.
    pub(crate) fn body_valid(&self, method: &str, path: &str, body: &Value) -> bool {
        self.body_violations(method, path, body).is_empty()
    }

    /// The statuses the operation documents.
    pub(crate) fn statuses(&self, method: &str, path: &str) -> Vec<u16> {
        self.operation(method, path)["responses"]
            .as_object()
            .unwrap()
            .keys()
            .map(|s| s.parse().unwrap())
            .collect()
    }

    /// Whether the operation documents `status`.
    pub(crate) fn documents(&self, method: &str, path: &str, status: u16) -> bool {
        self.statuses(method, path).contains(&status)
    }

    fn parameter(&self, method: &str, path: &str, name: &str) -> &Value {
        self.operation(method, path)["parameters"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("{method} {path} has no parameter {name}"))
    }

    /// Whether the document calls `value` valid for the parameter.
    fn parameter_valid(&self, method: &str, path: &str, name: &str, value: &str) -> bool {
        let schema = &self.parameter(method, path, name)["schema"];
        self.validator(schema).is_valid(&json!(value))
    }

    /// The header parameters an operation requires.
    fn required_headers(&self, method: &str, path: &str) -> Vec<String> {
        self.operation(method, path)["parameters"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["in"] == "header" && p["required"] == true)
            .map(|p| p["name"].as_str().unwrap().to_owned())
            .collect()
    }

    /// Asserts the operation documents `status` with a problem document.
    fn documents_problem(&self, method: &str, path: &str, status: u16) {
        let response = &self.operation(method, path)["responses"][status.to_string()];
        assert_eq!(
            response["content"]["application/problem+json"]["schema"]["$ref"],
            "#/components/schemas/Problem",
            "{method} {path} {status}: {response}"
        );
    }
}

/// What schemathesis counts as rejecting a request the document calls invalid.
fn rejected(status: u16) -> bool {
    matches!(status, 400 | 422)
}

/// What it counts as accepting one the document calls valid.
fn accepted(status: u16) -> bool {
    matches!(status, 101 | 200..=399 | 401 | 403 | 404 | 409 | 429)
}

async fn the_document_and_the_api_agree_on_which_requests_are_valid(db: TestDb) {
    let doc = Document::new();
    let (gw, id, mut ws) = demo_conversation(&db).await;

    // A list's cursor is a conversation id: the document says uuid.
    let list = "/api/v1/conversations";
    for cursor in ["N\u{8f}Á", "nope", ""] {
        assert!(
            !doc.parameter_valid("get", list, "cursor", cursor),
            "{cursor:?}"
        );
        let query = format!("{list}?cursor={}", urlencode(cursor));
        let (status, problem) = gw.get(&query).await;
        assert!(rejected(status), "{query}: {status} {problem}");
    }
    let unknown = uuid::Uuid::now_v7().to_string();
    assert!(doc.parameter_valid("get", list, "cursor", &unknown));
    let (status, page) = gw.get(&format!("{list}?cursor={unknown}")).await;
    assert_eq!(status, 200, "{page}");
    assert!(doc.parameter_valid("get", "/api/v1/search", "cursor", &unknown));
    assert!(!doc.parameter_valid("get", "/api/v1/search", "cursor", "nope"));

    // A WebSocket endpoint without the handshake: the document requires its
    // headers, and the answer is a documented problem document.
    let handshake = [
        "Connection",
        "Upgrade",
        "Sec-WebSocket-Version",
        "Sec-WebSocket-Key",
    ];
    for (path, url) in [
        (
            "/api/v1/conversations/{id}/ws",
            format!("/api/v1/conversations/{id}/ws"),
        ),
        ("/api/v1/ws", "/api/v1/ws".to_owned()),
    ] {
        assert_eq!(doc.required_headers("get", path), handshake, "{path}");
        doc.documents_problem("get", path, 400);
        let resp = gw.http.get(gw.url(&url)).send().await.unwrap();
        assert_eq!(resp.status(), 400, "{url}");
        assert_eq!(
            resp.headers()["content-type"],
            "application/problem+json",
            "{url}"
        );
        let problem: Value = resp.json().await.unwrap();
        assert_eq!(problem["code"], "not_a_websocket_handshake", "{problem}");
        assert!(
            problem["detail"].as_str().unwrap().contains("Connection"),
            "{problem}"
        );
        // Each header the document names is one the gateway checks.
        for missing in handshake {
            let mut request = gw.http.get(gw.url(&url));
            for (name, value) in [
                ("Connection", "keep-alive, Upgrade"),
                ("Upgrade", "websocket"),
                ("Sec-WebSocket-Version", "13"),
                ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
            ] {
                if name != missing {
                    request = request.header(name, value);
                }
            }
            let resp = request.send().await.unwrap();
            assert_eq!(resp.status(), 400, "{url} without {missing}");
            let problem: Value = resp.json().await.unwrap();
            assert!(
                problem["detail"].as_str().unwrap().contains(missing),
                "{url} without {missing}: {problem}"
            );
        }
    }
    // With them, it upgrades (101): the harness's WebSocket client.
    gw.ws("/api/v1/ws").await;

    // A conversation's cwd: absolute, 1 to 1024 characters.
    let create = "/api/v1/conversations";
    for body in [
        json!({"agent": "demo", "cwd": "", "title": ""}),
        json!({"agent": "demo", "cwd": "relative"}),
        json!({"agent": "demo", "cwd": format!("/{}", "d".repeat(1024))}),
    ] {
        assert!(!doc.body_valid("post", create, &body), "{body}");
        let (status, problem) = gw.post(create, body.clone()).await;
        assert!(rejected(status), "{body}: {status} {problem}");
    }
    // What the document cannot know (the disk) is a state, not an error.
    let missing = json!({"agent": "demo", "cwd": "/no/such/directory", "title": ""});
    assert!(doc.body_valid("post", create, &missing));
    let (status, problem) = gw.post(create, missing).await;
    assert_eq!(status, 404, "{problem}");

    // Settings: an empty id is invalid; one the agent does not offer is a
    // conflict with what it offers (the document cannot list it).
    let config = "/api/v1/conversations/{id}/config-options";
    let body = json!({"config_id": "", "value": true});
    assert!(!doc.body_valid("post", config, &body));
    let (status, problem) = gw
        .post(&format!("/api/v1/conversations/{id}/config-options"), body)
        .await;
    assert!(rejected(status), "{status} {problem}");
    let mode = "/api/v1/conversations/{id}/mode";
    let long = json!({"mode_id": "0".repeat(200)});
    assert!(doc.body_valid("post", mode, &long));
    let (status, problem) = gw
        .post(&format!("/api/v1/conversations/{id}/mode"), long)
        .await;
    assert!(accepted(status), "{status} {problem}");
    assert_eq!(problem["code"], "not_offered", "{problem}");
    let too_long = json!({"mode_id": "0".repeat(201)});
    assert!(!doc.body_valid("post", mode, &too_long));
    let (status, _) = gw
        .post(&format!("/api/v1/conversations/{id}/mode"), too_long)
        .await;
    assert!(rejected(status));

    // A prompt: exactly one of text and content, which the document says.
    let prompts = "/api/v1/conversations/{id}/prompts";
    for body in [
        json!({"content": null, "text": null}),
        json!({"text": "hi", "content": null}),
        json!({"text": "hi", "content": [{"type": "text", "text": "hi"}]}),
        json!({}),
        json!({"content": []}),
    ] {
        assert!(!doc.body_valid("post", prompts, &body), "{body}");
        let (status, problem) = gw
            .post(&format!("/api/v1/conversations/{id}/prompts"), body.clone())
            .await;
        assert!(rejected(status), "{body}: {status} {problem}");
    }
    let text = json!({"text": "tool"});
    assert!(doc.body_valid("post", prompts, &text));
    assert!(doc.body_valid(
        "post",
        prompts,
        &json!({"content": [{"type": "text", "text": "hi"}]})
    ));
    let (status, turn) = gw
        .post(&format!("/api/v1/conversations/{id}/prompts"), text)
        .await;
    assert_eq!(status, 202, "{turn}");

    // An answer: exactly one of option_id and outcome.
    let request = ws.until_type("permission_requested").await.pop().unwrap()["data"].clone();
    let respond = "/api/v1/permissions/{id}/respond";
    let url = format!(
        "/api/v1/permissions/{}/respond",
        request["id"].as_str().unwrap()
    );
    for body in [
        json!({"option_id": null, "outcome": null}),
        json!({"option_id": "allow-once", "outcome": null}),
        json!({"outcome": "selected"}),
        json!({}),
    ] {
        assert!(!doc.body_valid("post", respond, &body), "{body}");
        let (status, problem) = gw.post(&url, body.clone()).await;
        assert!(rejected(status), "{body}: {status} {problem}");
    }
    let other = json!({"option_id": "no-such-option"});
    assert!(doc.body_valid("post", respond, &other));
    let (status, problem) = gw.post(&url, other).await;
    assert_eq!(status, 409, "{problem}");
    assert_eq!(problem["code"], "not_offered", "{problem}");
    let allow = json!({"option_id": "allow-once"});
    assert!(doc.body_valid("post", respond, &allow));
    let (status, answered) = gw.post(&url, allow).await;
    assert_eq!(status, 200, "{answered}");
    ws.until_type("turn_ended").await;
    gw.stop().await;
}

fn urlencode(text: &str) -> String {
    text.bytes().map(|b| format!("%{b:02X}")).collect()
}

crate::backend_tests!(the_document_and_the_api_agree_on_which_requests_are_valid);
