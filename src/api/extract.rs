//! Extractors: the [`Caller`] a request's token names (see [`crate::auth`]),
//! with the state ([`Authed`]), an [`Operator`]'s request, what a path's
//! `{id}` names as the caller may see it ([`Visible`]), a conversation the
//! caller may act in as a collaborator or its owner ([`Acting`]), and
//! bodies, paths and queries where every bad input gets the same
//! problem+json shape: malformed JSON → 400, wrong shape → 422, not JSON →
//! 415, too large → 413, an id that is not a UUID → 404.

use std::future::Future;

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::StatusCode;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use uuid::Uuid;

use super::state::AppState;
use crate::access::Access;
use crate::auth::Caller;
use crate::error::Error;
use crate::model::Conversation;

impl FromRequestParts<AppState> for Caller {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Caller, Error> {
        let token = presented_token(parts);
        state.auth().identify(state.store(), token.as_deref()).await
    }
}

/// What a path's `{id}` names, found for the caller (with the state and the
/// caller, which a handler of it needs as well). What the caller may not
/// see is "not found", as what does not exist: a handler that takes a
/// `Visible<T>` cannot forget to ask.
pub struct Visible<T> {
    pub state: AppState,
    pub caller: Caller,
    pub item: T,
}

impl Visible<Conversation> {
    /// How far the caller may act in the conversation: they see it, so at
    /// least as a viewer (see [`crate::access`]).
    pub fn access(&self) -> Access {
        let owner = self.item.owner.as_deref();
        Access::of(&self.caller, owner, self.item.sharing.role).unwrap_or(Access::Viewer)
    }

    /// 403 `forbidden` unless the caller may act as `needed` here, to do
    /// `what` (said in the refusal).
    pub fn require(&self, needed: Access, what: &str) -> Result<(), Error> {
        self.access().require(needed, what)
    }
}

/// [`Acting`]'s levels: a conversation's member with the role
/// `collaborator` or more, or its owner (or an operator).
pub const COLLABORATOR: u8 = 2;
pub const OWNER: u8 = 3;

/// A conversation the caller may act in at `LEVEL` ([`COLLABORATOR`],
/// [`OWNER`]): one they may not see is 404 (as [`Visible`]), one they may
/// see but not act in so is 403 `forbidden` naming the role needed, before
/// the body is read (a handler that takes an `Acting` cannot forget to
/// ask).
pub struct Acting<const LEVEL: u8>(pub Visible<Conversation>);

impl<const LEVEL: u8> FromRequestParts<AppState> for Acting<LEVEL> {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Error> {
        let visible = Visible::<Conversation>::from_request_parts(parts, state).await?;
        let needed = match LEVEL {
            COLLABORATOR => Access::Collaborator,
            _ => Access::Owner,
        };
        visible.require(needed, "do this")?;
        Ok(Acting(visible))
    }
}

/// What a path can name by `{id}`, and how to find it for a caller.
pub trait Find: Sized {
    /// The item, or [`Error::NotFound`] where it does not exist or the
    /// caller may not see it.
    fn find(
        state: &AppState,
        caller: &Caller,
        id: Uuid,
    ) -> impl Future<Output = Result<Self, Error>> + Send;
}

/// The `{id}` of a path (which may name more).
#[derive(Deserialize)]
struct Id {
    id: Uuid,
}

impl<T: Find + Send> FromRequestParts<AppState> for Visible<T> {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Error> {
        let Authed { state, caller } = Authed::from_request_parts(parts, state).await?;
        let AppPath(Id { id }) = AppPath::from_request_parts(parts, &state).await?;
        let item = T::find(&state, &caller, id).await?;
        Ok(Visible {
            state,
            caller,
            item,
        })
    }
}

/// A request by a known caller, with the state: what a handler starts from.
/// [`Operator`] and [`Visible`] check more.
pub struct Authed {
    pub state: AppState,
    pub caller: Caller,
}

impl FromRequestParts<AppState> for Authed {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Error> {
        let caller = Caller::from_request_parts(parts, state).await?;
        let state = state.clone();
        Ok(Authed { state, caller })
    }
}

/// A request by an operator: anyone else gets 403, before the body is read
/// (a handler that takes an `Operator` cannot forget to ask).
pub struct Operator(pub Authed);

impl FromRequestParts<AppState> for Operator {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Error> {
        let authed = Authed::from_request_parts(parts, state).await?;
        authed.caller.require_operator().map(|()| Operator(authed))
    }
}

