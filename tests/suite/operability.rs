//! What an operator watches: `GET /metrics` scraped and parsed, and JSON
//! logs where every line of a session says its conversation (and turn).

use std::collections::HashMap;

use crate::common::*;
use serde_json::{json, Value};

/// A Prometheus text page as `name{labels}` → value (comments skipped).
fn parse_metrics(page: &str) -> HashMap<String, f64> {
    page.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (key, value) = l.rsplit_once(' ').expect("`name value`");
            (key.to_owned(), value.parse().expect("a number"))
        })
        .collect()
}

async fn scrape(gw: &TestGateway) -> HashMap<String, f64> {
    let response = reqwest::get(gw.url("/metrics")).await.unwrap();
    assert_eq!(response.status(), 200);
    let kind = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(kind.starts_with("text/plain"), "{kind}");
    parse_metrics(&response.text().await.unwrap())
}

fn value(metrics: &HashMap<String, f64>, key: &str) -> f64 {
    *metrics
        .get(key)
        .unwrap_or_else(|| panic!("no {key} in {metrics:#?}"))
}

/// One test for both backends in turn: the metrics recorder is one per
/// process, so two gateways scraped at once would mix their gauges.
#[tokio::test]
async fn metrics_count_agents_conversations_requests_events_and_sockets() {
    let mut dbs = vec![TestDb::sqlite().await];
    dbs.extend(TestDb::postgres().await);
    for db in dbs {
        let (gw, id, mut ws) = demo_conversation(&db).await;
        gw.prompt(&id, "tool").await;
        ws.until_type("permission_requested").await;
        let m = scrape(&gw).await;
        assert_eq!(value(&m, "acp_gateway_agents_running"), 1.0);
        assert_eq!(value(&m, "acp_gateway_permissions_pending"), 1.0);
        assert_eq!(
            value(
                &m,
                "acp_gateway_conversations{status=\"awaiting_permission\"}"
            ),
            1.0
        );
        assert_eq!(
            value(&m, "acp_gateway_conversations{status=\"closed\"}"),
            0.0
        );
        assert!(value(&m, "acp_gateway_websocket_clients") >= 1.0);
        assert!(value(&m, "acp_gateway_events_written_total") >= 3.0);
        assert!(value(&m, "acp_gateway_db_commit_seconds_count") >= 1.0);
        assert!(m.contains_key("acp_gateway_db_commit_seconds_bucket{le=\"0.01\"}"));
        assert!(m.contains_key("acp_gateway_write_buffer_events"));

        gw.post(&format!("/api/v1/conversations/{id}/cancel"), json!({}))
            .await;
        ws.until_type("turn_ended").await;
        // A crash, then a restart: counted by cause and by context.
        gw.prompt(&id, "crash").await;
        ws.until_agent_gone().await;
        gw.prompt(&id, "hello").await;
        ws.until_type("turn_ended").await;
        let m = scrape(&gw).await;
        assert!(value(&m, "acp_gateway_agent_exits_total{cause=\"crashed\"}") >= 1.0);
        assert!(
            value(
                &m,
                "acp_gateway_agent_restarts_total{context=\"reset\",cause=\"crashed\"}"
            ) >= 1.0,
            "{m:#?}"
        );
        assert_eq!(value(&m, "acp_gateway_permissions_pending"), 0.0);
        gw.stop().await;
    }
}

/// Log lines of a session carry its conversation and, inside a turn, the
/// turn; never the HTTP request that happened to start the session.
async fn json_logs_say_which_conversation_and_turn_each_line_is_about(db: TestDb) {
    let gw = GatewayProcess::start_with_args(
        &db,
        &[demo_profile("demo", &[])],
        "info",
        "",
        &["--log-format", "json"],
    );
    let conversation = gw
        .post("/api/v1/conversations", json!({"agent": "demo"}))
        .await
        .1;
    let id = conversation["id"].as_str().unwrap().to_owned();
    let mut ws = gw.conversation_ws(&id, 0).await;
    for (text, until) in [("hello", "turn_ended"), ("crash", "agent_status")] {
        let turn = gw
            .post(
                &format!("/api/v1/conversations/{id}/prompts"),
                json!({"text": text}),
            )
            .await
            .1;
        assert!(turn["turn_id"].is_string(), "{turn}");
        ws.until(|e| e["type"] == until && e["data"]["status"] != "starting")
            .await;
    }
    let log = gw.stop();
    let lines: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let spans =
        |line: &Value| -> Vec<Value> { line["spans"].as_array().cloned().unwrap_or_default() };
    let about = |message: &str| -> Vec<&Value> {
        lines
            .iter()
            .filter(|l| l["fields"]["message"] == message)
            .collect()
    };
    for message in ["turn started", "turn ended", "agent exited"] {
        let found = about(message);
        assert!(!found.is_empty(), "no {message:?} line in\n{log}");
        for line in found {
            let spans = spans(line);
            assert!(
                spans
                    .iter()
                    .any(|s| s["name"] == "conversation" && s["conversation_id"] == id),
                "{line}"
            );
            assert!(!spans.iter().any(|s| s["name"] == "http"), "{line}");
            if message.starts_with("turn") {
                let turn_id = &line["fields"]["turn_id"];
                assert!(
                    spans
                        .iter()
                        .any(|s| s["name"] == "turn" && s["turn_id"] == *turn_id),
                    "{line}"
                );
            }
        }
    }
}

backend_tests!(json_logs_say_which_conversation_and_turn_each_line_is_about,);
