//! Conversations made on a git repository: each works in a worktree of its
//! own on a branch of its own; what it changed is listed and diffed, and a
//! person commits, lands (merge, squash, rebase) and discards it, each
//! recorded with who did it; nothing is lost when git refuses or fails
//! half-way, and closing keeps the branch.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::common::*;
use acp_gateway::config::AgentProfile;

/// A repository made for the test: `main` with two commits' files
/// (`README.md`, `src/lib.rs`), checked out in its own working tree, beneath
/// a folder that is the profile's allowed root.
pub struct Repo {
    _dir: tempfile::TempDir,
    /// The allowed root (resolved).
    pub root: PathBuf,
    /// The repository's top directory, `main` checked out.
    pub path: PathBuf,
}

/// Runs git in `dir`; its output (asserting success).
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new("git")
        .args(["-c", "safe.directory=*"])
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .output()
        .expect("git runs");
    assert!(
        out.status.success(),
        "git {args:?} in {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

impl Repo {
    pub fn new() -> Repo {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let path = root.join("app");
        std::fs::create_dir_all(path.join("src")).unwrap();
        git(&path, &["init", "-q", "-b", "main"]);
        git(&path, &["config", "user.name", "Repo Owner"]);
        git(&path, &["config", "user.email", "owner@example.com"]);
        std::fs::write(path.join("README.md"), "# app\n").unwrap();
        git(&path, &["add", "-A"]);
        git(&path, &["commit", "-q", "-m", "first"]);
        std::fs::write(path.join("src/lib.rs"), "pub fn one() {}\n").unwrap();
        git(&path, &["add", "-A"]);
        git(&path, &["commit", "-q", "-m", "second"]);
        Repo {
            _dir: dir,
            root,
            path,
        }
    }

    pub fn git(&self, args: &[&str]) -> String {
        git(&self.path, args)
    }

    /// Every ref and what it points to, the index and the working tree's
    /// state: what "nothing changed" compares.
    pub fn snapshot(&self, worktree: Option<&Path>) -> String {
        let mut shot = self.git(&["for-each-ref", "--format=%(refname) %(objectname)"]);
        shot += &format!("\nmain tree: {}", self.git(&["status", "--porcelain"]));
        shot += &format!(
            "\nmain index: {}",
            self.git(&["diff", "--cached", "--name-only"])
        );
        if let Some(wt) = worktree {
            shot += &format!("\nworktree head: {}", git(wt, &["rev-parse", "HEAD"]));
            shot += &format!("\nworktree: {}", git(wt, &["status", "--porcelain"]));
            shot += &format!(
                "\nworktree index: {}",
                git(wt, &["diff", "--cached", "--name-only"])
            );
        }
        shot
    }
}

/// The demo agent, with files through the gateway, allowed in `root`.
pub fn demo_on(root: &Path) -> AgentProfile {
    AgentProfile {
        allowed_roots: vec![root.to_path_buf()],
        client_fs: true,
        ..demo_profile("demo", &[])
    }
}

fn changes_of(id: &str) -> String {
    format!("/api/v1/conversations/{id}/changes")
}

/// A conversation on `repo` (asserting 201), a WebSocket on it from the
/// start, and the conversation.
pub async fn on_repo(gw: &Client, repo: &Repo, extra: Value) -> (String, Ws, Value) {
    let mut body = json!({"agent": "demo", "repository": repo.path});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    let (status, conversation) = gw.post("/api/v1/conversations", body).await;
    assert_eq!(status, 201, "{conversation}");
    let id = conversation["id"].as_str().unwrap().to_owned();
    let ws = gw.conversation_ws(&id, 0).await;
    (id, ws, conversation)
}

/// Prompts `text` and waits for the turn's `changes_updated`: its data.
pub async fn turn_changes(gw: &Client, ws: &mut Ws, id: &str, text: &str) -> Value {
    gw.prompt(id, text).await;
    let frames = ws.until_type("changes_updated").await;
    let ended = frames.iter().find(|e| e["type"] == "turn_ended");
    assert!(
        ended.is_some(),
        "changes_updated comes after the turn's end"
    );
    let said = streamed_text(&frames, "agent_message_chunk");
    assert!(!said.contains("could not"), "{said}");
    frames.last().unwrap()["data"].clone()
}

fn file<'a>(changes: &'a Value, path: &str) -> &'a Value {
    changes["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == path)
        .unwrap_or_else(|| panic!("{path} in {changes}"))
}

