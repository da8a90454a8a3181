//! `GET /api/v1/search`: a conversation found by a word only its agent
//! said (its text written in many commits, joined), or by its title; only
//! the caller's own; paged; what it cannot search refused with 422.

use crate::common::*;
use serde_json::{json, Value};

/// Searches as `client`; the answer (asserting 200).
async fn search(client: &Client, query: &str) -> Value {
    let (status, body) = client.get(&format!("/api/v1/search?{query}")).await;
    assert_eq!(status, 200, "{query}: {body}");
    body
}

fn ids(page: &Value) -> Vec<String> {
    page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|hit| hit["conversation"]["id"].as_str().unwrap().to_owned())
        .collect()
}

/// A conversation of `client`'s whose agent streams `w0 … w{n-1}`.
async fn streamed(client: &Client, title: &str, n: usize) -> String {
    let (status, created) = client
        .post(
            "/api/v1/conversations",
            json!({"agent": "demo", "title": title}),
        )
        .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_owned();
    let mut ws = client.conversation_ws(&id, 0).await;
    client.prompt(&id, &format!("long {n}")).await;
    let frames = ws.until_type("turn_ended").await;
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "end_turn");
    id
}

async fn a_conversation_is_found_by_what_its_agent_said_or_its_title(db: TestDb) {
    let alice_token = cli_token(&db, "alice", "user");
    let bob_token = cli_token(&db, "bob", "user");
    let gw = TestGateway::start(
        &db,
        vec![
            demo_profile("demo", &["--chunk-delay-ms", "0"]),
            node_sdk_profile("sdk"),
        ],
    )
    .await;
    let (alice, bob) = (gw.with_token(&alice_token), gw.with_token(&bob_token));
    let first = streamed(&alice, "Deploy notes", 3000).await;
    let second = streamed(&alice, "Other", 3000).await;
    let bobs = streamed(&bob, "Bob's", 3000).await;
    // The agent's words are in many parts (commits); the prompt was "long 3000".
    let (_, messages) = alice
        .get(&format!("/api/v1/conversations/{first}/messages"))
        .await;
    assert!(messages["items"][1]["content"][0]["text"]
        .as_str()
        .unwrap()
        .contains(" w2718 "));

    // A word only the agent said, deep in its reply: both of alice's, newest
    // first, with the text around it.
    let found = search(&alice, "q=w2718").await;
    assert_eq!(ids(&found), [second.clone(), first.clone()]);
    let hit = &found["items"][1];
    assert_eq!(hit["matched"], "message");
    assert_eq!(hit["conversation"]["title"], "Deploy notes");
    let snippet = hit["snippet"].as_str().unwrap();
    assert!(snippet.contains("w2717 w2718 w2719"), "{snippet}");
    assert!(
        snippet.starts_with('…') && snippet.ends_with('…'),
        "{snippet}"
    );
    // All the words, any case.
    assert_eq!(ids(&search(&alice, "q=W2718%20w5").await).len(), 2);
    assert!(ids(&search(&alice, "q=w2718%20nowhere").await).is_empty());
    // What is no word is no trouble: a NUL, quotes, LIKE and FTS syntax.
    for odd in [
        "w5%00",
        "%22w5%22",
        "w5%25",
        "w5_",
        "w5%20OR%20x",
        "NEAR(w5",
        "w5*",
    ] {
        search(&alice, &format!("q={odd}")).await;
    }
    // A title.
    let by_title = search(&alice, "q=deploy").await;
    assert_eq!(ids(&by_title), std::slice::from_ref(&first));
    assert_eq!(by_title["items"][0]["matched"], "title");
    assert_eq!(by_title["items"][0]["snippet"], "Deploy notes");

    // The title the agent gave, where the user gave none (the SDK agent's
    // "usage" names its session "Usage report").
    let (_, untitled) = alice
        .post("/api/v1/conversations", json!({"agent": "sdk"}))
        .await;
    let untitled = untitled["id"].as_str().unwrap().to_owned();
    let mut ws = alice.conversation_ws(&untitled, 0).await;
    alice.prompt(&untitled, "usage").await;
    ws.until_type("turn_ended").await;
    assert_eq!(alice.conversation(&untitled).await["title"], "Usage report");
    let by_agents_title = search(&alice, "q=report").await;
    assert_eq!(ids(&by_agents_title), std::slice::from_ref(&untitled));
    assert_eq!(by_agents_title["items"][0]["matched"], "title");
    assert_eq!(by_agents_title["items"][0]["snippet"], "Usage report");

    // Only the caller's own.
    assert_eq!(
        ids(&search(&bob, "q=w2718").await),
        std::slice::from_ref(&bobs)
    );
    assert!(ids(&search(&bob, "q=deploy").await).is_empty());

    // Paged.
    let page = search(&alice, "q=w2718&limit=1").await;
    assert_eq!(ids(&page), std::slice::from_ref(&second));
    let cursor = page["next_cursor"].as_str().unwrap();
    let rest = search(&alice, &format!("q=w2718&limit=1&cursor={cursor}")).await;
    assert_eq!(ids(&rest), std::slice::from_ref(&first));
    assert!(rest["next_cursor"].is_null());

    // What cannot be searched.
    for query in [
        "q=".to_owned(),
        format!("q={}", "a".repeat(201)),
        "q=w1&limit=0".to_owned(),
        "q=w1&limit=51".to_owned(),
        "q=w1&cursor=nope".to_owned(),
        "q=w1&cursor=".to_owned(),
        "limit=5".to_owned(),
    ] {
        let (status, body) = alice.get(&format!("/api/v1/search?{query}")).await;
        assert_eq!(status, 422, "{query}: {body}");
    }
    // A search with no word in it finds nothing (the document cannot say
    // what a word is in every script, so it is no error).
    let nothing = search(&alice, "q=%21%21%21").await;
    assert_eq!(nothing["items"], serde_json::json!([]), "{nothing}");

    gw.stop().await;
}

