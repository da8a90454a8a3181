//! Committing, landing, discarding.

use std::path::Path;

use super::*;

#[tokio::test]
async fn a_commit_takes_everything_and_then_there_is_nothing_to_commit() {
    let place = Place::new();
    let wt = busy_worktree(&place).await;
    let dir = Path::new(&wt.path);
    let parent = run(dir, &["rev-parse", "HEAD"]);
    let commit = git()
        .commit(&wt, "Keep it all\n\nwith a body", &person(), &gateway())
        .await
        .unwrap();
    assert_eq!(commit.summary, "Keep it all");
    assert_eq!(commit.author, "Ada Person");
    assert_eq!(run(dir, &["rev-parse", "HEAD"]), commit.id);
    assert_eq!(run(dir, &["rev-parse", "HEAD^"]), parent);
    assert_eq!(
        run(dir, &["log", "-1", "--format=%an|%ae|%cn|%ce|%B"]),
        "Ada Person|ada@example.com|ACP Gateway|gateway@example.com|Keep it all\n\nwith a body"
    );
    // The index and the tree agree with the commit; the ignored file stays.
    assert_eq!(
        run(dir, &["status", "--porcelain", "--untracked-files=all"]),
        ""
    );
    assert!(dir.join("debug.log").exists());
    assert_eq!(
        run(dir, &["reflog", "-1", "--format=%gs", "acp/work"]),
        "commit: Keep it all"
    );
    let e = git()
        .commit(&wt, "again", &person(), &gateway())
        .await
        .unwrap_err();
    assert_eq!(e, GitError::NothingToCommit);
    assert!(std::fs::read_dir(&wt.git_dir).unwrap().all(|f| !f
        .unwrap()
        .file_name()
        .to_string_lossy()
        .starts_with("acp-index")));
}

#[tokio::test]
async fn a_commit_failing_midway_changes_nothing() {
    let place = Place::new();
    let wt = busy_worktree(&place).await;
    let dir = Path::new(&wt.path);
    run(dir, &["add", "new/new.txt"]);
    let (failing, control) = failing_git(&place);
    for step in ["commit-tree", "update-ref", "write-tree"] {
        std::fs::write(&control, step).unwrap();
        let before = place.state(&[dir]);
        let e = failing
            .commit(&wt, "no", &person(), &gateway())
            .await
            .unwrap_err();
        assert!(
            e.to_string().contains(&format!("{step} fails on purpose")),
            "{e}"
        );
        assert_eq!(place.state(&[dir]), before, "{step}");
    }
}

/// Lands `wt` (by the person, committed by the gateway) where it must be
/// refused: the error.
async fn refused(git: &Git, wt: &Worktree, source: Source, strategy: LandStrategy) -> GitError {
    git.land(wt, source, strategy, None, &person(), &gateway())
        .await
        .unwrap_err()
}

/// The repository with `main` checked out in its own tree, and a worktree
/// on `acp/work` with one commit (x.txt) that main lacks; main has a
/// commit of its own (y.txt) when `main_moves`.
pub(super) async fn landable(place: &Place, main_moves: bool) -> Worktree {
    let wt = place.worktree("main", "acp/work").await;
    let dir = Path::new(&wt.path);
    write(dir, "x.txt", "x\n");
    run(dir, &["add", "x.txt"]);
    run(
        dir,
        &[
            "-c",
            "user.name=Agent",
            "-c",
            "user.email=agent@x",
            "commit",
            "-qm",
            "add x",
        ],
    );
    write(dir, "a.txt", &(lines(10, "a") + "agent\n"));
    run(
        dir,
        &[
            "-c",
            "user.name=Agent",
            "-c",
            "user.email=agent@x",
            "commit",
            "-qam",
            "change a",
        ],
    );
    if main_moves {
        write(&place.repo, "y.txt", "y\n");
        run(&place.repo, &["add", "y.txt"]);
        run(&place.repo, &["commit", "-qm", "add y"]);
    }
    wt
}