async fn a_conversation_on_a_repository_works_in_its_own_worktree_and_shows_what_changed(
    db: TestDb,
) {
    let repo = Repo::new();
    let gw = TestGateway::start(&db, vec![demo_on(&repo.root)]).await;
    let (id, mut ws, conversation) = on_repo(&gw, &repo, json!({})).await;
    let worktree = &conversation["worktree"];
    let path = PathBuf::from(worktree["path"].as_str().unwrap());
    assert_eq!(worktree["base"], "main", "{conversation}");
    assert_eq!(worktree["repository"], json!(repo.path));
    assert_eq!(conversation["cwd"], worktree["path"]);
    let state = std::fs::canonicalize(db.state_dir()).unwrap();
    assert_eq!(path, state.join("worktrees").join(&id));
    let branch = worktree["branch"].as_str().unwrap();
    assert_eq!(branch, format!("acp/{}", &id.replace('-', "")[24..]));
    assert_eq!(
        repo.git(&["rev-parse", &format!("refs/heads/{branch}")]),
        repo.git(&["rev-parse", "main"])
    );

    // The agent writes with its own IO, then through fs/write_text_file.
    let updated = turn_changes(&gw, &mut ws, &id, "save notes.txt hello").await;
    assert_eq!(updated["totals"]["files"], 1, "{updated}");
    assert_eq!(updated["totals"]["added"], 1);
    assert_eq!(updated["files"][0]["path"], "notes.txt");
    let updated = turn_changes(&gw, &mut ws, &id, "fs-save src/lib.rs pub fn two() {}").await;
    assert_eq!(updated["totals"]["files"], 2, "{updated}");

    let (status, changes) = gw.get(&changes_of(&id)).await;
    assert_eq!(status, 200, "{changes}");
    assert_eq!(changes["branch"], branch);
    assert_eq!(changes["uncommitted"], 2, "{changes}");
    assert_eq!(changes["commits"], json!([]));
    let notes = file(&changes, "notes.txt");
    assert_eq!(
        (notes["status"].as_str(), notes["added"].as_u64()),
        (Some("added"), Some(1))
    );
    let lib = file(&changes, "src/lib.rs");
    assert_eq!(lib["status"], "modified");
    assert_eq!(
        (lib["added"].as_u64(), lib["removed"].as_u64()),
        (Some(1), Some(1))
    );
    // The conversation (and the list) say how much.
    let shown = gw.conversation(&id).await;
    assert_eq!(shown["changes"]["files"], 2, "{shown}");
    let (_, list) = gw.get("/api/v1/conversations").await;
    assert_eq!(list["items"][0]["changes"]["files"], 2, "{list}");

    let (status, diff) = gw
        .get(&format!("{}/diff?path=notes.txt", changes_of(&id)))
        .await;
    assert_eq!(status, 200, "{diff}");
    assert!(diff["diff"].as_str().unwrap().contains("+hello"), "{diff}");
    assert_eq!(diff["truncated"], false);
    let (_, all) = gw.get(&format!("{}/diff", changes_of(&id))).await;
    let all = all["diff"].as_str().unwrap();
    assert!(
        all.contains("+pub fn two() {}") && all.contains("-pub fn one() {}"),
        "{all}"
    );
    // The repository's own working tree is untouched.
    assert!(!repo.path.join("notes.txt").exists());
    assert_eq!(repo.git(&["status", "--porcelain"]), "");
}

