//! `acp-gateway export`: a history moves between the embedded database and
//! Postgres (either way) without losing or changing anything.

use crate::common::*;
use serde_json::{json, Value};

/// Everything the API shows of a gateway's history.
async fn history(gw: &TestGateway) -> Value {
    let (_, list) = gw.get("/api/v1/conversations?limit=200").await;
    let mut conversations = Vec::new();
    for c in list["items"].as_array().unwrap() {
        let id = c["id"].as_str().unwrap();
        let part = |p: &str| format!("/api/v1/conversations/{id}/{p}");
        conversations.push(json!({
            "conversation": c,
            "events": gw.events(id).await,
            "messages": gw.get(&part("messages")).await.1,
            "tool_calls": gw.get(&part("tool-calls")).await.1,
            "rules": gw.get(&part("rules")).await.1,
            "members": gw.get(&part("members")).await.1,
        }));
    }
    let (_, permissions) = gw.get("/api/v1/permissions?status=all").await;
    let (_, targets) = gw.get("/api/v1/notification-targets").await;
    let (_, vapid) = gw.get("/api/v1/notifications/vapid-public-key").await;
    // What was spent, of a removed conversation too (its times are now's).
    let (_, usage) = gw.get("/api/v1/usage?group_by=conversation").await;
    let usage = json!({"rows": usage["rows"], "totals": usage["totals"]});
    // Found by a word its agent said, and by one of its prompts.
    let (_, said) = gw.get("/api/v1/search?q=w299").await;
    let (_, prompted) = gw.get("/api/v1/search?q=status").await;
    json!({"conversations": conversations, "permissions": permissions,
           "notification_targets": targets, "vapid": vapid, "usage": usage,
           "search": [said, prompted]})
}

pub(crate) fn export(from: &TestDb, to: &TestDb) -> String {
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(config.path(), format!("database_url = {:?}\n", from.url)).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_acp-gateway"))
        .args(["export", "--config"])
        .arg(config.path())
        .args(["--to", &to.url])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "export failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

async fn make_history(db: &TestDb) {
    let gw = TestGateway::start(db, vec![demo_profile("demo", &[])]).await;
    let id = gw.create_conversation("demo").await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut ws = gw.conversation_ws(&id, 0).await;
    for prompt in ["hello", "plan", "long 300", "unknown", "cost 0.25 0.75"] {
        gw.prompt(&id, prompt).await;
        ws.until_type("turn_ended").await;
    }
    gw.prompt(&id, "execute git status").await;
    let request = ws.until_type("permission_requested").await.pop().unwrap();
    let perm = request["data"]["id"].as_str().unwrap();
    gw.post(
        &format!("/api/v1/permissions/{perm}/respond"),
        json!({"option_id": "allow-always"}),
    )
    .await;
    ws.until_type("turn_ended").await;
    let other = gw.create_conversation("demo").await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut ws = gw.conversation_ws(&other, 0).await;
    gw.prompt(&other, "parallel 2").await;
    ws.until_type("permission_requested").await;
    gw.post(&format!("/api/v1/conversations/{other}/cancel"), json!({}))
        .await;
    ws.until_type("turn_ended").await;
    gw.delete(&format!("/api/v1/conversations/{other}")).await;
    let (status, target) = gw
        .post(
            "/api/v1/notification-targets",
            json!({"kind": "webhook", "url": "https://93.184.216.34/hook", "label": "bridge"}),
        )
        .await;
    assert_eq!(status, 201, "{target}");
    gw.stop().await;
    // Spend of a conversation removed since: kept, and exported.
    let store = acp_gateway::store::open(&db.url).await.unwrap();
    let removed = acp_gateway::model::UsageRecord {
        id: acp_gateway::model::new_id(),
        conversation_id: acp_gateway::model::new_id(),
        turn_id: None,
        owner: None,
        agent: "demo".into(),
        at: acp_gateway::model::now(),
        seq: Some(7),
        used: Some(1),
        size: Some(2),
        cost_amount: Some(2.5),
        cost_currency: Some("EUR".into()),
        delta: 2.5,
    };
    assert_eq!(store.insert_usage_records(&[removed]).await.unwrap(), 1);
    // Each shared with a member (written as the session writes them).
    db.execute(
        "insert into conversation_members
           select id, 'bob', 'approver', 'user:anonymous', now() from conversations",
        "insert into conversation_members
           select id, 'bob', 'approver', 'user:anonymous', '2026-12-01 10:00:00+00:00'
           from conversations",
    )
    .await;
}

#[tokio::test]
async fn an_export_round_trip_preserves_every_event_message_tool_call_and_request() {
    let Some(pg) = TestDb::postgres().await else {
        return;
    };
    let lite = TestDb::sqlite().await;
    make_history(&lite).await;
    let gw = TestGateway::start(&lite, vec![]).await;
    let original = history(&gw).await;
    gw.stop().await;
    assert_eq!(original["conversations"].as_array().unwrap().len(), 2);
    assert_eq!(
        original["usage"]["totals"],
        json!([{"amount": 2.5, "currency": "EUR"}, {"amount": 0.75, "currency": "USD"}])
    );
    assert_eq!(original["usage"]["rows"].as_array().unwrap().len(), 2);
    for found in original["search"].as_array().unwrap() {
        assert_eq!(found["items"].as_array().unwrap().len(), 1, "{found}");
    }
    assert!(
        original["conversations"][0]["events"]
            .as_array()
            .unwrap()
            .len()
            > 5
    );
    assert!(!original["permissions"]["items"]
        .as_array()
        .unwrap()
        .is_empty());
    assert_eq!(
        original["notification_targets"]["items"][0]["label"],
        "bridge"
    );
    assert_eq!(
        original["conversations"][1]["rules"]["items"]
            .as_array()
            .unwrap()
            .len(),
        1
    );

    for c in original["conversations"].as_array().unwrap() {
        assert_eq!(c["conversation"]["members"], 1, "{c}");
        assert_eq!(c["members"]["items"][0]["user"], "bob", "{c}");
    }

    // SQLite → Postgres.
    let report = export(&lite, &pg);
    assert!(report.contains("exported 2 conversations"), "{report}");
    assert!(report.contains(" 3 usage records"), "{report}");
    let gw = TestGateway::start(&pg, vec![]).await;
    assert_eq!(history(&gw).await, original);
    gw.stop().await;

    // Running it again changes nothing.
    let report = export(&lite, &pg);
    assert!(
        report.contains("exported 0 conversations (2 already there)"),
        "{report}"
    );
    assert!(report.contains(" 0 usage records"), "{report}");

    // And back: Postgres → a fresh SQLite file.
    let back = TestDb::sqlite().await;
    export(&pg, &back);
    let gw = TestGateway::start(&back, vec![]).await;
    assert_eq!(history(&gw).await, original);
}
