//! One live conversation: the task that owns its agent process and ACP
//! session, applies what the agent sends (to the [`Transcript`], the
//! [`Pending`] requests and the [`Journal`]), and carries out the commands
//! its [`SessionHandle`] sends (prompt, cancel, answer a permission request,
//! close).
//!
//! Data flows agent stdout → rpc → this task → journal (commit, then
//! publish); commands flow supervisor → [`SessionHandle`] → this task → rpc
//! → agent stdin. Everything about one conversation happens in this one
//! task, so its state needs no locks and its events have one order.

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use uuid::Uuid;

use super::journal::{Journal, Sink};
use super::pending::{HeldRequests, Pending};
use super::served::{Served, Write};
use super::transcript::Transcript;
use crate::acp::agent::{describe_exit, AgentProcess};
use crate::acp::client::{AgentSession, CallFuture, Opened, Opening, EXIT_AFTER_EOF};
use crate::acp::rpc::{Incoming, IncomingRequest, RpcConfig, RpcError, RpcPeer, INVALID_PARAMS};
use crate::config::AgentProfile;
use crate::error::{Error, Result};
use crate::model::{
    self, AgentState, AgentStatus, ConfigOptionChanged, Conversation, ConversationStatus, Decision,
    ModeChanged, PermissionRequest, PermissionStatus, SessionState, TurnEnded, TurnStarted,
};
use crate::permissions::policy::{self, Facts, Mode};
use crate::permissions::{
    answer_resolved, keys_to_remember, option_kind, validate_answer, Answer, PolicyHandle,
};
use crate::process::procs::Host;
use crate::store::{AgentProcessRecord, Lane, Resolution, Store};
use crate::telemetry;
use crate::workspace::terminals::TerminalOutput;
use crate::workspace::Workspace;

/// Most events committed in one batch while an agent streams.
const MAX_BATCH_EVENTS: usize = 512;
/// Most text (joined message chunks) committed in one batch, in bytes.
const MAX_BATCH_TEXT: usize = 1 << 20;
/// How long a streamed update may wait to be committed with those after it
/// (a client sees it this much later at most).
const BATCH_WINDOW: Duration = Duration::from_millis(10);
/// How long a session whose agent is gone keeps trying to write what an
/// unreachable database has not taken yet.
const OUTAGE_PATIENCE: Duration = Duration::from_secs(600);
/// How long an agent gets to exit after SIGTERM.
const TERMINATE_GRACE: Duration = Duration::from_secs(2);
/// How long a session that ends waits for its killed terminals to report
/// their end (a process that left their group may hold their output open).
const TERMINALS_END: Duration = Duration::from_secs(2);
/// How long an agent gets to answer `session/close`.
const CLOSE_GRACE: Duration = Duration::from_secs(5);

enum Command {
    Prompt {
        content: Vec<Value>,
        reply: oneshot::Sender<Result<Uuid>>,
    },
    Cancel {
        reply: oneshot::Sender<Result<()>>,
    },
    Respond {
        permission_id: Uuid,
        answer: Answer,
        decided_by: String,
        via: Option<String>,
        reply: oneshot::Sender<Result<Option<PermissionRequest>>>,
    },
    Close {
        reply: oneshot::Sender<()>,
    },
    /// A user changes a session setting.
    Change(Change),
    /// Stop the agent if it is idle (to make room for another): `true` when
    /// it will.
    Release {
        reply: oneshot::Sender<bool>,
    },
}

/// A session setting a user asks the agent to change.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub enum Setting {
    /// `session/set_mode`.
    Mode(String),
    /// `session/set_config_option`: a string or boolean `value`.
    ConfigOption { config_id: String, value: Value },
}

impl Setting {
    /// Whether an agent that reports `state` offers this; else why not.
    pub fn check(&self, state: &SessionState) -> std::result::Result<(), String> {
        match self {
            Setting::Mode(mode_id) => state.check_mode(mode_id),
            Setting::ConfigOption { config_id, value } => {
                state.config_request(config_id, value).map(drop)
            }
        }
    }
}

/// A change of a setting, and whom to tell once the agent answered.
pub struct Change {
    setting: Setting,
    changed_by: String,
    reply: oneshot::Sender<Result<()>>,
}

/// A change sent to the agent, resolving with its answer.
type Changing = Pin<Box<dyn Future<Output = (Change, Result<Value>)> + Send>>;

/// The supervisor's handle to a live conversation. Every call answers
/// `None` once the session has ended.
#[derive(Clone)]
pub struct SessionHandle {
    tx: mpsc::Sender<Command>,
    /// The conversation's owner (see [`crate::model::Conversation::owner`]).
    owner: Option<Arc<str>>,
    /// Since when the agent has had no turn and no pending request.
    idle: Arc<Mutex<Option<Instant>>>,
}

impl SessionHandle {
    pub fn owner(&self) -> Option<&str> {
        self.owner.as_deref()
    }

    async fn call<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Command) -> Option<T> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(make(reply)).await.ok()?;
        rx.await.ok()
    }

    /// Starts a turn; returns its id once `turn_started` is committed.
    pub async fn prompt(&self, content: Vec<Value>) -> Option<Result<Uuid>> {
        self.call(|reply| Command::Prompt { content, reply }).await
    }

    pub async fn cancel(&self) -> Option<Result<()>> {
        self.call(|reply| Command::Cancel { reply }).await
    }

    /// Answers a request this session holds; `Ok(None)`: it holds no such
    /// request (the store knows the rest).
    pub async fn respond(
        &self,
        permission_id: Uuid,
        answer: Answer,
        decided_by: String,
        via: Option<String>,
    ) -> Option<Result<Option<PermissionRequest>>> {
        self.call(|reply| Command::Respond {
            permission_id,
            answer,
            decided_by,
            via,
            reply,
        })
        .await
    }

    /// Changes a session setting; returns once the agent accepted it and
    /// the change is recorded.
    pub async fn change(&self, setting: Setting, changed_by: String) -> Option<Result<()>> {
        self.call(|reply| {
            Command::Change(Change {
                setting,
                changed_by,
                reply,
            })
        })
        .await
    }

    /// Closes the conversation; returns when the agent is gone.
    pub async fn close(&self) {
        self.call(|reply| Command::Close { reply }).await;
    }

    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// Resolves once the session has ended.
    pub async fn ended(&self) {
        self.tx.closed().await
    }

    /// Since when the agent has been idle (no turn, nothing pending).
    pub fn idle_since(&self) -> Option<Instant> {
        *self.idle.lock().unwrap()
    }

    /// Stops the agent if it is still idle, and returns once it is gone;
    /// whether it was stopped.
    pub async fn release(&self) -> bool {
        let released = self.call(|reply| Command::Release { reply }).await;
        if released == Some(true) {
            self.tx.closed().await;
        }
        released.unwrap_or(false)
    }
}

