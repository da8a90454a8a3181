//! The client side of ACP over an [`RpcPeer`]: the handshake that opens a
//! session (typed with `agent-client-protocol-schema`), then prompts and
//! cancels on it. Errors ([`super::error::Error`]) carry the agent's last
//! stderr lines.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use serde_json::{json, Value};

use agent_client_protocol_schema::v1 as acp;

use super::agent::{describe_exit, AgentProcess};
use super::error::{Error, Result};
use super::incoming::Incoming;
use super::rpc::{AnswerHold, Inbox, RpcError, RpcPeer};
use crate::config::AgentProfile;
use crate::model::AgentReport;

pub mod sessions;

/// How long we wait for the process after its stdout closed.
pub const EXIT_AFTER_EOF: Duration = Duration::from_secs(3);

/// The agent's answer to a request, awaited while the session goes on.
pub type CallFuture = Pin<Box<dyn Future<Output = Result<Value, RpcError>> + Send>>;

/// A `session/prompt` waiting for its answer. The answer's place in the
/// agent's output stays held until `hold` is dropped: under a shim, the
/// output is acknowledged as far as it is dealt with, and a prompt's
/// answer is dealt with only once the turn's end it makes is in the batch
/// committed with that acknowledgement (else a crash between the two
/// commits would leave a reattached turn waiting for an answer the shim no
/// longer has).
pub struct PromptCall {
    pub answer: CallFuture,
    pub hold: AnswerHold,
}

/// ACP's `auth_required` error code.
const AUTH_REQUIRED: i64 = -32000;

/// An open ACP session with an agent.
pub struct AgentSession {
    peer: RpcPeer,
    session_id: String,
    /// Whether the agent takes `session/close`.
    can_close: bool,
}

/// What a session is opened for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Open<'a> {
    /// A new session (`session/new`).
    New,
    /// The conversation's earlier session (its id): restored where the
    /// agent can, else a new session ([`Opened::Reset`]).
    Restore(&'a str),
    /// An agent session begun elsewhere (its id), taken over: `session/load`
    /// (its history replayed, and kept for the conversation) where the agent
    /// offers it, else `session/resume`. Never a new session instead: an
    /// agent that offers neither fails with [`Error::NotSupported`], one that
    /// does not know the session with [`Error::NoSession`].
    Adopt(&'a str),
    /// A new session forked from the agent's session of this id
    /// (`session/fork`); an agent that does not offer it fails with
    /// [`Error::NotSupported`].
    Fork(&'a str),
}

/// How a session came to be open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opened {
    /// `session/new` for a conversation that had no session yet.
    New,
    /// `session/resume` restored the conversation's earlier session.
    Resumed,
    /// `session/load` restored the conversation's earlier session.
    Loaded,
    /// A fresh `session/new` for a conversation that had one: the agent
    /// cannot restore it (neither `session/resume` nor `loadSession`, or it
    /// refused), so it forgot the earlier turns.
    Reset,
    /// `session/fork` made the session from another.
    Forked,
}

impl Opened {
    /// The `context` an `agent_status` event gives a restart: `loaded`
    /// whenever the agent restored the session (by either method).
    pub fn context(self) -> Option<&'static str> {
        match self {
            Opened::New | Opened::Forked => None,
            Opened::Resumed | Opened::Loaded => Some("loaded"),
            Opened::Reset => Some("reset"),
        }
    }
}

/// An open session and what came with it.
pub struct Opening {
    pub session: AgentSession,
    pub opened: Opened,
    /// What the agent sent meanwhile that is still to be applied.
    pub early: Vec<Incoming>,
}

