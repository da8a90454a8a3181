//! Starting a conversation: the checks every start makes
//! ([`NewConversation`]), and taking over an agent session begun elsewhere
//! (`adopt`).

use super::super::state::AppState;
use super::on_repository::make_worktree;
pub(crate) use super::on_repository::OnRepository;
use crate::auth::{Caller, Limited};
use crate::error::{Error, Result};
use crate::limits;
use crate::model::{self, Conversation, ConversationStatus};
use crate::session::Origin;
use crate::workspace::cwd::{conversation_cwd, conversation_repository};

/// An agent session id a request names, in characters.
pub(super) const SESSION_ID_MAX_CHARS: usize = 256;

/// A new conversation's profile, directory and title, checked as every
/// start checks them.
pub(super) struct NewConversation {
    pub(super) profile: crate::config::AgentProfile,
    cwd: std::path::PathBuf,
    title: Option<String>,
    /// The repository it is made on (its worktree is its `cwd`), if any.
    repository: Option<std::path::PathBuf>,
    on: OnRepository,
}

impl NewConversation {
    /// The agent's name (422, 404), the title (422), and the `cwd` (422,
    /// 403, 404) as [`conversation_cwd`] takes it or the repository (422,
    /// 403) as [`conversation_repository`] does: a request's `cwd` wins
    /// over its profile's `repository`; a request with both is 422.
    pub(super) fn check(
        state: &AppState,
        caller: &Caller,
        agent: &str,
        title: Option<String>,
        cwd: Option<&str>,
        repository: Option<&str>,
        on: OnRepository,
    ) -> Result<NewConversation> {
        limits::agent_name("agent", agent)?;
        if let Some(title) = &title {
            limits::line("title", title, limits::TITLE_MAX_CHARS)?;
        }
        on.check()?;
        if cwd.is_some() && repository.is_some() {
            return Err(Error::Unprocessable(
                "a conversation is made in a cwd or on a repository, not both".to_owned(),
            ));
        }
        let profile = state
            .config()
            .agent(agent)
            .ok_or_else(|| Error::NotFound(format!("no agent named {agent:?}")))?;
        let user = Some(caller.user.as_str());
        let repository = match cwd {
            Some(_) => None,
            None => conversation_repository(&profile, repository, user)?,
        };
        if repository.is_some() && profile.url.is_some() {
            return Err(Error::Unprocessable(format!(
                "agent {agent:?} runs on another machine (url): its conversations cannot work in a \
                 worktree on this one"
            )));
        }
        if repository.is_none() && (on.base.is_some() || on.branch.is_some()) {
            return Err(Error::Unprocessable(
                "base and branch are for a conversation made on a repository".to_owned(),
            ));
        }
        let cwd = match &repository {
            // Its worktree, once made.
            Some(repository) => repository.clone(),
            None => conversation_cwd(&profile, cwd, user)?,
        };
        Ok(NewConversation {
            profile,
            cwd,
            title,
            repository,
            on,
        })
    }

    /// Where it is made on a repository: its worktree, made now (and its
    /// `cwd`).
    pub(super) async fn make_worktree(
        &self,
        state: &AppState,
        conversation: &mut Conversation,
    ) -> Result<()> {
        match &self.repository {
            Some(repository) => {
                make_worktree(state, &self.profile, conversation, repository, &self.on).await
            }
            None => Ok(()),
        }
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
            worktree: None,
            changes: None,
            spend: Vec::new(),
            sharing: Default::default(),
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
    let new = NewConversation::check(
        state,
        caller,
        agent,
        title,
        cwd,
        None,
        OnRepository::default(),
    )?;
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
