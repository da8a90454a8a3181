//! Recovery: what a previous run of this gateway, or a dead node of the
//! cluster, left behind. Its agents' leftover processes are killed, its
//! pending requests expire and its running turns end; the conversations
//! stay open, so the next prompt starts the agent again.

use anyhow::Context;
use uuid::Uuid;

use super::journal::{Journal, Outlets};
use super::Sessions;
use crate::cluster::Node;
use crate::error::Result;
use crate::model::{
    AgentState, AgentStatus, Conversation, ConversationStatus, Decision, PermissionStatus,
    TurnEnded,
};
use crate::process::procs::{self, Host, Sweep};
use crate::store::{AgentProcessRecord, PermissionFilter, Resolution, Store};

impl Sessions {
    /// Settles a conversation just taken from a dead node: what its agent
    /// left running here is killed, pending requests expire, a running turn
    /// ends.
    pub(super) async fn recover_taken(&self, id: Uuid, dead: Uuid) -> Result<()> {
        let outlets = &self.inner.setup.outlets;
        if let Err(e) = kill_leftover_agents(&*outlets.store, |c| c == id).await {
            tracing::warn!(conversation_id = %id, error = %e, "could not look for what the dead node's agent left");
        }
        let turn_id = outlets
            .store
            .live_conversations()
            .await?
            .into_iter()
            .find(|(c, _)| c.id == id)
            .and_then(|(_, turn)| turn);
        let conversation = self.stored(id).await?;
        tracing::info!(conversation_id = %id, dead_node = %dead, "recovering a conversation of a dead node");
        recover_conversation(
            outlets,
            &conversation,
            turn_id,
            "the gateway node that ran the agent stopped; the agent process is gone",
        )
        .await
    }

    /// Takes over and recovers the conversations of dead nodes, leaving them
    /// to whichever node gets their next command.
    ///
    /// Each is taken under the gate a command's start takes, and only from
    /// its dead node: a command that started it here meanwhile took it (and
    /// recovered it) first, and its new agent is left alone.
    pub async fn recover_orphans(&self) -> Result<()> {
        let node = &self.inner.node;
        for (id, dead) in node.orphans().await? {
            self.gated(id, async {
                if !node.take_orphan(id, dead).await? {
                    return Ok(());
                }
                let recovered = self.recover_taken(id, dead).await;
                node.release(id).await;
                recovered
            })
            .await?;
        }
        node.forget_dead_nodes().await
    }
}

/// Conversations that still claim an agent belong to a previous run whose
/// agents are gone (what is left of them is killed first): end their turns
/// and expire their pending requests, with events so clients learn what
/// happened. They stay open: the next prompt starts the agent again. What
/// another live node runs is left alone.
///
/// Agents a previous run left under their shims on this machine are left
/// alone here: their records are returned, for
/// [`Sessions::reattach`](super::Sessions::reattach) to take them up again.
pub async fn recover(outlets: &Outlets, node: &Node) -> anyhow::Result<Vec<AgentProcessRecord>> {
    // The agents on record first: one recorded later belongs to a node that
    // claimed its conversation after `elsewhere` was read.
    let records = outlets.store.list_agent_processes().await?;
    // Dead nodes' conversations become this node's (unless another node
    // takes them first); then what live nodes run is known.
    let taken = node.claim_orphans().await?;
    let elsewhere = node.owned_elsewhere().await?;
    let (shims, records): (Vec<_>, Vec<_>) = records.into_iter().partition(|r| {
        r.shim_socket.is_some()
            && !elsewhere.contains(&r.conversation_id)
            && Host::here().is_some_and(|h| h.sees(&r.boot_id, &r.pid_namespace))
    });
    let reattaching: Vec<Uuid> = shims.iter().map(|r| r.conversation_id).collect();
    let had_agents = kill_recorded(&*outlets.store, records, |c| {
        !elsewhere.contains(&c) && !reattaching.contains(&c)
    })
    .await
    .context("Failed to go through the agent processes a previous run recorded")?;
    // Ours to recover: on SQLite every one; on Postgres those nobody owns
    // and those just taken from dead nodes.
    let ours = |c: &Conversation| {
        !elsewhere.contains(&c.id)
            && !reattaching.contains(&c.id)
            && (!node.is_shared() || c.node_id.is_none() || c.node_id == Some(node.id()))
    };
    let detail = "the gateway restarted; the agent process is gone";
    let mut left: Vec<(Conversation, Option<Uuid>)> = outlets
        .store
        .live_conversations()
        .await?
        .into_iter()
        .filter(|(c, _)| ours(c))
        .collect();
    // Idle ones whose agent a crash (of this gateway or of a dead node) left
    // behind learn it is gone too.
    for id in had_agents
        .into_iter()
        .chain(taken.into_iter().map(|(id, _)| id))
    {
        if left.iter().any(|(c, _)| c.id == id) {
            continue;
        }
        if let Some(conversation) = outlets.store.get_conversation(id).await? {
            if conversation.status == ConversationStatus::Idle && ours(&conversation) {
                left.push((conversation, None));
            }
        }
    }
    for (conversation, turn_id) in left {
        tracing::info!(conversation_id = %conversation.id, "settling a conversation left by a previous run");
        recover_conversation(outlets, &conversation, turn_id, detail).await?;
    }
    // Nothing runs here yet: whatever this node took is anyone's again.
    node.release_all().await?;
    Ok(shims)
}

