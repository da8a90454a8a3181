//! Live updates over WebSocket.
//!
//! Per conversation: subscribe to the bus first, then replay from the store
//! everything after the client's `after`, then forward live events, skipping
//! what was already sent and filling any hole (a lagged receiver) from the
//! store. Events are committed before they are published, so the store has
//! whatever the bus skipped: no gap and no duplicate. During a database
//! outage a journal publishes before it commits (see [`crate::bus`]): a hole
//! the store does not hold yet is not skipped but asked for again at the
//! conversation's next event, or when the journal, having committed what it
//! published early, sends the last of it again ([`crate::bus::EventBus::remind`]):
//! a client still sees every event once and in order, only later.

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket, WebSocketUpgrade};
use axum::response::Response;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;
use utoipa::IntoParams;
use utoipa_axum::{router::OpenApiRouter, routes};
use uuid::Uuid;

use super::budget::{Reservation, SocketBudget};
use super::conversations::ConversationPath;
use super::extract::{bearer_subprotocol, AppQuery, Authed, Visible};
use super::responses::{NoConversation, WebSocketRefused};
use super::state::AppState;
use crate::auth::{Caller, Limited};
use crate::bus::Published;
use crate::error::{Error, Result};
use crate::model::{Conversation, Event, EventBody, MemberRole, Question, WaitingKind};
use crate::notify::presence::PresenceClient;
use crate::store::PermissionFilter;
use crate::telemetry;

/// Events read from the store per page while replaying.
const REPLAY_PAGE: i64 = 500;
/// A client that takes longer than this to accept one frame is closed (4008).
const SEND_TIMEOUT: Duration = Duration::from_secs(30);
/// Close code for a client that cannot keep up; it may resume with `after`.
const CLOSE_TOO_SLOW: u16 = 4008;
/// Close code when the connection's token is revoked or its user removed.
const CLOSE_POLICY_VIOLATION: u16 = 1008;
/// The largest message a client may send: clients send only presence
/// frames (`{"type":"presence","visible":…}`); a larger one ends the
/// connection rather than being buffered whole.
const CLIENT_MESSAGE_BYTES: usize = 4096;
/// Close code for a client evicted to make room in `ws_buffer_bytes`, or
/// whose next bytes found no room ("try again later"); it may resume with
/// `after`.
const CLOSE_TRY_AGAIN_LATER: u16 = 1013;
/// How long a close frame may take to go out (one for being over the
/// budget gets longer: see `close_for`).
const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);
/// How long an evicted socket's close frame may take to go out: it goes
/// after the rest of the frame the client stopped reading, so it seldom
/// does, and until the socket is dropped its bytes are held while another
/// socket waits for them (within `budget::ROOM_WAIT`).
const EVICTED_CLOSE_TIMEOUT: Duration = Duration::from_millis(250);

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(conversation_ws))
        .routes(routes!(inbox_ws))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct WsQuery {
    /// Send events with a greater seq first (default 0: all).
    after: Option<i64>,
    /// The bearer token, for clients that cannot set a header (or use the
    /// `bearer.<token>` subprotocol).
    #[serde(rename = "access_token")]
    #[param(rename = "access_token")]
    _access_token: Option<String>,
}

/// The bearer token as a query parameter (WebSocket upgrades only).
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub(super) struct TokenQuery {
    /// The bearer token, for clients that cannot set a header (or use the
    /// `bearer.<token>` subprotocol).
    access_token: Option<String>,
}

/// The WebSocket handshake's headers (RFC 6455 §4.1), as the document
/// states them; [`Handshake`] checks exactly these.
#[derive(IntoParams)]
#[into_params(parameter_in = Header)]
#[allow(dead_code)]
pub(super) struct HandshakeHeaders {
    /// Holds the token `Upgrade` (any case), alone or among others.
    #[param(
        rename = "Connection",
        pattern = "^([^,]*,)*[ \\t]*[Uu][Pp][Gg][Rr][Aa][Dd][Ee][ \\t]*(,[^,]*)*$"
    )]
    connection: String,
    /// `websocket` (any case).
    #[param(
        rename = "Upgrade",
        pattern = "^[ \\t]*[Ww][Ee][Bb][Ss][Oo][Cc][Kk][Ee][Tt][ \\t]*$"
    )]
    upgrade: String,
    /// `13`.
    #[param(rename = "Sec-WebSocket-Version", pattern = "^[ \\t]*13[ \\t]*$")]
    version: String,
    /// The client's nonce, answered in `Sec-WebSocket-Accept`.
    #[param(rename = "Sec-WebSocket-Key")]
    key: String,
}

