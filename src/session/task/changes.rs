//! The worktree between turns: a person's commit, land or discard (never
//! while a turn runs), and what each turn changed, recorded as it ends.

use super::Task;
use crate::error::Result;
use crate::session::work::{carry_out, no_worktree, summary, ChangeDone, ChangeOp};

impl Task {
    /// A person's commit, land or discard: refused while a turn runs (409
    /// `turn_in_progress`), else carried out and recorded; the agent waits
    /// meanwhile (nothing starts a turn while the task is here).
    pub(super) async fn change_work(&mut self, op: ChangeOp, by: &str) -> Result<ChangeDone> {
        let Some(work) = &self.work else {
            return Err(no_worktree());
        };
        if self.turns.turn.is_some() {
            return Err(crate::error::Error::conflict(
                "turn_in_progress",
                "a turn is running: its changes are committed, landed or discarded once it ends",
            ));
        }
        let done = carry_out(
            &work.git,
            &work.worktree,
            crate::git::Source::Worktree,
            &op,
            by,
        )
        .await?;
        self.journal.append(done.event());
        self.flush().await?;
        self.journal.record_change_totals(&done.totals()).await;
        Ok(done)
    }

    /// After a turn: what differs from the base now, as a
    /// `changes_updated` event (committed with the turn's end).
    pub(super) async fn note_changes(&mut self) {
        let Some(work) = &self.work else {
            return;
        };
        if let Some(updated) = summary(&work.git, &work.worktree).await {
            let totals = updated.totals;
            self.journal.append(updated);
            self.journal.record_change_totals(&totals).await;
        }
    }
}
