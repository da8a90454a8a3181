//! Making and removing a conversation's worktree.

use std::path::{Path, PathBuf};

use super::{branch_folder, canonical, status_files, unreachable, Git, GitError, Source};
use crate::model::{Signature, Worktree};

impl Git {
    /// Makes a worktree at `path` on a new branch `branch` from `base` in
    /// `repository`.
    pub async fn add_worktree(
        &self,
        repository: &Path,
        base: &str,
        branch: &str,
        path: &Path,
    ) -> Result<Worktree, GitError> {
        let not_a_repository = || {
            GitError::NotARepository(format!("{} is not a git repository", repository.display()))
        };
        if !repository.is_dir() {
            return Err(not_a_repository());
        }
        let out = self
            .at(repository)
            .args([
                "rev-parse",
                "--is-bare-repository",
                "--path-format=absolute",
                "--git-common-dir",
            ])
            .ok()
            .await
            .map_err(|e| because(not_a_repository(), e))?;
        let out = String::from_utf8_lossy(&out);
        let mut lines = out.lines();
        let bare = lines.next() == Some("true");
        let common_dir = lines.next().ok_or_else(not_a_repository)?.to_owned();
        let top = if bare {
            common_dir.clone()
        } else {
            self.at(repository)
                .args(["rev-parse", "--show-toplevel"])
                .text()
                .await
                .map_err(|e| because(not_a_repository(), e))?
        };
        let top = PathBuf::from(canonical(Path::new(&top)));

        if base.starts_with('-')
            || self
                .commit_id(&top, &format!("refs/heads/{base}"))
                .await?
                .is_none()
        {
            return Err(GitError::UnknownBase(format!(
                "{} has no branch {base:?}",
                top.display()
            )));
        }
        self.check_branch(&top, base, branch).await?;
        let path_was_there = path.exists();
        let added = self
            .at(&top)
            .args(["worktree", "add", "--quiet", "-b", branch, "--"])
            .arg(path)
            .arg(format!("refs/heads/{base}"))
            .ok()
            .await;
        if let Err(e) = added {
            // git makes the branch before the worktree: nothing may stay.
            let reference = format!("refs/heads/{branch}");
            let made = self
                .at(&top)
                .args(["show-ref", "--verify", "--quiet", &reference])
                .answer()
                .await;
            if let Ok(Some(_)) = made {
                let _ = self
                    .at(&top)
                    .args(["branch", "-D", "--", branch])
                    .ok()
                    .await;
            }
            if !path_was_there {
                // Only if empty: what git made of it.
                let _ = std::fs::remove_dir(path);
            }
            return Err(e);
        }
        let path = canonical(path);
        let git_dir = self
            .at(&path)
            .args(["rev-parse", "--path-format=absolute", "--git-dir"])
            .text()
            .await?;
        Ok(Worktree {
            repository: top.to_string_lossy().into_owned(),
            base: base.to_owned(),
            branch: branch.to_owned(),
            path,
            git_dir: canonical(Path::new(&git_dir)),
            common_dir: canonical(Path::new(&common_dir)),
        })
    }

    /// A branch name git accepts, in a folder that does not hold the base,
    /// and not there yet.
    async fn check_branch(&self, top: &Path, base: &str, branch: &str) -> Result<(), GitError> {
        let invalid = |why: &str| GitError::InvalidBranch(format!("branch {branch:?} {why}"));
        if branch.starts_with('-')
            || !self
                .at(top)
                .args(["check-ref-format", "--branch", branch])
                .output()
                .await?
                .status
                .success()
        {
            return Err(invalid("is not a valid branch name"));
        }
        let Some(folder) = branch_folder(branch) else {
            return Err(invalid(
                "must lie in a folder (as acp/1a2b3c4d or feature/x): the agent's box grants \
                 write access to its branch's folder, never to all branches",
            ));
        };
        if base == folder || base.starts_with(&format!("{folder}/")) {
            return Err(invalid(&format!(
                "lies in the folder {folder:?}, which holds the base {base:?}: the agent's box \
                 grants write access to that folder, so it could move the base"
            )));
        }
        if self
            .at(top)
            .args(["show-ref", "--verify", "--quiet"])
            .arg(format!("refs/heads/{branch}"))
            .answer()
            .await?
            .is_some()
        {
            return Err(GitError::BranchExists(format!(
                "{} already has a branch {branch:?}",
                top.display()
            )));
        }
        Ok(())
    }

    /// Removes a worktree (its directory and metadata); uncommitted work
    /// is committed on its branch first (the commit's id), so nothing is
    /// lost; `discard_branch` deletes the branch too.
    pub async fn remove_worktree(
        &self,
        worktree: &Worktree,
        discard_branch: bool,
        committer: &Signature,
    ) -> Result<Option<String>, GitError> {
        let repository = Path::new(&worktree.repository);
        if !Path::new(&worktree.common_dir).is_dir() {
            return Err(unreachable(worktree, Source::Branch).expect("the repository is gone"));
        }
        let there = Path::new(&worktree.path).is_dir() && Path::new(&worktree.git_dir).is_dir();
        let mut kept = None;
        if there {
            if !discard_branch && !self.dirty_files(worktree).await?.is_empty() {
                match self
                    .commit(
                        worktree,
                        "Uncommitted work kept when the conversation was closed",
                        committer,
                        committer,
                    )
                    .await
                {
                    Ok(commit) => kept = Some(commit.id),
                    Err(GitError::NothingToCommit) => {}
                    Err(e) => return Err(e),
                }
            }
            self.at(repository)
                .args(["worktree", "remove", "--force", "--"])
                .arg(&worktree.path)
                .ok()
                .await?;
        } else {
            self.at(repository).args(["worktree", "prune"]).ok().await?;
        }
        if discard_branch {
            let reference = format!("refs/heads/{}", worktree.branch);
            let exists = self
                .at(repository)
                .args(["show-ref", "--verify", "--quiet", &reference])
                .answer()
                .await?
                .is_some();
            if exists {
                self.at(repository)
                    .args(["branch", "-D", "--", &worktree.branch])
                    .ok()
                    .await?;
            }
        }
        Ok(kept)
    }

    /// What the worktree holds that is not committed (tracked files
    /// changed, untracked ones that are not ignored).
    pub(super) async fn dirty_files(&self, worktree: &Worktree) -> Result<Vec<String>, GitError> {
        let out = self
            .at(&worktree.path)
            .args([
                "status",
                "--porcelain=v1",
                "-z",
                "--untracked-files=all",
                "--no-renames",
            ])
            .ok()
            .await?;
        Ok(status_files(&out))
    }
}

/// `error`, with what git said (`why`) after it.
fn because(error: GitError, why: GitError) -> GitError {
    match error {
        GitError::NotARepository(what) => GitError::NotARepository(format!("{what}: {why}")),
        other => other,
    }
}
