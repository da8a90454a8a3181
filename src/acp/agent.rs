//! Agent processes: started with a clean environment as the root of a
//! process tree (see [`crate::process::spawn`]) so that the agent and everything it
//! started can be killed together; stderr is logged with the conversation
//! id and its last lines kept for error reports.

use std::collections::VecDeque;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::task::JoinHandle;
use uuid::Uuid;

use crate::config::AgentProfile;
use crate::process::spawn::Tree;

/// How many stderr lines are kept for error reports.
const STDERR_TAIL_LINES: usize = 20;
/// Longest stderr line kept (the log gets it whole).
const STDERR_LINE_MAX: usize = 1000;

/// A running agent subprocess.
pub struct AgentProcess {
    child: Child,
    /// The agent and what it started.
    tree: Tree,
    stderr_tail: Arc<Mutex<VecDeque<String>>>,
    stderr_task: Option<JoinHandle<()>>,
    exit: Option<ExitStatus>,
}

/// The pipes of a freshly spawned agent.
pub struct AgentPipes {
    pub stdin: ChildStdin,
    pub stdout: ChildStdout,
}

impl AgentProcess {
    /// Starts the profile's command in `cwd`, as the profile's user, with
    /// the profile's environment (see [`AgentProfile::environment`]).
    pub fn spawn(
        profile: &AgentProfile,
        cwd: &Path,
        conversation_id: Uuid,
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
        let environment = profile.environment(user.as_ref());
        let path = crate::process::spawn::path_of(&environment);
        let cannot_start =
            |reason: String| anyhow::anyhow!("cannot start agent {:?}: {reason}", profile.name);
        let program = crate::sys::resolve_command(&profile.command, path).map_err(cannot_start)?;
        // What `GET /api/v1/agents` predicts, said before the kernel says
        // only "Permission denied".
        crate::sys::runnable_by(&program, user.as_ref(), path).map_err(cannot_start)?;
        let mut command = Command::new(program);
        command
            .args(&profile.args)
            .env_clear()
            .envs(&environment)
            .current_dir(cwd)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Some(user) = &user {
            command.uid(user.uid).gid(user.gid);
        }
        let (mut child, tree) = crate::process::spawn::spawn(&mut command).with_context(|| {
            format!(
                "cannot start agent {:?} ({})",
                profile.name, profile.command
            )
        })?;
        let stdin = child.stdin.take().context("agent stdin missing")?;
        let stdout = child.stdout.take().context("agent stdout missing")?;
        let stderr = child.stderr.take().context("agent stderr missing")?;
        let stderr_tail = Arc::new(Mutex::new(VecDeque::new()));
        let tail = stderr_tail.clone();
        let agent = profile.name.clone();
        let stderr_task = tokio::spawn(async move {
            // Read to the end whatever it writes (invalid UTF-8 included): a
            // full stderr pipe would stall the agent.
            let mut stderr = BufReader::new(stderr);
            let mut raw = Vec::new();
            while matches!(stderr.read_until(b'\n', &mut raw).await, Ok(n) if n > 0) {
                let line = plain_text(&raw);
                raw.clear();
                tracing::info!(target: "agent_stderr", %conversation_id, agent = %agent, "{line}");
                let mut tail = tail.lock().unwrap();
                if tail.len() == STDERR_TAIL_LINES {
                    tail.pop_front();
                }
                tail.push_back(truncate(&line, STDERR_LINE_MAX));
            }
        });
        Ok((
            AgentProcess {
                child,
                tree,
                stderr_tail,
                stderr_task: Some(stderr_task),
                exit: None,
            },
            AgentPipes { stdin, stdout },
        ))
    }

    /// Its pid (also its process group id) and start time, which together
    /// tell it from a later process with the same pid; `None` without `/proc`.
    pub fn identity(&self) -> Option<(i32, u64)> {
        Some((self.tree.pid(), self.tree.start_time()?))
    }

    /// The last lines the agent wrote to stderr, joined by newlines.
    pub fn stderr_tail(&self) -> String {
        let tail = self.stderr_tail.lock().unwrap();
        tail.iter().cloned().collect::<Vec<_>>().join("\n")
    }

    /// Resolves when the agent exits (cancel-safe; returns at once
    /// afterwards). What it leaves behind in its group, and what was below
    /// it when it was asked to stop, goes with it.
    pub async fn wait(&mut self) -> ExitStatus {
        if let Some(status) = self.exit {
            return status;
        }
        let watched = self.tree.watches_exit();
        if watched {
            self.tree.exited().await;
            // Before it is reaped: its group is still its own.
            self.tree.kill_left();
        }
        let status = match self.child.wait().await {
            Ok(status) => status,
            Err(e) => {
                tracing::warn!(error = %e, "failed to wait for agent; treating it as gone");
                std::os::unix::process::ExitStatusExt::from_raw(-1)
            }
        };
        if !watched {
            // Without pidfds (before Linux 5.3): right after, as closely as
            // can be.
            self.tree.kill_left();
        }
        self.tree.reaped();
        self.exit = Some(status);
        status
    }

    /// Waits until the stderr reader has seen everything (bounded: a child
    /// of the agent may still hold the pipe open).
    pub async fn drain_stderr(&mut self) {
        if let Some(task) = self.stderr_task.take() {
            let _ = tokio::time::timeout(Duration::from_millis(500), task).await;
        }
    }

    /// Stops the agent: SIGTERM to it, its group and everything below it;
    /// after `grace`, the whole tree is killed.
    pub async fn terminate(&mut self, grace: Duration) -> ExitStatus {
        if self.exit.is_none() {
            // Found now, they are still found once the agent has gone.
            self.tree.remember();
            self.tree.signal(libc::SIGTERM);
            if tokio::time::timeout(grace, self.wait()).await.is_err() {
                self.tree.kill();
            }
        }
        let status = self.wait().await;
        self.drain_stderr().await;
        status
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        // Nothing outlives its conversation by accident.
        if self.exit.is_none() {
            self.tree.kill();
        }
    }
}

/// Describes how an agent ended, with its last stderr lines.
pub fn describe_exit(status: ExitStatus, stderr_tail: &str) -> String {
    use std::os::unix::process::ExitStatusExt;
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
