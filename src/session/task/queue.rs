//! The prompt queue at work: a prompt sent while a turn runs waits (or,
//! steering, cancels that turn and goes first), a person edits what waits,
//! and a turn's end starts the next or holds the queue for a person. Every
//! change is a `queue_changed` event committed with the queue itself; a
//! prompt that starts leaves the queue in the commit of its `turn_started`.
//!
//! Its part of the task is [`Queue`](super::parts::Queue); the pure rules
//! are [`crate::session::queue`]'s.

use serde_json::{json, Value};
use uuid::Uuid;

use super::parts::Ended;
use super::Task;
use crate::error::{Error, Result};
use crate::model::{self, PermissionRequest, QueueChanged, QueueHeld, QueuedPrompt};
use crate::session::command::{Prompted, WhileRunning};
use crate::session::queue::{self, QueueEdit};

impl Task {
    /// A person's prompt: a turn starts where none runs; else it is
    /// refused, queued, or (steering) queued first while the running turn
    /// is cancelled.
    pub(super) async fn take_prompt(
        &mut self,
        content: Vec<Value>,
        while_running: WhileRunning,
        by: Option<String>,
    ) -> Result<Prompted> {
        if self.turns.turn.is_none() {
            return self
                .start_turn(model::new_id(), content, by)
                .await
                .map(Prompted::Started);
        }
        // A prompt sent after the turn's cancel was asked for is what the
        // person wants next: it starts as that turn ends, as steering does.
        let cancelling = self.turns.turn.as_ref().is_some_and(|t| t.cancel_requested);
        let steer = match while_running {
            WhileRunning::Refuse => return Err(turn_in_progress()),
            WhileRunning::Queue => cancelling,
            WhileRunning::Steer => true,
        };
        let prompt = QueuedPrompt {
            id: model::new_id(),
            content,
            queued_by: by.unwrap_or_else(|| "system".into()),
            queued_at: model::now(),
            steer,
            reason_for: None,
        };
        let id = prompt.id;
        let position = self.enqueue(prompt).await?;
        if steer && !cancelling {
            self.cancel_turn("turn cancelled: a person steered", None)
                .await?;
        }
        Ok(Prompted::Queued { id, position })
    }

    /// Queues `prompt` (see [`queue::push`]) and commits it with its
    /// `queue_changed`; its position.
    async fn enqueue(&mut self, prompt: QueuedPrompt) -> Result<usize> {
        let before = self.queue.prompts.clone();
        let (id, by) = (prompt.id, prompt.queued_by.clone());
        let position = queue::push(&mut self.queue.prompts, prompt)?;
        self.journal.append(QueueChanged {
            change: "queued".into(),
            prompt_id: id,
            by: Some(by),
            queue: self.queue.prompts.clone(),
        });
        self.commit_queue(before).await?;
        Ok(position)
    }

    /// A person's change to a queued prompt: the `queue_changed` event.
    pub(super) async fn edit_queue(&mut self, edit: QueueEdit, by: &str) -> Result<QueueChanged> {
        let before = self.queue.prompts.clone();
        let changed = queue::apply(&mut self.queue.prompts, edit, by)?;
        self.journal.append(changed.clone());
        self.commit_queue(before).await?;
        Ok(changed)
    }

    /// Commits the queue as it is now; where that fails, the queue is
    /// `before` again (the caller hears the failure).
    async fn commit_queue(&mut self, before: Vec<QueuedPrompt>) -> Result<()> {
        self.journal.set_queue(&self.queue.prompts);
        if let Err(e) = self.flush().await {
            self.queue.prompts = before;
            self.journal.set_queue(&self.queue.prompts);
            return Err(e);
        }
        Ok(())
    }

    /// Starts the first queued prompt now (a held queue); its turn's id.
    pub(super) async fn resume_queue(&mut self) -> Result<Uuid> {
        if self.turns.turn.is_some() {
            return Err(turn_in_progress());
        }
        if self.queue.prompts.is_empty() {
            return Err(Error::conflict("queue_empty", "no prompt is queued"));
        }
        let next = self.queue.prompts.remove(0);
        self.start_queued(next).await
    }

