//! How a session ends: the user closes it, the gateway stops its agent
//! (idle, capacity, an error) or shuts down, or the agent goes by itself.
//! Whatever the cause, its terminals stop, its turn ends, its requests are
//! answered, and the agent is gone and forgotten before the task returns.
//!
//! Its part of the task is [`Ending`](super::parts::Ending).

use std::time::Duration;

use super::parts::Ended;
use super::{next_incoming, next_prompt_result, End, Task};
use crate::error::Result;
use crate::model::{AgentState, AgentStatus, ConversationStatus, PermissionStatus};
use crate::session::spawn::{forget_process, TERMINATE_GRACE};
use crate::telemetry;

/// How long a session whose agent is gone keeps trying to write what an
/// unreachable database has not taken yet.
const OUTAGE_PATIENCE: Duration = Duration::from_secs(600);
/// How long a session that ends waits for its killed terminals to report
/// their end (a process that left their group may hold their output open).
const TERMINALS_END: Duration = Duration::from_secs(2);
/// How long an agent gets to answer `session/close`.
const CLOSE_GRACE: Duration = Duration::from_secs(5);

impl Task {
    /// Shutting down: cancels the running turn and gives the agent
    /// `shutdown_timeout` to answer the prompt (applying what it sends
    /// meanwhile), so the turn ends as the agent ends it.
    pub(super) async fn wind_down(&mut self) -> Result<()> {
        if self.turns.turn.is_none() {
            return Ok(());
        }
        let deadline = tokio::time::Instant::now() + self.ending.shutdown_timeout;
        self.cancel_turn("the gateway is shutting down", Some(deadline))
            .await?;
        while self.turns.turn.is_some() {
            tokio::select! {
                result = next_prompt_result(&mut self.turns.prompt) => {
                    // Nothing more starts: the queue holds.
                    if let Some(ended) = self.answered(result).await? {
                        self.hold_queue(&ended);
                    }
                    break;
                }
                msg = next_incoming(&mut self.intake.incoming) => match msg {
                    Some(msg) => self.take_in(msg).await?,
                    None => break,
                },
                _ = tokio::time::sleep_until(deadline) => {
                    tracing::warn!("the agent did not answer session/cancel before shutdown_timeout");
                    break;
                }
            }
        }
        self.flush().await
    }

    /// A user closed the conversation: `session/close`, where the agent
    /// takes it, so it frees what it holds for the session (applying what it
    /// sends meanwhile), within [`CLOSE_GRACE`].
    pub(super) async fn close_session(&mut self) -> Result<()> {
        let Some(closing) = self.agent.close() else {
            return Ok(());
        };
        tokio::pin!(closing);
        let deadline = tokio::time::Instant::now() + CLOSE_GRACE;
        loop {
            tokio::select! {
                answer = &mut closing => {
                    if let Err(e) = answer {
                        tracing::warn!(error = %e, "session/close failed");
                    }
                    return Ok(());
                }
                msg = next_incoming(&mut self.intake.incoming) => match msg {
                    Some(msg) => self.take_in(msg).await?,
                    None => return Ok(()),
                },
                _ = tokio::time::sleep_until(deadline) => {
                    tracing::warn!("the agent did not answer session/close in time");
                    return Ok(());
                }
            }
        }
    }

    /// Counts why the agent went, and remembers it for a restart's count.
    pub(super) fn exited(&self, cause: &'static str) {
        telemetry::agent_exited(cause);
        self.ending
            .exits
            .lock()
            .unwrap()
            .insert(self.journal.conversation_id(), cause);
    }

    /// Another node claimed the conversation while this one was cut off (its
    /// lease ran out): nothing more of this node's is written to it, its
    /// agent and terminals stop here, and the task ends, dropping what it
    /// held. The other node's copy of the agent carries the conversation on.
    pub(super) async fn step_aside(&mut self) {
        tracing::warn!("another gateway node owns this conversation now; stopping its agent here");
        self.exited("fenced");
        let _ = tokio::time::timeout(TERMINALS_END, self.served.stop()).await;
        self.process.terminate(TERMINATE_GRACE).await;
        // The process record is this node's own: not the conversation's.
        forget_process(self.journal.store(), self.ending.record.take().as_ref()).await;
    }

    /// The gateway stops and leaves the agent running under its shim for
    /// the next start (`on_shutdown = "detach"`): everything is committed
    /// (so the shim may forget it), the connection is closed so that
    /// nothing is answered on the way out (the requests that wait stay
    /// pending, the turn running), and the shim is let go. The process
    /// record stays: it is how the next start finds the shim.
    pub(super) async fn detach(mut self) {
        tracing::info!("leaving the agent running under its shim");
        self.dealt_with();
        let deadline = tokio::time::Instant::now() + self.ending.shutdown_timeout;
        self.flush_until(deadline).await;
        // No answer goes out from here on (a dropped request would be
        // answered "dropped" otherwise).
        self.agent.peer().close("the gateway detached");
        let _ = tokio::time::timeout(TERMINALS_END, self.served.stop()).await;
        let Task { process, .. } = self;
        process.detach(TERMINATE_GRACE).await;
    }

