//! What the gateway counts, served as Prometheus text at `GET /metrics`.
//!
//! Counters and the commit-latency histogram are recorded where things
//! happen (through the `metrics` facade); gauges that the database or the
//! session registry know better (conversations by status, pending requests,
//! agents running) are set when the page is rendered.

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Events committed to the database.
const EVENTS_WRITTEN: &str = "acp_gateway_events_written_total";
/// Write transactions committed, and the rows they inserted or updated.
const DB_TRANSACTIONS: &str = "acp_gateway_db_transactions_total";
const DB_ROWS: &str = "acp_gateway_db_rows_written_total";
/// Seconds one batch commit took.
const COMMIT_SECONDS: &str = "acp_gateway_db_commit_seconds";
/// Events appended but not committed yet.
const WRITE_BUFFER: &str = "acp_gateway_write_buffer_events";
/// Open WebSocket connections.
const WEBSOCKETS: &str = "acp_gateway_websocket_clients";
/// Bytes WebSockets hold for clients that have not taken them yet (see
/// `ws_buffer_bytes`).
const WEBSOCKET_BUFFERED: &str = "acp_gateway_websocket_buffered_bytes";
/// WebSockets closed with 1013: evicted to make room in `ws_buffer_bytes`
/// (they had stopped reading), or no room found for their next bytes in time.
const WEBSOCKET_OVER_BUDGET: &str = "acp_gateway_websocket_over_budget_total";
/// Agent processes that ended, by cause.
const AGENT_EXITS: &str = "acp_gateway_agent_exits_total";
/// Agents started again for an existing conversation, by why they had gone
/// and what they remembered.
const AGENT_RESTARTS: &str = "acp_gateway_agent_restarts_total";
/// Notification delivery attempts, by target kind and outcome.
const NOTIFICATIONS: &str = "acp_gateway_notifications_total";

/// The process's recorder (one per process: the `metrics` facade is global).
fn handle() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(
                Matcher::Full(COMMIT_SECONDS.into()),
                &[
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                ],
            )
            .expect("buckets are not empty")
            .build_recorder();
        let handle = recorder.handle();
        if metrics::set_global_recorder(recorder).is_err() {
            tracing::warn!("another metrics recorder is installed; /metrics shows gauges only");
        }
        handle
    })
}

/// Installs the recorder (idempotent); call before serving.
pub fn install() {
    handle();
}

/// Folds recorded histogram samples into their buckets, every few seconds
/// until `stop`: without it they pile up between scrapes (and forever when
/// nobody scrapes).
pub async fn keep_up(stop: tokio_util::sync::CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => handle().run_upkeep(),
        }
    }
}

pub fn events_written(n: usize) {
    metrics::counter!(EVENTS_WRITTEN).increment(n as u64);
}

/// A write transaction committed `rows` rows.
pub fn transaction(rows: usize) {
    metrics::counter!(DB_TRANSACTIONS).increment(1);
    metrics::counter!(DB_ROWS).increment(rows as u64);
}

pub fn commit_took(latency: Duration) {
    metrics::histogram!(COMMIT_SECONDS).record(latency.as_secs_f64());
}

/// Events entered (`+n`) or left (`-n`) the write buffer.
pub fn buffered(delta: f64) {
    metrics::gauge!(WRITE_BUFFER).increment(delta);
}

/// Counts an open WebSocket while it lives.
pub struct WebSocketOpen(());

impl WebSocketOpen {
    pub fn new() -> WebSocketOpen {
        metrics::gauge!(WEBSOCKETS).increment(1.0);
        WebSocketOpen(())
    }
}

impl Default for WebSocketOpen {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for WebSocketOpen {
    fn drop(&mut self) {
        metrics::gauge!(WEBSOCKETS).decrement(1.0);
    }
}

/// Bytes held for WebSocket clients grew (`+n`) or shrank (`-n`).
pub fn websocket_buffered(delta: f64) {
    metrics::gauge!(WEBSOCKET_BUFFERED).increment(delta);
}

/// A WebSocket was closed with 1013: evicted to make room in
/// `ws_buffer_bytes`, or no room found in time.
pub fn websocket_over_budget() {
    metrics::counter!(WEBSOCKET_OVER_BUDGET).increment(1);
}

/// An agent process ended: `crashed` (by itself), `idle`, `capacity`
/// (`max_agents`), `shutdown`, `closed` (by a user), `error`.
pub fn agent_exited(cause: &'static str) {
    metrics::counter!(AGENT_EXITS, "cause" => cause).increment(1);
}

/// An agent was started again for a conversation: `context` `loaded` or
/// `reset`; `cause` why it had gone (as [`agent_exited`] counts it, or
/// `restart` when the gateway itself restarted).
pub fn agent_restarted(context: &'static str, cause: &'static str) {
    metrics::counter!(AGENT_RESTARTS, "context" => context, "cause" => cause).increment(1);
}

/// A notification delivery attempt to a target of `kind` came to
/// `outcome` (`delivered`, `failed`, `gone`).
pub fn notification_attempt(kind: &str, outcome: &'static str) {
    metrics::counter!(NOTIFICATIONS, "kind" => kind.to_owned(), "outcome" => outcome).increment(1);
}

/// What the registry and the database say now (`None`: the database did
/// not answer; those gauges keep their last values).
pub struct Snapshot {
    /// This gateway node (`acp_gateway_node_info{node_id}`, always 1).
    pub node_id: uuid::Uuid,
    pub agents_running: usize,
    pub conversations_by_status: Option<Vec<(String, i64)>>,
    pub permissions_pending: Option<i64>,
}

/// The page: the snapshot's gauges and everything recorded so far.
pub fn render(now: Snapshot) -> String {
    metrics::gauge!("acp_gateway_node_info", "node_id" => now.node_id.to_string()).set(1.0);
    metrics::gauge!("acp_gateway_agents_running").set(now.agents_running as f64);
    for (status, count) in now.conversations_by_status.unwrap_or_default() {
        metrics::gauge!("acp_gateway_conversations", "status" => status).set(count as f64);
    }
    if let Some(pending) = now.permissions_pending {
        metrics::gauge!("acp_gateway_permissions_pending").set(pending as f64);
    }
    handle().render()
}
