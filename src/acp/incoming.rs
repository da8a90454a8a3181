//! What an agent sends us that is not a response, as the ACP layer reads it:
//! [`Incoming`], the JSON-RPC layer's message with ACP's fast path, a
//! `session/update` notification that is one plain text chunk, read without
//! building a JSON tree (see [`super::chunk`]).

use super::chunk::{self, TextChunk};
use super::rpc::Inbound;

/// A message the agent sent that is not a response to one of our requests:
/// a notification, a request (answered through its responder), or a plain
/// text chunk ([`Incoming::Fast`]).
pub type Incoming = super::rpc::Incoming<TextChunk>;

impl Inbound for TextChunk {
    fn read_fast(line: &[u8]) -> Option<Self> {
        chunk::parse_line(line)
    }

    fn method(&self) -> &str {
        chunk::METHOD
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::{json, Value};
    use tokio::io::AsyncWriteExt;

    use super::*;
    use crate::acp::rpc::{RpcConfig, RpcPeer};

    #[tokio::test]
    async fn text_chunks_take_the_fast_path_in_order_with_everything_else() {
        let (ours, mut agent) = tokio::io::duplex(64 * 1024);
        let (reader, writer) = tokio::io::split(ours);
        let (_peer, mut incoming) =
            RpcPeer::spawn::<TextChunk>(reader, writer, RpcConfig::default());
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
                Incoming::Fast(c) if !text.is_empty() => {
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
