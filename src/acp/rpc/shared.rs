//! What one connection's handle, tasks and responders share: the table of callers waiting
//! for an answer, the close reason, and the writer's queue; and the errors a request ends
//! with.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::mem;
use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, MutexGuard, PoisonError};

use serde::Serialize;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot, watch, Notify};
use tracing::debug;

/// JSON-RPC error code: the method does not exist or is not available.
pub const METHOD_NOT_FOUND: i64 = -32601;

/// JSON-RPC error code: invalid method parameters.
pub const INVALID_PARAMS: i64 = -32602;

/// JSON-RPC error code: internal error.
pub const INTERNAL_ERROR: i64 = -32603;

/// Why a request did not produce a result.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RpcError {
    /// The peer answered with a JSON-RPC error object.
    #[error("remote error {code}: {message}")]
    Remote {
        /// The error's `code`.
        code: i64,
        /// The error's `message`.
        message: String,
        /// The error's `data`, if it had any.
        data: Option<Value>,
    },
    /// The connection is closed (peer exited, end of stream, write failed, or
    /// [`RpcPeer::close`](super::RpcPeer::close)); the string says why.
    #[error("connection closed: {0}")]
    Closed(String),
}

/// What the handle, the tasks and every [`Responder`](super::Responder) share.
pub(super) struct Connection {
    pub(super) label: String,
    pub(super) next_id: AtomicU64,
    pub(super) state: Mutex<State>,
    /// Carries the close reason to whoever awaits it (the tasks,
    /// [`RpcPeer::closed`](super::RpcPeer::closed)).
    pub(super) closed_tx: watch::Sender<Option<String>>,
    /// Serialized messages, each ending in `\n`, for the writer task.
    pub(super) out_tx: mpsc::UnboundedSender<Vec<u8>>,
    /// Told when the reader has dealt with part of the stream by itself
    /// (see [`super::RpcPeer::moved_on`]).
    pub(super) moved_on: Notify,
}

pub(super) struct State {
    pub(super) closed: Option<String>,
    pub(super) waiters: HashMap<u64, oneshot::Sender<Result<Value, RpcError>>>,
    pub(super) ledger: Ledger,
    /// Callers registered at the start for answers to an earlier
    /// connection's requests, until someone waits for them.
    pub(super) awaited: HashMap<u64, oneshot::Receiver<Result<Value, RpcError>>>,
}

/// How far the peer's byte stream has been dealt with: which of its lines
/// were read, and which of those were handed on (to the incoming channel, or
/// as an answer to a caller) and are not done with yet. Everything before
/// [`Ledger::processed_to`] is done with, so a stream that can be replayed
/// (a shim's) needs nothing before it again.
#[derive(Debug, Default)]
pub(super) struct Ledger {
    read_to: u64,
    /// Where each line handed on and not yet done with begins.
    open: BTreeSet<u64>,
    /// Answers handed to their callers, by request id: where each begins.
    answers: HashMap<u64, u64>,
    /// Requests whose answers stay open after their callers have them,
    /// until released (see [`super::AnswerHold`]).
    held: HashSet<u64>,
    /// `read_to` lies inside a line too long to use, whose rest is being
    /// discarded.
    inside_long_line: bool,
}

/// Where a stream is done with: see [`super::RpcPeer::processed`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Processed {
    /// Every byte before this is done with.
    pub to: u64,
    /// `to` lies inside a line too long to use: a reader starting there
    /// discards up to the next newline first.
    pub inside_long_line: bool,
}

impl Ledger {
    pub(super) fn starting_at(at: Processed) -> Ledger {
        Ledger {
            read_to: at.to,
            inside_long_line: at.inside_long_line,
            ..Ledger::default()
        }
    }

    /// A line that needs nothing more was read up to `end`.
    pub(super) fn read(&mut self, end: u64) {
        self.read_to = end;
        self.inside_long_line = false;
    }

    /// A line too long to use was discarded up to `to`, and goes on.
    pub(super) fn skipped(&mut self, to: u64) {
        self.read_to = to;
        self.inside_long_line = true;
    }

    /// The line from `start` to `end` was handed on.
    pub(super) fn hand_on(&mut self, start: u64, end: u64) {
        self.open.insert(start);
        self.read(end);
    }

    /// The line handed on from `start` is done with.
    pub(super) fn done(&mut self, start: u64) {
        self.open.remove(&start);
    }

    /// The answer to request `id`, from `start` to `end`, went to its caller.
    pub(super) fn answer_handed_on(&mut self, id: u64, start: u64, end: u64) {
        self.hand_on(start, end);
        self.answers.insert(id, start);
    }

    /// The caller of request `id` has its answer (or gave up): the answer
    /// is done with, unless it is held.
    pub(super) fn answer_taken(&mut self, id: u64) {
        if !self.held.contains(&id) {
            self.let_go(id);
        }
    }

    /// The answer to request `id` stays open once taken, until released.
    pub(super) fn hold(&mut self, id: u64) {
        self.held.insert(id);
    }

    /// The answer to request `id` needs holding no more: once taken (or
    /// if it already was), it is done with.
    pub(super) fn release(&mut self, id: u64) {
        self.held.remove(&id);
        self.let_go(id);
    }

    fn let_go(&mut self, id: u64) {
        if let Some(start) = self.answers.remove(&id) {
            self.open.remove(&start);
        }
    }

    /// Everything before this position is done with.
    pub(super) fn processed_to(&self) -> u64 {
        self.processed().to
    }

    /// Where the stream is done with, and whether that is inside a line
    /// being discarded.
    pub(super) fn processed(&self) -> Processed {
        match self.open.first() {
            Some(&to) => Processed {
                to,
                inside_long_line: false,
            },
            None => Processed {
                to: self.read_to,
                inside_long_line: self.inside_long_line,
            },
        }
    }
}

impl Connection {
    pub(super) fn state(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding the lock, but if something ever does, the table is
        // still consistent, so keep going rather than poison every later call.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn closed_reason(&self) -> Option<String> {
        self.state().closed.clone()
    }

    pub(super) fn closed_error(&self) -> RpcError {
        RpcError::Closed(
            self.closed_reason()
                .unwrap_or_else(|| "connection closed".to_owned()),
        )
    }

    /// Marks the connection closed and fails every waiting caller. The first reason wins.
    pub(super) fn close(&self, reason: String) {
        let waiters = {
            let mut state = self.state();
            if state.closed.is_some() {
                return;
            }
            state.closed = Some(reason.clone());
            self.closed_tx.send_replace(Some(reason.clone()));
            mem::take(&mut state.waiters)
        };
        debug!(
            label = %self.label,
            %reason,
            failed_requests = waiters.len(),
            "rpc connection closed"
        );
        for waiter in waiters.into_values() {
            // The caller may have given up in the meantime; nothing to do then.
            let _ = waiter.send(Err(RpcError::Closed(reason.clone())));
        }
    }

    /// Queues one outgoing message for the writer, serialized as a line.
    pub(super) fn send<T: Serialize>(&self, message: &T) -> Result<(), RpcError> {
        // Our message types hold only strings, numbers and `Value`s, whose maps have string
        // keys, so serialization has no way to fail.
        let mut bytes = serde_json::to_vec(message).expect("JSON-RPC messages always serialize");
        bytes.push(b'\n');
        self.out_tx.send(bytes).map_err(|_| self.closed_error())
    }
}
