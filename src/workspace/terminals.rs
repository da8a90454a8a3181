//! `terminal/*`: commands the gateway runs for the agent, in the workspace,
//! as the agent's user, with the agent's environment (plus the request's
//! `env`), each the root of a process tree of its own (see [`crate::process::spawn`]).
//!
//! A terminal's output is kept (the last `outputByteLimit` bytes, cut at a
//! character boundary from the start, as ACP asks) and each piece is also
//! handed out as a [`TerminalOutput`] for the session to publish. A
//! terminal's command is killed with everything it started when the
//! terminal is killed or released, and when the [`Terminals`] of a
//! conversation are dropped (the session ended). When the command ends by
//! itself, what it left running goes at once (its process group here; the
//! rest is an orphan of the gateway's process, which kills it): its end is
//! published then, even if something it started still held its output's
//! pipes (they are read for at most [`PIPES_AFTER_EXIT`] more).

use std::collections::HashMap;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_client_protocol_schema::v1 as acp;
use serde_json::{json, Value};
use tokio::io::AsyncReadExt;
use tokio::sync::{mpsc, watch};

use super::{Refusal, Workspace};
pub use crate::model::TerminalOutput;
use crate::process::spawn::{Environment, Tree};

/// Most output a terminal keeps, whatever `outputByteLimit` asks.
pub const MAX_OUTPUT_BYTES: usize = 4 * 1024 * 1024;
/// Most terminals a conversation has at once (released ones not counted).
pub const MAX_TERMINALS: usize = 32;
/// How long a terminal's pipes are still read once its command has ended:
/// what it wrote last is in them, but a process it left (one that escaped
/// being killed) could hold them open for ever.
pub const PIPES_AFTER_EXIT: Duration = Duration::from_millis(500);

/// What a command to be run is, for the operator's deny policies: an
/// `execute` tool call as an agent would send it.
pub fn as_tool_call(request: &acp::CreateTerminalRequest, cwd: &std::path::Path) -> Value {
    let mut command = vec![request.command.clone()];
    command.extend(request.args.iter().cloned());
    json!({
        "toolCallId": "terminal",
        "title": command.join(" "),
        "kind": "execute",
        "rawInput": {"command": command, "cwd": cwd},
    })
}

/// The kept output of one terminal: up to twice its limit, so the front is
/// cut once per limit's worth of output rather than on every piece.
#[derive(Debug, Default)]
struct Kept {
    text: String,
    truncated: bool,
}

impl Kept {
    /// The last `limit` bytes (from a character boundary), and whether
    /// anything before them was cut.
    fn tail(&self, limit: usize) -> (&str, bool) {
        if self.text.len() <= limit {
            return (&self.text, self.truncated);
        }
        let mut cut = self.text.len() - limit;
        while !self.text.is_char_boundary(cut) {
            cut += 1;
        }
        (&self.text[cut..], true)
    }
}

#[derive(Debug)]
struct Terminal {
    /// The command and what it started (`None` only in tests of keeping).
    tree: Option<Tree>,
    limit: usize,
    kept: Mutex<Kept>,
    /// `Some` once the process has exited.
    exit: watch::Receiver<Option<ExitStatus>>,
}

impl Terminal {
    fn kill(&self) {
        if self.exit.borrow().is_some() {
            return;
        }
        if let Some(tree) = &self.tree {
            tree.kill();
        }
    }

    fn keep(&self, piece: &str) {
        let mut kept = self.kept.lock().unwrap();
        kept.text.push_str(piece);
        if kept.text.len() > self.limit.saturating_mul(2) {
            let cut = kept.text.len() - kept.tail(self.limit).0.len();
            kept.text.drain(..cut);
            kept.truncated = true;
        }
    }
}

/// A conversation's terminals.
#[derive(Debug)]
pub struct Terminals {
    live: Mutex<HashMap<String, Arc<Terminal>>>,
    out: mpsc::Sender<TerminalOutput>,
    /// What every command starts with: its agent's environment.
    environment: Environment,
}

impl Drop for Terminals {
    fn drop(&mut self) {
        self.kill_all();
    }
}

impl Terminals {
    /// Output pieces go to `out`; commands start with `environment` (their
    /// agent's: see [`crate::process::profile::environment`]) and what
    /// their request adds.
    pub fn new(out: mpsc::Sender<TerminalOutput>, environment: Environment) -> Terminals {
        Terminals {
            live: Mutex::new(HashMap::new()),
            out,
            environment,
        }
    }