/// Ends what a conversation whose agent is gone had going: its pending
/// requests expire and its turn ends with `detail`; it stays open.
pub(super) async fn recover_conversation(
    outlets: &Outlets,
    conversation: &Conversation,
    turn_id: Option<Uuid>,
    detail: &str,
) -> Result<()> {
    let mut journal = Journal::new(outlets.clone(), conversation, turn_id);
    settle_pending(&mut journal, PermissionStatus::Expired, detail).await?;
    let turn_ended = turn_id.map(|turn_id| TurnEnded {
        turn_id,
        stop_reason: "error".into(),
        error: Some(detail.into()),
    });
    let agent = AgentStatus::new(AgentState::Exited, Some(detail.into()));
    // Not closed: the next prompt starts the agent again.
    journal
        .agent_gone(turn_ended, agent, ConversationStatus::Idle)
        .await?;
    Ok(())
}

/// Kills what the agents of a previous run on this machine left running
/// (a crashed gateway cannot take its agents' children with it) and forgets
/// their records, for the conversations `mine` accepts: records of another
/// boot, container or machine name no process here. Returns the
/// conversations whose agents were on record.
async fn kill_leftover_agents(
    store: &dyn Store,
    mine: impl Fn(Uuid) -> bool,
) -> anyhow::Result<Vec<Uuid>> {
    let records = store.list_agent_processes().await?;
    kill_recorded(store, records, mine).await
}

pub(super) async fn kill_recorded(
    store: &dyn Store,
    records: Vec<crate::store::AgentProcessRecord>,
    mine: impl Fn(Uuid) -> bool,
) -> anyhow::Result<Vec<Uuid>> {
    let records: Vec<_> = records
        .into_iter()
        .filter(|r| mine(r.conversation_id))
        .collect();
    let conversations: Vec<Uuid> = records.iter().map(|r| r.conversation_id).collect();
    if records.is_empty() {
        return Ok(conversations);
    }
    let Some(here) = Host::here() else {
        tracing::warn!(
            records = records.len(),
            "no /proc: cannot look for processes a previous run's agents left running"
        );
        return Ok(conversations);
    };
    for record in records {
        let conversation_id = record.conversation_id;
        let pid = record.pid;
        if !here.sees(&record.boot_id, &record.pid_namespace) {
            tracing::info!(%conversation_id, pid, host = %record.hostname, boot_id = %record.boot_id,
                pid_namespace = %record.pid_namespace,
                "forgetting an agent process recorded under another boot, container or machine");
        } else {
            let start_time = u64::try_from(record.start_time).unwrap_or_default();
            let sweep = tokio::task::spawn_blocking(move || procs::kill_leftovers(pid, start_time))
                .await
                .context("the /proc scan panicked")?;
            match sweep {
                Ok(Sweep::Nothing) => {
                    tracing::info!(%conversation_id, pid, "nothing left of a previous run's agent");
                }
                Ok(Sweep::PidReused(now)) => {
                    tracing::info!(%conversation_id, pid, now = %now.comm,
                        "a previous run's agent is gone and its pid reused: nothing killed");
                }
                Ok(Sweep::Killed { killed, failed }) => {
                    let killed: Vec<String> = killed
                        .iter()
                        .map(|p| format!("{} ({})", p.pid, p.comm))
                        .collect();
                    tracing::warn!(%conversation_id, pid, killed = ?killed,
                        "killed what a previous run's agent left running");
                    for (p, e) in failed {
                        tracing::error!(%conversation_id, pid, error = %e,
                            "could not kill {} ({}), left by a previous run's agent", p.pid, p.comm);
                    }
                }
                Err(e) => {
                    tracing::warn!(%conversation_id, pid, error = %e,
                        "cannot look for what a previous run's agent left running");
                }
            }
        }
        store.forget_agent_process(&record).await?;
    }
    Ok(conversations)
}

/// Resolves the conversation's pending requests (as stored) with `status`
/// and `detail`, where no agent will hear their answers.
pub(super) async fn settle_pending(
    journal: &mut Journal,
    status: PermissionStatus,
    detail: &str,
) -> Result<()> {
    let pending = journal
        .store()
        .list_permissions(&PermissionFilter {
            pending_only: true,
            conversation_id: Some(journal.conversation_id()),
            owner: None,
            kind: None,
        })
        .await?;
    for request in pending {
        let resolution = Resolution {
            request,
            status,
            decision: Decision::new(None, "system".into(), Some(detail.into())),
        };
        journal.resolve(&resolution).await?;
    }
    Ok(())
}
