//! What the peer sends us that is not a response: an [`Incoming`] message (a notification, a
//! request, or what the layer above's fast path read, the [`Inbound`] hook), and the
//! [`Responder`] that answers each request exactly once.

use std::fmt;
use std::sync::Arc;

use serde_json::Value;
use tracing::{debug, warn};

use super::framing::{ErrorObject, OutResponse};
use super::shared::{Connection, INTERNAL_ERROR, METHOD_NOT_FOUND};

/// The fast path of the layer above for its commonest lines: the reader routes responses
/// to their callers itself and hands everything else on as an [`Incoming`], in arrival
/// order, the lines this reads as [`Incoming::Fast`]. This is where the protocol on top
/// (ACP) plugs in; the connection itself knows no method names.
pub trait Inbound: Send + Sized + 'static {
    /// Tried on each line (without its `\r\n`) before any JSON tree is built, and
    /// borrowing it where it lies in the read buffer. `None` sends the line down the
    /// general path: this decides only which way is faster, never what is accepted.
    fn read_fast(line: &[u8]) -> Option<Self>;

    /// The method of the message it read, for logs.
    fn method(&self) -> &str;
}

/// A message the peer sent us that is not a response to one of our requests.
#[derive(Debug)]
pub enum Incoming<F> {
    /// A message with a `method` and no `id`; it gets no answer.
    Notification {
        /// The method name.
        method: String,
        /// The `params` as sent, or `Value::Null` if there were none.
        params: Value,
    },
    /// A message with a `method` and an `id`; it must be answered through its
    /// [`Responder`].
    Request(IncomingRequest),
    /// A line the fast path read ([`Inbound::read_fast`]).
    Fast(F),
}

impl<F: Inbound> Incoming<F> {
    /// The message's method, for logs.
    pub fn method(&self) -> &str {
        match self {
            Incoming::Notification { method, .. } => method,
            Incoming::Request(request) => &request.method,
            Incoming::Fast(fast) => fast.method(),
        }
    }
}

/// A request the peer made of us. Answer it through `responder`, now or much later.
#[derive(Debug)]
pub struct IncomingRequest {
    /// The peer's id for this request, a number or a string, exactly as sent.
    pub id: Value,
    /// The method name.
    pub method: String,
    /// The `params` as sent, or `Value::Null` if there were none.
    pub params: Value,
    /// Sends the one answer this request gets.
    pub responder: Responder,
}

impl IncomingRequest {
    /// Answers `-32601 Method not found: <method>`, for methods we do not implement.
    pub fn reject_unknown_method(self) {
        debug!(
            label = %self.responder.shared.label,
            id = %self.id,
            method = %self.method,
            "rejecting unknown method"
        );
        let message = format!("Method not found: {}", self.method);
        self.responder
            .respond_error(METHOD_NOT_FOUND, message, None);
    }
}

/// Answers one incoming request, exactly once.
///
/// Answering is fire-and-forget: if the connection is already closed the answer is dropped
/// and only logged, since there is nobody left to tell. Dropping a `Responder` without
/// answering answers `-32603 request dropped without an answer`, so the peer is never left
/// waiting for a request we forgot.
pub struct Responder {
    id: Value,
    method: String,
    shared: Arc<Connection>,
    answered: bool,
}

impl Responder {
    /// The responder for request `id` of `method`, not answered yet.
    pub(super) fn new(id: Value, method: String, shared: Arc<Connection>) -> Self {
        Self {
            id,
            method,
            shared,
            answered: false,
        }
    }

    /// The peer's id for the request, exactly as sent.
    pub fn id(&self) -> &Value {
        &self.id
    }

    /// Answers with a successful `result`.
    pub fn respond(mut self, result: Value) {
        self.answer(Ok(result));
    }

    /// Answers with an error object.
    pub fn respond_error(mut self, code: i64, message: impl Into<String>, data: Option<Value>) {
        self.answer(Err(ErrorObject {
            code,
            message: message.into(),
            data,
        }));
    }

    fn answer(&mut self, outcome: Result<Value, ErrorObject>) {
        self.answered = true;
        let (result, error) = match outcome {
            Ok(result) => (Some(result), None),
            Err(error) => (None, Some(error)),
        };
        let response = OutResponse {
            jsonrpc: "2.0",
            id: &self.id,
            result,
            error,
        };
        if let Err(err) = self.shared.send(&response) {
            debug!(
                label = %self.shared.label,
                id = %self.id,
                method = %self.method,
                %err,
                "answer not sent"
            );
        }
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        // Once the connection is closed nobody is waiting, so this is not worth a warning.
        if self.shared.closed_reason().is_none() {
            warn!(
                label = %self.shared.label,
                id = %self.id,
                method = %self.method,
                "incoming request dropped without an answer; answering -32603"
            );
        }
        self.answer(Err(ErrorObject {
            code: INTERNAL_ERROR,
            message: "request dropped without an answer".to_owned(),
            data: None,
        }));
    }
}

impl fmt::Debug for Responder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Responder")
            .field("id", &self.id)
            .field("method", &self.method)
            .field("answered", &self.answered)
            .finish_non_exhaustive()
    }
}