#[tokio::test]
async fn a_merge_lands_in_the_tree_where_the_base_is_checked_out() {
    let place = Place::new();
    let wt = landable(&place, true).await;
    let main_before = run(&place.repo, &["rev-parse", "main"]);
    let head = run(&place.repo, &["rev-parse", "acp/work"]);
    let landed = git()
        .land(
            &wt,
            Source::Worktree,
            LandStrategy::Merge,
            None,
            &person(),
            &gateway(),
        )
        .await
        .unwrap();
    assert_eq!(landed.from, main_before);
    assert_eq!(landed.working_tree.as_deref(), Some(place.repo.as_path()));
    assert_eq!(run(&place.repo, &["rev-parse", "main"]), landed.to);
    assert_eq!(
        run(&place.repo, &["rev-parse", "HEAD^1", "HEAD^2"]),
        format!("{main_before}\n{head}")
    );
    assert_eq!(
        run(&place.repo, &["log", "-1", "--format=%s|%an|%cn"]),
        "Merge branch 'acp/work' into main|Ada Person|ACP Gateway"
    );
    // The person's tree shows it, clean.
    assert_eq!(read(&place.repo, "x.txt"), "x\n");
    assert_eq!(read(&place.repo, "y.txt"), "y\n");
    assert!(read(&place.repo, "a.txt").ends_with("agent\n"));
    assert_eq!(run(&place.repo, &["status", "--porcelain"]), "");
    // The branch stays; nothing more to land.
    assert_eq!(run(&place.repo, &["rev-parse", "acp/work"]), head);
    let changes = git().changes(&wt, Source::Worktree).await.unwrap();
    assert_eq!(changes.totals.commits, 0);
    let e = refused(&git(), &wt, Source::Worktree, LandStrategy::Merge).await;
    assert!(matches!(e, GitError::NothingToLand(_)), "{e:?}");
}

#[tokio::test]
async fn a_squash_lands_on_a_base_checked_out_nowhere_and_the_branch_starts_again() {
    let place = Place::new();
    run(&place.repo, &["branch", "dev"]);
    let wt = place.worktree("dev", "acp/work").await;
    let dir = Path::new(&wt.path);
    for (file, summary) in [("p.txt", "add p"), ("q.txt", "add q")] {
        write(dir, file, "text\n");
        run(dir, &["add", file]);
        run(
            dir,
            &[
                "-c",
                "user.name=Agent",
                "-c",
                "user.email=agent@x",
                "commit",
                "-qm",
                summary,
            ],
        );
    }
    let dev = run(&place.repo, &["rev-parse", "dev"]);
    let landed = git()
        .land(
            &wt,
            Source::Worktree,
            LandStrategy::Squash,
            None,
            &person(),
            &gateway(),
        )
        .await
        .unwrap();
    assert_eq!(landed.working_tree, None);
    assert_eq!(landed.from, dev);
    assert_eq!(run(&place.repo, &["rev-parse", "dev"]), landed.to);
    assert_eq!(run(&place.repo, &["rev-parse", "dev^"]), dev);
    assert_eq!(
        run(&place.repo, &["log", "-1", "--format=%s", "dev"]),
        "acp/work: add p; add q"
    );
    assert_eq!(
        run(&place.repo, &["reflog", "-1", "--format=%gs", "dev"]),
        "land (squash) acp/work"
    );
    assert_eq!(
        run(&place.repo, &["ls-tree", "--name-only", "dev"])
            .lines()
            .count(),
        6
    );
    // The conversation's branch is at the new base, its tree as it was.
    assert_eq!(run(dir, &["rev-parse", "HEAD"]), landed.to);
    assert_eq!(run(dir, &["status", "--porcelain"]), "");
    let changes = git().changes(&wt, Source::Worktree).await.unwrap();
    assert_eq!((changes.totals.files, changes.totals.commits), (0, 0));
    // The repository's own tree (main) is untouched.
    assert_eq!(run(&place.repo, &["status", "--porcelain"]), "");
    assert!(!place.repo.join("p.txt").exists());
}

