//! The shim's one loop: the agent's output into [`Held`], out to the
//! gateway that is attached (if any); the gateway's input into the agent,
//! each byte once; acknowledgements, stopping, and the end.

use std::io;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::process::{ChildStderr, ChildStdin};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use sha2::{Digest, Sha256};

use super::held::Held;
use super::protocol::{self, Exit, Hello, ToGateway, ToShim, MAX_OUTPUT_CHUNK, VERSION};
use crate::process::child::{StderrTail, Supervised};

/// How many stderr lines the shim keeps for [`Exit::stderr_tail`].
const STDERR_TAIL_LINES: usize = 20;
/// How many messages wait for the gateway's socket at most.
const OUTBOX: usize = 16;
/// How long a stopped shim gives its last frames to reach the gateway.
const LAST_WORDS: Duration = Duration::from_secs(2);
/// How long a connection may take to prove it is the gateway's.
const AUTH_WITHIN: Duration = Duration::from_secs(10);

/// The gateway that is connected now.
struct Gateway {
    /// Which connection this is (frames of an older one are ignored).
    number: u64,
    outbox: mpsc::Sender<ToGateway>,
    /// Where the next output frame starts: `None` until it attaches.
    sent_to: Option<u64>,
    exit_sent: bool,
    reader: JoinHandle<()>,
    /// Ends once what was queued is written (or the socket failed).
    writer: Option<JoinHandle<()>>,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// Serves gateways (those of `peer_uid` that know `key`, where the shim has
/// one) until the agent has ended and its output is accounted for, holding
/// at most `buffer` bytes of it.
pub(super) async fn serve(
    listener: UnixListener,
    mut agent: Supervised,
    buffer: usize,
    peer_uid: u32,
    key: Option<Vec<u8>>,
) -> io::Result<()> {
    let child = agent.child_mut();
    let (Some(stdin), Some(mut stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err(io::Error::other("the agent's pipes are missing"));
    };
    let (input, _writer) = stdin_writer(stdin);
    let tail = StderrTail::new(STDERR_TAIL_LINES);
    let (mut stderr_chunks, stderr_task) = stderr_reader(stderr, tail.clone());
    let mut stderr_task = Some(stderr_task);
    let (frames_tx, mut frames) = mpsc::channel::<(u64, Option<ToShim>)>(OUTBOX);
    // Connections that proved they are the gateway's, their hello sent.
    let (proven_tx, mut proven) = mpsc::channel::<UnixStream>(OUTBOX);
    let key = key.map(|key| std::sync::Arc::new(Sha256::digest(&key)));

    let mut state = Serving {
        held: Held::new(buffer),
        input_taken: 0,
        exit: None,
        gateway: None,
        kill_at: None,
        stopping: false,
    };
    let mut stdout_open = true;
    let mut status = None;
    let mut connections: u64 = 0;
    let mut read_buf = vec![0u8; MAX_OUTPUT_CHUNK];

    loop {
        if let (Some(status), false, None) = (status, stdout_open, &state.exit) {
            // Its last stderr lines, as far as they come soon.
            if let Some(reader) = stderr_task.take() {
                let _ = tokio::time::timeout(LAST_WORDS, reader).await;
            }
            state.exit = Some(describe(status, &tail));
        }
        // The end: the agent has ended and its output is accounted for (or
        // the gateway, having asked it to stop, wants no more of it).
        if state.exit.is_some() {
            let all_acknowledged = state.held.start() == state.held.end();
            let told = state.gateway.as_ref().is_some_and(|g| g.exit_sent);
            if (told && (all_acknowledged || state.stopping))
                || (state.stopping && state.gateway.is_none())
            {
                if let Some(g) = state.gateway.take() {
                    let _ = tokio::time::timeout(LAST_WORDS, finish(g)).await;
                }
                return Ok(());
            }
        }
        // Whether the attached gateway is owed something (made once there
        // is room for it).
        let owed = state.gateway.as_ref().is_some_and(|g| match g.sent_to {
            Some(from) => from < state.held.end() || (!g.exit_sent && state.exit.is_some()),
            None => false,
        });
        let outbox = state.gateway.as_ref().map(|g| g.outbox.clone());
        let room = state.held.room().min(read_buf.len());
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let Some(peer) = stream.peer_cred().ok().map(|c| c.uid()) else { continue };
                // The gateway's uid alone: not the shim's own, which is its
                // agent's user (so another agent of that user's, say).
                if peer != peer_uid {
                    refuse(stream, format!("uid {peer} may not use this shim"));
                    continue;
                }
                let hello = hello_now(&agent, &state.held, state.input_taken, &state.exit);
                match &key {
                    // Only once it has proved it knows the key does it count
                    // (and so replace the gateway connected now).
                    Some(key) => prove(stream, hello, key.clone(), proven_tx.clone()),
                    None => {
                        // A new gateway replaces the one before (which is
                        // gone, or about to be).
                        connections += 1;
                        state.gateway = Some(connect(stream, connections, hello, frames_tx.clone()));
                    }
                }
            }
            Some(stream) = proven.recv() => {
                // Proven: a second hello, of how things stand now, is what
                // it attaches by (the first may be older than an
                // acknowledgement the gateway before it made meanwhile).
                connections += 1;
                let hello = hello_now(&agent, &state.held, state.input_taken, &state.exit);
                state.gateway = Some(connect(stream, connections, hello, frames_tx.clone()));
            }
            Some((number, frame)) = frames.recv() => state.take_frame(number, frame, &input, &mut agent),
            read = stdout.read(&mut read_buf[..room]), if stdout_open && room > 0 => {
                match read {
                    Ok(0) | Err(_) => stdout_open = false,
                    Ok(n) => state.held.push(&read_buf[..n]),
                }
            }
            ended = agent.wait(), if status.is_none() => status = Some(ended),
            _ = tokio::time::sleep_until(state.kill_at.unwrap_or_else(Instant::now)), if state.kill_at.is_some() => {
                state.kill_at = None;
                agent.kill();
            }
            Some(chunk) = stderr_chunks.recv() => {
                // Live only, and never waited for: a gateway that is slow
                // to read loses stderr lines, not output.
                if let Some(g) = state.gateway.as_ref().filter(|g| g.sent_to.is_some()) {
                    let _ = g.outbox.try_send(ToGateway::Stderr(chunk));
                }
            }
            permit = async { outbox.as_ref()?.reserve().await.ok() }, if owed => state.send_owed(permit),
        }
    }
}

