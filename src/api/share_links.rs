//! Read-only share links: `…/conversations/{id}/share-links` (made, listed
//! and revoked by the conversation's owner or an operator) and
//! `/api/v1/shared/{token}` (the conversation as its viewers see it, its
//! events, and its WebSocket), where the link's token is the only
//! credential: no bearer token is needed, and nothing but that one
//! conversation, read-only, is reachable with it. Off unless the operator
//! sets `share_links = true`.
//!
//! A link's token is `acpgw_share_` and 64 random hex digits, shown once;
//! only its SHA-256 is stored. An unknown, expired or revoked token is the
//! same 404, so tokens cannot be probed; failed lookups count per client
//! address as action URLs' do (see [`super::actions`]; here per gateway, in
//! [`crate::auth::Auth`]), 429 beyond. A link
//! revoked closes its open WebSockets (1008): at once on this node, and on
//! the others within the second that their check of revoked links takes
//! (`crate::app`), as a revoked bearer token's; one that expires closes them
//! at its expiry, on every node by its own clock.
//!
//! What a link shows: the conversation's id, title, agent profile name,
//! status and times (not its directory, its agent's session, settings or
//! worktree, nor who owns it), and its events as they are but for what
//! says more of the server than of the conversation (see
//! [`super::ws::viewer_event`]).

use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::{ConnectInfo, FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::Response;
use axum::Json;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::{router::OpenApiRouter, routes};
use uuid::Uuid;

use super::conversations::{ConversationPath, EventsQuery};
use super::extract::{AppJson, AppPath, AppQuery, Visible};
use super::openapi::EventList;
use super::page::paged_as;
use super::responses::{no_content_if, InvalidPage, NoConversation, WebSocketRefused};
use super::state::AppState;
use super::ws::{serve_conversation, viewer_event, Audience, Handshake, HandshakeHeaders, Watch};
use crate::auth::{Caller, Limited};
use crate::error::{Error, Result};
use crate::model::{Conversation, ConversationStatus, Event, Page, Role};
use crate::store::ShareLink;

/// How long a link lasts when the request does not say.
const DEFAULT_EXPIRY: Duration = Duration::from_secs(24 * 60 * 60);
/// The longest a link may last.
const MAX_EXPIRY: Duration = Duration::from_secs(30 * 24 * 60 * 60);
/// The shortest a link may last.
const MIN_EXPIRY: Duration = Duration::from_secs(1);

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create, list))
        .routes(routes!(revoke))
        .routes(routes!(shared))
        .routes(routes!(shared_events))
        .routes(routes!(shared_ws))
}

/// Who may make, list and revoke a conversation's share links: its owner,
/// or an operator (403 for anyone else who can see it). The one place that
/// says so.
fn may_share(caller: &Caller, conversation: &Conversation) -> Result<()> {
    let owner = conversation.owner.as_deref();
    crate::access::Access::of(caller, owner, conversation.sharing.role)
        .unwrap_or(crate::access::Access::Viewer)
        .require(crate::access::Access::Owner, "share it by link")
}

/// 403 `share_links_disabled` unless the operator set `share_links = true`.
fn enabled(state: &AppState) -> Result<()> {
    if state.config().share_links {
        Ok(())
    } else {
        Err(Error::Refused {
            code: "share_links_disabled",
            detail: "share links are off on this gateway: an operator enables them with \
                     `share_links = true` in its config"
                .into(),
        })
    }
}

/// What `POST …/share-links` takes.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = NewShareLinkRequest)]
struct CreateBody {
    /// How long the link lasts, as a duration like those of the config
    /// (`"30m"`, `"24h"`, `"7d"`, `"1h 30m"`): from 1 second to 30 days;
    /// 24 hours when absent or `null`.
    #[serde(default)]
    #[schema(example = "7d")]
    expires_in: Option<String>,
}

