//! What one user can make the gateway spend is bounded: agents per user and
//! conversations per minute (429 with `Retry-After`, another user
//! unaffected), pages of messages and events bounded in count and in bytes,
//! what WebSockets hold for slow clients bounded all together, and a prompt
//! stored once.

use crate::common::*;
use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message as WsMessage;

/// A user's answer with its `Retry-After`, if any.
struct Answer {
    status: u16,
    retry_after: Option<u64>,
    body: Value,
}

async fn create_as(gw: &TestGateway, token: &str) -> Answer {
    let response = gw
        .http
        .post(gw.url("/api/v1/conversations"))
        .bearer_auth(token)
        .json(&json!({"agent": "demo"}))
        .send()
        .await
        .unwrap();
    answer(response).await
}

async fn prompt_as(gw: &TestGateway, token: &str, id: &str, text: &str) -> Answer {
    let response = gw
        .http
        .post(gw.url(&format!("/api/v1/conversations/{id}/prompts")))
        .bearer_auth(token)
        .json(&json!({"text": text}))
        .send()
        .await
        .unwrap();
    answer(response).await
}

async fn answer(response: reqwest::Response) -> Answer {
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().parse().unwrap());
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned());
    let body: Value = response.json().await.unwrap();
    if status >= 400 {
        assert_eq!(content_type.as_deref(), Some("application/problem+json"));
    }
    Answer {
        status,
        retry_after,
        body,
    }
}

/// A 429 that says when to come back and which limit it is.
fn assert_limited(answer: &Answer, says: &str) {
    assert_eq!(answer.status, 429, "{}", answer.body);
    assert_eq!(answer.body["code"], "rate_limited");
    let detail = answer.body["detail"].as_str().unwrap();
    assert!(detail.contains(says), "{says:?} not in {detail:?}");
    let wait = answer.retry_after.expect("Retry-After");
    assert!((1..=60).contains(&wait), "{wait}");
}

/// A WebSocket on a conversation, as `token`'s holder.
async fn ws_as(gw: &TestGateway, token: &str, id: &str) -> Ws {
    gw.ws(&format!(
        "/api/v1/conversations/{id}/ws?after=0&access_token={token}"
    ))
    .await
}

async fn a_user_over_the_creation_limit_gets_429_and_another_user_does_not(db: TestDb) {
    let operator = cli_token(&db, "op", "operator");
    let mut config = Config::for_tests(&db, vec![demo_profile("demo", &[])]);
    config.rate_limits.conversations_per_minute = 2;
    config.max_agents = Some(20);
    let gw = TestGateway::start_with(config).await;
    let (alice, _) = gw.make_token(&operator, "alice", "user").await;
    let (alice_too, _) = gw.make_token(&operator, "alice", "user").await;
    let (bob, _) = gw.make_token(&operator, "bob", "user").await;
    for _ in 0..2 {
        assert_eq!(create_as(&gw, &alice).await.status, 201);
    }
    let refused = create_as(&gw, &alice).await;
    assert_limited(&refused, "new conversations per minute per user");
    // Per user, not per token.
    assert_limited(&create_as(&gw, &alice_too).await, "per user");
    // Bob is not alice.
    let created = create_as(&gw, &bob).await;
    assert_eq!(created.status, 201, "{}", created.body);
    let (status, list) = gw.get_as("/api/v1/conversations", Some(&alice)).await;
    assert_eq!(status, 200);
    assert_eq!(list["items"].as_array().unwrap().len(), 2, "{list}");
}