#[tokio::test]
async fn a_rebase_replays_the_commits_with_their_authors() {
    let place = Place::new();
    let wt = landable(&place, true).await;
    let main_before = run(&place.repo, &["rev-parse", "main"]);
    let landed = git()
        .land(
            &wt,
            Source::Worktree,
            LandStrategy::Rebase,
            Some("ignored"),
            &person(),
            &gateway(),
        )
        .await
        .unwrap();
    assert_eq!(run(&place.repo, &["rev-parse", "main~2"]), main_before);
    assert_eq!(
        run(&place.repo, &["log", "--format=%s|%an|%cn", "-2", "main"]),
        "change a|Agent|ACP Gateway\nadd x|Agent|ACP Gateway"
    );
    assert_eq!(run(&place.repo, &["rev-parse", "main"]), landed.to);
    assert_eq!(read(&place.repo, "x.txt"), "x\n");
    assert_eq!(run(Path::new(&wt.path), &["rev-parse", "HEAD"]), landed.to);

    // A branch ahead of its base: the base fast-forwards to it (Source::Branch).
    let dir = Path::new(&wt.path);
    write(dir, "z.txt", "z\n");
    run(dir, &["add", "z.txt"]);
    run(
        dir,
        &[
            "-c",
            "user.name=Agent",
            "-c",
            "user.email=agent@x",
            "commit",
            "-qm",
            "add z",
        ],
    );
    let head = run(dir, &["rev-parse", "HEAD"]);
    let landed = git()
        .land(
            &wt,
            Source::Branch,
            LandStrategy::Rebase,
            None,
            &person(),
            &gateway(),
        )
        .await
        .unwrap();
    assert_eq!(landed.to, head);
    assert_eq!(run(&place.repo, &["rev-parse", "main"]), head);
}

#[tokio::test]
async fn a_land_is_refused_on_a_dirty_tree_or_a_conflict_and_changes_nothing() {
    let place = Place::new();
    let wt = landable(&place, false).await;
    let dir = Path::new(&wt.path);
    // The person's tree has a change of its own.
    write(&place.repo, "b.txt", "mine\n");
    let before = place.state(&[dir]);
    for strategy in [
        LandStrategy::Merge,
        LandStrategy::Squash,
        LandStrategy::Rebase,
    ] {
        let e = refused(&git(), &wt, Source::Worktree, strategy).await;
        assert_eq!(
            e,
            GitError::Dirty {
                tree: place.repo.to_string_lossy().into_owned(),
                files: vec!["b.txt".into()]
            }
        );
        assert_eq!(place.state(&[dir]), before);
    }
    run(&place.repo, &["checkout", "-q", "b.txt"]);
    // The worktree's own uncommitted work.
    write(dir, "loose.txt", "loose\n");
    let e = refused(&git(), &wt, Source::Worktree, LandStrategy::Merge).await;
    assert!(
        matches!(&e, GitError::Dirty { tree, files } if tree == &wt.path && files == &["loose.txt"]),
        "{e:?}"
    );
    std::fs::remove_file(dir.join("loose.txt")).unwrap();
    // main changes a.txt's last line too: a conflict.
    write(&place.repo, "a.txt", &(lines(10, "a") + "owner\n"));
    run(&place.repo, &["commit", "-qam", "owner's a"]);
    let before = place.state(&[dir]);
    for strategy in [
        LandStrategy::Merge,
        LandStrategy::Squash,
        LandStrategy::Rebase,
    ] {
        let e = refused(&git(), &wt, Source::Worktree, strategy).await;
        assert_eq!(
            e,
            GitError::Conflict {
                files: vec!["a.txt".into()]
            },
            "{strategy:?}"
        );
        assert_eq!(place.state(&[dir]), before);
    }
}

