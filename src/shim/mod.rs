//! `acp-gateway shim`: the small supervisor each agent runs under, so that
//! the agent and its turn outlive the gateway (as containerd-shim and conmon
//! let containers outlive their daemons).
//!
//! The gateway starts the shim (as the agent's user, in the agent's
//! directory, with the agent's environment); the shim starts the agent, owns
//! its stdin, stdout, stderr and process tree, and serves the gateway on a
//! Unix socket (mode 0600, each peer's uid checked with `SO_PEERCRED`, and
//! a connection counts only once it has shown the key in the file beside
//! the socket, which no agent's box reaches: see [`key_of`]) with the
//! [`protocol`]. The shim starts with no capabilities but those the agent
//! keeps (`--capabilities`), and drops them again for the agent between
//! fork and exec. Where the conversation has a box (`--sandbox`), the shim
//! confines the agent to it there too; the shim itself stays
//! outside it (it keeps its socket, and reaps what the agent leaves). It keeps what the agent writes until a gateway
//! acknowledges it ([`held`]), at most `--buffer` bytes: when that is full
//! it stops reading, so the agent waits and nothing is dropped. A gateway
//! that goes away (crash, deploy) leaves the shim and its agent running; the
//! next one connects, says from where it wants the output, and carries on.
//!
//! The shim ends when its agent has ended and a gateway has acknowledged all
//! of its output, or when a gateway tells it to stop the agent. It has no
//! database, no HTTP and no configuration file: what it needs is on its
//! command line. Its first line on stdout says it is ready (with the agent's
//! pid) or why it could not start; it writes nothing else there.

mod serve;
pub mod protocol;
pub mod held;

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Stdio;

use serde::{Deserialize, Serialize};

use crate::process::child::Supervised;

/// What a shim needs, from its command line.
#[derive(Debug, Clone, clap::Args)]
pub struct ShimArgs {
    /// Where to serve the gateway (a Unix socket, made with mode 0600).
    #[arg(long)]
    pub socket: PathBuf,
    /// Most bytes of the agent's output held for the gateway.
    #[arg(long, default_value_t = 64 * 1024 * 1024)]
    pub buffer: usize,
    /// The uid the gateway runs as: only it and the shim's own uid may
    /// connect.
    #[arg(long)]
    pub peer_uid: u32,
    /// A file holding the key a gateway must show ([`protocol::ToShim::Auth`])
    /// before the shim serves it: read at start; removed with the socket.
    #[arg(long)]
    pub key_file: Option<PathBuf>,
    /// The agent's box (JSON, see [`crate::sandbox::Rules`]): the agent is
    /// confined by it between fork and exec; the shim itself is not (it
    /// keeps its socket and its reaping).
    #[arg(long)]
    pub sandbox: Option<String>,
    /// The capabilities the agent keeps (comma-separated names); it starts
    /// with no other, as the shim itself does (see
    /// [`crate::sandbox::capabilities`]).
    #[arg(long, value_delimiter = ',')]
    pub capabilities: Vec<String>,
    /// The agent's program and its arguments.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
    pub command: Vec<OsString>,
}

/// The key file beside a shim's socket: what a gateway shows the shim
/// ([`protocol::ToShim::Auth`]). Only the gateway and the shim can read it;
/// no agent's box reaches it.
pub fn key_of(socket: &std::path::Path) -> PathBuf {
    socket.with_extension("key")
}

/// The shim's one line on stdout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Ready {
    /// Serving, with the agent started.
    Serving { pid: i32, start_time: Option<u64> },
    /// It could not start; it has exited.
    Failed { error: String },
}

