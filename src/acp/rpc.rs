//! JSON-RPC 2.0 multiplexing over one line-delimited byte stream pair: the handle and its API.
//!
//! ACP agents speak JSON-RPC 2.0 on their stdio, one JSON message per line, and both sides
//! send requests: we call `session/prompt`, the agent calls `session/request_permission`. This
//! module turns an `AsyncRead`/`AsyncWrite` pair into an [`RpcPeer`] handle plus a stream of
//! incoming messages ([`Incoming`]), and knows nothing about ACP, its methods or its types:
//! the one thing the layer above adds is the fast path for its commonest lines, the
//! [`Inbound`] hook (ACP's text chunks), and what the messages mean is the session's.
//!
//! # Design
//!
//! [`RpcPeer::spawn`] starts two tasks that share one `Arc<Connection>`:
//!
//! - **The reader** (`routing.rs`) owns the `AsyncRead`. It cuts the stream into lines of at
//!   most [`RpcConfig::max_line_bytes`] (`framing.rs`: a longer line is dropped while it
//!   streams past, so memory stays bounded), parses each line and routes it:
//!   - a response (`id` + `result`/`error`) completes the caller waiting for that id;
//!   - a notification (`method`, no `id`) or a request (`method` + `id`) is sent, in arrival
//!     order, to the bounded incoming channel. The reader waits while that channel is
//!     full: this is the backpressure that keeps memory bounded, and it also means responses
//!     queued behind it wait, so the receiver must keep draining the channel.
//!
//!   Before any JSON tree is built, each line is offered to [`Inbound::read_fast`], the
//!   fast path the layer above may have for its commonest lines (ACP's text chunks).
//!   Anything that is not a JSON-RPC message (agents do print logs on stdout) is logged and
//!   skipped; nothing the peer sends can stop the reader except the end of the stream.
//! - **The writer** (`framing.rs`) owns the `AsyncWrite`. Every outgoing message is serialized
//!   by its sender and queued on an unbounded channel, because [`Responder::respond`] must
//!   work from synchronous code and from `Drop`. The writer writes what is queued and
//!   flushes once per batch.
//!
//! Our request ids come from an `AtomicU64` counting from 0; callers wait on a `oneshot`
//! registered in a table under a std `Mutex` (never held across an `.await`). A caller that
//! gives up (its future is dropped, e.g. by `tokio::time::timeout`) removes its entry through a
//! drop guard, so abandoned ids do not pile up. The peer's ids are a separate space and are
//! echoed back verbatim by the [`Responder`] that comes with each [`IncomingRequest`]; a
//! `Responder` dropped without an answer answers `-32603` itself, so the agent never waits
//! forever.
//!
//! # Closing
//!
//! The connection closes, once and with a reason, when the reader meets end of stream or a
//! read error, when a write fails, or when [`RpcPeer::close`] is called. Then every waiting
//! caller gets [`RpcError::Closed`] at once, later calls fail fast, both tasks stop (the
//! writer shuts its side down so the agent sees end of input), the incoming channel ends
//! after the messages already queued, and [`RpcPeer::closed`] resolves.

mod routing;
mod inbound;
mod framing;
mod inbox;
mod shared;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, oneshot, watch};
use tracing::trace;

pub use self::inbound::{Inbound, Incoming, IncomingRequest, Responder};
pub use self::inbox::Inbox;
pub use self::shared::{Processed, RpcError, INTERNAL_ERROR, INVALID_PARAMS, METHOD_NOT_FOUND};

use self::framing::{write_loop, LineReader, OutMessage};
use self::routing::read_loop;
use self::shared::{Connection, Ledger, State};

/// Size of the reader's own buffer; lines longer than this are assembled across refills.
/// Held only while the peer's bytes are being read: an idle agent costs none of it.
const READ_BUFFER_BYTES: usize = 64 * 1024;

/// Settings for one connection.
#[derive(Debug, Clone)]
pub struct RpcConfig {
    /// Longest accepted line in bytes, without its `\n`. Longer lines are discarded.
    pub max_line_bytes: usize,
    /// Capacity of the incoming channel; when it is full the reader stops reading.
    pub incoming_capacity: usize,
    /// Put into the `label` field of every log event of this connection (e.g. a
    /// conversation id), so one agent's traffic can be followed in the logs.
    pub label: String,
    /// Where in the peer's stream the reader starts (a stream joined part
    /// way through, as a shim replays it): positions count from here.
    pub start_position: u64,
    /// `start_position` lies inside a line too long to use (see
    /// [`Processed::inside_long_line`]): its rest is discarded.
    pub start_inside_long_line: bool,
    /// Our first request id: a connection that takes over from an earlier
    /// one to the same peer starts above every id that one used.
    pub first_request_id: u64,
    /// Ids of requests an earlier connection to the same peer sent whose
    /// answers may come first thing: their callers are registered before
    /// anything is read (see [`RpcPeer::answer_to`]).
    pub answers_awaited: Vec<u64>,
}

