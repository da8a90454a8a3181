//! Steering from the web client, end to end (Chromium at 375 px, as in
//! `web_client`, against the agent on the official npm SDK): prompts typed
//! during a turn wait in the queue shown above the prompt box, where they
//! are edited, moved and removed; "Send now" steers; a held queue says so
//! and resumes; a reason given with an answer is shown with the decision
//! and reaches the agent.

use serde_json::{json, Value};

use crate::common::*;
use crate::web_client::{scene, Scene};

/// The texts of the conversation's queue, as the API lists it.
async fn queued(gw: &TestGateway, conversation: &str) -> Vec<String> {
    let (status, list) = gw
        .get(&format!("/api/v1/conversations/{conversation}/queue"))
        .await;
    assert_eq!(status, 200, "{list}");
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            p["content"][0]["text"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect()
}

/// Waits on `ws` until the turn whose prompt is `text` starts; its id.
async fn started(ws: &mut Ws, text: &str) -> Value {
    let frames = ws
        .until(|e| e["type"] == "turn_started" && e["data"]["content"][0]["text"] == text)
        .await;
    frames.last().unwrap()["data"]["turn_id"].clone()
}

#[tokio::test]
async fn prompts_typed_during_a_turn_queue_above_the_input_and_are_edited_moved_removed_and_started(
) {
    let Some(mut scene) = scene().await else {
        return;
    };
    let Scene { gw, browser, .. } = &mut scene;
    let (conversation, mut ws) = gw.open_conversation("sdk").await;
    browser.send_prompt(&conversation, "work").await;
    let asked = ws.until_type("permission_requested").await;
    let request = asked.last().unwrap()["data"]["id"]
        .as_str()
        .unwrap()
        .to_owned();

    // While the turn runs, what is sent waits in the queue, shown above
    // the prompt box; "Send now" is offered.
    browser.wait("#send-now").await;
    for text in ["hello one", "hello two", "hello three"] {
        browser.fill("Message", text).await;
        browser.click("button", "Send").await;
        browser.wait_for_text("#queue li .text", text).await;
    }
    browser.wait_text("#queue-head", "Queued (3)").await;
    assert_eq!(
        browser.texts("#queue li .text").await,
        ["hello one", "hello two", "hello three"]
    );
    assert_eq!(
        queued(gw, &conversation).await,
        ["hello one", "hello two", "hello three"]
    );
    // The box is empty again, and the queue sits right above it.
    let value = browser
        .run(json!({"do": "values", "selector": "#prompt"}))
        .await;
    assert_eq!(value, json!([""]));
    browser.fits_the_screen().await;
    let shot = browser.screenshot("queue.png", false).await;
    eprintln!("queue screenshot: {}", shot.display());
    browser
        .no_axe_violation("a conversation with a queue")
        .await;

    // Edited, moved to the top, removed: each as the API has it.
    browser.click("button", "Edit: hello two").await;
    browser.fill("Edit the queued prompt", "hello TWO").await;
    browser.click("button", "Save").await;
    browser
        .wait_text("#queue li:nth-child(2) .text", "hello TWO")
        .await;
    browser.click("button", "Top: hello three").await;
    browser
        .wait_text("#queue li:nth-child(1) .text", "hello three")
        .await;
    browser.click("button", "Remove: hello one").await;
    browser.wait_text("#queue-head", "Queued (2)").await;
    assert_eq!(
        browser.texts("#queue li .text").await,
        ["hello three", "hello TWO"]
    );
    assert_eq!(
        queued(gw, &conversation).await,
        ["hello three", "hello TWO"]
    );

    // A prompt that started before the page heard of it: removing it says
    // so plainly (409 already_started), and the page shows the queue as it is.
    browser.run(json!({"do": "hold_events"})).await;
    let (status, _) = gw
        .post(
            &format!("/api/v1/permissions/{request}/respond"),
            json!({"option_id": "allow-once"}),
        )
        .await;
    assert_eq!(status, 200);
    started(&mut ws, "hello three").await;
    browser.click("button", "Remove: hello three").await;
    browser
        .wait_for_text("#queue-error", "That prompt has already started")
        .await;
    browser.run(json!({"do": "release_events"})).await;

    // The turn ended with end_turn: the queue goes on, one after the other.
    started(&mut ws, "hello TWO").await;
    browser
        .run(json!({"do": "wait", "selector": "p.turn-end >> nth=2"}))
        .await;
    browser.wait_hidden("section.queue").await;
    assert_eq!(
        browser.texts("section.message.user .text").await,
        ["work", "hello three", "hello TWO"]
    );
    let said = browser.texts("section.message.agent .text").await;
    assert_eq!(said.last().unwrap(), "You said: hello TWO", "{said:?}");
    assert!(queued(gw, &conversation).await.is_empty());
    browser.wait_hidden("#send-now").await;
    browser.close().await;
}

#[tokio::test]
async fn send_now_steers_and_a_held_queue_says_so_and_resumes() {
    let Some(mut scene) = scene().await else {
        return;
    };
    let Scene { gw, browser, .. } = &mut scene;
    let (conversation, mut ws) = gw.open_conversation("sdk").await;
    browser.send_prompt(&conversation, "hang").await;
    browser
        .wait_for_text(
            "section.message.agent .text",
            "Hanging until session/cancel.",
        )
        .await;
    browser.fill("Message", "hello later").await;
    browser.click("button", "Send").await;
    browser
        .wait_for_text("#queue li .text", "hello later")
        .await;

    // "Send now": the turn is cancelled and this prompt goes first, then
    // the queue as it was.
    browser.fill("Message", "hello now").await;
    browser.click("button", "Send now").await;
    let frames = ws.until_type("turn_ended").await;
    assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "cancelled");
    started(&mut ws, "hello now").await;
    started(&mut ws, "hello later").await;
    browser
        .run(json!({"do": "wait", "selector": "p.turn-end >> nth=2"}))
        .await;
    assert_eq!(
        browser.texts("section.message.user .text").await,
        ["hang", "hello now", "hello later"]
    );
    browser.wait_hidden("#send-now").await;
    browser.wait_hidden("section.queue").await;

    // A turn cancelled with a prompt waiting: the queue holds, the page
    // says so and offers Resume.
    browser.fill("Message", "hang").await;
    browser.click("button", "Send").await;
    started(&mut ws, "hang").await;
    browser.wait("#send-now").await;
    browser.fill("Message", "hello after").await;
    browser.click("button", "Send").await;
    browser
        .wait_for_text("#queue li .text", "hello after")
        .await;
    browser.click("button", "Cancel").await;
    ws.until_type("queue_held").await;
    browser
        .wait_text(
            "div.held span",
            "The queue is paused (the turn ended: cancelled). 1 prompt waits.",
        )
        .await;
    browser.fits_the_screen().await;
    let shot = browser.screenshot("queue-held.png", false).await;
    eprintln!("held queue screenshot: {}", shot.display());
    browser.no_axe_violation("a held queue").await;
    assert_eq!(queued(gw, &conversation).await, ["hello after"]);

    browser.click("button", "Resume").await;
    let turn = started(&mut ws, "hello after").await;
    ws.until(|e| e["type"] == "turn_ended" && e["data"]["turn_id"] == turn)
        .await;
    browser.wait_hidden("div.held").await;
    browser.wait_hidden("section.queue").await;
    browser
        .run(json!({"do": "wait", "selector": "p.turn-end >> nth=4"}))
        .await;
    let said = browser.texts("section.message.agent .text").await;
    assert_eq!(said.last().unwrap(), "You said: hello after", "{said:?}");
    browser.close().await;
}