/// What the shim's loop keeps between wake-ups, and what it does with a
/// gateway's frames and the room to send it more.
struct Serving {
    held: Held,
    /// How much of the gateway's input has gone to the agent.
    input_taken: u64,
    /// How the agent ended, once it has and its output is all read.
    exit: Option<Exit>,
    gateway: Option<Gateway>,
    /// When the agent asked to stop is killed.
    kill_at: Option<Instant>,
    /// The gateway asked the agent to stop: it wants no more of its output.
    stopping: bool,
}

impl Serving {
    /// A frame from the gateway connection `number` (`None`: it closed).
    /// What a gateway acknowledged, sent or asked holds even once a newer
    /// connection has replaced its own (numbered input is taken once
    /// whoever sends it); attaching is the current one's alone.
    fn take_frame(
        &mut self,
        number: u64,
        frame: Option<ToShim>,
        input: &mpsc::UnboundedSender<Vec<u8>>,
        agent: &mut Supervised,
    ) {
        let current = self.gateway.as_ref().is_some_and(|g| g.number == number);
        let frame = match frame {
            None if current => {
                self.gateway = None;
                return;
            }
            Some(ToShim::Attach { .. }) if !current => return,
            None => return,
            Some(frame) => frame,
        };
        match frame {
            ToShim::Attach { from } => {
                let g = self.gateway.as_mut().expect("the current gateway");
                if from >= self.held.start() && self.held.acknowledge(from) {
                    g.sent_to = Some(from);
                } else {
                    let why = format!(
                        "cannot attach at {from}: held are {}..{}",
                        self.held.start(),
                        self.held.end()
                    );
                    let _ = g.outbox.try_send(ToGateway::Refused(why));
                    self.gateway = None;
                }
            }
            ToShim::Input { offset, bytes } => {
                if offset > self.input_taken {
                    let why = format!("input at {offset}, but {} is next", self.input_taken);
                    if let Some(g) = self.gateway.as_ref().filter(|_| current) {
                        let _ = g.outbox.try_send(ToGateway::Refused(why));
                        self.gateway = None;
                    }
                    return;
                }
                // What was taken before (sent again after a reconnect) goes
                // to the agent once.
                let skip = (self.input_taken - offset) as usize;
                if skip < bytes.len() {
                    self.input_taken = offset + bytes.len() as u64;
                    let _ = input.send(bytes[skip..].to_vec());
                }
            }
            ToShim::Ack { to } => {
                // Only what was read can be acknowledged, and never what the
                // attached gateway has yet to be sent.
                let sent = self.gateway.as_ref().and_then(|g| g.sent_to);
                self.held
                    .acknowledge(to.min(sent.unwrap_or_else(|| self.held.end())));
            }
            // Proven already (or no key needed): nothing more to prove.
            ToShim::Auth { .. } => {}
            ToShim::Stop { grace_ms } => {
                self.stopping = true;
                agent.ask_to_stop();
                self.kill_at = Some(Instant::now() + Duration::from_millis(grace_ms.into()));
            }
        }
    }

