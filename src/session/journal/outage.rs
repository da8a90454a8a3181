//! Riding out a database outage: while the database does not answer, the
//! journal keeps what it would have committed (up to a bound), publishes it
//! at once so live clients see it (before it is committed: the one case
//! where an event reaches the bus first), tries again with a growing
//! backoff, and commits it all once the database answers. The normal path
//! (`journal.rs`) comes here only while an outage lasts, or when a commit
//! finds the database gone.

use std::time::Duration;

use super::{Journal, Outage, MAX_BACKOFF};
use crate::error::Error;
use crate::model::Event;

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

    /// During an outage, before a commit: whether the database is still
    /// away (not yet time to try it, or it does not answer a brief ping, so
    /// that the session keeps serving meanwhile). If so, what is buffered is
    /// published early and held.
    pub(super) async fn still_away(&mut self) -> bool {
        let Some(outage) = self.outage else {
            return false;
        };
        let now = tokio::time::Instant::now();
        if now >= outage.retry_at && self.database_answers().await {
            return false;
        }
        if now >= outage.retry_at {
            let backoff = (outage.backoff * 2).min(MAX_BACKOFF);
            self.outage = Some(Outage {
                retry_at: now + backoff,
                backoff,
            });
        }
        self.publish_early();
        self.gauge();
        true
    }

    /// A commit found the database gone (`e`): what it held waits, published
    /// early, and is tried again after a growing backoff.
    pub(super) fn went_away(&mut self, e: &Error) {
        let backoff = self.outage.map_or(Duration::from_millis(250), |o| {
            (o.backoff * 2).min(MAX_BACKOFF)
        });
        if self.outage.is_none() {
            tracing::warn!(conversation_id = %self.conversation_id, error = %e,
                "the database is unreachable: holding writes in memory and trying again");
        }
        self.outage = Some(Outage {
            retry_at: tokio::time::Instant::now() + backoff,
            backoff,
        });
        self.publish_early();
    }

    /// A commit went through: any outage is over.
    pub(super) fn came_back(&mut self) {
        if self.outage.take().is_some() {
            tracing::info!(conversation_id = %self.conversation_id,
                "the database answers again: buffered writes committed");
        }
    }

    /// Whether the database answers a ping within a moment.
    async fn database_answers(&self) -> bool {
        let ping = self.outlets.store.ping();
        matches!(
            tokio::time::timeout(Duration::from_millis(250), ping).await,
            Ok(Ok(()))
        )
    }

    /// During an outage: publishes the events no client has seen yet, so
    /// they still flow live; they are committed later, unchanged.
    fn publish_early(&mut self) {
        let fresh: Vec<Event> = self
            .batch
            .events
            .iter()
            .filter(|e| e.seq > self.published)
            .inspect(|e| e.body.make_json())
            .cloned()
            .collect();
        if let Some(last) = fresh.last() {
            self.published = last.seq;
            self.outlets.bus.publish(self.owner.as_deref(), fresh);
        }
    }

    /// `committed` (in `seq` order) begins with events published early: the
    /// last of those is sent again to the conversation's sockets, now that
    /// the store holds it (a socket that reconnected during the outage
    /// waits for the store, not for the next event), and other nodes are
    /// told of all of them.
    pub(super) fn early_ones_committed(&self, committed: &[Event]) {
        let published = self.published;
        let mut early = committed.iter().filter(|e| e.seq <= published);
        if let Some(first) = early.next() {
            let last = early.next_back().unwrap_or(first);
            self.outlets.bus.remind(self.owner.as_deref(), last);
            // Other nodes' sockets read them from the store, now they are there.
            self.outlets.bus.announce_committed(crate::bus::Announced {
                conversation: first.conversation_id,
                first: first.seq,
                last: last.seq,
            });
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
}