async fn a_user_at_the_agent_limit_loses_an_idle_agent_or_gets_429_and_another_user_does_not(
    db: TestDb,
) {
    let operator = cli_token(&db, "op", "operator");
    let mut config = Config::for_tests(&db, vec![demo_profile("demo", &[])]);
    config.max_agents = Some(10);
    config.max_agents_per_user = Some(2);
    let gw = TestGateway::start_with(config).await;
    let (alice, _) = gw.make_token(&operator, "alice", "user").await;
    let (bob, _) = gw.make_token(&operator, "bob", "user").await;
    let mut alices = Vec::new();
    for _ in 0..2 {
        let created = create_as(&gw, &alice).await;
        assert_eq!(created.status, 201, "{}", created.body);
        let id = created.body["id"].as_str().unwrap().to_owned();
        let ws = ws_as(&gw, &alice, &id).await;
        alices.push((id, ws));
    }
    // Bob's idle agent is not alice's to take.
    let bobs = create_as(&gw, &bob).await.body["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut bob_ws = ws_as(&gw, &bob, &bobs).await;
    // A third of alice's: her longest-idle agent (the first) makes room.
    let third = create_as(&gw, &alice).await;
    assert_eq!(third.status, 201, "{}", third.body);
    let third = third.body["id"].as_str().unwrap().to_owned();
    let frames = alices[0].1.until_agent_gone().await;
    assert_eq!(
        frames.last().unwrap()["data"]["detail"],
        "stopped to make room for another conversation's agent"
    );
    // Both her agents busy: nothing of hers is idle, so 429.
    let mut third_ws = ws_as(&gw, &alice, &third).await;
    let second = alices[1].0.clone();
    for (id, ws) in [(&second, &mut alices[1].1), (&third, &mut third_ws)] {
        assert_eq!(prompt_as(&gw, &alice, id, "hang").await.status, 202);
        ws.until_type("turn_started").await;
    }
    assert_limited(&create_as(&gw, &alice).await, "max_agents_per_user");
    // Her first conversation's agent would have to start again: 429 too.
    let first = alices[0].0.clone();
    assert_limited(
        &prompt_as(&gw, &alice, &first, "hello").await,
        "max_agents_per_user",
    );
    // Bob is unaffected: his agent answers, and he starts another.
    assert_eq!(prompt_as(&gw, &bob, &bobs, "hello").await.status, 202);
    let frames = bob_ws.until_type("turn_ended").await;
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "end_turn");
    assert_eq!(create_as(&gw, &bob).await.status, 201);
    // Once one of hers is idle again, it makes room for her first one.
    let (status, _) = gw
        .post_as(
            &format!("/api/v1/conversations/{third}/cancel"),
            Some(&alice),
            json!({}),
        )
        .await;
    assert_eq!(status, 202);
    third_ws.until_type("turn_ended").await;
    assert_eq!(prompt_as(&gw, &alice, &first, "hello").await.status, 202);
    let frames = alices[0].1.until_type("turn_ended").await;
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "end_turn");
    third_ws.until_agent_gone().await;
}

/// Every message or event of a listing, page after page: `(items, pages)`.
async fn all_pages(gw: &TestGateway, path: &str, limit: usize) -> (Vec<Value>, usize) {
    let mut items = Vec::new();
    let mut pages = 0;
    let mut after = String::new();
    loop {
        let (status, page) = gw.get(&format!("{path}?limit={limit}{after}")).await;
        assert_eq!(status, 200, "{page}");
        pages += 1;
        let got = page["items"].as_array().unwrap();
        assert!(got.len() <= limit);
        items.extend(got.iter().cloned());
        match page["next_cursor"].as_str() {
            Some(cursor) => {
                assert!(!got.is_empty(), "a page that says more holds something");
                after = format!("&after={cursor}");
            }
            None => return (items, pages),
        }
    }
}

