//! Agent processes: started with a clean environment as the root of a
//! process tree (see [`crate::process::spawn`]) so that the agent and everything it
//! started can be killed together; stderr is logged with the conversation
//! id and its last lines kept for error reports.
//!
//! An agent runs either as the gateway's own child (its pipes read here) or
//! under a shim ([`crate::shim`], reached through [`super::link`]), which
//! owns it and lets it outlive the gateway: then its output comes from the
//! shim's socket, positions and all, and a later gateway may reattach
//! ([`AgentProcess::reattach`]). A remote agent ([`super::remote`]) is no
//! process of ours at all: its WebSocket is the link, and stopping it closes
//! the connection. Above this, all three look alike: two byte streams
//! ([`AgentPipes`]) and an agent to wait for or stop.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, BufReader};
use tokio::process::Command;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use uuid::Uuid;

use super::link::{self, Ending, ShimControl};
use super::remote::{Ended, RemoteControl};
use super::rpc::{Processed, RpcPeer};
use crate::config::AgentProfile;
use crate::process::child::{StderrTail, Supervised};
use crate::sandbox::AgentBox;
use crate::shim::Ready;

/// How many stderr lines are kept for error reports.
const STDERR_TAIL_LINES: usize = 20;
/// Longest stderr line kept (the log gets it whole).
const STDERR_LINE_MAX: usize = 1000;
/// The read buffer of an agent's stderr (held only while it writes there).
const STDERR_BUFFER: usize = 8 * 1024;
/// How long a shim may take to say it is ready.
const SHIM_READY_WITHIN: Duration = Duration::from_secs(10);
/// How long a shim told to stop may take beyond the agent's grace.
const SHIM_STOP_MARGIN: Duration = Duration::from_secs(2);

/// Where and how agents run under shims (see [`crate::shim`]).
#[derive(Debug, Clone)]
pub struct ShimSetup {
    /// The executable that runs `shim` (the gateway's own).
    pub program: PathBuf,
    /// Where the shims' sockets are made.
    pub dir: PathBuf,
    /// Most bytes of output a shim holds for the gateway.
    pub buffer: usize,
}

impl ShimSetup {
    /// The shim's command line for a conversation's agent `program`: its
    /// socket, buffer, the gateway's uid, its key, the agent's box and the
    /// capabilities the profile keeps.
    fn command(
        &self,
        conversation_id: Uuid,
        program: &Path,
        profile: &AgentProfile,
        user: Option<&crate::sys::SystemUser>,
        agent_box: &AgentBox,
    ) -> anyhow::Result<Command> {
        let socket = self.socket(conversation_id);
        // A socket left by a shim that is gone.
        let _ = std::fs::remove_file(&socket);
        // SAFETY: getuid cannot fail.
        let gateway_uid = unsafe { libc::getuid() };
        let mut command = Command::new(&self.program);
        command
            .arg("shim")
            .arg("--socket")
            .arg(&socket)
            .arg("--buffer")
            .arg(self.buffer.to_string())
            .arg("--peer-uid")
            .arg(gateway_uid.to_string())
            .arg("--key-file")
            .arg(ShimSetup::make_key(&socket, user)?);
        if let Some(rules) = &agent_box.rules {
            command
                .arg("--sandbox")
                .arg(serde_json::to_string(rules).context("a box's rules serialize")?);
        }
        if !profile.capabilities.is_empty() {
            command
                .arg("--capabilities")
                .arg(profile.kept_capabilities().names().join(","));
        }
        command.arg("--").arg(program).args(&profile.args);
        Ok(command)
    }

    /// The socket of a conversation's shim.
    pub fn socket(&self, conversation_id: Uuid) -> PathBuf {
        self.dir.join(format!("{}.sock", conversation_id.simple()))
    }

    /// Makes a new key for the shim at `socket` (mode 0600, the shim's
    /// user's: `owner` where it is not ours).
    fn make_key(socket: &Path, owner: Option<&crate::sys::SystemUser>) -> anyhow::Result<PathBuf> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let file = crate::shim::key_of(socket);
        let _ = std::fs::remove_file(&file);
        let mut key = [0u8; 32];
        getrandom::fill(&mut key).map_err(|e| anyhow::anyhow!("no randomness for a key: {e}"))?;
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&file)
            .with_context(|| format!("cannot make {}", file.display()))?;
        out.write_all(hex::encode(key).as_bytes())?;
        if let Some(owner) = owner.filter(|_| crate::sys::running_as_root()) {
            std::os::unix::fs::chown(&file, Some(owner.uid), Some(owner.gid))?;
        }
        Ok(file)
    }
}