/// Why each conversation's agent last went away, for counting restarts by
/// cause (none recorded: the gateway itself restarted).
pub type ExitCauses = Arc<Mutex<HashMap<Uuid, &'static str>>>;

/// Everything needed to start a session.
pub struct StartParams {
    pub sink: Sink,
    pub profile: AgentProfile,
    /// A new conversation, or (`resume`) one as stored whose agent is gone.
    pub conversation: Conversation,
    pub resume: bool,
    pub max_line_bytes: usize,
    /// Cancelled when the gateway stops: the session closes its agent.
    pub shutdown: CancellationToken,
    /// How long a running turn's agent gets to answer its cancel then.
    pub shutdown_timeout: Duration,
    /// Most events held while the database is unreachable.
    pub write_buffer_events: usize,
    /// The operator policies that may answer permission requests.
    pub policies: PolicyHandle,
    pub exits: ExitCauses,
    /// This node's index of requests waiting for a person.
    pub held: HeldRequests,
}

/// Starts the agent, opens its ACP session, and spawns the session task.
/// A new conversation is persisted whatever happens, with its
/// `agent_status` events; on failure its status is `failed`. A resumed one
/// (`resume`) keeps its status when the agent fails to start again, so a
/// later prompt can try again; its `agent_status` says why.
pub async fn start(
    params: StartParams,
) -> Result<(SessionHandle, Conversation, tokio::task::JoinHandle<()>)> {
    let StartParams {
        sink,
        profile,
        mut conversation,
        resume,
        max_line_bytes,
        shutdown,
        shutdown_timeout,
        write_buffer_events,
        policies,
        exits,
        held,
    } = params;
    let id = conversation.id;
    let span = tracing::info_span!(parent: None, "conversation", conversation_id = %id, agent = %profile.name);
    if !resume {
        sink.store.insert_conversation(&conversation).await?;
    }
    let mut journal = Journal::new(sink, &conversation, None);
    journal.append(AgentStatus::new(AgentState::Starting, None));
    journal.flush().await?;

    let earlier = conversation.acp_session_id.clone().filter(|_| resume);
    let mut state = conversation.state.clone();
    let started = connect(
        &profile,
        &conversation,
        earlier.as_deref(),
        &mut state,
        max_line_bytes,
        journal.store(),
    )
    .instrument(span.clone())
    .await;
    let Connected {
        process,
        record,
        session,
        opened,
        incoming,
        early,
    } = match started {
        Ok(connected) => connected,
        Err(err) => {
            tracing::warn!(parent: &span, error = %err, "agent failed to start");
            journal.append(AgentStatus::new(AgentState::Failed, Some(err.to_string())));
            if !resume {
                journal.set_status(ConversationStatus::Failed);
            }
            journal.flush().await?;
            return Err(err);
        }
    };
    if resume {
        tracing::info!(parent: &span, context = ?opened.context(), "agent started again");
        if let Some(context) = opened.context() {
            let cause = exits.lock().unwrap().remove(&id).unwrap_or("restart");
            telemetry::agent_restarted(context, cause);
        }
    }
    journal.set_acp_session_id(session.session_id().to_owned());
    if state != conversation.state {
        journal.set_state(&state);
    }
    journal.append(AgentStatus {
        context: opened.context().map(Into::into),
        ..AgentStatus::new(AgentState::Ready, None)
    });
    journal.set_status(ConversationStatus::Idle);
    journal.flush().await?;
    journal.ride_out_outages(write_buffer_events);
    // From now on its commits are the agent's, except while serving a
    // command (see `Session::take`).
    journal.serve(Lane::Agent);
    conversation.status = journal.status();
    conversation.acp_session_id = Some(session.session_id().to_owned());
    conversation.last_seq = journal.last_seq();
    conversation.updated_at = model::now();
    conversation.state = state.clone();

    let (tx, rx) = mpsc::channel(32);
    let idle = Arc::new(Mutex::new(Some(Instant::now())));
    let (output_tx, terminal_output) = mpsc::channel(64);
    // Files are never reached with the gateway's rights instead of the
    // agent's user's: without that user, neither files nor terminals.
    let user = agent_user(&profile);
    let reachable = user.is_some() || profile.user.is_none();
    // Terminal commands get what the agent got (as its user).
    let environment = profile.environment(user.as_ref());
    let served = Served::new(
        Workspace {
            cwd: PathBuf::from(&conversation.cwd),
            allowed_roots: profile.allowed_roots.clone(),
            user,
            files: profile.client_fs && reachable,
            terminals: profile.client_terminal && reachable,
        },
        session.session_id().to_owned(),
        profile.name.clone(),
        profile.mode,
        policies.clone(),
        output_tx,
        environment,
    );
    let task = Session {
        idle: idle.clone(),
        idle_timeout: Some(profile.idle_timeout).filter(|t| !t.is_zero()),
        shutdown_timeout,
        exits,
        journal,
        process,
        record,
        session,
        incoming: Some(incoming),
        early,
        commands: rx,
        agent: profile.name.clone(),
        mode: profile.mode,
        cwd: PathBuf::from(&conversation.cwd),
        policies,
        turn: None,
        prompt: None,
        pending: Pending::new(profile.permission_timeout, profile.on_timeout, held),
        transcript: Transcript::default(),
        state,
        changes: FuturesUnordered::new(),
        call_timeout: profile.startup_timeout,
        served,
        terminal_output,
    };
    let task = tokio::spawn(task.run(shutdown).instrument(span));
    let owner = conversation.owner.as_deref().map(Arc::from);
    Ok((SessionHandle { tx, owner, idle }, conversation, task))
}

/// A spawned agent with its ACP session open.
struct Connected {
    process: AgentProcess,
    /// What lets a later gateway kill what a crash of this one would leave
    /// of the agent; `None` where processes cannot be identified (no `/proc`).
    record: Option<AgentProcessRecord>,
    session: AgentSession,
    opened: Opened,
    incoming: mpsc::Receiver<Incoming>,
    /// What the agent sent while opening that is still to be applied.
    early: Vec<Incoming>,
}

