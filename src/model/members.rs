//! A conversation shared with other users: a member and their role, what a
//! conversation shows of its sharing, and the events that record each
//! change of membership (`member_added`, `member_changed`,
//! `member_removed`), with who made it.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// What a member of a conversation may do there, each role all the one
/// before it may: a `viewer` sees everything (REST, WebSocket, search); an
/// `approver` also answers its permission requests and questions; a
/// `collaborator` also prompts, cancels, edits the queue, changes mode and
/// options, and commits its changes.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum MemberRole {
    Viewer,
    Approver,
    Collaborator,
}

impl MemberRole {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Viewer => "viewer",
            Self::Approver => "approver",
            Self::Collaborator => "collaborator",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "viewer" => Self::Viewer,
            "approver" => Self::Approver,
            "collaborator" => Self::Collaborator,
            _ => return None,
        })
    }

    /// Whether this role answers permission requests and questions (and so
    /// gets them in its inbox and notifications).
    pub fn answers(self) -> bool {
        self >= Self::Approver
    }
}

/// A user a conversation is shared with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Member {
    /// The member's user name.
    pub user: String,
    pub role: MemberRole,
    /// Who shared it with them (`user:<name>`).
    pub added_by: String,
    pub added_at: DateTime<Utc>,
}

/// What a conversation shows of its sharing, for the one who reads it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Sharing {
    /// How many users it is shared with.
    pub members: i64,
    /// The reader's role, where it is shared with them.
    pub role: Option<MemberRole>,
}

/// `member_added`, `member_changed` and `member_removed`: the conversation
/// was shared with `user`, their role changed, or they were removed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(as = MemberChangeData)]
pub struct MemberChange {
    /// The member.
    pub user: String,
    /// Their role now (`member_removed`: the role they had).
    pub role: MemberRole,
    /// Who made the change (`user:<name>`).
    pub by: String,
}

/// What a person asks of a conversation's members. Who may ask, and for
/// whom, the API checked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum MemberOp {
    /// Share it with `user` (409 `already_member` where it is).
    Add { user: String, role: MemberRole },
    /// Change a member's role (404 where `user` is none).
    Change { user: String, role: MemberRole },
    /// Remove a member (404 where `user` is none).
    Remove { user: String },
}

impl MemberOp {
    /// The member it is about.
    pub fn user(&self) -> &str {
        match self {
            MemberOp::Add { user, .. }
            | MemberOp::Change { user, .. }
            | MemberOp::Remove { user } => user,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_are_ordered_and_named_in_snake_case() {
        assert!(MemberRole::Viewer < MemberRole::Approver);
        assert!(MemberRole::Approver < MemberRole::Collaborator);
        for role in [
            MemberRole::Viewer,
            MemberRole::Approver,
            MemberRole::Collaborator,
        ] {
            let json = serde_json::to_value(role).unwrap();
            assert_eq!(json, role.as_str());
            assert_eq!(MemberRole::parse(role.as_str()), Some(role));
        }
        assert!(!MemberRole::Viewer.answers() && MemberRole::Approver.answers());
        assert_eq!(MemberRole::parse("owner"), None);
    }
}
