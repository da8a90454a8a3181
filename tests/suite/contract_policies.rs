//! The OpenAPI document's word on `PUT /api/v1/policies` and
//! `POST /api/v1/policies/evaluate` is the API's: each rule the API enforces
//! on a body, the request schema states (checked here with the `jsonschema`
//! crate, formats asserted, as schemathesis checks), and the live gateway
//! refuses what the schema refuses; a body the schema admits the gateway
//! takes (or answers a status schemathesis counts as taking it: 404 for an
//! unknown name, 409 for two rules with one name).

use crate::common::*;
use crate::contract::Document;
use serde_json::{json, Value};

/// The request body schema of an operation, ready to validate.
fn request_schema(method: &str, path: &str) -> jsonschema::Validator {
    Document::new().request_body(method, path)
}

/// The statuses an operation documents.
fn documented(method: &str, path: &str) -> Vec<u16> {
    Document::new().statuses(method, path)
}

/// A rule every case starts from: an allow rule with every field.
fn rule() -> Value {
    json!({
        "name": "edits inside the workspace",
        "agents": ["*"],
        "kinds": ["edit"],
        "commands": ["^git\\s+status\\b"],
        "paths": ["{cwd}/**"],
        "decision": "allow",
        "max_auto_per": {"count": 10, "window": "15m"},
        "remember": true
    })
}

/// The base rule with the field at `pointer` set to `value` (added when
/// the rule has no such field).
fn with(pointer: &str, value: Value) -> Value {
    let mut rule = rule();
    match rule.pointer_mut(pointer) {
        Some(field) => *field = value,
        None => rule[pointer.trim_start_matches('/')] = value,
    }
    rule
}

/// Rules the document refuses; the gateway answers 422 naming the field.
fn invalid_rules() -> Vec<(&'static str, Value, &'static str)> {
    let long = "é".repeat(101);
    vec![
        // The least count the document refuses.
        ("count 0", with("/max_auto_per/count", json!(0)), "count"),
        (
            "count over the limit",
            with("/max_auto_per/count", json!(10_001)),
            "count",
        ),
        (
            "count negative",
            with("/max_auto_per/count", json!(-1)),
            "count",
        ),
        (
            "count fractional",
            with("/max_auto_per/count", json!(1.5)),
            "count",
        ),
        (
            "window zero",
            with("/max_auto_per/window", json!("0s")),
            "window",
        ),
        (
            "window fractional",
            with("/max_auto_per/window", json!("1.5h")),
            "window",
        ),
        (
            "window without unit",
            with("/max_auto_per/window", json!("15")),
            "window",
        ),
        (
            "window unknown unit",
            with("/max_auto_per/window", json!("15 fortnights")),
            "window",
        ),
        (
            "window leading space",
            with("/max_auto_per/window", json!(" 15m")),
            "window",
        ),
        (
            "window too long",
            with("/max_auto_per/window", json!("1s".repeat(33))),
            "window",
        ),
        ("name empty", with("/name", json!("")), "name"),
        (
            "name blank",
            with("/name", json!(" \u{3000}\u{2028}")),
            "name",
        ),
        ("name two lines", with("/name", json!("a\nb")), "name"),
        ("name with NUL", with("/name", json!("a\u{0}")), "name"),
        ("name with DEL", with("/name", json!("a\u{7f}")), "name"),
        ("name too long", with("/name", json!(long)), "name"),
        ("no agents", with("/agents", json!([])), "agents"),
        (
            "regex unclosed",
            with("/commands", json!(["^rm("])),
            "commands[0]",
        ),
        (
            "regex Rust-only flag",
            with("/commands", json!(["(?i)^rm"])),
            "commands[0]",
        ),
        (
            "regex lone bracket",
            with("/commands", json!(["a]"])),
            "commands[0]",
        ),
        (
            "regex Rust-only escape",
            with("/commands", json!(["^rm\\z"])),
            "commands[0]",
        ),
        (
            "glob unclosed class",
            with("/paths", json!(["{cwd}/["])),
            "paths[0]",
        ),
        (
            "glob empty class",
            with("/paths", json!(["{cwd}/[!]"])),
            "paths[0]",
        ),
        (
            "glob range",
            with("/paths", json!(["{cwd}/[a-z]*"])),
            "paths[0]",
        ),
        (
            "glob nested alternatives",
            with("/paths", json!(["{a,{b,c}}"])),
            "paths[0]",
        ),
        (
            "glob unopened alternative",
            with("/paths", json!(["a}"])),
            "paths[0]",
        ),
        (
            "glob dangling escape",
            with("/paths", json!(["a\\"])),
            "paths[0]",
        ),
        (
            "glob escaped brace",
            with("/paths", json!(["\\{cwd}"])),
            "paths[0]",
        ),
        (
            "limit on a deny rule",
            json!({"name": "d", "decision": "deny", "max_auto_per": {"count": 1, "window": "1m"}}),
            "max_auto_per",
        ),
        (
            "limit on an ask rule",
            json!({"name": "a", "decision": "ask", "max_auto_per": {"count": 1, "window": "1m"}}),
            "max_auto_per",
        ),
        (
            "remember on a deny rule",
            json!({"name": "d", "decision": "deny", "remember": true}),
            "remember",
        ),
        (
            "unknown decision",
            with("/decision", json!("maybe")),
            "decision",
        ),
        ("unknown field", with("/colour", json!("blue")), "colour"),
        (
            "window not a string",
            with("/max_auto_per/window", json!(60)),
            "window",
        ),
    ]
}

