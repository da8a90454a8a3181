//! One error type for the HTTP API, rendered as RFC 9457 problem details
//! (`application/problem+json`) with a stable snake_case `code`.
//!
//! 5xx details that come from inside the gateway are logged, not sent; the
//! agent-facing 502/504 errors do carry their cause, because the user needs
//! it to fix their agent setup.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

/// Result alias used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything a request can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    NotFound(String),
    /// No valid credentials.
    #[error("{0}")]
    Unauthorized(String),
    /// Valid credentials, not enough rights.
    #[error("{0}")]
    Forbidden(String),
    /// Not allowed, for a reason a client can tell apart by `code` (e.g.
    /// `share_links_disabled`).
    #[error("{detail}")]
    Refused { code: &'static str, detail: String },
    /// Over a rate limit; try again after `retry_after` seconds.
    #[error("{detail}")]
    TooManyRequests { detail: String, retry_after: u64 },
    #[error("{0}")]
    BadRequest(String),
    /// A request to a WebSocket endpoint that is not a WebSocket handshake.
    #[error("{0}")]
    NotAHandshake(String),
    #[error("{0}")]
    UnsupportedMediaType(String),
    #[error("{0}")]
    PayloadTooLarge(String),
    /// No representation the request's `Accept` allows.
    #[error("{0}")]
    NotAcceptable(String),
    /// A request the gateway understands but does not serve.
    #[error("{0}")]
    NotImplemented(String),
    /// Well-formed input of the wrong shape.
    #[error("{0}")]
    Unprocessable(String),
    /// No more: a used or expired capability (an action URL).
    #[error("{0}")]
    Gone(String),
    /// The resource is in a state that forbids the request.
    #[error("{detail}")]
    Conflict {
        code: &'static str,
        detail: String,
        /// Extra members merged into the problem body (e.g. the current request).
        extra: Option<Value>,
    },
    /// A budget is spent (402 `budget_exceeded`): `extra` says which, its
    /// limit, what was spent and when it resets.
    #[error("{detail}")]
    BudgetExceeded { detail: String, extra: Value },
    /// The agent could not be started or failed while starting.
    #[error("{0}")]
    AgentFailed(String),
    /// A git repository or worktree is out of reach of this node, or git
    /// failed on it (its words are in the detail).
    #[error("{0}")]
    Repository(String),
    /// A path in the request leads out of where it must stay.
    #[error("{0}")]
    BadPath(String),
    /// The agent did not answer in time.
    #[error("{0}")]
    AgentTimeout(String),
    #[error("service unavailable: {0}")]
    Unavailable(String),
    /// Every agent slot (`max_agents`) is busy; try again after
    /// `retry_after` seconds.
    #[error("{detail}")]
    AtCapacity { detail: String, retry_after: u64 },
    /// This node no longer owns the conversation (named here) it wrote to:
    /// another node claimed it (see [`crate::cluster`]'s fencing), and
    /// nothing was written. A 409 `conversation_moved`: sent again, the
    /// command reaches the new owner.
    #[error("conversation {0} is run by another gateway node now")]
    Fenced(uuid::Uuid),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
    /// The answer another gateway node gave (see [`crate::cluster`]),
    /// passed on as it was.
    #[error("{}", .0.detail)]
    Remote(Box<Problem>),
}

/// An error as the API shows it: what [`Error`] becomes on the wire, and
/// what one gateway node hands another.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Problem {
    pub status: u16,
    pub code: String,
    pub detail: String,
    /// Members merged into the problem body (e.g. the current request).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after: Option<u64>,
}

impl Error {
    pub fn conflict(code: &'static str, detail: impl Into<String>) -> Self {
        Error::Conflict {
            code,
            detail: detail.into(),
            extra: None,
        }
    }

    /// Whether trying the same database write again may succeed: the
    /// connection or the server had a problem, not the data. Anything else
    /// (a value the database refuses, a violated constraint) fails again.
    pub fn is_transient(&self) -> bool {
        let Error::Database(e) = self else {
            return false;
        };
        match e {
            sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::Protocol(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed => true,
            sqlx::Error::Database(db) => {
                let code = db.code().unwrap_or_default();
                if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
                    // SQLite primary result codes: BUSY, LOCKED, IOERR, FULL.
                    matches!(code.parse::<i32>().map(|c| c & 0xff), Ok(5 | 6 | 10 | 13))
                } else {
                    // Postgres SQLSTATE classes: connection exception,
                    // transaction rollback (serialization, deadlock),
                    // insufficient resources, operator intervention (shutdown,
                    // a terminated connection), system error.
                    ["08", "40", "53", "57", "58"]
                        .iter()
                        .any(|class| code.starts_with(class))
                }
            }
            _ => false,
        }
    }

    /// Whether the database refused a write for a key that is taken: what
    /// it names (a request's id, an event's `seq`) is stored already.
    pub fn is_unique_violation(&self) -> bool {
        matches!(self, Error::Database(sqlx::Error::Database(db))
            if db.kind() == sqlx::error::ErrorKind::UniqueViolation)
    }