/// A conversation written by a gateway, left as a gateway of the version
/// before search would have left its database: no search tables, and their
/// migrations not applied. Its prompt says `pelican` (stored once, in its
/// `turn_started` event); its agent, `w0 … w2999` in many commits (parts).
async fn history_from_before_search(db: &TestDb) -> String {
    let gw = TestGateway::start(db, vec![demo_profile("demo", &["--chunk-delay-ms", "0"])]).await;
    let (id, mut ws) = gw.open_conversation("demo").await;
    gw.prompt(&id, "long 3000 pelican").await;
    ws.until_type("turn_ended").await;
    gw.stop().await;
    // The two migrations search came with, undone.
    let forget = "drop table search_backlog; drop table search_texts;
                  delete from _sqlx_migrations where version in (20261127000000, 20261129000000);";
    db.execute(forget, &format!("drop table search_fts; {forget}"))
        .await;
    id
}

/// The text of a message's text blocks.
fn text_of(message: &acp_gateway::model::Message) -> String {
    message
        .content
        .iter()
        .filter_map(|block| block["text"].as_str())
        .collect()
}

async fn history_from_before_search_is_found_once_the_upgraded_gateway_indexed_it(db: TestDb) {
    let old = history_from_before_search(&db).await;
    let gw = TestGateway::start(&db, vec![demo_profile("demo", &["--chunk-delay-ms", "0"])]).await;
    // Indexed in the background: found once it is done.
    let found = eventually(WAIT, async || {
        Some(search(&gw, "q=w2718").await).filter(|found| !ids(found).is_empty())
    })
    .await
    .expect("indexed in time");
    assert_eq!(ids(&found), [old.as_str()]);
    // The parts joined: a run of words across many commits.
    let snippet = found["items"][0]["snippet"].as_str().unwrap();
    assert!(snippet.contains("w2717 w2718 w2719"), "{snippet}");
    // The prompt, stored in its event only.
    let prompt = search(&gw, "q=pelican").await;
    assert_eq!(ids(&prompt), [old.as_str()]);
    assert_eq!(prompt["items"][0]["matched"], "message");

    // Each message once, and nothing left to do.
    let store = acp_gateway::store::open(&db.url).await.unwrap();
    let said: usize = store
        .list_messages(old.parse().unwrap())
        .await
        .unwrap()
        .iter()
        .map(|m| text_of(m).len())
        .sum();
    let indexed = db
        .number("select sum(length(body)) from search_texts")
        .await;
    assert_eq!(indexed, said as i64);
    assert_eq!(db.number("select count(*) from search_backlog").await, 0);

    // What is said from now on is indexed by its commits, as before.
    let (new, mut ws) = gw.open_conversation("demo").await;
    gw.prompt(&new, "echo heron").await;
    ws.until_type("turn_ended").await;
    assert_eq!(ids(&search(&gw, "q=heron").await), [new]);
    gw.stop().await;
}

/// Two nodes indexing one backlog at once each index a message once; a
/// commit that adds to an old message after it was read for the backlog (a
/// turn going on across the upgrade) loses nothing.
async fn a_backlog_is_indexed_once_and_a_commit_in_between_loses_nothing(db: TestDb) {
    use acp_gateway::model::MessagePart;
    use acp_gateway::store::Batch;
    let old = history_from_before_search(&db).await;
    let id: uuid::Uuid = old.parse().unwrap();
    // The migrations made the backlog: nothing is found yet.
    let (one, two) = (
        acp_gateway::store::open(&db.url).await.unwrap(),
        acp_gateway::store::open(&db.url).await.unwrap(),
    );
    assert_eq!(db.number("select count(*) from search_backlog").await, 2);
    assert!(one
        .search_conversations("w2718", 10, None, None)
        .await
        .unwrap()
        .is_empty());
    // Read for the backlog, then the agent's message grows.
    let messages = one.list_messages(id).await.unwrap();
    let texts: Vec<(uuid::Uuid, String)> = messages.iter().map(|m| (m.id, text_of(m))).collect();
    let agent = messages.last().unwrap().clone();
    let grown = MessagePart {
        part: 1_000_000,
        message: acp_gateway::model::Message {
            content: vec![json!({"type": "text", "text": " osprey"})],
            ..agent
        },
        content_in_event: None,
    };
    one.commit(
        id,
        &Batch {
            messages: vec![grown],
            ..Batch::default()
        },
    )
    .await
    .unwrap();
    let (a, b) = tokio::join!(
        one.index_backlog(id, &texts, true),
        two.index_backlog(id, &texts, true)
    );
    assert_eq!(a.unwrap() + b.unwrap(), 2, "the prompt and the reply, once");
    assert_eq!(db.number("select count(*) from search_backlog").await, 0);
    let said: usize = texts.iter().map(|(_, text)| text.len()).sum();
    let indexed = db
        .number("select sum(length(body)) from search_texts")
        .await;
    assert_eq!(indexed, (said + " osprey".len()) as i64);
    // The old words and the new in the one message.
    let found = one
        .search_conversations("w2718 osprey", 10, None, None)
        .await
        .unwrap();
    assert_eq!(found.len(), 1);
    // A pass with no backlog left does nothing.
    assert_eq!(
        acp_gateway::store::search_backlog::index_pass(&*one)
            .await
            .unwrap(),
        acp_gateway::store::search_backlog::Pass::default()
    );
}