    /// A turn ended with the agent still here: the next queued prompt
    /// starts (see [`queue::next_after`]), or the queue holds for a person.
    pub(super) async fn after_turn(&mut self, ended: Option<Ended>) -> Result<()> {
        let Some(ended) = ended else {
            return Ok(());
        };
        if self.queue.held_by_budget.is_some() {
            self.hold_queue(&ended);
            return Ok(());
        }
        match queue::next_after(&mut self.queue.prompts, &ended.stop_reason) {
            Some(next) => self.start_queued(next).await.map(drop),
            None => {
                self.hold_queue(&ended);
                Ok(())
            }
        }
    }

    /// Says that the queue holds after `ended`, where prompts wait.
    pub(super) fn hold_queue(&mut self, ended: &Ended) {
        let budget = self.queue.held_by_budget.take();
        if self.queue.prompts.is_empty() {
            return;
        }
        tracing::info!(queued = self.queue.prompts.len(), stop_reason = %ended.stop_reason, "the prompt queue holds");
        self.journal.append(QueueHeld {
            turn_id: ended.turn_id,
            stop_reason: ended.stop_reason.clone(),
            queued: self.queue.prompts.len() as u32,
            budget,
        });
    }

    /// Starts `next`, taken off the queue: its `queue_changed` and
    /// `turn_started` are committed together. Where the turn cannot start,
    /// it is queued first again.
    async fn start_queued(&mut self, next: QueuedPrompt) -> Result<Uuid> {
        self.journal
            .append(queue::started(&self.queue.prompts, &next));
        self.journal.set_queue(&self.queue.prompts);
        // Who queued it prompted ("system": the gateway did).
        let by = Some(next.queued_by.clone()).filter(|by| by.starts_with("user:"));
        match self.start_turn(next.id, next.content.clone(), by).await {
            Ok(turn_id) => Ok(turn_id),
            Err(e) => {
                tracing::warn!(error = %e, prompt_id = %next.id, "the queued prompt could not start; it stays first");
                self.queue.prompts.insert(0, next);
                self.journal.set_queue(&self.queue.prompts);
                Err(e)
            }
        }
    }

    /// A person's reason given with their answer to `request`: it goes to
    /// the agent as the first queued prompt, which starts when the turn
    /// ends (`steer`: at once, the turn cancelled; with no turn running,
    /// at once too).
    pub(super) async fn tell_reason(
        &mut self,
        request: &PermissionRequest,
        reason: &str,
        by: &str,
        steer: bool,
    ) -> Result<()> {
        let content = vec![json!({"type": "text", "text": queue::reason_text(request, reason)})];
        if self.turns.turn.is_none() {
            let by = Some(by.to_owned());
            return self
                .start_turn(model::new_id(), content, by)
                .await
                .map(drop);
        }
        let prompt = QueuedPrompt {
            id: model::new_id(),
            content,
            queued_by: by.to_owned(),
            queued_at: model::now(),
            steer,
            reason_for: Some(request.id),
        };
        // Ahead of everything queued so far, a full queue or not: the
        // agent hears it first.
        let before = self.queue.prompts.clone();
        let id = prompt.id;
        self.queue.prompts.insert(0, prompt);
        self.journal.append(QueueChanged {
            change: "queued".into(),
            prompt_id: id,
            by: Some(by.to_owned()),
            queue: self.queue.prompts.clone(),
        });
        self.commit_queue(before).await?;
        if steer {
            self.cancel_turn("turn cancelled: a person's reason is sent at once", None)
                .await?;
        }
        Ok(())
    }
}

fn turn_in_progress() -> Error {
    Error::conflict(
        "turn_in_progress",
        "a turn is already running; cancel it, wait for turn_ended, or send the prompt with \"queue\": true",
    )
}
