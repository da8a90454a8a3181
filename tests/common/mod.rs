//! Shared test support: a database per test, a real gateway on a free port,
//! real agent subprocesses, HTTP and WebSocket clients. No test sleeps a
//! fixed time: every wait is on an event, with a bound, or, where nothing
//! announces the change, a bounded poll ([`eventually`]).
//!
//! One file per job: [`db`] (a database of the test's own), [`agents`] (the
//! agents' profiles), [`gateway`] (a gateway in this process), [`process`]
//! (an `acp-gateway` process and the CLI), [`pids`] (processes as the system
//! sees them), [`client`] (REST), [`ws`] (WebSockets) and [`files`] (files
//! that change under the gateway). Everything is re-exported here, so a test
//! file needs one `use crate::common::*`.

// Each test and bench binary uses a part of the harness.
#![allow(dead_code, unused_imports)]

#[macro_use]
pub mod db;
pub mod agents;
pub mod client;
pub mod files;
pub mod gateway;
pub mod pids;
pub mod process;
pub mod ws;

pub use agents::*;
pub use client::*;
pub use db::*;
pub use files::*;
pub use gateway::*;
pub use pids::*;
pub use process::*;
pub use ws::*;

use std::time::Duration;

/// How long any single wait in a test may take before it fails.
pub const WAIT: Duration = Duration::from_secs(20);

/// How often [`eventually`] asks again.
const POLL: Duration = Duration::from_millis(20);

/// Asks `check` every 20 ms until it finds what it looks for, for at most
/// `bound`: what it found, or `Err` once `bound` has passed. Only for what
/// nothing announces (a row another process writes, a lock wait, a
/// process's counters): what an event says is waited for on the event.
pub async fn eventually<T>(
    bound: Duration,
    mut check: impl AsyncFnMut() -> Option<T>,
) -> Result<T, tokio::time::error::Elapsed> {
    tokio::time::timeout(bound, async {
        loop {
            if let Some(found) = check().await {
                return found;
            }
            tokio::time::sleep(POLL).await;
        }
    })
    .await
}

/// An environment variable parsed, else `default` (benchmark sizes).
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
