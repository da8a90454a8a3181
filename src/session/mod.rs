//! Conversations at work: the supervisor ([`Sessions`]) starts a session task
//! per live conversation, keeps the registry of those running on this node,
//! and routes the API's commands to them. A conversation outlives its agent
//! process: the next prompt for one whose agent is gone (crash, restart)
//! starts the agent again and resumes its session. [`recover`] settles what
//! a previous run left behind.
//!
//! Inside: [`task`] is one conversation's `select!` loop; [`transcript`]
//! (pure) turns chunks into messages and tool-call states; [`pending`] holds
//! permission requests until answered; [`journal`] is the single writer that
//! commits, then publishes.

pub mod command;
pub mod journal;
pub mod pending;
pub mod served;
mod spawn;
pub mod task;
pub mod transcript;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use anyhow::Context;
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use crate::cluster::{Claim, Duties, Forwarded, Node};
use crate::config::{AgentLimits, AgentProfile, Config};
use crate::error::{Error, Problem, Result};
use crate::model::{
    AgentState, AgentStatus, Conversation, ConversationStatus, Decision, PermissionRequest,
    PermissionStatus, TurnEnded,
};
use crate::permissions::{answer_without_agent, Answer, PolicyHandle};
use crate::process::procs::{self, Host, Sweep};
use crate::store::{PermissionFilter, Resolution, Store};
pub use command::Setting;
use command::{Command, SessionHandle};
use journal::{Journal, Sink};
use task::StartParams;

/// The supervisor of every live conversation on this node: cheap to clone.
#[derive(Clone)]
pub struct Sessions {
    inner: Arc<Shared>,
}

struct Shared {
    sink: Sink,
    /// This gateway node, and the others on the same database.
    node: Node,
    policies: PolicyHandle,
    /// The agent profiles, by name, as conversations are started with them.
    profiles: HashMap<String, AgentProfile>,
    max_line_bytes: usize,
    shutdown_timeout: std::time::Duration,
    write_buffer_events: usize,
    live: Mutex<HashMap<Uuid, SessionHandle>>,
    /// Which live conversation holds each request waiting for a person.
    held: pending::HeldRequests,
    /// Held while a conversation's agent starts again, so that concurrent
    /// prompts never start two.
    starting: Mutex<HashMap<Uuid, Arc<tokio::sync::Mutex<()>>>>,
    /// Most agents at once (`max_agents`, `max_agents_per_user`), and how
    /// many are starting.
    limits: AgentLimits,
    admitting: Mutex<Admitting>,
    exits: task::ExitCauses,
    /// Cancelled when the gateway stops: every session closes its agent.
    shutdown: CancellationToken,
    tasks: TaskTracker,
}

impl Sessions {
    pub fn new(
        sink: Sink,
        node: Node,
        policies: PolicyHandle,
        config: &Config,
        shutdown: CancellationToken,
        tasks: TaskTracker,
    ) -> Sessions {
        let profiles = config
            .agents
            .iter()
            .filter_map(|a| Some((a.name.clone(), config.agent(&a.name)?)))
            .collect();
        Sessions {
            inner: Arc::new(Shared {
                sink,
                node,
                policies,
                profiles,
                max_line_bytes: config.max_line_bytes,
                shutdown_timeout: config.shutdown_timeout,
                write_buffer_events: config.write_buffer_events,
                live: Mutex::new(HashMap::new()),
                held: Default::default(),
                starting: Mutex::new(HashMap::new()),
                limits: config.agent_limits(),
                admitting: Mutex::new(Admitting::default()),
                exits: Default::default(),
                shutdown,
                tasks,
            }),
        }
    }

    pub fn sink(&self) -> &Sink {
        &self.inner.sink
    }

    pub fn store(&self) -> &dyn Store {
        &*self.inner.sink.store
    }

    /// This gateway node.
    pub fn node(&self) -> &Node {
        &self.inner.node
    }

