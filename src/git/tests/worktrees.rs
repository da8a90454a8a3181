//! Making and removing worktrees; the box.

use std::path::{Path, PathBuf};

use super::*;

#[tokio::test]
async fn a_worktree_is_made_beside_another_and_its_box_names_its_folders() {
    let place = Place::new();
    // An empty directory made beforehand, and one not there yet.
    std::fs::create_dir(place.root.join("acp-one")).unwrap();
    let one = place.worktree("main", "acp/one").await;
    let two = place.worktree("main", "acp/two").await;
    let common = place.repo.join(".git");
    assert_eq!(one.repository, place.repo.to_str().unwrap());
    assert_eq!(one.common_dir, common.to_str().unwrap());
    assert_eq!(one.path, place.root.join("acp-one").to_str().unwrap());
    assert_eq!(
        one.git_dir,
        common.join("worktrees/acp-one").to_str().unwrap()
    );
    assert_eq!(
        two.git_dir,
        common.join("worktrees/acp-two").to_str().unwrap()
    );
    assert_eq!(
        (one.base.as_str(), one.branch.as_str()),
        ("main", "acp/one")
    );
    assert_eq!(read(Path::new(&two.path), "a.txt"), lines(10, "a"));
    assert_eq!(
        run(Path::new(&one.path), &["symbolic-ref", "HEAD"]),
        "refs/heads/acp/one"
    );
    // From a subdirectory of the repository, too.
    write(&place.repo, "sub/x.txt", "x");
    let three = git()
        .add_worktree(
            &place.repo.join("sub"),
            "main",
            "feature/three",
            &place.root.join("three"),
        )
        .await
        .unwrap();
    assert_eq!(three.repository, place.repo.to_str().unwrap());

    let paths = box_paths(&one);
    assert_eq!(
        paths.read_write,
        [
            PathBuf::from(&one.path),
            PathBuf::from(&one.git_dir),
            common.join("objects"),
            common.join("refs/heads/acp"),
            common.join("logs/refs/heads/acp"),
        ]
    );
    assert_eq!(paths.read_only, vec![common.clone()]);
    run(&place.repo, &["pack-refs", "--all"]);
    std::fs::remove_dir_all(common.join("refs/heads/acp")).ok();
    prepare_box(&one).unwrap();
    assert!(common.join("refs/heads/acp").is_dir());
    assert!(common.join("logs/refs/heads/acp").is_dir());
}

#[tokio::test]
async fn a_worktree_is_refused_where_it_cannot_be_made() {
    let place = Place::new();
    let at = |name: &str| place.root.join(name);
    let plain = place.root.join("plain");
    std::fs::create_dir(&plain).unwrap();
    for repository in [place.root.join("nowhere"), plain] {
        let e = git()
            .add_worktree(&repository, "main", "acp/x", &at("x"))
            .await
            .unwrap_err();
        assert!(matches!(e, GitError::NotARepository(_)), "{e:?}");
        assert!(e.to_string().contains("is not a git repository"), "{e}");
    }
    let e = git()
        .add_worktree(&place.repo, "nope", "acp/x", &at("x"))
        .await
        .unwrap_err();
    assert!(matches!(e, GitError::UnknownBase(_)), "{e:?}");
    run(&place.repo, &["branch", "acp/taken"]);
    let e = git()
        .add_worktree(&place.repo, "main", "acp/taken", &at("x"))
        .await
        .unwrap_err();
    assert!(matches!(e, GitError::BranchExists(_)), "{e:?}");
    for (branch, why) in [
        ("alone", "folder"),
        ("acp/..bad", "not a valid"),
        ("-acp/x", "not a valid"),
    ] {
        let e = git()
            .add_worktree(&place.repo, "main", branch, &at("x"))
            .await
            .unwrap_err();
        assert!(matches!(e, GitError::InvalidBranch(_)), "{branch}: {e:?}");
        assert!(e.to_string().contains(why), "{e}");
    }
    run(&place.repo, &["branch", "release/1.0"]);
    let e = git()
        .add_worktree(&place.repo, "release/1.0", "release/x", &at("x"))
        .await
        .unwrap_err();
    assert!(matches!(e, GitError::InvalidBranch(_)), "{e:?}");
    assert!(e.to_string().contains("holds the base"), "{e}");
    assert!(!at("x").exists());

    // Broken metadata: `worktrees` is a file.
    std::fs::write(place.repo.join(".git/worktrees"), "not a directory").unwrap();
    let e = git()
        .add_worktree(&place.repo, "main", "acp/x", &at("x"))
        .await
        .unwrap_err();
    let GitError::Failed(message) = &e else {
        panic!("{e:?}")
    };
    assert!(
        message.starts_with(&format!(
            "git worktree add in {} failed: ",
            place.repo.display()
        )),
        "{message}"
    );
    assert_eq!(run(&place.repo, &["branch", "--list", "acp/x"]), "");
}

