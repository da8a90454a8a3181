//! One live conversation: the task that owns its agent process and ACP
//! connection, turns agent messages into events and state, and carries out
//! commands from the API (prompt, cancel, answer a permission request, close).
//!
//! Data flows agent stdout → rpc → this task → [`Journal`] (commit, then
//! publish); commands flow API → [`SessionHandle`] → this task → rpc → agent
//! stdin. Everything about one conversation happens in this one task, so its
//! state needs no locks and its events have one order.

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use uuid::Uuid;

use agent_client_protocol_schema as acp_schema;
use agent_client_protocol_schema::v1 as acp;

use crate::acp::agent::{describe_exit, AgentProcess};
use crate::acp::procs::Host;
use crate::acp::rpc::{Incoming, IncomingRequest, Responder, RpcConfig, RpcError, RpcPeer};
use crate::config::AgentProfile;
use crate::error::{Error, Result};
use crate::journal::{Journal, Sink};
use crate::model::{
    self, event_type, Conversation, ConversationStatus, Decision, Message, PermissionRequest,
    PermissionStatus, Role, ToolCall,
};
use crate::permissions::{
    answer_resolved, automatic_answer, keys_to_remember, option_kind, timeout_option,
    validate_answer, Answer, Deadlines, OnTimeout, Rule,
};
use crate::policy::{Facts, Mode, PolicyHandle, RateLimiter};
use crate::store::{AgentProcessRecord, Resolution, Store};

/// Most events committed in one batch while an agent streams.
const MAX_BATCH_EVENTS: usize = 512;
/// How long an agent gets to exit after SIGTERM.
const TERMINATE_GRACE: Duration = Duration::from_secs(2);
/// How long we wait for the process after its stdout closed.
const EXIT_AFTER_EOF: Duration = Duration::from_secs(3);

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
        reply: oneshot::Sender<Result<PermissionRequest>>,
    },
    Close {
        reply: oneshot::Sender<()>,
    },
}

/// The API's handle to a live conversation.
#[derive(Clone)]
pub struct SessionHandle {
    tx: mpsc::Sender<Command>,
}

