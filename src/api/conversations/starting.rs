//! Starting a conversation: the checks every start makes
//! ([`NewConversation`]), and taking over an agent session begun elsewhere
//! (`adopt`).

use super::super::state::AppState;
use crate::auth::{Caller, Limited};
use crate::error::{Error, Result};
use crate::limits;
use crate::model::{self, Conversation, ConversationStatus};
use crate::session::Origin;
use crate::workspace::cwd::conversation_cwd;

/// An agent session id a request names, in characters.
pub(super) const SESSION_ID_MAX_CHARS: usize = 256;

/// A new conversation's profile, directory and title, checked as every
/// start checks them.
pub(super) struct NewConversation {
    pub(super) profile: crate::config::AgentProfile,
    cwd: std::path::PathBuf,
    title: Option<String>,
}

impl NewConversation {
    /// The agent's name (422, 404), the title (422) and the `cwd` (422,
    /// 403, 404), as [`conversation_cwd`] takes it.
    pub(super) fn check(
        state: &AppState,
        caller: &Caller,
        agent: &str,
        title: Option<String>,
        cwd: Option<&str>,
    ) -> Result<NewConversation> {
        limits::agent_name("agent", agent)?;
        if let Some(title) = &title {
            limits::line("title", title, limits::TITLE_MAX_CHARS)?;
        }
        let profile = state
            .config()
            .agent(agent)
            .ok_or_else(|| Error::NotFound(format!("no agent named {agent:?}")))?;
        let cwd = conversation_cwd(&profile, cwd, Some(&caller.user))?;
        Ok(NewConversation {
            profile,
            cwd,
            title,
        })
    }

    /// The conversation, not started yet.
    pub(super) fn conversation(&self, caller: &Caller) -> Conversation {
        let now = model::now();
        Conversation {
            id: model::new_id(),
            agent: self.profile.name.clone(),
            title: self.title.clone(),
            cwd: self.cwd.to_string_lossy().into_owned(),
            status: ConversationStatus::Starting,
            acp_session_id: None,
            last_seq: 0,
            created_at: now,
            updated_at: now,
            owner: Some(caller.user.clone()),
            state: Default::default(),
            node_id: None,
            queue: Vec::new(),
            forked_from: None,
            adopted_session: None,
        }
    }
}

/// A conversation of `caller`'s that takes over the agent session `adopt`
/// (see [`Origin::Adopt`]): 409 `already_held` where an open conversation
/// holds it (checked here, and by the database's unique index when two
/// race).
pub(super) async fn adopt(
    state: &AppState,
    caller: &Caller,
    agent: &str,
    title: Option<String>,
    cwd: Option<&str>,
    adopt: String,
) -> Result<Conversation> {
    limits::id("adopt", &adopt, SESSION_ID_MAX_CHARS)?;
    let new = NewConversation::check(state, caller, agent, title, cwd)?;
    let store = state.store();
    let theirs = store
        .sessions_of_others(
            &new.profile.name,
            &caller.user,
            std::slice::from_ref(&adopt),
        )
        .await?;
    if !theirs.is_empty() {
        // Another user's: as unknown as a session the agent does not have.
        return Err(Error::NotFound(format!(
            "the agent has no session {adopt:?} for this user"
        )));
    }
    let held = store
        .session_holders(
            &new.profile.name,
            Some(&caller.user),
            std::slice::from_ref(&adopt),
        )
        .await?;
    if let Some((_, holder)) = held.first() {
        return Err(Error::conflict(
            "already_held",
            format!("the agent session {adopt:?} is held by conversation {holder} already"),
        ));
    }
    state.auth().check_rate(caller, Limited::Conversation)?;
    let mut conversation = new.conversation(caller);
    conversation.adopted_session = Some(adopt);
    state
        .sessions()
        .begin(new.profile, conversation, Vec::new(), Origin::Adopt)
        .await
}
