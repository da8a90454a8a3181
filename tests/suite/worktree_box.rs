//! An agent on a repository, boxed: the agent built on the npm ACP SDK
//! edits files in its worktree through `fs/*` and with its own IO, and
//! commits from it with git itself; it reaches neither another
//! conversation's worktree nor the repository's own working tree.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde_json::json;

use super::sandbox::{agents_user, allowed, calls, denied, probe};
use super::worktrees::Repo;
use crate::common::*;
use acp_gateway::config::AgentProfile;
use acp_gateway::sandbox::SandboxMode;

/// Makes `path` and all beneath it the agents' user's (where the tests run
/// as root), and the folders above it traversable.
fn give_to_agents(root: &Path) {
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o755)).unwrap();
    if let Some(user) = agents_user() {
        let user = acp_gateway::sys::lookup_user(&user).unwrap();
        let status = std::process::Command::new("chown")
            .args(["-R", &format!("{}:{}", user.uid, user.gid)])
            .arg(root)
            .status()
            .unwrap();
        assert!(status.success());
    }
}

async fn a_boxed_sdk_agent_edits_and_commits_in_its_worktree_and_reaches_no_other(db: TestDb) {
    if acp_gateway::sandbox::landlock::kernel_abi().is_none() {
        eprintln!("skipping: this kernel has no Landlock");
        return;
    }
    let repo = Repo::new();
    give_to_agents(&repo.root);
    std::fs::set_permissions(db.state_dir(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let profile = AgentProfile {
        allowed_roots: vec![repo.root.clone()],
        user: agents_user(),
        client_fs: true,
        sandbox: SandboxMode::Required,
        ..node_sdk_profile("sdk")
    };
    let gw = TestGateway::start(&db, vec![profile]).await;
    let create = || async {
        let (status, c) = gw
            .post("/api/v1/conversations", json!({"agent": "sdk", "repository": repo.path}))
            .await;
        assert_eq!(status, 201, "{c}");
        (c["id"].as_str().unwrap().to_owned(), PathBuf::from(c["cwd"].as_str().unwrap()))
    };
    let (one, wt_one) = create().await;
    let (_two, wt_two) = create().await;

    // Through the gateway, then itself, then git.
    let answers = calls(
        &gw,
        &one,
        json!([["fs/write_text_file", {"path": wt_one.join("via-fs.txt"), "content": "fs\n"}]]),
    )
    .await;
    assert!(answers[0]["error"].is_null(), "{answers:?}");
    let git = |args: &[&str]| {
        let mut step = vec![json!("run"), json!("git"), json!("-C"), json!(wt_one)];
        step.extend(["-c", "user.name=Agent", "-c", "user.email=agent@example.com"].map(|a| json!(a)));
        step.extend(args.iter().map(|a| json!(a)));
        json!(step)
    };
    let found = probe(
        &gw,
        &one,
        json!([
            ["write", wt_one.join("own.txt"), "own\n"],
            git(&["add", "-A"]),
            git(&["commit", "-q", "-m", "The agent's own commit"]),
        ]),
    )
    .await;
    found.iter().for_each(allowed);

    // Not another worktree, nor the repository's working tree.
    let found = probe(
        &gw,
        &one,
        json!([
            ["write", wt_two.join("x.txt"), "x"],
            ["read", wt_two.join("README.md")],
            ["write", repo.path.join("README.md"), "x"],
            ["read", repo.path.join("src/lib.rs")],
        ]),
    )
    .await;
    found.iter().for_each(denied);

    let (status, changes) = gw
        .get(&format!("/api/v1/conversations/{one}/changes"))
        .await;
    assert_eq!(status, 200, "{changes}");
    assert_eq!(changes["commits"][0]["summary"], "The agent's own commit", "{changes}");
    assert_eq!(changes["uncommitted"], 0, "{changes}");
    let paths: Vec<&str> = changes["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["own.txt", "via-fs.txt"]);
    // The other worktree is as it was made.
    assert!(!wt_two.join("x.txt").exists());
    let (status, land) = gw
        .post(&format!("/api/v1/conversations/{one}/changes/land"), json!({"strategy": "rebase"}))
        .await;
    assert_eq!(status, 200, "{land}");
    assert!(repo.path.join("own.txt").exists() && repo.path.join("via-fs.txt").exists());
}

backend_tests!(a_boxed_sdk_agent_edits_and_commits_in_its_worktree_and_reaches_no_other);