/// A running agent: a subprocess (of ours or under a shim), or a remote
/// agent's connection.
pub struct AgentProcess {
    kind: Kind,
    stderr_tail: StderrTail,
    stderr_task: Option<JoinHandle<()>>,
}

enum Kind {
    /// The gateway's own child.
    Child(Supervised),
    Shim(ShimAgent),
    Remote(RemoteAgent),
}

/// A remote agent: its connection, and how that ended.
struct RemoteAgent {
    control: RemoteControl,
    /// Where it is (its url).
    url: String,
    ended: Option<(ExitStatus, Ended)>,
}

/// An agent under a shim.
struct ShimAgent {
    /// The shim, where this gateway started it (a reattached one is an
    /// earlier gateway's child).
    process: Option<Supervised>,
    /// The shim's pid and start time.
    identity: Option<(i32, u64)>,
    /// The agent's.
    agent: (i32, Option<u64>),
    control: ShimControl,
    exit: Option<ExitStatus>,
}

/// The two streams of a freshly started or reattached agent, and where
/// its output stream stands.
pub struct AgentPipes {
    pub stdin: Box<dyn AsyncWrite + Unpin + Send>,
    pub stdout: Box<dyn AsyncRead + Unpin + Send>,
    /// The position of the first byte of `stdout` in the agent's output.
    pub output_from: u64,
    /// Our first JSON-RPC request id: above every one an earlier gateway
    /// sent this agent.
    pub first_request_id: u64,
    /// The agent's control through its shim, if it has one.
    pub shim: Option<ShimControl>,
}

impl AgentProcess {
    /// Starts the profile's command in `cwd`, as the profile's user, with
    /// the profile's environment (see [`crate::process::profile::environment`]) and in
    /// its conversation's box (`agent_box`: its home, and the rules the agent is
    /// confined by between fork and exec, by the shim where it has one);
    /// under a shim where `shim` says how.
    pub async fn spawn(
        profile: &AgentProfile,
        cwd: &Path,
        conversation_id: Uuid,
        shim: Option<&ShimSetup>,
        agent_box: &AgentBox,
    ) -> anyhow::Result<(AgentProcess, AgentPipes)> {
        let user = match &profile.user {
            // Unprivileged: std drops the supplementary groups too when the
            // gateway is root.
            Some(name) => Some(
                crate::sys::lookup_user(name)
                    .map_err(|e| anyhow::anyhow!("agent {:?}: {e}", profile.name))?,
            ),
            None => None,
        };
        let mut environment = crate::process::profile::environment(profile, user.as_ref());
        environment.extend(agent_box.variables());
        let path = crate::process::spawn::path_of(&environment);
        let cannot_start =
            |reason: String| anyhow::anyhow!("cannot start agent {:?}: {reason}", profile.name);
        // The conversation's directory is stored resolved: a symlink on its
        // path now was swapped in since and leads elsewhere (the box's rules
        // refuse it too, but an unboxed agent must not work there either).
        crate::sys::open_dir_without_links(cwd).map_err(|e| cannot_start(e.to_string()))?;
        let program = crate::sys::resolve_command(&profile.command, path).map_err(cannot_start)?;
        // What `GET /api/v1/agents` predicts, said before the kernel says
        // only "Permission denied".
        crate::sys::runnable_by(&program, user.as_ref(), path).map_err(cannot_start)?;
        let mut command = match shim {
            None => {
                let mut command = Command::new(&program);
                command.args(&profile.args);
                command
            }
            Some(shim) => {
                shim.command(conversation_id, &program, profile, user.as_ref(), agent_box)?
            }
        };
        command
            .env_clear()
            .envs(&environment)
            .current_dir(cwd)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if shim.is_some() {
            // The shim reads nothing from us and says nothing but its ready
            // line: no pipe of ours may keep it (or a reader of ours) waiting
            // once we are gone.
            command.stdin(Stdio::null()).stderr(Stdio::null());
        }
        // Its user, and no capability but those the profile keeps, taken
        // on between fork and exec by the shim (which drops them again for
        // the agent) or the agent itself: before its box, as the box's
        // rules do not reach the setting of either.
        crate::sandbox::capabilities::Shedding::new(
            profile.kept_capabilities(),
            user.as_ref(),
            Some(cwd),
        )
        .map_err(|e| cannot_start(e.to_string()))?
        .on_child(&mut command);
        if let (Some(rules), None) = (&agent_box.rules, shim) {
            crate::sandbox::landlock::Prepared::new(rules)
                .map_err(|e| cannot_start(format!("cannot make its box: {e}")))?
                .confine_child(&mut command);
        }
        let spawned = match shim {
            None => Supervised::spawn(&mut command),
            Some(_) => Supervised::spawn_detachable(&mut command),
        };
        if spawned.is_err() {
            if let Some(shim) = shim {
                let _ = std::fs::remove_file(crate::shim::key_of(&shim.socket(conversation_id)));
            }
        }
        let mut process = spawned.with_context(|| {
            format!(
                "cannot start agent {:?} ({})",
                profile.name, profile.command
            )
        })?;
        match shim {
            None => {
                let stderr_tail = StderrTail::new(STDERR_TAIL_LINES);
                let child = process.child_mut();
                let stdin = child.stdin.take().context("agent stdin missing")?;
                let stdout = child.stdout.take().context("agent stdout missing")?;
                let stderr = child.stderr.take().context("agent stderr missing")?;
                let stderr_task =
                    read_stderr(stderr, stderr_tail.clone(), conversation_id, &profile.name);
                Ok((
                    AgentProcess {
                        kind: Kind::Child(process),
                        stderr_tail,
                        stderr_task: Some(stderr_task),
                    },
                    AgentPipes {
                        stdin: Box::new(stdin),
                        stdout: Box::new(stdout),
                        output_from: 0,
                        first_request_id: 0,
                        shim: None,
                    },
                ))
            }
            Some(shim) => {
                let stdout = process
                    .child_mut()
                    .stdout
                    .take()
                    .context("shim stdout missing")?;
                shim_ready(stdout, &mut process, &profile.name).await?;
                let identity = process.identity();
                let socket = shim.socket(conversation_id);
                Self::over_shim(
                    &socket,
                    |_| 0,
                    Some(process),
                    identity,
                    conversation_id,
                    &profile.name,
                )
                .await
            }
        }
    }

