//! A WebSocket client reading the gateway's JSON frames, and what tests
//! read from the events it receives.

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use super::WAIT;

/// A WebSocket client reading JSON frames.
pub struct Ws {
    pub stream: WebSocketStream<MaybeTlsStream<TcpStream>>,
}

impl Ws {
    /// The next JSON frame, failing the test after [`WAIT`].
    pub async fn next(&mut self) -> Value {
        self.next_within(WAIT).await
    }

    /// The next JSON frame, failing the test after `bound`.
    async fn next_within(&mut self, bound: Duration) -> Value {
        loop {
            let msg = tokio::time::timeout(bound, self.stream.next())
                .await
                .expect("a websocket frame arrives in time")
                .expect("websocket still open")
                .expect("websocket frame");
            match msg {
                WsMessage::Text(text) => return serde_json::from_str(&text).unwrap(),
                WsMessage::Ping(_) | WsMessage::Pong(_) => continue,
                other => panic!("unexpected websocket frame {other:?}"),
            }
        }
    }

    /// Reads until the server closes the socket: the JSON frames before it,
    /// and the close code (1005 when it gave none).
    pub async fn until_closed(&mut self) -> (Vec<Value>, u16) {
        let mut frames = Vec::new();
        loop {
            let frame = tokio::time::timeout(WAIT, self.stream.next())
                .await
                .expect("the socket is closed in time");
            match frame {
                Some(Ok(WsMessage::Text(text))) => {
                    frames.push(serde_json::from_str(&text).unwrap())
                }
                Some(Ok(WsMessage::Close(Some(frame)))) => return (frames, frame.code.into()),
                Some(Ok(WsMessage::Close(None))) | None => return (frames, 1005),
                Some(Ok(_)) => continue,
                Some(Err(e)) => panic!("socket failed instead of closing: {e}"),
            }
        }
    }

    /// Reads frames until one matches, returning all frames read (the match last).
    pub async fn until(&mut self, pred: impl Fn(&Value) -> bool) -> Vec<Value> {
        self.until_within(WAIT, pred).await
    }

    /// Reads frames, each within `bound`, until one matches: all frames
    /// read, the match last.
    pub async fn until_within(
        &mut self,
        bound: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Vec<Value> {
        let mut seen = Vec::new();
        loop {
            let frame = self.next_within(bound).await;
            let done = pred(&frame);
            seen.push(frame);
            if done {
                return seen;
            }
        }
    }

    /// Reads until an event of this type, each frame within `bound`
    /// instead of [`WAIT`] (for a turn that makes no event for a while):
    /// all frames read, the match last.
    pub async fn until_type_within(&mut self, kind: &str, bound: Duration) -> Vec<Value> {
        self.until_within(bound, |e| e["type"] == kind).await
    }

    /// Reads until an event of this type (and optionally matching more).
    pub async fn until_type(&mut self, kind: &str) -> Vec<Value> {
        self.until(|e| e["type"] == kind).await
    }

    /// Reads until the agent is reported gone (`agent_status` exited or failed).
    pub async fn until_agent_gone(&mut self) -> Vec<Value> {
        self.until(|e| {
            e["type"] == "agent_status"
                && matches!(e["data"]["status"].as_str(), Some("exited" | "failed"))
        })
        .await
    }

    pub async fn close(mut self) {
        let _ = self.stream.send(WsMessage::Close(None)).await;
    }
}

/// Reads until the demo agent's `child` scenario says its child's pid.
pub async fn child_pid(ws: &mut Ws) -> i32 {
    let frames = ws
        .until(|e| {
            e["data"]["update"]["content"]["text"]
                .as_str()
                .is_some_and(|t| t.starts_with("child "))
        })
        .await;
    let text = frames.last().unwrap()["data"]["update"]["content"]["text"]
        .as_str()
        .unwrap();
    text.trim_start_matches("child ").parse().unwrap()
}

/// The concatenated text of every `session_update` of one kind.
pub fn streamed_text(events: &[Value], update_kind: &str) -> String {
    events
        .iter()
        .filter(|e| {
            e["type"] == "session_update" && e["data"]["update"]["sessionUpdate"] == update_kind
        })
        .filter_map(|e| e["data"]["update"]["content"]["text"].as_str())
        .collect()
}

/// Asserts seqs are consecutive, starting right after `after`.
pub fn assert_consecutive(events: &[Value], after: i64) {
    for (i, e) in events.iter().enumerate() {
        assert_eq!(
            e["seq"].as_i64().unwrap(),
            after + 1 + i as i64,
            "event {i}: {e}"
        );
    }
}
