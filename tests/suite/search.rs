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

crate::backend_tests!(a_conversation_is_found_by_what_its_agent_said_or_its_title);