impl AgentSession {
    /// `initialize`, then what `how` asks (see [`Open`]): to resume an
    /// earlier session (the id a conversation had), `session/resume` where
    /// the agent offers it, else
    /// `session/load` where it offers that, else (or when it refuses)
    /// `session/new` in `cwd` with the profile's MCP servers. A new session
    /// is then put in the profile's `session_mode` and `session_config`. An
    /// agent that answers `auth_required` gets the profile's `auth_method`
    /// through `authenticate`, once. Each request gets the profile's
    /// `startup_timeout`. Fails with the agent's exit and stderr if it dies
    /// on the way.
    ///
    /// `state` is what the conversation knew of the session; it takes what
    /// the answers report (modes, configuration options).
    ///
    /// The history an agent replays while loading is not the conversation's
    /// news (the gateway has it): those updates are dropped. What else it
    /// sends meanwhile is returned, for the session to apply first.
    ///
    /// Fails with the protocol layer's [`Error`] (the crate's 502
    /// `agent_failed`, 504 `agent_timeout`).
    pub async fn open(
        peer: RpcPeer,
        process: &mut AgentProcess,
        profile: &AgentProfile,
        cwd: &str,
        how: Open<'_>,
        state: &mut AgentReport,
        incoming: &mut Inbox<Incoming>,
    ) -> Result<Opening> {
        let mut shake = Handshake::new(&peer, process, profile, incoming);
        let (init, offers) = shake.initialize(profile).await?;
        let capabilities = &init.agent_capabilities;
        state.prompt_capabilities = Some(to_json(&capabilities.prompt_capabilities));
        state.session_capabilities = Some(to_json(&offers));
        let can_close = offers.close;
        let session = |session_id: String| AgentSession {
            peer: peer.clone(),
            session_id,
            can_close,
        };
        let earlier = match how {
            Open::New => None,
            Open::Restore(earlier) => Some(earlier),
            Open::Adopt(adopted) => {
                let (session_id, opened) =
                    shake.adopt(profile, cwd, adopted, offers, state).await?;
                return Ok(Opening {
                    session: session(session_id),
                    opened,
                    early: shake.kept,
                });
            }
            Open::Fork(source) => {
                if !offers.fork {
                    return Err(Error::NotSupported(
                        "the agent does not offer session/fork \
                         (agentCapabilities.sessionCapabilities.fork)"
                            .into(),
                    ));
                }
                let params = json!({
                    "sessionId": source,
                    "cwd": cwd,
                    "mcpServers": profile.mcp_servers,
                });
                let answer = shake
                    .call_authenticated("session/fork", params, Replay::Keep)
                    .await?;
                let answer = shake.accepted("session/fork", answer)?;
                let session_id = answer
                    .get("sessionId")
                    .and_then(Value::as_str)
                    .filter(|id| !id.is_empty())
                    .ok_or_else(|| {
                        Error::Failed("agent answered session/fork without a sessionId".into())
                    })?
                    .to_owned();
                state.apply_opened(&answer, true);
                return Ok(Opening {
                    session: session(session_id),
                    opened: Opened::Forked,
                    early: shake.kept,
                });
            }
        };
        if let Some(earlier) = earlier {
            let ways = [
                (
                    offers.resume,
                    "session/resume",
                    Replay::Keep,
                    Opened::Resumed,
                ),
                (
                    offers.load,
                    "session/load",
                    Replay::DropHistory,
                    Opened::Loaded,
                ),
            ];
            for (offered, method, replay, opened) in ways {
                if !offered {
                    continue;
                }
                let params = json!({
                    "sessionId": earlier,
                    "cwd": cwd,
                    "mcpServers": profile.mcp_servers,
                });
                match shake.call_authenticated(method, params, replay).await? {
                    Ok(result) => {
                        if replay == Replay::DropHistory {
                            // Replayed before the answer, so all queued by now.
                            while let Ok(msg) = shake.incoming.try_recv() {
                                replay.keep(msg, &mut shake.kept);
                            }
                        }
                        state.apply_opened(&result, false);
                        return Ok(Opening {
                            session: session(earlier.to_owned()),
                            opened,
                            early: shake.kept,
                        });
                    }
                    // Refused (the agent lost that session): the next way,
                    // else start afresh.
                    Err(refused) => {
                        tracing::warn!(%method, code = refused.code, message = %refused.message,
                            "the agent could not restore the session");
                    }
                }
            }
        }
        let new = acp::NewSessionRequest::new(cwd).mcp_servers(profile.mcp_servers.clone());
        let new = shake
            .call_authenticated("session/new", to_json(&new), Replay::Keep)
            .await?;
        let new = shake.accepted("session/new", new)?;
        let session_id = from_json::<acp::NewSessionResponse>("session/new", new.clone())?
            .session_id
            .0
            .to_string();
        state.apply_opened(&new, true);
        shake.apply_defaults(profile, &session_id, state).await?;
        let opened = if earlier.is_some() {
            Opened::Reset
        } else {
            Opened::New
        };
        Ok(Opening {
            session: session(session_id),
            opened,
            early: shake.kept,
        })
    }

    /// The agent's id for the session.
    pub fn session_id(&self) -> &str {
        &self.session_id
    }

    /// The session as an earlier gateway opened it, for a connection to the
    /// same agent (a shim's, reattached).
    pub fn reattached(peer: RpcPeer, session_id: String, can_close: bool) -> AgentSession {
        AgentSession {
            peer,
            session_id,
            can_close,
        }
    }