    /// Whether this is [`Error::Fenced`]: the write was refused because
    /// another node owns the conversation now.
    pub fn is_fenced(&self) -> bool {
        matches!(self, Error::Fenced(_))
    }

    /// Whether the database is out of reach (for now): what waits for it
    /// may succeed later.
    pub fn is_outage(&self) -> bool {
        self.is_transient() || matches!(self, Error::Unavailable(_))
    }

    fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            Error::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            Error::Unauthorized(_) => (StatusCode::UNAUTHORIZED, "unauthorized"),
            Error::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden"),
            Error::Refused { code, .. } => (StatusCode::FORBIDDEN, code),
            Error::TooManyRequests { .. } => (StatusCode::TOO_MANY_REQUESTS, "rate_limited"),
            Error::BadRequest(_) => (StatusCode::BAD_REQUEST, "malformed_json"),
            Error::NotAHandshake(_) => (StatusCode::BAD_REQUEST, "not_a_websocket_handshake"),
            Error::UnsupportedMediaType(_) => {
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type")
            }
            Error::PayloadTooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
            Error::NotAcceptable(_) => (StatusCode::NOT_ACCEPTABLE, "not_acceptable"),
            Error::NotImplemented(_) => (StatusCode::NOT_IMPLEMENTED, "not_implemented"),
            Error::Unprocessable(_) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_request"),
            Error::Conflict { code, .. } => (StatusCode::CONFLICT, code),
            Error::Fenced(_) => (StatusCode::CONFLICT, "conversation_moved"),
            Error::Gone(_) => (StatusCode::GONE, "gone"),
            Error::BudgetExceeded { .. } => (StatusCode::PAYMENT_REQUIRED, "budget_exceeded"),
            Error::AgentFailed(_) => (StatusCode::BAD_GATEWAY, "agent_failed"),
            Error::Repository(_) => (StatusCode::BAD_GATEWAY, "repository_failed"),
            Error::BadPath(_) => (StatusCode::BAD_REQUEST, "invalid_path"),
            Error::AgentTimeout(_) => (StatusCode::GATEWAY_TIMEOUT, "agent_timeout"),
            Error::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            Error::AtCapacity { .. } => (StatusCode::SERVICE_UNAVAILABLE, "at_capacity"),
            Error::Database(_) if self.is_transient() => {
                (StatusCode::SERVICE_UNAVAILABLE, "database_unavailable")
            }
            Error::Database(_) | Error::Internal(_) => {
                (StatusCode::INTERNAL_SERVER_ERROR, "internal_error")
            }
            // Rendered from its problem (see `problem`).
            Error::Remote(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal_error"),
        }
    }

    /// The error as the API shows it. An internal error's cause is logged
    /// here and left out.
    pub fn problem(self) -> Problem {
        if let Error::Remote(problem) = self {
            return *problem;
        }
        let (status, code) = self.status_and_code();
        let detail = if status == StatusCode::INTERNAL_SERVER_ERROR {
            tracing::error!(error = ?self, "request failed");
            "internal error; see the gateway log".to_owned()
        } else {
            self.to_string()
        };
        let retry_after = match &self {
            Error::TooManyRequests { retry_after, .. } | Error::AtCapacity { retry_after, .. } => {
                Some(*retry_after)
            }
            _ => None,
        };
        let extra = match self {
            Error::Conflict { extra, .. } => extra,
            Error::BudgetExceeded { extra, .. } => Some(extra),
            _ => None,
        };
        Problem {
            status: status.as_u16(),
            code: code.to_owned(),
            detail,
            extra,
            retry_after,
        }
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let problem = self.problem();
        let status =
            StatusCode::from_u16(problem.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut body = json!({
            "type": format!("urn:acp-gateway:problem:{}", problem.code),
            "title": status.canonical_reason().unwrap_or("Error"),
            "status": status.as_u16(),
            "detail": problem.detail,
            "code": problem.code,
        });
        if let Some(Value::Object(extra)) = problem.extra {
            body.as_object_mut().unwrap().extend(extra);
        }
        let mut response = (
            status,
            [(header::CONTENT_TYPE, "application/problem+json")],
            body.to_string(),
        )
            .into_response();
        if let Some(seconds) = problem.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from(seconds));
        }
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            // The rest of the body was never read, so this connection cannot
            // carry another request: say so, and the client opens a new one.
            response.headers_mut().insert(
                header::CONNECTION,
                header::HeaderValue::from_static("close"),
            );
        }
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fenced_write_is_shown_as_a_conflict_named_conversation_moved() {
        let conversation = uuid::Uuid::nil();
        let fenced = Error::Fenced(conversation);
        assert!(fenced.is_fenced());
        assert_eq!(
            fenced.problem(),
            Problem {
                status: 409,
                code: "conversation_moved".into(),
                detail: format!("conversation {conversation} is run by another gateway node now"),
                extra: None,
                retry_after: None,
            }
        );
        assert!(!Error::conflict("conversation_moved", "a look-alike").is_fenced());
    }
}
