//! The agent's output under a shim, as its session task keeps track of it:
//! how far it is dealt with goes into the journal before each commit (the
//! commit writes it with the link), and once the journal says how far its
//! commits took it, the shim hears it may forget what lies before. Never
//! sooner: what a shim forgot before it was committed would be lost with a
//! crash of the gateway. An agent whose pipes are the gateway's own has
//! nothing of this. (The task's side of it is in `incoming.rs`, with the
//! rest of what the agent sends.)

use crate::acp::agent::Cursor;
use crate::acp::rpc::Processed;
use crate::store::AgentLink;

/// How far an agent's output under a shim is dealt with, and how far its
/// shim heard it is committed.
pub(super) struct ShimOutput {
    cursor: Cursor,
    acknowledged: Processed,
}

impl ShimOutput {
    /// Starting where `link`, as last committed, left the agent's output.
    pub(super) fn new(cursor: Cursor, link: &AgentLink) -> ShimOutput {
        ShimOutput {
            cursor,
            acknowledged: Processed {
                to: link.output_to,
                inside_long_line: link.output_inside_long_line,
            },
        }
    }

    /// Everything before this is dealt with.
    pub(super) fn position(&self) -> Processed {
        self.cursor.position()
    }

    /// Everything before `at` is committed: the shim may forget it.
    pub(super) fn acknowledge(&mut self, at: Processed) {
        self.cursor.committed(at.to);
        self.acknowledged = at;
    }

    /// Whether the output is dealt with further than the shim heard is
    /// committed.
    pub(super) fn moved(&self) -> bool {
        self.cursor.position() != self.acknowledged
    }
}

/// Resolves when the agent's output may have been dealt with further
/// without anything handed on to the task (the reader dropped lines);
/// never for an agent without a shim.
pub(super) async fn output_moved_on(output: &Option<ShimOutput>) {
    match output {
        Some(output) => output.cursor.moved_on().await,
        None => std::future::pending().await,
    }
}
