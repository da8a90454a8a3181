//! One ACP client's connection, whatever carries it: it takes the
//! client's messages as text ([`Conn::incoming`]) and puts its own on
//! [`Outgoing`]; the WebSocket and the Streamable HTTP transports (in the
//! parent) only move the text.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use uuid::Uuid;

use super::accepts;
use super::attach::{Attachment, Peer, Start};
use super::wire::{self, Incoming};
use crate::api::conversations::{prompt_content, start_conversation, Place};
use crate::api::state::AppState;
use crate::auth::{Caller, Limited};
use crate::error::{Error, Result};
use crate::limits;
use crate::model::WaitingKind;
use crate::model::{Answer, Conversation};
use crate::session::answer::Answerer;
use crate::session::command::{Prompted, WhileRunning};
use crate::session::Setting;
use agent_client_protocol_schema::v1::McpServer;

/// The ACP protocol version this gateway speaks.
const PROTOCOL_VERSION: u64 = 1;
/// Messages queued for the client before the gateway waits for it (on the
/// Streamable HTTP transport: while no GET stream is open).
const OUT_QUEUE: usize = 256;
/// The `_meta` key under which the gateway reads and writes its own members.
const META_KEY: &str = "acpGateway";
/// `session/list`'s page size.
const LIST_PAGE: i64 = 50;
/// Most MCP servers a client may give a session.
const MCP_SERVERS_MAX: usize = 100;

/// One client's connection.
pub struct Conn {
    state: AppState,
    caller: Caller,
    /// The profile of its new sessions, when the path names one.
    agent: Option<String>,
    peer: Arc<Peer>,
    /// The conversations it is attached to.
    attached: Mutex<HashMap<Uuid, Arc<Attachment>>>,
    initialized: AtomicBool,
    /// Its own answers, to the messages it takes (see [`Conn::reply`]).
    replies: mpsc::UnboundedSender<String>,
}

/// What a connection sends the client, in order of its queues: the
/// connection's own answers first, then what its tasks and attachments
/// queued.
pub struct Outgoing {
    queued: mpsc::Receiver<String>,
    replied: mpsc::UnboundedReceiver<String>,
}

impl Outgoing {
    /// The next message for the client; `None` once the connection is gone.
    pub async fn recv(&mut self) -> Option<String> {
        tokio::select! {
            biased;
            Some(text) = self.replied.recv() => Some(text),
            Some(text) = self.queued.recv() => Some(text),
            else => None,
        }
    }

    /// A message already waiting, if any (without waiting).
    pub fn try_recv(&mut self) -> Option<String> {
        self.replied
            .try_recv()
            .or_else(|_| self.queued.try_recv())
            .ok()
    }
}

impl Conn {
    /// A new connection of `caller`'s, whose new sessions run `agent`
    /// when the path names one, and what it will send.
    pub fn open(state: AppState, caller: Caller, agent: Option<String>) -> (Arc<Conn>, Outgoing) {
        let (out, queued) = mpsc::channel::<String>(OUT_QUEUE);
        let (replies, replied) = mpsc::unbounded_channel::<String>();
        let conn = Arc::new(Conn {
            state,
            caller,
            agent,
            peer: Arc::new(Peer::new(out)),
            attached: Mutex::new(HashMap::new()),
            initialized: AtomicBool::new(false),
            replies,
        });
        (conn, Outgoing { queued, replied })
    }

    /// Answers a binary WebSocket frame: ACP is text.
    pub fn refuse_binary(&self) {
        self.reply(wire::error(
            &Value::Null,
            wire::INVALID_REQUEST,
            "text frames only",
        ));
    }

    /// Detaches every session (their turns go on).
    pub fn detach_all(&self) {
        self.attached.lock().unwrap().clear();
    }

    /// Queues a frame from a task of its own (waiting while the client is
    /// behind).
    async fn send(&self, text: String) {
        // Only fails once the connection is gone.
        let _ = self.peer.out.send(text).await;
    }

    /// Queues the connection's own answer to a message it takes: never
    /// waits, since the transport that hands it messages is what empties
    /// the queues (the WebSocket closes a client that does not read within
    /// its send timeout; Streamable HTTP holds them until a stream opens
    /// or the connection ends).
    fn reply(&self, text: String) {
        let _ = self.replies.send(text);
    }

