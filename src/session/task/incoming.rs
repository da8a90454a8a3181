//! What the agent sends, applied: `session/update` notifications to the
//! transcript and the journal, its requests (permission, files, terminals)
//! to whoever serves them, and what is queued in its stdout drained in
//! order; under a shim, how far its output is dealt with, noted with each
//! commit and acknowledged after it (see `output.rs`).
//!
//! Its part of the task is [`Intake`](super::parts::Intake).

use serde_json::Value;

use super::Task;
use crate::acp::client::EXIT_AFTER_EOF;
use crate::acp::incoming::Incoming;
use crate::error::Result;
use crate::session::served::Write;

impl Task {
    /// Applies what the agent sent while its session opened.
    pub(super) async fn apply_early(&mut self) -> Result<()> {
        for msg in std::mem::take(&mut self.intake.early) {
            self.handle_incoming(msg).await?;
        }
        // The last of them, or one the opening dealt with, is in hand.
        self.dealt_with();
        self.flush().await
    }

    /// Applies the message the inbox gave last, then says it is dealt with.
    pub(super) async fn take_in(&mut self, msg: Incoming) -> Result<()> {
        self.handle_incoming(msg).await?;
        self.dealt_with();
        Ok(())
    }

    /// The inbox's message in hand is applied (what it changes is in the
    /// journal): the next commit counts it as committed, so a gateway that
    /// takes over after a crash does not apply it again. Said right after
    /// the message is applied, before any commit (or a crash after that
    /// commit applies it twice), and never sooner (or it is lost).
    pub(super) fn dealt_with(&mut self) {
        if let Some(incoming) = self.intake.incoming.as_mut() {
            incoming.done();
        }
    }

    /// The agent's stdout closed: nothing more comes in.
    pub(super) fn stdout_closed(&mut self) {
        self.intake.incoming = None;
    }

    /// Before a commit: tells the journal how far the agent's output under
    /// a shim is dealt with (everything the commit holds is: see
    /// `Task::dealt_with`).
    pub(super) fn note_output(&mut self) {
        if let Some(output) = &self.shim_output {
            self.journal.output_at(output.position());
        }
    }

    /// After a commit: tells the agent's shim how far the journal's commits
    /// took its output, so that it may forget what lies before.
    pub(super) fn acknowledge(&mut self) {
        let committed = self.journal.committed_output();
        if let (Some(output), Some(at)) = (&mut self.shim_output, committed) {
            output.acknowledge(at);
        }
    }

    /// The agent's output may have been dealt with further than its shim
    /// heard is committed (by the reader alone: lines dropped, too long, a
    /// message ignored): the journal is to commit so (see
    /// [`crate::session::journal::Journal::output_moved`]).
    pub(super) fn output_moved(&mut self) {
        self.acknowledge();
        if self.shim_output.as_ref().is_some_and(|o| o.moved()) {
            self.journal.output_moved();
        }
    }

    /// After the agent exited: applies everything left in its stdout until the
    /// reader reaches the end (bounded, in case a stray process holds the pipe).
    pub(super) async fn drain_until_closed(&mut self) -> Result<()> {
        let deadline = tokio::time::Instant::now() + EXIT_AFTER_EOF;
        while let Some(rx) = self.intake.incoming.as_mut() {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(msg)) => self.take_in(msg).await?,
                Ok(None) | Err(_) => self.intake.incoming = None,
            }
            if self.commit_due() {
                self.flush().await?;
            }
        }
        Ok(())
    }

    /// Applies whatever the agent has already sent, up to `max` messages.
    pub(super) async fn drain_incoming(&mut self, max: usize) -> Result<()> {
        let mut n = 0;
        while n < max && !self.journal.is_full() {
            let Some(rx) = self.intake.incoming.as_mut() else {
                break;
            };
            match rx.try_recv() {
                Ok(msg) => self.take_in(msg).await?,
                Err(_) => break,
            }
            n += 1;
            if self.commit_due() {
                self.flush().await?;
            }
        }
        Ok(())
    }

    async fn handle_incoming(&mut self, msg: Incoming) -> Result<()> {
        match msg {
            Incoming::Notification { method, params } => match method.as_str() {
                "session/update" => self.on_update(params),
                "$/cancel_request" => self.on_cancel_request(params).await?,
                "elicitation/complete" | "notifications/elicitation/complete" => {
                    self.on_question_complete(params).await?
                }
                other => tracing::debug!(method = other, "ignoring notification"),
            },
            Incoming::Fast(chunk) => {
                let turn_id = self.turns.id();
                self.transcript.text_chunk(chunk.kind, &chunk.text, turn_id);
                self.journal.text_chunk(chunk.kind, &chunk.text, turn_id);
            }
            Incoming::Request(request) => match request.method.as_str() {
                "session/request_permission" => self.on_permission_request(request).await?,
                "elicitation/create" => self.on_question(request).await?,
                method if self.served.serves(method) => {
                    if let Some(write) = self.served.handle(request, self.journal.store()).await? {
                        self.record_write(write).await?;
                    }
                }
                _ => request.reject_unknown_method(),
            },
        }
        Ok(())
    }

    /// A file the agent wrote: recorded and published, then the agent hears
    /// it is done (even while the database is away: the event waits in the
    /// journal, the file is written).
    pub(super) async fn record_write(&mut self, write: Write) -> Result<()> {
        let Write { written, responder } = write;
        tracing::info!(path = %written.path, "agent wrote a file");
        self.journal.append(written);
        // Committed with the request still in hand: after a crash before
        // the answer below, the request is read again and answered then
        // (and recorded twice) rather than never answered.
        let flushed = self.flush().await;
        responder.respond(serde_json::json!({}));
        flushed
    }

    pub(super) fn on_update(&mut self, mut params: Value) {
        // Taken, not copied: an update may be megabytes long.
        let update = params
            .as_object_mut()
            .and_then(|p| p.remove("update"))
            .filter(Value::is_object);
        let Some(update) = update else {
            tracing::warn!("session/update without an update object; ignored");
            return;
        };
        let turn_id = self.turns.id();
        // Read before the report takes it: its cost increase is counted
        // from the cost reported before.
        let usage = self.settings.state.usage_reading(&update);
        self.report_changed(&update);
        if let Some(reading) = usage {
            self.journal.usage_update(update, turn_id, reading);
        } else if self.transcript.apply(&update, turn_id) {
            self.journal.chunk(update, turn_id);
        } else {
            self.journal.session_update(update, turn_id);
        }
    }
}