    /// Kills every terminal's processes (they stay until released).
    pub fn kill_all(&self) {
        for terminal in self.live.lock().unwrap().values() {
            terminal.kill();
        }
    }

    /// Ends when every terminal's command has ended and all its output,
    /// its end included, has been handed out (give the output somewhere to
    /// go meanwhile: it waits for room).
    pub fn ended(&self) -> impl std::future::Future<Output = ()> + use<> {
        let exits: Vec<_> = self
            .live
            .lock()
            .unwrap()
            .values()
            .map(|terminal| terminal.exit.clone())
            .collect();
        async move {
            for mut exit in exits {
                let _ = exit.wait_for(Option::is_some).await;
            }
        }
    }

    fn get(&self, params: &Value) -> Result<Arc<Terminal>, Refusal> {
        let id = params
            .get("terminalId")
            .and_then(Value::as_str)
            .ok_or_else(|| Refusal::invalid("invalid params: terminalId (string) is required"))?;
        self.live
            .lock()
            .unwrap()
            .get(id)
            .cloned()
            .ok_or_else(|| Refusal::not_found(format!("no terminal {id:?}")))
    }

    /// `terminal/create`: starts the command (already checked against the
    /// policies); answers `{terminalId}`.
    pub fn create(
        &self,
        workspace: &Workspace,
        request: &acp::CreateTerminalRequest,
    ) -> Result<Value, Refusal> {
        if self.live.lock().unwrap().len() >= MAX_TERMINALS {
            return Err(Refusal::invalid(format!(
                "this conversation has {MAX_TERMINALS} terminals already; release one first"
            )));
        }
        let cwd = match &request.cwd {
            Some(cwd) => workspace.resolve(cwd)?,
            None => {
                // Stored resolved: a symlink there now leads elsewhere.
                crate::sys::open_dir_without_links(&workspace.cwd)
                    .map_err(|e| Refusal::invalid(e.to_string()))?;
                workspace.cwd.clone()
            }
        };
        let mut command = self.command(workspace, request, &cwd)?;
        let (child, tree) = crate::process::spawn::spawn(&mut command)
            .map_err(|e| Refusal::invalid(format!("cannot run {:?}: {e}", request.command)))?;
        let id = format!("term_{}", uuid::Uuid::now_v7().simple());
        let (exited, exit) = watch::channel(None);
        let limit = request
            .output_byte_limit
            .map_or(MAX_OUTPUT_BYTES, |n| (n as usize).min(MAX_OUTPUT_BYTES));
        let terminal = Arc::new(Terminal {
            tree: Some(tree),
            limit,
            kept: Mutex::default(),
            exit,
        });
        self.live
            .lock()
            .unwrap()
            .insert(id.clone(), terminal.clone());
        let mut shown = vec![request.command.clone()];
        shown.extend(request.args.iter().cloned());
        let first = TerminalOutput {
            terminal_id: id.clone(),
            output: String::new(),
            command: Some(shown),
            cwd: Some(cwd.display().to_string()),
            exit_status: None,
        };
        tokio::spawn(follow(terminal, child, self.out.clone(), first, exited));
        Ok(json!({ "terminalId": id }))
    }

    /// The command `request` asks for, run in `cwd` with the agent's
    /// environment, as the agent's user, with no capability but those its
    /// profile keeps, and in its box.
    fn command(
        &self,
        workspace: &Workspace,
        request: &acp::CreateTerminalRequest,
        cwd: &Path,
    ) -> Result<tokio::process::Command, Refusal> {
        let path = request
            .env
            .iter()
            .find(|v| v.name == "PATH")
            .map(|v| v.value.as_str())
            .or_else(|| crate::process::spawn::path_of(&self.environment));
        let program = if request.command.contains('/') {
            // A path: the terminal's cwd is what a relative one is relative
            // to, and whether it is there and runnable is for its start to
            // say, with the agent's user's rights and in its box (not ours).
            cwd.join(&request.command)
        } else {
            crate::sys::resolve_command(&request.command, path).map_err(|why| {
                Refusal::invalid(format!("cannot run {:?}: {why}", request.command))
            })?
        };
        let mut command = tokio::process::Command::new(program);
        command
            .args(&request.args)
            .env_clear()
            .envs(&self.environment)
            .envs(request.env.iter().map(|v| (&v.name, &v.value)))
            .current_dir(cwd)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let user = workspace
            .user
            .as_ref()
            .filter(|_| crate::sys::running_as_root());
        crate::sandbox::capabilities::Shedding::new(workspace.capabilities, user, Some(cwd))
            .map_err(|e| Refusal::invalid(format!("cannot run {:?}: {e}", request.command)))?
            .on_child(&mut command);
        if let Some(rules) = &workspace.sandbox {
            crate::sandbox::landlock::Prepared::new(rules)
                .map_err(|e| Refusal::invalid(format!("cannot box {:?}: {e}", request.command)))?
                .confine_child(&mut command);
        }
        Ok(command)
    }