/// A WebSocket handshake: what [`HandshakeHeaders`] states, or a problem
/// document (400 `not_a_websocket_handshake`) saying which header is not.
pub(super) struct Handshake(WebSocketUpgrade);

impl Handshake {
    /// Accepts messages (and frames) of at most `bytes`; a larger one ends
    /// the connection (1009).
    pub(super) fn max_message_size(self, bytes: usize) -> Handshake {
        Handshake(self.0.max_message_size(bytes).max_frame_size(bytes))
    }

    /// Accepts the upgrade (offering no subprotocol) and serves the
    /// socket, tracked for shutdown.
    pub(super) fn serve<F>(
        self,
        state: AppState,
        run: impl FnOnce(AppState, WebSocket) -> F + Send + 'static,
    ) -> Response
    where
        F: Future<Output = ()> + Send + 'static,
    {
        BearerProtocol(None).serve(self, state, run)
    }
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Handshake {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, state: &S) -> Result<Self> {
        use axum::http::header;
        // Trimmed of white space, as the patterns allow it.
        let header = |name| parts.headers.get(name).map(|v| v.as_bytes().trim_ascii());
        let refused = |what: &str| {
            Err(Error::NotAHandshake(format!(
                "not a WebSocket handshake: {what}"
            )))
        };
        let upgrade_token = header(header::CONNECTION).is_some_and(|v| {
            v.split(|b| *b == b',')
                .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"upgrade"))
        });
        if !upgrade_token {
            return refused("Connection must hold the token Upgrade");
        }
        if !header(header::UPGRADE).is_some_and(|v| v.eq_ignore_ascii_case(b"websocket")) {
            return refused("Upgrade must be websocket");
        }
        if header(header::SEC_WEBSOCKET_VERSION) != Some(b"13") {
            return refused("Sec-WebSocket-Version must be 13");
        }
        if header(header::SEC_WEBSOCKET_KEY).is_none() {
            return refused("Sec-WebSocket-Key is missing");
        }
        WebSocketUpgrade::from_request_parts(parts, state)
            .await
            .map(|upgrade| {
                Handshake(
                    upgrade
                        .max_message_size(CLIENT_MESSAGE_BYTES)
                        .max_frame_size(CLIENT_MESSAGE_BYTES),
                )
            })
            .map_err(|e| {
                Error::NotAHandshake(format!("not a WebSocket handshake: {}", e.body_text()))
            })
    }
}

/// A `bearer.<token>` subprotocol the client offered: a browser only accepts
/// the connection if the server selects it.
pub(super) struct BearerProtocol(Option<String>);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for BearerProtocol {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<Self, Self::Rejection> {
        Ok(BearerProtocol(bearer_subprotocol(parts).map(|(_, p)| p)))
    }
}

impl BearerProtocol {
    /// Accepts the upgrade (selecting the client's `bearer.<token>`
    /// subprotocol, if it offered one) and serves the socket, tracked for
    /// shutdown.
    pub(super) fn serve<F>(
        self,
        Handshake(upgrade): Handshake,
        state: AppState,
        run: impl FnOnce(AppState, WebSocket) -> F + Send + 'static,
    ) -> Response
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let upgrade = match self.0 {
            Some(protocol) => upgrade.protocols([protocol]),
            None => upgrade,
        };
        upgrade.on_upgrade(move |socket| {
            let tracked = state.clone();
            tracked.track_socket(run(state, socket))
        })
    }
}