    /// Connects to the profile's remote agent (its `url`, within its
    /// `startup_timeout`); frames longer than `max_line_bytes` end the
    /// connection.
    pub async fn connect(
        profile: &AgentProfile,
        max_line_bytes: usize,
    ) -> anyhow::Result<(AgentProcess, AgentPipes)> {
        let url = profile.url.clone().unwrap_or_default();
        let link = super::remote::connect(profile, max_line_bytes, profile.startup_timeout)
            .await
            .with_context(|| format!("cannot reach agent {:?} at {url}", profile.name))?;
        Ok((
            AgentProcess {
                kind: Kind::Remote(RemoteAgent {
                    control: link.control,
                    url,
                    ended: None,
                }),
                stderr_tail: StderrTail::new(STDERR_TAIL_LINES),
                stderr_task: None,
            },
            AgentPipes {
                stdin: Box::new(link.input),
                stdout: Box::new(link.output),
                output_from: 0,
                first_request_id: 0,
                shim: None,
            },
        ))
    }

    /// Reattaches to the shim at `socket` (started by an earlier gateway,
    /// whose pid and start time are `shim`), its output from `from`.
    pub async fn reattach(
        socket: &Path,
        from: u64,
        shim: Option<(i32, u64)>,
        conversation_id: Uuid,
        agent_name: &str,
    ) -> anyhow::Result<(AgentProcess, AgentPipes)> {
        Self::over_shim(
            socket,
            |hello| from.max(hello.held_from),
            None,
            shim,
            conversation_id,
            agent_name,
        )
        .await
    }