impl Default for RpcConfig {
    fn default() -> Self {
        Self {
            max_line_bytes: 16 * 1024 * 1024,
            incoming_capacity: 256,
            label: String::new(),
            start_position: 0,
            start_inside_long_line: false,
            first_request_id: 0,
            answers_awaited: Vec::new(),
        }
    }
}

/// A handle to one JSON-RPC connection: sends requests and notifications, awaits responses.
///
/// Cheap to clone; all clones share the connection. Incoming messages are not here but in
/// the receiver returned by [`RpcPeer::spawn`].
#[derive(Clone)]
pub struct RpcPeer {
    shared: Arc<Connection>,
}

impl fmt::Debug for RpcPeer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RpcPeer")
            .field("label", &self.shared.label)
            .field("closed", &self.shared.closed_reason())
            .finish_non_exhaustive()
    }
}

impl RpcPeer {
    /// Starts the reader and writer tasks over `reader` and `writer` (typically an agent's
    /// stdout and stdin) and returns the handle plus the channel of incoming notifications
    /// and requests, in the order they arrived, with what `I`'s fast path reads.
    ///
    /// The tasks end when the connection closes (see the module docs). Must be called from
    /// within a Tokio runtime.
    pub fn spawn<I: Inbound>(
        reader: impl AsyncRead + Unpin + Send + 'static,
        writer: impl AsyncWrite + Unpin + Send + 'static,
        config: RpcConfig,
    ) -> (RpcPeer, Inbox<Incoming<I>>) {
        let (out_tx, out_rx) = mpsc::unbounded_channel();
        let (closed_tx, _) = watch::channel(None);
        let shared = Arc::new(Connection {
            label: config.label,
            next_id: AtomicU64::new(config.first_request_id),
            state: Mutex::new(State {
                closed: None,
                waiters: HashMap::new(),
                ledger: Ledger::starting_at(Processed {
                    to: config.start_position,
                    inside_long_line: config.start_inside_long_line,
                }),
                awaited: HashMap::new(),
            }),
            closed_tx,
            out_tx,
            moved_on: tokio::sync::Notify::new(),
        });
        let peer = RpcPeer {
            shared: Arc::clone(&shared),
        };
        for id in config.answers_awaited {
            if let Ok(rx) = peer.register(id) {
                shared.state().awaited.insert(id, rx);
            }
        }
        // mpsc::channel panics on 0; a capacity of 1 is the closest meaningful value.
        let (incoming_tx, incoming_rx) = mpsc::channel(config.incoming_capacity.max(1));
        let lines = LineReader::new(
            super::lazy_buf::LazyBufReader::with_capacity(READ_BUFFER_BYTES, reader),
            config.max_line_bytes,
        )
        .starting_at(config.start_position)
        .inside_a_long_line(config.start_inside_long_line);
        tokio::spawn(write_loop(Arc::clone(&shared), writer, out_rx));
        tokio::spawn(read_loop(Arc::clone(&shared), lines, incoming_tx));
        let inbox = Inbox::new(incoming_rx, Arc::clone(&shared));
        (peer, inbox)
    }

    /// Sends a request and waits for its response.
    ///
    /// Returns the `result`, [`RpcError::Remote`] if the peer answered with an error, or
    /// [`RpcError::Closed`] if the connection is or becomes closed first. There is no
    /// timeout here: wrap the call in `tokio::time::timeout`; dropping the future forgets
    /// the request, and a late answer to it is logged and skipped.
    pub async fn request(&self, method: &str, params: Value) -> Result<Value, RpcError> {
        self.request_as(self.reserve_id(), method, params).await
    }

    /// An id for a request sent later with [`RpcPeer::request_as`] (to
    /// record it before the request goes out).
    pub fn reserve_id(&self) -> u64 {
        self.shared.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// [`RpcPeer::request`] with an id from [`RpcPeer::reserve_id`].
    pub async fn request_as(
        &self,
        id: u64,
        method: &str,
        params: Value,
    ) -> Result<Value, RpcError> {
        self.call(id, method, params).await
    }

    /// Waits for the answer to request `id` that an earlier connection to
    /// the same peer sent (a shim's agent, reattached): as
    /// [`RpcPeer::request`] would, without sending anything. The caller is
    /// registered at once, before the future is first polled (the answer
    /// may be the next line read).
    pub fn answer_to(
        &self,
        id: u64,
    ) -> impl std::future::Future<Output = Result<Value, RpcError>> + Send + 'static {
        let awaited = self.shared.state().awaited.remove(&id);
        let registered = match awaited {
            Some(rx) => Ok(rx),
            None => self.register(id),
        };
        let shared = Arc::clone(&self.shared);
        async move {
            let rx = registered?;
            let _guard = PendingGuard {
                shared: &shared,
                id,
            };
            match rx.await {
                Ok(outcome) => outcome,
                Err(_) => Err(shared.closed_error()),
            }
        }
    }