    /// Sends the attached gateway what it is owed (its next output, else the
    /// agent's exit) in the room `permit` holds (`None`: its writer has
    /// gone, and so has the gateway).
    fn send_owed(&mut self, permit: Option<mpsc::Permit<'_, ToGateway>>) {
        let (Some(permit), Some(g)) = (permit, self.gateway.as_mut()) else {
            self.gateway = None;
            return;
        };
        let from = g.sent_to.unwrap_or_else(|| self.held.end());
        let message = match self.held.from(from, MAX_OUTPUT_CHUNK) {
            Some(bytes) if !bytes.is_empty() => {
                g.sent_to = Some(from + bytes.len() as u64);
                ToGateway::Output {
                    offset: from,
                    bytes,
                }
            }
            _ => match &self.exit {
                Some(exit) => {
                    g.exit_sent = true;
                    ToGateway::Exit(exit.clone())
                }
                None => return,
            },
        };
        permit.send(message);
    }
}

/// What a gateway connecting now is told.
fn hello_now(agent: &Supervised, held: &Held, input_taken: u64, exit: &Option<Exit>) -> Hello {
    Hello {
        version: VERSION,
        pid: agent.pid(),
        start_time: agent.identity().map(|(_, t)| t),
        held_from: held.start(),
        read_to: held.end(),
        input_taken,
        exit: exit.clone(),
    }
}

/// Says hello to a connection, then waits for it to prove it knows the
/// key ([`ToShim::Auth`], its first frame): proven, it goes to `proven`
/// (and is said hello again, as things then stand); else it is told no and
/// closed. A process in an agent's box can reach the
/// socket (Landlock does not cover connecting to one before ABI 9) but not
/// the key beside it.
fn prove(
    mut stream: UnixStream,
    hello: Hello,
    key: std::sync::Arc<sha2::digest::Output<Sha256>>,
    proven: mpsc::Sender<UnixStream>,
) {
    tokio::spawn(async move {
        if protocol::send_to_gateway(&mut stream, &ToGateway::Hello(hello))
            .await
            .is_err()
        {
            return;
        }
        let first = tokio::time::timeout(AUTH_WITHIN, protocol::read_from_gateway(&mut stream));
        match first.await {
            // Digests compared: how long the comparison takes says nothing
            // of the key.
            Ok(Ok(Some(ToShim::Auth { key: given }))) if Sha256::digest(&given) == *key => {
                let _ = proven.send(stream).await;
            }
            _ => {
                let refused = ToGateway::Refused("not the gateway: no valid key".into());
                let _ = tokio::time::timeout(
                    LAST_WORDS,
                    protocol::send_to_gateway(&mut stream, &refused),
                )
                .await;
            }
        }
    });
}

