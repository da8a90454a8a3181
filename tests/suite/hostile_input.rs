//! Ordinary-but-hostile input: NUL characters, values the database refuses,
//! oversized fields. Each must get a clear answer or be stored faithfully,
//! and never wedge a conversation.

use crate::common::*;
use serde_json::{json, Value};

/// Text of a message of `role` in a conversation's history.
async fn message_texts(gw: &TestGateway, id: &str, role: &str) -> Vec<String> {
    let (status, body) = gw
        .get(&format!("/api/v1/conversations/{id}/messages"))
        .await;
    assert_eq!(status, 200, "{body}");
    body["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == role)
        .map(|m| {
            m["content"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|b| b["text"].as_str())
                .collect()
        })
        .collect()
}

async fn nul_characters_are_stored_faithfully_and_the_conversation_goes_on(db: TestDb) {
    let (gw, id, mut ws) = demo_conversation(&db).await;

    // The user's prompt and the agent's chunks carry a NUL.
    gw.prompt(&id, "hello\u{0}world").await;
    let live = ws.until_type("turn_ended").await;
    assert_eq!(live.last().unwrap()["data"]["stop_reason"], "end_turn");
    assert_consecutive(&live, 0);
    assert_eq!(
        streamed_text(&live, "agent_message_chunk"),
        "You said: hello\u{0}world"
    );
    let started = live.iter().find(|e| e["type"] == "turn_started").unwrap();
    assert_eq!(started["data"]["content"][0]["text"], "hello\u{0}world");

    // A tool call whose command and title carry one.
    gw.prompt(&id, "execute printf a\u{0}b").await;
    let frames = ws.until_type("permission_requested").await;
    let request = frames.last().unwrap()["data"].clone();
    assert_eq!(
        request["tool_call"]["rawInput"]["command"],
        "printf a\u{0}b"
    );
    let (status, body) = gw
        .post(
            &format!(
                "/api/v1/permissions/{}/respond",
                request["id"].as_str().unwrap()
            ),
            json!({"option_id": "allow-once"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let rest = ws.until_type("turn_ended").await;
    assert_eq!(rest.last().unwrap()["data"]["stop_reason"], "end_turn");

    // And the next turn works as ever.
    gw.prompt(&id, "again").await;
    let again = ws.until_type("turn_ended").await;
    assert_eq!(
        streamed_text(&again, "agent_message_chunk"),
        "You said: again"
    );

    // Everything reads back from the database as it was sent, also after a
    // restart (the title column of a tool call holds U+FFFD instead).
    let gw = gw.restart().await;
    let stored = gw.events(&id).await;
    assert_consecutive(&stored, 0);
    assert!(stored.iter().any(|e| e["type"] == "session_update"
        && e["data"]["update"]["content"]["text"]
            .as_str()
            .is_some_and(|t| t.contains('\u{0}'))));
    assert_eq!(message_texts(&gw, &id, "user").await[0], "hello\u{0}world");
    assert_eq!(
        message_texts(&gw, &id, "agent").await[0],
        "You said: hello\u{0}world"
    );
    let (_, calls) = gw
        .get(&format!("/api/v1/conversations/{id}/tool-calls"))
        .await;
    let call = &calls["items"][0];
    assert_eq!(call["raw_input"]["command"], "printf a\u{0}b");
    assert_eq!(call["title"], "Run printf a\u{FFFD}b");
    let (_, request) = gw
        .get(&format!(
            "/api/v1/permissions/{}",
            request["id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(
        request["tool_call"]["rawInput"]["command"],
        "printf a\u{0}b"
    );
    assert_eq!(request["status"], "approved");
}

async fn a_title_with_a_nul_or_too_long_is_refused_with_422_and_nothing_is_stored(db: TestDb) {
    let gw = TestGateway::start(&db, vec![demo_profile("demo", &[])]).await;
    for title in [
        "a\u{0}b".to_owned(),
        "x".repeat(201),
        "two\nlines".to_owned(),
    ] {
        let (status, body) = gw
            .post(
                "/api/v1/conversations",
                json!({"agent": "demo", "title": title}),
            )
            .await;
        assert_eq!(status, 422, "{body}");
        assert_eq!(body["code"], "invalid_request");
        assert!(
            body["detail"].as_str().unwrap().starts_with("title must"),
            "{body}"
        );
    }
    let long_agent = "a".repeat(10_000);
    let (status, body) = gw
        .post("/api/v1/conversations", json!({"agent": long_agent}))
        .await;
    assert_eq!(status, 422, "{body}");
    assert!(
        body["detail"].as_str().unwrap().len() < 200,
        "not echoed back: {body}"
    );
    let (status, body) = gw
        .post(
            "/api/v1/conversations",
            json!({"agent": "demo", "cwd": format!("/{}", "d".repeat(5000))}),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    let (_, list) = gw.get("/api/v1/conversations").await;
    assert_eq!(list["items"], json!([]));

    // A title of the longest allowed length is fine.
    let (status, conv) = gw
        .post(
            "/api/v1/conversations",
            json!({"agent": "demo", "title": "é".repeat(200)}),
        )
        .await;
    assert_eq!(status, 201, "{conv}");
    let id = conv["id"].as_str().unwrap();
    let blocks: Vec<Value> = (0..1001)
        .map(|_| json!({"type": "text", "text": "x"}))
        .collect();
    let (status, body) = gw
        .post(
            &format!("/api/v1/conversations/{id}/prompts"),
            json!({"content": blocks}),
        )
        .await;
    assert_eq!(status, 422, "{body}");
}

async fn a_batch_the_database_refuses_is_split_and_the_conversation_goes_on(db: TestDb) {
    let (gw, id, mut ws) = demo_conversation(&db).await;
    // From now on the database refuses every streamed update mentioning POISON.
    db.execute(
        "alter table events add constraint no_poison
           check (type <> 'session_update' or position('POISON' in data::text) = 0)",
        "create trigger no_poison before insert on events
           when new.type = 'session_update' and instr(new.data, 'POISON') > 0
           begin select raise(abort, 'poisoned'); end",
    )
    .await;

    gw.prompt(&id, "POISON").await;
    let live = ws.until_type("turn_ended").await;
    assert_consecutive(&live, 0);
    assert_eq!(live.last().unwrap()["data"]["stop_reason"], "end_turn");
    let stand_ins: Vec<&Value> = live
        .iter()
        .filter(|e| e["data"]["unstorable"].is_string())
        .collect();
    assert!(!stand_ins.is_empty(), "{live:?}");
    for e in &stand_ins {
        assert_eq!(e["type"], "session_update");
        assert!(!e.to_string().contains("POISON"), "{e}");
        assert!(e["data"]["turn_id"].is_string(), "{e}");
    }

    // The conversation goes on: the next turn is stored and streamed whole.
    gw.prompt(&id, "antidote").await;
    let next = ws.until_type("turn_ended").await;
    assert_eq!(next.last().unwrap()["data"]["stop_reason"], "end_turn");
    assert_eq!(
        streamed_text(&next, "agent_message_chunk"),
        "You said: antidote"
    );
    // What was published is what is stored.
    let stored = gw.events(&id).await;
    assert_consecutive(&stored, 0);
    let published: Vec<Value> = live.iter().chain(&next).cloned().collect();
    assert_eq!(stored, published);
    let (_, conv) = gw.get(&format!("/api/v1/conversations/{id}")).await;
    assert_eq!(conv["status"], "idle");
    assert_eq!(conv["last_seq"], stored.len() as i64);
}

async fn colours_in_an_agents_stderr_do_not_reach_the_client(db: TestDb) {
    let script = "printf '\\033[31mERROR\\033[0m: \\033[1mno model\\033[0m\\n' >&2; exit 1";
    let agent = profile("colour", "/bin/sh", &["-c", script]);
    let gw = TestGateway::start(&db, vec![agent]).await;
    let (status, body) = gw
        .post("/api/v1/conversations", json!({"agent": "colour"}))
        .await;
    assert_eq!(status, 502, "{body}");
    let detail = body["detail"].as_str().unwrap();
    assert!(detail.contains("ERROR: no model"), "{detail}");
    assert!(!detail.contains('\u{1b}'), "{detail:?}");
    let (_, list) = gw.get("/api/v1/conversations").await;
    let id = list["items"][0]["id"].as_str().unwrap().to_owned();
    let events = gw.events(&id).await;
    let failed = events.last().unwrap();
    assert_eq!(failed["data"]["status"], "failed");
    let detail = failed["data"]["detail"].as_str().unwrap();
    assert!(detail.contains("ERROR: no model") && !detail.contains('\u{1b}'));
}

async fn binary_garbage_on_an_agents_stderr_never_stalls_it(db: TestDb) {
    // More than a pipe holds, and not UTF-8: it must all be read.
    let script = format!(
        "head -c 300000 /dev/urandom >&2; exec {}",
        demo_agent_path()
    );
    let agent = profile("noisy", "/bin/sh", &["-c", &script]);
    let gw = TestGateway::start(&db, vec![agent]).await;
    let (status, conv) = gw
        .post("/api/v1/conversations", json!({"agent": "noisy"}))
        .await;
    assert_eq!(status, 201, "{conv}");
    let id = conv["id"].as_str().unwrap();
    let mut ws = gw.conversation_ws(id, 0).await;
    gw.prompt(id, "hello").await;
    let frames = ws.until_type("turn_ended").await;
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "end_turn");
}

backend_tests!(
    nul_characters_are_stored_faithfully_and_the_conversation_goes_on,
    a_title_with_a_nul_or_too_long_is_refused_with_422_and_nothing_is_stored,
    a_batch_the_database_refuses_is_split_and_the_conversation_goes_on,
    colours_in_an_agents_stderr_do_not_reach_the_client,
    binary_garbage_on_an_agents_stderr_never_stalls_it,
);