#[tokio::test]
async fn a_reason_given_with_an_answer_is_shown_with_the_decision_and_reaches_the_agent() {
    let Some(mut scene) = scene().await else {
        return;
    };
    let Scene { gw, browser, .. } = &mut scene;
    let (conversation, mut ws) = gw.open_conversation("sdk").await;
    browser.send_prompt(&conversation, "work").await;
    let asked = ws.until_type("permission_requested").await;
    let request = asked.last().unwrap()["data"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    browser.wait("article.permission").await;

    // The reason box opens on request; "Tell the agent now" needs a reason.
    browser.click("button", "Add a reason").await;
    browser
        .click("checkbox", "Tell the agent now (stops its turn)")
        .await;
    browser.click("button", "Reject").await;
    browser
        .wait_for_text("article.permission .error", "Write a reason")
        .await;
    let (_, still) = gw.get(&format!("/api/v1/permissions/{request}")).await;
    assert_eq!(still["status"], "pending");
    browser
        .click("checkbox", "Tell the agent now (stops its turn)")
        .await;
    let reason = "Keep the greeting as it is.\nIt is tested.";
    browser.fill("Reason", reason).await;
    browser.fits_the_screen().await;
    let shot = browser.screenshot("reason.png", false).await;
    eprintln!("reason screenshot: {}", shot.display());
    browser
        .no_axe_violation("a request with its reason box open")
        .await;
    browser.click("button", "Reject").await;

    // Shown with the decision, stored with it, and the agent told why when
    // its turn ends.
    browser
        .wait_text(
            "article.permission .decision-reason",
            &format!("Reason: {reason}"),
        )
        .await;
    let (_, answered) = gw.get(&format!("/api/v1/permissions/{request}")).await;
    assert_eq!(answered["status"], "rejected");
    assert_eq!(answered["decision"]["reason"], reason);
    let told = format!(
        "The user refused your request to run \"Edit src/main.rs\" (\"Reject\"). Their reason: {reason}"
    );
    started(&mut ws, &told).await;
    browser
        .run(json!({"do": "wait", "selector": "p.turn-end >> nth=1"}))
        .await;
    assert_eq!(
        browser.texts("section.message.user .text").await,
        ["work", told.as_str()]
    );
    // Opened again, the page shows it from the events.
    browser.goto("/#/conversations").await;
    browser.goto(&format!("/#/c/{conversation}")).await;
    browser
        .wait_text(
            "article.permission .decision-reason",
            &format!("Reason: {reason}"),
        )
        .await;

    // From the inbox, at once: the turn is stopped and the reason sent.
    gw.prompt(&conversation, "work").await;
    ws.until_type("permission_requested").await;
    browser.goto("/#/").await;
    browser.wait("article.permission").await;
    browser.click("button", "Add a reason").await;
    browser.fill("Reason", "Only this file.").await;
    browser
        .click("checkbox", "Tell the agent now (stops its turn)")
        .await;
    browser.click("button", "Allow once").await;
    started(
        &mut ws,
        "The user allowed your request to run \"Edit src/main.rs\" (\"Allow once\"), and said: Only this file.",
    )
    .await;
    browser.wait("#inbox p.empty").await;
    browser.close().await;
}
