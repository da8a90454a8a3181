//! What differs: files, commits, the diff.

use std::path::Path;

use super::*;
use crate::model::FileStatus;

#[tokio::test]
async fn changes_count_committed_uncommitted_and_untracked_files_and_stay_after_removal() {
    let place = Place::new();
    let wt = busy_worktree(&place).await;
    let dir = Path::new(&wt.path);
    let before = place.state(&[dir]);
    let changes = git().changes(&wt, Source::Worktree).await.unwrap();
    assert_eq!(place.state(&[dir]), before, "nothing changed");
    let summary: Vec<_> = changes
        .files
        .iter()
        .map(|f| {
            (
                f.path.as_str(),
                f.old_path.as_deref(),
                f.status,
                f.added,
                f.removed,
                f.binary,
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("a.txt", None, FileStatus::Modified, 1, 0, false),
            ("b.txt", None, FileStatus::Deleted, 0, 10, false),
            ("bin.dat", None, FileStatus::Added, 0, 0, true),
            ("d.txt", Some("c.txt"), FileStatus::Renamed, 0, 0, false),
            ("new/new.txt", None, FileStatus::Added, 2, 0, false),
        ]
    );
    assert_eq!(changes.totals.files, 5);
    assert_eq!(changes.totals.added, 3);
    assert_eq!(changes.totals.removed, 10);
    assert_eq!(changes.totals.commits, 1);
    assert_eq!(changes.uncommitted, 4);
    assert!(!changes.truncated);
    assert_eq!(changes.commits.len(), 1);
    assert_eq!(changes.commits[0].summary, "more a");
    assert_eq!(changes.commits[0].author, "Agent");
    assert_eq!(changes.head, run(dir, &["rev-parse", "HEAD"]));
    assert_eq!(changes.merge_base, run(&place.repo, &["rev-parse", "main"]));
    assert_eq!(changes.branch, "acp/work");

    // Closed: the work is kept as a commit, the changes read from the branch.
    let kept = git().remove_worktree(&wt, false, &gateway()).await.unwrap();
    let kept = kept.expect("a commit of the uncommitted work");
    assert!(!dir.exists());
    assert_eq!(run(&place.repo, &["rev-parse", "acp/work"]), kept);
    assert_eq!(
        run(&place.repo, &["log", "-1", "--format=%an <%ae> %s", &kept]),
        "ACP Gateway <gateway@example.com> Uncommitted work kept when the conversation was closed"
    );
    let after = git().changes(&wt, Source::Branch).await.unwrap();
    assert_eq!(after.files, changes.files);
    assert_eq!(after.totals.commits, 2);
    assert_eq!(after.uncommitted, 0);
    assert_eq!(after.head, kept);
    let e = git().changes(&wt, Source::Worktree).await.unwrap_err();
    assert!(
        e.to_string().contains("is not reachable from this node"),
        "{e}"
    );
    // Removing again does nothing more.
    assert_eq!(
        git().remove_worktree(&wt, false, &gateway()).await.unwrap(),
        None
    );
    assert!(run(&place.repo, &["rev-parse", "acp/work"]) == kept);
}

#[tokio::test]
async fn a_diff_shows_one_file_or_all_cut_at_a_line() {
    let place = Place::new();
    let wt = busy_worktree(&place).await;
    let one = git()
        .diff(&wt, Source::Worktree, Some("new/new.txt"), 100_000)
        .await
        .unwrap();
    assert!(!one.truncated);
    assert!(
        one.text
            .starts_with("diff --git a/new/new.txt b/new/new.txt\n"),
        "{}",
        one.text
    );
    assert!(one.text.ends_with("+one\n+two\n"), "{}", one.text);
    // A tracked file, with untracked ones elsewhere.
    let deleted = git()
        .diff(&wt, Source::Worktree, Some("b.txt"), 100_000)
        .await
        .unwrap();
    assert!(
        deleted.text.contains("deleted file mode"),
        "{}",
        deleted.text
    );
    assert!(deleted.text.contains("-b 9\n"), "{}", deleted.text);
    let all = git()
        .diff(&wt, Source::Worktree, None, 100_000)
        .await
        .unwrap();
    for file in ["a.txt", "b.txt", "new/new.txt", "d.txt"] {
        assert!(
            all.text.contains(&format!("b/{file}")),
            "{file}: {}",
            all.text
        );
    }
    assert!(
        all.text
            .contains("Binary files /dev/null and b/bin.dat differ"),
        "{}",
        all.text
    );
    assert!(!all.text.contains("debug.log"));
    let cut = git().diff(&wt, Source::Worktree, None, 100).await.unwrap();
    assert!(cut.truncated);
    assert!(
        cut.text.len() <= 100 && cut.text.ends_with('\n'),
        "{:?}",
        cut.text
    );
    assert!(all.text.starts_with(&cut.text));
    assert_eq!(
        git()
            .diff(&wt, Source::Worktree, Some("nothing-here"), 100)
            .await
            .unwrap()
            .text,
        ""
    );
    // A pathspec's magic is taken literally.
    assert_eq!(
        git()
            .diff(&wt, Source::Worktree, Some("*.txt"), 1000)
            .await
            .unwrap()
            .text,
        ""
    );
    for bad in [
        "",
        "../x",
        "a/../../x",
        "/etc/passwd",
        "a\0b",
        &"x".repeat(5000),
    ] {
        let e = git()
            .diff(&wt, Source::Worktree, Some(bad), 100)
            .await
            .unwrap_err();
        assert!(matches!(e, GitError::BadPath(_)), "{bad:?}: {e:?}");
    }
    let branch = git()
        .diff(&wt, Source::Branch, Some("a.txt"), 100_000)
        .await
        .unwrap();
    assert!(branch.text.contains("+a more\n"), "{}", branch.text);
    let branch_all = git()
        .diff(&wt, Source::Branch, None, 100_000)
        .await
        .unwrap();
    assert!(!branch_all.text.contains("new.txt"));
}

#[test]
fn raw_and_numstat_records_are_read_together() {
    let out = b":100644 100644 6178079 0505b3b M\0b\0:000000 100644 0000000 bdc955b A\0bin\0:100644 100644 7898192 7898192 R100\0a\0c\x001\t0\tb\0-\t-\tbin\x000\t0\t\0a\0c\0";
    let files = crate::git::changes::parse_raw_numstat(out);
    assert_eq!(files.len(), 3);
    assert_eq!((files[0].added, files[0].removed), (1, 0));
    assert!(files[1].binary);
    assert_eq!(files[2].status, FileStatus::Renamed);
    assert_eq!(files[2].old_path.as_deref(), Some("a"));
    assert_eq!(files[2].path, "c");
}

#[tokio::test]
async fn changes_count_uncommitted_files_with_and_without_commits_of_the_branch() {
    let place = Place::new();
    let wt = place.worktree("main", "acp/count").await;
    let dir = Path::new(&wt.path);
    // Nothing yet.
    let changes = git().changes(&wt, Source::Worktree).await.unwrap();
    assert_eq!((changes.totals.files, changes.uncommitted), (0, 0));
    assert_eq!(changes.head, changes.merge_base);
    // Tracked changes only, no commit of its own.
    write(dir, "a.txt", "changed\n");
    let changes = git().changes(&wt, Source::Worktree).await.unwrap();
    assert_eq!((changes.totals.files, changes.uncommitted), (1, 1));
    // A commit of its own, then a tracked change, nothing untracked.
    run(
        dir,
        &[
            "-c",
            "user.name=A",
            "-c",
            "user.email=a@x",
            "commit",
            "-qam",
            "a",
        ],
    );
    write(dir, "b.txt", "changed\n");
    let changes = git().changes(&wt, Source::Worktree).await.unwrap();
    assert_eq!((changes.totals.files, changes.uncommitted), (2, 1));
    assert_eq!(changes.totals.commits, 1);
    // And an untracked file.
    write(dir, "u.txt", "u\n");
    let changes = git().changes(&wt, Source::Worktree).await.unwrap();
    assert_eq!((changes.totals.files, changes.uncommitted), (3, 2));
    // Staged by the agent, the real index is left as it was.
    run(dir, &["add", "u.txt"]);
    std::fs::remove_file(dir.join("u.txt")).unwrap();
    let changes = git().changes(&wt, Source::Worktree).await.unwrap();
    assert_eq!((changes.totals.files, changes.uncommitted), (2, 1));
    assert_eq!(run(dir, &["diff", "--cached", "--name-only"]), "u.txt");
    // Staged, then put back in the worktree, beside an untracked file: as
    // `add -A` would have it, the same as the merge base.
    run(dir, &["reset", "-q"]);
    write(dir, "c.txt", "staged\n");
    run(dir, &["add", "c.txt"]);
    write(dir, "c.txt", &lines(20, "c"));
    write(dir, "sub/v.txt", "v\n");
    let changes = git().changes(&wt, Source::Worktree).await.unwrap();
    let paths: Vec<_> = changes.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(paths, ["a.txt", "b.txt", "sub/v.txt"]);
    assert_eq!(changes.uncommitted, 2);
    // Moved and removed with git itself (gone from the index and the
    // tree), beside an untracked file.
    run(dir, &["reset", "-q", "--hard"]);
    run(dir, &["mv", "c.txt", "moved.txt"]);
    run(dir, &["rm", "-q", "b.txt"]);
    write(dir, "sub/v.txt", "v\n");
    let changes = git().changes(&wt, Source::Worktree).await.unwrap();
    let files: Vec<_> = changes
        .files
        .iter()
        .map(|f| (f.path.as_str(), f.status))
        .collect();
    assert_eq!(
        files,
        [
            ("a.txt", FileStatus::Modified),
            ("b.txt", FileStatus::Deleted),
            ("moved.txt", FileStatus::Renamed),
            ("sub/v.txt", FileStatus::Added),
        ]
    );
    assert_eq!(changes.uncommitted, 3);
}

/// New files read by the gateway itself (text without a last newline, an
/// empty one, a binary one, a symlink) count as git counts them once added.
#[tokio::test]
async fn new_files_beside_changed_ones_count_as_git_counts_them() {
    let place = Place::new();
    let wt = place.worktree("main", "acp/new").await;
    let dir = Path::new(&wt.path);
    write(dir, "a.txt", &(lines(10, "a") + "a more\n"));
    write(dir, "fresh/unended.txt", "one\ntwo");
    write(dir, "fresh/empty.txt", "");
    std::fs::write(dir.join("fresh/blob.bin"), [0u8, 1, 2, 0, 3]).unwrap();
    std::os::unix::fs::symlink("a.txt", dir.join("fresh/link")).unwrap();
    let changes = git().changes(&wt, Source::Worktree).await.unwrap();
    let ours: Vec<(String, u64, u64, bool)> = changes
        .files
        .iter()
        .map(|f| (f.path.clone(), f.added, f.removed, f.binary))
        .collect();
    assert_eq!(changes.uncommitted, 5, "{ours:?}");
    // What git says once they are all added.
    run(dir, &["add", "-A"]);
    let numstat = run(
        dir,
        &["diff", "--cached", "--merge-base", "main", "--numstat"],
    );
    let mut theirs: Vec<(String, u64, u64, bool)> = numstat
        .lines()
        .map(|line| {
            let mut parts = line.split('\t');
            let (added, removed) = (parts.next().unwrap(), parts.next().unwrap());
            let path = parts.next().unwrap().to_owned();
            let binary = added == "-";
            let n = |s: &str| s.parse().unwrap_or(0);
            (path, n(added), n(removed), binary)
        })
        .collect();
    theirs.sort();
    assert_eq!(ours, theirs);
}
