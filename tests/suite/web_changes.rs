//! A conversation's changes in the web client, end to end (Chromium at 375
//! px, as in `web_client`): a conversation made on a real repository, the
//! demo agent writing a file in its worktree; the list counts the change
//! live, the Changes page lists the file with its lines and shows its
//! diff; then Commit, Land (merge: the repository's own working tree gets
//! the file) and Discard, each confirmed in the page, and what the gateway
//! refuses said with the files it names.

use std::path::PathBuf;

use acp_gateway::config::AgentProfile;
use serde_json::{json, Value};

use crate::common::*;
use crate::web_client::{db, Browser};
use crate::worktrees::{git, Repo};

/// Waits on `ws` for an event of `kind`; its data.
async fn data_of(ws: &mut Ws, kind: &str) -> Value {
    ws.until_type(kind).await.last().unwrap()["data"].clone()
}

#[tokio::test]
async fn a_conversations_changes_are_counted_shown_committed_landed_and_discarded_from_the_page() {
    let db = db().await;
    let made = Repo::new();
    let repo = made.path.clone();
    let agent = AgentProfile {
        allowed_roots: vec![made.root.clone()],
        ..demo_profile("demo", &[])
    };
    let gw = TestGateway::start(&db, vec![agent]).await;
    let Some((mut browser, _)) = Browser::launch(Some(&gw.base)).await else {
        return;
    };

    // A conversation made on the repository: a worktree on a branch of its own.
    let (status, conversation) = gw
        .post(
            "/api/v1/conversations",
            json!({"agent": "demo", "title": "Notes", "repository": repo}),
        )
        .await;
    assert_eq!(status, 201, "{conversation}");
    let id = conversation["id"].as_str().unwrap().to_owned();
    let branch = conversation["worktree"]["branch"]
        .as_str()
        .unwrap()
        .to_owned();
    let worktree = PathBuf::from(conversation["worktree"]["path"].as_str().unwrap());
    assert_eq!(conversation["worktree"]["base"], "main");
    let mut ws = gw.conversation_ws(&id, 0).await;

    // The list shows it; the agent's file is counted there live, after its turn.
    browser.goto("/#/conversations").await;
    browser
        .wait_for_text("li.conversation strong", "Notes")
        .await;
    gw.prompt(&id, "save notes.txt hello").await;
    let updated = data_of(&mut ws, "changes_updated").await;
    assert_eq!(updated["totals"]["files"], 1, "{updated}");
    browser
        .wait_text("li.conversation .changes", "1 file · +1 −0")
        .await;
    browser.fits_the_screen().await;
    let shot = browser.screenshot("changes-list.png", false).await;
    eprintln!("list screenshot: {}", shot.display());

    // The conversation links to its changes, counted too.
    browser.goto(&format!("/#/c/{id}")).await;
    browser
        .wait_text("#changes-link + span", "1 file · +1 −0")
        .await;
    browser.click("link", "Changes").await;

    // The Changes page: the branch and its base, the file with its lines.
    browser
        .wait_text("#branch", &format!("Branch {branch} from main"))
        .await;
    browser
        .wait_text("#changes-summary", "1 file · +1 −0 · 1 file not committed")
        .await;
    assert_eq!(
        browser.texts("#changed-files li .path").await,
        ["notes.txt"]
    );
    assert_eq!(browser.texts("#changed-files li .lines").await, ["+1 −0"]);
    browser
        .wait_text(
            "#branch-commits li",
            &format!("No commits yet on {branch}."),
        )
        .await;

    // A tap on the file shows its diff, lines coloured, scrolled within
    // itself: the page stays 375 px wide.
    browser.click("button", "notes.txt added +1 −0").await;
    browser
        .wait_text(".file-diff pre.diff .add:last-child", "+hello\n")
        .await;
    let hunks = browser.texts(".file-diff pre.diff .hunk").await;
    assert_eq!(hunks.len(), 1, "{hunks:?}");
    browser.fits_the_screen().await;
    let shot = browser.screenshot("changes.png", true).await;
    eprintln!("changes screenshot: {}", shot.display());
    browser
        .no_axe_violation("the Changes page with a diff")
        .await;

    // Land while the work is uncommitted: the gateway's refusal, with the file it names.
    browser.click("button", "Land on main").await;
    browser.click("button", "Land").await;
    browser
        .wait_for_text("#change-error", "has uncommitted changes")
        .await;
    assert_eq!(browser.texts("#change-error li").await, ["notes.txt"]);
    browser.click("button", "Cancel").await;

    // Commit: a message asked for, then the commit is on the branch.
    browser.click("button", "Commit").await;
    browser.fill("Commit message", "Add notes").await;
    browser.no_axe_violation("the commit confirmation").await;
    browser.click("button", "Commit").await;
    let committed = data_of(&mut ws, "changes_committed").await;
    assert_eq!(committed["commit"]["summary"], "Add notes", "{committed}");
    browser
        .wait_text("#branch-commits li strong", "Add notes")
        .await;
    browser.wait_for_text("#change-done", "Committed ").await;
    browser
        .wait_text("#changes-summary", "1 file · +1 −0 · 1 commit")
        .await;
    assert_eq!(
        git(&worktree, &["log", "-1", "--format=%s"]).trim(),
        "Add notes"
    );

    // Land, by merge: the repository's own working tree (main checked
    // out) now has the file.
    browser.click("button", "Land on main").await;
    browser
        .wait(&format!(
            "#change-confirm h2:text-is('Land {branch} on main')"
        ))
        .await;
    browser
        .click("radio", "Merge (a merge commit on the base)")
        .await;
    browser.no_axe_violation("the land confirmation").await;
    browser.fits_the_screen().await;
    let shot = browser.screenshot("changes-land.png", false).await;
    eprintln!("land screenshot: {}", shot.display());
    browser.click("button", "Land").await;
    let landed = data_of(&mut ws, "changes_landed").await;
    assert_eq!(landed["strategy"], "merge", "{landed}");
    browser
        .wait_for_text("#change-done", "Landed on main (merge)")
        .await;
    assert_eq!(
        std::fs::read_to_string(repo.join("notes.txt")).unwrap(),
        "hello\n"
    );
    assert_eq!(git(&repo, &["status", "--porcelain"]), "");
    browser.wait_text("#changes-summary", "No changes").await;

    // A new change arrives live, a long line in it: its diff scrolls
    // sideways within itself, the page does not.
    let long = "scratch-".repeat(40);
    gw.prompt(&id, &format!("save draft.txt {long}")).await;
    data_of(&mut ws, "changes_updated").await;
    browser
        .wait_text("#changed-files li .path", "draft.txt")
        .await;
    browser.click("button", "draft.txt added +1 −0").await;
    browser
        .wait_text(".file-diff pre.diff .add:last-child", &format!("+{long}\n"))
        .await;
    browser.fits_the_screen().await;
    let shot = browser.screenshot("changes-long-line.png", false).await;
    eprintln!("long line screenshot: {}", shot.display());

    // Discard asks first, then throws it away.
    browser.click("button", "Discard").await;
    browser
        .wait_for_text(
            "#change-confirm",
            "1 file not committed will be thrown away",
        )
        .await;
    // Cancel keeps it.
    browser.click("button", "Cancel").await;
    browser.wait_hidden("#change-confirm").await;
    assert!(worktree.join("draft.txt").exists());
    browser.click("button", "Discard").await;
    browser.no_axe_violation("the discard confirmation").await;
    browser.click("button", "Discard").await;
    data_of(&mut ws, "changes_discarded").await;
    browser.wait_for_text("#change-done", "Discarded").await;
    browser.wait_text("#changes-summary", "No changes").await;
    assert!(!worktree.join("draft.txt").exists());

    // Nothing left to commit: the gateway says so on the page.
    browser.click("button", "Commit").await;
    browser.fill("Commit message", "Nothing").await;
    browser.click("button", "Commit").await;
    browser
        .wait_for_text("#change-error", "nothing to commit")
        .await;
    browser.fits_the_screen().await;

    // The conversation tells what was done, and counts what is left.
    browser.click("link", "Back to Notes").await;
    browser
        .wait_text("#changes-link + span", "No changes")
        .await;
    for said in [
        "Committed by ",
        "Landed on main (merge) by ",
        "Uncommitted changes discarded by ",
    ] {
        browser.wait_for_text("#timeline p.note", said).await;
    }
    browser.close().await;
}