    /// The agent under the shim at `socket` (`process`, where this gateway
    /// started it, whose pid and start time are `identity`), attached at
    /// the offset `from` picks.
    async fn over_shim(
        socket: &Path,
        from: impl FnOnce(&crate::shim::protocol::Hello) -> u64,
        process: Option<Supervised>,
        identity: Option<(i32, u64)>,
        conversation_id: Uuid,
        agent_name: &str,
    ) -> anyhow::Result<(AgentProcess, AgentPipes)> {
        let (stderr_tx, mut stderr_rx) = mpsc::channel::<Vec<u8>>(64);
        let mut output_from = 0;
        let attached = link::attach(
            socket,
            |hello| {
                output_from = from(hello);
                output_from
            },
            stderr_tx,
        )
        .await;
        let link = match attached {
            Ok(link) => link,
            Err(e) => {
                if let Some(mut process) = process {
                    process.kill();
                    process.wait().await;
                }
                anyhow::bail!("cannot reach the agent's shim: {e}");
            }
        };
        let agent = (link.hello.pid, link.hello.start_time);
        // The stderr chunks the shim passes on, read as the pipe of an
        // agent of our own would be.
        let chunks = futures::stream::poll_fn(move |cx| {
            stderr_rx
                .poll_recv(cx)
                .map(|chunk| chunk.map(|c| Ok::<_, std::io::Error>(std::io::Cursor::new(c))))
        });
        let stderr_tail = StderrTail::new(STDERR_TAIL_LINES);
        let stderr_task = read_stderr(
            tokio_util::io::StreamReader::new(chunks),
            stderr_tail.clone(),
            conversation_id,
            agent_name,
        );
        let first_request_id = link.hello.input_taken;
        let control = link.control.clone();
        Ok((
            AgentProcess {
                kind: Kind::Shim(ShimAgent {
                    process,
                    identity,
                    agent,
                    control: control.clone(),
                    exit: None,
                }),
                stderr_tail,
                stderr_task: Some(stderr_task),
            },
            AgentPipes {
                stdin: Box::new(link.input),
                stdout: Box::new(link.output),
                output_from,
                first_request_id,
                shim: Some(control),
            },
        ))
    }

    /// Its pid (also its process group id) and start time, which together
    /// tell it from a later process with the same pid; `None` without `/proc`.
    /// Under a shim, the shim's.
    pub fn identity(&self) -> Option<(i32, u64)> {
        match &self.kind {
            Kind::Child(process) => process.identity(),
            Kind::Shim(shim) => shim.identity,
            Kind::Remote(_) => None,
        }
    }

    /// The agent's own pid and start time (under a shim, not the shim's).
    pub fn agent_identity(&self) -> (i32, Option<u64>) {
        match &self.kind {
            Kind::Child(process) => (process.pid(), process.identity().map(|(_, t)| t)),
            Kind::Shim(shim) => shim.agent,
            Kind::Remote(_) => (0, None),
        }
    }

    /// Whether it runs under a shim.
    pub fn is_shimmed(&self) -> bool {
        matches!(self.kind, Kind::Shim(_))
    }

    /// Whether it is a remote agent whose connection was lost (not closed
    /// in order): the agent may still hold its session, and its requests.
    pub fn connection_lost(&self) -> bool {
        matches!(
            &self.kind,
            Kind::Remote(RemoteAgent {
                ended: Some((_, Ended::Lost(_))),
                ..
            })
        )
    }

    /// How the agent ended (`status`, as [`AgentProcess::wait`] returned
    /// it), for people: with its last stderr lines; for a remote agent, how
    /// its connection ended.
    pub fn describe_end(&self, status: ExitStatus) -> String {
        match &self.kind {
            Kind::Remote(RemoteAgent {
                url,
                ended: Some((_, how)),
                ..
            }) => format!("the connection to the remote agent at {url} was {how}"),
            _ => describe_exit(status, &self.stderr_tail()),
        }
    }

    /// The last lines the agent wrote to stderr, joined by newlines.
    pub fn stderr_tail(&self) -> String {
        self.stderr_tail.text()
    }

    /// Resolves when the agent exits (cancel-safe; returns at once
    /// afterwards), see [`Supervised::wait`]. Under a shim: when the shim
    /// says so (the agent's stderr as the shim kept it), or when the shim
    /// is lost (what is left of both is killed then).
    pub async fn wait(&mut self) -> ExitStatus {
        match &mut self.kind {
            Kind::Child(process) => process.wait().await,
            Kind::Remote(remote) => {
                if let Some((status, _)) = &remote.ended {
                    return *status;
                }
                let how = remote.control.ended().await;
                remote.settle(how)
            }
            Kind::Shim(shim) => {
                if let Some(status) = shim.exit {
                    return status;
                }
                let status = match shim.control.ended().await {
                    Ending::Exited(exit) => {
                        if !exit.stderr_tail.is_empty() {
                            self.stderr_tail
                                .replace(exit.stderr_tail.lines().map(|line| {
                                    truncate(&plain_text(line.as_bytes()), STDERR_LINE_MAX)
                                }));
                        }
                        match (exit.code, exit.signal) {
                            (Some(code), _) => ExitStatus::from_raw((code & 0xff) << 8),
                            (None, Some(signal)) => ExitStatus::from_raw(signal & 0x7f),
                            _ => ExitStatus::from_raw(0),
                        }
                    }
                    Ending::Lost(why) => {
                        tracing::warn!(reason = %why, "the agent's shim went away; killing what is left");
                        shim.kill_all();
                        ExitStatus::from_raw(libc::SIGKILL)
                    }
                };
                // The shim itself ends once everything is committed (see
                // `release`).
                shim.exit = Some(status);
                status
            }
        }
    }

