//! A change of who a conversation is shared with (see
//! [`crate::model::members`]): what a person asks ([`MemberOp`], in the model) and how the
//! conversation's one writer carries it out, the membership stored and the
//! `member_*` event that records it committed in its log (so it is ordered
//! with the conversation's events and relayed to other nodes). Run by the
//! live session (`task.rs`), or by `sharing.rs` where none runs.

use super::journal::Journal;
use crate::error::{Error, Result};
use crate::model::{self, EventBody, Member, MemberChange, MemberOp};

/// Carries out `op` by `by` (`user:<name>`) with the conversation's
/// journal: the membership is stored first (a removal takes effect at
/// once), then its event committed. The member as they are now (removed:
/// as they were).
pub async fn apply(journal: &mut Journal, op: MemberOp, by: &str) -> Result<Member> {
    let id = journal.conversation_id();
    let user = op.user().to_owned();
    let existing = journal.store().get_member(id, &user).await?;
    let no_member = || Error::NotFound(format!("{user:?} is not a member of conversation {id}"));
    let (member, event): (Member, fn(MemberChange) -> EventBody) = match op {
        MemberOp::Add { role, .. } => {
            if existing.is_some() {
                return Err(Error::conflict(
                    "already_member",
                    format!(
                        "the conversation is shared with {user:?} already (PATCH changes a role)"
                    ),
                ));
            }
            let member = Member {
                user: user.clone(),
                role,
                added_by: by.to_owned(),
                added_at: model::now(),
            };
            journal.store().put_member(id, &member).await?;
            (member, EventBody::MemberAdded)
        }
        MemberOp::Change { role, .. } => {
            let mut member = existing.ok_or_else(no_member)?;
            if member.role == role {
                return Ok(member);
            }
            member.role = role;
            journal.store().put_member(id, &member).await?;
            (member, EventBody::MemberChanged)
        }
        MemberOp::Remove { .. } => {
            let member = existing.ok_or_else(no_member)?;
            journal.store().delete_member(id, &user).await?;
            (member, EventBody::MemberRemoved)
        }
    };
    journal.append(event(MemberChange {
        user,
        role: member.role,
        by: by.to_owned(),
    }));
    journal.flush().await?;
    Ok(member)
}
