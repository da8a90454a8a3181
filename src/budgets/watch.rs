//! Budgets watched as agents report their spend: after each `usage_update`
//! (cost and context) and each `turn_started` (turns) that this node
//! committed, the budgets that hold the conversation are read again from
//! the database. One 80 % spent records a `budget_warning`; one spent
//! records a `budget_exceeded` (each once per budget, scope and window,
//! whichever node sees it first: the database keeps which were recorded)
//! and stops the conversation's turn as its `on_exceed` says: cancelled, or
//! let finish, the queue held after it either way. A turns budget never
//! cancels the turn that used it up. An operator's exception lifts it.
//!
//! The notices are the conversation's events, so its owner sees them live
//! and the notifier tells the owner and the operators; what runs is told
//! through the session's own road ([`crate::session::Sessions::budget`]).

use std::sync::Arc;

use chrono::Utc;
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;

use super::rules::Level;
use super::Budgets;
use crate::bus::{EventBus, Published};
use crate::error::Result;
use crate::model::{BudgetLimit, BudgetNotice, Event, EventBody, OnExceed};
use crate::session::command::BudgetWord;
use crate::session::Sessions;

/// The watcher: runs until shutdown (see the module).
pub struct Watch {
    pub budgets: Budgets,
    pub sessions: Sessions,
    pub bus: EventBus,
}

/// What an event tells budgets.
enum Report {
    /// The agent's figures: tokens in context (`used`), and whether it
    /// reported a cost.
    Usage {
        used: Option<u64>,
        cost: bool,
    },
    TurnStarted,
}

impl Watch {
    pub async fn run(self, shutdown: CancellationToken) {
        if self.budgets.all().is_empty() {
            return;
        }
        let mut events = self.bus.subscribe_all();
        loop {
            let published = tokio::select! {
                _ = shutdown.cancelled() => return,
                received = events.recv() => match received {
                    // Its own node watches it.
                    Ok(published) if published.relayed => continue,
                    Ok(published) => published,
                    // Missed reports are caught up with by the next one:
                    // the spend is the database's.
                    Err(RecvError::Lagged(_)) => continue,
                    Err(RecvError::Closed) => return,
                },
            };
            let Some((event, report)) = read(&published) else {
                continue;
            };
            if let Err(e) = self.seen(&event, report).await {
                tracing::warn!(conversation_id = %event.conversation_id, error = %e,
                    "could not check the budgets after the agent's report");
            }
        }
    }

    async fn seen(&self, event: &Event, report: Report) -> Result<()> {
        let Some(conversation) = self
            .sessions
            .store()
            .get_conversation(event.conversation_id)
            .await?
        else {
            return Ok(());
        };
        let turn_id = match &event.body {
            EventBody::TurnStarted(started) => Some(started.turn_id),
            EventBody::SessionUpdate(update) => update.turn_id(),
            _ => None,
        };
        let used = match report {
            Report::Usage { used, .. } => used,
            Report::TurnStarted => None,
        };
        let now = Utc::now();
        for standing in self.budgets.standings(&conversation, used, now).await? {
            let concerned = match (&standing.budget.limit, &report) {
                (BudgetLimit::Turns { .. }, Report::TurnStarted) => true,
                (BudgetLimit::Cost { .. }, Report::Usage { cost, .. }) => *cost,
                (BudgetLimit::Context { .. }, Report::Usage { used, .. }) => used.is_some(),
                _ => false,
            };
            if !concerned || standing.level == Level::Under {
                continue;
            }
            if self
                .budgets
                .excepted(&standing.budget, conversation.owner.as_deref(), now)
                .await?
            {
                continue;
            }
            let store = self.sessions.store();
            let notice = BudgetNotice {
                standing: standing.standing.clone(),
                turn_id,
            };
            let kind = match standing.level {
                Level::Exceeded => "exceeded",
                _ => "warning",
            };
            let first = store
                .note_budget(
                    &standing.budget.id,
                    &standing.standing.key,
                    standing.window.start,
                    kind,
                    now,
                )
                .await?;
            let mut word = BudgetWord {
                budget: standing.budget.id.clone(),
                ..BudgetWord::default()
            };
            match standing.level {
                Level::Exceeded => {
                    word.exceeded = first.then_some(notice);
                    // Turns are counted as they start: the turn that used
                    // the budget up runs on; nothing queued starts after it.
                    word.stop = Some(match standing.budget.limit {
                        BudgetLimit::Turns { .. } => OnExceed::FinishTurn,
                        _ => standing.budget.on_exceed,
                    });
                }
                _ if first => word.warning = Some(notice),
                _ => continue,
            }
            if word.events().next().is_none() && turn_id.is_none() {
                continue;
            }
            self.tell(&conversation, word).await;
        }
        Ok(())
    }

    /// Tells the conversation a budget's word (a failure is logged: the
    /// next report tries again).
    async fn tell(&self, conversation: &crate::model::Conversation, word: BudgetWord) {
        let budget = word.budget.clone();
        if let Err(e) = self.sessions.budget(conversation, word).await {
            tracing::warn!(conversation_id = %conversation.id, %budget, error = %e,
                "could not tell the conversation of its budget");
        }
    }
}

/// The event a published text is, if budgets look at it: an agent's
/// `usage_update`, or a `turn_started`.
fn read(published: &Arc<Published>) -> Option<(Event, Report)> {
    let json: &str = published.json.as_str();
    let turn = json.contains("\"turn_started\"");
    if !turn && !json.contains("usage_update") {
        return None;
    }
    let event: Event = serde_json::from_str(json).ok()?;
    let report = match &event.body {
        EventBody::TurnStarted(_) => Report::TurnStarted,
        EventBody::SessionUpdate(update) => {
            let update = update.update();
            if update.get("sessionUpdate").and_then(|k| k.as_str()) != Some("usage_update") {
                return None;
            }
            Report::Usage {
                used: update.get("used").and_then(serde_json::Value::as_u64),
                cost: update.get("cost").is_some_and(|c| c.is_object()),
            }
        }
        _ => return None,
    };
    Some((event, report))
}
