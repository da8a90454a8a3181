//! The gateway's end of a remote agent's connection: an agent that serves
//! ACP over the network (the remote transport RFD) instead of one the
//! gateway spawns. Either transport becomes a [`RemoteLink`]: two byte
//! streams of one JSON-RPC message a line, so [`super::rpc`] reads the same
//! stream from the network as from a pipe or a shim's socket.
//!
//! - [`ws`]: a WebSocket, each text frame one message (`ws://`, `wss://`,
//!   or `https://` with `transport = "websocket"`).
//! - [`http`]: Streamable HTTP, each message POSTed and what the agent
//!   sends read from the connection's one GET event stream (`http://`,
//!   `https://`).
//!
//! What both share: [`shared`] (how a connection ended, its streams, its
//! control) and [`guard`] (the address guard every connection goes
//! through, as notification targets do, and TLS with the profile's
//! `ca_file`). Here: the transport a profile's connection takes.

mod http;
mod ws;
mod guard;
mod shared;

use std::time::Duration;

use anyhow::bail;

pub use self::shared::{Ended, RemoteControl, RemoteLink};
use crate::config::{AgentProfile, Transport};

/// Connects to the profile's `url` (within `within`) over its transport
/// and starts carrying messages both ways; messages longer than
/// `max_message_bytes` end it.
pub async fn connect(
    profile: &AgentProfile,
    max_message_bytes: usize,
    within: Duration,
) -> anyhow::Result<RemoteLink> {
    match profile.remote_transport() {
        Some(Transport::Http) => http::connect(profile, max_message_bytes, within).await,
        Some(Transport::Websocket) => ws::connect(profile, max_message_bytes, within).await,
        None => bail!("not a remote agent"),
    }
}

/// Why the profile's remote agent cannot be reached now, or `None` when it
/// can: what `GET /api/v1/agents` reports. A WebSocket is opened and
/// closed at once; over Streamable HTTP a `GET` without a connection id
/// is sent, which starts nothing on the agent (see [`http`]).
pub async fn unavailable_reason(profile: &AgentProfile, within: Duration) -> Option<String> {
    let found = match profile.remote_transport() {
        Some(Transport::Http) => http::probe(profile, within).await,
        Some(Transport::Websocket) => ws::probe(profile, within).await,
        None => Err(anyhow::anyhow!("not a remote agent")),
    };
    found.err().map(|e| format!("{e:#}"))
}
