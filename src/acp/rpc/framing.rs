//! Lines on the wire: the writer task that writes the queued lines (batched, one flush per
//! batch), the shapes of the messages we send, and the [`LineReader`] that cuts the peer's
//! byte stream into lines of bounded length.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use super::shared::Connection;

/// Most messages written before one flush, so a steady stream still gets flushed regularly.
const MAX_MESSAGES_PER_FLUSH: usize = 64;
/// How long the writer waits for the transport to shut down once the connection is closed;
/// a peer that stopped reading must not keep the writer task alive.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// A request (with `id`) or a notification (without).
#[derive(Serialize)]
pub(super) struct OutMessage<'a> {
    pub(super) jsonrpc: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) id: Option<u64>,
    pub(super) method: &'a str,
    /// JSON-RPC lets `params` be left out, not be `null`.
    #[serde(skip_serializing_if = "Value::is_null")]
    pub(super) params: Value,
}

#[derive(Serialize)]
pub(super) struct OutResponse<'a> {
    pub(super) jsonrpc: &'static str,
    pub(super) id: &'a Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) result: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) error: Option<ErrorObject>,
}

#[derive(Serialize)]
pub(super) struct ErrorObject {
    pub(super) code: i64,
    pub(super) message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) data: Option<Value>,
}

/// Writes queued messages until the connection closes or a write fails.
pub(super) async fn write_loop<W>(
    shared: Arc<Connection>,
    mut writer: W,
    mut out_rx: mpsc::UnboundedReceiver<Vec<u8>>,
) where
    W: AsyncWrite + Unpin,
{
    let mut closed_rx = shared.closed_tx.subscribe();
    loop {
        let first = tokio::select! {
            biased;
            _ = closed_rx.wait_for(Option::is_some) => break,
            message = out_rx.recv() => match message {
                Some(message) => message,
                // Cannot happen while `shared` (which holds the sender) is alive; harmless.
                None => break,
            },
        };
        // Selecting on `closed` keeps a peer that stopped reading from pinning this task.
        let written = tokio::select! {
            biased;
            _ = closed_rx.wait_for(Option::is_some) => break,
            written = write_batch(&mut writer, first, &mut out_rx) => written,
        };
        if let Err(err) = written {
            shared.close(format!("write failed: {err}"));
            return;
        }
    }
    // Tell the peer there is no more input; bounded, as a stuck transport must not keep us.
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, writer.shutdown()).await;
}

/// Writes `first` and whatever else is already queued, then flushes once.
async fn write_batch<W>(
    writer: &mut W,
    first: Vec<u8>,
    out_rx: &mut mpsc::UnboundedReceiver<Vec<u8>>,
) -> io::Result<()>
where
    W: AsyncWrite + Unpin,
{
    writer.write_all(&first).await?;
    for _ in 1..MAX_MESSAGES_PER_FLUSH {
        match out_rx.try_recv() {
            Ok(message) => writer.write_all(&message).await?,
            Err(_) => break,
        }
    }
    writer.flush().await
}

/// What [`LineReader::next_line`] found.
#[derive(Debug, PartialEq)]
pub(super) enum Line<T> {
    /// What the parser made of a line (given without its `\n`).
    Complete(T),
    /// A line longer than the limit, already discarded; `len` is its length.
    TooLong { len: usize },
    /// Part of a line longer than the limit was discarded and its end is
    /// not in sight yet: everything before [`LineReader::span`]'s end is
    /// dealt with (nothing of that line will be used), so a stream that
    /// can be replayed need not keep it.
    Skipping,
}

/// Most bytes the line buffer keeps between lines: what a long line needed
/// is given back.
const RETAINED_LINE_BYTES: usize = 64 * 1024;

