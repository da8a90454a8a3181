//! What the client asks of an agent about its sessions beyond opening one:
//! what it offers for them (from `initialize`), a page of its sessions
//! (`session/list`), and taking one begun elsewhere over (see
//! [`super::Open::Adopt`]).

use serde_json::{json, Value};

use super::super::agent::AgentProcess;
use super::super::error::{Error, Result};
use super::super::incoming::Incoming;
use super::super::rpc::{Inbox, RpcPeer};
use agent_client_protocol_schema as acp_schema;
use agent_client_protocol_schema::v1 as acp;

use super::{auth_methods, from_json, to_json, AgentSession, Handshake, Opened, Replay};
use crate::config::AgentProfile;
use crate::model::{AgentReport, SessionOffers};

/// ACP's `resource_not_found` error code (an unknown session).
const RESOURCE_NOT_FOUND: i64 = -32002;
/// JSON-RPC's `invalid_params` (some agents' answer to an unknown session).
const INVALID_PARAMS: i64 = -32602;

/// One page of an agent's sessions (`session/list`): each an ACP
/// `SessionInfo`, verbatim, and the cursor of the next page.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionPage {
    pub sessions: Vec<Value>,
    pub next_cursor: Option<String>,
}

/// Most pages of `session/list` looked through for the session an
/// adoption names.
const ADOPT_LIST_PAGES: usize = 20;

impl AgentSession {
    /// `initialize`, then one page of the agent's sessions (`session/list`,
    /// filtered by `cwd` where given, from `cursor`). An agent that does not
    /// offer `session/list` fails with [`Error::NotSupported`]. Nothing is
    /// opened: the caller ends the agent.
    pub async fn list_sessions(
        peer: RpcPeer,
        process: &mut AgentProcess,
        profile: &AgentProfile,
        cwd: Option<&str>,
        cursor: Option<&str>,
        incoming: &mut Inbox<Incoming>,
    ) -> Result<SessionPage> {
        let mut shake = Handshake::new(&peer, process, profile, incoming);
        let (_, offers) = shake.initialize(profile).await?;
        if !offers.list {
            return Err(Error::NotSupported(
                "the agent does not offer session/list (agentCapabilities.sessionCapabilities.list)"
                    .into(),
            ));
        }
        shake.list(cwd, cursor).await
    }
}

