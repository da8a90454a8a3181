//! A conversation's worktree and what changed in it (see [`crate::git`]):
//! the objects the `…/changes` routes show and the events that record them.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The git worktree a conversation made on a repository: its `cwd`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Worktree {
    /// The repository as the request or profile named it, resolved: its
    /// top directory (a bare repository's own directory).
    pub repository: String,
    /// The branch the work started from and lands on.
    #[schema(example = "main")]
    pub base: String,
    /// The conversation's own branch (`acp/<short id>` unless the request
    /// named one).
    #[schema(example = "acp/5f1c2a9e")]
    pub branch: String,
    /// The worktree's directory (`<state_dir>/worktrees/<conversation>`):
    /// the conversation's `cwd` while it is open; removed when it is
    /// closed (its branch stays).
    pub path: String,
    /// The worktree's own git directory (`<common>/worktrees/<name>`).
    pub git_dir: String,
    /// The repository's common git directory (its `.git`).
    pub common_dir: String,
}

/// How a file differs from the base.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FileStatus {
    /// New (untracked files included).
    Added,
    Modified,
    Deleted,
    /// Moved, perhaps changed too (`old_path` says from where).
    Renamed,
    /// Copied from `old_path`.
    Copied,
    /// Its kind changed (a file became a symlink, say).
    TypeChanged,
}

/// One file that differs from the base.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ChangedFile {
    /// Relative to the worktree, `/`-separated.
    pub path: String,
    /// Where a renamed or copied file came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub old_path: Option<String>,
    pub status: FileStatus,
    /// Lines added (0 for a binary file).
    pub added: u64,
    /// Lines removed (0 for a binary file).
    pub removed: u64,
    /// A binary file: named, its diff not shown.
    pub binary: bool,
}

/// A commit on the conversation's branch that the base does not have.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BranchCommit {
    /// Its full hash.
    pub id: String,
    /// The first line of its message.
    pub summary: String,
    /// Its author's name.
    pub author: String,
    pub authored_at: DateTime<Utc>,
}

/// How much differs from the base, in all.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ChangeTotals {
    /// Files that differ.
    pub files: u64,
    /// Lines added.
    pub added: u64,
    /// Lines removed.
    pub removed: u64,
    /// Commits on the branch that the base does not have.
    pub commits: u64,
}

/// What differs between the base and the worktree: committed, uncommitted
/// and untracked (but ignored) files, against the merge base of the base
/// and the branch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Changes {
    #[schema(example = "main")]
    pub base: String,
    pub branch: String,
    /// The merge base the files are compared with.
    pub merge_base: String,
    /// The branch's newest commit.
    pub head: String,
    pub totals: ChangeTotals,
    /// The files, by path (at most 1000; `truncated` says there are more,
    /// `totals` counts them all).
    pub files: Vec<ChangedFile>,
    /// More files differ than `files` lists.
    pub truncated: bool,
    /// The branch's commits that the base does not have, newest first (at
    /// most 200).
    pub commits: Vec<BranchCommit>,
    /// Files the worktree has that are not committed (the worktree is
    /// gone once the conversation is closed: then none).
    pub uncommitted: u64,
}

/// How a branch is brought into its base.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum LandStrategy {
    /// A merge commit on the base with the branch as its second parent.
    Merge,
    /// One new commit on the base with all of the branch's changes.
    Squash,
    /// The branch's commits replayed onto the base, which then
    /// fast-forwards to them.
    Rebase,
}

impl LandStrategy {
    pub fn as_str(self) -> &'static str {
        match self {
            LandStrategy::Merge => "merge",
            LandStrategy::Squash => "squash",
            LandStrategy::Rebase => "rebase",
        }
    }
}

/// `changes_updated`: after a turn, what differs from the base now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ChangesUpdated {
    pub totals: ChangeTotals,
    /// The files (at most 100; `totals.files` counts them all).
    pub files: Vec<ChangedFile>,
}

/// `changes_committed`: a person committed what the worktree held.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ChangesCommitted {
    pub commit: BranchCommit,
    /// Who (`user:<name>`).
    pub by: String,
    pub totals: ChangeTotals,
}

/// `changes_landed`: a person brought the branch into its base.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ChangesLanded {
    pub strategy: LandStrategy,
    pub base: String,
    /// The base's commit before.
    pub from: String,
    /// The base's commit now.
    pub to: String,
    /// The working tree where the base is checked out and which now shows
    /// the result; `null`: the base is checked out nowhere, its branch was
    /// moved.
    pub working_tree: Option<String>,
    pub by: String,
    pub totals: ChangeTotals,
}

/// `changes_discarded`: a person threw away what the worktree held since
/// its last commit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ChangesDiscarded {
    /// The commit the worktree is back at.
    pub head: String,
    pub by: String,
    pub totals: ChangeTotals,
}

/// One commit's author or committer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Signature {
    pub name: String,
    pub email: String,
}

impl Signature {
    /// The gateway, as a commit's committer.
    pub fn gateway() -> Signature {
        Signature {
            name: "acp-gateway".to_owned(),
            email: "acp-gateway@localhost".to_owned(),
        }
    }
}