/// Spawns the process, records it, and opens the ACP session (loading
/// `earlier` where the agent can).
async fn connect(
    profile: &AgentProfile,
    conversation: &Conversation,
    earlier: Option<&str>,
    state: &mut SessionState,
    max_line_bytes: usize,
    store: &dyn Store,
) -> Result<Connected> {
    let cwd = PathBuf::from(&conversation.cwd);
    let (mut process, pipes) = AgentProcess::spawn(profile, &cwd, conversation.id)
        .map_err(|e| Error::AgentFailed(format!("{e:#}")))?;
    // Before the handshake: a crash during it leaves an agent as well.
    let record = match record_process(store, &process, conversation.id).await {
        Ok(record) => record,
        Err(err) => {
            process.terminate(TERMINATE_GRACE).await;
            return Err(err);
        }
    };
    let (peer, mut incoming) = RpcPeer::spawn(
        pipes.stdout,
        pipes.stdin,
        RpcConfig {
            max_line_bytes,
            label: conversation.id.to_string(),
            ..RpcConfig::default()
        },
    );
    let opening = AgentSession::open(
        peer,
        &mut process,
        profile,
        &conversation.cwd,
        earlier,
        state,
        &mut incoming,
    );
    match opening.await {
        Ok(Opening {
            session,
            opened,
            early,
        }) => Ok(Connected {
            process,
            record,
            session,
            opened,
            incoming,
            early,
        }),
        Err(err) => {
            process.terminate(TERMINATE_GRACE).await;
            forget_process(store, record.as_ref()).await;
            Err(err)
        }
    }
}

/// Records a freshly spawned agent (see [`crate::process::procs`]).
async fn record_process(
    store: &dyn Store,
    process: &AgentProcess,
    conversation_id: Uuid,
) -> Result<Option<AgentProcessRecord>> {
    let (Some(host), Some((pid, start_time))) = (Host::here(), process.identity()) else {
        tracing::debug!("the agent process cannot be identified (no /proc): not recorded");
        return Ok(None);
    };
    let record = AgentProcessRecord {
        conversation_id,
        pid,
        start_time: start_time as i64,
        boot_id: host.boot_id.clone(),
        pid_namespace: host.pid_namespace.clone(),
        hostname: host.hostname.clone(),
        started_at: model::now(),
    };
    store.record_agent_process(&record).await?;
    Ok(Some(record))
}

/// Forgets an agent's record once it has been reaped and its group killed.
async fn forget_process(store: &dyn Store, record: Option<&AgentProcessRecord>) {
    let Some(record) = record else { return };
    if let Err(e) = store.forget_agent_process(record).await {
        // The next start judges it like any record (by pid and start time:
        // nothing of it runs any more) and forgets it then.
        tracing::warn!(error = %e, pid = record.pid, "could not forget the agent process record");
    }
}

/// A turn in progress.
struct Turn {
    id: Uuid,
    cancel_requested: bool,
    /// Carries `turn_id` into every log line of the turn.
    span: tracing::Span,
}

struct Session {
    journal: Journal,
    process: AgentProcess,
    /// Forgotten once the process is gone.
    record: Option<AgentProcessRecord>,
    session: AgentSession,
    /// `None` once the agent's stdout has closed.
    incoming: Option<mpsc::Receiver<Incoming>>,
    /// What the agent sent while its session opened, applied first.
    early: Vec<Incoming>,
    commands: mpsc::Receiver<Command>,
    /// The profile's name, mode and the conversation's cwd, for the policies.
    agent: String,
    mode: Mode,
    cwd: PathBuf,
    policies: PolicyHandle,
    turn: Option<Turn>,
    /// The outstanding `session/prompt` request.
    prompt: Option<CallFuture>,
    pending: Pending,
    transcript: Transcript,
    /// What the agent reports about its session.
    state: SessionState,
    /// Setting changes the agent has not answered yet.
    changes: FuturesUnordered<Changing>,
    /// How long the agent may take to answer a change.
    call_timeout: Duration,
    /// Since when the agent has been idle, shared with the handle.
    idle: Arc<Mutex<Option<Instant>>>,
    /// Stop the agent after this long idle (`None`: never).
    idle_timeout: Option<Duration>,
    /// How long a cancelled turn may take to end when the gateway stops.
    shutdown_timeout: Duration,
    exits: ExitCauses,
    /// Files and terminals, where the profile offers them.
    served: Served,
    /// Output of the terminals `served` runs.
    terminal_output: mpsc::Receiver<TerminalOutput>,
}

/// What woke the session loop.
enum Step {
    Incoming(Option<Incoming>),
    Answered(Result<Value, RpcError>),
    Exited,
    Due(Vec<Uuid>),
    Command(Option<Command>),
    Changed(Change, Result<Value>),
    Terminal(TerminalOutput),
    IdleTooLong,
    /// Time to commit what is held: the batch window closed, or the
    /// unreachable database is to be tried again.
    Retry,
}

/// Why the session loop ended.
enum End {
    /// The agent exited (or closed its stdout) by itself.
    AgentGone,
    /// A user closed the conversation: its turn and requests are cancelled.
    ClosedByUser { reply: Option<oneshot::Sender<()>> },
    /// The gateway stops the agent under a running conversation: its requests
    /// expire, its turn ends with an error. `cause` is for the metrics.
    Stopped { detail: String, cause: &'static str },
    /// The gateway shuts down: the running turn is cancelled as a user would
    /// cancel it, the agent gets `shutdown_timeout` to answer, then it stops.
    ShuttingDown,
}

async fn next_incoming(rx: &mut Option<mpsc::Receiver<Incoming>>) -> Option<Incoming> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// Resolves `timeout` after `since` (never without either).
async fn idle_for(since: Option<Instant>, timeout: Option<Duration>) {
    match (since, timeout) {
        (Some(since), Some(timeout)) => tokio::time::sleep_until(since + timeout).await,
        _ => std::future::pending().await,
    }
}

async fn next_prompt_result(prompt: &mut Option<CallFuture>) -> Result<Value, RpcError> {
    match prompt {
        Some(f) => f.await,
        None => std::future::pending().await,
    }
}

impl Session {
    async fn run(mut self, shutdown: CancellationToken) {
        let end = match self.apply_early().await {
            Ok(()) => self.serve(&shutdown).await,
            Err(e) => Err(e),
        };
        let end = match end {
            Ok(end) => end,
            Err(e) => {
                tracing::error!(error = %e, "session failed; stopping its agent");
                End::Stopped {
                    detail: "the gateway could not persist the conversation".into(),
                    cause: "error",
                }
            }
        };
        if let Err(e) = self.finish(end).await {
            tracing::error!(error = %e, "failed to record the end of the session");
        }
    }