    /// One text frame from the client. What waits on an agent runs in a
    /// task of its own; the rest here, in the order the client sent it.
    pub async fn incoming(self: Arc<Self>, text: &str) {
        let limit = self.state.config().max_body_bytes;
        if text.len() > limit {
            let message = format!("message over {limit} bytes (max_body_bytes)");
            return self.reply(wire::error(&Value::Null, wire::INVALID_REQUEST, &message));
        }
        match Incoming::parse(text) {
            Incoming::Invalid { id, code, message } => self.reply(wire::error(&id, code, &message)),
            Incoming::Response { id, outcome } => self.client_answered(id, outcome),
            Incoming::Notification { method, params } => {
                if method == "session/cancel" {
                    if let Err(e) = self.cancel(params) {
                        tracing::debug!(error = %e, "session/cancel refused");
                    }
                } else {
                    tracing::debug!(%method, "notification ignored");
                }
            }
            Incoming::Request { id, method, params } => {
                if let Err(e) = self.clone().request(&id, &method, params).await {
                    self.reply(wire::gateway_error(&id, e))
                }
            }
        }
    }

    async fn request(self: Arc<Self>, id: &Value, method: &str, params: Value) -> Result<()> {
        if method == "initialize" {
            let result = self.initialize_result().await?;
            self.initialized.store(true, Ordering::Relaxed);
            self.reply(wire::result(id, result));
            return Ok(());
        }
        if !self.initialized.load(Ordering::Relaxed) {
            let refused = wire::error(id, wire::INVALID_REQUEST, "initialize first");
            self.reply(refused);
            return Ok(());
        }
        match method {
            "session/new" => self.spawn(id, |conn, id| conn.new_session(id, params)),
            "session/load" => self.attach(id, params, true).await?,
            "session/resume" => self.attach(id, params, false).await?,
            "session/close" => {
                let p: SessionParams = read_params(params)?;
                let detached = self.attached.lock().unwrap().remove(&p.session_id);
                detached.ok_or_else(|| unknown_session(p.session_id))?;
                self.reply(wire::result(id, json!({})))
            }
            "session/delete" => {
                let p: SessionParams = read_params(params)?;
                let conversation = self.conversation(p.session_id).await?;
                self.spawn(id, move |conn, id| conn.delete(id, conversation))
            }
            "session/list" => self.list(id, params).await?,
            "session/prompt" => {
                let p: PromptParams = read_params(params)?;
                let attachment = self.attachment(p.session_id)?;
                self.spawn(id, move |conn, id| conn.prompt(id, attachment, p))
            }
            "session/set_mode" => {
                let p: ModeParams = read_params(params)?;
                limits::id("modeId", &p.mode_id, limits::SETTING_ID_MAX_CHARS)?;
                self.attachment(p.session_id)?;
                let setting = Setting::Mode(p.mode_id);
                self.spawn(id, move |conn, id| conn.change(id, p.session_id, setting))
            }
            "session/set_config_option" => {
                let p: OptionParams = read_params(params)?;
                limits::id("configId", &p.config_id, limits::SETTING_ID_MAX_CHARS)?;
                self.attachment(p.session_id)?;
                let setting = Setting::ConfigOption {
                    config_id: p.config_id,
                    value: p.value,
                };
                self.spawn(id, move |conn, id| conn.change(id, p.session_id, setting))
            }
            _ => {
                let message = format!("no method {method:?}");
                self.reply(wire::error(id, wire::METHOD_NOT_FOUND, &message))
            }
        }
        Ok(())
    }

    /// Runs what waits on an agent in a task of its own; its error is the
    /// request's error response.
    fn spawn<F, Fut>(self: &Arc<Self>, id: &Value, run: F)
    where
        F: FnOnce(Arc<Conn>, Value) -> Fut,
        Fut: std::future::Future<Output = Result<()>> + Send + 'static,
    {
        let conn = self.clone();
        let fut = run(self.clone(), id.clone());
        let id = id.clone();
        tokio::spawn(self.state.track_socket(async move {
            if let Err(e) = fut.await {
                conn.send(wire::gateway_error(&id, e)).await;
            }
        }));
    }

    fn attachment(&self, session_id: Uuid) -> Result<Arc<Attachment>> {
        let attached = self.attached.lock().unwrap();
        attached
            .get(&session_id)
            .cloned()
            .ok_or_else(|| unknown_session(session_id))
    }

    /// The conversation as the caller may see it now.
    async fn conversation(&self, id: Uuid) -> Result<Conversation> {
        let found = self.state.owned_conversation(&self.caller, id).await;
        found.map_err(|_| unknown_session(id))
    }

