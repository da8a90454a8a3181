//! Sharing a conversation: a change of its members made by its one writer,
//! as [`super::worktree`] does a change of its worktree.

use super::command::{Command, Handle};
use super::members::apply;
use super::Sessions;
use crate::error::Result;
use crate::model::{Conversation, Member, MemberOp};

impl Sessions {
    /// A person's change of the conversation's members (see
    /// [`super::members`]): by its live session, here or on the node that
    /// runs it, else here with no agent running; recorded as a `member_*`
    /// event. The member as they are now (removed: as they were).
    pub async fn change_members(
        &self,
        conversation: &Conversation,
        op: MemberOp,
        by: String,
    ) -> Result<Member> {
        let remote = Command::Members {
            op: op.clone(),
            by: by.clone(),
            reply: Default::default(),
        };
        let session = |session: Handle| {
            let (op, by) = (op.clone(), by.clone());
            async move { session.change_members(op, by).await }
        };
        self.unattended(conversation, session, remote, |journal, _stored| {
            let (op, by) = (op.clone(), by.clone());
            Box::pin(async move { apply(journal, op, &by).await })
        })
        .await
    }
}
