//! Conversations on a repository, against git by hand: a repository of
//! 10,000 files (BENCH_WORKTREE_FILES) in 100 folders; the time to create a
//! conversation on it (`POST /api/v1/conversations {"repository"}`, to its
//! 201: the worktree made, the agent started) against `git worktree add -b
//! <branch> <path> main` run by hand on the same repository; and, after 100
//! files changed in the worktree (BENCH_WORKTREE_CHANGED: half modified,
//! half new), the time to list its changes (`GET …/changes`) against `git
//! diff --stat main` run by hand in that worktree. Each the median of
//! BENCH_WORKTREE_RUNS (5) runs, alternating; prints both and the ratio.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use acp_gateway::config::AgentProfile;
use serde_json::json;

use crate::common::*;
use crate::load::{quantile, sorted};

fn git(dir: &Path, args: &[&str]) {
    let out = Command::new("git")
        .args(["-c", "safe.directory=*"])
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .output()
        .expect("git runs");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn timed(f: impl FnOnce()) -> f64 {
    let started = Instant::now();
    f();
    started.elapsed().as_secs_f64() * 1000.0
}

/// Changes `n` files of the worktree at `wt`: half modified, half new.
fn change(wt: &Path, n: usize) {
    for i in 0..n {
        let path = match i % 2 {
            0 => wt.join(format!("d{}/f{}.txt", i % 100, i)),
            _ => wt.join(format!("new/n{i}.txt")),
        };
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, format!("changed {i}\nline two\n")).unwrap();
    }
}

pub async fn run(backend: &str, db: &TestDb) {
    let files = env_or("BENCH_WORKTREE_FILES", 10_000);
    if files == 0 {
        return;
    }
    let changed = env_or("BENCH_WORKTREE_CHANGED", 100);
    let runs = env_or("BENCH_WORKTREE_RUNS", 5);
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    let repo = root.join("repo");
    for i in 0..files {
        let path = repo.join(format!("d{}/f{}.txt", i % 100, i));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, format!("file {i}\nline two\n")).unwrap();
    }
    git(&repo, &["init", "-q", "-b", "main"]);
    git(&repo, &["add", "-A"]);
    git(
        &repo,
        &[
            "-c",
            "user.name=b",
            "-c",
            "user.email=b@b",
            "commit",
            "-q",
            "-m",
            "files",
        ],
    );
    let profile = AgentProfile {
        allowed_roots: vec![root.clone()],
        ..demo_profile("demo", &[])
    };
    let extra = "rate_limits = { prompts_per_minute = 1000000, connections_per_minute = 1000000, \
        conversations_per_minute = 1000000 }";
    let gw = GatewayProcess::start_configured(db, &[profile], "info,sqlx=warn", extra);
    let by_hand = root.join("by-hand");
    std::fs::create_dir_all(&by_hand).unwrap();
    let (mut ours_create, mut git_create, mut ours_list, mut git_list) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for run in 0..=runs {
        // By hand: a worktree, 100 files changed, git diff --stat.
        let wt = by_hand.join(format!("wt{run}"));
        let add = timed(|| {
            git(
                &repo,
                &[
                    "worktree",
                    "add",
                    "-q",
                    "-b",
                    &format!("hand/{run}"),
                    wt.to_str().unwrap(),
                    "main",
                ],
            )
        });
        change(&wt, changed);
        let stat = timed(|| git(&wt, &["diff", "--stat", "main"]));
        // The gateway: a conversation on the repository, the same changes,
        // its changes listed.
        let sent = Instant::now();
        let (status, body) = gw
            .post(
                "/api/v1/conversations",
                json!({"agent": "demo", "repository": repo}),
            )
            .await;
        let create = sent.elapsed().as_secs_f64() * 1000.0;
        assert_eq!(status, 201, "{body}");
        let id = body["id"].as_str().unwrap().to_owned();
        change(Path::new(body["cwd"].as_str().unwrap()), changed);
        let sent = Instant::now();
        let (status, listed) = gw.get(&format!("/api/v1/conversations/{id}/changes")).await;
        let list = sent.elapsed().as_secs_f64() * 1000.0;
        assert_eq!(status, 200, "{listed}");
        assert_eq!(
            listed["totals"]["files"], changed as u64,
            "{}",
            listed["totals"]
        );
        // The first run warms what later ones share.
        if run > 0 {
            git_create.push(add);
            git_list.push(stat);
            ours_create.push(create);
            ours_list.push(list);
        }
        let (status, _) = gw
            .delete(&format!("/api/v1/conversations/{id}?discard_branch=true"))
            .await;
        assert_eq!(status, 204);
        git(
            &repo,
            &["worktree", "remove", "--force", wt.to_str().unwrap()],
        );
    }
    gw.stop();
    let median = |v: Vec<f64>| quantile(&sorted(v), 0.5);
    let (oc, gc, ol, gl) = (
        median(ours_create),
        median(git_create),
        median(ours_list),
        median(git_list),
    );
    println!(
        "[{backend}] worktrees ({files} files, {changed} changed, median of {runs}): create a conversation \
         on the repository {oc:.1} ms vs git worktree add {gc:.1} ms ({:.2}x); list its changes {ol:.1} ms \
         vs git diff --stat {gl:.1} ms ({:.2}x)",
        oc / gc,
        ol / gl
    );
}