    /// Attaches a conversation, answering `id` once caught up.
    /// Attaches a conversation (again: then in place of the attachment it
    /// had, whose waiting prompts it takes over).
    fn attach_now(&self, conversation: &Conversation, start: Start) {
        let mut attached = self.attached.lock().unwrap();
        let turns = attached.get(&conversation.id).map(|a| a.turns.clone());
        let attachment = Attachment::start(
            &self.state,
            self.peer.clone(),
            conversation.id,
            start,
            turns,
        );
        attached.insert(conversation.id, Arc::new(attachment));
    }

    /// `session/delete`: the conversation is closed as
    /// `DELETE /api/v1/conversations/{id}` closes it (its history stays),
    /// and this client detached from it.
    async fn delete(self: Arc<Self>, id: Value, conversation: Conversation) -> Result<()> {
        self.state.sessions().close(&conversation).await?;
        self.attached.lock().unwrap().remove(&conversation.id);
        self.reply(wire::result(&id, json!({})));
        Ok(())
    }

    async fn new_session(self: Arc<Self>, id: Value, params: Value) -> Result<()> {
        let p: NewParams = read_params(params)?;
        let named = p.meta.as_ref().and_then(|m| m.get(META_KEY)?.get("agent"));
        let named = match named {
            None => None,
            Some(Value::String(agent)) => Some(agent.clone()),
            Some(_) => {
                return Err(Error::Unprocessable(format!(
                    "_meta.{META_KEY}.agent must be a string"
                )))
            }
        };
        let agent = match (&self.agent, named) {
            (Some(path), Some(named)) if *path != named => {
                return Err(Error::Unprocessable(format!(
                    "this connection serves the agent {path:?}, not {named:?}"
                )))
            }
            (_, Some(named)) => named,
            (_, None) => self
                .default_agent()
                .ok_or_else(|| Error::NotFound("no agent profile is configured".into()))?,
        };
        let (servers, said) = self.client_mcp_servers(&agent, p.mcp_servers)?;
        let conversation = start_conversation(
            &self.state,
            &self.caller,
            &agent,
            None,
            Place {
                cwd: Some(&p.cwd),
                ..Place::default()
            },
            servers,
        )
        .await?;
        let mut result = settings(&conversation);
        result["sessionId"] = json!(conversation.id);
        if let Some(said) = said {
            result["_meta"] = json!({META_KEY: {"mcpServers": said}});
        }
        let start = Start {
            after: conversation.last_seq,
            history: false,
            request: Some((id, result)),
        };
        self.attach_now(&conversation, start);
        Ok(())
    }

    /// The profile of a new session that names none: the path's, else the
    /// first configured.
    fn default_agent(&self) -> Option<String> {
        let first = || self.state.config().agents.first().map(|a| a.name.clone());
        self.agent.clone().or_else(first)
    }

    /// What `initialize` answers: what the gateway serves of ACP, and as
    /// `promptCapabilities` what a new session's agent (the path's
    /// profile, else the default one, named in `_meta`) said it accepts
    /// the last time one of that profile started; until one has, what the
    /// gateway accepts (everything), a prompt block the session's agent
    /// turns out not to accept then being refused (`-32602`).
    async fn initialize_result(&self) -> Result<Value> {
        let agent = self.default_agent();
        let known = match &agent {
            Some(agent) => {
                let store = self.state.store();
                store.agent_prompt_capabilities(agent).await?
            }
            None => None,
        };
        let from = if known.is_some() { "agent" } else { "gateway" };
        let prompt = known.unwrap_or_else(accepts::gateway_accepts);
        Ok(json!({
            "protocolVersion": PROTOCOL_VERSION,
            "agentCapabilities": {
                "loadSession": true,
                "promptCapabilities": prompt,
                "mcpCapabilities": {"http": false, "sse": false},
                "sessionCapabilities": {"list": {}, "resume": {}, "close": {}, "delete": {}},
            },
            "authMethods": [],
            "agentInfo": {"name": "acp-gateway", "version": env!("CARGO_PKG_VERSION")},
            "_meta": {META_KEY: {"agent": agent, "promptCapabilitiesFrom": from}},
        }))
    }

    /// Whether the profile `agent` lets a client's MCP servers through
    /// (`client_mcp_servers`).
    fn lets_mcp_through(&self, agent: &str) -> bool {
        let profile = self.state.config().agent(agent);
        profile.is_some_and(|p| p.client_mcp_servers)
    }

