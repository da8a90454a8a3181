//! Turns: a prompt starts one, a cancel asks the agent to end it, and the
//! agent's answer to `session/prompt` ends it.

use serde_json::Value;
use uuid::Uuid;

use super::{Task, Turn};
use crate::acp::rpc::RpcError;
use crate::error::{Error, Result};
use crate::model::{self, PermissionStatus, TurnEnded, TurnStarted};

impl Task {
    pub(super) async fn start_turn(&mut self, content: Vec<Value>) -> Result<Uuid> {
        if self.turn.is_some() {
            return Err(Error::conflict(
                "turn_in_progress",
                "a turn is already running; cancel it or wait for turn_ended",
            ));
        }
        let turn_id = model::new_id();
        self.turn = Some(Turn {
            id: turn_id,
            cancel_requested: false,
            span: tracing::info_span!("turn", %turn_id),
        });
        self.journal.set_turn(Some(turn_id));
        self.journal.append(TurnStarted {
            turn_id,
            content: content.clone(),
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
            self.turn = None;
            self.journal.set_turn(None);
            if let Some(link) = self.journal.link_mut() {
                link.prompt_request = None;
            }
            return Err(e);
        }
        if let Some(turn) = &self.turn {
            turn.span
                .in_scope(|| tracing::info!(%turn_id, "turn started"));
        }
        self.prompt = Some(prompt);
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
        let Some(turn) = self.turn.as_mut() else {
            return Ok(());
        };
        turn.cancel_requested = true;
        if let Err(e) = self.agent.cancel().await {
            tracing::warn!(error = %e, "could not send session/cancel");
        }
        self.resolve_all(PermissionStatus::Cancelled, reason, patience)
            .await
    }

    /// The agent answered its prompt. Everything it sent before the answer
    /// is queued already: that is applied first, so the turn ends last
    /// (when the agent is going away, the exit path ends the turn). The
    /// answer's place in the agent's output is let go only once the turn's
    /// end is in the batch: a commit while the rest is applied must not
    /// acknowledge the answer to the agent's shim (see `PromptCall`). The
    /// turn ends even when applying the rest failed.
    pub(super) async fn answered(&mut self, result: Result<Value, RpcError>) -> Result<()> {
        let call = self.prompt.take();
        let drained = self.drain_incoming(usize::MAX).await;
        if !matches!(result, Err(RpcError::Closed(_))) {
            self.end_turn(result);
        }
        drop(call);
        drained
    }

    pub(super) fn end_turn(&mut self, result: Result<Value, RpcError>) {
        let Some(turn) = self.turn.take() else { return };
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
            stop_reason,
            error,
        });
        self.journal.set_turn(None);
        if let Some(link) = self.journal.link_mut() {
            link.prompt_request = None;
        }
        self.journal.set_status(self.status_now());
    }
}