/// How long a link asked for lasts (422 out of range or unreadable).
fn expiry(expires_in: Option<&str>) -> Result<Duration> {
    let Some(text) = expires_in else {
        return Ok(DEFAULT_EXPIRY);
    };
    let lasts = humantime_serde::re::humantime::parse_duration(text.trim()).map_err(|e| {
        Error::Unprocessable(format!(
            "expires_in: {text:?} is not a duration like \"1h\" or \"7d\": {e}"
        ))
    })?;
    if !(MIN_EXPIRY..=MAX_EXPIRY).contains(&lasts) {
        return Err(Error::Unprocessable(format!(
            "expires_in: {text:?} is out of range: from 1 second to 30 days"
        )));
    }
    Ok(lasts)
}

/// Where a link stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
enum LinkState {
    Active,
    Expired,
    Revoked,
}

/// A share link as its conversation's owner sees it (never its token).
#[derive(Serialize, ToSchema)]
struct ShareLinkView {
    id: Uuid,
    conversation_id: Uuid,
    /// `user:<name>`.
    created_by: String,
    created_at: DateTime<Utc>,
    expires_at: DateTime<Utc>,
    revoked_at: Option<DateTime<Utc>>,
    /// `active`, `expired` or `revoked` (revoked wins over expired).
    state: LinkState,
}

impl From<ShareLink> for ShareLinkView {
    fn from(link: ShareLink) -> ShareLinkView {
        let state = match (link.revoked_at, link.expires_at > crate::model::now()) {
            (Some(_), _) => LinkState::Revoked,
            (None, false) => LinkState::Expired,
            (None, true) => LinkState::Active,
        };
        ShareLinkView {
            id: link.id,
            conversation_id: link.conversation_id,
            created_by: link.created_by,
            created_at: link.created_at,
            expires_at: link.expires_at,
            revoked_at: link.revoked_at,
            state,
        }
    }
}

/// A new share link: the link, its token (shown this once) and its URL.
#[derive(Serialize, ToSchema)]
struct NewShareLink {
    #[serde(flatten)]
    link: ShareLinkView,
    /// The link's token (`acpgw_share_…`): shown once, never again. Not a
    /// bearer token: the API refuses it (401).
    token: String,
    /// The page that shows the conversation: `<notifications.base_url>/s/<token>`,
    /// or the path `/s/<token>` on this gateway where no `base_url` is set.
    url: String,
}

/// A conversation's share links.
#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
struct ShareLinkList {
    items: Vec<ShareLinkView>,
    /// Always `null`: one page holds every link.
    next_cursor: Option<String>,
}

/// Makes a read-only share link of the conversation: whoever holds its URL
/// sees the conversation's history and live events, without a token, until
/// it expires or is revoked. Its owner's or an operator's; off unless the
/// operator enabled `share_links`.
#[utoipa::path(
    post, operation_id = "createShareLink", path = "/api/v1/conversations/{id}/share-links",
    tag = "share-links",
    params(ConversationPath),
    request_body = CreateBody,
    responses(
        (status = 201, description = "Made: the link, with its token and URL (shown this once)", body = NewShareLink),
        (status = 403, description = "`share_links_disabled` (the operator has not enabled `share_links`), or `forbidden` (neither the conversation's owner nor an operator)"),
        NoConversation,
        (status = 422, description = "`expires_in` is not a duration, or not from 1 second to 30 days, or the body has other members"),
    )
)]
async fn create(
    Visible {
        state,
        caller,
        item,
    }: Visible<Conversation>,
    AppJson(body): AppJson<CreateBody>,
) -> Result<(StatusCode, Json<NewShareLink>)> {
    enabled(&state)?;
    may_share(&caller, &item)?;
    let lasts = expiry(body.expires_in.as_deref())?;
    let token = crate::auth::new_share_token();
    let now = crate::model::now();
    let link = ShareLink {
        id: crate::model::new_id(),
        conversation_id: item.id,
        token_hash: crate::auth::hash_token(&token),
        created_by: caller.decided_by(),
        created_at: now,
        expires_at: now + chrono::Duration::from_std(lasts).expect("at most 30 days"),
        revoked_at: None,
    };
    if !state.store().insert_share_link(&link).await? {
        return Err(Error::Internal(anyhow::anyhow!(
            "a new share link's id or token is taken"
        )));
    }
    let base = state
        .config()
        .notifications
        .base_url
        .as_deref()
        .unwrap_or("")
        .trim_end_matches('/');
    let url = format!("{base}/s/{token}");
    Ok((
        StatusCode::CREATED,
        Json(NewShareLink {
            link: link.into(),
            token,
            url,
        }),
    ))
}

