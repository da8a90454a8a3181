//! What a remote agent's connection is to the rest of the gateway, over
//! either transport: how it ended ([`Ended`]), its two streams as lines
//! ([`RemoteLink`]), its control ([`RemoteControl`]), and what a
//! connection's own tasks share ([`Ends`]).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, AUTHORIZATION};
use tokio::io::DuplexStream;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::config::AgentProfile;

/// How many bytes each direction's pipe between the connection and the
/// rpc layer holds.
pub(super) const PIPE_BYTES: usize = 64 * 1024;
/// How long a connection told to close may take to say it closed.
pub(super) const CLOSE_WITHIN: Duration = Duration::from_secs(2);
/// How large a message a look at whether an agent can be reached
/// (`GET /api/v1/agents`) may read.
pub(super) const PROBE_BYTES: usize = 64 * 1024;

/// How a remote agent's connection ended.
#[derive(Debug, Clone)]
pub enum Ended {
    /// Closed in order (by the agent, or by us): the text says by whom.
    Closed(String),
    /// Lost: the network, or the agent went away without closing.
    Lost(String),
}

impl std::fmt::Display for Ended {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Ended::Closed(why) => write!(f, "closed {why}"),
            Ended::Lost(why) => write!(f, "lost: {why}"),
        }
    }
}

/// An open connection to a remote agent: its two streams as lines, and
/// its control.
pub struct RemoteLink {
    /// What the rpc layer writes (one message a line).
    pub input: DuplexStream,
    /// What the rpc layer reads (one message a line).
    pub output: DuplexStream,
    pub control: RemoteControl,
}

/// Ends a remote agent's connection, and tells how it ended.
#[derive(Clone)]
pub struct RemoteControl {
    ended: watch::Receiver<Option<Ended>>,
    stop: CancellationToken,
}

impl RemoteControl {
    /// Resolves when the connection has ended (at once afterwards).
    pub async fn ended(&mut self) -> Ended {
        match self.ended.wait_for(Option::is_some).await {
            Ok(ended) => ended.clone().expect("waited for"),
            Err(_) => Ended::Lost("the connection's tasks are gone".into()),
        }
    }

    /// Closes the connection (a WebSocket close frame, or a Streamable
    /// HTTP `DELETE`) and waits for its end, bounded.
    pub async fn close(&mut self) -> Ended {
        self.stop.cancel();
        match tokio::time::timeout(CLOSE_WITHIN, self.ended()).await {
            Ok(ended) => ended,
            Err(_) => Ended::Closed("by the gateway (the agent did not answer the close)".into()),
        }
    }
}

/// What both of a connection's tasks share: how it ended, the word to
/// stop, and the word to stop waiting for the agent's answer to a close.
#[derive(Clone)]
pub(super) struct Ends {
    pub(super) ended: Arc<watch::Sender<Option<Ended>>>,
    pub(super) stop: CancellationToken,
    pub(super) abandon: CancellationToken,
}

impl Ends {
    /// A connection's ends, and the control over them.
    pub(super) fn new() -> (Ends, RemoteControl) {
        let (ended_tx, ended) = watch::channel(None);
        let stop = CancellationToken::new();
        let ends = Ends {
            ended: Arc::new(ended_tx),
            stop: stop.clone(),
            abandon: CancellationToken::new(),
        };
        (ends, RemoteControl { ended, stop })
    }

    /// Says how the connection ended, once (the first word stays).
    pub(super) fn end(&self, how: Ended) {
        end(&self.ended, how);
    }

    pub(super) fn is_ended(&self) -> bool {
        self.ended.borrow().is_some()
    }
}

/// Says how the connection ended, once (the first word stays).
pub(super) fn end(ended: &watch::Sender<Option<Ended>>, how: Ended) {
    ended.send_if_modified(|now| {
        if now.is_some() {
            return false;
        }
        *now = Some(how);
        true
    });
}

/// One message as one line: a message written over several lines (pretty
/// JSON) is made compact; the line ends with `\n`.
pub(super) fn as_line(mut text: String) -> String {
    if text.contains('\n') {
        if let Ok(value) = serde_json::from_str::<serde_json::Value>(&text) {
            text = value.to_string();
        } else {
            text = text.replace(['\r', '\n'], " ");
        }
    }
    text.push('\n');
    text
}

/// The headers every request to the profile's remote agent carries: its
/// `headers`, and its bearer token (marked sensitive: never logged).
pub(super) fn request_headers(profile: &AgentProfile) -> anyhow::Result<HeaderMap> {
    let mut headers = HeaderMap::new();
    for (key, value) in &profile.headers {
        let key = HeaderName::from_bytes(key.as_bytes()).context("bad header name")?;
        headers.insert(
            key,
            HeaderValue::from_str(value).context("bad header value")?,
        );
    }
    if let Some(token) = profile.remote_token()? {
        let mut value = HeaderValue::from_str(&format!("Bearer {token}"))
            .context("the token is not a valid header value")?;
        value.set_sensitive(true);
        headers.insert(AUTHORIZATION, value);
    }
    Ok(headers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_over_several_lines_becomes_one() {
        assert_eq!(
            as_line("{\n  \"id\": 1\n}".into()),
            "{\"id\":1}\n".to_owned()
        );
        assert_eq!(as_line("{\"id\":1}".into()), "{\"id\":1}\n");
    }
}