    /// The operator policies in force.
    pub fn policies(&self) -> &PolicyHandle {
        &self.inner.policies
    }

    /// How many agents run on this node.
    pub fn running(&self) -> usize {
        let live = self.inner.live.lock().unwrap();
        live.values().filter(|h| !h.is_closed()).count()
    }

    /// The live session of a conversation, if its agent runs on this node.
    fn live(&self, id: Uuid) -> Option<SessionHandle> {
        let live = self.inner.live.lock().unwrap();
        live.get(&id).filter(|h| !h.is_closed()).cloned()
    }

    /// Starts a new `conversation`'s agent with `profile` and its session
    /// task (see [`task::start`]); the conversation as stored once it is
    /// ready.
    pub async fn start(
        &self,
        profile: AgentProfile,
        mut conversation: Conversation,
    ) -> Result<Conversation> {
        let id = conversation.id;
        // Owned from the start: no other node takes it for left behind.
        conversation.node_id = Some(self.inner.node.id());
        match self.launch(profile, conversation, false).await {
            Ok((_, conversation)) => Ok(conversation),
            Err(e) => {
                self.inner.node.release(id).await;
                Err(e)
            }
        }
    }

    async fn launch(
        &self,
        profile: AgentProfile,
        conversation: Conversation,
        resume: bool,
    ) -> Result<(SessionHandle, Conversation)> {
        let id = conversation.id;
        let _slot = self.admit(conversation.owner.as_deref()).await?;
        let (handle, conversation, task) = task::start(StartParams {
            sink: self.inner.sink.clone(),
            profile,
            conversation,
            resume,
            max_line_bytes: self.inner.max_line_bytes,
            shutdown: self.inner.shutdown.child_token(),
            shutdown_timeout: self.inner.shutdown_timeout,
            write_buffer_events: self.inner.write_buffer_events,
            policies: self.inner.policies.clone(),
            exits: self.inner.exits.clone(),
            held: self.inner.held.clone(),
        })
        .await?;
        // Registered now, forgotten when its task ends.
        self.inner.live.lock().unwrap().insert(id, handle.clone());
        let sessions = self.clone();
        self.inner.tasks.spawn(async move {
            let _ = task.await;
            sessions.inner.live.lock().unwrap().remove(&id);
            // Its agent is gone from this node: any node may start it again
            // (unless it was started here again meanwhile).
            sessions
                .gated(id, async {
                    if sessions.live(id).is_none() {
                        sessions.inner.node.release(id).await;
                    }
                })
                .await;
        });
        Ok((handle, conversation))
    }

    /// A slot for one more agent of `owner`'s conversation. Under
    /// `max_agents_per_user`, the owner's longest-idle agent is stopped to
    /// make room when all theirs are taken, and 429 answered when none of
    /// theirs is idle; under `max_agents` the same with everyone's agents,
    /// and 503 (also when both limits are reached and no agent at all is
    /// idle: the gateway is at capacity). Another user's agent is never
    /// stopped for the owner's own limit.
    async fn admit(&self, owner: Option<&str>) -> Result<Slot> {
        let AgentLimits { total, per_user } = self.inner.limits;
        let busy = |limit: &str, n: usize| {
            format!("all {n} agents ({limit}) are busy with a turn or a permission request")
        };
        loop {
            let (idlest, over) = {
                let live = self.inner.live.lock().unwrap();
                let mut admitting = self.inner.admitting.lock().unwrap();
                let running: Vec<&SessionHandle> =
                    live.values().filter(|h| !h.is_closed()).collect();
                let idlest = |of: &mut dyn Iterator<Item = &&SessionHandle>| {
                    of.filter_map(|h| Some((h.idle_since()?, *h)))
                        .min_by_key(|(since, _)| *since)
                        .map(|(_, h)| h.clone())
                };
                let everyone_full = running.len() + admitting.total >= total;
                let theirs = running.iter().filter(|h| h.owner() == owner);
                if theirs.clone().count() + admitting.of(owner) >= per_user {
                    match idlest(&mut theirs.clone()) {
                        Some(h) => (h, "max_agents_per_user"),
                        None if everyone_full && idlest(&mut running.iter()).is_none() => {
                            return Err(Error::AtCapacity {
                                detail: busy("max_agents", total),
                                retry_after: 5,
                            })
                        }
                        None => {
                            return Err(Error::TooManyRequests {
                                detail: format!(
                                    "all {per_user} agents this user may run \
                                     (max_agents_per_user) are busy with a turn or a \
                                     permission request"
                                ),
                                retry_after: 5,
                            })
                        }
                    }
                } else if everyone_full {
                    match idlest(&mut running.iter()) {
                        Some(h) => (h, "max_agents"),
                        None => {
                            return Err(Error::AtCapacity {
                                detail: busy("max_agents", total),
                                retry_after: 5,
                            })
                        }
                    }
                } else {
                    admitting.add(owner);
                    return Ok(Slot {
                        sessions: self.clone(),
                        owner: owner.map(str::to_owned),
                    });
                }
            };
            // Busy again meanwhile? Then look again.
            if idlest.release().await {
                tracing::info!(limit = over, "stopped the longest-idle agent to make room");
            }
        }
    }

