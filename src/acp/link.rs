//! The gateway's end of a shim's socket (see [`crate::shim`]): the agent's
//! output and input as the two byte streams [`super::rpc`] speaks over, so
//! nothing above this knows whether an agent's pipes are its own or a
//! shim's, and a handle to acknowledge output, stop the agent and learn how
//! it ended.

use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, DuplexStream, ReadBuf};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, watch};

use super::lazy_buf::LazyBufReader;
use crate::shim::protocol::{self, Exit, Hello, ToGateway, ToShim, OLDEST_VERSION, VERSION};

/// Bytes in flight from the JSON-RPC layer to the link (the agent's input).
const PIPE_BYTES: usize = 64 * 1024;
/// Frames of the agent's output in flight from the link to the JSON-RPC
/// layer (each at most [`protocol::MAX_OUTPUT_CHUNK`]).
const OUTPUT_FRAMES: usize = 1;
/// Most bytes of the agent's input sent to the shim in one frame.
const INPUT_CHUNK: usize = 64 * 1024;
/// How long connecting and the shim's hello may take.
const HELLO_WITHIN: Duration = Duration::from_secs(10);

/// How the agent under a shim ended, as far as this link can tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// The agent ended; all its output has come through.
    Exited(Exit),
    /// The shim went away or refused us before saying so (the agent may
    /// still run: a later link may tell).
    Lost(String),
}

/// An attached shim.
pub struct ShimLink {
    /// What the shim said when we connected.
    pub hello: Hello,
    /// The agent's output, from where we attached.
    pub output: Output,
    /// The agent's input.
    pub input: DuplexStream,
    pub control: ShimControl,
}

/// The agent's output as one byte stream, read from the frames the shim
/// sent it in. A frame is given back as soon as it is read, so nothing of a
/// burst stays with the conversation after it: a pipe's buffer would, and
/// so would `tokio_util`'s `StreamReader`, which keeps the last frame until
/// the next one comes.
#[derive(Debug)]
pub struct Output {
    frames: mpsc::Receiver<Vec<u8>>,
    /// The frame being read, `read` bytes of it already.
    frame: Vec<u8>,
    read: usize,
}

impl AsyncRead for Output {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        while this.read >= this.frame.len() {
            match ready!(this.frames.poll_recv(cx)) {
                Some(frame) => (this.frame, this.read) = (frame, 0),
                // The end of the agent's output: read as end of file.
                None => return Poll::Ready(Ok(())),
            }
        }
        let n = (this.frame.len() - this.read).min(buf.remaining());
        buf.put_slice(&this.frame[this.read..this.read + n]);
        this.read += n;
        if this.read == this.frame.len() {
            (this.frame, this.read) = (Vec::new(), 0);
        }
        Poll::Ready(Ok(()))
    }
}

/// Acknowledging, stopping and watching the agent under a shim.
#[derive(Clone)]
pub struct ShimControl {
    commands: mpsc::UnboundedSender<ToShim>,
    ending: watch::Receiver<Option<Ending>>,
    /// The offset after the last byte handed to `output`.
    delivered: Arc<AtomicU64>,
}

impl ShimControl {
    /// Lets the shim forget the output before `to` (it is committed).
    pub fn acknowledge(&self, to: u64) {
        let _ = self.commands.send(ToShim::Ack { to });
    }

    /// Asks the shim to stop the agent: SIGTERM, SIGKILL after `grace`.
    pub fn stop(&self, grace: Duration) {
        let grace_ms = u32::try_from(grace.as_millis()).unwrap_or(u32::MAX);
        let _ = self.commands.send(ToShim::Stop { grace_ms });
    }

    /// The offset after the last byte of output handed on so far.
    pub fn delivered(&self) -> u64 {
        self.delivered.load(Ordering::Acquire)
    }

    /// Resolves once the agent has ended or the link is lost.
    pub async fn ended(&self) -> Ending {
        let mut ending = self.ending.clone();
        let seen = ending.wait_for(Option::is_some).await;
        match seen {
            Ok(ending) => ending.clone().expect("waited for"),
            Err(_) => Ending::Lost("the link's tasks ended".into()),
        }
    }
}

