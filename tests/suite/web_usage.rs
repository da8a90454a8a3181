//! What agents spent, in the web client (Chromium at 375 px, as in
//! `web_client`): each conversation's spend in the list and on its page
//! (there, live as its agent reports more), and the Usage page reached from
//! the navigation: the span's totals, a bar per day, the spend per agent
//! and per conversation (by title).

use serde_json::json;

use crate::common::*;
use crate::web_client::{db, Browser};

/// A conversation titled `title` whose one turn is `prompt`, ended: its id.
async fn spent_in(gw: &TestGateway, title: &str, prompt: &str) -> String {
    let (status, created) = gw
        .post(
            "/api/v1/conversations",
            json!({"agent": "demo", "title": title}),
        )
        .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_owned();
    let mut ws = gw.conversation_ws(&id, 0).await;
    gw.prompt(&id, prompt).await;
    ws.until_type("turn_ended").await;
    id
}

#[tokio::test]
async fn spend_is_shown_on_each_conversation_and_summed_on_the_usage_page() {
    let db = db().await;
    let gw = TestGateway::start(&db, vec![demo_profile("demo", &[])]).await;
    let Some((mut browser, _)) = Browser::launch(Some(&gw.base)).await else {
        return;
    };
    let spendy = spent_in(&gw, "Spendy", "cost 0.25 0.75").await;
    spent_in(&gw, "Frugal", "cost 0.5").await;
    let quiet = spent_in(&gw, "Quiet", "hello").await;

    browser.goto("/#/conversations").await;
    browser
        .wait_for_text("li.conversation .spend", "Spent 0.75 USD")
        .await;
    let spends = browser.texts("li.conversation .spend").await;
    assert_eq!(
        spends,
        ["", "Spent 0.50 USD", "Spent 0.75 USD"],
        "Quiet shows none"
    );
    browser.fits_the_screen().await;

    // On its page, and live as its agent reports more.
    browser.goto(&format!("/#/c/{quiet}")).await;
    browser.wait("#prompt").await;
    browser.wait_hidden("#spend").await;
    browser.send_prompt(&spendy, "cost 1.5").await;
    browser.wait_text("#spend", "Spent 1.50 USD").await;
    browser.fits_the_screen().await;

    // The Usage page, from the navigation.
    browser.click("link", "Usage").await;
    browser
        .wait_text(
            "#usage-totals",
            "Spent 2.00 USD in the last 30 days (4 usage reports).",
        )
        .await;
    assert_eq!(browser.texts("#usage-agents .name").await, ["demo"]);
    assert_eq!(browser.texts("#usage-agents .amount").await, ["2.00 USD"]);
    assert_eq!(
        browser.texts("#usage-agents .meta").await,
        ["4 reports · 3 turns"]
    );
    browser
        .wait_for_text("#usage-conversations .name a", "Spendy")
        .await;
    browser
        .wait_for_text("#usage-conversations .name a", "Frugal")
        .await;
    assert_eq!(
        browser.texts("#usage-conversations .amount").await,
        ["1.50 USD", "0.50 USD"],
        "the biggest spender first"
    );
    // Today's bar holds it all.
    browser.wait("#usage-chart rect[data-amount=\"2\"]").await;
    browser.wait_hidden("#usage-users").await;
    browser.fits_the_screen().await;
    browser.no_axe_violation("/#/usage").await;
    let shot = browser.screenshot("usage.png", true).await;
    eprintln!("usage screenshot: {}", shot.display());

    // A shorter span asks again.
    browser
        .run(json!({"do": "select", "label": "Span", "value": "7"}))
        .await;
    browser
        .wait_text(
            "#usage-totals",
            "Spent 2.00 USD in the last 7 days (4 usage reports).",
        )
        .await;
    browser.close().await;
}
