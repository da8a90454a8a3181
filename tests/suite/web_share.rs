//! Share links in the web client, end to end (Chromium at 375 px, as in
//! `web_client`): the owner makes a link from the conversation's page and
//! sees it listed; the link's page shows the conversation, history and
//! live, read-only and without a token; revoked, the open page says the
//! link no longer works, and the owner's list says it is revoked.

use serde_json::{json, Value};

use crate::common::*;
use crate::web_client::{db, Browser};

#[tokio::test]
async fn a_link_made_on_the_page_shows_the_conversation_read_only_until_revoked() {
    let db = db().await;
    let mut config = Config::for_tests(&db, vec![demo_profile("demo", &[])]);
    config.share_links = true;
    let gw = TestGateway::start_with(config).await;
    let Some((mut browser, origin)) = Browser::launch(Some(&gw.base)).await else {
        return;
    };
    let (conversation, mut ws) = gw.open_conversation("demo").await;
    gw.prompt(&conversation, "hello").await;
    ws.until_type("turn_ended").await;

    // The owner makes a link for 7 days.
    browser.goto(&format!("/#/c/{conversation}")).await;
    browser.wait("#prompt").await;
    browser.click("button", "Share link").await;
    browser
        .run(json!({"do": "select", "label": "Expires after", "value": "7d"}))
        .await;
    browser.click("button", "Create link").await;
    browser.wait("#share-url").await;
    browser.wait("#share-links li[data-state=active]").await;
    let url = browser
        .run(json!({"do": "values", "selector": "#share-url"}))
        .await[0]
        .as_str()
        .unwrap()
        .to_owned();
    let path = url
        .strip_prefix(&origin)
        .unwrap_or_else(|| panic!("{url} is not on {origin}"))
        .to_owned();
    assert!(path.starts_with("/s/acpgw_share_"), "{url}");
    let (status, links) = gw
        .get(&format!("/api/v1/conversations/{conversation}/share-links"))
        .await;
    assert_eq!(status, 200, "{links}");
    let link: &Value = &links["items"][0];
    let made = chrono::DateTime::parse_from_rfc3339(link["created_at"].as_str().unwrap()).unwrap();
    let ends = chrono::DateTime::parse_from_rfc3339(link["expires_at"].as_str().unwrap()).unwrap();
    assert_eq!(ends - made, chrono::Duration::days(7));
    browser.fits_the_screen().await;
    browser.no_axe_violation("the share control").await;
    let shot = browser.screenshot("share-control.png", false).await;
    eprintln!("share control screenshot: {}", shot.display());

    // The link's page: the history, nothing to press, no token asked for.
    browser.goto(&path).await;
    browser
        .wait_for_text("#timeline .message.agent", "hello")
        .await;
    browser.wait_text("#live", "Live").await;
    assert_eq!(browser.texts("#prompt").await, Vec::<String>::new());
    let buttons = browser
        .run(json!({"do": "names", "selector": "body", "role": "button"}))
        .await;
    assert_eq!(buttons, json!([]));
    browser.fits_the_screen().await;
    browser.no_axe_violation("the shared page").await;
    // Live: a turn made elsewhere shows as it happens.
    assert_eq!(browser.texts("#timeline .turn-end").await.len(), 1);
    gw.prompt(&conversation, "hello").await;
    ws.until_type("turn_ended").await;
    browser
        .run(json!({"do": "wait", "selector": "#timeline .turn-end >> nth=1"}))
        .await;
    let shot = browser.screenshot("shared-page.png", true).await;
    eprintln!("shared page screenshot: {}", shot.display());

    // Revoked while the page is open: it says so at once.
    let id = link["id"].as_str().unwrap();
    let (status, _) = gw
        .delete(&format!(
            "/api/v1/conversations/{conversation}/share-links/{id}"
        ))
        .await;
    assert_eq!(status, 204);
    browser.wait("#ended").await;
    browser.fits_the_screen().await;
    // Opened again: the same.
    browser.goto(&path).await;
    browser.wait("#ended").await;

    // The owner's list says it is revoked, with nothing left to revoke.
    browser.goto(&format!("/#/c/{conversation}")).await;
    browser.wait("#prompt").await;
    browser.click("button", "Share link").await;
    browser.wait("#share-links li[data-state=revoked]").await;
    let revoke = browser
        .run(json!({"do": "names", "selector": "#share-links", "role": "button"}))
        .await;
    assert_eq!(revoke, json!([]));
    browser.close().await;
}
