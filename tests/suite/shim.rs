//! `acp-gateway shim` on its own: a real shim process with a real agent
//! process below it, spoken to on its socket. Output is replayed exactly
//! after a reconnect, input sent again reaches the agent once, a full
//! buffer pauses the agent and loses nothing, an agent that ends while no
//! gateway is attached is accounted for later, stopping stops, and only the
//! gateway's uid may connect.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use acp_gateway::shim::protocol::{
    self, Exit, Hello, ToGateway, ToShim, MAX_OUTPUT_CHUNK, VERSION,
};
use acp_gateway::shim::Ready;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;

/// Bound on every wait.
const WAIT: Duration = Duration::from_secs(20);

async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(WAIT, f)
        .await
        .unwrap_or_else(|_| panic!("timed out: {what}"))
}

/// A shim started by the test, killed with its agent when dropped.
struct Shim {
    child: tokio::process::Child,
    socket: PathBuf,
    agent_pid: i32,
    _dir: tempfile::TempDir,
}

impl Shim {
    async fn start(buffer: usize, agent: &[&str]) -> Shim {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("shim.sock");
        let (child, ready) = start_shim(&socket, buffer, agent).await;
        let Ready::Serving { pid, .. } = ready else {
            panic!("the shim did not start: {ready:?}");
        };
        Shim {
            child,
            socket,
            agent_pid: pid,
            _dir: dir,
        }
    }

    /// A shim over `sh -c script`, and a gateway attached from the start.
    async fn attached_to(script: &str) -> (Shim, Conn) {
        let shim = Shim::start(1 << 20, &["sh", "-c", script]).await;
        let mut gateway = shim.connect().await;
        gateway.send(ToShim::Attach { from: 0 }).await;
        (shim, gateway)
    }

    async fn connect(&self) -> Conn {
        Conn::open(&self.socket).await
    }

    /// Waits for the shim to exit; its exit code.
    async fn exited(&mut self) -> i32 {
        within("the shim exits", self.child.wait())
            .await
            .unwrap()
            .code()
            .unwrap_or(-1)
    }
}

impl Drop for Shim {
    fn drop(&mut self) {
        // Whatever a failed test leaves: the agent, then the shim.
        unsafe {
            libc::kill(-self.agent_pid, libc::SIGKILL);
        }
        let _ = self.child.start_kill();
    }
}

async fn start_shim(
    socket: &Path,
    buffer: usize,
    agent: &[&str],
) -> (tokio::process::Child, Ready) {
    // As the gateway does: a key beside the socket.
    let key = acp_gateway::shim::key_of(socket);
    std::fs::write(&key, "0123456789abcdef0123456789abcdef").unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_acp-gateway"))
        .arg("shim")
        .arg("--socket")
        .arg(socket)
        .arg("--buffer")
        .arg(buffer.to_string())
        .arg("--peer-uid")
        .arg(unsafe { libc::geteuid() }.to_string())
        .arg("--key-file")
        .arg(&key)
        .arg("--")
        .args(agent)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = within("the shim says it is ready", lines.next_line())
        .await
        .unwrap()
        .expect("a line on stdout");
    (child, serde_json::from_str(&line).unwrap())
}

/// One connection to a shim, as a gateway holds it.
struct Conn {
    read: OwnedReadHalf,
    write: OwnedWriteHalf,
    hello: Hello,
}

impl Conn {
    async fn open(socket: &Path) -> Conn {
        let stream = within("connect", UnixStream::connect(socket))
            .await
            .unwrap();
        let (mut read, write) = stream.into_split();
        let hello = match within("hello", protocol::read_from_shim(&mut read)).await {
            Ok(Some(ToGateway::Hello(hello))) => hello,
            other => panic!("expected a hello, got {other:?}"),
        };
        assert_eq!(hello.version, VERSION);
        let mut conn = Conn { read, write, hello };
        // As the gateway: the key, then the hello that counts.
        let key = std::fs::read(acp_gateway::shim::key_of(socket)).unwrap();
        conn.send(ToShim::Auth { key }).await;
        conn.hello = match within("hello again", protocol::read_from_shim(&mut conn.read)).await {
            Ok(Some(ToGateway::Hello(hello))) => hello,
            other => panic!("expected a second hello, got {other:?}"),
        };
        conn
    }

    async fn send(&mut self, message: ToShim) {
        protocol::send_to_shim(&mut self.write, &message)
            .await
            .unwrap();
    }

