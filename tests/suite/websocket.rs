//! Live updates: replay after `after`, no gap and no duplicate across the
//! switch from replay to live, reconnecting mid-turn.

use crate::common::*;

async fn a_client_reconnecting_mid_turn_gets_exactly_the_missed_events_then_live_ones(db: TestDb) {
    let (gw, id, mut ws) = demo_conversation(&db).await;
    gw.prompt(&id, "slow 30").await;
    // Read a few streamed events, then drop the connection mid-turn.
    // (Chunks that arrive together may be merged into one event.)
    let first = ws
        .until(|e| {
            e["type"] == "session_update"
                && e["data"]["update"]["content"]["text"]
                    .as_str()
                    .is_some_and(|t| t.contains("s3 "))
        })
        .await;
    let last_seen = first.last().unwrap()["seq"].as_i64().unwrap();
    ws.close().await;
    // Reconnect while the agent keeps streaming.
    let mut ws = gw.conversation_ws(&id, last_seen).await;
    let rest = ws.until_type("turn_ended").await;
    assert_consecutive(&rest, last_seen);
    let all: Vec<_> = first.iter().chain(&rest).cloned().collect();
    assert_consecutive(&all, 0);
    let text = streamed_text(&all, "agent_message_chunk");
    let expected: String = (0..30).map(|i| format!("s{i} ")).collect();
    assert_eq!(text, expected);
    assert_eq!(gw.events(&id).await, all);
}

async fn a_client_connecting_after_the_turn_gets_the_whole_history_then_live_events(db: TestDb) {
    let (gw, id, mut ws) = demo_conversation(&db).await;
    gw.prompt(&id, "long 2000").await;
    ws.until_type("turn_ended").await;
    let stored = gw.events(&id).await;
    let mut late = gw.conversation_ws(&id, 2).await;
    let mut replayed = Vec::new();
    for _ in 2..stored.len() {
        replayed.push(late.next().await);
    }
    assert_eq!(&replayed[..], &stored[2..]);
    gw.prompt(&id, "hello").await;
    let live = late.until_type("turn_ended").await;
    assert_consecutive(&live, stored.len() as i64);
}

async fn a_subscriber_that_falls_behind_catches_up_from_the_database_in_order(db: TestDb) {
    let mut config = TestGateway::start(&db, vec![demo_profile("demo", &[])])
        .await
        .stop()
        .await;
    // A live buffer of one event: every burst of events overflows it.
    config.event_buffer = 1;
    let gw = TestGateway::start_with(config).await;
    let id = gw.create_conversation("demo").await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut ws = gw.conversation_ws(&id, 0).await;
    let mut inbox_frames = Vec::new();
    for prompt in ["parallel 5", "plan", "unknown", "slow 10"] {
        gw.prompt(&id, prompt).await;
        loop {
            let frames = ws
                .until(|e| e["type"] == "permission_requested" || e["type"] == "turn_ended")
                .await;
            let last = frames.last().unwrap().clone();
            inbox_frames.extend(frames);
            if last["type"] == "turn_ended" {
                break;
            }
            let perm = last["data"]["id"].as_str().unwrap();
            gw.post(
                &format!("/api/v1/permissions/{perm}/respond"),
                serde_json::json!({"option_id": "allow-once"}),
            )
            .await;
        }
    }
    assert_consecutive(&inbox_frames, 0);
    assert_eq!(gw.events(&id).await, inbox_frames);
}

backend_tests!(
    a_client_reconnecting_mid_turn_gets_exactly_the_missed_events_then_live_ones,
    a_client_connecting_after_the_turn_gets_the_whole_history_then_live_events,
    a_subscriber_that_falls_behind_catches_up_from_the_database_in_order,
);
