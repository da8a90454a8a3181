//! A child the gateway (or a shim) started as the root of a tree, watched
//! until it exits: waiting for it, stopping it, and never leaving anything
//! of it behind by accident.

use std::process::ExitStatus;
use std::time::Duration;

use tokio::process::{Child, Command};

use super::spawn::Tree;

/// A started child and everything below it.
pub struct Supervised {
    child: Child,
    /// The child and what it started.
    tree: Tree,
    exit: Option<ExitStatus>,
    /// Let go to outlive us: not killed on drop.
    detached: bool,
}

impl Supervised {
    /// Starts `command` as the root of a tree (see [`super::spawn::spawn`]);
    /// its environment, user and pipes are the caller's to set first.
    pub fn spawn(command: &mut Command) -> std::io::Result<Supervised> {
        command.kill_on_drop(true);
        Self::spawn_detachable(command)
    }

    /// [`Supervised::spawn`] for a child that may be let go to outlive us
    /// ([`Supervised::detach`]: a shim); until then it is killed on drop
    /// like any other.
    pub fn spawn_detachable(command: &mut Command) -> std::io::Result<Supervised> {
        let (child, tree) = super::spawn::spawn(command)?;
        Ok(Supervised {
            child,
            tree,
            exit: None,
            detached: false,
        })
    }

    /// Lets it go on without us (spawned with
    /// [`Supervised::spawn_detachable`]): nothing of it is killed.
    pub fn detach(mut self) {
        self.detached = true;
    }

    /// The child itself (to take its pipes).
    pub fn child_mut(&mut self) -> &mut Child {
        &mut self.child
    }

    /// Its pid (also its process group id) and start time, which together
    /// tell it from a later process with the same pid; `None` without `/proc`.
    pub fn identity(&self) -> Option<(i32, u64)> {
        Some((self.tree.pid(), self.tree.start_time()?))
    }

    /// Its pid (also its process group's).
    pub fn pid(&self) -> i32 {
        self.tree.pid()
    }

    /// How it ended, once it has.
    pub fn exit(&self) -> Option<ExitStatus> {
        self.exit
    }

    /// Resolves when the child exits (cancel-safe; returns at once
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
                tracing::warn!(error = %e, "failed to wait for a child; treating it as gone");
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

    /// Asks it to stop: SIGTERM to it, its group and everything below it;
    /// after `grace`, the whole tree is killed.
    pub async fn terminate(&mut self, grace: Duration) -> ExitStatus {
        if self.exit.is_none() {
            self.ask_to_stop();
            if tokio::time::timeout(grace, self.wait()).await.is_err() {
                self.kill();
            }
        }
        self.wait().await
    }

    /// SIGTERM to it, its group and everything below it (what is found now
    /// is still found once it has gone); [`Supervised::wait`] tells when it
    /// has.
    pub fn ask_to_stop(&self) {
        if self.exit.is_none() {
            self.tree.remember();
            self.tree.signal(libc::SIGTERM);
        }
    }

    /// Kills it and everything below it.
    pub fn kill(&self) {
        if self.exit.is_none() {
            self.tree.kill();
        }
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        // Nothing outlives its owner by accident.
        if self.exit.is_none() && !self.detached {
            self.tree.kill();
        }
    }
}

/// The last lines a child wrote to stderr, kept for reports of how it ended
/// (shared between the task reading them and whoever reports).
#[derive(Debug, Clone)]
pub struct StderrTail {
    lines: std::sync::Arc<std::sync::Mutex<std::collections::VecDeque<String>>>,
    max: usize,
}

impl StderrTail {
    /// Keeps the last `max` lines.
    pub fn new(max: usize) -> StderrTail {
        StderrTail {
            lines: Default::default(),
            max,
        }
    }

    /// One more line; the oldest goes once `max` are kept.
    pub fn push(&self, line: String) {
        let mut lines = self.lines.lock().unwrap_or_else(|e| e.into_inner());
        if lines.len() == self.max {
            lines.pop_front();
        }
        lines.push_back(line);
    }

    /// Replaces the lines kept with `lines` (a fuller account from
    /// elsewhere: a shim's), the last `max` of them.
    pub fn replace(&self, new: impl IntoIterator<Item = String>) {
        let mut lines = self.lines.lock().unwrap_or_else(|e| e.into_inner());
        lines.clear();
        for line in new {
            if lines.len() == self.max {
                lines.pop_front();
            }
            lines.push_back(line);
        }
    }

    /// The lines kept, joined by newlines.
    pub fn text(&self) -> String {
        let lines = self.lines.lock().unwrap_or_else(|e| e.into_inner());
        lines.iter().cloned().collect::<Vec<_>>().join("\n")
    }
}