    /// The live session of a conversation; one whose agent is gone (a
    /// crash, an idle stop, a restart of the gateway) has it started again
    /// on this node and resumed, unless another live node runs it (then
    /// that node). Concurrent callers wait for one start.
    async fn attach(&self, conversation: &Conversation) -> Result<Attached> {
        let id = conversation.id;
        if let Some(session) = self.live(id) {
            return Ok(Attached::Here(session));
        }
        self.gated(id, async {
            if let Some(session) = self.live(id) {
                return Ok(Attached::Here(session));
            }
            // As stored now: its `last_seq` and status are the journal's.
            let conversation = self.stored(id).await?;
            if conversation.status == ConversationStatus::Closed {
                return Err(not_live(&conversation));
            }
            let profile = self.inner.profiles.get(&conversation.agent).cloned();
            let profile = profile.ok_or_else(|| {
                Error::conflict(
                    "agent_unavailable",
                    format!(
                        "the conversation's agent profile {:?} is no longer configured",
                        conversation.agent
                    ),
                )
            })?;
            let conversation = match self.inner.node.claim(id).await? {
                Claim::Elsewhere(node) => return Ok(Attached::There(node)),
                Claim::Mine { took_from: None } => conversation,
                Claim::Mine {
                    took_from: Some(dead),
                } => {
                    self.settle_taken(id, dead).await?;
                    self.stored(id).await?
                }
            };
            match self.launch(profile, conversation, true).await {
                Ok((session, _)) => Ok(Attached::Here(session)),
                Err(e) => {
                    self.inner.node.release(id).await;
                    Err(e)
                }
            }
        })
        .await
    }

    /// Runs `work` holding the conversation's gate: what starts its agent,
    /// settles it for a dead node or gives it up runs one at a time.
    async fn gated<T>(&self, id: Uuid, work: impl Future<Output = T>) -> T {
        let gate = self
            .inner
            .starting
            .lock()
            .unwrap()
            .entry(id)
            .or_default()
            .clone();
        let done = {
            let _held = gate.lock().await;
            work.await
        };
        // Done (an agent registered, or not) before the gate goes, and it
        // goes with its last holder: whoever comes next finds the live
        // session, or is the only one to try again.
        let mut starting = self.inner.starting.lock().unwrap();
        let last_holder = Arc::strong_count(&gate) <= 2;
        if last_holder && starting.get(&id).is_some_and(|g| Arc::ptr_eq(g, &gate)) {
            starting.remove(&id);
        }
        done
    }

