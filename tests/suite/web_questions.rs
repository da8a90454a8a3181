//! The agents' questions (ACP elicitation) in the web client, end to end
//! (Chromium at 375 px, as in `web_client`, against the agent on the
//! official npm SDK): a form question in the inbox, built from its schema,
//! checked in the page (a message on the field), then by the gateway (its
//! 422 shown on the field it names), then answered, and shown answered in
//! its conversation; one declined there; one answered elsewhere followed
//! live; a URL question with its host shown plainly, accepted.

use serde_json::{json, Value};

use crate::common::*;
use crate::web_client::{scene, Browser};

/// The form the agent asks with: a choice, a bounded integer, an email, a
/// yes/no and a multi-select.
fn form() -> Value {
    json!({
        "mode": "form",
        "message": "Which environment, and how many replicas?",
        "requestedSchema": {
            "type": "object",
            "properties": {
                "env": {"type": "string", "title": "Environment", "oneOf": [
                    {"const": "staging", "title": "Staging"},
                    {"const": "production", "title": "Production"}
                ]},
                "replicas": {"type": "integer", "title": "Replicas", "minimum": 1, "maximum": 5},
                "contact": {"type": "string", "title": "Contact", "format": "email",
                            "description": "Who to tell when it is done"},
                "confirm": {"type": "boolean", "title": "Run the migrations too"},
                "regions": {"type": "array", "title": "Regions",
                            "items": {"enum": ["eu", "us"]}, "maxItems": 2}
            },
            "required": ["env", "replicas"]
        }
    })
}

/// What the agent says it got, once its turn ended.
async fn agent_got(ws: &mut Ws) -> Value {
    let frames = ws.until_type("turn_ended").await;
    let said = streamed_text(&frames, "agent_message_chunk");
    serde_json::from_str(&said).unwrap_or(Value::String(said))
}

async fn asked(ws: &mut Ws) -> Value {
    let frames = ws.until_type("question_asked").await;
    frames.last().unwrap()["data"].clone()
}

/// The visible per-field messages of the form, in order.
async fn field_errors(browser: &mut Browser) -> Vec<String> {
    browser.texts("article.question .field-error:visible").await
}