    /// Sends `bytes` for the agent, the first at input `offset`.
    async fn input(&mut self, offset: u64, bytes: &[u8]) {
        self.send(ToShim::Input {
            offset,
            bytes: bytes.to_vec(),
        })
        .await;
    }

    /// The next frame (stderr frames passed over).
    async fn next(&mut self) -> Option<ToGateway> {
        loop {
            match within("a frame", protocol::read_from_shim(&mut self.read))
                .await
                .unwrap()
            {
                Some(ToGateway::Stderr(_)) => continue,
                other => return other,
            }
        }
    }

    /// Output from `from` until `until` bytes have come, checking that
    /// each frame starts where the one before ended.
    async fn output(&mut self, from: u64, until: u64) -> Vec<u8> {
        let mut got = Vec::new();
        let mut at = from;
        while at < until {
            match self.next().await {
                Some(ToGateway::Output { offset, bytes }) => {
                    assert_eq!(offset, at, "frames follow each other");
                    assert!(bytes.len() <= MAX_OUTPUT_CHUNK);
                    at += bytes.len() as u64;
                    got.extend(bytes);
                }
                other => panic!("expected output at {at}, got {other:?}"),
            }
        }
        got
    }

    /// Output until the agent's exit; the output and the exit.
    async fn until_exit(&mut self, from: u64) -> (Vec<u8>, Exit) {
        let mut got = Vec::new();
        let mut at = from;
        loop {
            match self.next().await {
                Some(ToGateway::Output { offset, bytes }) => {
                    assert_eq!(offset, at, "frames follow each other");
                    at += bytes.len() as u64;
                    got.extend(bytes);
                }
                Some(ToGateway::Exit(exit)) => return (got, exit),
                other => panic!("expected output or the exit, got {other:?}"),
            }
        }
    }
}

fn numbered_lines(n: usize) -> Vec<u8> {
    (1..=n)
        .flat_map(|i| format!("{i}\n").into_bytes())
        .collect()
}