/// Upgrades to a WebSocket carrying the conversation's events: every event
/// with `seq > after`, in order, then live ones, one JSON text frame each
/// (an `Event`): no gap, no duplicate. A client that reads too slowly is
/// closed with 4008; when the gateway's buffer budget (`ws_buffer_bytes`,
/// or its user's share, `ws_buffer_bytes_per_user`) is full, the sockets
/// that stopped reading with the most unread bytes are closed with 1013;
/// either may come back with `after`. A revoked token closes it with 1008,
/// a stopping gateway with 1001. The client may send `{"type":"presence","visible":true|false}`:
/// while its last such frame says visible, its user counts as present and
/// is not notified (see `docs/api.md`, Notifications); other frames than
/// ping/pong/close are ignored.
#[utoipa::path(
    get, operation_id = "conversationEvents", path = "/api/v1/conversations/{id}/ws", tag = "events",
    params(ConversationPath, WsQuery, HandshakeHeaders),
    responses(
        (status = 101, description = "Switching to WebSocket; then one `Event` per text frame"),
        WebSocketRefused,
        NoConversation,
        (status = 422, description = "Invalid query (e.g. `after` not a number)"),
    )
)]
async fn conversation_ws(
    Visible {
        state,
        caller,
        item,
    }: Visible<Conversation>,
    AppQuery(q): AppQuery<WsQuery>,
    protocol: BearerProtocol,
    upgrade: Handshake,
) -> Result<Response> {
    let id = item.id;
    state.auth().check_rate(&caller, Limited::Connection)?;
    let after = q.after.unwrap_or(0).max(0);
    let revoked = state.auth().on_revocation(&caller);
    let presence = state.presence().client(&caller.user);
    let budget = state.send_budget().join(&caller.user);
    // A member's: it closes once their membership is gone.
    let member = item.sharing.role.map(|_| caller.user.clone());
    let run = move |state, socket| async move {
        let watch = Watch {
            revoked,
            member,
            audience: Audience::Caller(presence),
        };
        let served = serve_conversation(state, id, after, watch, &budget, socket).await;
        // The socket is gone by now, and with it the bytes queued in it.
        drop(budget);
        if let Err(e) = served {
            tracing::debug!(conversation_id = %id, error = %e, "websocket ended");
        }
    };
    Ok(protocol.serve(upgrade, state, run))
}

/// Whom a conversation's WebSocket serves: a caller of the API (their
/// presence frames count), or the holder of a share link (read-only: its
/// frames are ignored, and it sees events as [`for_viewer`] makes them).
pub(super) enum Audience {
    Caller(PresenceClient),
    Viewer,
}

/// Why a socket loop stopped.
#[derive(Debug, thiserror::Error)]
pub(super) enum WsEnd {
    #[error("client gone")]
    ClientGone,
    #[error("client too slow")]
    TooSlow,
    #[error("token revoked or its role changed")]
    Revoked,
    #[error("share link revoked or expired")]
    LinkEnded,
    #[error("membership of the conversation removed")]
    Unshared,
    #[error("over the buffer budget")]
    OverBudget,
    #[error("evicted to make room in the buffer budget")]
    Evicted,
    #[error(transparent)]
    Store(#[from] Error),
}

/// Sends one frame, its bytes reserved in the budget until they were
/// written to the TCP stream.
async fn send(
    budget: &SocketBudget,
    socket: &mut WebSocket,
    text: impl Into<Utf8Bytes>,
) -> Result<(), WsEnd> {
    let text = text.into();
    let reserved = reserve(budget, text.len()).await?;
    send_frame(budget, socket, text).await?;
    reserved.release();
    Ok(())
}

/// Room for `bytes`, or why this socket must close.
async fn reserve(budget: &SocketBudget, bytes: usize) -> Result<Reservation<'_>, WsEnd> {
    match budget.reserve(bytes).await {
        Some(reserved) => Ok(reserved),
        None if budget.is_evicted() => Err(WsEnd::Evicted),
        None => Err(WsEnd::OverBudget),
    }
}