/// The conversation's share links, oldest first: revoked and expired ones
/// too, with their state; never their tokens.
#[utoipa::path(
    get, operation_id = "listShareLinks", path = "/api/v1/conversations/{id}/share-links",
    tag = "share-links",
    params(ConversationPath),
    responses(
        (status = 200, description = "Every link of the conversation", body = ShareLinkList),
        (status = 403, description = "Neither the conversation's owner nor an operator"),
        NoConversation,
    )
)]
async fn list(
    Visible {
        state,
        caller,
        item,
    }: Visible<Conversation>,
) -> Result<Json<Page<ShareLinkView>>> {
    may_share(&caller, &item)?;
    let links = state.store().list_share_links(item.id).await?;
    Ok(Json(Page {
        items: links.into_iter().map(ShareLinkView::from).collect(),
        next_cursor: None,
    }))
}

/// A share link in a path.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
struct LinkPath {
    /// The conversation
    id: Uuid,
    /// The share link
    link_id: Uuid,
}

/// Revokes a share link: from now on its URL answers 404, and the
/// WebSockets open with it close (1008). Revoking it again is 204 too.
#[utoipa::path(
    delete, operation_id = "revokeShareLink", path = "/api/v1/conversations/{id}/share-links/{link_id}",
    tag = "share-links",
    params(LinkPath),
    responses(
        (status = 204, description = "Revoked (or it was already)"),
        (status = 403, description = "Neither the conversation's owner nor an operator"),
        (status = 404, description = "No such conversation, or it has no such link"),
    )
)]
async fn revoke(
    Visible {
        state,
        caller,
        item,
    }: Visible<Conversation>,
    AppPath(path): AppPath<(Uuid, Uuid)>,
) -> Result<StatusCode> {
    may_share(&caller, &item)?;
    let (_, link_id) = path;
    let revoked = state
        .store()
        .revoke_share_link(item.id, link_id, crate::model::now())
        .await?;
    if revoked.is_some() {
        // Here at once; other nodes find it revoked within a second.
        state.auth().close_share(link_id);
    }
    no_content_if(revoked.is_some(), || {
        Error::NotFound(format!(
            "conversation {} has no share link {link_id}",
            item.id
        ))
    })
}

/// The client's address (all clients behind one proxy share it).
struct ClientAddr(String);

impl<S: Send + Sync> FromRequestParts<S> for ClientAddr {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(ClientAddr(
            parts
                .extensions
                .get::<ConnectInfo<SocketAddr>>()
                .map(|c| c.0.ip().to_string())
                .unwrap_or_default(),
        ))
    }
}

/// A token no usable link has: 404, the same for an unknown, expired or
/// revoked one, and counted against `client`; 429 once it failed 20 times
/// in a minute (see [`crate::auth::Auth::share_lookup_failed`]).
fn no_link(state: &AppState, client: &str) -> Error {
    match state.auth().share_lookup_failed(client) {
        Ok(()) => Error::NotFound("no such share link".into()),
        Err(too_many) => too_many,
    }
}

