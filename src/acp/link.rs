//! The gateway's end of a shim's socket (see [`crate::shim`]): the agent's
//! output and input as the two byte streams [`super::rpc`] speaks over, so
//! nothing above this knows whether an agent's pipes are its own or a
//! shim's, and a handle to acknowledge output, stop the agent and learn how
//! it ended.

use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, DuplexStream};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, watch};

use super::lazy_buf::LazyBufReader;
use crate::shim::protocol::{self, Exit, Hello, ToGateway, ToShim, OLDEST_VERSION, VERSION};

/// Bytes in flight between the link and the JSON-RPC layer, each way.
const PIPE_BYTES: usize = 64 * 1024;
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
    pub output: DuplexStream,
    /// The agent's input.
    pub input: DuplexStream,
    pub control: ShimControl,
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

    let (output, mut output_tx) = tokio::io::duplex(PIPE_BYTES);
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
                    if output_tx.write_all(&bytes).await.is_err() {
                        // Nobody reads the agent any more.
                        break Ending::Lost("the link was dropped".into());
                    }
                    handed.store(at + bytes.len() as u64, Ordering::Release);
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
        let _ = output_tx.shutdown().await;
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