/// Rule lists the document admits, each put in force as is.
fn valid_lists() -> Vec<(&'static str, Value)> {
    vec![
        ("no rules", json!([])),
        ("every field", json!([rule()])),
        (
            "the limits' edges",
            json!([
                with("/max_auto_per", json!({"count": 1, "window": "1s"})),
                {"name": "é".repeat(100), "decision": "allow",
                 "max_auto_per": {"count": 10_000, "window": "999999999y".repeat(6)}}
            ]),
        ),
        (
            "a whole number written with a fraction",
            json!([with("/max_auto_per/count", json!(5.0))]),
        ),
        (
            "windows of several parts",
            json!([
                with("/max_auto_per/window", json!("1h 30m")),
                {"name": "b", "decision": "allow", "max_auto_per": {"count": 2, "window": "90 seconds"}},
                {"name": "c", "decision": "allow", "max_auto_per": {"count": 2, "window": "1d12h "}}
            ]),
        ),
        (
            "deny and ask rules with what they may say of limits",
            json!([
                {"name": "no secrets", "paths": ["{cwd}/secret/**", "**/*.{pem,key}"],
                 "decision": "deny", "max_auto_per": null, "remember": false},
                {"name": "ask for git", "kinds": ["execute"], "commands": ["(?i:^git)\\s"],
                 "decision": "ask"}
            ]),
        ),
        (
            "globs of every construct",
            json!([with(
                "/paths",
                json!([
                    "",
                    "/etc/**",
                    "{cwd}/[!.]*",
                    "a\\*b\\}",
                    "[]-]",
                    "[{]",
                    "{,x}",
                    "**/a,b",
                    "?]"
                ])
            )]),
        ),
        (
            "names of any script, strings with NUL where no rule forbids it",
            json!([
                {"name": " règle ✓ ", "kinds": ["a\u{0}"], "agents": ["\u{0}"], "decision": "deny"},
                {"name": "\u{200b}", "decision": "ask"}
            ]),
        ),
    ]
}

fn body(items: Value) -> Value {
    json!({ "items": items })
}

async fn every_rule_of_put_policies_is_in_the_document(db: TestDb) {
    let gw = TestGateway::start(&db, vec![demo_profile("demo", &[])]).await;
    let schema = request_schema("put", "/api/v1/policies");
    let statuses = documented("put", "/api/v1/policies");
    let put = |body: Value| gw.call("PUT", "/api/v1/policies", Some(body));
    let (_, before) = gw.get("/api/v1/policies").await;

    let mut cases: Vec<(String, Value, String)> = invalid_rules()
        .into_iter()
        .map(|(what, rule, field)| (what.to_owned(), body(json!([rule])), field.to_owned()))
        .collect();
    let too_many: Vec<Value> = (0..1001)
        .map(|i| json!({"name": format!("r{i}"), "decision": "ask"}))
        .collect();
    cases.push(("1001 rules".into(), body(json!(too_many)), "1000".into()));
    cases.push(("no items".into(), json!({}), "items".into()));
    for (what, body, field) in cases {
        assert!(
            !schema.is_valid(&body),
            "{what}: the document admits {body}"
        );
        let (status, problem) = put(body).await;
        assert_eq!(status, 422, "{what}: {problem}");
        assert!(statuses.contains(&status), "{what}: {status} undocumented");
        let detail = problem["detail"].as_str().unwrap();
        assert!(detail.contains(&field), "{what}: {detail}");
    }
    // None of it changed anything.
    assert_eq!(gw.get("/api/v1/policies").await.1, before);

    let policies = acp_gateway::api::openapi();
    let doc = serde_json::to_value(&policies).unwrap();
    let mut list = doc["components"]["schemas"]["Policies"].clone();
    list["components"] = doc["components"].clone();
    let list = jsonschema::options()
        .should_validate_formats(true)
        .build(&list)
        .unwrap();
    for (what, items) in valid_lists() {
        let body = body(items.clone());
        let errors: Vec<String> = schema.iter_errors(&body).map(|e| e.to_string()).collect();
        assert!(errors.is_empty(), "{what}: {errors:?}");
        let (status, answer) = put(body).await;
        assert_eq!(status, 200, "{what}: {answer}");
        // In force, read back as sent, in the shape the document gives.
        let (_, now) = gw.get("/api/v1/policies").await;
        assert!(list.is_valid(&now), "{what}: {now}");
        let sent: Vec<Value> = serde_json::from_value(items).unwrap();
        for (got, sent) in now["items"].as_array().unwrap().iter().zip(&sent) {
            assert_eq!(got["name"], sent["name"], "{what}");
            assert_eq!(
                got["max_auto_per"]["window"],
                sent["max_auto_per"]["window"]
            );
        }
    }

    // Two rules with one name: each is valid, the list is not, which no
    // JSON Schema says; 409, not 422, and the list in force stays.
    let (_, before) = gw.get("/api/v1/policies").await;
    let twice = body(json!([rule(), with("/kinds", json!(["read"]))]));
    assert!(schema.is_valid(&twice));
    let problem = assert_problem(put(twice).await, 409, "policies[1]");
    assert_eq!(problem["code"], "duplicate_name");
    assert!(statuses.contains(&409));
    assert_eq!(gw.get("/api/v1/policies").await.1, before);
    // With an invalid rule too, the invalid rule is what is reported.
    let both = body(json!([rule(), rule(), with("/agents", json!([]))]));
    assert_problem(put(both).await, 422, "policies[2]");
}