/// The usable link `token` names and its conversation, else [`no_link`]:
/// share links off, a token of the wrong form (not looked up), unknown,
/// expired or revoked.
async fn usable(
    state: &AppState,
    token: &str,
    client: String,
) -> Result<(ShareLink, Conversation)> {
    if !state.config().share_links || !crate::auth::share_token_well_formed(token) {
        return Err(no_link(state, &client));
    }
    let hash = crate::auth::hash_token(token);
    let Some(link) = state.store().find_share_link(&hash).await? else {
        return Err(no_link(state, &client));
    };
    if !link.usable(crate::model::now()) {
        return Err(no_link(state, &client));
    }
    let Some(conversation) = state.store().get_conversation(link.conversation_id).await? else {
        return Err(no_link(state, &client));
    };
    Ok((link, conversation))
}

/// A shared conversation, as a share link shows it: nothing of the server
/// (its directory, the agent's session or settings, the worktree) and not
/// who owns it.
#[derive(Serialize, ToSchema)]
struct SharedConversation {
    id: Uuid,
    /// The agent profile's name.
    agent: String,
    /// The user's title, else the agent's.
    title: Option<String>,
    status: ConversationStatus,
    /// The seq of its newest event (0: none yet).
    last_seq: i64,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    /// When the link stops working (it may be revoked before).
    link_expires_at: DateTime<Utc>,
}

impl SharedConversation {
    fn of(conversation: Conversation, link: &ShareLink) -> SharedConversation {
        SharedConversation {
            // The title as the API shows it (the agent's where none was given).
            title: conversation.title.or(conversation.state.title),
            id: conversation.id,
            agent: conversation.agent,
            status: conversation.status,
            last_seq: conversation.last_seq,
            created_at: conversation.created_at,
            updated_at: conversation.updated_at,
            link_expires_at: link.expires_at,
        }
    }
}

/// A share link's token in a path.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
struct TokenPath {
    /// The share link's token
    #[param(pattern = "^acpgw_share_[0-9a-f]{64}$")]
    token: String,
}

/// The shared conversation, read-only, for whoever holds the link (no
/// bearer token).
#[utoipa::path(
    get, operation_id = "getSharedConversation", path = "/api/v1/shared/{token}",
    tag = "share-links", security(()),
    params(TokenPath),
    responses(
        (status = 200, description = "The conversation as the link shows it", body = SharedConversation),
        (status = 404, description = "No such link: unknown, expired or revoked (one answer for all), or share links are off"),
        (status = 429, description = "The token is not usable and this address failed 20 lookups in the last minute (`Retry-After`); a usable link still answers"),
    )
)]
async fn shared(
    State(state): State<AppState>,
    AppPath(token): AppPath<String>,
    ClientAddr(client): ClientAddr,
) -> Result<Json<SharedConversation>> {
    let (link, conversation) = usable(&state, &token, client).await?;
    Ok(Json(SharedConversation::of(conversation, &link)))
}