impl Handshake<'_> {
    /// `initialize`, with the client capabilities the profile offers: the
    /// agent's answer, and what it offers for sessions.
    pub(super) async fn initialize(
        &mut self,
        profile: &AgentProfile,
    ) -> Result<(acp::InitializeResponse, SessionOffers)> {
        // Files and terminals only where the profile offers them; the
        // methods of those it does not are answered "method not found".
        let offered = acp::ClientCapabilities::default()
            .fs(acp::FileSystemCapabilities::new()
                .read_text_file(profile.client_fs)
                .write_text_file(profile.client_fs))
            .terminal(profile.client_terminal)
            // A person answers the agent's questions (forms and URLs).
            .elicitation(
                acp::ElicitationCapabilities::new()
                    .form(acp::ElicitationFormCapabilities::new())
                    .url(acp::ElicitationUrlCapabilities::new()),
            );
        let init = acp::InitializeRequest::new(acp_schema::ProtocolVersion::V1)
            .client_capabilities(offered)
            .client_info(acp::Implementation::new(
                "acp-gateway",
                env!("CARGO_PKG_VERSION"),
            ));
        let init = self
            .call("initialize", to_json(&init), Replay::Keep)
            .await?;
        let init = self.accepted("initialize", init)?;
        self.auth_methods = auth_methods(&init);
        let offers = session_offers(&init);
        let init: acp::InitializeResponse = from_json("initialize", init)?;
        if init.protocol_version != acp_schema::ProtocolVersion::V1 {
            return Err(Error::Failed(format!(
                "agent speaks ACP protocol version {}, the gateway speaks 1",
                to_json(&init.protocol_version)
            )));
        }
        Ok((init, offers))
    }

    /// One page of `session/list` (`cwd` and `cursor` as given).
    pub(super) async fn list(
        &mut self,
        cwd: Option<&str>,
        cursor: Option<&str>,
    ) -> Result<SessionPage> {
        let mut params = json!({});
        if let Some(cwd) = cwd {
            params["cwd"] = json!(cwd);
        }
        if let Some(cursor) = cursor {
            params["cursor"] = json!(cursor);
        }
        let answer = self
            .call_authenticated("session/list", params, Replay::Keep)
            .await?;
        let answer = self.accepted("session/list", answer)?;
        let sessions = answer
            .get("sessions")
            .and_then(Value::as_array)
            .ok_or_else(|| Error::Failed("agent answered session/list without sessions".into()))?
            .iter()
            // A session without an id or cwd is of no use to anyone.
            .filter(|s| {
                s.get("sessionId").and_then(Value::as_str).is_some()
                    && s.get("cwd").and_then(Value::as_str).is_some()
            })
            .cloned()
            .collect();
        let next_cursor = answer
            .get("nextCursor")
            .and_then(Value::as_str)
            .map(str::to_owned);
        Ok(SessionPage {
            sessions,
            next_cursor,
        })
    }

    /// Takes over the agent's session `adopted` (see [`Open::Adopt`]):
    /// where the agent lists its sessions, it must be among those listed
    /// for `cwd` (its title then becomes the report's); then `session/load`
    /// with its history kept, else `session/resume`.
    pub(super) async fn adopt(
        &mut self,
        profile: &AgentProfile,
        cwd: &str,
        adopted: &str,
        offers: SessionOffers,
        state: &mut AgentReport,
    ) -> Result<(String, Opened)> {
        let unknown = || {
            Error::NoSession(format!(
                "the agent has no session {adopted:?} in {cwd} for this user"
            ))
        };
        if !offers.load && !offers.resume {
            return Err(Error::NotSupported(
                "the agent offers neither session/load nor session/resume: its sessions \
                 cannot be taken over"
                    .into(),
            ));
        }
        if offers.list {
            let mut cursor: Option<String> = None;
            let mut found = None;
            for _ in 0..ADOPT_LIST_PAGES {
                let page = self.list(Some(cwd), cursor.as_deref()).await?;
                found = page
                    .sessions
                    .into_iter()
                    .find(|s| s.get("sessionId").and_then(Value::as_str) == Some(adopted));
                cursor = page.next_cursor;
                if found.is_some() || cursor.is_none() {
                    break;
                }
            }
            let found = found.ok_or_else(unknown)?;
            if let Some(title) = found.get("title").and_then(Value::as_str) {
                state.title = Some(title.chars().take(500).collect());
            }
        }
        let params = json!({
            "sessionId": adopted,
            "cwd": cwd,
            "mcpServers": profile.mcp_servers,
        });
        let (method, opened) = match offers.load {
            true => ("session/load", Opened::Loaded),
            false => ("session/resume", Opened::Resumed),
        };
        // Its history is the conversation's news: kept, to be applied.
        match self
            .call_authenticated(method, params, Replay::Keep)
            .await?
        {
            Ok(result) => {
                state.apply_opened(&result, true);
                Ok((adopted.to_owned(), opened))
            }
            Err(refused) if matches!(refused.code, RESOURCE_NOT_FOUND | INVALID_PARAMS) => {
                tracing::info!(%method, code = refused.code, message = %refused.message,
                    "the agent does not know the session to adopt");
                Err(unknown())
            }
            Err(refused) => Err(self.accepted(method, Err(refused)).unwrap_err()),
        }
    }
}

/// What `initialize`'s answer offers for sessions (read leniently: an
/// object, even `{}`, offers; anything else does not).
fn session_offers(init: &Value) -> SessionOffers {
    let capabilities = init.get("agentCapabilities");
    let session = capabilities.and_then(|c| c.get("sessionCapabilities"));
    let offers = |key: &str| {
        session
            .and_then(|s| s.get(key))
            .is_some_and(Value::is_object)
    };
    SessionOffers {
        load: capabilities
            .and_then(|c| c.get("loadSession"))
            .and_then(Value::as_bool)
            .unwrap_or(false),
        resume: offers("resume"),
        list: offers("list"),
        fork: offers("fork"),
        close: offers("close"),
    }
}