impl SessionHandle {
    async fn call<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Command) -> Option<T> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(make(reply)).await.ok()?;
        rx.await.ok()
    }

    /// Starts a turn; returns its id once `turn_started` is committed.
    /// `None`: the session has ended.
    pub async fn prompt(&self, content: Vec<Value>) -> Option<Result<Uuid>> {
        self.call(|reply| Command::Prompt { content, reply }).await
    }

    pub async fn cancel(&self) -> Option<Result<()>> {
        self.call(|reply| Command::Cancel { reply }).await
    }

    pub async fn respond(
        &self,
        permission_id: Uuid,
        answer: Answer,
        decided_by: String,
    ) -> Option<Result<PermissionRequest>> {
        self.call(|reply| Command::Respond {
            permission_id,
            answer,
            decided_by,
            reply,
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
}

/// Everything needed to start a session.
pub struct StartParams {
    pub sink: Sink,
    pub profile: AgentProfile,
    pub conversation: Conversation,
    pub max_line_bytes: usize,
    /// Cancelled when the gateway stops: the session closes its agent.
    pub shutdown: CancellationToken,
    /// The operator policies that may answer permission requests.
    pub policies: PolicyHandle,
}

/// Starts the agent, runs `initialize` and `session/new`, and spawns the
/// session task. The conversation is persisted whatever happens, with its
/// `agent_status` events; on failure its status is `failed`.
pub async fn start(
    params: StartParams,
) -> Result<(SessionHandle, Conversation, tokio::task::JoinHandle<()>)> {
    let StartParams {
        sink,
        profile,
        mut conversation,
        max_line_bytes,
        shutdown,
        policies,
    } = params;
    let id = conversation.id;
    let span = tracing::info_span!("conversation", conversation_id = %id, agent = %profile.name);
    sink.store.insert_conversation(&conversation).await?;
    let mut journal = Journal::new(sink, &conversation, None);
    journal.event(
        event_type::AGENT_STATUS,
        json!({"status": "starting", "detail": null}),
    );
    journal.flush().await?;

    let started = connect(&profile, &conversation, max_line_bytes, journal.store())
        .instrument(span.clone())
        .await;
    let (Connected { process, record }, peer, incoming, acp_session_id) = match started {
        Ok(parts) => parts,
        Err(err) => {
            tracing::warn!(parent: &span, error = %err, "agent failed to start");
            journal.event(
                event_type::AGENT_STATUS,
                json!({"status": "failed", "detail": err.to_string()}),
            );
            journal.set_status(ConversationStatus::Failed);
            journal.flush().await?;
            return Err(err);
        }
    };
    journal.acp_session_id = Some(acp_session_id.clone());
    journal.event(
        event_type::AGENT_STATUS,
        json!({"status": "ready", "detail": null}),
    );
    journal.set_status(ConversationStatus::Idle);
    journal.flush().await?;
    conversation.status = journal.status;
    conversation.acp_session_id = Some(acp_session_id.clone());
    conversation.last_seq = journal.last_seq();
    conversation.updated_at = model::now();

    let (tx, rx) = mpsc::channel(32);
    let session = Session {
        journal,
        process,
        record,
        peer,
        incoming: Some(incoming),
        commands: rx,
        acp_session_id,
        permission_timeout: profile.permission_timeout,
        on_timeout: profile.on_timeout,
        agent: profile.name.clone(),
        mode: profile.mode,
        cwd: PathBuf::from(&conversation.cwd),
        policies,
        limiter: RateLimiter::default(),
        turn: None,
        prompt: None,
        pending: HashMap::new(),
        deadlines: Deadlines::default(),
        message: None,
        tool_calls: HashMap::new(),
        dirty_tool_calls: Vec::new(),
    };
    let task = tokio::spawn(session.run(shutdown).instrument(span));
    Ok((SessionHandle { tx }, conversation, task))
}

/// A spawned agent and the record that lets a later gateway kill what a
/// crash of this one would leave of it.
struct Connected {
    process: AgentProcess,
    /// `None` where processes cannot be identified (no `/proc`).
    record: Option<AgentProcessRecord>,
}

/// Spawns the process, records it, and performs the ACP handshake.
async fn connect(
    profile: &AgentProfile,
    conversation: &Conversation,
    max_line_bytes: usize,
    store: &dyn Store,
) -> Result<(Connected, RpcPeer, mpsc::Receiver<Incoming>, String)> {
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
    let (peer, incoming) = RpcPeer::spawn(
        pipes.stdout,
        pipes.stdin,
        RpcConfig {
            max_line_bytes,
            label: conversation.id.to_string(),
            ..RpcConfig::default()
        },
    );
    let handshake = async {
        // We serve neither files nor terminals (yet): the default capabilities
        // say so, and agents must not ask for them.
        let init = acp::InitializeRequest::new(acp_schema::ProtocolVersion::V1)
            .client_capabilities(acp::ClientCapabilities::default())
            .client_info(acp::Implementation::new(
                "acp-gateway",
                env!("CARGO_PKG_VERSION"),
            ));
        let init = call(
            &peer,
            &mut process,
            profile.startup_timeout,
            "initialize",
            to_json(&init),
        )
        .await?;
        let init: acp::InitializeResponse = from_json("initialize", init)?;
        if init.protocol_version != acp_schema::ProtocolVersion::V1 {
            return Err(Error::AgentFailed(format!(
                "agent speaks ACP protocol version {}, the gateway speaks 1",
                to_json(&init.protocol_version)
            )));
        }
        let new =
            acp::NewSessionRequest::new(&conversation.cwd).mcp_servers(profile.mcp_servers.clone());
        let new = call(
            &peer,
            &mut process,
            profile.startup_timeout,
            "session/new",
            to_json(&new),
        )
        .await?;
        let new: acp::NewSessionResponse = from_json("session/new", new)?;
        Ok(new.session_id.0.to_string())
    };
    match handshake.await {
        Ok(session_id) => Ok((Connected { process, record }, peer, incoming, session_id)),
        Err(err) => {
            process.terminate(TERMINATE_GRACE).await;
            forget_process(store, record.as_ref()).await;
            Err(err)
        }
    }
}

/// Records a freshly spawned agent (see [`crate::acp::procs`]).
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

fn to_json(value: &impl serde::Serialize) -> Value {
    serde_json::to_value(value).expect("ACP types serialize")
}

fn from_json<T: serde::de::DeserializeOwned>(method: &str, value: Value) -> Result<T> {
    serde_json::from_value(value).map_err(|e| {
        Error::AgentFailed(format!(
            "agent answered {method} with an invalid result: {e}"
        ))
    })
}

/// One handshake request, with a timeout and errors that carry the agent's
/// stderr.
async fn call(
    peer: &RpcPeer,
    process: &mut AgentProcess,
    timeout: Duration,
    method: &str,
    params: Value,
) -> Result<Value> {
    let outcome = tokio::select! {
        r = tokio::time::timeout(timeout, peer.request(method, params)) => r,
        status = process.wait() => {
            process.drain_stderr().await;
            return Err(Error::AgentFailed(format!(
                "{} during {method}", describe_exit(status, &process.stderr_tail())
            )));
        }
    };
    match outcome {
        Ok(Ok(result)) => Ok(result),
        Ok(Err(RpcError::Remote { code, message, .. })) => Err(Error::AgentFailed(with_stderr(
            format!("agent answered {method} with error {code}: {message}"),
            process,
        ))),
        Ok(Err(RpcError::Closed(reason))) => {
            let status = tokio::time::timeout(EXIT_AFTER_EOF, process.wait()).await;
            process.drain_stderr().await;
            Err(Error::AgentFailed(match status {
                Ok(status) => format!(
                    "{} during {method}",
                    describe_exit(status, &process.stderr_tail())
                ),
                Err(_) => with_stderr(
                    format!("agent closed its output during {method}: {reason}"),
                    process,
                ),
            }))
        }
        Err(_) => Err(Error::AgentTimeout(with_stderr(
            format!(
                "agent did not answer {method} within {}",
                humantime_fmt(timeout)
            ),
            process,
        ))),
    }
}

fn with_stderr(text: String, process: &AgentProcess) -> String {
    let tail = process.stderr_tail();
    if tail.is_empty() {
        text
    } else {
        format!("{text}; last stderr lines:\n{tail}")
    }
}

fn humantime_fmt(d: Duration) -> String {
    humantime_serde::re::humantime::format_duration(d).to_string()
}

/// A turn in progress.
struct Turn {
    id: Uuid,
    cancel_requested: bool,
}

/// A permission request waiting for its answer.
struct Pending {
    request: PermissionRequest,
    responder: Responder,
}

type PromptFuture = Pin<Box<dyn Future<Output = Result<Value, RpcError>> + Send>>;

struct Session {
    journal: Journal,
    process: AgentProcess,
    /// Forgotten once the process is gone.
    record: Option<AgentProcessRecord>,
    peer: RpcPeer,
    /// `None` once the agent's stdout has closed.
    incoming: Option<mpsc::Receiver<Incoming>>,
    commands: mpsc::Receiver<Command>,
    acp_session_id: String,
    permission_timeout: Option<Duration>,
    on_timeout: OnTimeout,
    /// The profile's name, mode and the conversation's cwd, for the policies.
    agent: String,
    mode: Mode,
    cwd: PathBuf,
    policies: PolicyHandle,
    limiter: RateLimiter,
    turn: Option<Turn>,
    /// The outstanding `session/prompt` request.
    prompt: Option<PromptFuture>,
    pending: HashMap<Uuid, Pending>,
    /// When pending requests time out (only with a `permission_timeout`).
    deadlines: Deadlines,
    /// The message chunks are currently merged into.
    message: Option<(Message, bool)>,
    tool_calls: HashMap<String, ToolCall>,
    dirty_tool_calls: Vec<String>,
}

/// Why the session loop ended.
enum End {
    /// The agent exited (or closed its stdout) by itself.
    AgentGone,
    /// A user closed the conversation: its turn and requests are cancelled.
    ClosedByUser { reply: Option<oneshot::Sender<()>> },
    /// The gateway stops the agent under a running conversation: its requests
    /// expire, its turn ends with an error.
    Stopped { detail: &'static str },
}

async fn next_incoming(rx: &mut Option<mpsc::Receiver<Incoming>>) -> Option<Incoming> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

async fn next_prompt_result(prompt: &mut Option<PromptFuture>) -> Result<Value, RpcError> {
    match prompt {
        Some(f) => f.await,
        None => std::future::pending().await,
    }
}

impl Session {
    async fn run(mut self, shutdown: CancellationToken) {
        let end = match self.serve(&shutdown).await {
            Ok(end) => end,
            Err(e) => {
                tracing::error!(error = %e, "session failed; stopping its agent");
                End::Stopped {
                    detail: "the gateway could not persist the conversation",
                }
            }
        };
        if let Err(e) = self.finish(end).await {
            tracing::error!(error = %e, "failed to record the end of the session");
        }
    }

    async fn serve(&mut self, shutdown: &CancellationToken) -> Result<End> {
        loop {
            // Unbiased: a fast-streaming agent must not starve the user's
            // commands (a cancel above all).
            tokio::select! {
                msg = next_incoming(&mut self.incoming) => match msg {
                    Some(msg) => {
                        self.handle_incoming(msg).await?;
                        self.drain_incoming(MAX_BATCH_EVENTS).await?;
                        self.flush().await?;
                    }
                    None => {
                        self.incoming = None;
                        if tokio::time::timeout(EXIT_AFTER_EOF, self.process.wait()).await.is_err() {
                            tracing::warn!("agent closed stdout but kept running; killing it");
                            self.process.terminate(TERMINATE_GRACE).await;
                        }
                        return Ok(End::AgentGone);
                    }
                },
                result = next_prompt_result(&mut self.prompt) => {
                    self.prompt = None;
                    // Everything the agent sent before its answer is queued
                    // already: apply it first so the turn ends last.
                    self.drain_incoming(usize::MAX).await?;
                    if let Err(RpcError::Closed(_)) = result {
                        // The agent is going away; the exit path ends the turn.
                        continue;
                    }
                    self.end_turn(result);
                    self.flush().await?;
                }
                _ = self.process.wait() => {
                    // What it wrote before dying may still be in the pipe.
                    self.drain_until_closed().await?;
                    return Ok(End::AgentGone);
                }
                due = self.deadlines.due() => self.time_out(due).await?,
                cmd = self.commands.recv() => match cmd {
                    Some(Command::Close { reply }) => {
                        return Ok(End::ClosedByUser { reply: Some(reply) });
                    }
                    Some(cmd) => self.handle_command(cmd).await?,
                    None => return Ok(End::ClosedByUser { reply: None }),
                },
                _ = shutdown.cancelled() => {
                    return Ok(End::Stopped { detail: "the gateway is shutting down" });
                }
            }
        }
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
            if self.journal.batch.events.len() >= MAX_BATCH_EVENTS {
                self.flush().await?;
            }
        }
        Ok(())
    }

    /// Applies whatever the agent has already sent, up to `max` messages.
    async fn drain_incoming(&mut self, max: usize) -> Result<()> {
        let mut n = 0;
        while n < max {
            let Some(rx) = self.incoming.as_mut() else {
                break;
            };
            match rx.try_recv() {
                Ok(msg) => self.handle_incoming(msg).await?,
                Err(_) => break,
            }
            n += 1;
            if self.journal.batch.events.len() >= MAX_BATCH_EVENTS {
                self.flush().await?;
            }
        }
        Ok(())
    }

    async fn flush(&mut self) -> Result<()> {
        if let Some((message, dirty)) = &mut self.message {
            if *dirty {
                self.journal.batch.messages.push(message.clone());
                *dirty = false;
            }
        }
        for id in self.dirty_tool_calls.drain(..) {
            if let Some(call) = self.tool_calls.get(&id) {
                self.journal.batch.tool_calls.push(call.clone());
            }
        }
        self.journal.flush().await
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
            Incoming::Request(request) => match request.method.as_str() {
                "session/request_permission" => self.on_permission_request(request).await?,
                _ => request.reject_unknown_method(),
            },
        }
        Ok(())
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
        let kind = update
            .get("sessionUpdate")
            .and_then(Value::as_str)
            .unwrap_or("");
        let turn_id = self.turn_id();
        match kind {
            "agent_message_chunk" | "agent_thought_chunk" | "user_message_chunk" => {
                let role = match kind {
                    "agent_message_chunk" => Role::Agent,
                    "agent_thought_chunk" => Role::Thought,
                    _ => Role::User,
                };
                if let Some(block) = update.get("content") {
                    self.add_to_message(role, block.clone());
                }
                if self.merge_chunk(&update) {
                    return;
                }
            }
            "tool_call" | "tool_call_update" => {
                if let Some(id) = update.get("toolCallId").and_then(Value::as_str) {
                    self.apply_tool_call(id, &update);
                }
            }
            _ => {}
        }
        self.journal.event(
            event_type::SESSION_UPDATE,
            json!({"turn_id": turn_id, "update": update}),
        );
    }

    /// Joins a plain text chunk onto the previous uncommitted event when that
    /// is a chunk of the same kind and turn that differs only in its text.
    fn merge_chunk(&mut self, update: &Value) -> bool {
        let turn_id = self.turn_id();
        let Some(last) = self.journal.batch.events.last_mut() else {
            return false;
        };
        if last.kind != event_type::SESSION_UPDATE
            || last
                .data
                .get("turn_id")
                .and_then(|v| v.as_str())
                .map(str::to_owned)
                != turn_id.map(|t| t.to_string())
        {
            return false;
        }
        let prev = &mut last.data["update"];
        let (Some(new_text), Some(_)) = (
            update.get("content").and_then(model::plain_text),
            prev.get("content").and_then(model::plain_text),
        ) else {
            return false;
        };
        if !same_but_text(prev, update) {
            return false;
        }
        if let Value::String(text) = &mut prev["content"]["text"] {
            text.push_str(new_text);
        }
        true
    }

    fn add_to_message(&mut self, role: Role, block: Value) {
        let turn_id = self.turn_id();
        match &mut self.message {
            Some((message, dirty)) if message.role == role && message.turn_id == turn_id => {
                message.push_block(block);
                *dirty = true;
            }
            _ => {
                if let Some((message, true)) = self.message.take() {
                    self.journal.batch.messages.push(message);
                }
                let mut message = Message {
                    id: model::new_id(),
                    turn_id,
                    role,
                    content: Vec::new(),
                    created_at: model::now(),
                };
                message.push_block(block);
                self.message = Some((message, true));
            }
        }
    }

    fn apply_tool_call(&mut self, id: &str, update: &Value) {
        let at = model::now();
        let turn_id = self.turn_id();
        let call = self
            .tool_calls
            .entry(id.to_owned())
            .or_insert_with(|| ToolCall::new(id.to_owned(), turn_id, at));
        call.apply(update, at);
        if !self.dirty_tool_calls.iter().any(|d| d == id) {
            self.dirty_tool_calls.push(id.to_owned());
        }
    }

    async fn on_permission_request(&mut self, request: IncomingRequest) -> Result<()> {
        let params = &request.params;
        let tool_call = params.get("toolCall").filter(|v| v.is_object()).cloned();
        let options = params.get("options").and_then(Value::as_array).cloned();
        let (Some(tool_call), Some(options)) = (tool_call, options) else {
            request.responder.respond_error(
                crate::acp::rpc::INVALID_PARAMS,
                "session/request_permission needs toolCall (object) and options (array)",
                None,
            );
            return Ok(());
        };
        let permission = PermissionRequest {
            id: model::new_id(),
            conversation_id: self.journal.conversation_id,
            turn_id: self.turn_id(),
            tool_call,
            options,
            status: PermissionStatus::Pending,
            decision: None,
            created_at: model::now(),
        };
        let id = permission.id;
        tracing::info!(permission_id = %id, "agent asks permission");
        // The request's toolCall is an update: complete it with what we know.
        let tool_call = self.known_tool_call(&permission.tool_call);
        let policies = self.policies.refresh(self.journal.store()).await?;
        let remembered = self
            .journal
            .store()
            .list_rules(permission.conversation_id)
            .await?;
        let now = tokio::time::Instant::now();
        let facts = Facts {
            agent: &self.agent,
            tool_call: &tool_call,
            cwd: &self.cwd,
            mode: self.mode,
        };
        let verdict = policies.evaluate(&facts, &remembered, Some(&self.limiter), now);
        self.journal.event(
            event_type::PERMISSION_REQUESTED,
            serde_json::to_value(&permission).expect("serializes"),
        );
        if let Some((status, option_id)) = automatic_answer(&permission, &verdict) {
            // Decided by policy: requested and resolved are committed together
            // (nobody could answer in between) and both published, so the
            // audit trail shows what ran without a person, and which rule let it.
            let rule = verdict.rule.as_deref().unwrap_or("default");
            tracing::info!(permission_id = %id, rule, decision = ?verdict.decision, "decided by policy");
            let decision = Decision::new(
                option_id,
                format!("policy:{rule}"),
                Some(verdict.reason.clone()),
            );
            let resolved = PermissionRequest {
                status,
                decision: Some(decision.clone()),
                ..permission
            };
            self.journal.batch.new_permissions.push(resolved.clone());
            self.journal.event(
                event_type::PERMISSION_RESOLVED,
                serde_json::to_value(&resolved).expect("serializes"),
            );
            self.flush().await?;
            self.limiter.record(&verdict, now);
            request.responder.respond(decision.acp_result());
            return Ok(());
        }
        self.journal.batch.new_permissions.push(permission.clone());
        self.pending.insert(
            id,
            Pending {
                request: permission,
                responder: request.responder,
            },
        );
        if let Some(timeout) = self.permission_timeout {
            self.deadlines.set(id, timeout);
        }
        self.journal.set_status(self.status_now());
        Ok(())
    }

    /// What the gateway knows of a tool call, overlaid with `update`.
    fn known_tool_call(&self, update: &Value) -> Value {
        let mut merged = json!({});
        let known = update
            .get("toolCallId")
            .and_then(Value::as_str)
            .and_then(|id| self.tool_calls.get(id));
        if let Some(call) = known {
            merged = json!({
                "kind": call.kind, "title": call.title,
                "locations": call.locations, "rawInput": call.raw_input,
            });
        }
        if let (Some(merged), Some(update)) = (merged.as_object_mut(), update.as_object()) {
            for (k, v) in update {
                if !v.is_null() {
                    merged.insert(k.clone(), v.clone());
                }
            }
        }
        merged
    }

    /// Answers the requests whose `permission_timeout` ran out.
    async fn time_out(&mut self, due: Vec<Uuid>) -> Result<()> {
        let reason = format!(
            "no answer within {} (on_timeout = {})",
            humantime_fmt(self.permission_timeout.unwrap_or_default()),
            match self.on_timeout {
                OnTimeout::Reject => "reject",
                OnTimeout::Cancel => "cancel",
            }
        );
        for id in due {
            self.deadlines.remove(id);
            let Some(pending) = self.pending.get(&id) else {
                continue;
            };
            let option = timeout_option(&pending.request, self.on_timeout);
            self.resolve(
                id,
                PermissionStatus::TimedOut,
                option,
                "system",
                Some(&reason),
            )
            .await?;
        }
        Ok(())
    }

    /// The agent withdrew one of its own requests.
    async fn on_cancel_request(&mut self, params: Value) -> Result<()> {
        let Some(request_id) = params.get("requestId") else {
            return Ok(());
        };
        let found = self
            .pending
            .iter()
            .find(|(_, p)| p.responder.id() == request_id)
            .map(|(id, _)| *id);
        if let Some(id) = found {
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
        self.flush().await?;
        self.deadlines.remove(id);
        let Some(pending) = self.pending.remove(&id) else {
            return Ok(None);
        };
        let decision = Decision::new(option_id, decided_by.to_owned(), reason.map(str::to_owned));
        self.journal.set_status(self.status_now());
        let resolution = Resolution {
            permission_id: id,
            status,
            decision: decision.clone(),
        };
        match self.journal.resolve(&resolution).await {
            Ok(Some(request)) => {
                pending.responder.respond(decision.acp_result());
                Ok(Some(request))
            }
            Ok(None) => {
                // Resolved elsewhere (cannot happen while we own it, but the
                // store is the arbiter): answer the agent with what won.
                let current = self.journal.store().get_permission(id).await?;
                if let Some(d) = current.as_ref().and_then(|c| c.decision.as_ref()) {
                    pending.responder.respond(d.acp_result());
                }
                Ok(current)
            }
            Err(e) => {
                // Not persisted: keep it pending so nothing is lost.
                self.pending.insert(id, pending);
                self.journal.set_status(self.status_now());
                Err(e)
            }
        }
    }

    async fn resolve_all(&mut self, status: PermissionStatus, reason: &str) -> Result<()> {
        let mut ids: Vec<Uuid> = self.pending.keys().copied().collect();
        ids.sort();
        for id in ids {
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
                let result = self.cancel_turn().await;
                let _ = reply.send(result);
            }
            Command::Respond {
                permission_id,
                answer,
                decided_by,
                reply,
            } => {
                let result = self.answer(permission_id, answer, &decided_by).await;
                let _ = reply.send(result);
            }
            Command::Close { reply } => {
                let _ = reply.send(());
            }
        }
        Ok(())
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
        });
        self.journal.set_turn(Some(turn_id));
        self.journal.event(
            event_type::TURN_STARTED,
            json!({"turn_id": turn_id, "content": content}),
        );
        if let Some((message, true)) = self.message.take() {
            self.journal.batch.messages.push(message);
        }
        self.journal.batch.messages.push(Message {
            id: model::new_id(),
            turn_id: Some(turn_id),
            role: Role::User,
            content: content.clone(),
            created_at: model::now(),
        });
        self.journal.set_status(self.status_now());
        if let Err(e) = self.flush().await {
            self.turn = None;
            self.journal.set_turn(None);
            return Err(e);
        }
        tracing::info!(%turn_id, "turn started");
        let peer = self.peer.clone();
        let params = json!({"sessionId": self.acp_session_id, "prompt": content});
        self.prompt = Some(Box::pin(async move {
            peer.request("session/prompt", params).await
        }));
        Ok(turn_id)
    }

    /// The ACP cancel rule: `session/cancel`, then every pending request of
    /// the session is answered with the cancelled outcome.
    async fn cancel_turn(&mut self) -> Result<()> {
        let Some(turn) = self.turn.as_mut() else {
            return Ok(());
        };
        turn.cancel_requested = true;
        let params = json!({"sessionId": self.acp_session_id});
        if let Err(e) = self.peer.notify("session/cancel", params).await {
            tracing::warn!(error = %e, "could not send session/cancel");
        }
        self.resolve_all(PermissionStatus::Cancelled, "turn cancelled")
            .await
    }

    async fn answer(
        &mut self,
        id: Uuid,
        answer: Answer,
        decided_by: &str,
    ) -> Result<PermissionRequest> {
        let Some(pending) = self.pending.get(&id) else {
            let request = self
                .journal
                .store()
                .get_permission(id)
                .await?
                .ok_or_else(|| Error::NotFound(format!("no permission request {id}")))?;
            validate_answer(&request, &answer)?;
            if request.status == PermissionStatus::Pending {
                return Err(Error::conflict(
                    "agent_gone",
                    "the agent that asked is no longer running",
                ));
            }
            return answer_resolved(request, &answer);
        };
        let status = validate_answer(&pending.request, &answer)?;
        let option_id = match answer.clone() {
            Answer::Option(id) => Some(id),
            Answer::Cancelled => None,
        };
        let always = option_id
            .as_deref()
            .and_then(|o| option_kind(&pending.request, o))
            .filter(|kind| kind.ends_with("_always"))
            .map(|kind| {
                let keys = keys_to_remember(&self.known_tool_call(&pending.request.tool_call));
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
            .resolve(id, status, option_id, decided_by, reason.as_deref())
            .await?
        {
            Some(request) => answer_resolved(request, &answer)?,
            None => return Err(Error::NotFound(format!("no permission request {id}"))),
        };
        match always {
            Some((option_kind, Ok(keys))) => {
                for key in keys {
                    let rule = Rule {
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
        Ok(request)
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
        self.journal.event(
            event_type::TURN_ENDED,
            json!({"turn_id": turn.id, "stop_reason": stop_reason, "error": error}),
        );
        self.journal.set_turn(None);
        self.journal.set_status(self.status_now());
    }

    /// Records how the session ended and makes sure the agent is gone.
    async fn finish(&mut self, end: End) -> Result<()> {
        let (detail, stop_reason, reply) = match end {
            End::AgentGone => (String::new(), "error", None),
            End::ClosedByUser { reply } => ("conversation closed".to_owned(), "cancelled", reply),
            End::Stopped { detail } => (detail.to_owned(), "error", None),
        };
        let closing = !detail.is_empty();
        if closing {
            if let Some(turn) = self.turn.as_mut() {
                // Politely first: the agent may still wrap up its updates.
                turn.cancel_requested = true;
                let params = json!({"sessionId": self.acp_session_id});
                let _ = self.peer.notify("session/cancel", params).await;
            }
            if stop_reason == "cancelled" {
                self.resolve_all(PermissionStatus::Cancelled, &detail)
                    .await?;
            }
            self.process.terminate(TERMINATE_GRACE).await;
            self.drain_until_closed().await?;
        }
        let (agent_status, detail, final_status) = if closing {
            ("exited", detail, ConversationStatus::Closed)
        } else {
            let status = self.process.wait().await;
            self.process.drain_stderr().await;
            let detail = describe_exit(status, &self.process.stderr_tail());
            tracing::warn!(%detail, "agent exited");
            let agent_status = if status.success() { "exited" } else { "failed" };
            (agent_status, detail, ConversationStatus::Failed)
        };
        // Reaped, and its group killed with it.
        forget_process(self.journal.store(), self.record.take().as_ref()).await;
        // Requests the agent can no longer receive an answer for.
        let reason = format!("the agent went away: {}", first_line(&detail));
        self.resolve_all(PermissionStatus::Expired, &reason).await?;
        if let Some(turn) = self.turn.take() {
            let error = (stop_reason == "error").then(|| detail.clone());
            self.journal.event(
                event_type::TURN_ENDED,
                json!({"turn_id": turn.id, "stop_reason": stop_reason, "error": error}),
            );
        }
        self.journal.event(
            event_type::AGENT_STATUS,
            json!({"status": agent_status, "detail": detail}),
        );
        self.journal.set_turn(None);
        self.journal.set_status(final_status);
        self.flush().await?;
        if let Some(reply) = reply {
            let _ = reply.send(());
        }
        Ok(())
    }
}

/// Whether two chunk updates are equal apart from `content.text` (compared
/// in place: the text may be long, and this runs for every chunk).
fn same_but_text(a: &Value, b: &Value) -> bool {
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
        return false;
    };
    a.len() == b.len()
        && a.iter().all(|(key, va)| match (key.as_str(), b.get(key)) {
            ("content", Some(vb)) => match (va.as_object(), vb.as_object()) {
                (Some(ca), Some(cb)) => {
                    ca.len() == cb.len()
                        && ca.iter().all(|(k, v)| k == "text" || cb.get(k) == Some(v))
                        && cb.contains_key("text")
                }
                _ => false,
            },
            (_, Some(vb)) => va == vb,
            (_, None) => false,
        })
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or(s)
}