async fn two_conversations_on_one_repository_work_side_by_side(db: TestDb) {
    let repo = Repo::new();
    let gw = TestGateway::start(&db, vec![demo_on(&repo.root)]).await;
    let (one, mut ws_one, c_one) = on_repo(&gw, &repo, json!({})).await;
    let (two, mut ws_two, c_two) = on_repo(&gw, &repo, json!({"branch": "feature/two"})).await;
    assert_eq!(c_two["worktree"]["branch"], "feature/two");
    assert_ne!(c_one["cwd"], c_two["cwd"]);
    // Both at once, on the same file name.
    let (a, b) = tokio::join!(
        turn_changes(&gw, &mut ws_one, &one, "save notes.txt from one"),
        turn_changes(&gw, &mut ws_two, &two, "save notes.txt from two"),
    );
    assert_eq!(
        (a["totals"]["files"].as_u64(), b["totals"]["files"].as_u64()),
        (Some(1), Some(1))
    );
    for (id, says) in [(&one, "+from one"), (&two, "+from two")] {
        let (_, diff) = gw
            .get(&format!("{}/diff?path=notes.txt", changes_of(id)))
            .await;
        let diff = diff["diff"].as_str().unwrap();
        assert!(diff.contains(says), "{id}: {diff}");
    }
    for c in [&c_one, &c_two] {
        let path = PathBuf::from(c["cwd"].as_str().unwrap());
        assert!(std::fs::read_to_string(path.join("notes.txt"))
            .unwrap()
            .starts_with("from "));
    }
}

async fn a_person_commits_lands_and_discards_and_each_is_recorded(db: TestDb) {
    let repo = Repo::new();
    let gw = TestGateway::start(&db, vec![demo_on(&repo.root)]).await;
    let (id, mut ws, conversation) = on_repo(&gw, &repo, json!({})).await;
    let worktree = PathBuf::from(conversation["cwd"].as_str().unwrap());
    turn_changes(&gw, &mut ws, &id, "save notes.txt hello").await;

    let (status, committed) = gw
        .post(
            &format!("{}/commit", changes_of(&id)),
            json!({"message": "Add notes"}),
        )
        .await;
    assert_eq!(status, 200, "{committed}");
    let by = committed["by"].as_str().unwrap().to_owned();
    assert!(by.starts_with("user:"), "{committed}");
    assert_eq!(committed["commit"]["summary"], "Add notes");
    let author = git(&worktree, &["log", "-1", "--format=%an|%cn"]);
    assert_eq!(
        author,
        format!("{}|acp-gateway", by.trim_start_matches("user:"))
    );
    let frames = ws.until_type("changes_committed").await;
    assert_eq!(frames.last().unwrap()["data"]["by"], by.as_str());
    let (status, problem) = gw
        .post(
            &format!("{}/commit", changes_of(&id)),
            json!({"message": "again"}),
        )
        .await;
    assert_problem((status, problem), 409, "nothing to commit");
    let (_, changes) = gw.get(&changes_of(&id)).await;
    assert_eq!(changes["uncommitted"], 0, "{changes}");
    assert_eq!(changes["commits"][0]["summary"], "Add notes");

    // Land with a merge: `main` is checked out, clean, in the repository's
    // own working tree, which shows the result.
    let main_before = repo.git(&["rev-parse", "main"]);
    let (status, landed) = gw
        .post(
            &format!("{}/land", changes_of(&id)),
            json!({"strategy": "merge"}),
        )
        .await;
    assert_eq!(status, 200, "{landed}");
    assert_eq!(landed["from"], main_before.as_str());
    assert_eq!(landed["working_tree"], json!(repo.path));
    assert_eq!(landed["totals"]["files"], 0, "{landed}");
    assert_eq!(
        std::fs::read_to_string(repo.path.join("notes.txt")).unwrap(),
        "hello\n"
    );
    assert_eq!(repo.git(&["rev-list", "--count", "--merges", "main"]), "1");
    assert_eq!(repo.git(&["status", "--porcelain"]), "");
    let frames = ws.until_type("changes_landed").await;
    assert_eq!(frames.last().unwrap()["data"]["strategy"], "merge");
    let (status, problem) = gw
        .post(
            &format!("{}/land", changes_of(&id)),
            json!({"strategy": "merge"}),
        )
        .await;
    assert_problem((status, problem), 409, "nothing to land");

    // Discard: back to the last commit, untracked files gone.
    turn_changes(&gw, &mut ws, &id, "save scratch.txt junk").await;
    std::fs::write(worktree.join("README.md"), "changed\n").unwrap();
    let (status, discarded) = gw
        .post(&format!("{}/discard", changes_of(&id)), json!({}))
        .await;
    assert_eq!(status, 200, "{discarded}");
    assert!(!worktree.join("scratch.txt").exists());
    assert_eq!(
        std::fs::read_to_string(worktree.join("README.md")).unwrap(),
        "# app\n"
    );
    ws.until_type("changes_discarded").await;
    let kinds: Vec<String> = gw
        .events(&id)
        .await
        .iter()
        .map(|e| e["type"].as_str().unwrap().to_owned())
        .filter(|t| t.starts_with("changes_") && t != "changes_updated")
        .collect();
    assert_eq!(
        kinds,
        ["changes_committed", "changes_landed", "changes_discarded"]
    );
}

