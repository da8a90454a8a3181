//! The client side of ACP over an [`RpcPeer`]: the handshake that opens a
//! session (typed with `agent-client-protocol-schema`), then prompts and
//! cancels on it. Errors carry the agent's last stderr lines.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use serde_json::{json, Value};

use agent_client_protocol_schema as acp_schema;
use agent_client_protocol_schema::v1 as acp;

use super::agent::{describe_exit, AgentProcess};
use super::rpc::{RpcError, RpcPeer};
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

impl AgentSession {
    /// `initialize`, then `session/new` in `cwd` with the profile's MCP
    /// servers; each within the profile's `startup_timeout`. Fails with the
    /// agent's exit and stderr if it dies on the way.
    pub async fn open(
        peer: RpcPeer,
        process: &mut AgentProcess,
        profile: &AgentProfile,
        cwd: &str,
    ) -> Result<AgentSession> {
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
        )
        .await?;
        let init: acp::InitializeResponse = from_json("initialize", init)?;
        if init.protocol_version != acp_schema::ProtocolVersion::V1 {
            return Err(Error::AgentFailed(format!(
                "agent speaks ACP protocol version {}, the gateway speaks 1",
                to_json(&init.protocol_version)
            )));
        }
        let new = acp::NewSessionRequest::new(cwd).mcp_servers(profile.mcp_servers.clone());
        let new = call(
            &peer,
            process,
            profile.startup_timeout,
            "session/new",
            to_json(&new),
        )
        .await?;
        let new: acp::NewSessionResponse = from_json("session/new", new)?;
        Ok(AgentSession {
            peer,
            session_id: new.session_id.0.to_string(),
        })
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
