//! Agent processes: started with a clean environment as the root of a
//! process tree (see [`crate::process::spawn`]) so that the agent and everything it
//! started can be killed together; stderr is logged with the conversation
//! id and its last lines kept for error reports.

use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{ChildStdin, ChildStdout, Command};
use tokio::task::JoinHandle;
use uuid::Uuid;

use crate::config::AgentProfile;
use crate::process::child::{StderrTail, Supervised};

/// How many stderr lines are kept for error reports.
const STDERR_TAIL_LINES: usize = 20;
/// Longest stderr line kept (the log gets it whole).
const STDERR_LINE_MAX: usize = 1000;

/// A running agent subprocess.
pub struct AgentProcess {
    /// The agent and what it started.
    process: Supervised,
    stderr_tail: StderrTail,
    stderr_task: Option<JoinHandle<()>>,
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
            .stderr(Stdio::piped());
        if let Some(user) = &user {
            command.uid(user.uid).gid(user.gid);
        }
        let mut process = Supervised::spawn(&mut command).with_context(|| {
            format!(
                "cannot start agent {:?} ({})",
                profile.name, profile.command
            )
        })?;
        let child = process.child_mut();
        let stdin = child.stdin.take().context("agent stdin missing")?;
        let stdout = child.stdout.take().context("agent stdout missing")?;
        let stderr = child.stderr.take().context("agent stderr missing")?;
        let stderr_tail = StderrTail::new(STDERR_TAIL_LINES);
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
                tail.push(truncate(&line, STDERR_LINE_MAX));
            }
        });
        Ok((
            AgentProcess {
                process,
                stderr_tail,
                stderr_task: Some(stderr_task),
            },
            AgentPipes { stdin, stdout },
        ))
    }

    /// Its pid (also its process group id) and start time, which together
    /// tell it from a later process with the same pid; `None` without `/proc`.
    pub fn identity(&self) -> Option<(i32, u64)> {
        self.process.identity()
    }

    /// The last lines the agent wrote to stderr, joined by newlines.
    pub fn stderr_tail(&self) -> String {
        self.stderr_tail.text()
    }

    /// Resolves when the agent exits (cancel-safe; returns at once
    /// afterwards), see [`Supervised::wait`].
    pub async fn wait(&mut self) -> ExitStatus {
        self.process.wait().await
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
        let status = self.process.terminate(grace).await;
        self.drain_stderr().await;
        status
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