/// The shared conversation's events with `seq > after`, ascending, as
/// `GET …/conversations/{id}/events` pages them (and as a link shows them).
#[utoipa::path(
    get, operation_id = "listSharedEvents", path = "/api/v1/shared/{token}/events",
    tag = "share-links", security(()),
    params(TokenPath, EventsQuery),
    responses(
        (status = 200, description = "A page; `next_cursor` is its last seq when the page stopped at `limit` or at `max_page_bytes`", body = EventList),
        (status = 404, description = "No such link: unknown, expired or revoked (one answer for all), or share links are off"),
        InvalidPage,
        (status = 429, description = "The token is not usable and this address failed 20 lookups in the last minute (`Retry-After`); a usable link still answers"),
    )
)]
async fn shared_events(
    State(state): State<AppState>,
    AppPath(token): AppPath<String>,
    ClientAddr(client): ClientAddr,
    AppQuery(q): AppQuery<EventsQuery>,
) -> Result<Json<Page<Event>>> {
    let (link, _) = usable(&state, &token, client).await?;
    let (after, limit) = q.checked()?;
    let page = state
        .store()
        .list_events_page(
            link.conversation_id,
            after,
            limit,
            state.config().max_page_bytes,
        )
        .await?;
    Ok(paged_as(
        page,
        |e| e.seq.to_string(),
        |e| Some(viewer_event(e)),
    ))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct SharedWsQuery {
    /// Send events with a greater seq first (default 0: all).
    after: Option<i64>,
}

/// Upgrades to a WebSocket carrying the shared conversation's events, as
/// `GET …/conversations/{id}/ws` does (every event with `seq > after`, then
/// live ones; 4008 and 1013 the same), read-only: frames from the client
/// are ignored (presence included). Closed with 1008 when the link is
/// revoked or expires.
#[utoipa::path(
    get, operation_id = "sharedEvents", path = "/api/v1/shared/{token}/ws",
    tag = "share-links", security(()),
    params(TokenPath, SharedWsQuery, HandshakeHeaders),
    responses(
        (status = 101, description = "Switching to WebSocket; then one `Event` per text frame"),
        WebSocketRefused,
        (status = 404, description = "No such link: unknown, expired or revoked (one answer for all), or share links are off"),
        (status = 422, description = "Invalid query (e.g. `after` not a number)"),
    )
)]
async fn shared_ws(
    State(state): State<AppState>,
    AppPath(token): AppPath<String>,
    ClientAddr(client): ClientAddr,
    AppQuery(q): AppQuery<SharedWsQuery>,
    upgrade: Handshake,
) -> Result<Response> {
    let (link, conversation) = usable(&state, &token, client).await?;
    // Connections are limited per link, as per token.
    let holder = Caller {
        user: format!("share:{}", link.id),
        role: Role::User,
        token_id: Some(link.id),
    };
    state.auth().check_rate(&holder, Limited::Connection)?;
    let id = conversation.id;
    let after = q.after.unwrap_or(0).max(0);
    let revoked = state.auth().on_share_revocation(link.id);
    // Counted open until the socket ends (or the upgrade never happens);
    // then its expiry's timer ends too.
    let open = Open {
        state: state.clone(),
        link: link.id,
        ended: revoked.clone(),
    };
    // Its expiry closes it, on this node's clock.
    let lasts = (link.expires_at - crate::model::now())
        .to_std()
        .unwrap_or_default();
    let expired = revoked.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = tokio::time::sleep(lasts) => expired.cancel(),
            _ = expired.cancelled() => {}
        }
    });
    // Its own share of the buffer budget (no user is named `share:…`).
    let budget = state.send_budget().join(&holder.user);
    let run = move |state, socket| async move {
        let watch = Watch {
            revoked,
            member: None,
            audience: Audience::Viewer,
        };
        let served = serve_conversation(state, id, after, watch, &budget, socket).await;
        drop(budget);
        drop(open);
        if let Err(e) = served {
            tracing::debug!(conversation_id = %id, error = %e, "share link websocket ended");
        }
    };
    Ok(upgrade.serve(state, run))
}

/// One share link WebSocket open on this node, counted while it is held.
struct Open {
    state: AppState,
    link: Uuid,
    /// Cancelled when it ends: its expiry's timer ends with it.
    ended: tokio_util::sync::CancellationToken,
}

impl Drop for Open {
    fn drop(&mut self) {
        self.ended.cancel();
        self.state.auth().share_socket_closed(self.link);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_is_a_duration_from_a_second_to_thirty_days() {
        assert_eq!(expiry(None).unwrap(), DEFAULT_EXPIRY);
        assert_eq!(expiry(Some("7d")).unwrap(), Duration::from_secs(7 * 86400));
        assert_eq!(expiry(Some("1h 30m")).unwrap(), Duration::from_secs(5400));
        assert_eq!(expiry(Some("30days")).unwrap(), MAX_EXPIRY);
        for bad in ["", "0s", "31d", "soon", "-1h", "7"] {
            assert!(
                matches!(expiry(Some(bad)), Err(Error::Unprocessable(_))),
                "{bad:?}"
            );
        }
    }
}