#[tokio::test]
async fn a_land_failing_midway_changes_nothing() {
    let place = Place::new();
    let wt = landable(&place, true).await;
    let dir = Path::new(&wt.path);
    let (failing, control) = failing_git(&place);
    // Checked out in the repository's tree: the fast-forward fails.
    for (step, strategy) in [
        ("merge", LandStrategy::Merge),
        ("commit-tree", LandStrategy::Squash),
        ("commit-tree", LandStrategy::Rebase),
        ("merge-tree", LandStrategy::Merge),
    ] {
        std::fs::write(&control, step).unwrap();
        let before = place.state(&[dir]);
        let e = refused(&failing, &wt, Source::Worktree, strategy).await;
        assert!(
            e.to_string().contains(&format!("{step} fails on purpose")),
            "{e}"
        );
        assert_eq!(place.state(&[dir]), before, "{step}");
    }
    // Checked out nowhere: update-ref fails.
    run(&place.repo, &["checkout", "-q", "--detach"]);
    std::fs::write(&control, "update-ref").unwrap();
    let before = place.state(&[dir]);
    let e = refused(&failing, &wt, Source::Branch, LandStrategy::Squash).await;
    assert!(e.to_string().contains("update-ref fails on purpose"), "{e}");
    assert_eq!(place.state(&[dir]), before);
}

/// The base moves while a land runs (another process commits on it, just
/// before the step named): 409 `base_moved`, and nothing of the land is
/// anywhere: the base keeps what moved it, the branch and trees as they
/// were.
#[tokio::test]
async fn the_base_moving_while_landing_is_base_moved_and_changes_nothing() {
    let place = Place::new();
    let wt = landable(&place, true).await;
    let dir = Path::new(&wt.path);
    let head = run(&place.repo, &["rev-parse", "acp/work"]);
    let (moving, _) = failing_git(&place);
    let commit_in_the_tree = format!(
        "git -C '{}' -c user.name=Other -c user.email=o@x commit -q --allow-empty -m moved",
        place.repo.display()
    );
    // Checked out in the repository's tree: moved before the land looks at
    // the tree (a merge needs merge-tree: main moved), and between that
    // look and the fast-forward.
    for (step, strategy) in [
        ("merge-tree", LandStrategy::Merge),
        ("merge", LandStrategy::Merge),
        ("commit-tree", LandStrategy::Squash),
    ] {
        let main = run(&place.repo, &["rev-parse", "main"]);
        before(&place, step, &commit_in_the_tree);
        let e = refused(&moving, &wt, Source::Worktree, strategy).await;
        assert!(matches!(e, GitError::BaseMoved(_)), "{step}: {e:?}");
        assert!(!place.root.join(format!("before-{step}")).exists());
        assert_eq!(run(&place.repo, &["rev-parse", "main^"]), main, "{step}");
        assert_eq!(
            run(&place.repo, &["log", "-1", "--format=%s", "main"]),
            "moved"
        );
        assert_eq!(run(&place.repo, &["status", "--porcelain"]), "");
        assert_eq!(run(&place.repo, &["rev-parse", "acp/work"]), head);
        assert_eq!(run(dir, &["status", "--porcelain"]), "");
    }

    // Checked out nowhere: the compare-and-swap of the ref refuses.
    run(&place.repo, &["checkout", "-q", "--detach"]);
    let main = run(&place.repo, &["rev-parse", "main"]);
    let elsewhere = run(
        &place.repo,
        &[
            "commit-tree",
            "main^{tree}",
            "-p",
            "main",
            "-m",
            "elsewhere",
        ],
    );
    before(
        &place,
        "commit-tree",
        &format!(
            "git -C '{}' update-ref refs/heads/main {elsewhere} {main}",
            place.repo.display()
        ),
    );
    let state = place.state(&[dir]);
    let e = refused(&moving, &wt, Source::Branch, LandStrategy::Squash).await;
    assert!(matches!(e, GitError::BaseMoved(_)), "{e:?}");
    // All as it was, but for what moved main.
    let expected: Vec<String> = state
        .iter()
        .map(|s| {
            s.replace(
                &format!("refs/heads/main {main}"),
                &format!("refs/heads/main {elsewhere}"),
            )
        })
        .collect();
    assert_eq!(place.state(&[dir]), expected);
}