    /// The way to answer a request the peer made of an earlier connection
    /// (a shim's agent, reattached) and that waits for its answer still.
    pub fn responder_for(&self, id: Value, method: &str) -> Responder {
        Responder::new(id, method.to_owned(), Arc::clone(&self.shared))
    }

    /// A waiter for the answer to request `id`.
    fn register(&self, id: u64) -> Result<oneshot::Receiver<Result<Value, RpcError>>, RpcError> {
        let (tx, rx) = oneshot::channel();
        // Checking `closed` under the same lock that `close` drains the table with means a
        // waiter is either refused here or failed by `close`, never forgotten.
        let mut state = self.shared.state();
        if let Some(reason) = &state.closed {
            return Err(RpcError::Closed(reason.clone()));
        }
        state.waiters.insert(id, tx);
        Ok(rx)
    }

    async fn call(&self, id: u64, method: &str, params: Value) -> Result<Value, RpcError> {
        let rx = self.register(id)?;
        let _guard = PendingGuard {
            shared: &self.shared,
            id,
        };
        self.shared.send(&OutMessage {
            jsonrpc: "2.0",
            id: Some(id),
            method,
            params,
        })?;
        trace!(label = %self.shared.label, id, method, "request sent");
        match rx.await {
            Ok(outcome) => outcome,
            // `close` always sends before dropping a waiter, so this is only a safety net.
            Err(_) => Err(self.shared.closed_error()),
        }
    }

    /// Sends a notification (no response is expected). Succeeds once the message is queued
    /// for writing; fails at once if the connection is closed.
    pub async fn notify(&self, method: &str, params: Value) -> Result<(), RpcError> {
        if let Some(reason) = self.shared.closed_reason() {
            return Err(RpcError::Closed(reason));
        }
        self.shared.send(&OutMessage {
            jsonrpc: "2.0",
            id: None,
            method,
            params,
        })?;
        trace!(label = %self.shared.label, method, "notification sent");
        Ok(())
    }

    /// Whether the connection is closed.
    pub fn is_closed(&self) -> bool {
        self.shared.closed_reason().is_some()
    }

    /// Resolves with the reason once the connection is closed; at once if it already is.
    pub async fn closed(&self) -> String {
        let mut closed_rx = self.shared.closed_tx.subscribe();
        // The sender lives in `Connection`, which `self` keeps alive, so this cannot fail.
        let reason = match closed_rx.wait_for(Option::is_some).await {
            Ok(reason) => reason.clone().unwrap_or_default(),
            Err(_) => "connection closed".to_owned(),
        };
        reason
    }

    /// Closes the connection from our side with `reason`: waiting callers fail, both tasks
    /// stop, and the writer shuts the transport down (an agent sees end of input). Does
    /// nothing if the connection is already closed.
    pub fn close(&self, reason: impl Into<String>) {
        self.shared.close(reason.into());
    }

    /// Where the peer's stream is done with: every line before it was read
    /// and, if it was handed on, taken and done with ([`Inbox::done`], or
    /// its caller has its answer). A replayable stream needs nothing
    /// before it again.
    pub fn processed_to(&self) -> u64 {
        self.shared.state().ledger.processed_to()
    }

    /// [`RpcPeer::processed_to`], and whether it lies inside a line too
    /// long to use (a reader joining there discards up to the next
    /// newline first: [`RpcConfig::start_inside_long_line`]).
    pub fn processed(&self) -> Processed {
        self.shared.state().ledger.processed()
    }

    /// Resolves once the reader has dealt with part of the stream by
    /// itself since this was last awaited (or, if nobody awaited it, since
    /// it last did): a line that was not a message, or too long, or an
    /// answer nobody waits for, was dropped, so [`RpcPeer::processed`]
    /// may have moved on without anything handed on. Cancel-safe.
    pub async fn moved_on(&self) {
        self.shared.moved_on.notified().await
    }

    /// Keeps the answer to request `id` from counting as done with (see
    /// [`RpcPeer::processed_to`]) once its caller has it, until the hold is
    /// dropped: for an answer whose effects the caller records later than
    /// it takes the answer. Take it before the answer can arrive.
    pub fn hold_answer(&self, id: u64) -> AnswerHold {
        self.shared.state().ledger.hold(id);
        AnswerHold {
            shared: Arc::clone(&self.shared),
            id,
        }
    }

    /// How many requests are waiting for a response.
    #[cfg(test)]
    fn pending_len(&self) -> usize {
        self.shared.state().waiters.len()
    }
}

/// See [`RpcPeer::hold_answer`]; dropping it lets the answer go.
pub struct AnswerHold {
    shared: Arc<Connection>,
    id: u64,
}

impl Drop for AnswerHold {
    fn drop(&mut self) {
        self.shared.state().ledger.release(self.id);
    }
}

/// Removes a request's waiter when the `request` future ends, however it ends; this is what
/// cleans up after a caller whose future was dropped.
struct PendingGuard<'a> {
    shared: &'a Connection,
    id: u64,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        let mut state = self.shared.state();
        state.waiters.remove(&self.id);
        state.ledger.answer_taken(self.id);
    }
}