/// Runs the shim until its agent has ended and been accounted for; the exit
/// code of the process.
pub async fn run(args: ShimArgs) -> u8 {
    let say = |ready: &Ready| {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        // The gateway may already be gone: nothing to do about it then.
        let _ = writeln!(out, "{}", serde_json::to_string(ready).unwrap_or_default());
        let _ = out.flush();
    };
    match start(&args) {
        Ok((listener, agent, key)) => {
            let (pid, start_time) = (agent.pid(), agent.identity().map(|(_, t)| t));
            say(&Ready::Serving { pid, start_time });
            // What the agent's processes leave behind, re-parented to the
            // shim, is killed and reaped as it comes.
            let reaping = tokio_util::sync::CancellationToken::new();
            tokio::spawn(crate::process::spawn::reap_orphans(reaping.clone()));
            let result = serve::serve(listener, agent, args.buffer, args.peer_uid, key).await;
            reaping.cancel();
            let _ = std::fs::remove_file(&args.socket);
            if let Some(file) = &args.key_file {
                let _ = std::fs::remove_file(file);
            }
            match result {
                Ok(()) => 0,
                Err(_) => 1,
            }
        }
        Err(error) => {
            if let Some(file) = &args.key_file {
                let _ = std::fs::remove_file(file);
            }
            say(&Ready::Failed {
                error: format!("{error:#}"),
            });
            1
        }
    }
}

/// Binds the socket (no one but the owner may connect to it), reads the
/// key, and starts the agent.
fn start(
    args: &ShimArgs,
) -> anyhow::Result<(tokio::net::UnixListener, Supervised, Option<Vec<u8>>)> {
    use anyhow::Context;
    let key = match &args.key_file {
        Some(file) => {
            let key = std::fs::read(file)
                .with_context(|| format!("cannot read the key file {}", file.display()))?;
            anyhow::ensure!(
                key.len() >= 16,
                "the key file {} is too short",
                file.display()
            );
            Some(key)
        }
        None => None,
    };
    // What the agent leaves behind goes to the shim, which kills it.
    crate::process::spawn::adopt_orphans().context("cannot adopt the agent's orphans")?;
    let listener = {
        // SAFETY: umask only sets the process's file mode mask; restored at
        // once, before the agent starts (it must not inherit it).
        let previous = unsafe { libc::umask(0o177) };
        let bound = tokio::net::UnixListener::bind(&args.socket);
        unsafe { libc::umask(previous) };
        bound.with_context(|| format!("cannot listen on {}", args.socket.display()))?
    };
    let (program, rest) = args.command.split_first().context("no agent command")?;
    let mut command = tokio::process::Command::new(program);
    command
        .args(rest)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // The gateway started the shim with nothing but what the agent keeps;
    // the agent sheds it again all the same (the shim's own can only be
    // fewer), then goes in its box.
    let kept = crate::sandbox::capabilities::CapSet::parse(&args.capabilities)
        .map_err(|(_, why)| anyhow::anyhow!("invalid --capabilities: {why}"))
        .and_then(|keep| {
            crate::sandbox::capabilities::Shedding::new(keep, None, None)
                .context("cannot drop the agent's capabilities")
        });
    match kept {
        Ok(shedding) => shedding.on_child(&mut command),
        Err(e) => {
            let _ = std::fs::remove_file(&args.socket);
            return Err(e);
        }
    }
    if let Some(rules) = &args.sandbox {
        let boxed = serde_json::from_str::<crate::sandbox::Rules>(rules)
            .context("invalid --sandbox")
            .and_then(|rules| {
                crate::sandbox::landlock::Prepared::new(&rules).context("cannot make its box")
            });
        match boxed {
            Ok(prepared) => prepared.confine_child(&mut command),
            Err(e) => {
                let _ = std::fs::remove_file(&args.socket);
                return Err(e);
            }
        }
    }
    let agent = Supervised::spawn(&mut command).with_context(|| {
        let _ = std::fs::remove_file(&args.socket);
        format!("cannot start {}", program.to_string_lossy())
    })?;
    // The agent has its directory; the shim holds none (nor keeps one
    // from being unmounted or counted as in use).
    let _ = std::env::set_current_dir("/");
    // Processes of its user (other agents among them) can neither read its
    // memory (what it holds of the agent's output) nor trace it.
    if let Err(e) = crate::sys::forbid_inspection() {
        eprintln!("shim: cannot forbid inspection: {e}");
    }
    Ok((listener, agent, key))
}