async fn messages_are_paged_without_loss_or_repetition(db: TestDb) {
    let mut config = Config::for_tests(&db, vec![demo_profile("demo", &[])]);
    config.max_page_bytes = 4096;
    let gw = TestGateway::start_with(config).await;
    let (id, mut ws) = gw.open_conversation("demo").await;
    for prompt in ["hello", "plan", "big 10000", "hello", "tool", "hello"] {
        gw.prompt(&id, prompt).await;
        if prompt == "tool" {
            let request = ws.until_type("permission_requested").await.pop().unwrap();
            let permission = request["data"]["id"].as_str().unwrap();
            gw.post(
                &format!("/api/v1/permissions/{permission}/respond"),
                json!({"option_id": "allow-once"}),
            )
            .await;
        }
        ws.until_type("turn_ended").await;
    }
    let store = acp_gateway::store::open(&db.url).await.unwrap();
    let everything =
        serde_json::to_value(store.list_messages(id.parse().unwrap()).await.unwrap()).unwrap();
    let everything = everything.as_array().unwrap();
    assert!(everything.len() >= 12, "{}", everything.len());
    let path = format!("/api/v1/conversations/{id}/messages");
    // By count: every message once, in order.
    let (paged, pages) = all_pages(&gw, &path, 3).await;
    assert_eq!(&paged, everything);
    assert!(pages >= 4, "{pages}");
    // By bytes: no page passes 4096 bytes unless it holds a single message
    // (the 10000-byte answer), and nothing is lost either.
    let (paged, pages) = all_pages(&gw, &path, 1000).await;
    assert_eq!(&paged, everything);
    assert!(pages >= 3, "{pages}");
    let mut after = String::new();
    loop {
        let (_, page) = gw.get(&format!("{path}?limit=1000{after}")).await;
        let items = page["items"].as_array().unwrap();
        let bytes: usize = items.iter().map(|m| m.to_string().len()).sum();
        assert!(bytes <= 4096 || items.len() == 1, "{bytes} in {items:?}");
        match page["next_cursor"].as_str() {
            Some(c) => after = format!("&after={c}"),
            None => break,
        }
    }
    // A client that asks for no page gets the first, bounded, and the way on.
    let (status, first) = gw.get(&path).await;
    assert_eq!(status, 200);
    assert!(first["next_cursor"].is_string(), "{first}");
    let (status, _) = gw.get(&format!("{path}?after=seven")).await;
    assert_eq!(status, 422);
    let (status, _) = gw.get(&format!("{path}?limit=0")).await;
    assert_eq!(status, 422);
}

async fn an_events_page_is_bounded_in_bytes(db: TestDb) {
    let mut config = Config::for_tests(&db, vec![demo_profile("demo", &[])]);
    config.max_page_bytes = 8192;
    let gw = TestGateway::start_with(config).await;
    let (id, mut ws) = gw.open_conversation("demo").await;
    for prompt in ["big 3000", "big 3000", "big 20000", "big 3000", "hello"] {
        gw.prompt(&id, prompt).await;
        ws.until_type("turn_ended").await;
    }
    let store = acp_gateway::store::open(&db.url).await.unwrap();
    let stored = store
        .list_events(id.parse().unwrap(), 0, 100_000)
        .await
        .unwrap();
    let stored = serde_json::to_value(stored).unwrap();
    let path = format!("/api/v1/conversations/{id}/events");
    // Asked for 10000, a page stops before the event that would pass 8192
    // bytes, and says where to go on.
    let (status, first) = gw.get(&format!("{path}?limit=10000")).await;
    assert_eq!(status, 200);
    let items = first["items"].as_array().unwrap();
    assert!(items.len() < stored.as_array().unwrap().len());
    let bytes: usize = items.iter().map(|e| e.to_string().len()).sum();
    assert!(bytes <= 8192, "{bytes}");
    let next = &stored[items.len()];
    assert!(
        bytes + next.to_string().len() > 8192,
        "the next event would have fit"
    );
    assert_eq!(
        first["next_cursor"].as_str().unwrap(),
        items.last().unwrap()["seq"].to_string()
    );
    // Page after page: everything once, in order; the 20000-byte event
    // comes alone.
    let (paged, pages) = all_pages(&gw, &path, 10000).await;
    assert_eq!(Value::from(paged.clone()), stored);
    assert_consecutive(&paged, 0);
    assert!(pages >= 3, "{pages}");
    let mut after = 0;
    loop {
        let (_, page) = gw.get(&format!("{path}?limit=10000&after={after}")).await;
        let items = page["items"].as_array().unwrap();
        let bytes: usize = items.iter().map(|e| e.to_string().len()).sum();
        assert!(bytes <= 8192 || items.len() == 1, "{bytes}");
        match page["next_cursor"].as_str() {
            Some(c) => after = c.parse().unwrap(),
            None => break,
        }
    }
    // The WebSocket's catch-up reads pages the same way, and loses nothing.
    let mut replay = gw.conversation_ws(&id, 0).await;
    let last = paged.last().unwrap()["seq"].as_i64().unwrap();
    let frames = replay.until(|e| e["seq"] == last).await;
    assert_eq!(Value::from(frames), stored);
}