    /// Waits until the stderr reader has seen everything (bounded: a child
    /// of the agent may still hold the pipe open).
    pub async fn drain_stderr(&mut self) {
        if let Some(task) = self.stderr_task.take() {
            let _ = tokio::time::timeout(Duration::from_millis(500), task).await;
        }
    }

    /// Stops the agent: SIGTERM to it, its group and everything below it;
    /// after `grace`, the whole tree is killed. Under a shim, the shim does
    /// that and ends. A remote agent's connection is closed (a close frame,
    /// or a Streamable HTTP `DELETE`; its answer awaited briefly).
    pub async fn terminate(&mut self, grace: Duration) -> ExitStatus {
        let status = match &mut self.kind {
            Kind::Child(process) => process.terminate(grace).await,
            Kind::Shim(shim) => {
                if shim.exit.is_none() {
                    shim.control.stop(grace);
                    let ended =
                        tokio::time::timeout(grace + SHIM_STOP_MARGIN, shim.control.ended());
                    if ended.await.is_err() {
                        tracing::warn!("the agent's shim did not stop it in time; killing both");
                        shim.kill_all();
                    }
                }
                self.wait().await
            }
            Kind::Remote(remote) => match &remote.ended {
                Some((status, _)) => *status,
                None => {
                    let how = remote.control.close().await;
                    remote.settle(how)
                }
            },
        };
        self.drain_stderr().await;
        status
    }

    /// The agent has ended and what it said is committed: its shim (if it
    /// has one) may end too.
    pub async fn release(&mut self) {
        if let Kind::Shim(shim) = &mut self.kind {
            shim.control.stop(Duration::ZERO);
            if let Some(process) = &mut shim.process {
                if tokio::time::timeout(SHIM_STOP_MARGIN, process.wait())
                    .await
                    .is_err()
                {
                    process.kill();
                    process.wait().await;
                }
            }
        }
    }

    /// Leaves an agent under a shim running for the next gateway (ours is
    /// going away); an agent of our own, or a remote agent's connection, is
    /// stopped as by [`AgentProcess::terminate`].
    pub async fn detach(mut self, grace: Duration) {
        match self.kind {
            Kind::Shim(ShimAgent {
                process: Some(process),
                ..
            }) => process.detach(),
            Kind::Shim(_) => {}
            Kind::Child(_) | Kind::Remote(_) => {
                self.terminate(grace).await;
            }
        }
    }
}

impl RemoteAgent {
    /// Keeps how its connection ended; what [`AgentProcess::wait`] says of
    /// it: success when it was closed in order, code 1 when it was lost.
    fn settle(&mut self, how: Ended) -> ExitStatus {
        let status = match how {
            Ended::Closed(_) => ExitStatus::from_raw(0),
            Ended::Lost(_) => ExitStatus::from_raw(1 << 8),
        };
        self.ended = Some((status, how));
        status
    }
}

impl ShimAgent {
    /// Kills the shim and the agent with everything below them.
    fn kill_all(&self) {
        if let Some(process) = &self.process {
            process.kill();
        } else if let Some((pid, start_time)) = self.identity {
            let _ = crate::process::procs::kill_leftovers(pid, start_time);
        }
        if let (pid, Some(start_time)) = self.agent {
            if pid > 0 {
                let _ = crate::process::procs::kill_leftovers(pid, start_time);
            }
        }
    }
}

/// Tells the shim at `socket` to stop its agent (SIGTERM, SIGKILL after
/// `grace`) and waits for the agent's end (bounded); an error when the
/// shim cannot be reached.
pub async fn stop_shim(socket: &Path, grace: Duration) -> anyhow::Result<()> {
    let (stderr, _) = mpsc::channel(1);
    let link = link::attach(socket, |hello| hello.read_to, stderr).await?;
    link.control.stop(grace);
    // What it still says is of no one's interest now.
    drop(link.output);
    let _ = tokio::time::timeout(grace + SHIM_STOP_MARGIN, link.control.ended()).await;
    Ok(())
}

