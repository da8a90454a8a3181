//! Committing a worktree's work and landing its branch on the base: the
//! new commits are made with plumbing (`write-tree`, `merge-tree`,
//! `commit-tree`) and nothing moves until they all exist; then one
//! compare-and-swap (`update-ref` with the old value, or a fast-forward of
//! the tree where the base is checked out) applies them.

use std::path::{Path, PathBuf};

use super::{
    gone, lossy, parse_log, records, status_files, unreachable, Git, GitError, Landed,
    RepositoryHeld, Source, TempIndex,
};
use crate::model::{BranchCommit, LandStrategy, Signature, Worktree};

/// What [`Git::commit`] does (under the repository's hold).
pub(super) async fn commit(
    git: &Git,
    worktree: &Worktree,
    message: &str,
    author: &Signature,
    committer: &Signature,
) -> Result<BranchCommit, GitError> {
    if let Some(e) = unreachable(worktree, Source::Worktree) {
        return Err(e);
    }
    let dir = Path::new(&worktree.path);
    // The index is replaced at the end: not while another git holds it.
    if Path::new(&worktree.git_dir).join("index.lock").exists() {
        return Err(GitError::Busy(format!(
            "another git runs in {} (its index.lock is there); nothing changed",
            worktree.path
        )));
    }
    let parent = git
        .at(dir)
        .args(["rev-parse", "--verify", "HEAD^{commit}"])
        .text()
        .await?;
    let mut index = TempIndex::copy(git, worktree)?;
    git.at(dir)
        .index(&index.path)
        .args(["add", "-A"])
        .ok()
        .await?;
    let tree = git
        .at(dir)
        .index(&index.path)
        .arg("write-tree")
        .text()
        .await?;
    let parent_tree = git
        .at(dir)
        .args(["rev-parse", "--verify"])
        .arg(format!("{parent}^{{tree}}"))
        .text()
        .await?;
    if tree == parent_tree {
        return Err(GitError::NothingToCommit);
    }
    let mut text = message.to_owned();
    if !text.ends_with('\n') {
        text.push('\n');
    }
    let id = git
        .at(dir)
        .args(["commit-tree", &tree, "-p", &parent])
        .author(author)
        .committer(committer)
        .input(text)
        .text()
        .await?;
    let summary = message.lines().next().unwrap_or("").trim().to_owned();
    git.at(dir)
        .args(["update-ref", "-m"])
        .arg(format!("commit: {summary}"))
        .args(["HEAD", &id, &parent])
        .committer(committer)
        .ok()
        .await
        .map_err(|e| match e {
            // Something else committed meanwhile: try again.
            GitError::Failed(m) if m.contains("but expected") => GitError::Busy(format!(
                "the branch {} moved while committing; nothing changed: {m}",
                worktree.branch
            )),
            other => other.busy_if_locked(),
        })?;
    // The index becomes what was committed (else, made to match HEAD).
    let real = Path::new(&worktree.git_dir).join("index");
    match std::fs::rename(&index.path, &real) {
        Ok(()) => index.kept = true,
        Err(_) => {
            git.at(dir).args(["reset", "-q"]).ok().await?;
        }
    }
    let out = git
        .at(dir)
        .args([
            "log",
            "-1",
            "-z",
            "--format=%H%x1f%an%x1f%aI%x1f%s",
            &id,
            "--",
        ])
        .ok()
        .await?;
    parse_log(&out)?
        .pop()
        .ok_or_else(|| GitError::Failed(format!("git log does not show the commit {id}")))
}

/// An `update-ref` refused because the ref is no longer at the old value
/// is [`GitError::BaseMoved`] (`why`); a lock, busy; else as it was.
fn moved_or(e: GitError, why: &str) -> GitError {
    match e {
        GitError::Failed(m) if m.contains("but expected") || m.contains("is at ") => {
            GitError::BaseMoved(format!("{why}: {m}"))
        }
        other => other.busy_if_locked(),
    }
}

/// `git merge-tree --write-tree --name-only --no-messages -z`: the tree,
/// or the files that conflict.
async fn merge_tree(
    git: &Git,
    dir: &Path,
    merge_base: Option<&str>,
    ours: &str,
    theirs: &str,
) -> Result<String, GitError> {
    let mut call = git.at(dir).args([
        "merge-tree",
        "--write-tree",
        "--name-only",
        "--no-messages",
        "-z",
    ]);
    if let Some(base) = merge_base {
        call = call.arg(format!("--merge-base={base}"));
    }
    let call = call.args([ours, theirs]);
    let what = call.what();
    let output = call.output().await?;
    let mut fields = records(&output.stdout);
    let tree = fields.next().map(lossy).unwrap_or_default();
    match output.status.code() {
        Some(0) if !tree.is_empty() => Ok(tree),
        // Conflicts: the tree (with conflict markers) and then the files.
        Some(1) if !tree.is_empty() && tree.bytes().all(|b| b.is_ascii_hexdigit()) => {
            let mut files: Vec<String> = fields.take_while(|f| !f.is_empty()).map(lossy).collect();
            files.dedup();
            Err(GitError::Conflict { files })
        }
        _ => Err(super::failure(&what, &output)),
    }
}