    /// The connection it is open on.
    pub fn peer(&self) -> &RpcPeer {
        &self.peer
    }

    /// Whether the agent takes `session/close`.
    pub fn can_close(&self) -> bool {
        self.can_close
    }

    /// Sends `session/prompt` once polled. Its JSON-RPC id is known at
    /// once (to be recorded before the request goes out).
    pub fn prompt(&self, content: &[Value]) -> (u64, PromptCall) {
        let id = self.peer.reserve_id();
        let mut params = json!({"prompt": content});
        params["sessionId"] = Value::String(self.session_id.clone());
        let peer = self.peer.clone();
        let hold = self.peer.hold_answer(id);
        let answer = Box::pin(async move { peer.request_as(id, "session/prompt", params).await });
        (id, PromptCall { answer, hold })
    }

    /// The answer to the `session/prompt` an earlier gateway sent as
    /// request `id` (see [`RpcPeer::answer_to`]).
    pub fn prompt_answer(&self, id: u64) -> PromptCall {
        PromptCall {
            hold: self.peer.hold_answer(id),
            answer: Box::pin(self.peer.answer_to(id)),
        }
    }

    /// Sends `session/set_mode`.
    pub fn set_mode(&self, mode_id: &str) -> CallFuture {
        self.request("session/set_mode", json!({"modeId": mode_id}))
    }

    /// Sends `session/set_config_option` with `params` (as
    /// [`AgentReport::config_request`] makes them).
    pub fn set_config_option(&self, params: Value) -> CallFuture {
        self.request("session/set_config_option", params)
    }

    /// Sends `session/close`, if the agent takes it.
    pub fn close(&self) -> Option<CallFuture> {
        self.can_close
            .then(|| self.request("session/close", json!({})))
    }

    /// A request about this session: `params` (an object) with its `sessionId`.
    fn request(&self, method: &'static str, mut params: Value) -> CallFuture {
        params["sessionId"] = Value::String(self.session_id.clone());
        let peer = self.peer.clone();
        Box::pin(async move { peer.request(method, params).await })
    }

    /// Sends `session/cancel`.
    pub async fn cancel(&self) -> Result<(), RpcError> {
        let params = json!({"sessionId": self.session_id});
        self.peer.notify("session/cancel", params).await
    }
}

/// An agent's error answer to a request.
struct Refused {
    code: i64,
    message: String,
}

/// What to do with what an agent sends while a handshake request waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Replay {
    /// Keep everything, for the session to apply.
    Keep,
    /// Drop replayed history (`session/load`), keep the rest.
    DropHistory,
}

impl Replay {
    fn keep(self, msg: Incoming, kept: &mut Vec<Incoming>) {
        if self == Replay::Keep || !is_history(&msg) {
            kept.push(msg);
        }
    }
}

/// The requests that open a session, and what arrives meanwhile.
struct Handshake<'a> {
    peer: &'a RpcPeer,
    process: &'a mut AgentProcess,
    timeout: Duration,
    incoming: &'a mut Inbox<Incoming>,
    kept: Vec<Incoming>,
    /// What `initialize` offered.
    auth_methods: Vec<AuthMethod>,
    /// The profile's `auth_method`.
    auth_method: Option<&'a str>,
    authenticated: bool,
}

impl<'a> Handshake<'a> {
    /// A handshake with the agent of `profile` on `peer`, before
    /// `initialize`.
    fn new(
        peer: &'a RpcPeer,
        process: &'a mut AgentProcess,
        profile: &'a AgentProfile,
        incoming: &'a mut Inbox<Incoming>,
    ) -> Handshake<'a> {
        Handshake {
            peer,
            process,
            timeout: profile.startup_timeout,
            incoming,
            kept: Vec::new(),
            auth_methods: Vec::new(),
            auth_method: profile.auth_method.as_deref(),
            authenticated: false,
        }
    }
}