/// Commits `name` with `text` in the conversation's worktree, through the
/// API.
async fn commit_file(gw: &Client, ws: &mut Ws, id: &str, name: &str, text: &str) {
    turn_changes(gw, ws, id, &format!("save {name} {text}")).await;
    let (status, body) = gw
        .post(
            &format!("{}/commit", changes_of(id)),
            json!({"message": format!("Add {name}")}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
}

async fn squash_rebase_conflicts_and_a_dirty_base_tree_land_or_change_nothing(db: TestDb) {
    let repo = Repo::new();
    let gw = TestGateway::start(&db, vec![demo_on(&repo.root)]).await;

    // Squash: one commit on main with both files.
    let (id, mut ws, _) = on_repo(&gw, &repo, json!({})).await;
    commit_file(&gw, &mut ws, &id, "a.txt", "a").await;
    commit_file(&gw, &mut ws, &id, "b.txt", "b").await;
    let before = repo.git(&["rev-parse", "main"]);
    let (status, landed) = gw
        .post(
            &format!("{}/land", changes_of(&id)),
            json!({"strategy": "squash", "message": "A and B"}),
        )
        .await;
    assert_eq!(status, 200, "{landed}");
    assert_eq!(repo.git(&["rev-parse", "main^"]), before);
    assert_eq!(repo.git(&["log", "-1", "--format=%s", "main"]), "A and B");
    assert!(repo.path.join("a.txt").exists() && repo.path.join("b.txt").exists());
    let (_, changes) = gw.get(&changes_of(&id)).await;
    assert_eq!(
        changes["totals"]["files"], 0,
        "after a squash the branch starts again: {changes}"
    );

    // Rebase: main moved meanwhile; the branch's commits go on top.
    let (id, mut ws, _) = on_repo(&gw, &repo, json!({})).await;
    commit_file(&gw, &mut ws, &id, "c.txt", "c").await;
    std::fs::write(repo.path.join("other.txt"), "other\n").unwrap();
    repo.git(&["add", "-A"]);
    repo.git(&["commit", "-q", "-m", "meanwhile"]);
    let (status, landed) = gw
        .post(
            &format!("{}/land", changes_of(&id)),
            json!({"strategy": "rebase"}),
        )
        .await;
    assert_eq!(status, 200, "{landed}");
    assert_eq!(
        repo.git(&["log", "-2", "--format=%s", "main"]),
        "Add c.txt\nmeanwhile"
    );
    assert_eq!(repo.git(&["rev-list", "--count", "--merges", "main"]), "0");

    // A conflict: 409 naming the file, nothing changed.
    let (id, mut ws, c) = on_repo(&gw, &repo, json!({})).await;
    let wt = PathBuf::from(c["cwd"].as_str().unwrap());
    commit_file(&gw, &mut ws, &id, "README.md", "theirs").await;
    std::fs::write(repo.path.join("README.md"), "ours\n").unwrap();
    repo.git(&["commit", "-q", "-am", "ours"]);
    let before = repo.snapshot(Some(&wt));
    for strategy in ["merge", "squash", "rebase"] {
        let (status, problem) = gw
            .post(
                &format!("{}/land", changes_of(&id)),
                json!({"strategy": strategy}),
            )
            .await;
        assert_eq!(
            (status, problem["code"].as_str()),
            (409, Some("conflict")),
            "{problem}"
        );
        assert_eq!(problem["files"], json!(["README.md"]), "{problem}");
        assert_eq!(
            repo.snapshot(Some(&wt)),
            before,
            "{strategy} changed nothing"
        );
    }

    // The base's working tree has uncommitted changes: 409 naming them.
    let (id, mut ws, c) = on_repo(&gw, &repo, json!({})).await;
    let wt = PathBuf::from(c["cwd"].as_str().unwrap());
    commit_file(&gw, &mut ws, &id, "d.txt", "d").await;
    std::fs::write(repo.path.join("src/lib.rs"), "pub fn dirty() {}\n").unwrap();
    let before = repo.snapshot(Some(&wt));
    let (status, problem) = gw
        .post(
            &format!("{}/land", changes_of(&id)),
            json!({"strategy": "merge"}),
        )
        .await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (409, Some("uncommitted_changes")),
        "{problem}"
    );
    assert_eq!(problem["files"], json!(["src/lib.rs"]), "{problem}");
    assert_eq!(repo.snapshot(Some(&wt)), before);
    repo.git(&["checkout", "--", "src/lib.rs"]);

    // A base checked out nowhere: its branch moves.
    repo.git(&["branch", "dev", "main"]);
    let (id, mut ws, _) = on_repo(&gw, &repo, json!({"base": "dev"})).await;
    commit_file(&gw, &mut ws, &id, "e.txt", "e").await;
    let main = repo.git(&["rev-parse", "main"]);
    let (status, landed) = gw
        .post(
            &format!("{}/land", changes_of(&id)),
            json!({"strategy": "merge"}),
        )
        .await;
    assert_eq!(status, 200, "{landed}");
    assert_eq!(landed["working_tree"], Value::Null);
    assert_eq!(
        repo.git(&["rev-parse", "dev"]),
        landed["to"].as_str().unwrap()
    );
    assert_eq!(repo.git(&["rev-parse", "main"]), main);
    assert!(!repo.path.join("e.txt").exists());
}

async fn concurrent_lands_one_wins_the_other_is_409(db: TestDb) {
    let repo = Repo::new();
    let gw = TestGateway::start(&db, vec![demo_on(&repo.root)]).await;
    let (id, mut ws, _) = on_repo(&gw, &repo, json!({})).await;
    commit_file(&gw, &mut ws, &id, "a.txt", "a").await;
    let land = format!("{}/land", changes_of(&id));
    let ((s1, b1), (s2, b2)) = tokio::join!(
        gw.post(&land, json!({"strategy": "merge"})),
        gw.post(&land, json!({"strategy": "merge"})),
    );
    let mut statuses = [s1, s2];
    statuses.sort();
    assert_eq!(statuses, [200, 409], "{b1} {b2}");
    assert_eq!(repo.git(&["rev-list", "--count", "--merges", "main"]), "1");
}

async fn bad_repositories_bases_branches_and_paths_are_refused_clearly(db: TestDb) {
    let repo = Repo::new();
    let elsewhere = tempfile::tempdir().unwrap();
    let plain = repo.root.join("plain");
    std::fs::create_dir_all(&plain).unwrap();
    let gw = TestGateway::start(&db, vec![demo_on(&repo.root)]).await;
    let create = |body: Value| {
        let gw = &gw;
        async move { gw.post("/api/v1/conversations", body).await }
    };
    let (status, problem) = create(json!({"agent": "demo", "repository": plain})).await;
    assert_eq!(status, 422, "{problem}");
    let (status, problem) =
        create(json!({"agent": "demo", "repository": repo.root.join("nope")})).await;
    assert_eq!(status, 422, "{problem}");
    let (status, problem) = create(json!({"agent": "demo", "repository": elsewhere.path()})).await;
    assert_eq!(status, 403, "{problem}");
    let (status, problem) =
        create(json!({"agent": "demo", "repository": repo.path, "base": "no-such-branch"})).await;
    assert_eq!(status, 422, "{problem}");
    repo.git(&["branch", "feature/taken"]);
    let (status, problem) =
        create(json!({"agent": "demo", "repository": repo.path, "branch": "feature/taken"})).await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (409, Some("branch_exists")),
        "{problem}"
    );
    for branch in ["top-level", "bad..name", "acp/x y", ""] {
        let (status, problem) =
            create(json!({"agent": "demo", "repository": repo.path, "branch": branch})).await;
        assert_eq!(status, 422, "{branch}: {problem}");
    }
    let (status, problem) =
        create(json!({"agent": "demo", "repository": repo.path, "cwd": repo.path})).await;
    assert_eq!(status, 422, "{problem}");
    let (status, problem) = create(json!({"agent": "demo", "base": "main"})).await;
    assert_eq!(status, 422, "{problem}");
    // Worktree metadata git cannot write: 502 naming the repository.
    let worktrees = repo.path.join(".git/worktrees");
    std::fs::write(&worktrees, "not a folder").unwrap();
    let (status, problem) = create(json!({"agent": "demo", "repository": repo.path})).await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (502, Some("repository_failed")),
        "{problem}"
    );
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains(repo.path.to_str().unwrap()),
        "{problem}"
    );
    std::fs::remove_file(&worktrees).unwrap();
    // Nothing was left behind by the refusals.
    let (_, list) = gw.get("/api/v1/conversations").await;
    assert_eq!(list["items"], json!([]), "{list}");
    assert_eq!(repo.git(&["branch", "--list", "acp/*"]), "");

    // The diff's path stays in the worktree.
    let (id, _ws, _) = on_repo(&gw, &repo, json!({})).await;
    for path in ["../x", "/etc/passwd", "src/../../x", "a/.."] {
        let (status, problem) = gw
            .get(&format!(
                "{}/diff?path={}",
                changes_of(&id),
                urlencode(path)
            ))
            .await;
        assert_eq!(
            (status, problem["code"].as_str()),
            (400, Some("invalid_path")),
            "{path}: {problem}"
        );
    }
    // Paths the document calls fine are fine, whether or not there is such a file.
    for path in [
        "README.md",
        "./README.md",
        "src//lib.rs",
        "..hidden",
        "a/.../b",
    ] {
        let (status, body) = gw
            .get(&format!(
                "{}/diff?path={}",
                changes_of(&id),
                urlencode(path)
            ))
            .await;
        assert_eq!(status, 200, "{path}: {body}");
    }
    // A conversation without a worktree has no changes.
    let (status, plain) = gw
        .post(
            "/api/v1/conversations",
            json!({"agent": "demo", "cwd": repo.root}),
        )
        .await;
    assert_eq!(status, 201, "{plain}");
    let plain_conversation = plain["id"].as_str().unwrap();
    let (status, problem) = gw.get(&changes_of(plain_conversation)).await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (409, Some("no_worktree")),
        "{problem}"
    );
    // A worktree this node cannot reach: 502 saying so.
    let (id, _ws, c) = on_repo(&gw, &repo, json!({})).await;
    let wt = PathBuf::from(c["cwd"].as_str().unwrap());
    std::fs::rename(&wt, wt.with_extension("moved")).unwrap();
    let (status, problem) = gw.get(&changes_of(&id)).await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (502, Some("repository_failed")),
        "{problem}"
    );
    assert!(
        problem["detail"].as_str().unwrap().contains("reach"),
        "{problem}"
    );
    std::fs::rename(wt.with_extension("moved"), &wt).unwrap();
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

