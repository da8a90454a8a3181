//! An agent's own sessions, listed for a user (`session/list`): the agent
//! is started as a conversation of that user's would start it (its user,
//! the user's home for it, its box), only to initialize and list, and ended
//! at once. It counts against the agent limits while it runs.

use std::path::Path;

use crate::acp::agent::AgentProcess;
use crate::acp::client::sessions::SessionPage;
use crate::acp::client::AgentSession;
use crate::acp::rpc::{RpcConfig, RpcPeer};
use crate::config::AgentProfile;
use crate::error::{Error, Result};
use crate::model::{self, Conversation, ConversationStatus};

use super::spawn::{agent_box_of, TERMINATE_GRACE};
use super::Sessions;

impl Sessions {
    /// One page of the sessions the agent of `profile` keeps for `owner`
    /// (started in `cwd`; `filter`: only those of that directory), from
    /// `cursor` (the agent's). 409 `not_supported` where the agent does not
    /// list its sessions.
    pub async fn list_agent_sessions(
        &self,
        profile: &AgentProfile,
        owner: &str,
        cwd: &Path,
        filter: Option<&str>,
        cursor: Option<&str>,
    ) -> Result<SessionPage> {
        let profile = crate::sandbox::profile::for_user(profile, Some(owner));
        // What a conversation would be, to start its agent as it would be
        // started; never stored.
        let now = model::now();
        let probe = Conversation {
            id: model::new_id(),
            agent: profile.name.clone(),
            title: None,
            cwd: cwd.to_string_lossy().into_owned(),
            status: ConversationStatus::Starting,
            acp_session_id: None,
            last_seq: 0,
            created_at: now,
            updated_at: now,
            owner: Some(owner.to_owned()),
            state: Default::default(),
            node_id: None,
            queue: Vec::new(),
            forked_from: None,
            adopted_session: None,
            worktree: None,
            changes: None,
            spend: Vec::new(),
            sharing: Default::default(),
        };
        let _slot = self.admit(Some(owner)).await?;
        let agent_box = agent_box_of(&profile, &probe, &self.inner.setup.homes)?;
        let started = match profile.url {
            Some(_) => AgentProcess::connect(&profile, self.inner.setup.max_line_bytes).await,
            // No shim, no record: it lives for one request.
            None => AgentProcess::spawn(&profile, cwd, probe.id, None, &agent_box).await,
        };
        let (mut process, pipes) = started.map_err(|e| Error::AgentFailed(format!("{e:#}")))?;
        let (peer, mut incoming) = RpcPeer::spawn(
            pipes.stdout,
            pipes.stdin,
            RpcConfig {
                max_line_bytes: self.inner.setup.max_line_bytes,
                label: format!("{} sessions", profile.name),
                start_position: pipes.output_from,
                first_request_id: pipes.first_request_id,
                ..RpcConfig::default()
            },
        );
        let listed = AgentSession::list_sessions(
            peer,
            &mut process,
            &profile,
            filter,
            cursor,
            &mut incoming,
        )
        .await;
        process.terminate(TERMINATE_GRACE).await;
        Ok(listed?)
    }
}
