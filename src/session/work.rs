//! What a person asks of a conversation's worktree (commit, land,
//! discard) and what it did, as the event that records it; and what a
//! turn changed (see [`crate::git`]). Run by [`super::worktree`] where
//! nothing else runs on the conversation.

use serde::{Deserialize, Serialize};

use crate::config::AgentProfile;
use crate::error::{Error, Result};
use crate::git::{Git, Source};
use crate::model::{
    ChangeTotals, ChangedFile, ChangesCommitted, ChangesDiscarded, ChangesLanded, ChangesUpdated,
    Conversation, ConversationStatus, EventBody, LandStrategy, Signature, Worktree,
};

/// Files an after-turn `changes_updated` event lists.
const EVENT_FILES: usize = 100;

/// What a person asks of a worktree.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum ChangeOp {
    /// Commit everything, as `author` (the gateway commits).
    Commit { message: String, author: Signature },
    /// Bring the branch into its base.
    Land {
        strategy: LandStrategy,
        message: Option<String>,
        author: Signature,
    },
    /// Reset the worktree to its last commit.
    Discard,
}

/// What it did: the event that records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "done", rename_all = "snake_case")]
pub enum ChangeDone {
    Committed(ChangesCommitted),
    Landed(ChangesLanded),
    Discarded(ChangesDiscarded),
}

impl ChangeDone {
    pub fn totals(&self) -> ChangeTotals {
        match self {
            ChangeDone::Committed(c) => c.totals,
            ChangeDone::Landed(l) => l.totals,
            ChangeDone::Discarded(d) => d.totals,
        }
    }

    pub fn event(&self) -> EventBody {
        match self.clone() {
            ChangeDone::Committed(c) => EventBody::ChangesCommitted(c),
            ChangeDone::Landed(l) => EventBody::ChangesLanded(l),
            ChangeDone::Discarded(d) => EventBody::ChangesDiscarded(d),
        }
    }
}

/// git as a profile's conversations run it: as the agent's user.
pub fn git_of(program: &std::path::Path, profile: Option<&AgentProfile>) -> Git {
    let user = profile
        .and_then(|p| p.user.as_deref())
        .and_then(|name| crate::sys::lookup_user(name).ok());
    Git::new(program).run_as(user)
}

/// Where a conversation's changes are: its worktree while it is open, its
/// branch alone once it is closed (its worktree is removed then).
pub fn source_of(conversation: &Conversation) -> Source {
    match conversation.status {
        ConversationStatus::Closed => Source::Branch,
        _ => Source::Worktree,
    }
}

/// Carries `op` out in `worktree` (by `by`): what it did, with how much
/// differs from the base afterwards.
pub async fn carry_out(
    git: &Git,
    worktree: &Worktree,
    source: Source,
    op: &ChangeOp,
    by: &str,
) -> Result<ChangeDone> {
    let committer = Signature::gateway();
    let done = match op {
        ChangeOp::Commit { message, author } => {
            let commit = git.commit(worktree, message, author, &committer).await?;
            let totals = totals(git, worktree, source).await;
            ChangeDone::Committed(ChangesCommitted {
                commit,
                by: by.to_owned(),
                totals,
            })
        }
        ChangeOp::Land {
            strategy,
            message,
            author,
        } => {
            let landed = git
                .land(
                    worktree,
                    source,
                    *strategy,
                    message.as_deref(),
                    author,
                    &committer,
                )
                .await?;
            let totals = totals(git, worktree, source).await;
            ChangeDone::Landed(ChangesLanded {
                strategy: landed.strategy,
                base: worktree.base.clone(),
                from: landed.from,
                to: landed.to,
                working_tree: landed
                    .working_tree
                    .map(|t| t.to_string_lossy().into_owned()),
                by: by.to_owned(),
                totals,
            })
        }
        ChangeOp::Discard => {
            let head = git.discard(worktree).await?;
            let totals = totals(git, worktree, source).await;
            ChangeDone::Discarded(ChangesDiscarded {
                head,
                by: by.to_owned(),
                totals,
            })
        }
    };
    Ok(done)
}

/// How much differs now (nothing known: zero, and the log says why).
async fn totals(git: &Git, worktree: &Worktree, source: Source) -> ChangeTotals {
    match git.changes(worktree, source).await {
        Ok(changes) => changes.totals,
        Err(e) => {
            tracing::warn!(worktree = %worktree.path, error = %e, "could not read the worktree's changes");
            ChangeTotals::default()
        }
    }
}

/// The `changes_updated` event after a turn (`None`: git could not tell;
/// logged).
pub async fn summary(git: &Git, worktree: &Worktree) -> Option<ChangesUpdated> {
    match git.changes(worktree, Source::Worktree).await {
        Ok(changes) => {
            let files: Vec<ChangedFile> = changes.files.into_iter().take(EVENT_FILES).collect();
            Some(ChangesUpdated {
                totals: changes.totals,
                files,
            })
        }
        Err(e) => {
            tracing::warn!(worktree = %worktree.path, error = %e, "could not read the worktree's changes after the turn");
            None
        }
    }
}

/// 409 `no_worktree`.
pub fn no_worktree() -> Error {
    Error::conflict(
        "no_worktree",
        "the conversation was not made on a repository: it has no worktree",
    )
}