/// The texts of one column of a table, for looking into the database.
async fn column(db: &TestDb, sql_pg: &str, sql_lite: &str) -> Vec<String> {
    use sqlx::Connection;
    if db.url.starts_with("sqlite:") {
        let mut conn = sqlx::SqliteConnection::connect(&db.url).await.unwrap();
        sqlx::query_scalar(sql_lite)
            .fetch_all(&mut conn)
            .await
            .unwrap()
    } else {
        let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
        sqlx::query_scalar(sql_pg)
            .fetch_all(&mut conn)
            .await
            .unwrap()
    }
}

/// How many times `marker` is stored in the database, anywhere a prompt
/// could be: events, messages, message parts.
async fn times_stored(db: &TestDb, marker: &str) -> usize {
    let mut texts = column(
        db,
        "select data::text from events",
        "select data from events",
    )
    .await;
    texts.extend(
        column(
            db,
            "select content::text from messages",
            "select content from messages",
        )
        .await,
    );
    texts.extend(
        column(
            db,
            "select content::text from message_parts",
            "select content from message_parts",
        )
        .await,
    );
    texts.iter().map(|t| t.matches(marker).count()).sum()
}

async fn a_prompt_is_stored_once_and_read_back_everywhere(db: TestDb) {
    let (gw, id, mut ws) = demo_conversation(&db).await;
    let marker = format!("prompt-{}", uuid::Uuid::now_v7().simple());
    // `refuse`: the demo agent answers without repeating the prompt.
    let text = format!("refuse {marker} {}", "x".repeat(30_000));
    let turn = gw.prompt(&id, &text).await;
    ws.until_type("turn_ended").await;
    assert_eq!(times_stored(&db, &marker).await, 1);
    // The turn's event and the user's message both carry it.
    let events = gw.events(&id).await;
    let started = events.iter().find(|e| e["type"] == "turn_started").unwrap();
    assert_eq!(started["data"]["content"][0]["text"], text.as_str());
    let (_, messages) = gw
        .get(&format!("/api/v1/conversations/{id}/messages"))
        .await;
    let mine = messages["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "user")
        .unwrap();
    assert_eq!(mine["turn_id"], turn.as_str());
    assert_eq!(mine["content"], json!([{"type": "text", "text": text}]));
    // And so does a copy made by `acp-gateway export`, storing it once too.
    gw.stop().await;
    let copy = TestDb::sqlite().await;
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(config.path(), format!("database_url = {:?}\n", db.url)).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_acp-gateway"))
        .args(["export", "--config"])
        .arg(config.path())
        .args(["--to", &copy.url])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(times_stored(&copy, &marker).await, 1);
    let gw = TestGateway::start(&copy, vec![]).await;
    let (_, copied) = gw
        .get(&format!("/api/v1/conversations/{id}/messages"))
        .await;
    assert_eq!(copied, messages);
}

/// Reads a conversation's events until `last` as a client should: after a
/// 1013, or its connection ending without a close frame (a socket closed
/// while its client did not read: the close frame could not go out), it
/// comes back with `after`. The seqs it saw (in order) and how many times
/// it was told to come back.
async fn read_to(gw: &TestGateway, id: &str, mut ws: Ws, last: i64) -> (Vec<i64>, usize) {
    let mut seen = Vec::new();
    let mut told = 0;
    loop {
        let frame = tokio::time::timeout(WAIT, ws.stream.next())
            .await
            .expect("a frame in time");
        match frame {
            Some(Ok(WsMessage::Text(text))) => {
                let event: Value = serde_json::from_str(&text).unwrap();
                let seq = event["seq"].as_i64().unwrap();
                seen.push(seq);
                if seq == last {
                    let _ = ws.stream.send(WsMessage::Close(None)).await;
                    return (seen, told);
                }
            }
            Some(Ok(WsMessage::Close(Some(close)))) => {
                assert_eq!(u16::from(close.code), 1013, "{close:?}");
                told += 1;
                assert!(told < 10_000, "told to come back too often");
                let after = seen.last().copied().unwrap_or(0);
                ws = gw.conversation_ws(id, after).await;
            }
            Some(Err(_)) | None | Some(Ok(WsMessage::Close(None))) => {
                told += 1;
                assert!(told < 10_000, "told to come back too often");
                let after = seen.last().copied().unwrap_or(0);
                ws = gw.conversation_ws(id, after).await;
            }
            Some(Ok(_)) => {}
        }
    }
}

async fn non_reading_websockets_hold_a_bounded_total_and_the_ones_over_it_resume(db: TestDb) {
    const BUDGET: usize = 256 * 1024;
    const CLIENTS: usize = 100;
    let mut config = Config::for_tests(&db, vec![demo_profile("demo", &[])]);
    config.ws_buffer_bytes = BUDGET;
    config.max_page_bytes = 32 * 1024;
    config.rate_limits.connections_per_minute = 100_000;
    config.rate_limits.prompts_per_minute = 100_000;
    let gw = TestGateway::start_with(config).await;
    // A history of about 400 KiB, far more than the kernel holds for a
    // client with small buffers.
    let (id, mut ws) = gw.open_conversation("demo").await;
    for _ in 0..24 {
        gw.prompt(&id, "big 16384").await;
        ws.until_type("turn_ended").await;
    }
    ws.close().await;
    let last = gw.events(&id).await.last().unwrap()["seq"]
        .as_i64()
        .unwrap();
    // Clients that never read: each catches up a page at a time until the
    // kernel is full, then holds its page; the budget runs out, and those
    // holding the most are closed to make room.
    let mut evicted = gw.ws_budget.watch_evicted();
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        clients.push(
            gw.non_reading_ws(&format!("/api/v1/conversations/{id}/ws?after=0"))
                .await,
        );
    }
    tokio::time::timeout(WAIT, evicted.wait_for(|n| *n >= 1))
        .await
        .expect("the budget runs out in time")
        .unwrap();
    assert!(gw.ws_budget.peak() <= BUDGET, "{}", gw.ws_budget.peak());
    // Now they read: each sees every event once, those told 1013 after
    // coming back with `after`.
    let gw = std::sync::Arc::new(gw);
    let readers: Vec<_> = clients
        .into_iter()
        .map(|client| {
            let gw = gw.clone();
            let id = id.clone();
            tokio::spawn(async move { read_to(&gw, &id, client, last).await })
        })
        .collect();
    let mut told = 0;
    for reader in readers {
        let (seen, times) = reader.await.unwrap();
        assert_eq!(seen, (1..=last).collect::<Vec<_>>());
        told += times;
    }
    assert!(told >= 1, "some clients were over the budget");
    assert!(gw.ws_budget.peak() <= BUDGET, "{}", gw.ws_budget.peak());
    assert!(gw.ws_budget.evicted() + gw.ws_budget.refused() >= told);
}