    /// `terminal/output`: what is kept, and how it ended if it has.
    pub fn output(&self, params: &Value) -> Result<Value, Refusal> {
        let terminal = self.get(params)?;
        let kept = terminal.kept.lock().unwrap();
        let (output, truncated) = kept.tail(terminal.limit);
        let mut answer = json!({"output": output, "truncated": truncated});
        if let Some(status) = *terminal.exit.borrow() {
            answer["exitStatus"] = exit_status(status);
        }
        Ok(answer)
    }

    /// `terminal/wait_for_exit`: waits (elsewhere than the session loop)
    /// for the command to end.
    pub fn waiter(
        &self,
        params: &Value,
    ) -> Result<impl std::future::Future<Output = Result<Value, Refusal>> + use<>, Refusal> {
        let mut exit = self.get(params)?.exit.clone();
        Ok(async move {
            let status = *exit
                .wait_for(Option::is_some)
                .await
                .map_err(|_| Refusal::not_found("the terminal went away"))?;
            Ok(exit_status(status.expect("waited for")))
        })
    }

    /// `terminal/kill`: kills the command; the terminal stays until released.
    pub fn kill(&self, params: &Value) -> Result<Value, Refusal> {
        self.get(params)?.kill();
        Ok(json!({}))
    }

    /// `terminal/release`: kills the command if it still runs and forgets
    /// the terminal.
    pub fn release(&self, params: &Value) -> Result<Value, Refusal> {
        let terminal = self.get(params)?;
        terminal.kill();
        let id = params["terminalId"].as_str().unwrap_or_default();
        self.live.lock().unwrap().remove(id);
        Ok(json!({}))
    }
}

type Reader = Box<dyn tokio::io::AsyncRead + Unpin + Send>;

fn box_reader(reader: impl tokio::io::AsyncRead + Unpin + Send + 'static) -> Reader {
    Box::new(reader)
}

/// Reads a pipe to its end as text, never splitting a character (invalid
/// bytes become U+FFFD).
async fn read_text(mut reader: Reader, pieces: mpsc::Sender<String>) {
    let mut buf = vec![0u8; 8192];
    let mut held: Vec<u8> = Vec::new();
    loop {
        let n = match reader.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        held.extend_from_slice(&buf[..n]);
        // An incomplete character at the end waits for the next read.
        let complete = match std::str::from_utf8(&held) {
            Ok(_) => held.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => held.len(),
        };
        let text = String::from_utf8_lossy(&held[..complete]).into_owned();
        held.drain(..complete);
        if !text.is_empty() && pieces.send(text).await.is_err() {
            return;
        }
    }
    if !held.is_empty() {
        let _ = pieces
            .send(String::from_utf8_lossy(&held).into_owned())
            .await;
    }
}

/// ACP's `TerminalExitStatus`.
fn exit_status(status: ExitStatus) -> Value {
    json!({
        "exitCode": status.code(),
        "signal": status.signal().map(signal_name),
    })
}

fn signal_name(signal: i32) -> String {
    let name = match signal {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGABRT => "SIGABRT",
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        other => return format!("signal {other}"),
    };
    name.to_owned()
}

