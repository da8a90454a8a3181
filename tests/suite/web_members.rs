//! Sharing in the web client, end to end (Chromium at 375 px, as in
//! `web_client`): the owner shares a conversation from its Members panel,
//! the list marks it shared, the transcript says who prompted and who
//! decided; the member sees it marked "shared with me" with their role;
//! the owner removes them again.

use serde_json::json;

use crate::common::*;
use crate::web_client::{db, Browser};

async fn sign_in(browser: &mut Browser, token: &str) {
    browser.goto("/").await;
    browser.wait("#token").await;
    browser.fill("Token", token).await;
    browser.click("button", "Sign in").await;
    browser.wait("#sign-out").await;
}

#[tokio::test]
async fn an_owner_shares_from_the_members_panel_and_both_see_who_did_what() {
    let db = db().await;
    let alice = cli_token(&db, "alice", "user");
    let bob = cli_token(&db, "bob", "user");
    let gw = TestGateway::start(&db, vec![demo_profile("demo", &[])]).await;
    let (as_alice, as_bob) = (gw.with_token(&alice), gw.with_token(&bob));
    let (status, created) = as_alice
        .post(
            "/api/v1/conversations",
            json!({"agent": "demo", "title": "Team plan"}),
        )
        .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_owned();
    let mut ws = as_alice.conversation_ws(&id, 0).await;
    as_alice.prompt(&id, "hello").await;
    ws.until_type("turn_ended").await;
    let Some((mut browser, _)) = Browser::launch(Some(&gw.base)).await else {
        return;
    };

    // The owner opens the Members panel: not shared yet; shares with bob.
    sign_in(&mut browser, &alice).await;
    browser.goto(&format!("/#/c/{id}")).await;
    browser
        .wait_for_text("section.message.user p.who", "alice")
        .await;
    browser.click("button", "Members").await;
    browser.wait_for_text("#members li", "Not shared").await;
    browser.fill("User", "bob").await;
    browser
        .run(json!({"do": "select", "label": "Role", "value": "approver"}))
        .await;
    browser.click("button", "Share").await;
    browser.wait_for_text("#members li.member", "bob").await;
    browser.wait_text("#members-count", "(1)").await;
    browser
        .wait_for_text("p.note.member", "alice shared it with bob (approver)")
        .await;
    assert_eq!(as_bob.conversation(&id).await["role"], "approver");
    browser.fits_the_screen().await;
    let shot = browser.screenshot("members-panel.png", false).await;
    eprintln!("members screenshot: {}", shot.display());

    // The approver answers; the owner's page says who decided.
    as_alice.prompt(&id, "tool").await;
    let request = ws.until_type("permission_requested").await.pop().unwrap();
    let request = request["data"]["id"].as_str().unwrap();
    let (status, answered) = as_bob
        .post(
            &format!("/api/v1/permissions/{request}/respond"),
            json!({"option_id": "allow-once"}),
        )
        .await;
    assert_eq!(status, 200, "{answered}");
    browser
        .wait_for_text("article.permission", "user:bob")
        .await;
    ws.until_type("turn_ended").await;

    // The list marks it shared by its owner.
    browser.goto("/#/conversations").await;
    browser
        .wait_text("li.conversation .badge", "Shared · 1")
        .await;

    // The member: shared with them, as what; theirs neither to delete nor
    // to share.
    browser.click("button", "Sign out").await;
    sign_in(&mut browser, &bob).await;
    browser.goto("/#/conversations").await;
    browser
        .wait_text("li.conversation .badge", "Shared with me · approver")
        .await;
    let buttons = browser
        .run(json!({"do": "names", "selector": "li.conversation", "role": "button"}))
        .await;
    assert_eq!(buttons, json!([]), "no Delete for a member");
    browser.goto(&format!("/#/c/{id}")).await;
    browser.click("button", "Members").await;
    browser
        .wait_text("#my-role", "Shared with you as approver")
        .await;
    browser.wait_hidden("form.member-add").await;
    browser.fits_the_screen().await;

    // The owner removes them.
    browser.click("button", "Sign out").await;
    sign_in(&mut browser, &alice).await;
    browser.goto(&format!("/#/c/{id}")).await;
    browser.click("button", "Members").await;
    browser.wait_for_text("#members li.member", "bob").await;
    browser.click("button", "Remove bob").await;
    browser.wait_for_text("#members li", "Not shared").await;
    assert_eq!(
        as_bob.get(&format!("/api/v1/conversations/{id}")).await.0,
        404
    );
    browser.close().await;
    gw.stop().await;
}