/// A WebSocket client's message is bounded like a request body: one over
/// 4 KiB ends its connection instead of being read whole, and the gateway
/// serves on (presence frames, the only ones clients send, are far below).
async fn an_oversized_client_frame_ends_its_websocket(db: TestDb) {
    let gw = TestGateway::start(&db, vec![demo_profile("demo", &[])]).await;
    let (id, mut ws) = gw.open_conversation("demo").await;
    ws.until_type("agent_status").await;
    let presence = json!({"type": "presence", "visible": true}).to_string();
    ws.stream
        .send(WsMessage::Text(presence.into()))
        .await
        .unwrap();
    let big = "x".repeat(8 * 1024 * 1024);
    // The gateway may close while the frame is still being written.
    let _ = ws.stream.send(WsMessage::Text(big.into())).await;
    let ended = tokio::time::timeout(WAIT, async {
        loop {
            match ws.stream.next().await {
                Some(Ok(WsMessage::Close(_))) | Some(Err(_)) | None => break,
                Some(Ok(_)) => {}
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the connection ends");
    let mut again = gw.conversation_ws(&id, 0).await;
    gw.prompt(&id, "hello").await;
    again.until_type("turn_ended").await;
}

backend_tests!(
    an_oversized_client_frame_ends_its_websocket,
    a_user_over_the_creation_limit_gets_429_and_another_user_does_not,
    a_user_at_the_agent_limit_loses_an_idle_agent_or_gets_429_and_another_user_does_not,
    messages_are_paged_without_loss_or_repetition,
    an_events_page_is_bounded_in_bytes,
    a_prompt_is_stored_once_and_read_back_everywhere,
    non_reading_websockets_hold_a_bounded_total_and_the_ones_over_it_resume,
);