    async fn serve(&mut self, shutdown: &CancellationToken) -> Result<End> {
        loop {
            let idle_since = self.idle_since();
            // Unbiased: a fast-streaming agent must not starve the user's
            // commands (a cancel above all).
            // While the database is away and the buffer full, the agent's
            // output waits in its pipe (backpressure), nothing is dropped.
            let full = self.journal.is_full();
            let step = tokio::select! {
                msg = next_incoming(&mut self.incoming), if !full => Step::Incoming(msg),
                _ = self.journal.retry_due() => Step::Retry,
                _ = self.journal.window_closes(BATCH_WINDOW) => Step::Retry,
                result = next_prompt_result(&mut self.prompt) => Step::Answered(result),
                _ = self.process.wait() => Step::Exited,
                due = self.pending.due() => Step::Due(due),
                cmd = self.commands.recv() => Step::Command(cmd),
                Some((change, answer)) = self.changes.next(), if !self.changes.is_empty() => {
                    Step::Changed(change, answer)
                }
                Some(output) = self.terminal_output.recv() => Step::Terminal(output),
                _ = shutdown.cancelled() => return Ok(End::ShuttingDown),
                _ = idle_for(idle_since, self.idle_timeout) => Step::IdleTooLong,
            };
            // Inside a turn, every log line says which.
            let span = self
                .turn
                .as_ref()
                .map_or_else(tracing::Span::none, |t| t.span.clone());
            match self.take(step).instrument(span).await {
                Ok(Some(end)) => return Ok(end),
                Ok(None) => {}
                // The database is away: the session goes on, writes wait.
                Err(e) if e.is_outage() => {
                    tracing::warn!(error = %e, "database unreachable; carrying on");
                }
                Err(e) => return Err(e),
            }
            self.note_idle();
        }
    }

    /// Carries out one step of the loop; `Some` when the session ends.
    async fn take(&mut self, step: Step) -> Result<Option<End>> {
        match step {
            Step::Incoming(Some(msg)) => {
                self.handle_incoming(msg).await?;
                self.drain_incoming(MAX_BATCH_EVENTS).await?;
                if self.commit_due() {
                    self.flush().await?;
                }
            }
            Step::Incoming(None) => {
                self.incoming = None;
                if tokio::time::timeout(EXIT_AFTER_EOF, self.process.wait())
                    .await
                    .is_err()
                {
                    tracing::warn!("agent closed stdout but kept running; killing it");
                    self.process.terminate(TERMINATE_GRACE).await;
                }
                return Ok(Some(End::AgentGone));
            }
            Step::Answered(result) => {
                self.prompt = None;
                // Everything the agent sent before its answer is queued
                // already: apply it first so the turn ends last.
                self.drain_incoming(usize::MAX).await?;
                // When the agent is going away, the exit path ends the turn.
                if !matches!(result, Err(RpcError::Closed(_))) {
                    self.end_turn(result);
                    self.flush().await?;
                }
            }
            Step::Exited => {
                // What it wrote before dying may still be in the pipe.
                self.drain_until_closed().await?;
                return Ok(Some(End::AgentGone));
            }
            Step::Due(due) => self.time_out(due).await?,
            Step::Retry => self.flush().await?,
            Step::Command(Some(Command::Close { reply })) => {
                return Ok(Some(End::ClosedByUser { reply: Some(reply) }));
            }
            Step::Command(Some(Command::Release { reply })) => {
                let idle = self.is_idle();
                let _ = reply.send(idle);
                if idle {
                    return Ok(Some(End::Stopped {
                        detail: "stopped to make room for another conversation's agent".into(),
                        cause: "capacity",
                    }));
                }
            }
            Step::Command(Some(cmd)) => {
                // A person waits for its answer: its writes go first.
                self.journal.serve(Lane::Person);
                let handled = self.handle_command(cmd).await;
                self.journal.serve(Lane::Agent);
                handled?;
            }
            Step::Changed(change, answer) => {
                // What the agent sent before its answer (its own report of
                // the change, say) comes first, as it did on the wire.
                self.drain_incoming(usize::MAX).await?;
                self.changed(change, answer).await?;
            }
            Step::Terminal(output) => {
                self.journal.append(output);
                if self.commit_due() {
                    self.flush().await?;
                }
            }
            Step::Command(None) => return Ok(Some(End::ClosedByUser { reply: None })),
            Step::IdleTooLong => {
                let after = humantime_serde::re::humantime::format_duration(
                    self.idle_timeout.unwrap_or_default(),
                );
                tracing::info!(%after, "stopping the idle agent");
                return Ok(Some(End::Stopped {
                    detail: format!("stopped after {after} idle"),
                    cause: "idle",
                }));
            }
        }
        Ok(None)
    }

    /// Whether the agent has no turn, no pending request and no setting
    /// change to answer.
    fn is_idle(&self) -> bool {
        self.turn.is_none() && self.pending.is_empty() && self.changes.is_empty()
    }

    fn idle_since(&self) -> Option<Instant> {
        *self.idle.lock().unwrap()
    }

    /// Starts or ends the idle period after whatever just happened.
    fn note_idle(&self) {
        let mut idle = self.idle.lock().unwrap();
        match (self.is_idle(), *idle) {
            (true, None) => *idle = Some(Instant::now()),
            (false, Some(_)) => *idle = None,
            _ => {}
        }
    }

    /// Applies what the agent sent while its session opened.
    async fn apply_early(&mut self) -> Result<()> {
        for msg in std::mem::take(&mut self.early) {
            self.handle_incoming(msg).await?;
        }
        self.flush().await
    }