    /// Runs `command` on the conversation's live session, starting the
    /// agent again first if it is gone; where another node runs it, that
    /// node runs `remote` (the same command, sent as JSON) and its answer
    /// is this one.
    async fn on_live<T, F, Fut>(
        &self,
        conversation: &Conversation,
        command: F,
        remote: Command,
    ) -> Result<T>
    where
        F: Fn(SessionHandle) -> Fut,
        Fut: Future<Output = Option<Result<T>>>,
        T: serde::de::DeserializeOwned,
    {
        if conversation.status == ConversationStatus::Closed {
            return Err(not_live(conversation));
        }
        // A few rounds: an agent may go away (or its node die) just then.
        for _ in 0..3 {
            match self.attach(conversation).await? {
                Attached::Here(session) => {
                    if let Some(result) = command(session.clone()).await {
                        return result;
                    }
                    // Its agent went away just then (the session was
                    // ending): once it has ended, start it again, as for
                    // any gone agent.
                    session.ended().await;
                }
                Attached::There(node) => {
                    if let Some(answer) = self.forward(conversation.id, node, &remote).await? {
                        return answer;
                    }
                }
            }
        }
        Err(not_live(&self.stored(conversation.id).await?))
    }

    /// Has `node` run `command`: its answer, or `None` when it died before
    /// taking it.
    async fn forward<T: serde::de::DeserializeOwned>(
        &self,
        conversation_id: Uuid,
        node: Uuid,
        command: &Command,
    ) -> Result<Option<Result<T>>> {
        Ok(
            match self
                .inner
                .node
                .forward(conversation_id, node, command.to_value())
                .await?
            {
                Forwarded::Answered(Ok(value)) => Some(decode(value)),
                Forwarded::Answered(Err(problem)) => Some(Err(Error::Remote(problem))),
                Forwarded::OwnerGone => None,
            },
        )
    }

    /// Whether a live node other than this one runs the conversation's
    /// agent (without claiming it).
    async fn runs_elsewhere(&self, conversation_id: Uuid) -> Result<Option<Uuid>> {
        if !self.inner.node.is_shared() || self.live(conversation_id).is_some() {
            return Ok(None);
        }
        self.inner.node.runs_elsewhere(conversation_id).await
    }

    /// Starts a turn, starting the agent again first if it is gone; the
    /// turn's id once `turn_started` is committed.
    pub async fn prompt(&self, conversation: &Conversation, content: Vec<Value>) -> Result<Uuid> {
        let remote = Command::Prompt {
            content: content.clone(),
        };
        self.on_live(
            conversation,
            |session| {
                let content = content.clone();
                async move { session.prompt(content).await }
            },
            remote,
        )
        .await
    }

    /// Changes a session setting (the agent's session mode or one of its
    /// configuration options), between turns or during one; returns once
    /// the agent accepted and the change is recorded. What the agent does
    /// not offer is refused (422) without asking it, and without starting
    /// an agent that is gone.
    pub async fn change(
        &self,
        conversation: &Conversation,
        setting: Setting,
        changed_by: String,
    ) -> Result<()> {
        if self.live(conversation.id).is_none() {
            setting
                .check(&conversation.state)
                .map_err(Error::Unprocessable)?;
        }
        let remote = Command::Change {
            setting: setting.clone(),
            changed_by: changed_by.clone(),
        };
        self.on_live(
            conversation,
            |session| {
                let (setting, changed_by) = (setting.clone(), changed_by.clone());
                async move { session.change(setting, changed_by).await }
            },
            remote,
        )
        .await
    }

    /// Cancels the running turn, if any.
    pub async fn cancel(&self, conversation: &Conversation) -> Result<()> {
        if let Some(session) = self.live(conversation.id) {
            if let Some(result) = session.cancel().await {
                return result;
            }
        }
        if conversation.status == ConversationStatus::Closed {
            return Err(not_live(conversation));
        }
        if let Some(node) = self.runs_elsewhere(conversation.id).await? {
            if let Some(answer) = self
                .forward(conversation.id, node, &Command::Cancel)
                .await?
            {
                return answer;
            }
        }
        // No agent, so no turn: nothing to cancel.
        Ok(())
    }

