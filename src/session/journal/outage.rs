//! Riding out a database outage: while the database does not answer, the
//! journal keeps what it would have committed (up to a bound), publishes it
//! at once so live clients see it (before it is committed: the one case
//! where an event reaches the bus first), tries again with a growing
//! backoff, and commits it all once the database answers.

use std::time::Duration;

use super::Journal;
use crate::acp::rpc::Processed;
use crate::error::Result;
use crate::model::Event;
use crate::store::AgentLink;
use crate::telemetry;

impl Journal {
    /// From now on a database outage does not fail [`Journal::flush`]: what
    /// is appended waits in memory, in order (the writer takes no more once
    /// it held `max_events`: see [`Journal::is_full`]), its events are
    /// published live meanwhile, and commits are tried again with back-off
    /// until the database answers; `seq` stays gap-free. For a session's
    /// writer, which lives on to keep trying; others fail.
    pub fn ride_out_outages(&mut self, max_events: usize) {
        self.max_buffered = max_events.max(1);
    }

    /// Whether the database is unreachable and writes are waiting.
    pub fn in_outage(&self) -> bool {
        self.outage.is_some()
    }

    /// Whether the buffer is full: take nothing more until it drains.
    pub fn is_full(&self) -> bool {
        self.outage.is_some() && self.batch.events.len() >= self.max_buffered
    }

    /// Resolves when it is time to try the database again (never while it
    /// answers).
    pub async fn retry_due(&self) {
        match self.outage {
            Some(outage) => tokio::time::sleep_until(outage.retry_at).await,
            None => std::future::pending().await,
        }
    }

    /// Keeps the write-buffer gauge at what this journal held.
    pub(super) fn gauge(&mut self) {
        let buffered = self.batch.events.len();
        telemetry::buffered(buffered as f64 - self.gauged as f64);
        self.gauged = buffered;
    }

    /// Whether the database answers a ping within a moment.
    pub(super) async fn database_answers(&self) -> bool {
        let ping = self.sink.store.ping();
        matches!(
            tokio::time::timeout(Duration::from_millis(250), ping).await,
            Ok(Ok(()))
        )
    }

    /// During an outage: publishes the events no client has seen yet, so
    /// they still flow live; they are committed later, unchanged.
    pub(super) fn publish_early(&mut self) {
        let fresh: Vec<Event> = self
            .batch
            .events
            .iter()
            .filter(|e| e.seq > self.published)
            .cloned()
            .collect();
        if let Some(last) = fresh.last() {
            self.published = last.seq;
            self.sink.bus.publish(self.owner.as_deref(), fresh);
        }
    }

    /// Tries to commit what is buffered until it is (or `deadline` passes);
    /// whether everything is committed.
    pub async fn flush_until(&mut self, deadline: tokio::time::Instant) -> bool {
        loop {
            if let Err(e) = self.flush().await {
                tracing::error!(conversation_id = %self.conversation_id, error = %e,
                    "could not write the conversation's last events");
                return false;
            }
            if !self.in_outage() {
                return true;
            }
            let retry_at = self.outage.map_or(deadline, |o| o.retry_at);
            if retry_at > deadline {
                tracing::error!(conversation_id = %self.conversation_id,
                    events = self.batch.events.len(),
                    "the database stayed unreachable: events buffered in memory are lost");
                return false;
            }
            tokio::time::sleep_until(retry_at).await;
        }
    }

    pub(super) async fn commit_with_retries(&mut self) -> Result<()> {
        let mut attempt = 0;
        loop {
            let started = std::time::Instant::now();
            self.batch.fence = self.fence;
            if let Some((link, cursor)) = &mut self.link {
                let at = cursor.position();
                link.output_to = at.to;
                link.output_inside_long_line = at.inside_long_line;
                self.batch.link = Some(link.clone());
            }
            let committed = self
                .sink
                .store
                .commit(self.conversation_id, &self.batch)
                .await;
            telemetry::commit_took(started.elapsed());
            match committed {
                Ok(()) => break,
                // A writer that rides out outages tries again later instead.
                Err(e) if e.is_transient() && attempt < 3 && self.max_buffered == 0 => {
                    attempt += 1;
                    tracing::warn!(conversation_id = %self.conversation_id, error = %e, attempt, "commit failed; retrying");
                    tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
                }
                // Another node owns the conversation now: nothing of this
                // node's is written any more.
                Err(e) if e.is_transient() || e.is_fenced() => return Err(e),
                Err(e) => {
                    tracing::warn!(conversation_id = %self.conversation_id, error = %e,
                        "the database refused a batch; writing it piece by piece");
                    let link = self.batch.link.clone();
                    self.commit_piecewise().await?;
                    self.acknowledge(link.as_ref());
                    return Ok(());
                }
            }
        }
        let batch = std::mem::take(&mut self.batch);
        self.acknowledge(batch.link.as_ref());
        self.committed();
        telemetry::events_written(batch.events.len());
        self.publish_committed(batch.events);
        Ok(())
    }

    /// The agent's output before `link.output_to` is committed: its shim
    /// may forget it.
    fn acknowledge(&mut self, link: Option<&AgentLink>) {
        if let (Some(link), Some((_, cursor))) = (link, &self.link) {
            cursor.committed(link.output_to);
            self.acknowledged = Processed {
                to: link.output_to,
                inside_long_line: link.output_inside_long_line,
            };
        }
    }
}