async fn commit_land_and_discard_wait_for_the_turn_and_a_protected_base_is_the_operators(
    db: TestDb,
) {
    let repo = Repo::new();
    let operator = cli_token(&db, "root-op", "operator");
    let profile = AgentProfile {
        protected_bases: vec!["main".into()],
        ..demo_on(&repo.root)
    };
    let gw = TestGateway::start(&db, vec![profile]).await;
    let (alice, _) = gw.make_token(&operator, "alice", "user").await;
    let alice = gw.with_token(&alice);
    let (id, mut ws, _) = on_repo(&alice, &repo, json!({})).await;
    commit_file(&alice, &mut ws, &id, "a.txt", "a").await;
    // While a turn runs: 409, nothing changed.
    let op = gw.with_token(&operator);
    alice.prompt(&id, "hang").await;
    ws.until_type("turn_started").await;
    for (what, body) in [
        ("commit", json!({"message": "m"})),
        ("land", json!({"strategy": "merge"})),
        ("discard", json!({})),
    ] {
        let (status, problem) = op.post(&format!("{}/{what}", changes_of(&id)), body).await;
        assert_eq!(
            (status, problem["code"].as_str()),
            (409, Some("turn_in_progress")),
            "{what}: {problem}"
        );
    }
    alice.cancel_turn(&mut ws, &id).await;
    // `main` is protected: alice may not land there; an operator may.
    let (status, problem) = alice
        .post(
            &format!("{}/land", changes_of(&id)),
            json!({"strategy": "merge"}),
        )
        .await;
    assert_eq!(status, 403, "{problem}");
    assert!(!repo.path.join("a.txt").exists());
    let (status, landed) = op
        .post(
            &format!("{}/land", changes_of(&id)),
            json!({"strategy": "merge"}),
        )
        .await;
    assert_eq!(status, 200, "{landed}");
    assert_eq!(landed["by"], "user:root-op");
    assert!(repo.path.join("a.txt").exists());
}