/// Sends one frame whose bytes the caller reserved in the budget, unless
/// the socket is evicted meanwhile (what is left of the frame then stays
/// queued, and reserved, until the socket is dropped).
async fn send_frame(
    budget: &SocketBudget,
    socket: &mut WebSocket,
    text: Utf8Bytes,
) -> Result<(), WsEnd> {
    tokio::select! {
        sent = tokio::time::timeout(SEND_TIMEOUT, socket.send(Message::Text(text))) => match sent {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(WsEnd::ClientGone),
            Err(_) => Err(WsEnd::TooSlow),
        },
        _ = budget.evicted() => Err(WsEnd::Evicted),
    }
}

/// Sends stored events after `*last` up to `until` (inclusive, or all), a
/// page at a time: each page (at most `max_page_bytes`) reserved in the budget
/// while it is sent.
#[allow(clippy::too_many_arguments)]
async fn replay(
    state: &AppState,
    budget: &SocketBudget,
    id: Uuid,
    socket: &mut WebSocket,
    last: &mut i64,
    until: Option<i64>,
    viewer: bool,
) -> Result<(), WsEnd> {
    let max_bytes = state.config().max_page_bytes;
    loop {
        let page = state
            .store()
            .list_events_page(id, *last, REPLAY_PAGE, max_bytes)
            .await?;
        let more = page.more;
        let mut reserved = reserve(budget, page.bytes()).await?;
        for event in page.items {
            if until.is_some_and(|u| event.seq > u) {
                reserved.release();
                return Ok(());
            }
            let seq = event.seq;
            let event = if viewer { viewer_event(event) } else { event };
            let text = serde_json::to_string(&event).expect("events serialize");
            drop(event);
            let len = text.len();
            send_frame(budget, socket, text.into()).await?;
            reserved.give_back(len);
            *last = seq;
        }
        reserved.release();
        if !more {
            return Ok(());
        }
    }
}

/// What ends a conversation's socket besides the client and the gateway:
/// its token revoked (or its share link ended), or (a member's) the
/// membership gone; and whom it serves.
pub(super) struct Watch {
    pub(super) revoked: CancellationToken,
    /// The member whose socket it is (`None`: its owner's, an operator's
    /// or a share link's).
    pub(super) member: Option<String>,
    pub(super) audience: Audience,
}

/// Serves a conversation's events on `socket` until the client goes, it
/// falls behind or over the budget, what `watch` watches ends it, or the
/// gateway stops.
pub(super) async fn serve_conversation(
    state: AppState,
    id: Uuid,
    after: i64,
    watch: Watch,
    budget: &SocketBudget,
    mut socket: WebSocket,
) -> Result<(), WsEnd> {
    let _open = telemetry::WebSocketOpen::new();
    let Watch {
        revoked,
        member,
        mut audience,
    } = watch;
    let viewer = matches!(audience, Audience::Viewer);
    let ended = if viewer {
        WsEnd::LinkEnded
    } else {
        WsEnd::Revoked
    };
    let mut sub = state.bus().subscribe(id);
    let mut last = after;
    let shutdown = state.closing().clone();
    let result = async {
        if let Some(user) = &member {
            // Removed between the handshake and the subscription.
            if state.store().get_member(id, user).await?.is_none() {
                return Err(WsEnd::Unshared);
            }
        }
        replay(&state, budget, id, &mut socket, &mut last, None, viewer).await?;
        loop {
            tokio::select! {
                received = sub.rx.recv() => match received {
                    Ok(published) => {
                        let seq = published.seq;
                        if seq <= last {
                            continue;
                        }
                        if let (Some(user), Some(note)) = (&member, &published.member) {
                            if &note.user == user && note.role.is_none() {
                                return Err(WsEnd::Unshared);
                            }
                        }
                        if seq > last + 1 {
                            replay(&state, budget, id, &mut socket, &mut last, Some(seq), viewer).await?;
                        } else {
                            let text = match viewer {
                                true => for_viewer(&published.json),
                                false => published.json.clone(),
                            };
                            send(budget, &mut socket, text).await?;
                            last = seq;
                        }
                    }
                    Err(RecvError::Lagged(_)) => {
                        replay(&state, budget, id, &mut socket, &mut last, None, viewer).await?
                    }
                    Err(RecvError::Closed) => return Ok(()),
                },
                incoming = socket.recv() => client_frame(incoming, &mut audience)?,
                _ = revoked.cancelled() => return Err(ended),
                _ = budget.evicted() => return Err(WsEnd::Evicted),
                _ = shutdown.cancelled() => {
                    // Everything stored by now, then goodbye.
                    replay(&state, budget, id, &mut socket, &mut last, None, viewer).await?;
                    return Ok(());
                }
            }
        }
    }
    .await;
    close_for(&mut socket, &result).await;
    result
}

