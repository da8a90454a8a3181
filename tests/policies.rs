//! Operator policies end to end: real agent subprocesses, decisions without a
//! person where the rules say so, audited with the rule's name.

mod common;

use acp_gateway::config::AgentProfile;
use acp_gateway::policy::{Mode, PolicyRule};
use common::*;
use serde_json::{json, Value};

/// The example rules.
fn example_rules() -> Vec<PolicyRule> {
    serde_json::from_value(json!([
        {"name": "read-only tools", "kinds": ["read", "search", "think", "fetch"], "decision": "allow"},
        {"name": "no destructive shell", "kinds": ["execute"],
         "commands": ["^rm\\s+-rf\\b", "^git\\s+push\\s+.*--force"], "decision": "deny"},
        {"name": "edits inside the workspace", "kinds": ["edit", "delete", "move"],
         "paths": ["{cwd}/**"], "decision": "allow", "max_auto_per": {"count": 10, "window": "15m"}}
    ]))
    .unwrap()
}

async fn start_with(db: &TestDb, profile: AgentProfile) -> (TestGateway, String, Ws) {
    let mut config = TestGateway::config(db, vec![profile]);
    config.policies = example_rules();
    let gw = TestGateway::start_with(config).await;
    let dir = std::env::temp_dir().join("acp-gateway-policy-tests");
    std::fs::create_dir_all(&dir).unwrap();
    let (status, conv) = gw
        .post(
            "/api/v1/conversations",
            json!({"agent": "demo", "cwd": dir.to_str().unwrap()}),
        )
        .await;
    assert_eq!(status, 201, "{conv}");
    let id = conv["id"].as_str().unwrap().to_owned();
    let ws = gw.conversation_ws(&id, 0).await;
    (gw, id, ws)
}

/// Runs a prompt to its end; returns the permission request as finally
/// resolved, or the pending one (answering it `allow-once` when `answer`).
async fn run(gw: &TestGateway, id: &str, ws: &mut Ws, prompt: &str) -> (Value, Vec<Value>) {
    gw.prompt(id, prompt).await;
    let frames = ws.until(|e| e["type"] == "permission_requested").await;
    let requested = frames.last().unwrap()["data"].clone();
    let next = ws.next().await;
    if next["type"] == "permission_resolved" {
        let rest = ws.until_type("turn_ended").await;
        return (next["data"].clone(), rest);
    }
    panic!("expected the policy to decide {prompt:?} at once, got {next} after {requested}");
}

async fn a_read_is_auto_approved_and_audited_with_the_rule_name(db: TestDb) {
    let (gw, id, mut ws) = start_with(&db, demo_profile("demo", &[])).await;
    let (resolved, frames) = run(&gw, &id, &mut ws, "read src/main.rs").await;
    assert_eq!(resolved["status"], "approved");
    assert_eq!(resolved["decision"]["option_id"], "allow-once");
    assert_eq!(resolved["decision"]["decided_by"], "policy:read-only tools");
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "end_turn");
    let (_, audit) = gw
        .get(&format!(
            "/api/v1/permissions?status=all&conversation_id={id}"
        ))
        .await;
    assert_eq!(audit["items"][0], resolved);
    let (_, tools) = gw
        .get(&format!("/api/v1/conversations/{id}/tool-calls"))
        .await;
    assert_eq!(tools["items"][0]["status"], "completed");
}

async fn a_destructive_command_is_denied_without_a_person(db: TestDb) {
    let (gw, id, mut ws) = start_with(&db, demo_profile("demo", &[])).await;
    let (resolved, frames) = run(&gw, &id, &mut ws, "execute ls && rm -rf /").await;
    assert_eq!(resolved["status"], "rejected");
    assert_eq!(resolved["decision"]["option_id"], "reject-once");
    assert_eq!(
        resolved["decision"]["decided_by"],
        "policy:no destructive shell"
    );
    assert!(resolved["decision"]["reason"]
        .as_str()
        .unwrap()
        .contains("rm -rf /"));
    assert_eq!(
        streamed_text(&frames, "agent_message_chunk"),
        "Permission denied."
    );
    let (_, pending) = gw.get("/api/v1/permissions?status=pending").await;
    assert_eq!(pending["items"], json!([]));
}

async fn an_unmatched_edit_waits_for_a_person(db: TestDb) {
    let (gw, id, mut ws) = start_with(&db, demo_profile("demo", &[])).await;
    // Inside the workspace: allowed. Escaping it with `..`: a person decides.
    let (resolved, _) = run(&gw, &id, &mut ws, "edit notes.txt").await;
    assert_eq!(
        resolved["decision"]["decided_by"],
        "policy:edits inside the workspace"
    );
    gw.prompt(&id, "edit ../../etc/passwd").await;
    let request = ws.until_type("permission_requested").await.pop().unwrap()["data"].clone();
    let (_, pending) = gw.get("/api/v1/permissions?status=pending").await;
    assert_eq!(pending["items"][0]["id"], request["id"]);
    let path = format!(
        "/api/v1/permissions/{}/respond",
        request["id"].as_str().unwrap()
    );
    let (status, answered) = gw.post(&path, json!({"option_id": "reject-once"})).await;
    assert_eq!(status, 200);
    assert_eq!(answered["decision"]["decided_by"], "user:anonymous");
    ws.until_type("turn_ended").await;
}

