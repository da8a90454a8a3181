//! Git, and nothing of sessions: a conversation's worktree made on a
//! repository, what differs in it from its base, and committing, landing
//! and discarding that work. The `changes` routes and the session call
//! this; the box is told what to grant from [`box_paths`].
//!
//! Everything runs git itself (the CLI, [`Git::program`]): its porcelain
//! for what a person would do in a working tree (`worktree add`, `merge
//! --ff-only`, `rebase`, `reset`), its plumbing where nothing may change
//! until the result is known (`merge-tree`, `commit-tree`, `update-ref`
//! with the old value), and its machine-readable output (`-z`). Git's
//! on-disk formats are never read here.

mod to_error;
mod current;

use std::path::{Path, PathBuf};

use crate::model::{
    BranchCommit, Changes, LandStrategy, Signature, Worktree,
};
use crate::sys::SystemUser;

/// How git is run: which program, and as whom.
#[derive(Debug, Clone)]
pub struct Git {
    /// The git program (the configuration's `git`, default `git` on `PATH`).
    pub program: PathBuf,
    /// The user git runs as when the gateway runs as root (the agent's):
    /// what it writes in a worktree is theirs.
    pub user: Option<SystemUser>,
}

/// Why git did not do what was asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GitError {
    /// 422: the path is not a git repository.
    #[error("{0}")]
    NotARepository(String),
    /// 422: no such base branch (or commit).
    #[error("{0}")]
    UnknownBase(String),
    /// 422: not a valid branch name, or one the box cannot confine.
    #[error("{0}")]
    InvalidBranch(String),
    /// 409 `branch_exists`.
    #[error("{0}")]
    BranchExists(String),
    /// 409 `uncommitted_changes`: the tree named has uncommitted changes
    /// (its files, relative to it).
    #[error("{tree} has uncommitted changes: {}", files.join(", "))]
    Dirty { tree: String, files: Vec<String> },
    /// 409 `conflict`: the branch does not land cleanly (these files).
    #[error("the branch conflicts with its base in {}", files.join(", "))]
    Conflict { files: Vec<String> },
    /// 409 `nothing_to_commit`.
    #[error("nothing to commit: the worktree is as its last commit")]
    NothingToCommit,
    /// 409 `nothing_to_land`: the base has everything the branch has.
    #[error("nothing to land: {0}")]
    NothingToLand(String),
    /// 409 `repository_busy`: another land, commit or discard on this
    /// repository runs (or git's own lock is held); nothing changed.
    #[error("{0}")]
    Busy(String),
    /// 409 `base_moved`: the base changed while landing; nothing changed.
    #[error("{0}")]
    BaseMoved(String),
    /// 400: a path that leads out of the worktree.
    #[error("{0}")]
    BadPath(String),
    /// 502: the repository or worktree is not there (on this node) or git
    /// failed on it (locked or broken worktree metadata, say); says which
    /// and git's own words.
    #[error("{0}")]
    Failed(String),
}

/// Where a worktree's changes are read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The worktree, uncommitted and untracked files included.
    Worktree,
    /// The branch alone (the worktree is gone: the conversation is closed).
    Branch,
}

/// A unified diff, cut at a number of bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diff {
    pub text: String,
    /// More followed (cut at a line's end at or before the limit).
    pub truncated: bool,
}

/// What a land did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Landed {
    pub strategy: LandStrategy,
    /// The base's commit before and after.
    pub from: String,
    pub to: String,
    /// Where the base is checked out (that tree shows the result); `None`:
    /// nowhere, its branch was moved.
    pub working_tree: Option<PathBuf>,
}

/// What the agent's box must grant for git to work in a worktree.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BoxPaths {
    pub read_write: Vec<PathBuf>,
    pub read_only: Vec<PathBuf>,
}

impl Git {
    pub fn new(program: impl Into<PathBuf>) -> Git {
        Git {
            program: program.into(),
            user: None,
        }
    }

    /// The same, run as `user` when the gateway runs as root.
    pub fn run_as(&self, user: Option<SystemUser>) -> Git {
        Git {
            program: self.program.clone(),
            user,
        }
    }

    /// Makes a worktree at `path` on a new branch `branch` from `base` in
    /// `repository`.
    pub async fn add_worktree(
        &self,
        repository: &Path,
        base: &str,
        branch: &str,
        path: &Path,
    ) -> Result<Worktree, GitError> {
        let _ = (repository, base, branch, path);
        todo!()
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
        let _ = (worktree, discard_branch, committer);
        todo!()
    }

    /// What differs from the base.
    pub async fn changes(&self, worktree: &Worktree, source: Source) -> Result<Changes, GitError> {
        let _ = (worktree, source);
        todo!()
    }

    /// The unified diff against the merge base, of one file or all.
    pub async fn diff(
        &self,
        worktree: &Worktree,
        source: Source,
        path: Option<&str>,
        max_bytes: usize,
    ) -> Result<Diff, GitError> {
        let _ = (worktree, source, path, max_bytes);
        todo!()
    }

    /// Commits everything in the worktree.
    pub async fn commit(
        &self,
        worktree: &Worktree,
        message: &str,
        author: &Signature,
        committer: &Signature,
    ) -> Result<BranchCommit, GitError> {
        let _ = (worktree, message, author, committer);
        todo!()
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
        let _ = (worktree, source, strategy, message, author, committer);
        todo!()
    }

    /// Resets the worktree to its last commit; the commit's id.
    pub async fn discard(&self, worktree: &Worktree) -> Result<String, GitError> {
        let _ = worktree;
        todo!()
    }
}

/// What a worktree's box grants (pure).
pub fn box_paths(worktree: &Worktree) -> BoxPaths {
    let _ = worktree;
    BoxPaths::default()
}

/// Makes the directories [`box_paths`] names that git may have removed
/// (an emptied ref folder), so that the box can be made.
pub fn prepare_box(worktree: &Worktree) -> std::io::Result<()> {
    let _ = worktree;
    Ok(())
}