#[tokio::test]
async fn a_form_question_is_checked_in_the_page_and_by_the_gateway_then_answered_from_the_inbox() {
    let Some(mut scene) = scene().await else {
        return;
    };
    let crate::web_client::Scene { gw, browser, .. } = &mut scene;
    let (conversation, mut ws) = gw.open_conversation("sdk").await;
    browser.goto("/#/").await;
    browser.wait("#inbox p.empty").await;
    gw.prompt(&conversation, &format!("question {}", form()))
        .await;
    let question = asked(&mut ws).await;
    let qid = question["id"].as_str().unwrap().to_owned();

    // Live in the inbox: the message, a control per field, required ones
    // marked, and Submit, Decline, Cancel.
    browser
        .wait_text(
            "article.question h2",
            "Which environment, and how many replicas?",
        )
        .await;
    browser.wait_text("#inbox-count", "1").await;
    let names = browser
        .run(json!({"do": "names", "selector": "article.question .options", "role": "button"}))
        .await;
    assert_eq!(names, json!(["Submit", "Decline", "Cancel"]));
    assert_eq!(
        browser.texts("article.question legend").await,
        ["Environment (required)", "Regions"]
    );
    assert_eq!(
        browser.texts("article.question .check label").await,
        [
            "Staging",
            "Production",
            "Run the migrations too",
            "eu",
            "us"
        ]
    );
    let kinds = browser
        .run(json!({"do": "attrs", "selector": "article.question .check input", "name": "type"}))
        .await;
    assert_eq!(
        kinds,
        json!(["radio", "radio", "checkbox", "checkbox", "checkbox"])
    );
    let kinds = browser
        .run(json!({"do": "attrs", "selector": "article.question input:not([type=radio]):not([type=checkbox])", "name": "type"}))
        .await;
    assert_eq!(kinds, json!(["number", "email"]));
    for (name, value) in [("min", "1"), ("max", "5"), ("step", "1")] {
        let got = browser
            .run(json!({"do": "attrs", "selector": "article.question input[type=number]", "name": name}))
            .await;
        assert_eq!(got, json!([value]), "{name}");
    }
    assert_eq!(
        browser.texts("article.question .required").await,
        [" (required)", " (required)"]
    );
    assert_eq!(
        browser.texts("article.question .field .hint").await,
        ["Who to tell when it is done"]
    );
    browser.fits_the_screen().await;
    browser
        .no_axe_violation("a form question in the inbox")
        .await;
    let shot = browser.screenshot("question-form.png", true).await;
    eprintln!("question screenshot: {}", shot.display());

    // Checked in the page first: nothing is sent while a field is wrong.
    browser.click("button", "Submit").await;
    browser
        .wait_for_text("article.question .field-error", "Required")
        .await;
    assert_eq!(field_errors(browser).await, ["Required", "Required"]);
    browser.fill("Replicas (required)", "9").await;
    browser.click("radio", "Production").await;
    browser.click("button", "Submit").await;
    browser
        .wait_for_text("article.question .field-error", "Must be at most 5")
        .await;
    assert_eq!(field_errors(browser).await, ["Must be at most 5"]);
    let invalid = browser
        .run(json!({"do": "attrs", "selector": "article.question input[type=number]", "name": "aria-invalid"}))
        .await;
    assert_eq!(invalid, json!(["true"]));
    let (_, still) = gw.get(&format!("/api/v1/questions/{qid}")).await;
    assert_eq!(still["status"], "pending");

    // The browser takes "ops@localhost" as an email address; the gateway
    // does not, and its 422 shows on the field it names.
    browser.fill("Replicas (required)", "3").await;
    browser.fill("Contact", "ops@localhost").await;
    browser.click("button", "Submit").await;
    browser
        .wait_for_text("article.question .field-error", "Must be an email address")
        .await;
    assert_eq!(field_errors(browser).await, ["Must be an email address"]);
    let (_, still) = gw.get(&format!("/api/v1/questions/{qid}")).await;
    assert_eq!(still["status"], "pending");

    // Put right and sent: the agent gets the content.
    browser.fill("Contact", "ops@example.org").await;
    browser.click("checkbox", "Run the migrations too").await;
    browser.click("checkbox", "us").await;
    browser.click("button", "Submit").await;
    let content = json!({"env": "production", "replicas": 3, "contact": "ops@example.org",
                         "confirm": true, "regions": ["us"]});
    assert_eq!(
        agent_got(&mut ws).await,
        json!({"action": "accept", "content": content})
    );
    browser.wait("#inbox p.empty").await;
    let (_, answered) = gw.get(&format!("/api/v1/questions/{qid}")).await;
    assert_eq!(answered["status"], "accepted");

    // Its conversation shows it answered, with what was sent (a choice by
    // its title, a yes/no in words).
    browser.goto(&format!("/#/c/{conversation}")).await;
    browser
        .wait_for_text("article.question .decision", "Answered: Accepted by user:")
        .await;
    assert_eq!(
        browser.texts("article.question dl.answer dt").await,
        [
            "Environment",
            "Replicas",
            "Contact",
            "Run the migrations too",
            "Regions"
        ]
    );
    assert_eq!(
        browser.texts("article.question dl.answer dd").await,
        ["Production", "3", "ops@example.org", "Yes", "us"]
    );
    assert_eq!(
        browser
            .run(json!({"do": "names", "selector": "article.question", "role": "button"}))
            .await,
        json!([])
    );
    browser.fits_the_screen().await;
    browser.close().await;
}