async fn an_invalid_put_is_422_and_the_old_policy_stays_in_force(db: TestDb) {
    let (gw, id, mut ws) = start_with(&db, demo_profile("demo", &[])).await;
    let (_, before) = gw.get("/api/v1/policies").await;
    assert_eq!(before["updated_by"], "config");
    assert_eq!(before["items"].as_array().unwrap().len(), 3);
    let resp = gw
        .http
        .put(gw.url("/api/v1/policies"))
        .json(&json!({"items": [
            {"name": "fine", "kinds": ["read"], "decision": "deny"},
            {"name": "broken", "kinds": ["execute"], "commands": ["^rm("], "decision": "deny"}
        ]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 422);
    let problem: Value = resp.json().await.unwrap();
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("policies[1] (\"broken\").commands[0]"),
        "{problem}"
    );
    assert_eq!(gw.get("/api/v1/policies").await.1, before);
    // The live path still uses the old rules.
    let (resolved, _) = run(&gw, &id, &mut ws, "read a.txt").await;
    assert_eq!(resolved["decision"]["decided_by"], "policy:read-only tools");
}

async fn a_put_applies_to_requests_arriving_after_it_and_records_who_and_when(db: TestDb) {
    let (gw, id, mut ws) = start_with(&db, demo_profile("demo", &[])).await;
    let resp = gw
        .http
        .put(gw.url("/api/v1/policies"))
        .json(&json!({"items": [{"name": "no reading", "kinds": ["read"], "decision": "deny"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let (_, now) = gw.get("/api/v1/policies").await;
    assert_eq!(now["items"][0]["name"], "no reading");
    assert_eq!(now["updated_by"], "user:anonymous");
    assert!(now["updated_at"].is_string());
    let (resolved, _) = run(&gw, &id, &mut ws, "read a.txt").await;
    assert_eq!(resolved["status"], "rejected");
    assert_eq!(resolved["decision"]["decided_by"], "policy:no reading");
    // Persisted: a restarted gateway keeps the new rules over the config file's.
    let gw = gw.restart().await;
    let (_, after) = gw.get("/api/v1/policies").await;
    assert_eq!(after, now);
}

async fn the_dry_run_agrees_with_the_live_path(db: TestDb) {
    let (gw, id, mut ws) = start_with(&db, demo_profile("demo", &[])).await;
    let dir = std::env::temp_dir().join("acp-gateway-policy-tests");
    for prompt in [
        "read x.rs",
        "execute rm -rf build",
        "edit y.rs",
        "edit ../z.rs",
        "execute make",
    ] {
        gw.prompt(&id, prompt).await;
        let requested = ws.until_type("permission_requested").await.pop().unwrap()["data"].clone();
        // A policy decision is committed together with the request.
        let (_, now) = gw
            .get(&format!(
                "/api/v1/permissions/{}",
                requested["id"].as_str().unwrap()
            ))
            .await;
        let live = if now["status"] != "pending" {
            ws.until_type("turn_ended").await;
            let d = &now["decision"];
            let decision = if now["status"] == "approved" {
                "allow"
            } else {
                "deny"
            };
            (
                decision.to_owned(),
                d["decided_by"]
                    .as_str()
                    .unwrap()
                    .trim_start_matches("policy:")
                    .to_owned(),
            )
        } else {
            let path = format!(
                "/api/v1/permissions/{}/respond",
                requested["id"].as_str().unwrap()
            );
            gw.post(&path, json!({"outcome": "cancelled"})).await;
            ws.until_type("turn_ended").await;
            ("ask".to_owned(), String::new())
        };
        let (status, dry) = gw
            .post(
                "/api/v1/policies/evaluate",
                json!({"agent": "demo", "tool_call": requested["tool_call"], "cwd": dir.to_str().unwrap()}),
            )
            .await;
        assert_eq!(status, 200, "{dry}");
        let dry = (
            dry["decision"].as_str().unwrap().to_owned(),
            dry["rule"].as_str().unwrap_or("").to_owned(),
        );
        let dry = if dry.0 == "ask" {
            ("ask".to_owned(), String::new())
        } else {
            dry
        };
        assert_eq!(dry, live, "{prompt}");
    }
    let (status, _) = gw
        .post(
            "/api/v1/policies/evaluate",
            json!({"agent": "nope", "tool_call": {}}),
        )
        .await;
    assert_eq!(status, 404);
}

async fn profile_modes_read_only_and_trusted_apply_but_never_over_a_deny(db: TestDb) {
    let mut read_only = demo_profile("demo", &[]);
    read_only.mode = Mode::ReadOnly;
    let (gw, id, mut ws) = start_with(&db, read_only).await;
    let (resolved, _) = run(&gw, &id, &mut ws, "edit inside.txt").await;
    assert_eq!(resolved["status"], "rejected");
    assert_eq!(resolved["decision"]["decided_by"], "policy:mode:read_only");
    let (resolved, _) = run(&gw, &id, &mut ws, "read inside.txt").await;
    assert_eq!(resolved["status"], "approved");
    gw.stop().await;

    let mut trusted = demo_profile("demo", &[]);
    trusted.mode = Mode::Trusted;
    let (gw, id, mut ws) = start_with(&db, trusted).await;
    let (resolved, _) = run(&gw, &id, &mut ws, "execute make install").await;
    assert_eq!(resolved["status"], "approved");
    assert_eq!(resolved["decision"]["decided_by"], "policy:mode:trusted");
    let (resolved, _) = run(&gw, &id, &mut ws, "execute rm -rf /").await;
    assert_eq!(resolved["status"], "rejected");
    assert_eq!(
        resolved["decision"]["decided_by"],
        "policy:no destructive shell"
    );
}

backend_tests!(
    a_read_is_auto_approved_and_audited_with_the_rule_name,
    a_destructive_command_is_denied_without_a_person,
    an_unmatched_edit_waits_for_a_person,
    an_invalid_put_is_422_and_the_old_policy_stays_in_force,
    a_put_applies_to_requests_arriving_after_it_and_records_who_and_when,
    the_dry_run_agrees_with_the_live_path,
    profile_modes_read_only_and_trusted_apply_but_never_over_a_deny,
);