async fn closing_removes_the_worktree_keeps_the_branch_and_its_work_unless_discarded(db: TestDb) {
    let repo = Repo::new();
    let gw = TestGateway::start(&db, vec![demo_on(&repo.root)]).await;
    let (id, mut ws, c) = on_repo(&gw, &repo, json!({})).await;
    let wt = PathBuf::from(c["cwd"].as_str().unwrap());
    let branch = c["worktree"]["branch"].as_str().unwrap().to_owned();
    turn_changes(&gw, &mut ws, &id, "save notes.txt kept").await;
    let (status, _) = gw.delete(&format!("/api/v1/conversations/{id}")).await;
    assert_eq!(status, 204);
    assert!(!wt.exists(), "the worktree is removed");
    assert_eq!(
        repo.git(&["worktree", "list", "--porcelain"])
            .matches("worktree ")
            .count(),
        1
    );
    // The uncommitted file is kept, committed on the branch.
    assert_eq!(repo.git(&["show", &format!("{branch}:notes.txt")]), "kept");
    let (status, changes) = gw.get(&changes_of(&id)).await;
    assert_eq!(status, 200, "{changes}");
    assert_eq!(file(&changes, "notes.txt")["status"], "added");
    let (status, problem) = gw
        .post(
            &format!("{}/commit", changes_of(&id)),
            json!({"message": "m"}),
        )
        .await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (409, Some("conversation_closed")),
        "{problem}"
    );
    // Closed, its branch still lands.
    let (status, landed) = gw
        .post(
            &format!("{}/land", changes_of(&id)),
            json!({"strategy": "merge"}),
        )
        .await;
    assert_eq!(status, 200, "{landed}");
    assert!(repo.path.join("notes.txt").exists());

    let (id, mut ws, c) = on_repo(&gw, &repo, json!({})).await;
    let branch = c["worktree"]["branch"].as_str().unwrap().to_owned();
    turn_changes(&gw, &mut ws, &id, "save junk.txt junk").await;
    let (status, _) = gw
        .delete(&format!("/api/v1/conversations/{id}?discard_branch=true"))
        .await;
    assert_eq!(status, 204);
    assert_eq!(repo.git(&["branch", "--list", &branch]), "");
    for (method, path) in [
        ("GET", changes_of(&id)),
        ("GET", format!("{}/diff", changes_of(&id))),
    ] {
        let (status, problem) = gw.call(method, &path, None).await;
        assert_eq!(
            (status, problem["code"].as_str()),
            (409, Some("branch_gone")),
            "{problem}"
        );
    }
    let (status, problem) = gw
        .post(
            &format!("{}/land", changes_of(&id)),
            json!({"strategy": "merge"}),
        )
        .await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (409, Some("branch_gone")),
        "{problem}"
    );
}