impl Handshake<'_> {
    /// One request, with a timeout and errors that carry the agent's
    /// stderr; an error answer is the inner `Err`. What the agent sends
    /// meanwhile is read and kept (a long replay must not stall the pipe its
    /// answer comes through).
    async fn call(
        &mut self,
        method: &str,
        params: Value,
        replay: Replay,
    ) -> Result<std::result::Result<Value, Refused>> {
        let request = tokio::time::timeout(self.timeout, self.peer.request(method, params));
        tokio::pin!(request);
        let outcome = loop {
            tokio::select! {
                r = &mut request => break r,
                Some(msg) = self.incoming.recv() => replay.keep(msg, &mut self.kept),
                status = self.process.wait() => {
                    self.process.drain_stderr().await;
                    return Err(Error::Failed(format!(
                        "{} during {method}", describe_exit(status, &self.process.stderr_tail())
                    )));
                }
            }
        };
        match outcome {
            Ok(Ok(result)) => Ok(Ok(result)),
            Ok(Err(RpcError::Remote { code, message, .. })) => Ok(Err(Refused { code, message })),
            Ok(Err(RpcError::Closed(reason))) => {
                let status = tokio::time::timeout(EXIT_AFTER_EOF, self.process.wait()).await;
                self.process.drain_stderr().await;
                Err(Error::Failed(match status {
                    Ok(status) => format!(
                        "{} during {method}",
                        describe_exit(status, &self.process.stderr_tail())
                    ),
                    Err(_) => with_stderr(
                        format!("agent closed its output during {method}: {reason}"),
                        self.process,
                    ),
                }))
            }
            Err(_) => Err(Error::Timeout(with_stderr(
                format!(
                    "agent did not answer {method} within {}",
                    humantime_fmt(self.timeout)
                ),
                self.process,
            ))),
        }
    }

    /// Like [`Handshake::call`], but an agent that answers `auth_required`
    /// is authenticated with the profile's `auth_method` and asked again
    /// (once); without one it offers, the error names the methods it offers.
    async fn call_authenticated(
        &mut self,
        method: &str,
        params: Value,
        replay: Replay,
    ) -> Result<std::result::Result<Value, Refused>> {
        match self.call(method, params.clone(), replay).await? {
            Err(refused) if refused.code == AUTH_REQUIRED && !self.authenticated => {
                self.authenticate(method, &refused).await?;
                self.call(method, params, replay).await
            }
            answer => Ok(answer),
        }
    }

    async fn authenticate(&mut self, method: &str, refused: &Refused) -> Result<()> {
        let offered = if self.auth_methods.is_empty() {
            "it offers no authentication method".to_owned()
        } else {
            let methods: Vec<String> = self
                .auth_methods
                .iter()
                .map(|m| match m.terminal {
                    false => format!("{:?} ({})", m.id, m.name),
                    true => format!("{:?} ({}, a terminal login)", m.id, m.name),
                })
                .collect();
            format!("it offers auth_method {}", methods.join(", "))
        };
        let needs = format!(
            "the agent needs authentication: it answered {method} with \"{}\"",
            refused.message
        );
        let chosen = match self.auth_method {
            None => {
                return Err(Error::Failed(with_stderr(
                    format!("{needs}; {offered}: set auth_method in the agent's profile"),
                    self.process,
                )))
            }
            Some(id) => match self.auth_methods.iter().find(|m| m.id == id) {
                None => {
                    return Err(Error::Failed(with_stderr(
                        format!(
                        "{needs}; the profile's auth_method {id:?} is not one it offers; {offered}"
                    ),
                        self.process,
                    )))
                }
                // Not for `authenticate`: a person logs in by running the
                // agent in a terminal.
                Some(m) if m.terminal => {
                    return Err(Error::Failed(with_stderr(
                        format!(
                            "{needs}; the profile's auth_method {id:?} is a terminal login: log in \
                             by running the agent interactively, as the user it runs as"
                        ),
                        self.process,
                    )))
                }
                Some(_) => id,
            },
        };
        tracing::info!(
            auth_method = chosen,
            "the agent needs authentication; authenticating"
        );
        let answer = self
            .call("authenticate", json!({"methodId": chosen}), Replay::Keep)
            .await?;
        self.accepted("authenticate", answer)?;
        self.authenticated = true;
        Ok(())
    }

    /// The answer, or the agent's error (with its stderr) as ours.
    fn accepted(&self, method: &str, answer: std::result::Result<Value, Refused>) -> Result<Value> {
        answer.map_err(|Refused { code, message }| {
            Error::Failed(with_stderr(
                format!("agent answered {method} with error {code}: {message}"),
                self.process,
            ))
        })
    }

    /// Puts a new session in the profile's `session_mode` and
    /// `session_config`. An operator pinned them: a session that cannot
    /// take them does not start.
    async fn apply_defaults(
        &mut self,
        profile: &AgentProfile,
        session_id: &str,
        state: &mut AgentReport,
    ) -> Result<()> {
        let pinned = |key: &str, why: String| {
            Error::Failed(format!("the profile's {key} cannot be applied: {why}"))
        };
        if let Some(mode) = &profile.session_mode {
            state
                .check_mode(mode)
                .map_err(|why| pinned("session_mode", why))?;
            let params = json!({"sessionId": session_id, "modeId": mode});
            let answer = self.call("session/set_mode", params, Replay::Keep).await?;
            self.accepted("session/set_mode", answer)?;
            state.set_current_mode(mode);
        }
        for (config_id, value) in &profile.session_config {
            let mut params = state
                .config_request(config_id, value)
                .map_err(|why| pinned("session_config", why))?;
            params["sessionId"] = json!(session_id);
            let answer = self
                .call("session/set_config_option", params, Replay::Keep)
                .await?;
            let answer = self.accepted("session/set_config_option", answer)?;
            if let Some(options) = answer.get("configOptions") {
                state.set_config_options(options.clone());
            }
        }
        Ok(())
    }
}