/// The land went in, but the branch could not start again from the new
/// base: the error says both, the base has the land and the branch is
/// where it was (its work is in the base, nothing is lost).
#[tokio::test]
async fn a_land_whose_branch_cannot_be_moved_says_that_it_landed() {
    let place = Place::new();
    let wt = landable(&place, true).await;
    let dir = Path::new(&wt.path);
    let (failing, control) = failing_git(&place);
    // The worktree's branch (reset) and, landing from the branch, its ref
    // (update-ref: the base is checked out, so the base moves by merge).
    for (step, source) in [("reset", Source::Worktree), ("update-ref", Source::Branch)] {
        let main = run(&place.repo, &["rev-parse", "main"]);
        let head = run(&place.repo, &["rev-parse", "acp/work"]);
        std::fs::write(&control, step).unwrap();
        let e = refused(&failing, &wt, source, LandStrategy::Squash).await;
        let landed = run(&place.repo, &["rev-parse", "main"]);
        assert_ne!(landed, main, "{step}");
        assert_eq!(run(&place.repo, &["rev-parse", "main^"]), main, "{step}");
        let said = e.to_string();
        assert!(
            said.contains(&format!("the branch landed on main (now {landed})"))
                && said.contains("acp/work could not be moved to it")
                && said.contains(&format!("{step} fails on purpose")),
            "{step}: {said}"
        );
        assert_eq!(run(&place.repo, &["rev-parse", "acp/work"]), head, "{step}");
        assert_eq!(run(dir, &["rev-parse", "HEAD"]), head, "{step}");
        assert_eq!(run(&place.repo, &["status", "--porcelain"]), "");
        // The base has the branch's work.
        assert_eq!(run(&place.repo, &["show", "main:x.txt"]), "x", "{step}");
        // Back as it was, for the next.
        std::fs::write(&control, "").unwrap();
        run(&place.repo, &["reset", "-q", "--hard", &main]);
    }
}

#[tokio::test]
async fn a_second_land_on_the_same_repository_at_once_is_busy() {
    let place = Place::new();
    let wt = landable(&place, false).await;
    let git = git();
    let (person, gateway) = (person(), gateway());
    let (one, two) = tokio::join!(
        git.land(
            &wt,
            Source::Worktree,
            LandStrategy::Merge,
            None,
            &person,
            &gateway
        ),
        git.land(
            &wt,
            Source::Worktree,
            LandStrategy::Merge,
            None,
            &person,
            &gateway
        ),
    );
    assert!(one.is_ok(), "{one:?}");
    let e = two.unwrap_err();
    assert!(
        matches!(&e, GitError::Busy(m) if m.contains("another land, commit or discard runs on")),
        "{e:?}"
    );
    // git's own lock held: busy too, nothing changed.
    let other = place.worktree("main", "acp/other").await;
    write(Path::new(&other.path), "loose.txt", "loose\n");
    let lock = Path::new(&other.git_dir).join("HEAD.lock");
    std::fs::write(&lock, "").unwrap();
    let e = git
        .commit(&other, "x", &person, &gateway)
        .await
        .unwrap_err();
    assert!(matches!(e, GitError::Busy(_)), "{e:?}");
    std::fs::remove_file(lock).unwrap();
    let lock = Path::new(&other.git_dir).join("index.lock");
    std::fs::write(&lock, "").unwrap();
    let e = git
        .commit(&other, "x", &person, &gateway)
        .await
        .unwrap_err();
    assert!(matches!(e, GitError::Busy(_)), "{e:?}");
    let e = git.discard(&other).await.unwrap_err();
    assert!(matches!(e, GitError::Busy(_)), "{e:?}");
    std::fs::remove_file(lock).unwrap();
    assert!(Path::new(&other.path).join("loose.txt").exists());
}

#[tokio::test]
async fn discard_returns_the_worktree_to_its_last_commit_keeping_ignored_files() {
    let place = Place::new();
    let wt = busy_worktree(&place).await;
    let dir = Path::new(&wt.path);
    let head = git().discard(&wt).await.unwrap();
    assert_eq!(head, run(dir, &["rev-parse", "HEAD"]));
    assert_eq!(
        run(dir, &["status", "--porcelain", "--untracked-files=all"]),
        ""
    );
    assert!(dir.join("debug.log").exists());
    assert!(!dir.join("new").exists());
    assert_eq!(read(dir, "c.txt"), lines(20, "c"));
}
