//! A person's commit, land or discard in a conversation's worktree: run
//! where nothing else runs on the conversation (its live session between
//! turns, or under the claim an unattended command takes), recorded as an
//! event with who did it, and how much then differs from the base
//! recorded for the list; and the worktree's end when it is closed.

use super::command::{Command, Handle};
use super::work::{carry_out, git_of, no_worktree, source_of, ChangeDone, ChangeOp};
use super::Sessions;
use crate::error::Result;
use crate::git::Git;
use crate::model::{Conversation, Signature};

impl Sessions {
    /// A person's commit, land or discard in the conversation's worktree
    /// (409 `no_worktree` where it has none): by its live session between
    /// turns (409 `turn_in_progress` during one), here or on the node that
    /// runs it, else here with no agent running; recorded as an event.
    pub async fn change_work(
        &self,
        conversation: &Conversation,
        op: ChangeOp,
        by: String,
    ) -> Result<ChangeDone> {
        let Some(worktree) = conversation.worktree.clone() else {
            return Err(no_worktree());
        };
        let remote = Command::Changes {
            op: op.clone(),
            by: by.clone(),
            reply: Default::default(),
        };
        let session = |session: Handle| {
            let (op, by) = (op.clone(), by.clone());
            async move { session.change_work(op, by).await }
        };
        let git = self.git_for(conversation);
        self.unattended(conversation, session, remote, |journal, stored| {
            let (op, by, git, worktree) = (op.clone(), by.clone(), git.clone(), worktree.clone());
            Box::pin(async move {
                let done = carry_out(&git, &worktree, source_of(&stored), &op, &by).await?;
                journal.append(done.event());
                journal.flush().await?;
                journal.record_change_totals(&done.totals()).await;
                Ok(done)
            })
        })
        .await
    }

    /// git as this conversation's agent runs it.
    pub(super) fn git_for(&self, conversation: &Conversation) -> Git {
        git_of(
            &self.inner.setup.git,
            self.inner.profiles.get(&conversation.agent),
        )
    }

    /// At close: the worktree is removed (what it held uncommitted is
    /// committed on its branch first: nothing is lost); its branch stays
    /// unless `discard_branch`.
    pub async fn remove_worktree(&self, conversation: &Conversation, discard_branch: bool) {
        let Some(worktree) = &conversation.worktree else {
            return;
        };
        let git = self.git_for(conversation);
        match git
            .remove_worktree(worktree, discard_branch, &Signature::gateway())
            .await
        {
            Ok(Some(kept)) => {
                tracing::info!(conversation_id = %conversation.id, commit = %kept, "uncommitted work kept on the branch at close")
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(conversation_id = %conversation.id, error = %e, "could not remove the worktree")
            }
        }
    }
}
