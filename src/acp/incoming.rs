//! What an agent sends us that is not a response, as the ACP layer reads it: the
//! [`Incoming`] messages the session handles, and the [`Inbound`] hook that gives the
//! connection its fast path for `session/update` text chunks (see [`super::chunk`]).

use serde_json::Value;

use super::chunk::{self, TextChunk};
// From the hook's own file rather than `super::rpc`: `rpc.rs` re-exports `Incoming` (for
// `RpcPeer::spawn`), and imports between files go one way (tests/suite/architecture.rs).
use super::rpc::inbound::{Inbound, IncomingRequest};

/// A message the peer sent us that is not a response to one of our requests.
#[derive(Debug)]
pub enum Incoming {
    /// A message with a `method` and no `id`; it gets no answer.
    Notification {
        /// The method name.
        method: String,
        /// The `params` as sent, or `Value::Null` if there were none.
        params: Value,
    },
    /// A message with a `method` and an `id`; it must be answered through its
    /// [`Responder`](super::rpc::Responder).
    Request(IncomingRequest),
    /// A `session/update` notification that is one plain text chunk, read
    /// without building a JSON tree (see [`super::chunk`]).
    TextChunk(TextChunk),
}

impl Inbound for Incoming {
    fn read_fast(line: &[u8]) -> Option<Self> {
        chunk::parse_line(line).map(Incoming::TextChunk)
    }

    fn notification(method: String, params: Value) -> Self {
        Incoming::Notification { method, params }
    }

    fn request(request: IncomingRequest) -> Self {
        Incoming::Request(request)
    }

    fn into_request(self) -> Result<IncomingRequest, Self> {
        match self {
            Incoming::Request(request) => Ok(request),
            other => Err(other),
        }
    }

    fn method(&self) -> &str {
        match self {
            Incoming::Notification { method, .. } => method,
            Incoming::Request(request) => &request.method,
            Incoming::TextChunk(_) => chunk::METHOD,
        }
    }
}