/// What only words in the document say: a regex valid in ECMAScript that
/// the Rust engine, which runs it, does not take. schemathesis' regexes
/// never use these constructs.
async fn regexes_rust_cannot_run_are_refused_as_the_description_says(db: TestDb) {
    let gw = TestGateway::start(&db, vec![demo_profile("demo", &[])]).await;
    let schema = request_schema("put", "/api/v1/policies");
    for regex in ["(?=x)", "(a)\\1", "\\0", "[]", "\\cA"] {
        let body = body(json!([with("/commands", json!([regex]))]));
        assert!(schema.is_valid(&body), "{regex}");
        let problem = assert_problem(
            gw.call("PUT", "/api/v1/policies", Some(body)).await,
            422,
            "commands[0]: invalid regex",
        );
        assert_eq!(problem["code"], "invalid_request");
    }
}

async fn every_rule_of_evaluate_is_in_the_document(db: TestDb) {
    let gw = TestGateway::start(&db, vec![demo_profile("demo", &[])]).await;
    let schema = request_schema("post", "/api/v1/policies/evaluate");
    let statuses = documented("post", "/api/v1/policies/evaluate");
    let ask = json!({"agent": "demo", "tool_call": {"kind": "read", "title": "Read x"}});
    let with = |key: &str, value: Value| {
        let mut body = ask.clone();
        body[key] = value;
        body
    };
    for (what, body) in [
        ("agent capitalised", with("agent", json!("Demo"))),
        ("agent empty", with("agent", json!(""))),
        ("agent too long", with("agent", json!("a".repeat(65)))),
        ("agent with a space", with("agent", json!("de mo"))),
        ("agent with NUL", with("agent", json!("demo\u{0}"))),
        ("tool_call a string", with("tool_call", json!("read"))),
        ("tool_call a list", with("tool_call", json!([]))),
        ("cwd relative", with("cwd", json!("src"))),
        (
            "conversation_id not a UUID",
            with("conversation_id", json!("nope")),
        ),
        ("unknown field", with("mode", json!("trusted"))),
        ("no tool_call", json!({"agent": "demo"})),
    ] {
        assert!(
            !schema.is_valid(&body),
            "{what}: the document admits {body}"
        );
        let (status, problem) = gw.post("/api/v1/policies/evaluate", body).await;
        assert_eq!(status, 422, "{what}: {problem}");
        assert!(statuses.contains(&status), "{what}");
    }
    let dir = tempfile::tempdir().unwrap();
    let conversation = uuid::Uuid::now_v7().to_string();
    for (what, body, expected) in [
        ("the profile's cwd", ask.clone(), 200),
        ("a cwd", with("cwd", json!(dir.path())), 200),
        (
            "a well-formed unknown agent",
            with("agent", json!("a".repeat(64))),
            404,
        ),
        (
            "an unknown conversation",
            with("conversation_id", json!(conversation)),
            404,
        ),
        ("any tool call object", with("tool_call", json!({})), 200),
    ] {
        let errors: Vec<String> = schema.iter_errors(&body).map(|e| e.to_string()).collect();
        assert!(errors.is_empty(), "{what}: {errors:?}");
        let (status, answer) = gw.post("/api/v1/policies/evaluate", body).await;
        assert_eq!(status, expected, "{what}: {answer}");
        assert!(statuses.contains(&status), "{what}");
    }
}

/// The config file's rules go through the same checks: a count the
/// document refuses stops the gateway from starting, naming the rule.
#[tokio::test]
async fn the_config_file_is_checked_as_the_api_checks() {
    let db = TestDb::sqlite().await;
    let mut config = Config::for_tests(&db, vec![demo_profile("demo", &[])]);
    config.policies = serde_json::from_value(json!([
        {"name": "r", "decision": "allow", "max_auto_per": {"count": 0, "window": "1m"}}
    ]))
    .unwrap();
    let err = config.validate().unwrap_err().to_string();
    assert!(
        err.contains("policies[0] (\"r\").max_auto_per.count"),
        "{err}"
    );
    config.policies = serde_json::from_value(json!([rule()])).unwrap();
    config.validate().unwrap();
}

backend_tests!(
    every_rule_of_put_policies_is_in_the_document,
    regexes_rust_cannot_run_are_refused_as_the_description_says,
    every_rule_of_evaluate_is_in_the_document,
);
