//! Live updates: replay after `after`, no gap and no duplicate across the
//! switch from replay to live, reconnecting mid-turn; sockets that do not
//! read are closed to make room, never a reader that keeps up.

use crate::common::*;
use futures::StreamExt;
use serde_json::Value;
use tokio_tungstenite::tungstenite::Message as WsMessage;

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

/// A client that keeps up: a task reading every frame at once and handing
/// it on; a close, an error or the end of the socket is handed on too, and
/// ends it. The task is stopped when this is dropped.
struct KeepingUp {
    frames: tokio::sync::mpsc::UnboundedReceiver<Result<Value, String>>,
    task: tokio::task::JoinHandle<()>,
}

impl KeepingUp {
    fn start(mut ws: Ws) -> KeepingUp {
        let (tx, frames) = tokio::sync::mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            loop {
                let item = match ws.stream.next().await {
                    Some(Ok(WsMessage::Text(text))) => Ok(serde_json::from_str(&text).unwrap()),
                    Some(Ok(WsMessage::Ping(_) | WsMessage::Pong(_))) => continue,
                    other => Err(format!("{other:?}")),
                };
                let end = item.is_err();
                if tx.send(item).is_err() || end {
                    return;
                }
            }
        });
        KeepingUp { frames, task }
    }

    /// Adds to `seen` the events it read up to the next turn's end, failing
    /// the test if its socket was closed (or nothing came for [`WAIT`]).
    async fn until_turn_ended(&mut self, seen: &mut Vec<Value>) {
        loop {
            let item = tokio::time::timeout(WAIT, self.frames.recv())
                .await
                .expect("a frame in time")
                .expect("the reader reads on");
            let event =
                item.unwrap_or_else(|end| panic!("a reader that keeps up was closed: {end}"));
            let done = event["type"] == "turn_ended";
            seen.push(event);
            if done {
                return;
            }
        }
    }
}

impl Drop for KeepingUp {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Twenty sockets of alice's that never read, on a conversation
/// streaming 64 KiB a turn, fill alice's share of a small buffer budget.
/// They are closed to make room (1013, or the connection's end where the
/// close frame cannot get past what they did not read), never a reader that
/// keeps up: neither alice's own on the same conversation nor bob's on his,
/// each seeing every event once, in order. What all sockets hold stays
/// within the budget, what alice's hold within her share.
async fn sockets_that_do_not_read_are_closed_to_make_room_and_readers_that_keep_up_are_not(
    db: TestDb,
) {
    const BUDGET: usize = 1024 * 1024;
    const PER_USER: usize = 256 * 1024;
    const NON_READERS: usize = 20;
    const TURNS: usize = 32;
    let alice = cli_token(&db, "alice", "user");
    let bob = cli_token(&db, "bob", "user");
    let mut config = Config::for_tests(&db, vec![demo_profile("demo", &[])]);
    config.ws_buffer_bytes = BUDGET;
    config.ws_buffer_bytes_per_user = Some(PER_USER);
    config.max_page_bytes = 64 * 1024;
    config.rate_limits.connections_per_minute = 100_000;
    config.rate_limits.prompts_per_minute = 100_000;
    let gw = TestGateway::start_with(config).await;
    let (as_alice, as_bob) = (gw.with_token(&alice), gw.with_token(&bob));
    let (alices, bobs) = (as_alice.create("demo").await, as_bob.create("demo").await);
    let path = |id: &str| format!("/api/v1/conversations/{id}/ws?after=0");
    let mut non_readers = Vec::new();
    for _ in 0..NON_READERS {
        non_readers.push(as_alice.non_reading_ws(&path(&alices)).await);
    }
    let mut readers = Vec::new();
    for (client, id) in [(&as_alice, &alices), (&as_bob, &bobs)] {
        let reader = KeepingUp::start(client.ws(&path(id)).await);
        readers.push((client, id, reader, Vec::new()));
    }
    for _ in 0..TURNS {
        for (client, id, _, _) in &readers {
            client.prompt(id, "big 65536").await;
        }
        for (_, _, reader, seen) in &mut readers {
            reader.until_turn_ended(seen).await;
        }
    }
    for (client, id, _, seen) in &readers {
        assert_consecutive(seen, 0);
        assert_eq!(&client.events(id).await[..seen.len()], &seen[..]);
    }
    let budget = &gw.ws_budget;
    let evicted = budget.evicted();
    eprintln!(
        "held at most {} bytes of {BUDGET}, one user at most {} of {PER_USER}; \
         {evicted} sockets evicted, {} refused",
        budget.peak(),
        budget.user_peak(),
        budget.refused(),
    );
    assert!(budget.peak() <= BUDGET, "{}", budget.peak());
    assert!(budget.user_peak() <= PER_USER, "{}", budget.user_peak());
    assert!(evicted >= NON_READERS / 2, "{evicted} evicted");
    assert_eq!(budget.refused(), 0);
    // Reading at last, a socket that was closed finds what the kernel held
    // for it, in order, then its end; one never closed (it held little)
    // reads on to the last event.
    let last = readers[0].3.last().unwrap()["seq"].as_i64().unwrap();
    let mut ended = 0;
    for mut ws in non_readers {
        let mut seqs = Vec::new();
        let closed = loop {
            let frame = tokio::time::timeout(WAIT, ws.stream.next())
                .await
                .expect("a frame or the end in time");
            match frame {
                Some(Ok(WsMessage::Text(text))) => {
                    let event: Value = serde_json::from_str(&text).unwrap();
                    seqs.push(event["seq"].as_i64().unwrap());
                    if seqs.last() == Some(&last) {
                        break false;
                    }
                }
                Some(Ok(WsMessage::Close(Some(close)))) => {
                    assert_eq!(u16::from(close.code), 1013, "{close:?}");
                    break true;
                }
                Some(Ok(WsMessage::Close(None))) | Some(Err(_)) | None => break true,
                Some(Ok(_)) => {}
            }
        };
        assert_eq!(seqs, (1..=seqs.len() as i64).collect::<Vec<_>>());
        ended += usize::from(closed);
    }
    assert!(ended >= evicted, "{ended} ended, {evicted} evicted");
}

backend_tests!(
    a_client_reconnecting_mid_turn_gets_exactly_the_missed_events_then_live_ones,
    a_client_connecting_after_the_turn_gets_the_whole_history_then_live_events,
    a_subscriber_that_falls_behind_catches_up_from_the_database_in_order,
    sockets_that_do_not_read_are_closed_to_make_room_and_readers_that_keep_up_are_not,
);