/// A commit's author and message, for replaying it.
struct Original {
    id: String,
    parent: Option<String>,
    author: Signature,
    date: String,
    message: String,
}

/// What [`Git::land`] does (under the repository's hold).
pub(super) async fn land(
    git: &Git,
    worktree: &Worktree,
    source: Source,
    strategy: LandStrategy,
    message: Option<&str>,
    author: &Signature,
    committer: &Signature,
) -> Result<Landed, GitError> {
    if let Some(e) = unreachable(worktree, source) {
        return Err(e);
    }
    let repo = Path::new(&worktree.repository);
    let base_ref = format!("refs/heads/{}", worktree.base);
    let branch_ref = format!("refs/heads/{}", worktree.branch);
    // 1. The worktree's work is committed.
    if source == Source::Worktree {
        let files = git.dirty_files(worktree).await?;
        if !files.is_empty() {
            return Err(GitError::Dirty {
                tree: worktree.path.clone(),
                files,
            });
        }
    }
    // 2. Something to land.
    let (head, base) = tokio::join!(
        git.commit_id(repo, &branch_ref),
        git.commit_id(repo, &base_ref)
    );
    let head = head?.ok_or_else(|| gone(worktree, &worktree.branch))?;
    let base = base?.ok_or_else(|| gone(worktree, &worktree.base))?;
    if is_ancestor(git, repo, &head, &base).await? {
        return Err(GitError::NothingToLand(format!(
            "{} has everything {} has",
            worktree.base, worktree.branch
        )));
    }
    // 3. The base's new commit, nothing moved yet.
    let new = match strategy {
        LandStrategy::Merge => {
            let tree = merge_tree(git, repo, None, &base, &head).await?;
            let text = message.map_or_else(
                || format!("Merge branch '{}' into {}", worktree.branch, worktree.base),
                str::to_owned,
            );
            commit_tree(git, repo, &tree, &[&base, &head], &text, author, committer).await?
        }
        LandStrategy::Squash => {
            let tree = merge_tree(git, repo, None, &base, &head).await?;
            let text = match message {
                Some(text) => text.to_owned(),
                None => {
                    let out = git
                        .at(repo)
                        .args(["log", "--reverse", "--no-merges", "-z", "--format=%s"])
                        .arg(format!("{base}..{head}"))
                        .arg("--")
                        .ok()
                        .await?;
                    let summaries: Vec<String> = records(&out).map(lossy).collect();
                    format!("{}: {}", worktree.branch, summaries.join("; "))
                }
            };
            commit_tree(git, repo, &tree, &[&base], &text, author, committer).await?
        }
        LandStrategy::Rebase => {
            if is_ancestor(git, repo, &base, &head).await? {
                head.clone()
            } else {
                replay(git, repo, &base, &head, committer).await?
            }
        }
    };
    // 4. The base moves to it.
    let working_tree = checked_out(git, repo, &base_ref).await?;
    match &working_tree {
        Some(tree) => {
            let files = {
                let out = git
                    .at(tree)
                    .args(["status", "--porcelain=v1", "-z", "--untracked-files=no"])
                    .ok()
                    .await?;
                status_files(&out)
            };
            if !files.is_empty() {
                return Err(GitError::Dirty {
                    tree: tree.to_string_lossy().into_owned(),
                    files,
                });
            }
            let at = git
                .at(tree)
                .args(["rev-parse", "--verify", "HEAD"])
                .text()
                .await?;
            if at != base {
                return Err(base_moved(worktree));
            }
            git.at(tree)
                .args(["merge", "--ff-only", "--quiet", &new])
                .committer(committer)
                .ok()
                .await
                .map_err(|e| match e {
                    GitError::Failed(m) if m.contains("Not possible to fast-forward") => {
                        base_moved(worktree)
                    }
                    other => other.busy_if_locked(),
                })?;
        }
        None => {
            git.at(repo)
                .args(["update-ref", "-m"])
                .arg(format!("land ({}) {}", strategy.as_str(), worktree.branch))
                .args([&base_ref, &new, &base])
                .committer(committer)
                .ok()
                .await
                .map_err(|e| {
                    moved_or(
                        e,
                        &format!("{} moved while landing; nothing changed", worktree.base),
                    )
                })?;
        }
    }
    // 5. The branch starts again from the base (its work is in it now).
    if strategy != LandStrategy::Merge && new != head {
        let moved = match source {
            Source::Worktree => {
                git.at(&worktree.path)
                    .args(["reset", "-q", "--keep", &new])
                    .committer(committer)
                    .ok()
                    .await
            }
            Source::Branch => {
                git.at(repo)
                    .args(["update-ref", "-m"])
                    .arg(format!(
                        "land ({}) onto {}",
                        strategy.as_str(),
                        worktree.base
                    ))
                    .args([&branch_ref, &new, &head])
                    .committer(committer)
                    .ok()
                    .await
            }
        };
        if let Err(e) = moved {
            return Err(GitError::Failed(format!(
                "the branch landed on {} (now {new}), but {} could not be moved to it: {e}",
                worktree.base, worktree.branch
            )));
        }
    }
    Ok(Landed {
        strategy,
        from: base,
        to: new,
        working_tree,
    })
}

