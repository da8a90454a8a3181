//! What an agent sends us that is not a response, as the ACP layer reads it: the
//! [`Incoming`] messages the session handles, and the [`Inbound`] hook that gives the
//! connection its fast path for `session/update` text chunks (see [`super::chunk`]).

use serde_json::Value;

use super::chunk::{self, TextChunk};
use super::rpc::{Inbound, IncomingRequest};

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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;
    use tokio::io::AsyncWriteExt;

    use super::*;
    use crate::acp::rpc::{RpcConfig, RpcPeer};

    #[tokio::test]
    async fn text_chunks_take_the_fast_path_in_order_with_everything_else() {
        let (ours, mut agent) = tokio::io::duplex(64 * 1024);
        let (reader, writer) = tokio::io::split(ours);
        let (_peer, mut incoming) =
            RpcPeer::spawn::<Incoming>(reader, writer, RpcConfig::default());
        let update =
            |params: Value| json!({"jsonrpc": "2.0", "method": "session/update", "params": params});
        let chunk = |text: &str| {
            update(
                json!({"sessionId": "s", "update": {"sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": text}}}),
            )
        };
        for message in [chunk("a"), update(json!({"n": 1}))] {
            let mut line = serde_json::to_vec(&message).unwrap();
            line.push(b'\n');
            agent.write_all(&line).await.unwrap();
        }
        // Split across writes, so that it is assembled rather than read in place.
        let line = serde_json::to_vec(&chunk("b")).unwrap();
        for part in [&line[..10], &line[10..], b"\n"] {
            agent.write_all(part).await.unwrap();
            agent.flush().await.unwrap();
        }
        for text in ["a", "", "b"] {
            let next = tokio::time::timeout(Duration::from_secs(10), incoming.recv());
            match next.await.unwrap().unwrap() {
                Incoming::TextChunk(c) if !text.is_empty() => {
                    assert_eq!(c.text, text);
                    assert_eq!(c.session_id, "s");
                }
                Incoming::Notification { method, params } if text.is_empty() => {
                    assert_eq!(method, chunk::METHOD);
                    assert_eq!(params, json!({"n": 1}));
                }
                other => panic!("expected {text:?}, got {other:?}"),
            }
        }
    }
}
