//! The protocol layer's own errors: what can go wrong opening a session with
//! an agent, said without HTTP. [`From`] turns them into the crate's
//! [`crate::error::Error`], with the status and problem code the API has
//! always given them (502 `agent_failed`, 504 `agent_timeout`), so callers
//! above keep using `?`. The connection itself fails with
//! [`RpcError`](super::rpc::RpcError).

/// Result alias of the protocol layer.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why the agent could not be talked to.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The agent exited, refused a request, or answered something unusable;
    /// the message says which (with its last stderr lines where they help).
    #[error("{0}")]
    Failed(String),
    /// The agent did not answer in time.
    #[error("{0}")]
    Timeout(String),
    /// The agent does not offer what was asked of it (a fork, a listing,
    /// taking a session over): the crate's 409 `not_supported`.
    #[error("{0}")]
    NotSupported(String),
    /// The agent does not know the session asked for: the crate's 404.
    #[error("{0}")]
    NoSession(String),
}

impl From<Error> for crate::error::Error {
    fn from(error: Error) -> Self {
        match error {
            Error::Failed(detail) => crate::error::Error::AgentFailed(detail),
            Error::Timeout(detail) => crate::error::Error::AgentTimeout(detail),
            Error::NotSupported(detail) => crate::error::Error::Conflict {
                code: "not_supported",
                detail,
                extra: None,
            },
            Error::NoSession(detail) => crate::error::Error::NotFound(detail),
        }
    }
}

#[cfg(test)]
mod tests {
    use axum::response::IntoResponse;

    use super::*;

    #[test]
    fn protocol_errors_keep_their_http_status_and_problem_code() {
        for (error, status, code) in [
            (Error::Failed("agent exited".into()), 502, "agent_failed"),
            (Error::Timeout("no answer".into()), 504, "agent_timeout"),
        ] {
            let detail = error.to_string();
            let problem = crate::error::Error::from(error).problem();
            assert_eq!(
                (problem.status, problem.code.as_str(), problem.detail),
                (status, code, detail)
            );
        }
        let response = crate::error::Error::from(Error::Timeout("slow".into())).into_response();
        assert_eq!(response.status().as_u16(), 504);
    }
}