/// The token a request presents: the `Authorization` header, or, on a
/// WebSocket upgrade or a request to the ACP front door only (browsers
/// cannot set headers on a WebSocket), `?access_token=` or the
/// `bearer.<token>` subprotocol.
fn presented_token(parts: &Parts) -> Option<String> {
    if let Some(value) = parts.headers.get(axum::http::header::AUTHORIZATION) {
        let value = value.to_str().ok()?;
        let (scheme, token) = value.split_once(' ')?;
        return scheme
            .eq_ignore_ascii_case("bearer")
            .then(|| token.trim().to_owned());
    }
    if !is_websocket_upgrade(parts) && !is_acp_path(parts) {
        return None;
    }
    if let Some(query) = parts.uri.query() {
        for pair in query.split('&') {
            if let Some(token) = pair.strip_prefix("access_token=") {
                return Some(token.to_owned());
            }
        }
    }
    bearer_subprotocol(parts).map(|(token, _)| token)
}

/// A request to the ACP front door (`/api/v1/acp`, `/api/v1/acp/{agent}`),
/// whose Streamable HTTP transport takes the token as its WebSocket does.
fn is_acp_path(parts: &Parts) -> bool {
    let path = parts.uri.path();
    path == "/api/v1/acp"
        || path
            .strip_prefix("/api/v1/acp/")
            .is_some_and(|a| !a.contains('/'))
}

/// A `GET` asking to upgrade to a WebSocket.
fn is_websocket_upgrade(parts: &Parts) -> bool {
    parts.method == axum::http::Method::GET
        && parts
            .headers
            .get(axum::http::header::UPGRADE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
}

/// `Sec-WebSocket-Protocol: bearer.<token>`: the token and the protocol
/// string to echo back.
pub fn bearer_subprotocol(parts: &Parts) -> Option<(String, String)> {
    let header = parts
        .headers
        .get(axum::http::header::SEC_WEBSOCKET_PROTOCOL)?;
    header.to_str().ok()?.split(',').find_map(|p| {
        let p = p.trim();
        p.strip_prefix("bearer.")
            .map(|token| (token.to_owned(), p.to_owned()))
    })
}

/// `axum::Json` with our error shape.
pub struct AppJson<T>(pub T);

impl<T, S> FromRequest<S> for AppJson<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = Error;

    async fn from_request(req: Request, state: &S) -> Result<Self, Error> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(value)) => Ok(AppJson(value)),
            Err(rejection) => Err(match rejection {
                JsonRejection::JsonDataError(e) => Error::Unprocessable(e.body_text()),
                JsonRejection::JsonSyntaxError(e) => Error::BadRequest(e.body_text()),
                JsonRejection::MissingJsonContentType(_) => Error::UnsupportedMediaType(
                    "expected a JSON body with Content-Type: application/json".into(),
                ),
                other if other.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                    Error::PayloadTooLarge("request body is too large".into())
                }
                other => Error::BadRequest(other.body_text()),
            }),
        }
    }
}

/// Defines `$name<T>`: axum's `$axum<T>` extractor with its rejection turned
/// into our [`Error`] by `$error`.
macro_rules! parts_extractor {
    ($(#[$doc:meta])* $name:ident, $axum:ident, $error:expr) => {
        $(#[$doc])*
        pub struct $name<T>(pub T);

        impl<T, S> FromRequestParts<S> for $name<T>
        where
            T: DeserializeOwned + Send,
            S: Send + Sync,
        {
            type Rejection = Error;

            async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Error> {
                axum::extract::$axum::<T>::from_request_parts(parts, state)
                    .await
                    .map(|extracted| $name(extracted.0))
                    .map_err($error)
            }
        }
    };
}

parts_extractor!(
    /// `axum::extract::Path` where a malformed id means "no such resource".
    AppPath,
    Path,
    |e: PathRejection| Error::NotFound(format!("no such resource: {}", e.body_text()))
);

parts_extractor!(
    /// `axum::extract::Query` with wrong values reported as 422.
    AppQuery,
    Query,
    |e: QueryRejection| Error::Unprocessable(e.body_text())
);

/// A body that holds exactly one of the members `a` and `b` (the document's
/// `oneOf` of two objects, each with its one member required and no other):
/// the object is read as `A` or as `B` by which member it has, so a `null`
/// member counts as given and is refused with the other's type error.
pub fn exactly_one<'de, D, A, B, T>(
    deserializer: D,
    (a, as_a): (&str, fn(A) -> T),
    (b, as_b): (&str, fn(B) -> T),
) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    A: DeserializeOwned,
    B: DeserializeOwned,
{
    use serde::de::Error as _;
    use serde::Deserialize as _;
    let object = serde_json::Map::<String, serde_json::Value>::deserialize(deserializer)?;
    let read = |object| serde_json::Value::Object(object);
    match (object.contains_key(a), object.contains_key(b)) {
        (true, false) => serde_json::from_value(read(object)).map(as_a),
        (false, true) => serde_json::from_value(read(object)).map(as_b),
        _ => return Err(D::Error::custom(format!("give exactly one of {a} or {b}"))),
    }
    .map_err(D::Error::custom)
}