/// Hands out a started terminal's output as it comes (`first` before it),
/// then, once its command has ended and its pipes are drained, its exit.
async fn follow(
    terminal: Arc<Terminal>,
    mut child: tokio::process::Child,
    out: mpsc::Sender<TerminalOutput>,
    first: TerminalOutput,
    exited: watch::Sender<Option<ExitStatus>>,
) {
    let terminal_id = first.terminal_id.clone();
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let _ = out.send(first).await;
    let piece = |output: String| TerminalOutput {
        terminal_id: terminal_id.clone(),
        output,
        command: None,
        cwd: None,
        exit_status: None,
    };
    let (tx, mut pieces) = mpsc::channel::<String>(16);
    let readers = [stdout.map(box_reader), stderr.map(box_reader)];
    let readers: Vec<_> = readers
        .into_iter()
        .flatten()
        .map(|reader| tokio::spawn(read_text(reader, tx.clone())))
        .collect();
    drop(tx);
    let tree = terminal
        .tree
        .as_ref()
        .expect("a running terminal has its tree");
    let watched = tree.watches_exit();
    let mut reaped = None;
    let mut open = true;
    loop {
        tokio::select! {
            text = pieces.recv(), if open => match text {
                Some(text) => {
                    terminal.keep(&text);
                    let _ = out.send(piece(text)).await;
                }
                None => open = false,
            },
            () = tree.exited(), if watched => break,
            status = child.wait(), if !watched => {
                reaped = Some(status);
                break;
            }
        }
    }
    // Ended: what it left running goes with it now, while its group
    // is still its own (not reaped yet).
    tree.kill_left();
    // What it wrote last is still in the pipes; whatever it left
    // that escaped must not hold its end back.
    let deadline = tokio::time::Instant::now() + PIPES_AFTER_EXIT;
    loop {
        let text = match tokio::time::timeout_at(deadline, pieces.recv()).await {
            Ok(Some(text)) => text,
            Ok(None) => break,
            Err(_) => {
                tracing::debug!("a terminal's pipes stayed open after its command ended");
                for reader in &readers {
                    reader.abort();
                }
                match pieces.try_recv() {
                    Ok(text) => text,
                    Err(_) => break,
                }
            }
        };
        terminal.keep(&text);
        let _ = out.send(piece(text)).await;
    }
    for reader in readers {
        reader.abort();
    }
    let status = match reaped {
        Some(status) => status,
        None => child.wait().await,
    };
    tree.reaped();
    let status = status.unwrap_or_else(|_| ExitStatus::from_raw(1 << 8));
    // Handed out before the exit is known, so whoever waits for the
    // exit finds every piece of output already handed out.
    let _ = out
        .send(TerminalOutput {
            exit_status: Some(exit_status(status)),
            ..piece(String::new())
        })
        .await;
    let _ = exited.send(Some(status));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_output_is_cut_from_the_start_at_a_character_boundary() {
        let (exit_tx, exit) = watch::channel(None);
        drop(exit_tx);
        let terminal = Terminal {
            tree: None,
            limit: 5,
            kept: Mutex::default(),
            exit,
        };
        terminal.keep("ab");
        assert_eq!(terminal.kept.lock().unwrap().tail(5), ("ab", false));
        terminal.keep("cé€");
        // "abcé€" is 1+1+1+2+3 = 8 bytes; the last 5 are "é€".
        assert_eq!(terminal.kept.lock().unwrap().tail(5), ("é€", true));
        // Past twice the limit the front is dropped; what is shown is the same.
        terminal.keep("defgh");
        let kept = terminal.kept.lock().unwrap();
        assert!(kept.text.len() <= 10, "{:?}", kept.text);
        assert_eq!(kept.tail(5), ("defgh", true));
    }
}

#[cfg(test)]
mod running {
    use super::*;

    fn workspace_in(cwd: std::path::PathBuf, user: Option<crate::sys::SystemUser>) -> Workspace {
        Workspace {
            cwd,
            allowed_roots: Vec::new(),
            user,
            files: false,
            terminals: true,
            sandbox: None,
            capabilities: Default::default(),
        }
    }

    /// An agent's environment with no profile settings.
    fn environment(user: Option<&crate::sys::SystemUser>) -> Environment {
        crate::process::spawn::environment(&Default::default(), &[], user)
    }

    fn request(command: &str, args: &[&str]) -> acp::CreateTerminalRequest {
        serde_json::from_value(json!({"sessionId": "s", "command": command, "args": args})).unwrap()
    }