    /// After the agent exited: applies everything left in its stdout until the
    /// reader reaches the end (bounded, in case a stray process holds the pipe).
    async fn drain_until_closed(&mut self) -> Result<()> {
        let deadline = tokio::time::Instant::now() + EXIT_AFTER_EOF;
        while let Some(rx) = self.incoming.as_mut() {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(msg)) => self.handle_incoming(msg).await?,
                Ok(None) | Err(_) => self.incoming = None,
            }
            if self.commit_due() {
                self.flush().await?;
            }
        }
        Ok(())
    }

    /// Applies whatever the agent has already sent, up to `max` messages.
    async fn drain_incoming(&mut self, max: usize) -> Result<()> {
        let mut n = 0;
        while n < max && !self.journal.is_full() {
            let Some(rx) = self.incoming.as_mut() else {
                break;
            };
            match rx.try_recv() {
                Ok(msg) => self.handle_incoming(msg).await?,
                Err(_) => break,
            }
            n += 1;
            if self.commit_due() {
                self.flush().await?;
            }
        }
        Ok(())
    }

    /// Whether to commit now (see [`Journal::commit_due`]).
    fn commit_due(&self) -> bool {
        self.journal
            .commit_due(BATCH_WINDOW, MAX_BATCH_EVENTS, MAX_BATCH_TEXT)
    }

    /// Commits what happened: the journal's batch with the transcript's
    /// changes.
    async fn flush(&mut self) -> Result<()> {
        self.save_transcript();
        self.journal.flush().await
    }

    /// Moves the transcript's changes into the journal's batch.
    fn save_transcript(&mut self) {
        let changes = self.transcript.take_changes();
        for message in changes.messages {
            self.journal.save_message(message);
        }
        for call in changes.tool_calls {
            self.journal.save_tool_call(call);
        }
    }

    fn status_now(&self) -> ConversationStatus {
        if !self.pending.is_empty() {
            ConversationStatus::AwaitingPermission
        } else if self.turn.is_some() {
            ConversationStatus::Running
        } else {
            ConversationStatus::Idle
        }
    }

    fn turn_id(&self) -> Option<Uuid> {
        self.turn.as_ref().map(|t| t.id)
    }

    async fn handle_incoming(&mut self, msg: Incoming) -> Result<()> {
        match msg {
            Incoming::Notification { method, params } => match method.as_str() {
                "session/update" => self.on_update(params),
                "$/cancel_request" => self.on_cancel_request(params).await?,
                other => tracing::debug!(method = other, "ignoring notification"),
            },
            Incoming::TextChunk(chunk) => {
                let turn_id = self.turn_id();
                self.transcript.text_chunk(&chunk, turn_id);
                self.journal.text_chunk(turn_id, &chunk);
            }
            Incoming::Request(request) => match request.method.as_str() {
                "session/request_permission" => self.on_permission_request(request).await?,
                method if self.served.serves(method) => {
                    if let Some(write) = self.served.handle(request, self.journal.store()).await? {
                        self.record_write(write).await?;
                    }
                }
                _ => request.reject_unknown_method(),
            },
        }
        Ok(())
    }

    /// A file the agent wrote: recorded and published, then the agent hears
    /// it is done (even while the database is away: the event waits in the
    /// journal, the file is written).
    async fn record_write(&mut self, write: Write) -> Result<()> {
        let Write { written, responder } = write;
        tracing::info!(path = %written.path, "agent wrote a file");
        self.journal.append(written);
        let flushed = self.flush().await;
        responder.respond(serde_json::json!({}));
        flushed
    }

    fn on_update(&mut self, mut params: Value) {
        // Taken, not copied: an update may be megabytes long.
        let update = params
            .as_object_mut()
            .and_then(|p| p.remove("update"))
            .filter(Value::is_object);
        let Some(update) = update else {
            tracing::warn!("session/update without an update object; ignored");
            return;
        };
        let turn_id = self.turn_id();
        if self.state.apply_update(&update) {
            self.journal.set_state(&self.state);
        }
        if self.transcript.apply(&update, turn_id) {
            self.journal.chunk(turn_id, update);
        } else {
            self.journal.session_update(turn_id, update);
        }
    }

    async fn on_permission_request(&mut self, request: IncomingRequest) -> Result<()> {
        let params = &request.params;
        let tool_call = params.get("toolCall").filter(|v| v.is_object()).cloned();
        let options = params.get("options").and_then(Value::as_array).cloned();
        let (Some(tool_call), Some(options)) = (tool_call, options) else {
            request.responder.respond_error(
                INVALID_PARAMS,
                "session/request_permission needs toolCall (object) and options (array)",
                None,
            );
            return Ok(());
        };
        let turn_id = self.turn_id();
        // The request's toolCall is an update of a call the agent may have
        // announced before (Mistral Vibe sends only its id): what it says
        // goes into the call's record, and the request is stored, shown and
        // judged with the whole call, so a person approves what the policies
        // judged.
        self.transcript.apply_tool_call_update(&tool_call, turn_id);
        let tool_call = self.transcript.known_tool_call(&tool_call);
        let permission = PermissionRequest {
            id: model::new_id(),
            conversation_id: self.journal.conversation_id(),
            turn_id,
            tool_call,
            options,
            status: PermissionStatus::Pending,
            decision: None,
            created_at: model::now(),
        };
        tracing::info!(permission_id = %permission.id, "agent asks permission");
        // With the database away: the policies as last seen, no remembered
        // answers (a person is asked rather than anything assumed).
        let policies = match self.policies.refresh(self.journal.store()).await {
            Err(e) if e.is_outage() => self.policies.current(),
            other => other?,
        };
        let remembered = match self
            .journal
            .store()
            .list_rules(permission.conversation_id)
            .await
        {
            Err(e) if e.is_outage() => Vec::new(),
            other => other?,
        };
        // Its paths as they really are too: a symlink hides nothing from a
        // deny (the agent reaches them itself; this is as of now).
        let given = policy::tool_paths(&permission.tool_call, &self.cwd);
        let real_paths = self.served.real_paths(given).await;
        let facts = Facts {
            agent: &self.agent,
            tool_call: &permission.tool_call,
            cwd: &self.cwd,
            mode: self.mode,
            real_paths: &real_paths,
        };
        match self
            .pending
            .decide(&permission, &policies, &facts, &remembered)
        {
            Some((status, decision)) => {
                // Decided by policy: requested and resolved are committed
                // together and both published, so the audit trail shows what
                // ran without a person, and which rule let it.
                let answer = decision.acp_result();
                self.journal
                    .add_permission_request(&permission, Some((status, decision)));
                self.flush().await?;
                request.responder.respond(answer);
            }
            None => {
                self.journal.add_permission_request(&permission, None);
                self.pending.park(permission, request.responder);
                self.journal.set_status(self.status_now());
            }
        }
        Ok(())
    }

    /// Answers the requests whose `permission_timeout` ran out.
    async fn time_out(&mut self, due: Vec<Uuid>) -> Result<()> {
        let reason = self.pending.timeout_reason();
        for id in due {
            let Some(option) = self.pending.expire(id) else {
                continue;
            };
            let resolved = self
                .resolve(
                    id,
                    PermissionStatus::TimedOut,
                    option,
                    "system",
                    Some(&reason),
                )
                .await;
            match resolved {
                Ok(_) => {}
                // Answered once the database can record it.
                Err(e) if e.is_outage() => self.pending.retry_later(id, Duration::from_secs(1)),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// The agent withdrew one of its own requests.
    async fn on_cancel_request(&mut self, params: Value) -> Result<()> {
        let Some(request_id) = params.get("requestId") else {
            return Ok(());
        };
        if let Some(id) = self.pending.find_by_rpc_id(request_id) {
            self.resolve(
                id,
                PermissionStatus::Cancelled,
                None,
                "system",
                Some("withdrawn by the agent"),
            )
            .await?;
        }
        Ok(())
    }

    /// Decides a pending request: persisted first, then the agent is
    /// answered, then `permission_resolved` is published.
    async fn resolve(
        &mut self,
        id: Uuid,
        status: PermissionStatus,
        option_id: Option<String>,
        decided_by: &str,
        reason: Option<&str>,
    ) -> Result<Option<PermissionRequest>> {
        self.resolve_via(id, status, option_id, decided_by, reason, None)
            .await
    }

    /// [`Self::resolve`], saying how a person's answer came.
    async fn resolve_via(
        &mut self,
        id: Uuid,
        status: PermissionStatus,
        option_id: Option<String>,
        decided_by: &str,
        reason: Option<&str>,
        via: Option<String>,
    ) -> Result<Option<PermissionRequest>> {
        self.flush().await?;
        let Some(parked) = self.pending.take(id) else {
            return Ok(None);
        };
        let decision = Decision {
            via,
            ..Decision::new(option_id, decided_by.to_owned(), reason.map(str::to_owned))
        };
        self.journal.set_status(self.status_now());
        let resolution = Resolution {
            request: parked.request.clone(),
            status,
            decision: decision.clone(),
        };
        match self.journal.resolve(&resolution).await {
            Ok(Some(request)) => {
                parked.responder.respond(decision.acp_result());
                Ok(Some(request))
            }
            Ok(None) => {
                // Resolved elsewhere (cannot happen while we own it, but the
                // store is the arbiter): answer the agent with what won.
                let current = self.journal.store().get_permission(id).await?;
                if let Some(d) = current.as_ref().and_then(|c| c.decision.as_ref()) {
                    parked.responder.respond(d.acp_result());
                }
                Ok(current)
            }
            Err(e) => {
                // Not persisted: keep it pending so nothing is lost.
                self.pending.put_back(parked);
                self.journal.set_status(self.status_now());
                Err(e)
            }
        }
    }

    async fn resolve_all(&mut self, status: PermissionStatus, reason: &str) -> Result<()> {
        for id in self.pending.ids() {
            self.resolve(id, status, None, "system", Some(reason))
                .await?;
        }
        Ok(())
    }

    async fn handle_command(&mut self, cmd: Command) -> Result<()> {
        match cmd {
            Command::Prompt { content, reply } => {
                let result = self.start_turn(content).await;
                let _ = reply.send(result);
            }
            Command::Cancel { reply } => {
                let result = self.cancel_turn("turn cancelled").await;
                let _ = reply.send(result);
            }
            Command::Respond {
                permission_id,
                answer,
                decided_by,
                via,
                reply,
            } => {
                let result = self.answer(permission_id, answer, &decided_by, via).await;
                let _ = reply.send(result);
            }
            Command::Change(change) => self.change(change),
            Command::Close { reply } => {
                let _ = reply.send(());
            }
            Command::Release { reply } => {
                let _ = reply.send(false);
            }
        }
        Ok(())
    }

    /// Sends a user's change of a setting to the agent, once checked
    /// against what it offers (else refused at once); answered in
    /// [`Session::changed`].
    fn change(&mut self, change: Change) {
        let request = match &change.setting {
            Setting::Mode(mode_id) => self
                .state
                .check_mode(mode_id)
                .map(|()| ("session/set_mode", self.session.set_mode(mode_id))),
            Setting::ConfigOption { config_id, value } => {
                self.state.config_request(config_id, value).map(|params| {
                    (
                        "session/set_config_option",
                        self.session.set_config_option(params),
                    )
                })
            }
        };
        let (method, answer) = match request {
            Ok(request) => request,
            Err(why) => {
                let _ = change.reply.send(Err(Error::Unprocessable(why)));
                return;
            }
        };
        tracing::info!(setting = ?change.setting, changed_by = %change.changed_by, "changing a session setting");
        let timeout = self.call_timeout;
        self.changes.push(Box::pin(async move {
            let answer = match tokio::time::timeout(timeout, answer).await {
                Ok(Ok(answer)) => Ok(answer),
                Ok(Err(RpcError::Remote { code, message, .. })) => Err(Error::AgentFailed(
                    format!("the agent refused {method} (error {code}): {message}"),
                )),
                Ok(Err(RpcError::Closed(reason))) => Err(Error::AgentFailed(format!(
                    "the agent went away before it answered {method}: {reason}"
                ))),
                Err(_) => Err(Error::AgentTimeout(format!(
                    "the agent did not answer {method} within {}",
                    humantime_serde::re::humantime::format_duration(timeout)
                ))),
            };
            (change, answer)
        }));
    }

    /// The agent answered a change: once accepted, it is recorded (the
    /// conversation's state and an event every client sees), then the user
    /// is told.
    async fn changed(&mut self, change: Change, answer: Result<Value>) -> Result<()> {
        let Change {
            setting,
            changed_by,
            reply,
        } = change;
        let answer = match answer {
            Ok(answer) => answer,
            Err(e) => {
                tracing::warn!(error = %e, "a session setting was not changed");
                let _ = reply.send(Err(e));
                return Ok(());
            }
        };
        match &setting {
            Setting::Mode(mode_id) => {
                self.state.set_current_mode(mode_id);
                self.journal.append(ModeChanged {
                    mode_id: mode_id.clone(),
                    changed_by: changed_by.clone(),
                    modes: self.state.modes.clone(),
                });
            }
            Setting::ConfigOption { config_id, value } => {
                match answer.get("configOptions").filter(|o| o.is_array()) {
                    Some(options) => {
                        self.state.set_config_options(options.clone());
                    }
                    None => tracing::warn!(
                        "the agent answered session/set_config_option without configOptions"
                    ),
                }
                self.journal.append(ConfigOptionChanged {
                    config_id: config_id.clone(),
                    value: value.clone(),
                    changed_by: changed_by.clone(),
                    config_options: self.state.config_options.clone(),
                });
            }
        }
        self.journal.set_state(&self.state);
        let flushed = self.flush().await;
        let _ = reply.send(match &flushed {
            Ok(()) => Ok(()),
            Err(e) => Err(Error::Unavailable(format!(
                "the agent changed the setting but it could not be recorded: {e}"
            ))),
        });
        flushed
    }

    async fn start_turn(&mut self, content: Vec<Value>) -> Result<Uuid> {
        if self.turn.is_some() {
            return Err(Error::conflict(
                "turn_in_progress",
                "a turn is already running; cancel it or wait for turn_ended",
            ));
        }
        let turn_id = model::new_id();
        self.turn = Some(Turn {
            id: turn_id,
            cancel_requested: false,
            span: tracing::info_span!("turn", %turn_id),
        });
        self.journal.set_turn(Some(turn_id));
        self.journal.append(TurnStarted {
            turn_id,
            content: content.clone(),
        });
        let turn_started = self.journal.last_seq();
        let prompt = self.session.prompt(&content);
        self.transcript.user_prompt(turn_id, content, turn_started);
        self.journal.set_status(self.status_now());
        if let Err(e) = self.flush().await {
            self.turn = None;
            self.journal.set_turn(None);
            return Err(e);
        }
        if let Some(turn) = &self.turn {
            turn.span
                .in_scope(|| tracing::info!(%turn_id, "turn started"));
        }
        self.prompt = Some(prompt);
        Ok(turn_id)
    }

    /// The ACP cancel rule: `session/cancel`, then every pending request of
    /// the session is answered with the cancelled outcome.
    async fn cancel_turn(&mut self, reason: &str) -> Result<()> {
        let Some(turn) = self.turn.as_mut() else {
            return Ok(());
        };
        turn.cancel_requested = true;
        if let Err(e) = self.session.cancel().await {
            tracing::warn!(error = %e, "could not send session/cancel");
        }
        self.resolve_all(PermissionStatus::Cancelled, reason).await
    }

    /// Shutting down: cancels the running turn and gives the agent
    /// `shutdown_timeout` to answer the prompt (applying what it sends
    /// meanwhile), so the turn ends as the agent ends it.
    async fn wind_down(&mut self) -> Result<()> {
        if self.turn.is_none() {
            return Ok(());
        }
        self.cancel_turn("the gateway is shutting down").await?;
        let deadline = tokio::time::Instant::now() + self.shutdown_timeout;
        while self.turn.is_some() {
            tokio::select! {
                result = next_prompt_result(&mut self.prompt) => {
                    self.prompt = None;
                    self.drain_incoming(usize::MAX).await?;
                    if !matches!(result, Err(RpcError::Closed(_))) {
                        self.end_turn(result);
                    }
                    break;
                }
                msg = next_incoming(&mut self.incoming) => match msg {
                    Some(msg) => self.handle_incoming(msg).await?,
                    None => break,
                },
                _ = tokio::time::sleep_until(deadline) => {
                    tracing::warn!("the agent did not answer session/cancel before shutdown_timeout");
                    break;
                }
            }
        }
        self.flush().await
    }

    /// A user's answer to a request this session holds (`None`: it holds
    /// none with that id). An "always" answer is remembered as rules.
    async fn answer(
        &mut self,
        id: Uuid,
        answer: Answer,
        decided_by: &str,
        via: Option<String>,
    ) -> Result<Option<PermissionRequest>> {
        let Some(pending) = self.pending.get(id) else {
            return Ok(None);
        };
        let status = validate_answer(pending, &answer)?;
        let option_id = match answer.clone() {
            Answer::Option(id) => Some(id),
            Answer::Cancelled => None,
        };
        let always = option_id
            .as_deref()
            .and_then(|o| option_kind(pending, o))
            .filter(|kind| kind.ends_with("_always"))
            .map(|kind| {
                let keys = keys_to_remember(&self.transcript.known_tool_call(&pending.tool_call));
                (kind.to_owned(), keys)
            });
        // An "always" that would cover more than the user saw is not
        // remembered; the answer applies to this request, and says why.
        let reason = match &always {
            Some((_, Err(why))) => Some(format!("not remembered: {why}")),
            _ => None,
        };
        // What was stored is the truth: our own decision reads back as the
        // identical answer.
        let request = match self
            .resolve_via(id, status, option_id, decided_by, reason.as_deref(), via)
            .await?
        {
            Some(request) => answer_resolved(request, &answer)?,
            None => return Err(Error::NotFound(format!("no permission request {id}"))),
        };
        match always {
            Some((option_kind, Ok(keys))) => {
                for key in keys {
                    let rule = model::Rule {
                        id: model::new_id(),
                        conversation_id: request.conversation_id,
                        tool_kind: key.kind,
                        subject: key.subject,
                        option_kind: option_kind.clone(),
                        permission_id: request.id,
                        created_at: model::now(),
                    };
                    let rule = self.journal.store().upsert_rule(&rule).await?;
                    tracing::info!(rule_id = %rule.id, kind = %rule.tool_kind,
                        subject = %rule.subject, "remembered {}", rule.option_kind);
                }
            }
            Some((option_kind, Err(why))) => {
                tracing::info!(permission_id = %id, %why, "{option_kind} not remembered");
            }
            None => {}
        }
        Ok(Some(request))
    }

    fn end_turn(&mut self, result: Result<Value, RpcError>) {
        let Some(turn) = self.turn.take() else { return };
        let (stop_reason, error) = match result {
            Ok(value) => match value.get("stopReason").and_then(Value::as_str) {
                Some(reason) => (reason.to_owned(), None),
                None => (
                    "error".to_owned(),
                    Some("agent answered session/prompt without a stopReason".to_owned()),
                ),
            },
            Err(_) if turn.cancel_requested => ("cancelled".to_owned(), None),
            Err(RpcError::Remote { code, message, .. }) => (
                "error".to_owned(),
                Some(format!("agent error {code}: {message}")),
            ),
            Err(RpcError::Closed(reason)) => ("error".to_owned(), Some(reason)),
        };
        tracing::info!(turn_id = %turn.id, %stop_reason, "turn ended");
        self.journal.append(TurnEnded {
            turn_id: turn.id,
            stop_reason,
            error,
        });
        self.journal.set_turn(None);
        self.journal.set_status(self.status_now());
    }

    /// The agent is gone: the setting changes it was asked for are
    /// answered now, with its answer if it gave one, else the end of its
    /// connection.
    async fn settle_changes(&mut self) -> Result<()> {
        while let Ok(Some((change, answer))) =
            tokio::time::timeout(EXIT_AFTER_EOF, self.changes.next()).await
        {
            self.changed(change, answer).await?;
        }
        Ok(())
    }

    /// A user closed the conversation: `session/close`, where the agent
    /// takes it, so it frees what it holds for the session (applying what it
    /// sends meanwhile), within [`CLOSE_GRACE`].
    async fn close_session(&mut self) -> Result<()> {
        let Some(closing) = self.session.close() else {
            return Ok(());
        };
        tokio::pin!(closing);
        let deadline = tokio::time::Instant::now() + CLOSE_GRACE;
        loop {
            tokio::select! {
                answer = &mut closing => {
                    if let Err(e) = answer {
                        tracing::warn!(error = %e, "session/close failed");
                    }
                    return Ok(());
                }
                msg = next_incoming(&mut self.incoming) => match msg {
                    Some(msg) => self.handle_incoming(msg).await?,
                    None => return Ok(()),
                },
                _ = tokio::time::sleep_until(deadline) => {
                    tracing::warn!("the agent did not answer session/close in time");
                    return Ok(());
                }
            }
        }
    }

    /// Counts why the agent went, and remembers it for a restart's count.
    fn exited(&self, cause: &'static str) {
        telemetry::agent_exited(cause);
        self.exits
            .lock()
            .unwrap()
            .insert(self.journal.conversation_id(), cause);
    }

    /// Records how the session ended and makes sure the agent is gone.
    async fn finish(&mut self, end: End) -> Result<()> {
        // The agent's terminals go with it; what they printed, and how they
        // ended, is kept (waiting a little for a command that will not die).
        let ended = self.served.stop();
        tokio::pin!(ended);
        let bound = tokio::time::sleep(TERMINALS_END);
        tokio::pin!(bound);
        loop {
            tokio::select! {
                Some(output) = self.terminal_output.recv() => self.journal.append(output),
                () = &mut ended => break,
                () = &mut bound => break,
            }
        }
        while let Ok(output) = self.terminal_output.try_recv() {
            self.journal.append(output);
        }
        let by_user = matches!(end, End::ClosedByUser { .. });
        let (detail, stop_reason, reply) = match end {
            End::AgentGone => (String::new(), "error", None),
            End::ClosedByUser { reply } => {
                self.exited("closed");
                ("conversation closed".to_owned(), "cancelled", reply)
            }
            End::Stopped { detail, cause } => {
                self.exited(cause);
                (detail, "error", None)
            }
            End::ShuttingDown => {
                self.exited("shutdown");
                self.wind_down().await?;
                ("the gateway is shutting down".to_owned(), "cancelled", None)
            }
        };
        let closing = !detail.is_empty();
        if closing {
            if let Some(turn) = self.turn.as_mut() {
                // Politely first: the agent may still wrap up its updates.
                turn.cancel_requested = true;
                let _ = self.session.cancel().await;
            }
            if stop_reason == "cancelled" {
                self.resolve_all(PermissionStatus::Cancelled, &detail)
                    .await?;
            }
            if by_user {
                self.close_session().await?;
            }
            self.process.terminate(TERMINATE_GRACE).await;
            self.drain_until_closed().await?;
        }
        // Closed only by a user: otherwise the next prompt starts the agent
        // again.
        let final_status = if by_user {
            ConversationStatus::Closed
        } else {
            ConversationStatus::Idle
        };
        let (agent_state, detail) = if closing {
            (AgentState::Exited, detail)
        } else {
            let status = self.process.wait().await;
            self.process.drain_stderr().await;
            let detail = describe_exit(status, &self.process.stderr_tail());
            tracing::warn!(%detail, "agent exited");
            self.exited(if status.success() {
                "exited"
            } else {
                "crashed"
            });
            let state = if status.success() {
                AgentState::Exited
            } else {
                AgentState::Failed
            };
            (state, detail)
        };
        self.settle_changes().await?;
        // What waits for an unreachable database is written first (the
        // requests' answers must come after it).
        self.save_transcript();
        let patience = if by_user || stop_reason == "cancelled" {
            self.shutdown_timeout
        } else {
            OUTAGE_PATIENCE
        };
        let deadline = tokio::time::Instant::now() + patience;
        self.journal.settle(deadline).await;
        // Reaped, and its group killed with it.
        forget_process(self.journal.store(), self.record.take().as_ref()).await;
        // Requests the agent can no longer receive an answer for.
        let reason = format!("the agent went away: {}", first_line(&detail));
        self.resolve_all(PermissionStatus::Expired, &reason).await?;
        let turn_ended = self.turn.take().map(|turn| TurnEnded {
            turn_id: turn.id,
            stop_reason: stop_reason.to_owned(),
            error: (stop_reason == "error").then(|| detail.clone()),
        });
        let agent = AgentStatus::new(agent_state, Some(detail));
        self.save_transcript();
        self.journal
            .agent_gone(turn_ended, agent, final_status)
            .await?;
        // Nothing held in memory may go with the task.
        self.journal.settle(deadline).await;
        if let Some(reply) = reply {
            let _ = reply.send(());
        }
        Ok(())
    }
}

/// The system user the profile's agent runs as (files it reaches through
/// the gateway are reached with that user's rights).
fn agent_user(profile: &AgentProfile) -> Option<crate::sys::SystemUser> {
    let name = profile.user.as_deref()?;
    match crate::sys::lookup_user(name) {
        Ok(user) => Some(user),
        Err(e) => {
            tracing::warn!(error = %e, "the agent's user is gone");
            None
        }
    }
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or(s)
}