    /// Answers a request that a live session on this node holds, if the
    /// caller may see its conversation (`can_see`, given the owner): the
    /// common case, answered without reading the database first. `None`
    /// when no live session holds it (any more): see [`Sessions::respond`].
    pub async fn respond_held(
        &self,
        id: Uuid,
        can_see: impl FnOnce(Option<&str>) -> bool,
        answer: Answer,
        decided_by: String,
        via: Option<String>,
    ) -> Option<Result<PermissionRequest>> {
        let conversation_id = *self.inner.held.lock().unwrap().get(&id)?;
        let session = self.live(conversation_id)?;
        if !can_see(session.owner()) {
            return Some(Err(Error::NotFound(format!("no permission request {id}"))));
        }
        match session.respond(id, answer, decided_by, via).await? {
            Ok(Some(answered)) => Some(Ok(answered)),
            // Answered or withdrawn meanwhile: the stored request tells.
            Ok(None) => None,
            Err(e) => Some(Err(e)),
        }
    }

    /// A user's answer to a permission request: the live session that holds
    /// it answers the agent; otherwise only a repeat of the recorded decision
    /// succeeds.
    pub async fn respond(
        &self,
        request: &PermissionRequest,
        answer: Answer,
        decided_by: String,
        via: Option<String>,
    ) -> Result<PermissionRequest> {
        let id = request.id;
        if let Some(session) = self.live(request.conversation_id) {
            if let Some(result) = session.respond(id, answer.clone(), decided_by, via).await {
                if let Some(answered) = result? {
                    return Ok(answered);
                }
            }
        } else if let Some(node) = self.runs_elsewhere(request.conversation_id).await? {
            let remote = Command::Respond {
                request: id,
                answer: answer.clone(),
                decided_by,
                via,
            };
            if let Some(answer) = self.forward(request.conversation_id, node, &remote).await? {
                return answer;
            }
        }
        let request = self
            .store()
            .get_permission(id)
            .await?
            .ok_or_else(|| Error::NotFound(format!("no permission request {id}")))?;
        answer_without_agent(request, &answer)
    }

    /// Closes a conversation: its live session stops its agent (cancelling
    /// its turn and requests), here or on the node that runs it; one without
    /// an agent is just marked closed.
    pub async fn close(&self, conversation: &Conversation) -> Result<()> {
        if let Some(session) = self.live(conversation.id) {
            session.close().await;
            return Ok(());
        }
        if conversation.status == ConversationStatus::Closed {
            return Ok(());
        }
        for _ in 0..3 {
            match self.inner.node.claim(conversation.id).await? {
                Claim::Elsewhere(node) => {
                    if let Some(answer) =
                        self.forward(conversation.id, node, &Command::Close).await?
                    {
                        return answer;
                    }
                }
                Claim::Mine { took_from } => {
                    let id = conversation.id;
                    return self
                        .gated(id, async {
                            if let Some(session) = self.live(id) {
                                // Started here meanwhile.
                                session.close().await;
                                return Ok(());
                            }
                            let closed = async {
                                if let Some(dead) = took_from {
                                    self.settle_taken(id, dead).await?;
                                }
                                let conversation = self.stored(id).await?;
                                let mut journal =
                                    Journal::new(self.inner.sink.clone(), &conversation, None);
                                journal.set_status(ConversationStatus::Closed);
                                journal.flush().await
                            }
                            .await;
                            self.inner.node.release(id).await;
                            closed
                        })
                        .await;
                }
            }
        }
        Err(not_live(&self.stored(conversation.id).await?))
    }

