//! The gateway as an ACP agent (`/api/v1/acp`): an ACP client (an IDE, an
//! SDK client) connects over WebSocket, one JSON-RPC message per text
//! frame, and works through the gateway as through an agent. Its sessions
//! are the caller's conversations (the `sessionId` is the conversation's
//! id): `session/new` starts one as `POST /api/v1/conversations` does,
//! prompts, cancels and setting changes take the session's one road
//! ([`crate::session::Sessions`]), answers to permission requests the one
//! road for answers ([`crate::session::answer::Answerer`], `via` `acp`). What the
//! client sees of each attached conversation is its event log, turned into
//! ACP by [`attach`]. `fs/*` and `terminal/*` stay the gateway's: they are
//! served to the agent, never forwarded to the client.
//!
//! Two transports carry a connection ([`conn::Conn`], which takes the
//! client's messages as text and gives its own as text): the WebSocket
//! here, and ACP's Streamable HTTP ([`http`]: POSTed messages, one GET
//! event stream per connection, DELETE) on the same paths.

mod http;
mod conn;
mod accepts;
mod attach;
mod wire;

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::Extension;
use serde::Serialize;
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::{router::OpenApiRouter, routes};

use super::extract::{AppPath, Authed};
use super::responses::WebSocketRefused;
use super::state::{AcpSlot, AppState};
use super::ws::{BearerProtocol, Handshake, HandshakeHeaders, TokenQuery};
use crate::auth::{Caller, Limited};
use crate::error::{Error, Result};
use conn::Conn;
use http::HttpConns;

/// Messages up to this many bytes over `max_body_bytes` are read and
/// refused with an error response; a larger one ends the connection (1009).
const OVERSIZE_SLACK: usize = 1024 * 1024;
/// A client that takes longer than this to accept one frame is closed.
const SEND_TIMEOUT: Duration = Duration::from_secs(30);

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(acp_default, acp_post, acp_delete))
        .routes(routes!(acp_agent, acp_agent_post, acp_agent_delete))
        .layer(Extension(HttpConns::default()))
}

/// The agent profile a path names (documentation of the parameter).
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
struct AgentPath {
    /// An agent profile's name (`GET /api/v1/agents`)
    agent: String,
}

/// The Streamable HTTP transport's headers (documentation).
#[derive(IntoParams)]
#[into_params(parameter_in = Header)]
#[allow(dead_code)]
struct HttpHeaders {
    /// The connection (from `initialize`'s answer); required on every
    /// message but `initialize`, and on `GET` streams and `DELETE`.
    #[param(rename = "Acp-Connection-Id", nullable = false)]
    connection: Option<String>,
    /// The session a message is about: accepted, not read (the message's
    /// `params.sessionId` is what counts).
    #[param(rename = "Acp-Session-Id", nullable = false)]
    session: Option<String>,
}

/// `DELETE`'s header (documentation).
#[derive(IntoParams)]
#[into_params(parameter_in = Header)]
#[allow(dead_code)]
struct DeleteHeaders {
    /// The connection to end.
    #[param(rename = "Acp-Connection-Id")]
    connection: String,
}

/// The message a POST without `Acp-Connection-Id` sends: `initialize`.
/// Any other JSON-RPC 2.0 message of ACP is sent with `Acp-Connection-Id`
/// (one without it is refused with 400).
#[derive(Serialize, ToSchema)]
#[schema(as = AcpHttpMessage)]
#[allow(dead_code)]
struct InitializeMessage {
    jsonrpc: JsonRpcVersion,
    /// The request's id, answered in the response.
    id: i64,
    method: InitializeMethod,
    /// `initialize`'s params (protocolVersion, clientCapabilities, …).
    #[schema(value_type = Option<Object>)]
    params: Option<Value>,
}

#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
enum JsonRpcVersion {
    #[serde(rename = "2.0")]
    V2,
}

#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
enum InitializeMethod {
    #[serde(rename = "initialize")]
    Initialize,
}

