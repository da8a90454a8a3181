//! The client side of ACP over an [`RpcPeer`]: the handshake that opens a
//! session (typed with `agent-client-protocol-schema`), then prompts and
//! cancels on it. Errors carry the agent's last stderr lines.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use serde_json::{json, Value};

use agent_client_protocol_schema as acp_schema;
use agent_client_protocol_schema::v1 as acp;

use tokio::sync::mpsc;

use super::agent::{describe_exit, AgentProcess};
use super::rpc::{Incoming, RpcError, RpcPeer};
use crate::config::AgentProfile;
use crate::error::{Error, Result};

/// How long we wait for the process after its stdout closed.
pub const EXIT_AFTER_EOF: Duration = Duration::from_secs(3);

/// The answer to a `session/prompt`, awaited while the turn streams.
pub type PromptFuture = Pin<Box<dyn Future<Output = Result<Value, RpcError>> + Send>>;

/// An open ACP session with an agent.
pub struct AgentSession {
    peer: RpcPeer,
    session_id: String,
}

/// How a session came to be open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opened {
    /// `session/new` for a conversation that had no session yet.
    New,
    /// `session/load` restored the conversation's earlier session.
    Loaded,
    /// A fresh `session/new` for a conversation that had one: the agent
    /// cannot load it (no `loadSession`, or it refused), so it forgot the
    /// earlier turns.
    Reset,
}

impl Opened {
    /// The `context` an `agent_status` event gives a restart.
    pub fn context(self) -> Option<&'static str> {
        match self {
            Opened::New => None,
            Opened::Loaded => Some("loaded"),
            Opened::Reset => Some("reset"),
        }
    }
}

impl AgentSession {
    /// `initialize`, then `session/new` in `cwd` with the profile's MCP
    /// servers, or, to resume `earlier` (the session id a conversation had),
    /// `session/load` where the agent offers it; each within the profile's
    /// `startup_timeout`. Fails with the agent's exit and stderr if it dies
    /// on the way.
    ///
    /// The history an agent replays while loading is not the conversation's
    /// news (the gateway has it): those updates are dropped. What else it
    /// sends meanwhile is returned, for the session to apply first.
    pub async fn open(
        peer: RpcPeer,
        process: &mut AgentProcess,
        profile: &AgentProfile,
        cwd: &str,
        earlier: Option<&str>,
        incoming: &mut mpsc::Receiver<Incoming>,
    ) -> Result<(AgentSession, Opened, Vec<Incoming>)> {
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
            process,
            profile.startup_timeout,
            "initialize",
            to_json(&init),
            None,
        )
        .await?;
        let init: acp::InitializeResponse = from_json("initialize", init)?;
        if init.protocol_version != acp_schema::ProtocolVersion::V1 {
            return Err(Error::AgentFailed(format!(
                "agent speaks ACP protocol version {}, the gateway speaks 1",
                to_json(&init.protocol_version)
            )));
        }
        let mut kept = Vec::new();
        if let Some(earlier) = earlier.filter(|_| init.agent_capabilities.load_session) {
            let load = acp::LoadSessionRequest::new(earlier.to_owned(), cwd)
                .mcp_servers(profile.mcp_servers.clone());
            let loading = (&mut *incoming, &mut kept);
            match call(
                &peer,
                process,
                profile.startup_timeout,
                "session/load",
                to_json(&load),
                Some(loading),
            )
            .await
            {
                Ok(_) => {
                    // Replayed before the answer, so all queued by now.
                    while let Ok(msg) = incoming.try_recv() {
                        keep_unless_history(msg, &mut kept);
                    }
                    let session = AgentSession {
                        peer,
                        session_id: earlier.to_owned(),
                    };
                    return Ok((session, Opened::Loaded, kept));
                }
                // Refused (the agent lost that session): start afresh.
                Err(Error::AgentFailed(why)) if !process.has_exited() => {
                    tracing::warn!(%why, "the agent could not load the session; starting a new one");
                }
                Err(e) => return Err(e),
            }
        }
        let new = acp::NewSessionRequest::new(cwd).mcp_servers(profile.mcp_servers.clone());
        let new = call(
            &peer,
            process,
            profile.startup_timeout,
            "session/new",
            to_json(&new),
            None,
        )
        .await?;
        let new: acp::NewSessionResponse = from_json("session/new", new)?;
        let session = AgentSession {
            peer,
            session_id: new.session_id.0.to_string(),
        };
        let opened = if earlier.is_some() {
            Opened::Reset
        } else {
            Opened::New
        };
        Ok((session, opened, kept))
    }

    /// The agent's id for the session.
    pub fn session_id(&self) -> &str {
        &self.session_id
    }

    /// Sends `session/prompt`; the future resolves with the agent's answer.
    pub fn prompt(&self, content: &[Value]) -> PromptFuture {
        let peer = self.peer.clone();
        let params = json!({"sessionId": self.session_id, "prompt": content});
        Box::pin(async move { peer.request("session/prompt", params).await })
    }

    /// Sends `session/cancel`.
    pub async fn cancel(&self) -> Result<(), RpcError> {
        let params = json!({"sessionId": self.session_id});
        self.peer.notify("session/cancel", params).await
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

/// Replayed history: what an agent sends while loading a session that
/// the conversation already holds.
fn is_history(msg: &Incoming) -> bool {
    let Incoming::Notification { method, params } = msg else {
        return false;
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
            )
        )
}

fn keep_unless_history(msg: Incoming, kept: &mut Vec<Incoming>) {
    if !is_history(&msg) {
        kept.push(msg);
    }
}

/// What arrives from the agent during a call that replays history, and
/// where to keep what is not history.
type Draining<'a> = (&'a mut mpsc::Receiver<Incoming>, &'a mut Vec<Incoming>);

/// One handshake request, with a timeout and errors that carry the agent's
/// stderr. With `draining`, the agent's own messages are read meanwhile
/// (a long replay must not stall the pipe its answer comes through).
async fn call(
    peer: &RpcPeer,
    process: &mut AgentProcess,
    timeout: Duration,
    method: &str,
    params: Value,
    mut draining: Option<Draining<'_>>,
) -> Result<Value> {
    let request = tokio::time::timeout(timeout, peer.request(method, params));
    tokio::pin!(request);
    let outcome = loop {
        tokio::select! {
            r = &mut request => break r,
            Some(msg) = next_drained(&mut draining) => {
                if let Some((_, kept)) = draining.as_mut() {
                    keep_unless_history(msg, kept);
                }
            }
            status = process.wait() => {
                process.drain_stderr().await;
                return Err(Error::AgentFailed(format!(
                    "{} during {method}", describe_exit(status, &process.stderr_tail())
                )));
            }
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

async fn next_drained(draining: &mut Option<Draining<'_>>) -> Option<Incoming> {
    match draining {
        Some((rx, _)) => rx.recv().await,
        None => std::future::pending().await,
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