    /// Settles a conversation just taken from a dead node: what its agent
    /// left running here is killed, pending requests expire, a running turn
    /// ends.
    async fn settle_taken(&self, id: Uuid, dead: Uuid) -> Result<()> {
        let sink = &self.inner.sink;
        if let Err(e) = kill_leftover_agents(&*sink.store, |c| c == id).await {
            tracing::warn!(conversation_id = %id, error = %e, "could not look for what the dead node's agent left");
        }
        let turn_id = sink
            .store
            .live_conversations()
            .await?
            .into_iter()
            .find(|(c, _)| c.id == id)
            .and_then(|(_, turn)| turn);
        let conversation = self.stored(id).await?;
        tracing::info!(conversation_id = %id, dead_node = %dead, "settling a conversation of a dead node");
        settle(
            sink,
            &conversation,
            turn_id,
            "the gateway node that ran the agent stopped; the agent process is gone",
        )
        .await
    }

    /// Takes over and settles the conversations of dead nodes, leaving them
    /// to whichever node gets their next command.
    pub async fn settle_orphans_now(&self) -> Result<()> {
        for (id, dead) in self.inner.node.take_orphans().await? {
            self.gated(id, async {
                let settled = self.settle_taken(id, dead).await;
                self.inner.node.release(id).await;
                settled
            })
            .await?;
        }
        Ok(())
    }

    async fn stored(&self, id: Uuid) -> Result<Conversation> {
        self.store()
            .get_conversation(id)
            .await?
            .ok_or_else(|| Error::NotFound(format!("no conversation {id}")))
    }
}

/// What this node does for the others (see [`crate::cluster`]).
#[async_trait::async_trait]
impl Duties for Sessions {
    async fn execute(&self, conversation_id: Uuid, command: Value) -> Result<Value, Box<Problem>> {
        let run = async {
            let command: Command = decode(command)?;
            let conversation = self.stored(conversation_id).await?;
            Ok::<Value, Error>(match command {
                Command::Prompt { content } => {
                    serde_json::to_value(self.prompt(&conversation, content).await?)
                        .expect("ids serialize")
                }
                Command::Cancel => {
                    self.cancel(&conversation).await?;
                    Value::Null
                }
                Command::Close => {
                    self.close(&conversation).await?;
                    Value::Null
                }
                Command::Respond {
                    request,
                    answer,
                    decided_by,
                    via,
                } => {
                    let request = self.store().get_permission(request).await?.ok_or_else(|| {
                        Error::NotFound(format!("no permission request {request}"))
                    })?;
                    serde_json::to_value(self.respond(&request, answer, decided_by, via).await?)
                        .expect("requests serialize")
                }
                Command::Change {
                    setting,
                    changed_by,
                } => {
                    self.change(&conversation, setting, changed_by).await?;
                    Value::Null
                }
                // Never sent to another node (it cannot be read from JSON).
                Command::Release => {
                    return Err(Error::Internal(anyhow::anyhow!(
                        "another node asked to release an agent"
                    )))
                }
            })
        };
        run.await.map_err(|e| Box::new(e.problem()))
    }

    async fn settle_orphans(&self) {
        if let Err(e) = self.settle_orphans_now().await {
            tracing::warn!(error = %e, "could not settle the conversations of a dead node");
        }
    }
}

/// Where a conversation's agent runs.
enum Attached {
    Here(SessionHandle),
    /// On this other live node.
    There(Uuid),
}

/// Agents admitted and still starting: in all, and per owner.
#[derive(Default)]
struct Admitting {
    total: usize,
    by_owner: HashMap<Option<String>, usize>,
}

impl Admitting {
    fn of(&self, owner: Option<&str>) -> usize {
        self.by_owner
            .get(&owner.map(str::to_owned))
            .copied()
            .unwrap_or(0)
    }

    fn add(&mut self, owner: Option<&str>) {
        self.total += 1;
        *self.by_owner.entry(owner.map(str::to_owned)).or_default() += 1;
    }