#[tokio::test]
async fn questions_in_a_conversation_are_declined_followed_live_and_a_url_question_accepted() {
    let Some(mut scene) = scene().await else {
        return;
    };
    let crate::web_client::Scene { gw, browser, .. } = &mut scene;
    let (conversation, mut ws) = gw.open_conversation("sdk").await;

    // Declined from its card in the conversation.
    browser
        .send_prompt(&conversation, &format!("question {}", form()))
        .await;
    asked(&mut ws).await;
    browser.wait("article.question form").await;
    browser.click("button", "Decline").await;
    assert_eq!(agent_got(&mut ws).await, json!({"action": "decline"}));
    browser
        .wait_for_text("article.question .decision", "Answered: Declined by user:")
        .await;

    // Answered elsewhere while the page shows it: the card follows.
    gw.prompt(&conversation, &format!("question {}", form()))
        .await;
    let second = asked(&mut ws).await;
    browser.wait("article.question >> nth=1 >> form").await;
    let (status, _) = gw
        .post(
            &format!(
                "/api/v1/questions/{}/respond",
                second["id"].as_str().unwrap()
            ),
            json!({"action": "accept", "content": {"env": "staging", "replicas": 1}}),
        )
        .await;
    assert_eq!(status, 200);
    browser
        .wait_for_text(
            "article.question >> nth=1 >> .decision",
            "Answered: Accepted by user:",
        )
        .await;
    assert_eq!(
        browser
            .texts("article.question >> nth=1 >> dl.answer dd")
            .await,
        ["Staging", "1"]
    );
    agent_got(&mut ws).await;

    // A URL question: the link (opened apart from the page), its host
    // shown plainly, and "I opened it".
    let url = "https://login.example.org/device?code=WXYZ-1234";
    let ask = json!({"mode": "url", "elicitationId": "e-1", "url": url,
                     "message": "Sign in to the deploy service"});
    browser.fill("Message", &format!("question {ask}")).await;
    browser.click("button", "Send").await;
    asked(&mut ws).await;
    let third = "article.question >> nth=2";
    browser
        .wait_for_text(&format!("{third} >> h2"), "Sign in to the deploy service")
        .await;
    assert_eq!(
        browser.texts(&format!("{third} >> .host")).await,
        ["On login.example.org"]
    );
    let href = browser
        .run(json!({"do": "attrs", "selector": format!("{third} >> a.url"), "name": "href"}))
        .await;
    assert_eq!(href, json!([url]));
    let rel = browser
        .run(json!({"do": "attrs", "selector": format!("{third} >> a.url"), "name": "rel"}))
        .await;
    assert!(rel[0].as_str().unwrap().contains("noopener"), "{rel}");
    let names = browser
        .run(json!({"do": "names", "selector": format!("{third} >> .options"), "role": "button"}))
        .await;
    assert_eq!(names, json!(["I opened it", "Decline"]));
    browser.fits_the_screen().await;
    browser
        .no_axe_violation("a conversation with questions")
        .await;
    let shot = browser.screenshot("question-url.png", true).await;
    eprintln!("URL question screenshot: {}", shot.display());
    browser.click("button", "I opened it").await;
    assert_eq!(agent_got(&mut ws).await, json!({"action": "accept"}));
    browser
        .wait_for_text(
            &format!("{third} >> .decision"),
            "Answered: Accepted by user:",
        )
        .await;
    browser.close().await;
}