/// The `GET` event stream's header (documentation).
#[derive(IntoParams)]
#[into_params(parameter_in = Header)]
#[allow(dead_code)]
struct StreamHeaders {
    /// Asks for the connection's event stream (Streamable HTTP) instead of
    /// a WebSocket; then `Accept` must allow `text/event-stream` (406).
    #[param(rename = "Acp-Connection-Id", nullable = false)]
    connection: Option<String>,
    /// The `id` of the last event a dropped stream of the connection
    /// delivered: the events after it are sent first, each once, in order
    /// (400 `malformed_json` when not a number or never sent; 409
    /// `acp_events_gone` when some are no longer kept). A WebSocket
    /// starts afresh: there it is ignored (400 when not a number).
    #[param(rename = "Last-Event-ID", nullable = false, pattern = "^[0-9]+$")]
    last_event_id: Option<String>,
}

/// Upgrades to an ACP connection: the gateway is the agent, the caller's
/// client speaks JSON-RPC 2.0 in text frames, `initialize` first. A
/// `session/new` names its agent profile in
/// `_meta.acpGateway.agent`, else gets the first configured profile.
/// Without `Upgrade`, with `Acp-Connection-Id` (or `Accept:
/// text/event-stream`): that Streamable HTTP connection's event stream. See
/// `docs/api.md`, ACP clients.
#[utoipa::path(
    get, operation_id = "acpClient", path = "/api/v1/acp", tag = "acp",
    params(TokenQuery, HandshakeHeaders, StreamHeaders),
    responses(
        (status = 101, description = "Switching to WebSocket; then ACP (JSON-RPC 2.0), one message per text frame"),
        (status = 200, description = "The connection's event stream: every message the gateway sends it, one per `data:` event with an `id` (1, 2, … on the connection)", content_type = "text/event-stream", body = String),
        WebSocketRefused,
        (status = 404, description = "No such Streamable HTTP connection of the caller's (unknown or ended)"),
        (status = 406, description = "A stream whose `Accept` does not allow `text/event-stream` (`not_acceptable`)"),
        (status = 409, description = "The connection's event stream is already open (`acp_stream_open`), or events after `Last-Event-ID` are no longer kept (`acp_events_gone`)"),
        (status = 422, description = "Invalid query"),
    )
)]
async fn acp_default(
    Authed { state, caller }: Authed,
    Extension(conns): Extension<HttpConns>,
    headers: HeaderMap,
    protocol: BearerProtocol,
    upgrade: std::result::Result<Handshake, Error>,
) -> Result<Response> {
    if http::wants_stream(&headers) {
        return http::stream(&conns, &caller, &headers);
    }
    not_resumed(&headers)?;
    open(state, caller, None, protocol, upgrade?)
}

/// Sends one ACP message over Streamable HTTP: `initialize` (without
/// `Acp-Connection-Id`) opens a connection and is answered here; any other
/// message names its connection and is answered 202, its answer going out
/// on the connection's event stream (`GET`).
#[utoipa::path(
    post, operation_id = "acpHttpPost", path = "/api/v1/acp", tag = "acp",
    params(TokenQuery, HttpHeaders),
    request_body(content = InitializeMessage, content_type = "application/json", description = "One JSON-RPC 2.0 message: `initialize` without `Acp-Connection-Id`, any other with it; a batch (array) is refused with 501"),
    responses(
        (status = 200, description = "`initialize`'s answer; the new connection's id in `Acp-Connection-Id`", body = Value,
            headers(("Acp-Connection-Id" = String, description = "The new connection"))),
        (status = 202, description = "Taken; what answers it goes out on the event stream"),
        (status = 400, description = "Not one JSON-RPC message (`malformed_json`), or `Acp-Connection-Id` missing"),
        (status = 404, description = "No such connection of the caller's (unknown, ended or deleted), or no such agent profile"),
        (status = 413, description = "The body is over `max_body_bytes` (`payload_too_large`)"),
        (status = 415, description = "The body is not `application/json` (`unsupported_media_type`)"),
        (status = 422, description = "Invalid query"),
        (status = 429, description = "Too many ACP connections of this user, or connections opened (`Retry-After`)"),
        (status = 501, description = "A JSON-RPC batch (`not_implemented`)"),
    )
)]
async fn acp_post(
    Authed { state, caller }: Authed,
    Extension(conns): Extension<HttpConns>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response> {
    http::post(&conns, state, caller, None, &headers, body).await
}

/// Ends a Streamable HTTP connection: its sessions are detached, their
/// conversations (and turns) go on.
#[utoipa::path(
    delete, operation_id = "acpHttpDelete", path = "/api/v1/acp", tag = "acp",
    params(TokenQuery, DeleteHeaders),
    responses(
        (status = 204, description = "Ended"),
        (status = 400, description = "`Acp-Connection-Id` missing (`malformed_json`)"),
        (status = 404, description = "No such connection of the caller's"),
        (status = 422, description = "Invalid query"),
    )
)]
async fn acp_delete(
    Authed { caller, .. }: Authed,
    Extension(conns): Extension<HttpConns>,
    headers: HeaderMap,
) -> Result<Response> {
    http::delete(&conns, &caller, &headers)
}