    fn remove(&mut self, owner: Option<String>) {
        self.total -= 1;
        if let std::collections::hash_map::Entry::Occupied(mut n) = self.by_owner.entry(owner) {
            *n.get_mut() -= 1;
            if *n.get() == 0 {
                n.remove();
            }
        }
    }
}

/// One agent admitted under the limits while it starts; its place is taken
/// over by the live registry once it runs.
struct Slot {
    sessions: Sessions,
    owner: Option<String>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let owner = self.owner.take();
        self.sessions.inner.admitting.lock().unwrap().remove(owner);
    }
}

/// The value another node's answer carries back.
fn decode<T: serde::de::DeserializeOwned>(value: Value) -> Result<T> {
    serde_json::from_value(value).map_err(|e| {
        Error::Internal(anyhow::anyhow!(
            "another node's answer is not what this node expects: {e}"
        ))
    })
}

/// Why a conversation cannot take a command: it is closed, or its agent
/// went away while the command waited.
fn not_live(conversation: &Conversation) -> Error {
    match conversation.status {
        ConversationStatus::Closed => {
            Error::conflict("conversation_closed", "the conversation is closed")
        }
        _ => Error::conflict(
            "agent_unavailable",
            format!(
                "the conversation's agent is not running (status {})",
                conversation.status.as_str()
            ),
        ),
    }
}

/// Conversations that still claim an agent belong to a previous run whose
/// agents are gone (what is left of them is killed first): end their turns
/// and expire their pending requests, with events so clients learn what
/// happened. They stay open: the next prompt starts the agent again. What
/// another live node runs is left alone.
pub async fn recover(sink: &Sink, node: &Node) -> anyhow::Result<()> {
    // The agents on record first: one recorded later belongs to a node that
    // claimed its conversation after `elsewhere` was read.
    let records = sink.store.list_agent_processes().await?;
    // Dead nodes' conversations become this node's (unless another node
    // takes them first); then what live nodes run is known.
    let taken = node.take_orphans().await?;
    let elsewhere = node.owned_elsewhere().await?;
    let had_agents = kill_recorded(&*sink.store, records, |c| !elsewhere.contains(&c))
        .await
        .context("Failed to go through the agent processes a previous run recorded")?;
    // Ours to settle: on SQLite every one; on Postgres those nobody owns
    // and those just taken from dead nodes.
    let ours = |c: &Conversation| {
        !elsewhere.contains(&c.id)
            && (!node.is_shared() || c.node_id.is_none() || c.node_id == Some(node.id()))
    };
    let detail = "the gateway restarted; the agent process is gone";
    let mut left: Vec<(Conversation, Option<Uuid>)> = sink
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
        if let Some(conversation) = sink.store.get_conversation(id).await? {
            if conversation.status == ConversationStatus::Idle && ours(&conversation) {
                left.push((conversation, None));
            }
        }
    }
    for (conversation, turn_id) in left {
        tracing::info!(conversation_id = %conversation.id, "settling a conversation left by a previous run");
        settle(sink, &conversation, turn_id, detail).await?;
    }
    // Nothing runs here yet: whatever this node took is anyone's again.
    node.release_all().await?;
    Ok(())
}

/// Ends what a conversation whose agent is gone had going: its pending
/// requests expire and its turn ends with `detail`; it stays open.
async fn settle(
    sink: &Sink,
    conversation: &Conversation,
    turn_id: Option<Uuid>,
    detail: &str,
) -> Result<()> {
    let mut journal = Journal::new(sink.clone(), conversation, turn_id);
    let pending = sink
        .store
        .list_permissions(&PermissionFilter {
            pending_only: true,
            conversation_id: Some(conversation.id),
            owner: None,
        })
        .await?;
    for request in pending {
        let resolution = Resolution {
            request,
            status: PermissionStatus::Expired,
            decision: Decision::new(None, "system".into(), Some(detail.into())),
        };
        journal.resolve(&resolution).await?;
    }
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

async fn kill_recorded(
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