    /// The client's `mcpServers` for a session of the profile `agent`: as
    /// given where the profile lets them through, else none; and what
    /// `_meta` says of them (nothing when none were given).
    fn client_mcp_servers(
        &self,
        agent: &str,
        given: Option<Value>,
    ) -> Result<(Vec<McpServer>, Option<Value>)> {
        let servers: Vec<McpServer> = match given {
            None | Some(Value::Null) => Vec::new(),
            Some(given) => serde_json::from_value(given).map_err(|e| {
                Error::Unprocessable(format!("mcpServers: not ACP McpServers: {e}"))
            })?,
        };
        limits::count("mcpServers", servers.len(), MCP_SERVERS_MAX)?;
        if servers.is_empty() {
            return Ok((servers, None));
        }
        if !self.lets_mcp_through(agent) {
            let detail = format!(
                "the agent profile {agent:?} does not let a client's MCP servers through \
                 (client_mcp_servers is off): its agent runs without them"
            );
            return Ok((Vec::new(), Some(json!({"passed": false, "detail": detail}))));
        }
        Ok((servers, Some(json!({"passed": true}))))
    }

    /// `session/load` (history replayed first) or `session/resume`.
    async fn attach(&self, id: &Value, params: Value, load: bool) -> Result<()> {
        let p: SessionParams = read_params(params)?;
        let conversation = self.conversation(p.session_id).await?;
        let (servers, mut said) = self.client_mcp_servers(&conversation.agent, p.mcp_servers)?;
        if self.lets_mcp_through(&conversation.agent) {
            let sessions = self.state.sessions();
            let given = sessions
                .give_client_mcp_servers(conversation.id, servers)
                .await;
            if !given {
                said = Some(json!({
                    "passed": false,
                    "detail": "the session's agent is busy with a turn: it gets them when it \
                               next starts (stopped when idle, started again by a prompt)",
                }));
            }
        }
        let cursor = p.meta.as_ref().and_then(|m| m.get(META_KEY)?.get("cursor"));
        let cursor = match cursor {
            None => None,
            Some(c) => Some(c.as_i64().filter(|c| *c >= 0).ok_or_else(|| {
                Error::Unprocessable(format!("_meta.{META_KEY}.cursor must be a seq (>= 0)"))
            })?),
        };
        let after = match (cursor, load) {
            (Some(cursor), _) => cursor,
            (None, true) => 0,
            (None, false) => conversation.last_seq,
        };
        let mut result = settings(&conversation);
        if let Some(said) = said {
            result["_meta"] = json!({META_KEY: {"mcpServers": said}});
        }
        let start = Start {
            after,
            history: load,
            request: Some((id.clone(), result)),
        };
        self.attach_now(&conversation, start);
        Ok(())
    }

    async fn list(&self, id: &Value, params: Value) -> Result<()> {
        let p: ListParams = read_params(params)?;
        let before = match p.cursor.as_deref() {
            None => None,
            Some(c) => Some(
                Uuid::parse_str(c)
                    .map_err(|_| Error::Unprocessable(format!("cursor {c:?} is not a cursor")))?,
            ),
        };
        if let Some(cwd) = &p.cwd {
            limits::path("cwd", cwd, limits::CWD_MAX_CHARS)?;
        }
        let owner = self.caller.owner_filter();
        let mut items = self
            .state
            .store()
            .list_conversations(
                LIST_PAGE + 1,
                before,
                owner.as_deref(),
                p.cwd.as_deref(),
                false,
            )
            .await?;
        let more = items.len() as i64 > LIST_PAGE;
        items.truncate(LIST_PAGE as usize);
        let next = more
            .then(|| items.last().map(|c| c.id.to_string()))
            .flatten();
        let sessions: Vec<Value> = items
            .into_iter()
            .map(|c| {
                let view = serde_json::to_value(&c).expect("conversations serialize");
                json!({
                    "sessionId": c.id,
                    "cwd": c.cwd,
                    "title": view.get("title"),
                    "updatedAt": c.updated_at,
                    "_meta": {META_KEY: {"agent": c.agent, "status": view.get("status")}},
                })
            })
            .collect();
        let result = json!({"sessions": sessions, "nextCursor": next});
        self.reply(wire::result(id, result));
        Ok(())
    }

    async fn prompt(
        self: Arc<Self>,
        id: Value,
        attachment: Arc<Attachment>,
        p: PromptParams,
    ) -> Result<()> {
        let content = prompt_content(p.prompt)?;
        self.state
            .auth()
            .check_rate(&self.caller, Limited::Prompt)?;
        let conversation = self.conversation(p.session_id).await?;
        self.state.budgets().admit(&conversation).await?;
        let known = conversation.state.prompt_capabilities.as_ref();
        accepts::check(&content, known, &conversation.agent)?;
        attachment.prompting(&content);
        let turn = match self
            .state
            .sessions()
            .prompt(
                &conversation,
                content.clone(),
                WhileRunning::Refuse,
                Some(self.caller.decided_by()),
            )
            .await
        {
            Ok(Prompted::Started(turn)) => turn,
            // Never while refused.
            Ok(Prompted::Queued { .. }) => {
                attachment.not_prompted(&content);
                return Err(Error::Internal(anyhow::anyhow!("an ACP prompt was queued")));
            }
            Err(e) => {
                attachment.not_prompted(&content);
                return Err(e);
            }
        };
        if let Some(answer) = attachment.await_turn(turn, id) {
            self.send(answer).await;
        }
        Ok(())
    }