/// Upgrades to an ACP connection whose new sessions run the agent profile
/// `{agent}` (as `/api/v1/acp` otherwise, the event stream included).
#[utoipa::path(
    get, operation_id = "acpAgentClient", path = "/api/v1/acp/{agent}", tag = "acp",
    params(AgentPath, TokenQuery, HandshakeHeaders, StreamHeaders),
    responses(
        (status = 101, description = "Switching to WebSocket; then ACP (JSON-RPC 2.0), one message per text frame"),
        (status = 200, description = "The connection's event stream: every message the gateway sends it, one per `data:` event with an `id` (1, 2, … on the connection)", content_type = "text/event-stream", body = String),
        WebSocketRefused,
        (status = 404, description = "No such agent profile, or no such Streamable HTTP connection of the caller's"),
        (status = 406, description = "A stream whose `Accept` does not allow `text/event-stream` (`not_acceptable`)"),
        (status = 409, description = "The connection's event stream is already open (`acp_stream_open`), or events after `Last-Event-ID` are no longer kept (`acp_events_gone`)"),
        (status = 422, description = "Invalid query"),
    )
)]
async fn acp_agent(
    Authed { state, caller }: Authed,
    Extension(conns): Extension<HttpConns>,
    AppPath(agent): AppPath<String>,
    headers: HeaderMap,
    protocol: BearerProtocol,
    upgrade: std::result::Result<Handshake, Error>,
) -> Result<Response> {
    known_agent(&state, &agent)?;
    if http::wants_stream(&headers) {
        return http::stream(&conns, &caller, &headers);
    }
    not_resumed(&headers)?;
    open(state, caller, Some(agent), protocol, upgrade?)
}

/// As `POST /api/v1/acp`, a new connection's sessions running `{agent}`.
#[utoipa::path(
    post, operation_id = "acpAgentHttpPost", path = "/api/v1/acp/{agent}", tag = "acp",
    params(AgentPath, TokenQuery, HttpHeaders),
    request_body(content = InitializeMessage, content_type = "application/json", description = "One JSON-RPC 2.0 message: `initialize` without `Acp-Connection-Id`, any other with it; a batch (array) is refused with 501"),
    responses(
        (status = 200, description = "`initialize`'s answer; the new connection's id in `Acp-Connection-Id`", body = Value,
            headers(("Acp-Connection-Id" = String, description = "The new connection"))),
        (status = 202, description = "Taken; what answers it goes out on the event stream"),
        (status = 400, description = "Not one JSON-RPC message (`malformed_json`), or `Acp-Connection-Id` missing"),
        (status = 404, description = "No such agent profile, or no such connection of the caller's (unknown, ended or deleted)"),
        (status = 413, description = "The body is over `max_body_bytes` (`payload_too_large`)"),
        (status = 415, description = "The body is not `application/json` (`unsupported_media_type`)"),
        (status = 422, description = "Invalid query"),
        (status = 429, description = "Too many ACP connections of this user, or connections opened (`Retry-After`)"),
        (status = 501, description = "A JSON-RPC batch (`not_implemented`)"),
    )
)]
async fn acp_agent_post(
    Authed { state, caller }: Authed,
    Extension(conns): Extension<HttpConns>,
    AppPath(agent): AppPath<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response> {
    known_agent(&state, &agent)?;
    http::post(&conns, state, caller, Some(agent), &headers, body).await
}

/// As `DELETE /api/v1/acp`.
#[utoipa::path(
    delete, operation_id = "acpAgentHttpDelete", path = "/api/v1/acp/{agent}", tag = "acp",
    params(AgentPath, TokenQuery, DeleteHeaders),
    responses(
        (status = 204, description = "Ended"),
        (status = 400, description = "`Acp-Connection-Id` missing (`malformed_json`)"),
        (status = 404, description = "No such agent profile, or no such connection of the caller's"),
        (status = 422, description = "Invalid query"),
    )
)]
async fn acp_agent_delete(
    Authed { state, caller }: Authed,
    Extension(conns): Extension<HttpConns>,
    AppPath(agent): AppPath<String>,
    headers: HeaderMap,
) -> Result<Response> {
    known_agent(&state, &agent)?;
    http::delete(&conns, &caller, &headers)
}