/// Whether an event goes to the caller's inbox: one of a conversation they
/// own (any, for an operator) or answer in as a member. A `member_*` event
/// naming them updates `shared` first (and goes too where they could
/// answer before or after it).
fn inboxed(caller: &Caller, shared: &mut HashMap<Uuid, MemberRole>, published: &Published) -> bool {
    if caller.can_see(published.owner.as_deref()) {
        return true;
    }
    let id = published.conversation_id;
    let before = shared.get(&id).is_some_and(|r| r.answers());
    if let Some(note) = published.member.as_ref().filter(|n| n.user == caller.user) {
        match note.role {
            Some(role) => shared.insert(id, role),
            None => shared.remove(&id),
        };
        return before || note.role.is_some_and(MemberRole::answers);
    }
    before
}

/// What a frame from the client means: commands go over REST, pings are
/// answered by the library, so only presence frames
/// (`{"type":"presence","visible":bool}`) and the end of the connection
/// matter.
fn client_frame(
    frame: Option<Result<Message, axum::Error>>,
    audience: &mut Audience,
) -> Result<(), WsEnd> {
    match frame {
        Some(Ok(Message::Close(_))) | Some(Err(_)) | None => Err(WsEnd::ClientGone),
        Some(Ok(Message::Text(text))) => {
            // A share link's holder is nobody's presence.
            if let Audience::Caller(presence) = audience {
                presence.frame(text.as_str());
            }
            Ok(())
        }
        Some(Ok(_)) => Ok(()),
    }
}

/// The types of event that carry what a share link's holder must not see:
/// `agent_status` (its `detail`: the agent's exit and last stderr lines),
/// `terminal_output` (its `cwd`: a directory of the server).
const NOT_FOR_VIEWERS: [&str; 2] = [
    crate::model::event_type::AGENT_STATUS,
    crate::model::event_type::TERMINAL_OUTPUT,
];

/// [`NOT_FOR_VIEWERS`] as an event's JSON text names them.
const NOT_FOR_VIEWERS_JSON: [&str; 2] =
    ["\"type\":\"agent_status\"", "\"type\":\"terminal_output\""];

/// An event as a share link's holder sees it: `agent_status` without its
/// `detail`, `terminal_output` without its `cwd`; the rest as it is.
pub(super) fn viewer_event(mut event: Event) -> Event {
    match &mut event.body {
        EventBody::AgentStatus(status) => status.detail = None,
        EventBody::TerminalOutput(output) => output.cwd = None,
        EventBody::Verbatim { kind, data } if NOT_FOR_VIEWERS.contains(&kind.as_str()) => {
            if let Some(data) = data.as_object_mut() {
                data.remove("detail");
                data.remove("cwd");
            }
        }
        _ => {}
    }
    event
}

/// A published event's text as a share link's holder sees it (see
/// [`viewer_event`]): read again only where its type is one of
/// [`NOT_FOR_VIEWERS`] (the type comes after `seq` and `conversation_id`,
/// near the start), else shared as it is.
fn for_viewer(json: &Utf8Bytes) -> Utf8Bytes {
    let head = &json.as_bytes()[..json.len().min(160)];
    let named = NOT_FOR_VIEWERS_JSON
        .iter()
        .any(|kind| memchr::memmem::find(head, kind.as_bytes()).is_some());
    if !named {
        return json.clone();
    }
    match serde_json::from_str::<Event>(json.as_str()) {
        Ok(event) => serde_json::to_string(&viewer_event(event))
            .expect("events serialize")
            .into(),
        // Not an event: nothing of one is sent.
        Err(_) => Utf8Bytes::from_static("{}"),
    }
}

