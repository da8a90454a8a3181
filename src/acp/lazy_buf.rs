//! A buffered reader that holds its buffer only while it has something to
//! read: an agent waiting for its next prompt (most conversations, most of
//! the time) costs no read buffer, and one that streams reads through a
//! buffer as large as a `BufReader`'s would be.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncBufRead, AsyncRead, ReadBuf};
use tokio_util::io::poll_read_buf;

/// Like [`tokio::io::BufReader`], except that the buffer is allocated when
/// a read is about to be made and given back when the reader has nothing
/// buffered and the inner reader has nothing ready. It is never zeroed
/// (reads fill it through [`poll_read_buf`]), so taking it again after a
/// pause costs an allocation, not a pass over its bytes.
#[derive(Debug)]
pub struct LazyBufReader<R> {
    inner: R,
    capacity: usize,
    /// What was read; the unread bytes are `buf[pos..]`.
    buf: Vec<u8>,
    pos: usize,
}

impl<R> LazyBufReader<R> {
    pub fn with_capacity(capacity: usize, inner: R) -> Self {
        LazyBufReader {
            inner,
            capacity: capacity.max(1),
            buf: Vec::new(),
            pos: 0,
        }
    }

    /// Whether it holds a buffer now.
    pub fn holds_buffer(&self) -> bool {
        self.buf.capacity() > 0
    }
}

impl<R: AsyncRead + Unpin> AsyncBufRead for LazyBufReader<R> {
    fn poll_fill_buf(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<&[u8]>> {
        let this = self.get_mut();
        if this.pos >= this.buf.len() {
            this.buf.clear();
            this.pos = 0;
            if this.buf.capacity() == 0 {
                this.buf.reserve_exact(this.capacity);
            }
            match poll_read_buf(Pin::new(&mut this.inner), cx, &mut this.buf) {
                Poll::Pending => {
                    // Nothing to read for now: nothing to hold either.
                    this.buf = Vec::new();
                    return Poll::Pending;
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(_)) => {}
            }
        }
        Poll::Ready(Ok(&this.buf[this.pos..]))
    }

    fn consume(self: Pin<&mut Self>, amt: usize) {
        let this = self.get_mut();
        this.pos = (this.pos + amt).min(this.buf.len());
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for LazyBufReader<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let available = ready!(self.as_mut().poll_fill_buf(cx))?;
        let n = available.len().min(out.remaining());
        out.put_slice(&available[..n]);
        self.consume(n);
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn it_holds_a_buffer_only_while_there_is_something_to_read() {
        let (mut writer, reader) = tokio::io::duplex(1024);
        let mut reader = LazyBufReader::with_capacity(8, reader);
        assert!(!reader.holds_buffer());
        // Nothing written: waiting holds nothing.
        assert!(reader.fill_buf().now_or_never().is_none());
        assert!(!reader.holds_buffer());

        writer.write_all(b"hello, world").await.unwrap();
        // At most its capacity at a time, held until it is read.
        assert_eq!(reader.fill_buf().await.unwrap(), b"hello, w");
        reader.consume(3);
        assert!(reader.holds_buffer());
        assert_eq!(reader.fill_buf().await.unwrap(), b"lo, w");
        reader.consume(5);
        assert_eq!(reader.fill_buf().await.unwrap(), b"orld");
        reader.consume(4);
        // All read and nothing more ready: the buffer is given back.
        assert!(reader.fill_buf().now_or_never().is_none());
        assert!(!reader.holds_buffer());

        // And taken again for what comes next; the end reads as empty.
        writer.write_all(b"line one\nline two\n").await.unwrap();
        drop(writer);
        let mut lines = Vec::new();
        let mut line = String::new();
        while reader.read_line(&mut line).await.unwrap() > 0 {
            lines.push(std::mem::take(&mut line));
        }
        assert_eq!(lines, ["line one\n", "line two\n"]);
        assert!(reader.fill_buf().await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn it_reads_a_long_stream_whole_in_small_or_large_reads() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        for (capacity, read_size) in [(7, 3), (64 * 1024, 5000), (10, 1 << 20)] {
            let (mut writer, reader) = tokio::io::duplex(4096);
            let mut reader = LazyBufReader::with_capacity(capacity, reader);
            let sent = data.clone();
            let writing = tokio::spawn(async move {
                writer.write_all(&sent).await.unwrap();
            });
            let mut got = Vec::new();
            let mut chunk = vec![0; read_size];
            loop {
                let n = reader.read(&mut chunk).await.unwrap();
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&chunk[..n]);
            }
            writing.await.unwrap();
            assert_eq!(got, data, "capacity {capacity}, reads of {read_size}");
        }
    }
}