/// Connects to the shim at `socket` and attaches at the offset `from`
/// picks from its hello (e.g. [`Hello::held_from`]: all it still holds).
/// Stderr chunks go to `stderr` as they come (dropped when it is full).
pub async fn attach(
    socket: &Path,
    from: impl FnOnce(&Hello) -> u64,
    stderr: mpsc::Sender<Vec<u8>>,
) -> io::Result<ShimLink> {
    let connecting = async {
        let stream = UnixStream::connect(socket).await?;
        let (mut read, write) = stream.into_split();
        match protocol::read_from_shim(&mut read).await? {
            Some(ToGateway::Hello(hello))
                if (OLDEST_VERSION..=VERSION).contains(&hello.version) =>
            {
                Ok((read, write, hello))
            }
            Some(ToGateway::Hello(hello)) => Err(io::Error::other(format!(
                "the shim speaks version {}, we speak {VERSION}",
                hello.version
            ))),
            Some(ToGateway::Refused(why)) => Err(io::Error::other(format!("refused: {why}"))),
            _ => Err(io::Error::other("the shim did not say hello")),
        }
    };
    let (mut read, mut write, mut hello) =
        tokio::time::timeout(HELLO_WITHIN, connecting)
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "the shim did not answer"))??;
    // Since version 2, a shim with a key serves only who shows it, then
    // says hello again.
    let key_file = crate::shim::key_of(socket);
    if hello.version >= 2 {
        let key = match std::fs::read(&key_file) {
            Ok(key) => Some(key),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => {
                return Err(io::Error::other(format!(
                    "cannot read the shim's key {}: {e}",
                    key_file.display()
                )))
            }
        };
        if let Some(key) = key {
            protocol::send_to_shim(&mut write, &ToShim::Auth { key }).await?;
            let again = tokio::time::timeout(HELLO_WITHIN, protocol::read_from_shim(&mut read))
                .await
                .map_err(|_| {
                    io::Error::new(io::ErrorKind::TimedOut, "the shim did not answer")
                })??;
            hello = match again {
                Some(ToGateway::Hello(hello)) => hello,
                Some(ToGateway::Refused(why)) => {
                    return Err(io::Error::other(format!("refused: {why}")))
                }
                _ => return Err(io::Error::other("the shim did not say hello again")),
            };
        }
    }
    let from = from(&hello);
    protocol::send_to_shim(&mut write, &ToShim::Attach { from }).await?;

    let (output_tx, frames) = mpsc::channel(OUTPUT_FRAMES);
    let output = Output {
        frames,
        frame: Vec::new(),
        read: 0,
    };
    let (input, input_rx) = tokio::io::duplex(PIPE_BYTES);
    let (commands, mut commands_rx) = mpsc::unbounded_channel();
    let (ending_tx, ending) = watch::channel(None);
    let delivered = Arc::new(AtomicU64::new(from));

    // The shim's frames: output on to the JSON-RPC layer, in order.
    let handed = delivered.clone();
    tokio::spawn(async move {
        let end = loop {
            let frame = match protocol::read_from_shim(&mut read).await {
                Ok(Some(frame)) => frame,
                Ok(None) => break Ending::Lost("the shim closed the connection".into()),
                Err(e) => break Ending::Lost(format!("the shim's socket failed: {e}")),
            };
            match frame {
                ToGateway::Output { offset, bytes } => {
                    let at = handed.load(Ordering::Acquire);
                    if offset != at {
                        break Ending::Lost(format!("output at {offset}, expected {at}"));
                    }
                    let len = bytes.len() as u64;
                    if output_tx.send(bytes).await.is_err() {
                        // Nobody reads the agent any more.
                        break Ending::Lost("the link was dropped".into());
                    }
                    handed.store(at + len, Ordering::Release);
                }
                ToGateway::Stderr(bytes) => {
                    let _ = stderr.try_send(bytes);
                }
                ToGateway::Exit(exit) => break Ending::Exited(exit),
                ToGateway::Refused(why) => break Ending::Lost(format!("refused: {why}")),
                ToGateway::Hello(_) => break Ending::Lost("a second hello".into()),
            }
        };
        // The JSON-RPC layer sees the end of the agent's output.
        drop(output_tx);
        let _ = ending_tx.send(Some(end));
    });

    // Our input and commands to the shim, input numbered from where the
    // shim's count stands.
    let mut offset = hello.input_taken;
    tokio::spawn(async move {
        // Held only while there is input to send: an idle agent costs none.
        let mut input_rx = LazyBufReader::with_capacity(INPUT_CHUNK, input_rx);
        let mut input_open = true;
        loop {
            let message = tokio::select! {
                read = input_rx.fill_buf(), if input_open => match read {
                    Ok([]) | Err(_) => {
                        input_open = false;
                        continue;
                    }
                    Ok(bytes) => ToShim::Input { offset, bytes: bytes.to_vec() },
                },
                command = commands_rx.recv() => match command {
                    Some(command) => command,
                    None => return,
                },
            };
            if let ToShim::Input { bytes, .. } = &message {
                input_rx.consume(bytes.len());
                offset += bytes.len() as u64;
            }
            if protocol::send_to_shim(&mut write, &message).await.is_err() {
                return;
            }
        }
    });

    Ok(ShimLink {
        hello,
        output,
        input,
        control: ShimControl {
            commands,
            ending,
            delivered,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn the_output_reads_its_frames_as_one_stream_and_keeps_none_it_has_read() {
        let (frames_tx, frames) = mpsc::channel(4);
        let mut output = Output {
            frames,
            frame: Vec::new(),
            read: 0,
        };
        for frame in [&b"one\ntw"[..], b"", b"o\nthree", b"\n"] {
            frames_tx.send(frame.to_vec()).await.unwrap();
        }
        // Reads smaller than a frame, and across frames (an empty one
        // skipped).
        let mut bytes = [0u8; 4];
        output.read_exact(&mut bytes).await.unwrap();
        assert_eq!(&bytes, b"one\n");
        assert_eq!(output.frame.len(), 6, "the frame being read is kept");
        let mut two = [0u8; 2];
        output.read_exact(&mut two).await.unwrap();
        assert_eq!(&two, b"tw");
        // A frame read to its end is given back at once.
        assert_eq!(output.frame.capacity(), 0);
        output.read_exact(&mut bytes).await.unwrap();
        assert_eq!(&bytes, b"o\nth");
        drop(frames_tx);
        let mut rest = Vec::new();
        output.read_to_end(&mut rest).await.unwrap();
        assert_eq!(rest, b"ree\n");
    }
}
