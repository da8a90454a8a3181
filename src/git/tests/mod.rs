//! Real repositories in temporary directories, and the real git: the
//! helpers; the tests of worktrees, of changes and of committing and
//! landing are in the files beside.

mod changes;
mod land;
mod worktrees;

use std::path::{Path, PathBuf};

use super::*;

/// Runs the real git in `dir` (as a person would); its stdout, trimmed.
pub(super) fn run(dir: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?} in {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

pub(super) fn write(dir: &Path, file: &str, text: &str) {
    let path = dir.join(file);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

pub(super) fn read(dir: &Path, file: &str) -> String {
    std::fs::read_to_string(dir.join(file)).unwrap()
}

pub(super) fn lines(n: usize, word: &str) -> String {
    (0..n).map(|i| format!("{word} {i}\n")).collect()
}

pub(super) fn person() -> Signature {
    Signature {
        name: "Ada Person".into(),
        email: "ada@example.com".into(),
    }
}

pub(super) fn gateway() -> Signature {
    Signature {
        name: "ACP Gateway".into(),
        email: "gateway@example.com".into(),
    }
}

/// A temporary directory with a repository `repo` on `main` (a.txt,
/// b.txt, c.txt committed, *.log ignored).
pub(super) struct Place {
    _dir: tempfile::TempDir,
    pub(super) root: PathBuf,
    pub(super) repo: PathBuf,
}

impl Place {
    pub(super) fn new() -> Place {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let repo = root.join("repo");
        std::fs::create_dir(&repo).unwrap();
        run(&repo, &["init", "-q", "-b", "main"]);
        run(&repo, &["config", "user.name", "Repo Owner"]);
        run(&repo, &["config", "user.email", "owner@example.com"]);
        write(&repo, "a.txt", &lines(10, "a"));
        write(&repo, "b.txt", &lines(10, "b"));
        write(&repo, "c.txt", &lines(20, "c"));
        write(&repo, ".gitignore", "*.log\n");
        run(&repo, &["add", "-A"]);
        run(&repo, &["commit", "-q", "-m", "first"]);
        Place {
            _dir: dir,
            root,
            repo,
        }
    }

    pub(super) async fn worktree(&self, base: &str, branch: &str) -> Worktree {
        let path = self.root.join(branch.replace('/', "-"));
        git()
            .add_worktree(&self.repo, base, branch, &path)
            .await
            .unwrap()
    }

    /// Every ref, and the status and index of the repository's tree and
    /// of `others`.
    pub(super) fn state(&self, others: &[&Path]) -> Vec<String> {
        let mut state = vec![run(
            &self.repo,
            &["for-each-ref", "--format=%(refname) %(objectname)"],
        )];
        for dir in std::iter::once(self.repo.as_path()).chain(others.iter().copied()) {
            state.push(run(dir, &["rev-parse", "HEAD"]));
            state.push(run(
                dir,
                &["status", "--porcelain", "--untracked-files=all"],
            ));
            state.push(run(dir, &["diff", "--cached", "--name-only"]));
        }
        state
    }
}

pub(super) fn git() -> Git {
    Git::new("git")
}

/// A git that fails the subcommand named in the file it returns, and runs
/// the real git otherwise; before a subcommand for which [`before`] left a
/// script, it runs that script once (as another process would, meanwhile).
pub(super) fn failing_git(place: &Place) -> (Git, PathBuf) {
    let control = place.root.join("fail");
    let script = place.root.join("git-wrapper");
    std::fs::write(
        &script,
        format!(
            r#"#!/bin/sh
fail=$(cat '{}' 2>/dev/null)
sub=
skip=
for a in "$@"; do
  if [ -n "$skip" ]; then skip=; continue; fi
  case "$a" in
    -c|-C) skip=1 ;;
    -*) ;;
    *) sub="$a"; break ;;
  esac
done
before='{}/before-'"$sub"
if [ -n "$sub" ] && [ -f "$before" ]; then sh "$before" >&2 && rm -f "$before"; fi
if [ -n "$sub" ] && [ "$sub" = "$fail" ]; then echo "fatal: $sub fails on purpose" >&2; exit 1; fi
exec git "$@"
"#,
            control.display(),
            place.root.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    (Git::new(script), control)
}

/// Has [`failing_git`] run `script` (sh, with the real git) once, before
/// its next `step`.
pub(super) fn before(place: &Place, step: &str, script: &str) {
    std::fs::write(place.root.join(format!("before-{step}")), script).unwrap();
}

/// A worktree with a commit on its branch and uncommitted work of every
/// kind.
pub(super) async fn busy_worktree(place: &Place) -> Worktree {
    let wt = place.worktree("main", "acp/work").await;
    let dir = Path::new(&wt.path);
    write(dir, "a.txt", &(lines(10, "a") + "a more\n"));
    run(
        dir,
        &[
            "-c",
            "user.name=Agent",
            "-c",
            "user.email=agent@x",
            "commit",
            "-qam",
            "more a",
        ],
    );
    // Uncommitted: b deleted, c renamed, new (untracked), binary, ignored.
    std::fs::remove_file(dir.join("b.txt")).unwrap();
    std::fs::rename(dir.join("c.txt"), dir.join("d.txt")).unwrap();
    write(dir, "new/new.txt", "one\ntwo\n");
    std::fs::write(dir.join("bin.dat"), [0u8, 1, 2, 3, 0, 255]).unwrap();
    write(dir, "debug.log", "ignored\n");
    wt
}
