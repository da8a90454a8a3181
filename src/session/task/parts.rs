//! What a session task holds, in one part per job, each named after the
//! file that does the job and changes it through that file's methods; other
//! files read it. Two exceptions: the loop (in `task.rs` and, while the
//! session ends, in `ending.rs`) polls what the parts wait on (the agent's
//! inbox, its answer to the prompt, setting changes, deadlines), and
//! `reattached.rs` sets the turn and the waiting requests up as an earlier
//! run left them. What every job uses (the journal, the agent's session and
//! process, the transcript, files and terminals) is the task's own, in
//! `task.rs`.

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::stream::FuturesUnordered;
use serde_json::Value;
use tokio::time::Instant;
use uuid::Uuid;

use crate::acp::client::PromptCall;
use crate::acp::incoming::Incoming;
use crate::acp::rpc::Inbox;
use crate::config::ShutdownPlan;
use crate::error::Result;
use crate::model::{AgentReport, QueuedPrompt};
use crate::permissions::policy::Mode;
use crate::permissions::PolicyHandle;
use crate::session::command::{Reply, Setting};
use crate::session::pending::Pending;
use crate::store::AgentProcessRecord;

/// Why each conversation's agent last went away, for counting restarts by
/// cause (none recorded: the gateway itself restarted).
pub type ExitCauses = Arc<Mutex<HashMap<Uuid, &'static str>>>;

/// What the agent sends, not yet applied (`incoming.rs`).
pub(super) struct Intake {
    /// `None` once the agent's stdout has closed.
    pub(super) incoming: Option<Inbox<Incoming>>,
    /// What the agent sent while its session opened, applied first.
    pub(super) early: Vec<Incoming>,
}

/// The turn in progress and its `session/prompt` (`turns.rs`).
#[derive(Default)]
pub(super) struct Turns {
    pub(super) turn: Option<Turn>,
    /// The outstanding `session/prompt` request.
    pub(super) prompt: Option<PromptCall>,
}

impl Turns {
    pub(super) fn id(&self) -> Option<Uuid> {
        self.turn.as_ref().map(|t| t.id)
    }
}

/// How a turn ended, for what comes after it (`queue.rs`).
pub(super) struct Ended {
    pub(super) turn_id: Uuid,
    pub(super) stop_reason: String,
}

/// The prompts waiting for the running turn to end (`queue.rs`).
#[derive(Default)]
pub(super) struct Queue {
    pub(super) prompts: Vec<QueuedPrompt>,
    /// The budget that holds the queue after the running turn, however it
    /// ends (see `budget.rs`).
    pub(super) held_by_budget: Option<String>,
}

/// A turn in progress.
pub(super) struct Turn {
    pub(super) id: Uuid,
    pub(super) cancel_requested: bool,
    /// Carries `turn_id` into every log line of the turn.
    pub(super) span: tracing::Span,
}

impl Turn {
    pub(super) fn new(id: Uuid) -> Turn {
        Turn {
            id,
            cancel_requested: false,
            span: tracing::info_span!("turn", turn_id = %id),
        }
    }
}

/// The agent's session settings and the changes of them it has not
/// answered yet (`settings.rs`).
pub(super) struct Settings {
    /// What the agent reports about its session.
    pub(super) state: AgentReport,
    /// Setting changes the agent has not answered yet.
    pub(super) changes: FuturesUnordered<Changing>,
    /// How long the agent may take to answer a change.
    pub(super) call_timeout: Duration,
}

/// A change of a setting sent to the agent, and whom to tell once it
/// answered.
pub(super) struct Change {
    pub(super) setting: Setting,
    pub(super) changed_by: String,
    pub(super) reply: Reply<Result<()>>,
}

/// A change sent to the agent, resolving with its answer.
pub(super) type Changing = Pin<Box<dyn Future<Output = (Change, Result<Value>)> + Send>>;

/// The agent's permission requests that wait, and what answers them
/// without a person (`permissions.rs`).
pub(super) struct Requests {
    pub(super) pending: Pending,
    pub(super) policies: PolicyHandle,
    /// The profile's name, mode and the conversation's cwd, for the policies.
    pub(super) profile_name: String,
    pub(super) mode: Mode,
    pub(super) cwd: PathBuf,
}

/// When and how the session ends (`ending.rs`).
pub(super) struct Ending {
    /// Since when the agent has been idle, shared with the handle.
    pub(super) idle: Arc<Mutex<Option<Instant>>>,
    /// Stop the agent after this long idle (`None`: never).
    pub(super) idle_timeout: Option<Duration>,
    /// How long a cancelled turn may take to end when the gateway stops.
    pub(super) shutdown_timeout: Duration,
    /// When the gateway stops: whether an agent under a shim is left running.
    pub(super) on_shutdown: ShutdownPlan,
    pub(super) exits: ExitCauses,
    /// The agent's process as recorded, forgotten once it is gone.
    pub(super) record: Option<AgentProcessRecord>,
}

impl Ending {
    pub(super) fn idle_since(&self) -> Option<Instant> {
        *self.idle.lock().unwrap()
    }

    /// Starts or ends the idle period, as the agent is `idle` now or not.
    pub(super) fn note_idle(&self, idle: bool) {
        let mut since = self.idle.lock().unwrap();
        match (idle, *since) {
            (true, None) => *since = Some(Instant::now()),
            (false, Some(_)) => *since = None,
            _ => {}
        }
    }
}

/// The conversation's worktree, and git as its agent runs it
/// (`changes.rs`).
pub(super) struct Work {
    pub(super) git: crate::git::Git,
    pub(super) worktree: crate::model::Worktree,
}
