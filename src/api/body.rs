//! Requests answered before their body was read (a 401, a 403, a 404, a
//! 413, an endpoint that takes no body): HTTP/1.1 carries
//! the next request on the same connection only after this one's body, so
//! an unread body must be read and dropped, or the connection must end, and
//! then the client must be told (`connection: close`). Otherwise the server
//! closes it without a word and a keep-alive client's next request meets
//! "server disconnected".
//!
//! [`drain_unread_body`] does this once, as a layer around every route: a
//! small rest with a known length (at most [`DRAIN_MAX_BYTES`]) is read and
//! dropped before the answer goes out, so the connection stays usable;
//! anything else gets `connection: close`.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::Request;
use axum::http::{header, HeaderValue, Version};
use axum::middleware::Next;
use axum::response::Response;

/// The largest unread rest of a body that is read and dropped to keep the
/// connection; a larger one ends it.
pub const DRAIN_MAX_BYTES: u64 = 64 * 1024;
/// How long reading that rest may take (a client that sent its headers but
/// takes its time with the body) before the connection ends instead.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// What became of a request's body.
enum Fate {
    /// The handler still holds it.
    InHandler,
    /// It was read to its end.
    Read,
    /// The handler let it go before its end: the rest.
    Left(Body),
}

/// A request body that reports its [`Fate`].
struct Watched {
    inner: Option<Body>,
    fate: Arc<Mutex<Fate>>,
}

impl HttpBody for Watched {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        let Some(inner) = self.inner.as_mut() else {
            return Poll::Ready(None);
        };
        let polled = Pin::new(inner).poll_frame(cx);
        if let Poll::Ready(None) = polled {
            *self.fate.lock().unwrap() = Fate::Read;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(HttpBody::is_end_stream)
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| http_body::SizeHint::with_exact(0), HttpBody::size_hint)
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        let mut fate = self.fate.lock().unwrap();
        if matches!(*fate, Fate::InHandler) {
            *fate = match self.inner.take() {
                Some(rest) if !rest.is_end_stream() => Fate::Left(rest),
                _ => Fate::Read,
            };
        }
    }
}

/// The layer: see the module docs.
pub async fn drain_unread_body(request: Request, next: Next) -> Response {
    let http1 = matches!(request.version(), Version::HTTP_10 | Version::HTTP_11);
    if !http1 || request.body().is_end_stream() {
        return next.run(request).await;
    }
    let length = request.body().size_hint().exact();
    // A client waiting for "100 Continue" has not sent its body: asking for
    // it just to drop it makes no sense.
    let expects_continue = request
        .headers()
        .get(header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    let fate = Arc::new(Mutex::new(Fate::InHandler));
    let watched = fate.clone();
    let request = request.map(move |body| {
        Body::new(Watched {
            inner: Some(body),
            fate: watched,
        })
    });
    let mut response = next.run(request).await;
    let fate = std::mem::replace(&mut *fate.lock().unwrap(), Fate::Read);
    let keep = match fate {
        Fate::Read => true,
        Fate::Left(rest) if !expects_continue && length.is_some_and(|n| n <= DRAIN_MAX_BYTES) => {
            drained(rest).await
        }
        // Too large, of unknown length, not sent yet, or still held by
        // whatever the handler gave it to.
        Fate::Left(_) | Fate::InHandler => false,
    };
    if !keep {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// Reads `rest` to its end and drops it; whether it ended in time and
/// within [`DRAIN_MAX_BYTES`].
async fn drained(mut rest: Body) -> bool {
    let read = async {
        let mut bytes = 0u64;
        while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut rest).poll_frame(cx)).await
        {
            let Ok(frame) = frame else { return false };
            if let Some(data) = frame.data_ref() {
                bytes += data.len() as u64;
                if bytes > DRAIN_MAX_BYTES {
                    return false;
                }
            }
        }
        true
    };
    tokio::time::timeout(DRAIN_TIMEOUT, read)
        .await
        .unwrap_or(false)
}