/// An authentication method `initialize` offered.
#[derive(Debug, PartialEq, Eq)]
struct AuthMethod {
    id: String,
    name: String,
    /// `type: "terminal"`: the user runs the agent to log in; not for
    /// `authenticate`.
    terminal: bool,
}

/// The authentication methods `initialize` offered (read leniently: a
/// method's `type` may be new).
fn auth_methods(init: &Value) -> Vec<AuthMethod> {
    let methods = init.get("authMethods").and_then(Value::as_array);
    methods
        .into_iter()
        .flatten()
        .filter_map(|m| {
            let id = m.get("id")?.as_str()?.to_owned();
            let name = m
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or(&id)
                .to_owned();
            let terminal = m.get("type").and_then(Value::as_str) == Some("terminal");
            Some(AuthMethod { id, name, terminal })
        })
        .collect()
}

fn to_json(value: &impl serde::Serialize) -> Value {
    serde_json::to_value(value).expect("ACP types serialize")
}

fn from_json<T: serde::de::DeserializeOwned>(method: &str, value: Value) -> Result<T> {
    serde_json::from_value(value).map_err(|e| {
        Error::Failed(format!(
            "agent answered {method} with an invalid result: {e}"
        ))
    })
}

/// Replayed history: what an agent sends while loading a session that
/// the conversation already holds. Mode and option changes replayed from
/// the past are history too: the answer to `session/load` says what holds
/// now (and where it does not, the conversation keeps what it knew).
fn is_history(msg: &Incoming) -> bool {
    let Incoming::Notification { method, params } = msg else {
        // A text chunk is a message chunk.
        return matches!(msg, Incoming::Fast(_));
    };
    let kind = params
        .get("update")
        .and_then(|u| u.get("sessionUpdate"))
        .and_then(Value::as_str);
    method == "session/update"
        && matches!(
            kind,
            Some(
                "user_message_chunk"
                    | "agent_message_chunk"
                    | "agent_thought_chunk"
                    | "tool_call"
                    | "tool_call_update"
                    | "plan"
                    | "current_mode_update"
                    | "config_option_update"
            )
        )
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

#[cfg(test)]
mod tests {
    use super::*;

    fn update(kind: &str) -> Incoming {
        Incoming::Notification {
            method: "session/update".into(),
            params: json!({"sessionId": "s", "update": {"sessionUpdate": kind}}),
        }
    }

    #[test]
    fn a_load_drops_the_past_and_keeps_reports_of_now() {
        let history = [
            "user_message_chunk",
            "agent_message_chunk",
            "tool_call",
            "plan",
            "current_mode_update",
            "config_option_update",
        ];
        let news = [
            "available_commands_update",
            "usage_update",
            "session_info_update",
            "brand_new_kind",
        ];
        for (kinds, past) in [(&history[..], true), (&news[..], false)] {
            for kind in kinds {
                let mut kept = Vec::new();
                Replay::DropHistory.keep(update(kind), &mut kept);
                assert_eq!(kept.is_empty(), past, "{kind} is history: {past}");
                if past {
                    Replay::Keep.keep(update(kind), &mut kept);
                    assert_eq!(kept.len(), 1, "{kind} is kept outside a load");
                }
            }
        }
    }

    #[test]
    fn auth_methods_are_read_by_id_and_name() {
        let init = json!({"authMethods": [
            {"id": "api-key", "name": "API key"},
            {"id": "terminal-login", "type": "terminal"},
            {"name": "no id"},
        ]});
        let method = |id: &str, name: &str, terminal| AuthMethod {
            id: id.into(),
            name: name.into(),
            terminal,
        };
        assert_eq!(
            auth_methods(&init),
            [
                method("api-key", "API key", false),
                method("terminal-login", "terminal-login", true),
            ]
        );
        assert!(auth_methods(&json!({})).is_empty());
    }
}