    /// Records how the session ended and makes sure the agent is gone.
    pub(super) async fn finish(&mut self, end: End) -> Result<()> {
        // The agent's terminals go with it; what they printed, and how they
        // ended, is kept (waiting a little for a command that will not die).
        let ended = self.served.stop();
        tokio::pin!(ended);
        let bound = tokio::time::sleep(TERMINALS_END);
        tokio::pin!(bound);
        loop {
            tokio::select! {
                Some(output) = self.terminal_output.recv() => self.journal.append(output),
                () = &mut ended => break,
                () = &mut bound => break,
            }
        }
        while let Ok(output) = self.terminal_output.try_recv() {
            self.journal.append(output);
        }
        let by_user = matches!(end, End::ClosedByUser { .. });
        let (detail, stop_reason, reply) = match end {
            End::AgentGone => (String::new(), "error", None),
            End::ClosedByUser { reply } => {
                self.exited("closed");
                ("conversation closed".to_owned(), "cancelled", reply)
            }
            End::Stopped { detail, cause } => {
                self.exited(cause);
                (detail, "error", None)
            }
            End::ShuttingDown => {
                self.exited("shutdown");
                self.wind_down().await?;
                ("the gateway is shutting down".to_owned(), "cancelled", None)
            }
        };
        let closing = !detail.is_empty();
        if closing {
            // Politely first: the agent may still wrap up its updates.
            self.ask_to_cancel().await;
            if stop_reason == "cancelled" {
                let deadline = tokio::time::Instant::now() + self.ending.shutdown_timeout;
                self.resolve_all(PermissionStatus::Cancelled, &detail, Some(deadline))
                    .await?;
            }
            if by_user {
                self.close_session().await?;
            }
            self.process.terminate(TERMINATE_GRACE).await;
            self.drain_until_closed().await?;
        }
        // Closed only by a user: otherwise the next prompt starts the agent
        // again.
        let final_status = if by_user {
            ConversationStatus::Closed
        } else {
            ConversationStatus::Idle
        };
        let (agent_state, detail) = if closing {
            (AgentState::Exited, detail)
        } else {
            let status = self.process.wait().await;
            self.process.drain_stderr().await;
            let detail = self.process.describe_end(status);
            tracing::warn!(%detail, "agent exited");
            self.exited(if status.success() {
                "exited"
            } else {
                "crashed"
            });
            let state = if status.success() {
                AgentState::Exited
            } else {
                AgentState::Failed
            };
            (state, detail)
        };
        self.answer_changes_left().await?;
        // What waits for an unreachable database is written first (the
        // requests' answers must come after it).
        let patience = if by_user || stop_reason == "cancelled" {
            self.ending.shutdown_timeout
        } else {
            OUTAGE_PATIENCE
        };
        let deadline = tokio::time::Instant::now() + patience;
        self.flush_until(deadline).await;
        // Reaped, and its group killed with it.
        forget_process(self.journal.store(), self.ending.record.take().as_ref()).await;
        // Requests the agent can no longer receive an answer for; except
        // where a remote agent's connection was lost: the agent may still
        // hold its session and them, so they stay pending until it is back
        // and asks again (see `Task::take_up_held`).
        if !closing && self.process.connection_lost() {
            let held = self.requests.pending.ids().len();
            if held > 0 {
                tracing::info!(held, "requests wait for the remote agent to come back");
            }
        } else {
            let reason = format!("the agent went away: {}", first_line(&detail));
            self.resolve_all(PermissionStatus::Expired, &reason, Some(deadline))
                .await?;
        }
        let error = (stop_reason == "error").then(|| detail.clone());
        let turn_ended = self.turn_ended_without_answer(stop_reason, error);
        let held = turn_ended.as_ref().map(|t| Ended {
            turn_id: t.turn_id,
            stop_reason: t.stop_reason.clone(),
        });
        let agent = AgentStatus::new(agent_state, Some(detail));
        self.save_transcript();
        self.note_output();
        if let Some(turn_ended) = turn_ended {
            self.journal.append(turn_ended);
        }
        if let Some(ended) = held {
            self.hold_queue(&ended);
        }
        let gone = self.journal.agent_gone(None, agent, final_status).await;
        self.acknowledge();
        gone?;
        // Nothing held in memory may go with the task.
        self.flush_until(deadline).await;
        // Its shim has nothing more to hold for anyone.
        self.process.release().await;
        if let Some(reply) = reply {
            reply.send(());
        }
        Ok(())
    }
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or(s)
}