/// Starts serving a connection: its hello sent first, its frames read into
/// `frames`, tagged with `number`.
fn connect(
    stream: UnixStream,
    number: u64,
    hello: Hello,
    frames: mpsc::Sender<(u64, Option<ToShim>)>,
) -> Gateway {
    let (mut read, mut write) = stream.into_split();
    let (outbox, mut queued) = mpsc::channel::<ToGateway>(OUTBOX);
    let writer = tokio::spawn(async move {
        if protocol::send_to_gateway(&mut write, &ToGateway::Hello(hello))
            .await
            .is_err()
        {
            return;
        }
        while let Some(message) = queued.recv().await {
            if protocol::send_to_gateway(&mut write, &message)
                .await
                .is_err()
            {
                return;
            }
        }
        let _ = write.shutdown().await;
    });
    let reader = tokio::spawn(async move {
        loop {
            let frame = protocol::read_from_gateway(&mut read).await.ok().flatten();
            let closed = frame.is_none();
            if frames.send((number, frame)).await.is_err() || closed {
                return;
            }
        }
    });
    Gateway {
        number,
        outbox,
        sent_to: None,
        exit_sent: false,
        reader,
        writer: Some(writer),
    }
}

/// Lets a gateway's last frames go out; resolves when they have (or its
/// socket failed).
async fn finish(mut gateway: Gateway) {
    let writer = gateway.writer.take();
    // The outbox closes: the writer ends after what it holds.
    drop(gateway);
    if let Some(writer) = writer {
        let _ = writer.await;
    }
}

/// Tells a peer that may not connect why, and closes.
fn refuse(mut stream: UnixStream, why: String) {
    tokio::spawn(async move {
        let _ = tokio::time::timeout(
            LAST_WORDS,
            protocol::send_to_gateway(&mut stream, &ToGateway::Refused(why)),
        )
        .await;
    });
}

/// Writes what the gateways send to the agent's stdin, in order; a closed
/// stdin (the agent stopped reading) drops the rest.
fn stdin_writer(mut stdin: ChildStdin) -> (mpsc::UnboundedSender<Vec<u8>>, JoinHandle<()>) {
    let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
    let task = tokio::spawn(async move {
        while let Some(bytes) = rx.recv().await {
            if stdin.write_all(&bytes).await.is_err() || stdin.flush().await.is_err() {
                return;
            }
        }
    });
    (tx, task)
}

/// Reads the agent's stderr to its end (a full pipe would stall it): each
/// chunk to the loop, its last lines kept.
fn stderr_reader(
    mut stderr: ChildStderr,
    tail: StderrTail,
) -> (mpsc::Receiver<Vec<u8>>, JoinHandle<()>) {
    let (tx, rx) = mpsc::channel(OUTBOX);
    let task = tokio::spawn(async move {
        let mut buf = vec![0u8; 8 * 1024];
        let mut partial = Vec::new();
        loop {
            let n = match stderr.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            partial.extend_from_slice(&buf[..n]);
            while let Some(end) = partial.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = partial.drain(..=end).collect();
                tail.push(String::from_utf8_lossy(&line).trim_end().to_owned());
            }
            let _ = tx.try_send(buf[..n].to_vec());
        }
    });
    (rx, task)
}

fn describe(status: std::process::ExitStatus, tail: &StderrTail) -> Exit {
    use std::os::unix::process::ExitStatusExt;
    Exit {
        code: status.code(),
        signal: status.signal(),
        stderr_tail: tail.text(),
    }
}
