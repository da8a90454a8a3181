//! Turns: a prompt starts one, a cancel asks the agent to end it, and the
//! agent's answer to `session/prompt` ends it.
//!
//! Its part of the task is [`Turns`](super::parts::Turns).

use serde_json::Value;
use uuid::Uuid;

use super::parts::{Ended, Turn};
use super::Task;
use crate::acp::rpc::RpcError;
use crate::error::Result;
use crate::model::{PermissionStatus, TurnEnded, TurnStarted};

impl Task {
    /// Starts the turn `turn_id` (no other runs: see `queue.rs`); its id
    /// once `turn_started` is committed.
    /// `by` is who prompted (`user:<name>`), recorded with it.
    pub(super) async fn start_turn(
        &mut self,
        turn_id: Uuid,
        content: Vec<Value>,
        by: Option<String>,
    ) -> Result<Uuid> {
        debug_assert!(self.turns.turn.is_none());
        self.turns.turn = Some(Turn::new(turn_id));
        self.journal.set_turn(Some(turn_id));
        self.journal.append(TurnStarted {
            turn_id,
            content: content.clone(),
            by,
        });
        let turn_started = self.journal.last_seq();
        // Its id is committed with the turn, before it goes out: a gateway
        // reattaching to the agent's shim knows the answer when it comes.
        let (prompt_id, prompt) = self.agent.prompt(&content);
        if let Some(link) = self.journal.link_mut() {
            link.prompt_request = Some(prompt_id);
        }
        self.transcript.user_prompt(turn_id, content, turn_started);
        self.journal.set_status(self.status_now());
        if let Err(e) = self.flush().await {
            self.turns.turn = None;
            self.journal.set_turn(None);
            if let Some(link) = self.journal.link_mut() {
                link.prompt_request = None;
            }
            return Err(e);
        }
        if let Some(turn) = &self.turns.turn {
            turn.span
                .in_scope(|| tracing::info!(%turn_id, "turn started"));
        }
        self.turns.prompt = Some(prompt);
        Ok(turn_id)
    }

    /// The ACP cancel rule: `session/cancel`, then every pending request of
    /// the session is answered with the cancelled outcome (a database that
    /// is away waited for until `patience`, for an ending: see
    /// [`Task::resolve_all`]).
    pub(super) async fn cancel_turn(
        &mut self,
        reason: &str,
        patience: Option<tokio::time::Instant>,
    ) -> Result<()> {
        if !self.ask_to_cancel().await {
            return Ok(());
        }
        self.resolve_all(PermissionStatus::Cancelled, reason, patience)
            .await
    }

    /// Sends `session/cancel` for the running turn, if there is one (and
    /// says whether there was): the turn ends as the agent answers.
    pub(super) async fn ask_to_cancel(&mut self) -> bool {
        let Some(turn) = self.turns.turn.as_mut() else {
            return false;
        };
        turn.cancel_requested = true;
        if let Err(e) = self.agent.cancel().await {
            tracing::warn!(error = %e, "could not send session/cancel");
        }
        true
    }

    /// The running turn, ended without the agent's answer (its agent went):
    /// the event that says how.
    pub(super) fn turn_ended_without_answer(
        &mut self,
        stop_reason: &str,
        error: Option<String>,
    ) -> Option<TurnEnded> {
        self.turns.turn.take().map(|turn| TurnEnded {
            turn_id: turn.id,
            stop_reason: stop_reason.to_owned(),
            error,
        })
    }

    /// The agent answered its prompt. Everything it sent before the answer
    /// is queued already: that is applied first, so the turn ends last
    /// (when the agent is going away, the exit path ends the turn). The
    /// answer's place in the agent's output is let go only once the turn's
    /// end is in the batch: a commit while the rest is applied must not
    /// acknowledge the answer to the agent's shim (see `PromptCall`). The
    /// turn ends even when applying the rest failed.
    /// How it ended, where it did.
    pub(super) async fn answered(
        &mut self,
        result: Result<Value, RpcError>,
    ) -> Result<Option<Ended>> {
        let call = self.turns.prompt.take();
        let drained = self.drain_incoming(usize::MAX).await;
        let ended = match result {
            Err(RpcError::Closed(_)) => None,
            result => self.end_turn(result),
        };
        drop(call);
        drained.map(|()| ended)
    }

    /// The agent answered its prompt before it went (the answer was read
    /// with the rest of its output): the turn ends as it said (and the
    /// queue, if any, holds: the agent is going).
    pub(super) async fn take_prompt_answer(&mut self) -> Result<()> {
        use futures::FutureExt;
        let answered = self
            .turns
            .prompt
            .as_mut()
            .and_then(|call| (&mut call.answer).now_or_never());
        if let Some(result) = answered {
            let call = self.turns.prompt.take();
            if !matches!(result, Err(RpcError::Closed(_))) {
                if let Some(ended) = self.end_turn(result) {
                    self.hold_queue(&ended);
                }
                // Let go of the answer now that the turn's end is in the
                // batch (see `PromptCall`).
                drop(call);
                self.flush().await?;
            }
        }
        Ok(())
    }

    /// Ends the running turn as the agent's answer says; how it ended.
    pub(super) fn end_turn(&mut self, result: Result<Value, RpcError>) -> Option<Ended> {
        let turn = self.turns.turn.take()?;
        let (stop_reason, error) = match result {
            Ok(value) => match value.get("stopReason").and_then(Value::as_str) {
                Some(reason) => (reason.to_owned(), None),
                None => (
                    "error".to_owned(),
                    Some("agent answered session/prompt without a stopReason".to_owned()),
                ),
            },
            Err(_) if turn.cancel_requested => ("cancelled".to_owned(), None),
            Err(RpcError::Remote { code, message, .. }) => (
                "error".to_owned(),
                Some(format!("agent error {code}: {message}")),
            ),
            Err(RpcError::Closed(reason)) => ("error".to_owned(), Some(reason)),
        };
        tracing::info!(turn_id = %turn.id, %stop_reason, "turn ended");
        self.journal.append(TurnEnded {
            turn_id: turn.id,
            stop_reason: stop_reason.clone(),
            error,
        });
        self.journal.set_turn(None);
        if let Some(link) = self.journal.link_mut() {
            link.prompt_request = None;
        }
        self.journal.set_status(self.status_now());
        Some(Ended {
            turn_id: turn.id,
            stop_reason,
        })
    }
}