async fn close_for(socket: &mut WebSocket, result: &Result<(), WsEnd>) {
    let (code, reason, patience) = match result {
        Ok(()) => (1001, "gateway shutting down", CLOSE_TIMEOUT),
        Err(WsEnd::TooSlow) => (
            CLOSE_TOO_SLOW,
            "too slow; resume with ?after=",
            CLOSE_TIMEOUT,
        ),
        Err(WsEnd::Revoked) => (
            CLOSE_POLICY_VIOLATION,
            "token revoked or its role changed",
            CLOSE_TIMEOUT,
        ),
        Err(WsEnd::LinkEnded) => (
            CLOSE_POLICY_VIOLATION,
            "share link revoked or expired",
            CLOSE_TIMEOUT,
        ),
        Err(WsEnd::Unshared) => (
            CLOSE_POLICY_VIOLATION,
            "membership of the conversation removed",
            CLOSE_TIMEOUT,
        ),
        Err(WsEnd::Evicted) => {
            telemetry::websocket_over_budget();
            (
                CLOSE_TRY_AGAIN_LATER,
                "over the gateway's buffer budget; resume with ?after=",
                EVICTED_CLOSE_TIMEOUT,
            )
        }
        Err(WsEnd::OverBudget) => {
            telemetry::websocket_over_budget();
            // Nothing of a frame is left to send before it (a frame is
            // refused before it is started): only the close frame waits
            // for a client busy reading what came before.
            (
                CLOSE_TRY_AGAIN_LATER,
                "over the gateway's buffer budget; resume with ?after=",
                SEND_TIMEOUT,
            )
        }
        Err(WsEnd::Store(_)) => (1011, "internal error", CLOSE_TIMEOUT),
        Err(WsEnd::ClientGone) => return,
    };
    let frame = CloseFrame {
        code,
        reason: Utf8Bytes::from_static(reason),
    };
    let _ = tokio::time::timeout(patience, socket.send(Message::Close(Some(frame)))).await;
}

/// Upgrades to a WebSocket carrying every event of every conversation the
/// caller can see, live, after one first frame: an `InboxSnapshot` of the
/// pending permission requests. The permission inbox of a phone; after
/// 4008 (too slow) or 1013 (over the gateway's buffer budget), reconnect
/// for a fresh snapshot. The client may send
/// `{"type":"presence","visible":true|false}`, as on a conversation's
/// WebSocket.
#[utoipa::path(
    get, operation_id = "inbox", path = "/api/v1/ws", tag = "events",
    params(TokenQuery, HandshakeHeaders),
    responses(
        (status = 101, description = "Switching to WebSocket; an `InboxSnapshot`, then one `Event` per text frame"),
        WebSocketRefused,
        (status = 422, description = "Invalid query"),
    )
)]
async fn inbox_ws(
    Authed { state, caller }: Authed,
    protocol: BearerProtocol,
    upgrade: Handshake,
) -> Result<Response> {
    state.auth().check_rate(&caller, Limited::Connection)?;
    let revoked = state.auth().on_revocation(&caller);
    let budget = state.send_budget().join(&caller.user);
    let run = move |state, socket| async move {
        let served = serve_inbox(state, caller, revoked, &budget, socket).await;
        // The socket is gone by now, and with it the bytes queued in it.
        drop(budget);
        if let Err(e) = served {
            tracing::debug!(error = %e, "inbox websocket ended");
        }
    };
    Ok(protocol.serve(upgrade, state, run))
}