/// How far a conversation has dealt with its agent's output under a shim,
/// and telling the shim once that is committed: what its session task
/// needs (it gives the position to the journal before a commit, and
/// acknowledges what the commit took).
pub struct Cursor {
    peer: RpcPeer,
    control: ShimControl,
}

impl Cursor {
    pub fn new(peer: RpcPeer, control: ShimControl) -> Cursor {
        Cursor { peer, control }
    }

    /// Everything before this is dealt with.
    pub fn position(&self) -> Processed {
        self.peer.processed()
    }

    /// Resolves when the output may have been dealt with further without
    /// anything handed on to the session (see [`RpcPeer::moved_on`]).
    pub async fn moved_on(&self) {
        self.peer.moved_on().await
    }

    /// Everything before `to` is committed: the shim may forget it.
    pub fn committed(&self, to: u64) {
        self.control.acknowledge(to);
    }
}

fn read_stderr(
    stderr: impl AsyncRead + Unpin + Send + 'static,
    tail: StderrTail,
    conversation_id: Uuid,
    agent: &str,
) -> JoinHandle<()> {
    let agent = agent.to_owned();
    tokio::spawn(async move {
        // Read to the end whatever it writes (invalid UTF-8 included): a
        // full stderr pipe would stall the agent. Most agents say nothing
        // there most of the time: the buffer is held only while they do.
        let mut stderr = super::lazy_buf::LazyBufReader::with_capacity(STDERR_BUFFER, stderr);
        let mut raw = Vec::new();
        while matches!(stderr.read_until(b'\n', &mut raw).await, Ok(n) if n > 0) {
            let line = plain_text(&raw);
            raw.clear();
            tracing::info!(target: "agent_stderr", %conversation_id, agent = %agent, "{line}");
            tail.push(truncate(&line, STDERR_LINE_MAX));
        }
    })
}

/// Describes how an agent ended, with its last stderr lines.
pub fn describe_exit(status: ExitStatus, stderr_tail: &str) -> String {
    let how = match (status.code(), status.signal()) {
        (Some(code), _) => format!("agent exited with code {code}"),
        (None, Some(signal)) => format!("agent was killed by signal {signal}"),
        _ => "agent exited".to_owned(),
    };
    if stderr_tail.is_empty() {
        how
    } else {
        format!("{how}; last stderr lines:\n{stderr_tail}")
    }
}

/// A line of an agent's stderr as text for people: colours and other
/// terminal control sequences (Codex colours its errors) and the line end
/// removed, invalid UTF-8 replaced.
fn plain_text(raw: &[u8]) -> String {
    // Tabs would go with the controls: they become spaces first.
    let spaced: Vec<u8> = raw
        .iter()
        .map(|&b| if b == b'\t' { b' ' } else { b })
        .collect();
    let stripped = strip_ansi_escapes::strip(spaced);
    String::from_utf8_lossy(&stripped)
        .chars()
        .filter(|c| !c.is_control())
        .collect()
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// Waits for a shim just started to say it serves (its agent started), or
/// why not.
async fn shim_ready(
    stdout: tokio::process::ChildStdout,
    process: &mut Supervised,
    name: &str,
) -> anyhow::Result<()> {
    let ready = tokio::time::timeout(SHIM_READY_WITHIN, async {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).await?;
        anyhow::Ok(line)
    });
    let line = match ready.await {
        Ok(Ok(line)) => line,
        Ok(Err(e)) => anyhow::bail!("cannot read the shim's ready line: {e}"),
        Err(_) => anyhow::bail!("the agent's shim did not start in time"),
    };
    // The agent's pid comes again in the shim's hello.
    match serde_json::from_str::<Ready>(line.trim()) {
        Ok(Ready::Serving { .. }) => {}
        Ok(Ready::Failed { error }) => {
            anyhow::bail!("cannot start agent {:?}: {error}", name)
        }
        Err(_) if line.is_empty() => {
            let status = process.wait().await;
            anyhow::bail!("the agent's shim ended at once ({status})")
        }
        Err(e) => anyhow::bail!("the agent's shim said {line:?}: {e}"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stderr_lines_lose_colours_and_control_characters_but_keep_their_text() {
        let codex = b"\x1b[31mERROR\x1b[0m: model \x1b[1mgpt\x1b[0m refused\r\n";
        assert_eq!(plain_text(codex), "ERROR: model gpt refused");
        assert_eq!(plain_text(b"tab\tkept\x07\n"), "tab kept");
        assert_eq!(plain_text(b"bad \xff utf8\n"), "bad \u{FFFD} utf8");
    }
}
