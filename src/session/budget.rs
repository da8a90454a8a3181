//! A budget's word on a conversation (see `crate::budgets`): told to its
//! live session, here or on the node that runs it, else its notices
//! recorded on what is stored (nothing runs there to stop).

use super::command::{BudgetWord, Command, Handle};
use super::Sessions;
use crate::error::Result;
use crate::model::Conversation;

impl Sessions {
    pub async fn budget(&self, conversation: &Conversation, word: BudgetWord) -> Result<()> {
        let remote = Command::Budget {
            word: word.clone(),
            reply: Default::default(),
        };
        let session = |session: Handle| {
            let word = word.clone();
            async move { session.budget(word).await }
        };
        self.unattended(conversation, session, remote, |journal, _stored| {
            let word = word.clone();
            Box::pin(async move {
                for event in word.events() {
                    journal.append(event);
                }
                journal.flush().await
            })
        })
        .await
    }
}