/// Splits a byte stream into `\n`-terminated lines of bounded length.
///
/// Hand-written rather than a `tokio_util` codec because `FramedRead` stops after a decode
/// error, and an over-long line must only cost that line. A line that lies whole in the
/// `BufReader`'s buffer (the usual case) is parsed there, never copied; one that spans
/// refills is assembled in `buf` first. Bytes of an over-long line are consumed and dropped
/// as they arrive, so at most `max` bytes are ever held (plus the `BufReader`'s fixed
/// buffer). Cancel-safe: all state lives in `self`, and a line is parsed and consumed with
/// no await in between.
pub(super) struct LineReader<R> {
    inner: R,
    /// The longest line kept, in bytes.
    pub(super) max: usize,
    buf: Vec<u8>,
    /// `Some(bytes seen so far)` while skipping the rest of an over-long line.
    discarding: Option<usize>,
    /// Where the next byte lies in the peer's stream (counted from where the
    /// stream was joined, see [`LineReader::starting_at`]).
    position: u64,
    /// Where the line read last (or being read) began.
    line_start: u64,
    /// The most bytes `buf` ever held, to prove the bound in tests.
    #[cfg(test)]
    pub(super) peak: usize,
}

impl<R: AsyncBufRead + Unpin> LineReader<R> {
    pub(super) fn new(inner: R, max: usize) -> Self {
        Self {
            inner,
            max,
            buf: Vec::new(),
            discarding: None,
            position: 0,
            line_start: 0,
            #[cfg(test)]
            peak: 0,
        }
    }

    /// Counts positions from `position` (a stream joined part way through).
    pub(super) fn starting_at(mut self, position: u64) -> Self {
        self.position = position;
        self.line_start = position;
        self
    }

    /// The stream is joined inside a line already found too long (see
    /// [`Line::Skipping`]): the rest of it is discarded too.
    pub(super) fn inside_a_long_line(mut self, inside: bool) -> Self {
        if inside {
            self.discarding = Some(0);
        }
        self
    }

    /// Where the line [`LineReader::next_line`] returned last began and
    /// ended (after its `\n`) in the peer's stream.
    pub(super) fn span(&self) -> (u64, u64) {
        (self.line_start, self.position)
    }

    fn consume(&mut self, n: usize) {
        self.inner.consume(n);
        self.position += n as u64;
    }

    /// The next line as `parse` reads it, or `None` at end of stream. An unterminated last
    /// line still counts.
    pub(super) async fn next_line<T>(
        &mut self,
        mut parse: impl FnMut(&[u8]) -> T,
    ) -> io::Result<Option<Line<T>>> {
        loop {
            if self.buf.is_empty() && self.discarding.is_none() {
                self.line_start = self.position;
            }
            let available = self.inner.fill_buf().await?;
            if available.is_empty() {
                if let Some(len) = self.discarding.take() {
                    return Ok(Some(Line::TooLong { len }));
                }
                if self.buf.is_empty() {
                    return Ok(None);
                }
                return Ok(Some(Line::Complete(self.take_buffered(&mut parse))));
            }
            let newline = memchr::memchr(b'\n', available);
            if let Some(end) = newline {
                if self.buf.is_empty() && self.discarding.is_none() && end <= self.max {
                    let parsed = parse(&available[..end]);
                    self.consume(end + 1);
                    return Ok(Some(Line::Complete(parsed)));
                }
            }
            let chunk = &available[..newline.unwrap_or(available.len())];
            match &mut self.discarding {
                Some(seen) => *seen += chunk.len(),
                None if self.buf.len() + chunk.len() > self.max => {
                    self.discarding = Some(self.buf.len() + chunk.len());
                    // Give the memory back now; the line may go on for a long time.
                    self.buf = Vec::new();
                }
                None => {
                    self.buf.extend_from_slice(chunk);
                    #[cfg(test)]
                    {
                        self.peak = self.peak.max(self.buf.len());
                    }
                }
            }
            let consumed = chunk.len() + usize::from(newline.is_some());
            self.consume(consumed);
            if newline.is_some() {
                return Ok(Some(match self.discarding.take() {
                    Some(len) => Line::TooLong { len },
                    None => Line::Complete(self.take_buffered(&mut parse)),
                }));
            }
            if self.discarding.is_some() {
                // Said at every refill: what went by is done with now,
                // however long the line goes on.
                return Ok(Some(Line::Skipping));
            }
        }
    }

    /// Parses the assembled line and empties the buffer (giving a long
    /// line's memory back).
    fn take_buffered<T>(&mut self, parse: impl FnOnce(&[u8]) -> T) -> T {
        let parsed = parse(&self.buf);
        if self.buf.capacity() > RETAINED_LINE_BYTES {
            self.buf = Vec::new();
        } else {
            self.buf.clear();
        }
        parsed
    }
}