    fn cancel(self: &Arc<Self>, params: Value) -> Result<()> {
        let p: SessionParams = read_params(params)?;
        self.attachment(p.session_id)?;
        let conn = self.clone();
        tokio::spawn(self.state.track_socket(async move {
            let cancelled = async {
                let conversation = conn.conversation(p.session_id).await?;
                conn.state.sessions().cancel(&conversation).await
            };
            if let Err(e) = cancelled.await {
                tracing::debug!(conversation_id = %p.session_id, error = %e, "session/cancel failed");
            }
        }));
        Ok(())
    }

    async fn change(self: Arc<Self>, id: Value, session_id: Uuid, setting: Setting) -> Result<()> {
        let conversation = self.conversation(session_id).await?;
        let sessions = self.state.sessions();
        sessions
            .change(&conversation, setting, self.caller.decided_by())
            .await?;
        let conversation = self.conversation(session_id).await?;
        let settings = settings(&conversation);
        let result = json!({"configOptions": settings.get("configOptions")});
        self.send(wire::result(&id, result)).await;
        Ok(())
    }

    /// The client's answer to a request of the gateway's: a permission
    /// request's, taken by the one road for answers.
    fn client_answered(self: &Arc<Self>, id: Value, outcome: std::result::Result<Value, Value>) {
        let Some((conversation_id, request)) = self.peer.answered(&id) else {
            tracing::debug!(%id, "a response to no request of this connection, ignored");
            return;
        };
        let answer = match outcome.map(|r| permission_answer(&r)) {
            Ok(Some(answer)) => answer,
            Ok(None) | Err(_) => {
                tracing::debug!(%conversation_id, %request, "the client did not answer a permission request");
                return;
            }
        };
        let conn = self.clone();
        tokio::spawn(self.state.track_socket(async move {
            let who = Answerer {
                decided_by: conn.caller.decided_by(),
                via: Some("acp".into()),
                reason: None,
                steer: false,
                kind: Some(WaitingKind::Permission),
                caller: Some(&conn.caller),
            };
            if let Err(e) = conn.state.sessions().answer(request, &who, answer).await {
                tracing::debug!(%conversation_id, %request, error = %e, "an ACP client's answer was refused");
            }
        }));
    }
}

/// A conversation's modes and configuration options, as ACP names them.
fn settings(conversation: &Conversation) -> Value {
    let view = serde_json::to_value(conversation).expect("conversations serialize");
    json!({"modes": view.get("modes"), "configOptions": view.get("config_options")})
}

/// The answer a `session/request_permission` result gives.
fn permission_answer(result: &Value) -> Option<Answer> {
    let outcome = result.get("outcome")?;
    match outcome.get("outcome")?.as_str()? {
        "selected" => Some(Answer::Option(
            outcome.get("optionId")?.as_str()?.to_owned(),
        )),
        "cancelled" => Some(Answer::Cancelled),
        _ => None,
    }
}

fn unknown_session(id: Uuid) -> Error {
    Error::NotFound(format!("no session {id} on this connection"))
}

/// The params as `T`: absent params are an empty object.
fn read_params<T: DeserializeOwned>(params: Value) -> Result<T> {
    let params = match params {
        Value::Null => json!({}),
        params => params,
    };
    serde_json::from_value(params).map_err(|e| Error::Unprocessable(format!("invalid params: {e}")))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct NewParams {
    cwd: String,
    mcp_servers: Option<Value>,
    #[serde(rename = "_meta")]
    meta: Option<Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SessionParams {
    session_id: Uuid,
    /// `session/load`'s and `session/resume`'s.
    mcp_servers: Option<Value>,
    #[serde(rename = "_meta")]
    meta: Option<Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PromptParams {
    session_id: Uuid,
    prompt: Vec<Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ModeParams {
    session_id: Uuid,
    mode_id: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct OptionParams {
    session_id: Uuid,
    config_id: String,
    value: Value,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct ListParams {
    cursor: Option<String>,
    /// Only the sessions whose working directory is exactly this path.
    cwd: Option<String>,
}