async fn serve_inbox(
    state: AppState,
    caller: Caller,
    revoked: CancellationToken,
    budget: &SocketBudget,
    mut socket: WebSocket,
) -> Result<(), WsEnd> {
    let _open = telemetry::WebSocketOpen::new();
    let mut presence = Audience::Caller(state.presence().client(&caller.user));
    // Subscribe before taking the snapshot so nothing falls between them.
    let mut rx = state.bus().subscribe_all();
    let shutdown = state.closing().clone();
    let result = async {
        // The conversations shared with the caller, each with their role
        // (kept up to date by the `member_*` events naming them): those
        // they answer in are in their inbox.
        let mut shared: HashMap<Uuid, MemberRole> = state
            .store()
            .memberships(&caller.user)
            .await?
            .into_iter()
            .collect();
        let mut pending = state
            .store()
            .list_permissions(&PermissionFilter {
                pending_only: true,
                conversation_id: None,
                owner: caller.owner_filter(),
                kind: None,
            })
            .await?;
        // A viewer's are not theirs to answer.
        let viewed = |id: &Uuid, shared: &HashMap<Uuid, MemberRole>| {
            !caller.is_operator() && shared.get(id).is_some_and(|role| !role.answers())
        };
        pending.retain(|r| !viewed(&r.conversation_id, &shared));
        // With those waiting here that the database does not hold yet:
        // asked while it was away, their events went out before this
        // socket was open.
        let stored: std::collections::HashSet<Uuid> = pending.iter().map(|r| r.id).collect();
        let unstored: Vec<_> = state
            .sessions()
            .waiting_here(|id, owner| {
                caller.can_see(owner) || shared.get(&id).is_some_and(|r| r.answers())
            })
            .into_iter()
            .filter(|r| !stored.contains(&r.id))
            .collect();
        if !unstored.is_empty() {
            pending.extend(unstored);
            // Ids are UUIDv7: their order is the order of creation.
            pending.sort_by_key(|r| r.id);
        }
        // One list of what waits, in two kinds: permission requests, and
        // the agents' questions (as questions show).
        let (questions, permissions): (Vec<_>, Vec<_>) = pending
            .into_iter()
            .partition(|r| r.kind == WaitingKind::Question);
        let questions: Vec<Question> = questions.iter().map(Question::from).collect();
        let snapshot = json!({
            "type": "snapshot",
            "pending_permissions": permissions,
            "pending_questions": questions,
        });
        send(budget, &mut socket, snapshot.to_string()).await?;
        loop {
            tokio::select! {
                received = rx.recv() => match received {
                    Ok(published) if inboxed(&caller, &mut shared, &published) => {
                        send(budget, &mut socket, published.json.clone()).await?
                    }
                    Ok(_) => {}
                    // A fresh snapshot is the way back: reconnect.
                    Err(RecvError::Lagged(_)) => return Err(WsEnd::TooSlow),
                    Err(RecvError::Closed) => return Ok(()),
                },
                incoming = socket.recv() => client_frame(incoming, &mut presence)?,
                _ = revoked.cancelled() => return Err(WsEnd::Revoked),
                _ = budget.evicted() => return Err(WsEnd::Evicted),
                _ = shutdown.cancelled() => {
                    // What was published before the sessions ended, then goodbye.
                    while let Ok(published) = rx.try_recv() {
                        if inboxed(&caller, &mut shared, &published) {
                            send(budget, &mut socket, published.json.clone()).await?;
                        }
                    }
                    return Ok(());
                }
            }
        }
    }
    .await;
    close_for(&mut socket, &result).await;
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_viewer_sees_no_agent_stderr_nor_terminal_directory_and_the_rest_as_it_is() {
        let at = "2026-12-04T10:00:00Z";
        let id = Uuid::nil();
        for (kind, data) in [
            (
                "agent_status",
                json!({"status": "failed", "detail": "secret stderr"}),
            ),
            (
                "terminal_output",
                json!({"terminal_id": "t", "output": "", "cwd": "/srv/secret", "command": ["ls"]}),
            ),
        ] {
            let text =
                json!({"seq": 1, "conversation_id": id, "type": kind, "at": at, "data": data})
                    .to_string();
            let seen = for_viewer(&Utf8Bytes::from(text.clone()));
            assert!(!seen.as_str().contains("secret"), "{seen}");
            assert!(NOT_FOR_VIEWERS.contains(&kind));
            let typed: Event = serde_json::from_str(&text).unwrap();
            let shown = serde_json::to_string(&viewer_event(typed)).unwrap();
            assert!(!shown.contains("secret"), "{shown}");
        }
        let other = json!({"seq": 2, "conversation_id": id, "type": "turn_ended", "at": at,
                           "data": {"turn_id": id, "stop_reason": "end_turn", "error": null}})
        .to_string();
        assert_eq!(for_viewer(&Utf8Bytes::from(other.clone())).as_str(), other);
    }
}
