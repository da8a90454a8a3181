//! A budget's word on the conversation: its notices recorded, and the
//! running turn cancelled or let finish with the queue held after it (see
//! [`crate::session::command::BudgetWord`]).

use super::Task;
use crate::error::Result;
use crate::model::OnExceed;
use crate::session::command::BudgetWord;

impl Task {
    pub(super) async fn budget(&mut self, word: BudgetWord) -> Result<()> {
        for event in word.events() {
            self.journal.append(event);
        }
        // Between turns nothing runs to stop, and nothing queued starts
        // on its own (a turn's end starts it).
        if let Some(budget) = word.stopping().filter(|_| self.turns.turn.is_some()) {
            self.queue.held_by_budget = Some(budget.to_owned());
            if word.stop == Some(OnExceed::Cancel) {
                tracing::info!(budget, "a budget is spent: the turn is cancelled");
                self.cancel_turn(&format!("turn cancelled: budget {budget} is spent"), None)
                    .await?;
            }
        }
        self.flush().await
    }
}
