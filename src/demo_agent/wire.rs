//! The demo agent's JSON-RPC plumbing: one writer owns stdout, and the
//! agent's own requests to the client wait here for their answers.

use std::collections::HashMap;
use std::convert::Infallible;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

/// JSON-RPC error code: the method does not exist.
pub(super) const METHOD_NOT_FOUND: i64 = -32601;
/// JSON-RPC error code: the params are malformed or refer to something unknown.
pub(super) const INVALID_PARAMS: i64 = -32602;
/// JSON-RPC error code: the agent failed to handle the request.
pub(super) const INTERNAL_ERROR: i64 = -32603;

/// One line for the stdout writer.
pub(super) enum Out {
    /// A line to write (without its newline).
    Line(String),
    /// Flush and exit the process with this code; queued before it means written before it.
    Exit(i32),
}

/// Owns stdout: the single place that writes to it, so lines never interleave. Runs on a
/// blocking thread. Lines queued together are written together: stdout is flushed whenever
/// the queue runs empty, so nothing waits in the buffer while the agent waits for an answer.
pub(super) fn write_stdout(mut lines: mpsc::Receiver<Out>) {
    let mut stdout = std::io::BufWriter::with_capacity(64 * 1024, std::io::stdout().lock());
    let fail = |err: std::io::Error| -> ! {
        log!("cannot write to stdout ({err}), exiting");
        std::process::exit(1);
    };
    while let Some(mut out) = lines.blocking_recv() {
        loop {
            match out {
                Out::Line(line) => {
                    if let Err(err) = writeln!(stdout, "{line}") {
                        fail(err);
                    }
                }
                Out::Exit(code) => {
                    // Nothing useful to do if this flush fails: we are exiting anyway.
                    let _ = stdout.flush();
                    std::process::exit(code);
                }
            }
            match lines.try_recv() {
                Ok(next) => out = next,
                Err(_) => break,
            }
        }
        if let Err(err) = stdout.flush() {
            fail(err);
        }
    }
}

/// The answer to a request the agent sent: its `result`, or its `error` object.
pub(super) type Reply = Result<Value, Value>;

/// A JSON-RPC error to answer a request with.
#[derive(Debug)]
pub(super) struct RpcError {
    pub(super) code: i64,
    pub(super) message: String,
}

impl RpcError {
    pub(super) fn new(code: i64, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

/// The agent's end of the connection: what it writes, and the requests it
/// sent that await answers.
pub(super) struct Wire {
    /// Queue to the stdout writer.
    outbox: mpsc::Sender<Out>,
    /// Ids of the agent's own requests; the first is 0 on purpose, clients must accept it.
    next_request_id: AtomicU64,
    /// Requests the agent sent and awaits answers for. `None` once stdin has closed, since no
    /// answer can come any more: dropping the senders wakes every waiter.
    pending: Mutex<Option<HashMap<u64, oneshot::Sender<Reply>>>>,
    /// Each request that awaits its answer, as sent (to ask it again on a
    /// resumed session's new connection).
    sent: Mutex<HashMap<u64, Value>>,
}

impl Wire {
    pub(super) fn new(outbox: mpsc::Sender<Out>) -> Self {
        Self {
            outbox,
            next_request_id: AtomicU64::new(0),
            pending: Mutex::new(Some(HashMap::new())),
            sent: Mutex::new(HashMap::new()),
        }
    }

    /// No answer can come any more (stdin closed): every waiter wakes.
    pub(super) fn close(&self) {
        self.pending.lock().unwrap().take();
    }

    /// Hands an answer to the task waiting for it.
    pub(super) fn route_reply(&self, id: &Value, reply: Reply) {
        if let Some(id) = id.as_u64() {
            self.sent.lock().unwrap().remove(&id);
        }
        let waiter = id.as_u64().and_then(|id| {
            self.pending
                .lock()
                .unwrap()
                .as_mut()
                .and_then(|pending| pending.remove(&id))
        });
        match waiter {
            // The waiter may have given up in the meantime; the answer is then moot.
            Some(waiter) => drop(waiter.send(reply)),
            None => log!("ignoring an answer to unknown or abandoned request {id}"),
        }
    }

    /// Sends a request to the client; the receiver yields its answer.
    pub(super) async fn request(
        &self,
        method: &str,
        params: Value,
    ) -> (u64, oneshot::Receiver<Reply>) {
        let id = self.next_id();
        let (waiter, answer) = oneshot::channel();
        // Registered before sending, so even an instant answer finds its waiter. Once stdin is
        // closed the sender is dropped here and the receiver reports that at once.
        if let Some(pending) = self.pending.lock().unwrap().as_mut() {
            pending.insert(id, waiter);
        }
        let message = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.sent.lock().unwrap().insert(id, message.clone());
        self.send(message).await;
        (id, answer)
    }

    /// Sends again, on their ids, the requests of `session_id` that still
    /// await their answers, oldest first.
    pub(super) async fn ask_again(&self, session_id: &str) {
        let mut again: Vec<(u64, Value)> = {
            let sent = self.sent.lock().unwrap();
            sent.iter()
                .filter(|(_, m)| m["params"]["sessionId"].as_str() == Some(session_id))
                .map(|(id, m)| (*id, m.clone()))
                .collect()
        };
        again.sort_by_key(|(id, _)| *id);
        for (id, message) in again {
            log!("asking again request {id}");
            self.send(message).await;
        }
    }

    /// An id for a request of the agent's.
    pub(super) fn next_id(&self) -> u64 {
        self.next_request_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Stops waiting for the answer to a request.
    pub(super) fn forget(&self, id: u64) {
        self.sent.lock().unwrap().remove(&id);
        if let Some(pending) = self.pending.lock().unwrap().as_mut() {
            pending.remove(&id);
        }
    }

    /// Queues a protocol message for stdout.
    pub(super) async fn send(&self, message: Value) {
        self.send_raw(message.to_string()).await;
    }

    /// Queues a line for stdout as is; also used to emit deliberate garbage.
    pub(super) async fn send_raw(&self, line: String) {
        // Fails only if the writer is gone, i.e. the process is exiting anyway.
        let _ = self.outbox.send(Out::Line(line)).await;
    }

    /// Exits with `code` once everything queued for stdout is written.
    pub(super) async fn exit(&self, code: i32) -> Infallible {
        let _ = self.outbox.send(Out::Exit(code)).await;
        std::future::pending().await
    }
}

/// A JSON-RPC response to request `id`.
pub(super) fn response(id: Value, reply: Result<Value, RpcError>) -> Value {
    match reply {
        Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
        Err(err) => json!({
            "jsonrpc": "2.0",
            "id": id,
            "error": {"code": err.code, "message": err.message},
        }),
    }
}

/// A JSON-RPC notification.
pub(super) fn notification(method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "method": method, "params": params})
}