#[tokio::test]
async fn output_is_replayed_exactly_after_a_reconnect() {
    let expected = numbered_lines(20_000);
    let mut shim = Shim::start(1 << 20, &["sh", "-c", "seq 1 20000; exec cat"]).await;
    let mut first = shim.connect().await;
    assert_eq!((first.hello.held_from, first.hello.input_taken), (0, 0));
    first.send(ToShim::Attach { from: 0 }).await;
    let part = first.output(0, 30_000).await;
    // Acknowledged up to the end of the last whole line received, as a
    // gateway does once it has committed it.
    let acked = part.iter().rposition(|&b| b == b'\n').unwrap() as u64 + 1;
    first.send(ToShim::Ack { to: acked }).await;
    // Acknowledged before the crash: the next one starts there.
    first.send(ToShim::Attach { from: acked }).await;
    drop(first);

    let mut second = shim.connect().await;
    // The acknowledgement may or may not have arrived before the crash.
    assert!(second.hello.held_from <= acked);
    assert!(second.hello.read_to >= 30_000);
    assert_eq!(second.hello.exit, None, "cat still runs");
    second.send(ToShim::Attach { from: acked }).await;
    let rest = second.output(acked, expected.len() as u64).await;
    assert_eq!(
        rest,
        &expected[acked as usize..],
        "every byte once, in order"
    );

    // Attaching before what was let go is refused, not answered wrongly.
    let mut third = shim.connect().await;
    third.send(ToShim::Attach { from: acked - 1 }).await;
    match third.next().await {
        Some(ToGateway::Refused(why)) => assert!(why.contains("cannot attach"), "{why}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    let mut last = shim.connect().await;
    last.send(ToShim::Attach { from: acked }).await;
    last.send(ToShim::Stop { grace_ms: 2000 }).await;
    let (_, exit) = last.until_exit(acked).await;
    assert_eq!(exit.signal, Some(libc::SIGTERM));
    assert_eq!(shim.exited().await, 0);
    assert!(!shim.socket.exists(), "the socket goes with the shim");
}

#[tokio::test]
async fn input_sent_again_after_a_reconnect_reaches_the_agent_once() {
    let mut shim = Shim::start(1 << 20, &["cat"]).await;
    let mut first = shim.connect().await;
    first.send(ToShim::Attach { from: 0 }).await;
    first.input(0, b"one\n").await;
    assert_eq!(first.output(0, 4).await, b"one\n");
    drop(first);

    let mut second = shim.connect().await;
    assert_eq!(second.hello.input_taken, 4);
    second.send(ToShim::Attach { from: 4 }).await;
    // A gateway that cannot tell what arrived sends from where it knows.
    second.input(0, b"one\ntwo\n").await;
    second.input(8, b"three\n").await;
    assert_eq!(second.output(4, 14).await, b"two\nthree\n");
    // A gap is refused.
    second.input(99, b"lost?\n").await;
    match second.next().await {
        Some(ToGateway::Refused(why)) => assert!(why.contains("99"), "{why}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    let mut last = shim.connect().await;
    assert_eq!(last.hello.input_taken, 14);
    last.send(ToShim::Attach { from: 14 }).await;
    last.send(ToShim::Stop { grace_ms: 2000 }).await;
    let (more, _) = last.until_exit(14).await;
    assert!(more.is_empty(), "{more:?}");
    assert_eq!(shim.exited().await, 0);
}

#[tokio::test]
async fn a_full_buffer_pauses_the_agent_and_loses_nothing() {
    const BUFFER: usize = 64 * 1024;
    let dir = tempfile::tempdir().unwrap();
    let finished = dir.path().join("finished");
    // Far more than the buffer and the pipe hold together.
    let script = format!("seq 1 200000; touch {}", finished.display());
    let expected = numbered_lines(200_000);
    let mut shim = Shim::start(BUFFER, &["sh", "-c", &script]).await;
    let mut gateway = shim.connect().await;
    gateway.send(ToShim::Attach { from: 0 }).await;
    // Nothing acknowledged: exactly the buffer comes, and the agent waits.
    let held = gateway.output(0, BUFFER as u64).await;
    // A gateway that comes now (the one before gone) finds it full.
    drop(gateway);
    let mut gateway = shim.connect().await;
    assert_eq!(
        gateway.hello.read_to, BUFFER as u64,
        "never more than the buffer"
    );
    assert!(!finished.exists(), "the agent is paused, not done");

    // Acknowledging lets it go on; every byte arrives once.
    let mut got = held;
    gateway
        .send(ToShim::Attach {
            from: BUFFER as u64,
        })
        .await;
    loop {
        let at = got.len() as u64;
        match gateway.next().await {
            Some(ToGateway::Output { offset, bytes }) => {
                assert_eq!(offset, at);
                got.extend(bytes);
                gateway
                    .send(ToShim::Ack {
                        to: got.len() as u64,
                    })
                    .await;
            }
            Some(ToGateway::Exit(exit)) => {
                assert_eq!(exit.code, Some(0));
                break;
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(got.len(), expected.len());
    assert!(got == expected, "every line once, in order");
    assert!(finished.exists());
    assert_eq!(shim.exited().await, 0, "all acknowledged: the shim ends");
}

#[tokio::test]
async fn an_agent_that_ends_while_no_gateway_is_attached_is_accounted_for_later() {
    let dir = tempfile::tempdir().unwrap();
    let go = dir.path().join("go");
    let script = format!(
        "read line < {go}; echo 'last words'; echo 'gone for good' >&2; exit 3",
        go = go.display()
    );
    nix_mkfifo(&go);
    let mut shim = Shim::start(1 << 20, &["sh", "-c", &script]).await;
    // No gateway attached while the agent speaks and ends.
    let agent = shim.agent_pid;
    std::fs::write(&go, "now\n").unwrap();
    wait_for_exit_of(agent).await;

    let mut later = shim.connect().await;
    later.send(ToShim::Attach { from: 0 }).await;
    let (output, exit) = later.until_exit(0).await;
    assert_eq!(output, b"last words\n");
    assert_eq!(exit.code, Some(3));
    assert!(exit.stderr_tail.contains("gone for good"), "{exit:?}");
    // It waits for the acknowledgement of its last words, then goes.
    later.send(ToShim::Ack { to: 11 }).await;
    assert_eq!(shim.exited().await, 0);
}

#[tokio::test]
async fn stop_kills_an_agent_that_ignores_sigterm_after_the_grace() {
    let script = "trap '' TERM; echo ready; while :; do sleep 1; done";
    let (mut shim, mut gateway) = Shim::attached_to(script).await;
    // Past `trap`: it says so.
    assert_eq!(gateway.output(0, 6).await, b"ready\n");
    gateway.send(ToShim::Stop { grace_ms: 100 }).await;
    let (_, exit) = gateway.until_exit(6).await;
    assert_eq!(exit.signal, Some(libc::SIGKILL));
    assert_eq!(shim.exited().await, 0);
    assert!(!alive(shim.agent_pid), "nothing of the agent is left");
}

#[tokio::test]
async fn a_shim_that_cannot_start_its_agent_says_why_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("shim.sock");
    let (mut child, ready) = start_shim(&socket, 1024, &["/nonexistent/agent"]).await;
    match ready {
        Ready::Failed { error } => assert!(error.contains("/nonexistent/agent"), "{error}"),
        other => panic!("{other:?}"),
    }
    let status = within("the shim exits", child.wait()).await.unwrap();
    assert_eq!(status.code(), Some(1));
    assert!(!socket.exists());
    assert!(!acp_gateway::shim::key_of(&socket).exists());
}

/// A connection that cannot show the key is told no, and the gateway
/// attached meanwhile goes on being served: it was never replaced.
#[tokio::test]
async fn a_connection_without_the_key_is_refused_and_replaces_nobody() {
    let (shim, mut gateway) = Shim::attached_to("cat").await;
    for key in [None, Some(b"not the key at all".to_vec())] {
        let stream = UnixStream::connect(&shim.socket).await.unwrap();
        let (mut read, mut write) = stream.into_split();
        let hello = within("hello", protocol::read_from_shim(&mut read)).await;
        assert!(matches!(hello, Ok(Some(ToGateway::Hello(_)))), "{hello:?}");
        let frame = match key {
            Some(key) => ToShim::Auth { key },
            None => ToShim::Stop { grace_ms: 0 },
        };
        protocol::send_to_shim(&mut write, &frame).await.unwrap();
        match within("the refusal", protocol::read_from_shim(&mut read)).await {
            Ok(Some(ToGateway::Refused(why))) => assert!(why.contains("key"), "{why}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
    gateway.input(0, b"still here\n").await;
    assert_eq!(gateway.output(0, 11).await, b"still here\n");
    assert!(alive(shim.agent_pid));
}

#[tokio::test]
async fn only_the_gateways_uid_may_connect() {
    let mut shim = Shim::start(1 << 20, &["cat"]).await;
    let mode = std::fs::metadata(&shim.socket)
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "the socket is its owner's alone");
    if unsafe { libc::geteuid() } == 0 {
        // Even where the file would let another user in, the shim asks the
        // kernel who is connecting and refuses them.
        std::fs::set_permissions(&shim.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
        std::fs::set_permissions(
            shim.socket.parent().unwrap(),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        let said = connect_as(&shim.socket, 65534).await;
        assert!(said.starts_with("5 uid 65534 may not"), "{said:?}");
    }
    // The shim's own gateway still gets in.
    let mut gateway = shim.connect().await;
    gateway.send(ToShim::Attach { from: 0 }).await;
    gateway.send(ToShim::Stop { grace_ms: 2000 }).await;
    gateway.until_exit(0).await;
    assert_eq!(shim.exited().await, 0);
}

#[tokio::test]
async fn the_agents_own_user_may_not_connect_to_its_shim() {
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root to run the shim as another user");
        return;
    }
    // As the gateway starts it for a profile with a user: the shim runs as
    // that user; another process of that user (another agent) is refused.
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let socket = dir.path().join("shim.sock");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_acp-gateway"))
        .args(["shim", "--socket"])
        .arg(&socket)
        .args(["--peer-uid", "0", "--", "cat"])
        .uid(65534)
        .gid(65534)
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let ready = within("the shim says it is ready", lines.next_line())
        .await
        .unwrap()
        .unwrap();
    assert!(ready.contains("serving"), "{ready}");
    let said = connect_as(&socket, 65534).await;
    assert!(said.starts_with("5 uid 65534 may not"), "{said:?}");
    // The gateway (root here) gets in.
    let stream = UnixStream::connect(&socket).await.unwrap();
    let (mut read, mut write) = stream.into_split();
    match within("hello", protocol::read_from_shim(&mut read)).await {
        Ok(Some(ToGateway::Hello(_))) => {}
        other => panic!("expected a hello, got {other:?}"),
    }
    for message in [ToShim::Attach { from: 0 }, ToShim::Stop { grace_ms: 2000 }] {
        protocol::send_to_shim(&mut write, &message).await.unwrap();
    }
    // Told how its agent ended, the gateway goes; so does the shim.
    while let Ok(Some(frame)) = within("the agent's end", protocol::read_from_shim(&mut read)).await
    {
        if matches!(frame, ToGateway::Exit(_)) {
            break;
        }
    }
    drop((read, write));
    let status = within("the shim exits", child.wait()).await.unwrap();
    assert!(status.success() || status.code() == Some(0), "{status:?}");
}

/// What a process of `uid` hears when it connects to `socket`: the first
/// frame's kind and text.
async fn connect_as(socket: &Path, uid: u32) -> String {
    let script = r#"
import socket, struct, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
data = b""
while True:
    chunk = s.recv(4096)
    if not chunk:
        break
    data += chunk
length, kind = struct.unpack(">IB", data[:5])
print(kind, data[5:4 + length].decode())
"#;
    let output = within(
        "a stranger connects",
        tokio::process::Command::new("python3")
            .arg("-c")
            .arg(script)
            .arg(socket)
            .uid(uid)
            .gid(uid)
            .output(),
    )
    .await
    .unwrap();
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn nix_mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

fn alive(pid: i32) -> bool {
    // A zombie is gone for our purposes: it runs nothing; so is one being
    // reaped.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| {
            !stat
                .rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                // Exited (Z), or being reaped just now (X).
                .starts_with(['Z', 'X', 'x'])
        })
        .unwrap_or(false)
}

/// Waits until `pid` (not our child) has exited: its pidfd becomes readable.
async fn wait_for_exit_of(pid: i32) {
    use std::os::fd::{FromRawFd, OwnedFd};
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return; // already gone
    }
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    // SAFETY: the AsyncFd owns the descriptor, open for as long as it lives.
    let fd = unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
    }
    .unwrap();
    within("the agent exits", fd.readable())
        .await
        .unwrap()
        .retain_ready();
}

#[tokio::test]
async fn the_gateways_link_carries_the_agent_both_ways_and_picks_up_where_it_was_acknowledged() {
    use acp_gateway::acp::link::{self, Ending};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let mut shim = Shim::start(1 << 20, &["cat"]).await;
    let (stderr, _stderr) = tokio::sync::mpsc::channel(8);
    let mut first = link::attach(&shim.socket, |hello| hello.held_from, stderr.clone())
        .await
        .unwrap();
    first.input.write_all(b"one\ntwo\n").await.unwrap();
    assert_eq!(read_n(&mut first.output, 8).await, b"one\ntwo\n");
    assert_eq!(first.control.delivered(), 8);
    // "one" is committed, "two" is not: the gateway goes away.
    first.control.acknowledge(4);
    drop(first);

    // As a gateway reattaches: from what it committed (the shim may or
    // may not have taken the first one's acknowledgement yet; either way
    // it still holds what follows).
    let mut second = link::attach(&shim.socket, |_| 4, stderr).await.unwrap();
    assert!(second.hello.held_from <= 4 && second.hello.input_taken == 8);
    let again = read_n(&mut second.output, 4).await;
    assert_eq!(again, b"two\n");
    // Input goes on from where the shim's count stood.
    second.input.write_all(b"three\n").await.unwrap();
    assert_eq!(read_n(&mut second.output, 6).await, b"three\n");
    second.control.stop(Duration::from_secs(2));
    match within("the end", second.control.ended()).await {
        Ending::Exited(exit) => assert_eq!(exit.signal, Some(libc::SIGTERM)),
        other => panic!("{other:?}"),
    }
    let mut rest = Vec::new();
    second.output.read_to_end(&mut rest).await.unwrap();
    assert!(rest.is_empty());
    assert_eq!(shim.exited().await, 0);

    // A shim that is not there is an error, not a hang.
    let gone = link::attach(
        &shim.socket,
        |h| h.held_from,
        tokio::sync::mpsc::channel(1).0,
    )
    .await;
    assert!(gone.is_err());
}

#[tokio::test]
async fn what_the_agent_leaves_behind_is_killed_by_its_shim() {
    // A daemon of the agent's own session outlives the agent: re-parented
    // to the shim, it is killed there.
    let script = "setsid sleep 1000 & echo $!; exit 0";
    let (mut shim, mut gateway) = Shim::attached_to(script).await;
    let (output, exit) = gateway.until_exit(0).await;
    assert_eq!(exit.code, Some(0));
    let end = output.len() as u64;
    let daemon: i32 = String::from_utf8(output).unwrap().trim().parse().unwrap();
    wait_for_exit_of(daemon).await;
    assert!(!alive(daemon));
    gateway.send(ToShim::Ack { to: end }).await;
    assert_eq!(shim.exited().await, 0);
}

/// The next `n` bytes of a link's output.
async fn read_n(output: &mut acp_gateway::acp::link::Output, n: usize) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let mut bytes = vec![0u8; n];
    within("the agent's output", output.read_exact(&mut bytes))
        .await
        .unwrap();
    bytes
}
