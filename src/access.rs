//! What a caller may do in a conversation: the one place that decides.
//!
//! [`Access`] is ordered: a `viewer` sees everything of the conversation
//! (REST, WebSocket, search); an `approver` also answers its permission
//! requests and questions; a `collaborator` also prompts, cancels, edits
//! the queue, changes mode and options, and commits its changes; its
//! `owner` (and any operator) also closes, shares, forks and lands it,
//! discards its changes and forgets its rules. It comes from the caller,
//! the conversation's owner and the caller's membership (see
//! [`crate::model::members`]); one with none sees nothing of it ("not
//! found").

use uuid::Uuid;

use crate::auth::Caller;
use crate::error::{Error, Result};
use crate::model::MemberRole;
use crate::store::Store;

/// How far a caller may act in a conversation (see the module).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Access {
    Viewer,
    Approver,
    Collaborator,
    /// Its owner, or an operator.
    Owner,
}

impl Access {
    /// The access of `caller` to a conversation of `owner`'s in which they
    /// hold `role` (if they are a member): `None` where they have none.
    pub fn of(caller: &Caller, owner: Option<&str>, role: Option<MemberRole>) -> Option<Access> {
        if caller.can_see(owner) {
            return Some(Access::Owner);
        }
        role.map(Access::from)
    }

    /// The access of `caller` to the conversation `id` of `owner`'s,
    /// looking up their membership where they neither own it nor operate.
    pub async fn find(
        store: &dyn Store,
        caller: &Caller,
        id: Uuid,
        owner: Option<&str>,
    ) -> Result<Option<Access>> {
        if caller.can_see(owner) {
            return Ok(Some(Access::Owner));
        }
        let member = store.get_member(id, &caller.user).await?;
        Ok(member.map(|m| Access::from(m.role)))
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Access::Viewer => "viewer",
            Access::Approver => "approver",
            Access::Collaborator => "collaborator",
            Access::Owner => "owner",
        }
    }

    /// 403 `forbidden` unless this access reaches `needed`, naming the
    /// role needed for `what` (e.g. "prompt").
    pub fn require(self, needed: Access, what: &str) -> Result<()> {
        if self >= needed {
            return Ok(());
        }
        let who = match needed {
            Access::Owner => "the conversation's owner or an operator".to_owned(),
            other => format!("a member with the role {} or more", other.as_str()),
        };
        Err(Error::Forbidden(format!(
            "only {who} may {what} (your role here is {})",
            self.as_str()
        )))
    }
}

impl From<MemberRole> for Access {
    fn from(role: MemberRole) -> Access {
        match role {
            MemberRole::Viewer => Access::Viewer,
            MemberRole::Approver => Access::Approver,
            MemberRole::Collaborator => Access::Collaborator,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Role;

    fn caller(user: &str, role: Role) -> Caller {
        Caller {
            user: user.into(),
            role,
            token_id: None,
        }
    }

    #[test]
    fn owners_and_operators_own_members_get_their_role_others_nothing() {
        let bob = caller("bob", Role::User);
        assert_eq!(Access::of(&bob, Some("bob"), None), Some(Access::Owner));
        assert_eq!(
            Access::of(&caller("op", Role::Operator), Some("bob"), None),
            Some(Access::Owner)
        );
        assert_eq!(
            Access::of(&bob, Some("ann"), Some(MemberRole::Approver)),
            Some(Access::Approver)
        );
        assert_eq!(Access::of(&bob, Some("ann"), None), None);
    }

    #[test]
    fn a_refusal_names_the_role_needed() {
        assert!(Access::Collaborator
            .require(Access::Approver, "answer")
            .is_ok());
        let refused = Access::Viewer
            .require(Access::Collaborator, "prompt")
            .unwrap_err();
        assert!(
            matches!(&refused, Error::Forbidden(m) if m.contains("collaborator") && m.contains("viewer"))
        );
        let refused = Access::Collaborator
            .require(Access::Owner, "share it")
            .unwrap_err();
        assert!(matches!(&refused, Error::Forbidden(m) if m.contains("owner")));
    }
}
