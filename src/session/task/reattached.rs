//! A session task for an agent an earlier run of the gateway left under its
//! shim: the connection starts where that run's last commit left the
//! agent's output (what came after is read again, exactly once), the
//! running turn waits for the answer to the `session/prompt` that run sent,
//! and the requests that wait for a person are answered on the agent's own
//! JSON-RPC ids.

use tracing::Instrument;
use uuid::Uuid;

use super::parts::Turn;
use super::{assemble, Assembly, Setup, ShimOutput, Task};
use crate::acp::agent::{AgentPipes, AgentProcess, Cursor};
use crate::acp::client::AgentSession;
use crate::acp::rpc::{RpcConfig, RpcPeer};
use crate::config::AgentProfile;
use crate::error::{Error, Result};
use crate::model::{
    Answer, Conversation, Decision, MessageRole, PermissionRequest, PermissionStatus,
};
use crate::session::command::Handle;
use crate::session::journal::Journal;
use crate::store::{AgentLink, AgentProcessRecord, CommitQueue, Resolution};

/// What reattaching one conversation's session takes besides the
/// [`Setup`].
pub struct Reattached<'a> {
    pub setup: Setup,
    pub journal: Journal,
    pub process: AgentProcess,
    pub pipes: AgentPipes,
    pub record: AgentProcessRecord,
    /// Where the last commit left the agent.
    pub link: AgentLink,
    pub session_id: String,
    pub profile: AgentProfile,
    pub conversation: &'a Conversation,
    pub turn_id: Option<Uuid>,
    /// The conversation's requests that wait, as stored.
    pub pending: Vec<PermissionRequest>,
    /// The conversation's box (its terminals and files are in it too).
    pub agent_box: crate::sandbox::AgentBox,
}

/// Spawns the session task of a reattached agent.
pub async fn reattach(r: Reattached<'_>) -> Result<(Handle, tokio::task::JoinHandle<()>)> {
    let id = r.conversation.id;
    let span = tracing::info_span!(parent: None, "conversation", conversation_id = %id, agent = %r.profile.name);
    let control = r
        .pipes
        .shim
        .clone()
        .ok_or_else(|| Error::AgentFailed("a reattached agent has no shim".into()))?;
    let (peer, incoming) = RpcPeer::spawn(
        r.pipes.stdout,
        r.pipes.stdin,
        RpcConfig {
            max_line_bytes: r.setup.max_line_bytes,
            label: id.to_string(),
            start_position: r.pipes.output_from,
            // Where it picks up inside a line too long to use, the rest of
            // that line is dropped as the first gateway dropped its start.
            start_inside_long_line: r.link.output_inside_long_line
                && r.pipes.output_from == r.link.output_to,
            first_request_id: r.pipes.first_request_id,
            // The running turn's end may be the first line read.
            answers_awaited: r.link.prompt_request.into_iter().collect(),
            ..RpcConfig::default()
        },
    );
    let agent = AgentSession::reattached(peer.clone(), r.session_id, r.link.can_close);
    let mut journal = r.journal;
    journal.ride_out_outages(r.setup.write_buffer_events);
    journal.serve(CommitQueue::Agent);
    journal.link_to(r.link.clone());
    let shim_output = ShimOutput::new(Cursor::new(peer.clone(), control), &r.link);
    let shutdown = r.setup.shutdown.child_token();
    let (handle, mut task) = assemble(Assembly {
        setup: r.setup,
        journal,
        shim_output: Some(shim_output),
        process: r.process,
        record: Some(r.record),
        agent,
        incoming,
        early: Vec::new(),
        profile: r.profile,
        conversation: r.conversation,
        state: r.conversation.state.clone(),
        agent_box: r.agent_box,
    });
    task.take_up(r.turn_id, &r.link, r.pending, &peer)
        .instrument(span.clone())
        .await?;
    let task = tokio::spawn(task.run(shutdown).instrument(span));
    Ok((handle, task))
}

impl Task {
    /// Takes up the running turn and the waiting requests where the earlier
    /// run left them.
    async fn take_up(
        &mut self,
        turn_id: Option<Uuid>,
        link: &AgentLink,
        pending: Vec<PermissionRequest>,
        peer: &RpcPeer,
    ) -> Result<()> {
        if let Some(turn_id) = turn_id {
            // What the turn has said so far goes on where it stands.
            let store = self.journal.store();
            let id = self.journal.conversation_id();
            let current = store
                .last_message(id)
                .await?
                .filter(|(m, _)| m.turn_id == Some(turn_id) && m.role != MessageRole::User);
            let calls = store.list_tool_calls(id).await?;
            let calls = calls
                .into_iter()
                .filter(|c| c.turn_id == Some(turn_id))
                .collect();
            self.transcript.take_up(current, calls);
            self.turns.turn = Some(Turn::new(turn_id));
            match link.prompt_request {
                Some(request) => self.turns.prompt = Some(self.agent.prompt_answer(request)),
                // Never sent: nothing will end it.
                None => {
                    let ended = self.end_turn(Err(crate::acp::rpc::RpcError::Closed(
                        "the gateway restarted before the prompt reached the agent".into(),
                    )));
                    if let Some(ended) = ended {
                        self.hold_queue(&ended);
                    }
                }
            }
        }
        // The requests that wait go on waiting, answered on the agent's
        // own ids; one whose id is not known cannot be answered.
        let mut unanswerable = Vec::new();
        for request in pending {
            match link.waiting.get(&request.id) {
                Some(rpc_id) => {
                    let responder = peer.responder_for(rpc_id.clone(), request.kind.method());
                    self.requests.pending.park_restored(request, responder);
                }
                None => unanswerable.push(request),
            }
        }
        // Answers committed just before the earlier run went may not have
        // reached the agent: sent again, on their ids (an agent that had
        // its answer already ignores an answer to a request it no longer
        // waits for; one that had not would wait for ever).
        for (id, rpc_id) in &link.waiting {
            if self.requests.pending.get(*id).is_some() {
                continue;
            }
            let resolved = self.journal.store().get_permission(*id).await?;
            let Some(resolved) = resolved else { continue };
            if let Some(decision) = &resolved.decision {
                tracing::info!(permission_id = %id, "answering the agent again after the restart");
                peer.responder_for(rpc_id.clone(), resolved.kind.method())
                    .respond(decision.acp_result(resolved.kind));
            }
        }
        self.keep_rpc_ids();
        for request in unanswerable {
            // Nothing says how to answer the agent: it cannot be.
            let resolution = Resolution {
                request,
                status: PermissionStatus::Expired,
                decision: Decision::new(
                    Answer::Cancelled,
                    "system".into(),
                    Some("the gateway restarted; the agent cannot be answered".into()),
                ),
            };
            self.journal.resolve(&resolution).await?;
        }
        self.journal.set_status(self.status_now());
        self.flush().await
    }
}