    async fn finished(terminals: &Terminals, id: &Value) -> Value {
        let params = json!({ "terminalId": id });
        let exit = terminals.waiter(&params).unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(30), exit)
            .await
            .expect("the command ends")
            .unwrap();
        terminals.output(&params).unwrap()
    }

    #[tokio::test]
    async fn a_conversation_has_at_most_so_many_terminals_and_released_ones_do_not_count() {
        let dir = tempfile::tempdir().unwrap();
        let workspace = workspace_in(dir.path().to_path_buf(), None);
        let (out, _output) = mpsc::channel(4096);
        let terminals = Terminals::new(out, environment(None));
        let sleep = request("sleep", &["300"]);
        let mut ids = Vec::new();
        for _ in 0..MAX_TERMINALS {
            ids.push(terminals.create(&workspace, &sleep).unwrap()["terminalId"].clone());
        }
        let refused = terminals.create(&workspace, &sleep).unwrap_err();
        assert_eq!(refused.code, super::super::INVALID_PARAMS);
        assert!(refused.message.contains("release one first"), "{refused:?}");

        let first = json!({ "terminalId": ids[0] });
        terminals.release(&first).unwrap();
        assert_eq!(
            terminals.output(&first).unwrap_err().code,
            super::super::NOT_FOUND
        );
        let again = terminals.create(&workspace, &sleep).unwrap()["terminalId"].clone();
        // Dropping the conversation's terminals kills what still runs.
        let last = json!({ "terminalId": again });
        let exit = terminals.waiter(&last).unwrap();
        drop(terminals);
        let status = tokio::time::timeout(std::time::Duration::from_secs(30), exit)
            .await
            .expect("the command is killed")
            .unwrap();
        assert_eq!(status["signal"], "SIGKILL", "{status}");
    }

    /// A command given as a path is the agent's to find: a relative one is
    /// relative to the terminal's cwd, and one its user cannot reach is
    /// refused as one that is not there is (nothing is looked up with the
    /// gateway's rights; as `nobody` only where the gateway is root).
    #[tokio::test]
    async fn a_command_path_is_found_as_the_agent_would_find_it() {
        use std::os::unix::fs::PermissionsExt;
        let mode = |path: &std::path::Path, mode: u32| {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap()
        };
        let dir = tempfile::tempdir().unwrap();
        let cwd = dir.path().canonicalize().unwrap();
        mode(&cwd, 0o755);
        std::fs::write(cwd.join("script.sh"), "#!/bin/sh\necho here\n").unwrap();
        mode(&cwd.join("script.sh"), 0o755);
        let (out, _output) = mpsc::channel(4096);
        let terminals = Terminals::new(out, environment(None));
        let workspace = workspace_in(cwd.clone(), None);
        let id = terminals
            .create(&workspace, &request("./script.sh", &[]))
            .unwrap()["terminalId"]
            .clone();
        assert_eq!(finished(&terminals, &id).await["output"], "here\n");

        let Some(nobody) = crate::sys::nobody_if_root() else {
            return;
        };
        let private = tempfile::tempdir().unwrap();
        let tool = private.path().join("tool");
        std::fs::copy(cwd.join("script.sh"), &tool).unwrap();
        mode(private.path(), 0o700);
        let terminals = Terminals::new(mpsc::channel(4096).0, environment(Some(&nobody)));
        let workspace = workspace_in(cwd, Some(nobody.clone()));
        let refusal = |command: &std::path::Path| {
            let refused = terminals
                .create(&workspace, &request(command.to_str().unwrap(), &[]))
                .unwrap_err();
            refused
                .message
                .replace(command.to_str().unwrap(), "<command>")
        };
        let there = refusal(&tool);
        assert!(there.contains("Permission denied"), "{there}");
        assert_eq!(there, refusal(&private.path().join("missing")));
    }

    /// A terminal's command runs as the agent's user, with its home (only
    /// where the gateway is root and the system has `nobody`).
    #[tokio::test]
    async fn commands_run_as_the_agents_user() {
        let Some(nobody) = crate::sys::nobody_if_root() else {
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let workspace = workspace_in(dir.path().to_path_buf(), Some(nobody.clone()));
        let (out, _output) = mpsc::channel(4096);
        let terminals = Terminals::new(out, environment(Some(&nobody)));
        let id = terminals
            .create(
                &workspace,
                &request("sh", &["-c", "id -u; id -g; echo $HOME"]),
            )
            .unwrap()["terminalId"]
            .clone();
        let output = finished(&terminals, &id).await;
        assert_eq!(
            output["output"],
            format!("{}\n{}\n{}\n", nobody.uid, nobody.gid, nobody.home),
            "{output}"
        );
        assert_eq!(output["exitStatus"]["exitCode"], 0);

        // Without a user to be, it runs as the gateway does.
        let workspace = workspace_in(dir.path().to_path_buf(), None);
        let id = terminals
            .create(&workspace, &request("id", &["-u"]))
            .unwrap()["terminalId"]
            .clone();
        assert_eq!(finished(&terminals, &id).await["output"], "0\n");
    }
}