fn base_moved(worktree: &Worktree) -> GitError {
    GitError::BaseMoved(format!(
        "{} moved while landing; nothing changed",
        worktree.base
    ))
}

async fn is_ancestor(git: &Git, dir: &Path, ancestor: &str, of: &str) -> Result<bool, GitError> {
    Ok(git
        .at(dir)
        .args(["merge-base", "--is-ancestor", ancestor, of])
        .answer()
        .await?
        .is_some())
}

async fn commit_tree(
    git: &Git,
    dir: &Path,
    tree: &str,
    parents: &[&str],
    message: &str,
    author: &Signature,
    committer: &Signature,
) -> Result<String, GitError> {
    let mut call = git.at(dir).args(["commit-tree", tree]);
    for parent in parents {
        call = call.args(["-p", parent]);
    }
    let mut text = message.to_owned();
    if !text.ends_with('\n') {
        text.push('\n');
    }
    call.author(author)
        .committer(committer)
        .input(text)
        .text()
        .await
}

/// The branch's commits (not its merges) made again on the base, each
/// with its own author and message; the last one.
async fn replay(
    git: &Git,
    repo: &Path,
    base: &str,
    head: &str,
    committer: &Signature,
) -> Result<String, GitError> {
    let out = git
        .at(repo)
        .args([
            "log",
            "--reverse",
            "--no-merges",
            "-z",
            "--format=%H%x1f%P%x1f%an%x1f%ae%x1f%aI%x1f%B",
        ])
        .arg(format!("{base}..{head}"))
        .arg("--")
        .ok()
        .await?;
    let originals: Vec<Original> = records(&out)
        .map(|record| {
            let record = lossy(record);
            let mut parts = record.splitn(6, '\u{1f}');
            let mut next = || parts.next().unwrap_or("").to_owned();
            let (id, parents, name, email, date, message) =
                (next(), next(), next(), next(), next(), next());
            Original {
                id,
                parent: parents.split_whitespace().next().map(str::to_owned),
                author: Signature { name, email },
                date,
                message,
            }
        })
        .collect();
    let mut at = base.to_owned();
    for original in originals {
        let parent = original.parent.ok_or_else(|| {
            GitError::Failed(format!(
                "{} has no parent: it cannot be replayed on the base",
                original.id
            ))
        })?;
        let tree = merge_tree(git, repo, Some(&parent), &at, &original.id).await?;
        let mut message = original.message.trim_end().to_owned();
        message.push('\n');
        at = git
            .at(repo)
            .args(["commit-tree", &tree, "-p", &at])
            .author(&original.author)
            .env("GIT_AUTHOR_DATE", &original.date)
            .committer(committer)
            .input(message)
            .text()
            .await?;
    }
    Ok(at)
}

/// The working tree where `reference` is checked out, if one is.
async fn checked_out(git: &Git, repo: &Path, reference: &str) -> Result<Option<PathBuf>, GitError> {
    let out = git
        .at(repo)
        .args(["worktree", "list", "--porcelain", "-z"])
        .ok()
        .await?;
    let mut path: Option<PathBuf> = None;
    let mut on_it = false;
    let mut skip = false;
    for field in records(&out).chain(std::iter::once(&b""[..])) {
        if field.is_empty() {
            if on_it && !skip {
                if let Some(path) = path.take() {
                    return Ok(Some(path));
                }
            }
            (path, on_it, skip) = (None, false, false);
            continue;
        }
        let field = lossy(field);
        if let Some(p) = field.strip_prefix("worktree ") {
            path = Some(PathBuf::from(p));
        } else if let Some(b) = field.strip_prefix("branch ") {
            on_it = b == reference;
        } else if field == "bare" || field.starts_with("prunable") {
            skip = true;
        }
    }
    Ok(None)
}

impl Git {
    /// Commits everything in the worktree.
    pub async fn commit(
        &self,
        worktree: &Worktree,
        message: &str,
        author: &Signature,
        committer: &Signature,
    ) -> Result<BranchCommit, GitError> {
        let _held = RepositoryHeld::take(worktree)?;
        commit(self, worktree, message, author, committer)
            .await
            .map_err(GitError::busy_if_locked)
    }

    /// Brings the branch into its base.
    pub async fn land(
        &self,
        worktree: &Worktree,
        source: Source,
        strategy: LandStrategy,
        message: Option<&str>,
        author: &Signature,
        committer: &Signature,
    ) -> Result<Landed, GitError> {
        let _held = RepositoryHeld::take(worktree)?;
        land(self, worktree, source, strategy, message, author, committer)
            .await
            .map_err(GitError::busy_if_locked)
    }
}