#[tokio::test]
async fn a_worktree_removed_with_its_branch_leaves_nothing() {
    let place = Place::new();
    let wt = busy_worktree(&place).await;
    assert_eq!(
        git().remove_worktree(&wt, true, &gateway()).await.unwrap(),
        None
    );
    assert_eq!(run(&place.repo, &["branch", "--list", "acp/work"]), "");
    assert_eq!(
        run(&place.repo, &["worktree", "list", "--porcelain"])
            .matches("worktree ")
            .count(),
        1
    );
    // Its directory already gone: pruned, idempotent.
    let other = place.worktree("main", "acp/other").await;
    std::fs::remove_dir_all(&other.path).unwrap();
    git()
        .remove_worktree(&other, true, &gateway())
        .await
        .unwrap();
    git()
        .remove_worktree(&other, true, &gateway())
        .await
        .unwrap();
    assert!(!Path::new(&other.git_dir).exists());
    assert_eq!(run(&place.repo, &["branch", "--list", "acp/*"]), "");
}

#[tokio::test]
async fn a_bare_repository_takes_worktrees_and_lands_by_moving_its_branch() {
    let place = Place::new();
    let bare = place.root.join("bare.git");
    run(
        &place.root,
        &[
            "clone",
            "-q",
            "--bare",
            place.repo.to_str().unwrap(),
            bare.to_str().unwrap(),
        ],
    );
    let path = place.root.join("on-bare");
    let wt = git()
        .add_worktree(&bare, "main", "acp/bare", &path)
        .await
        .unwrap();
    assert_eq!(wt.repository, bare.to_str().unwrap());
    assert_eq!(wt.common_dir, bare.to_str().unwrap());
    write(&path, "new.txt", "new\n");
    git()
        .commit(&wt, "new", &person(), &gateway())
        .await
        .unwrap();
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
    assert_eq!(landed.working_tree, None);
    assert_eq!(run(&bare, &["rev-parse", "main"]), landed.to);
}

#[tokio::test]
async fn a_locked_stale_worktree_in_the_way_fails_naming_the_repository() {
    let place = Place::new();
    let wt = place.worktree("main", "acp/stale").await;
    run(&place.repo, &["worktree", "lock", &wt.path]);
    std::fs::remove_dir_all(&wt.path).unwrap();
    // The same directory again, on another branch: git refuses a path a
    // locked worktree still claims.
    let e = git()
        .add_worktree(&place.repo, "main", "acp/again", Path::new(&wt.path))
        .await
        .unwrap_err();
    let GitError::Failed(message) = &e else {
        panic!("{e:?}")
    };
    assert!(
        message.contains(&format!("git worktree add in {}", place.repo.display())),
        "{message}"
    );
    assert!(message.contains("locked"), "{message}");
    assert_eq!(run(&place.repo, &["branch", "--list", "acp/again"]), "");
}

/// As root, git runs as the agent's user: what it writes is theirs.
#[tokio::test]
async fn git_runs_as_the_agents_user() {
    let Some(nobody) = crate::sys::nobody_if_root() else {
        return;
    };
    let place = Place::new();
    // The temporary directory is root's: the user may enter it, and owns
    // the repository.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&place.root, std::fs::Permissions::from_mode(0o755)).unwrap();
    let chown = std::process::Command::new("chown")
        .args(["-R", &format!("{}:{}", nobody.uid, nobody.gid)])
        .arg(&place.repo)
        .status()
        .unwrap();
    assert!(chown.success());
    let path = place.root.join("as-nobody");
    std::fs::create_dir(&path).unwrap();
    std::os::unix::fs::chown(&path, Some(nobody.uid), Some(nobody.gid)).unwrap();
    let as_nobody = git().run_as(Some(nobody.clone()));
    let wt = as_nobody
        .add_worktree(&place.repo, "main", "acp/nobody", &path)
        .await
        .unwrap();
    use std::os::unix::fs::MetadataExt;
    let owner = |p: &Path| std::fs::metadata(p).unwrap().uid();
    assert_eq!(owner(&path.join("a.txt")), nobody.uid);
    assert_eq!(owner(Path::new(&wt.git_dir)), nobody.uid);
    write(&path, "new.txt", "new\n");
    std::os::unix::fs::chown(path.join("new.txt"), Some(nobody.uid), Some(nobody.gid)).unwrap();
    let changes = as_nobody.changes(&wt, Source::Worktree).await.unwrap();
    assert_eq!(changes.totals.files, 1);
    as_nobody
        .commit(&wt, "new", &person(), &gateway())
        .await
        .unwrap();
    assert_eq!(owner(&Path::new(&wt.git_dir).join("index")), nobody.uid);
}