async fn worktrees_survive_a_restart_and_the_agent_goes_on_in_its_own(db: TestDb) {
    let repo = Repo::new();
    let gw = TestGateway::start(&db, vec![demo_on(&repo.root)]).await;
    let (id, mut ws, c) = on_repo(&gw, &repo, json!({})).await;
    turn_changes(&gw, &mut ws, &id, "save one.txt one").await;
    drop(ws);
    let gw = gw.restart().await;
    let wt = PathBuf::from(c["cwd"].as_str().unwrap());
    assert!(wt.join("one.txt").exists());
    let after = gw.conversation(&id).await["last_seq"].as_i64().unwrap();
    let mut ws = gw.conversation_ws(&id, after).await;
    let updated = turn_changes(&gw, &mut ws, &id, "save two.txt two").await;
    assert_eq!(updated["totals"]["files"], 2, "{updated}");
    let (_, changes) = gw.get(&changes_of(&id)).await;
    assert_eq!(changes["uncommitted"], 2, "{changes}");
}

/// A git that fails the subcommand named in `fail` (a file beside it) and
/// runs the real one otherwise.
fn failing_git(dir: &Path) -> (PathBuf, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let real = String::from_utf8(
        std::process::Command::new("sh")
            .args(["-c", "command -v git"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let fail = dir.join("fail");
    let script = dir.join("git");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nfail=$(cat {fail} 2>/dev/null)\nskip=\nfor a in \"$@\"; do\n  if [ -n \"$skip\" ]; then skip=; continue; fi\n  case \"$a\" in -c|-C) skip=1; continue;; -*) continue;; esac\n  if [ \"$a\" = \"$fail\" ]; then echo \"failing $a on purpose\" >&2; exit 1; fi\n  break\ndone\nexec {} \"$@\"\n",
            real.trim(),
            fail = fail.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    (script, fail)
}

async fn git_failing_half_way_through_a_commit_or_a_land_changes_nothing(db: TestDb) {
    let repo = Repo::new();
    let tools = tempfile::tempdir().unwrap();
    let (script, fail) = failing_git(tools.path());
    let mut config = Config::for_tests(&db, vec![demo_on(&repo.root)]);
    config.git = Some(script);
    let gw = TestGateway::start_with(config).await;
    let (id, mut ws, c) = on_repo(&gw, &repo, json!({})).await;
    let wt = PathBuf::from(c["cwd"].as_str().unwrap());
    turn_changes(&gw, &mut ws, &id, "save notes.txt hello").await;
    for step in ["commit-tree", "update-ref"] {
        std::fs::write(&fail, step).unwrap();
        let before = repo.snapshot(Some(&wt));
        let (status, problem) = gw
            .post(
                &format!("{}/commit", changes_of(&id)),
                json!({"message": "m"}),
            )
            .await;
        assert_eq!(
            (status, problem["code"].as_str()),
            (502, Some("repository_failed")),
            "{step}: {problem}"
        );
        assert_eq!(repo.snapshot(Some(&wt)), before, "{step}");
    }
    std::fs::write(&fail, "").unwrap();
    let (status, body) = gw
        .post(
            &format!("{}/commit", changes_of(&id)),
            json!({"message": "m"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    for (step, strategy) in [
        ("merge", "merge"),
        ("merge-tree", "merge"),
        ("commit-tree", "squash"),
    ] {
        std::fs::write(&fail, step).unwrap();
        let before = repo.snapshot(Some(&wt));
        let (status, problem) = gw
            .post(
                &format!("{}/land", changes_of(&id)),
                json!({"strategy": strategy}),
            )
            .await;
        assert_eq!(status, 502, "{step}/{strategy}: {problem}");
        assert_eq!(repo.snapshot(Some(&wt)), before, "{step}/{strategy}");
    }
    // Advance main so that rebase must replay, and fail the final move.
    std::fs::write(repo.path.join("other.txt"), "o\n").unwrap();
    repo.git(&["add", "-A"]);
    repo.git(&["commit", "-q", "-m", "meanwhile"]);
    for step in ["merge-tree", "commit-tree", "merge"] {
        std::fs::write(&fail, step).unwrap();
        let before = repo.snapshot(Some(&wt));
        let (status, problem) = gw
            .post(
                &format!("{}/land", changes_of(&id)),
                json!({"strategy": "rebase"}),
            )
            .await;
        assert_eq!(status, 502, "{step}/rebase: {problem}");
        assert_eq!(repo.snapshot(Some(&wt)), before, "{step}/rebase");
    }
    // Then it lands.
    std::fs::write(&fail, "").unwrap();
    let (status, landed) = gw
        .post(
            &format!("{}/land", changes_of(&id)),
            json!({"strategy": "rebase"}),
        )
        .await;
    assert_eq!(status, 200, "{landed}");
}

backend_tests!(
    a_conversation_on_a_repository_works_in_its_own_worktree_and_shows_what_changed,
    two_conversations_on_one_repository_work_side_by_side,
    a_person_commits_lands_and_discards_and_each_is_recorded,
    squash_rebase_conflicts_and_a_dirty_base_tree_land_or_change_nothing,
    concurrent_lands_one_wins_the_other_is_409,
    bad_repositories_bases_branches_and_paths_are_refused_clearly,
    commit_land_and_discard_wait_for_the_turn_and_a_protected_base_is_the_operators,
    closing_removes_the_worktree_keeps_the_branch_and_its_work_unless_discarded,
    worktrees_survive_a_restart_and_the_agent_goes_on_in_its_own,
    git_failing_half_way_through_a_commit_or_a_land_changes_nothing,
);