/// A backlog of more messages than a page: every one indexed; a message
/// with no text leaves the backlog all the same; a conversation whose page
/// the database refuses keeps that page and the rest in the backlog, holds
/// up no other, and is done by the next pass.
async fn a_backlog_of_many_pages_is_indexed_whole(db: TestDb) {
    use acp_gateway::model::{self, Message, MessagePart, MessageRole};
    use acp_gateway::store::search_backlog::{index_pass, Pass};
    use acp_gateway::store::Batch;
    let store = acp_gateway::store::open(&db.url).await.unwrap();
    let message = |text: Option<String>| MessagePart {
        part: 0,
        message: Message {
            id: model::new_id(),
            turn_id: None,
            role: MessageRole::Agent,
            content: vec![match text {
                Some(text) => json!({"type": "text", "text": text}),
                None => json!({"type": "image", "data": "AA==", "mimeType": "image/png"}),
            }],
            created_at: model::now(),
        },
        content_in_event: None,
    };
    // The first conversation (the backlog's first): 250 messages with text
    // and one without; the second, one.
    let mut many: Vec<MessagePart> = (0..250)
        .map(|i| message(Some(format!("kestrel{i} "))))
        .collect();
    many.push(message(None));
    for messages in [many, vec![message(Some("osprey".into()))]] {
        let conversation = idle_conversation(None);
        store.insert_conversation(&conversation).await.unwrap();
        let batch = Batch {
            messages,
            ..Batch::default()
        };
        store.commit(conversation.id, &batch).await.unwrap();
    }
    // As a database from before search holds it: nothing indexed, all in
    // the backlog.
    let forget =
        "delete from search_texts; insert into search_backlog select id, conversation_id from messages;";
    db.execute(forget, forget).await;
    // The database refuses the first conversation's second page.
    db.execute(
        "create function refuse() returns trigger language plpgsql as $$
         begin if new.body = 'kestrel150 ' then raise exception 'refused'; end if; return new; end $$;
         create trigger refuse before insert on search_texts for each row execute function refuse();",
        "create trigger refuse before insert on search_texts when new.body = 'kestrel150 '
         begin select raise(abort, 'refused'); end;",
    )
    .await;
    let pass = index_pass(&*store).await.unwrap();
    assert_eq!(
        pass,
        Pass {
            indexed: 101,
            failed: 1
        }
    );
    assert_eq!(db.number("select count(*) from search_backlog").await, 151);
    let found = |word: &'static str| {
        let store = store.clone();
        async move {
            store
                .search_conversations(word, 10, None, None)
                .await
                .unwrap()
                .len()
        }
    };
    assert_eq!(found("osprey").await, 1);
    assert_eq!(found("kestrel99").await, 1);
    assert_eq!(found("kestrel150").await, 0);

    db.execute(
        "drop trigger refuse on search_texts; drop function refuse();",
        "drop trigger refuse;",
    )
    .await;
    let pass = index_pass(&*store).await.unwrap();
    assert_eq!(
        pass,
        Pass {
            indexed: 150,
            failed: 0
        }
    );
    assert_eq!(index_pass(&*store).await.unwrap(), Pass::default());
    assert_eq!(db.number("select count(*) from search_backlog").await, 0);
    assert_eq!(db.number("select count(*) from search_texts").await, 251);
    for word in [
        "kestrel0",
        "kestrel100",
        "kestrel150",
        "kestrel249",
        "osprey",
    ] {
        assert_eq!(found(word).await, 1, "{word}");
    }
}

crate::backend_tests!(
    a_conversation_is_found_by_what_its_agent_said_or_its_title,
    history_from_before_search_is_found_once_the_upgraded_gateway_indexed_it,
    a_backlog_is_indexed_once_and_a_commit_in_between_loses_nothing,
    a_backlog_of_many_pages_is_indexed_whole
);
