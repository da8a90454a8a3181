//! The agent's output under a shim, as the session task keeps track of it:
//! how far it is dealt with goes into the journal before each commit (the
//! commit writes it with the link), and once the journal says how far its
//! commits took it, the shim hears it may forget what lies before. Never
//! sooner: what a shim forgot before it was committed would be lost with a
//! crash of the gateway. An agent whose pipes are the gateway's own has
//! nothing of this.

use super::Task;
use crate::acp::agent::Cursor;
use crate::acp::rpc::Processed;
use crate::store::AgentLink;

/// How far an agent's output under a shim is dealt with, and how far its
/// shim heard it is committed.
pub(in crate::session) struct ShimOutput {
    cursor: Cursor,
    acknowledged: Processed,
}

impl ShimOutput {
    /// Starting where `link`, as last committed, left the agent's output.
    pub(in crate::session) fn new(cursor: Cursor, link: &AgentLink) -> ShimOutput {
        ShimOutput {
            cursor,
            acknowledged: Processed {
                to: link.output_to,
                inside_long_line: link.output_inside_long_line,
            },
        }
    }
}

/// Resolves when the agent's output may have been dealt with further
/// without anything handed on to the task (see [`Task::output_moved`]);
/// never for an agent without a shim.
pub(super) async fn output_moved_on(output: &Option<ShimOutput>) {
    match output {
        Some(output) => output.cursor.moved_on().await,
        None => std::future::pending().await,
    }
}

impl Task {
    /// Before a commit: tells the journal how far the agent's output is
    /// dealt with (everything the commit holds is; see `Task::dealt_with`).
    pub(super) fn note_output(&mut self) {
        if let Some(output) = &self.shim_output {
            self.journal.output_at(output.cursor.position());
        }
    }

    /// After a commit: tells the shim how far the journal's commits took
    /// the agent's output, so that it may forget what lies before.
    pub(super) fn acknowledge(&mut self) {
        let committed = self.journal.committed_output();
        if let (Some(output), Some(at)) = (&mut self.shim_output, committed) {
            output.cursor.committed(at.to);
            output.acknowledged = at;
        }
    }

    /// The agent's output may have been dealt with further than its shim
    /// heard is committed (by the reader alone: lines dropped, too long, a
    /// message ignored): the journal is to commit so (see
    /// [`crate::session::journal::Journal::output_moved`]).
    pub(super) fn output_moved(&mut self) {
        self.acknowledge();
        if let Some(output) = &self.shim_output {
            if output.cursor.position() != output.acknowledged {
                self.journal.output_moved();
            }
        }
    }
}