fn known_agent(state: &AppState, agent: &str) -> Result<()> {
    if state.config().agent(agent).is_none() {
        return Err(Error::NotFound(format!("no agent named {agent:?}")));
    }
    Ok(())
}

/// A WebSocket starts afresh: a `Last-Event-ID` (the event stream's) on
/// its handshake is ignored, but one that is not an event's id (a number)
/// is refused as on the event stream (400).
fn not_resumed(headers: &HeaderMap) -> Result<()> {
    let given = headers.get(axum::http::header::HeaderName::from_static("last-event-id"));
    let well_formed = |v: &str| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit());
    match given.map(|v| v.to_str().map(well_formed)) {
        None | Some(Ok(true)) => Ok(()),
        Some(_) => Err(Error::BadRequest(
            "Last-Event-ID must be an event's id (a number)".into(),
        )),
    }
}

fn open(
    state: AppState,
    caller: Caller,
    agent: Option<String>,
    protocol: BearerProtocol,
    upgrade: Handshake,
) -> Result<Response> {
    state.auth().check_rate(&caller, Limited::Connection)?;
    let slot = state.acp_slot(&caller.user)?;
    let revoked = state.auth().on_revocation(&caller);
    let upgrade = upgrade.max_message_size(state.config().max_body_bytes + OVERSIZE_SLACK);
    let run = move |state, socket| serve(state, caller, agent, revoked, slot, socket);
    Ok(protocol.serve(upgrade, state, run))
}

async fn serve(
    state: AppState,
    caller: Caller,
    agent: Option<String>,
    revoked: CancellationToken,
    _slot: AcpSlot,
    mut socket: WebSocket,
) {
    let shutdown = state.closing().clone();
    let (conn, mut outgoing) = Conn::open(state, caller, agent);
    let close = loop {
        let text = tokio::select! {
            Some(text) = outgoing.recv() => text,
            incoming = socket.recv() => {
                match incoming {
                    Some(Ok(Message::Text(text))) => conn.clone().incoming(text.as_str()).await,
                    Some(Ok(Message::Binary(_))) => conn.refuse_binary(),
                    Some(Ok(Message::Close(_))) | Some(Err(_)) | None => break None,
                    Some(Ok(_)) => {}
                }
                continue;
            }
            _ = revoked.cancelled() => break Some((1008, "token revoked or its role changed")),
            _ = shutdown.cancelled() => break Some((1001, "gateway shutting down")),
        };
        match tokio::time::timeout(SEND_TIMEOUT, socket.send(Message::Text(text.into()))).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => break None,
            Err(_) => break Some((4008, "too slow")),
        }
    };
    // Detached; their turns go on.
    conn.detach_all();
    if let Some((code, reason)) = close {
        let frame = CloseFrame {
            code,
            reason: Utf8Bytes::from_static(reason),
        };
        let _ = tokio::time::timeout(
            Duration::from_secs(1),
            socket.send(Message::Close(Some(frame))),
        )
        .await;
    }
}