/// A yes/no question notified while nobody looks: the service worker shows
/// it as the agent's question with Yes and No, and a tap on No answers it
/// through its action URL (the agent gets `{"go": false}`).
#[tokio::test]
async fn a_yes_no_question_is_answered_from_its_notification_on_this_device() {
    let Some((mut browser, origin)) = Browser::launch(None).await else {
        return;
    };
    let db = crate::web_client::db().await;
    let (receiver_url, mut received) = crate::web_client::receiver().await;
    let mut config = Config::for_tests(&db, vec![node_sdk_profile("sdk")]);
    config.notifications.base_url = Some(origin.clone());
    config.notifications.grace = std::time::Duration::from_millis(100);
    config.notifications.allow_private_targets = true;
    let gw = TestGateway::start_with(config).await;
    browser.run(json!({"do": "upstream", "url": gw.base})).await;
    browser.goto("/#/settings").await;
    browser.run(json!({"do": "sw_ready"})).await;
    let (status, hook) = gw
        .post(
            "/api/v1/notification-targets",
            json!({"kind": "webhook", "url": format!("{receiver_url}/hook"), "label": "hook"}),
        )
        .await;
    assert_eq!(status, 201, "{hook}");

    // Nobody looks: the page leaves the app (its sockets close), the agent asks.
    browser.goto("/ui/app.css").await;
    let (conversation, mut ws) = gw.open_conversation("sdk").await;
    let ask = json!({"mode": "form", "message": "Deploy to production now?",
        "requestedSchema": {"type": "object", "properties": {"go": {"type": "boolean"}}}});
    gw.prompt(&conversation, &format!("question {ask}")).await;
    let question = asked(&mut ws).await;
    let (path, _, body) = tokio::time::timeout(WAIT, received.recv())
        .await
        .expect("the gateway delivers to the webhook")
        .unwrap();
    assert_eq!(path, "/hook");
    let notification: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(notification["request"]["id"], question["id"]);
    assert_eq!(notification["request"]["kind"], "question");

    browser
        .run(json!({"do": "push", "data": notification}))
        .await;
    let shown = browser.run(json!({"do": "notifications"})).await;
    assert_eq!(shown.as_array().unwrap().len(), 1, "{shown}");
    assert_eq!(
        shown[0]["title"], "The agent asks: Deploy to production now?",
        "{shown}"
    );
    let no = r#"question-accept:{"go":false}"#;
    assert_eq!(
        shown[0]["actions"],
        json!([r#"question-accept:{"go":true}"#, no]),
        "{shown}"
    );
    browser
        .run(json!({"do": "notification_click", "action": no}))
        .await;
    assert_eq!(
        agent_got(&mut ws).await,
        json!({"action": "accept", "content": {"go": false}})
    );
    let (_, answered) = gw
        .get(&format!(
            "/api/v1/questions/{}",
            question["id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(answered["answer"]["via"], "notification", "{answered}");
    browser.close().await;
}

/// Text, a URL, a date, a date and time, a long choice and a number: each
/// its own kind of field, checked in the page, and sent as the schema says
/// (the date and time in RFC 3339).
#[tokio::test]
async fn a_form_of_text_dates_a_long_choice_and_a_number_reaches_the_agent_as_filled_in() {
    let Some(mut scene) = scene().await else {
        return;
    };
    let crate::web_client::Scene { gw, browser, .. } = &mut scene;
    let (conversation, mut ws) = gw.open_conversation("sdk").await;
    let ask = json!({"mode": "form", "message": "Schedule the release",
        "requestedSchema": {"type": "object", "properties": {
            "name": {"type": "string", "title": "Service", "minLength": 2, "maxLength": 20,
                     "pattern": "^[a-z-]+$"},
            "site": {"type": "string", "title": "Dashboard", "format": "uri"},
            "day": {"type": "string", "title": "Day", "format": "date"},
            "at": {"type": "string", "title": "Start at", "format": "date-time"},
            "size": {"type": "string", "title": "Size", "enum": ["xs", "s", "m", "l", "xl"]},
            "share": {"type": "number", "title": "Share", "maximum": 1.5}
        }, "required": ["name", "day"]}});
    browser.goto(&format!("/#/c/{conversation}")).await;
    browser.wait("#prompt").await;
    gw.prompt(&conversation, &format!("question {ask}")).await;
    asked(&mut ws).await;
    browser.wait("article.question form").await;
    let kinds = browser
        .run(json!({"do": "attrs", "selector": "article.question input", "name": "type"}))
        .await;
    assert_eq!(
        kinds,
        json!(["text", "url", "date", "datetime-local", "number"])
    );
    assert_eq!(
        browser.texts("article.question select option").await,
        ["Choose…", "xs", "s", "m", "l", "xl"]
    );
    let step = browser
        .run(json!({"do": "attrs", "selector": "article.question input[type=number]", "name": "step"}))
        .await;
    assert_eq!(step, json!(["any"]));

    browser.fill("Service (required)", "a").await;
    browser.click("button", "Submit").await;
    browser
        .wait_for_text("article.question .field-error", "At least 2 characters")
        .await;
    assert_eq!(
        field_errors(browser).await,
        ["At least 2 characters", "Required"]
    );
    browser.fill("Service (required)", "Billing API").await;
    browser.fill("Day (required)", "2026-12-24").await;
    browser.fill("Share", "2").await;
    browser.click("button", "Submit").await;
    browser
        .wait_for_text("article.question .field-error", "Must be at most 1.5")
        .await;
    assert_eq!(
        field_errors(browser).await,
        ["Must match the pattern ^[a-z-]+$", "Must be at most 1.5"]
    );
    browser.fill("Service (required)", "billing-api").await;
    browser.fill("Share", "0.5").await;
    browser
        .fill("Dashboard", "https://dash.example.org/release")
        .await;
    browser.fill("Start at", "2026-12-24T09:30").await;
    browser
        .run(json!({"do": "select", "label": "Size", "value": "xl"}))
        .await;
    browser.fits_the_screen().await;
    browser.click("button", "Submit").await;
    let got = agent_got(&mut ws).await;
    assert_eq!(got["action"], "accept", "{got}");
    let content = &got["content"];
    assert_eq!(content["name"], "billing-api");
    assert_eq!(content["site"], "https://dash.example.org/release");
    assert_eq!(content["day"], "2026-12-24");
    assert_eq!(content["size"], "xl");
    assert_eq!(content["share"], 0.5);
    // The page's time zone's 09:30, as RFC 3339 in UTC.
    let at = content["at"].as_str().unwrap();
    assert!(
        chrono::DateTime::parse_from_rfc3339(at).is_ok() && at.ends_with('Z'),
        "{at}"
    );
    browser
        .wait_for_text("article.question .decision", "Answered: Accepted by user:")
        .await;
    assert_eq!(
        browser.texts("article.question dl.answer dt").await,
        ["Service", "Dashboard", "Day", "Start at", "Size", "Share"]
    );
    browser.close().await;
}
