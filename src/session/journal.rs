//! The write side of one conversation: assigns `seq`, collects events and the
//! state they imply into a [`Batch`], commits it, then publishes the events.
//!
//! A conversation has exactly one `Journal` at a time (its session task, or
//! the recovery pass at start-up), which is what makes `seq` gap-free without
//! a database round-trip per event. Writers append through its typed
//! methods (events, chunks joined while uncommitted, requests, messages,
//! tool calls, the end of an agent); the batch itself is private.
//!
//! This file holds the appending, the commit and the publishing after it:
//! the normal path, start to end. `journal/outage.rs` rides out a database
//! outage (buffering, publishing early, retrying), and `journal/storable.rs`
//! is the fallback for what the database refuses (each part alone, then
//! stand-ins).
//!
//! For an agent under a shim, every commit also writes how far the agent's
//! output is dealt with (given by the session task before it commits); the
//! journal says how far that is committed
//! ([`Journal::committed_output`]), and the task tells the shim it may
//! forget what lies before. The journal itself knows nothing of the shim.

use std::time::Duration;

use serde_json::Value;
use uuid::Uuid;

use crate::acp::rpc::Processed;
use crate::bus::EventBus;
use crate::error::Result;
use crate::model::{
    self, AgentReport, AgentStatus, ChunkKind, Conversation, ConversationStatus, Decision, Event,
    EventBody, MessagePart, PermissionRequest, PermissionStatus, QueuedPrompt, SessionUpdate,
    ToolCall, TurnEnded, UsageReading, UsageRecord,
};
use crate::store::{AgentLink, Batch, CommitQueue, ConversationPatch, Resolution, Store};
use crate::telemetry;

mod outage;
mod storable;

/// Where a journal's events go: the store (committed), then the bus
/// (published).
#[derive(Clone)]
pub struct Outlets {
    pub store: std::sync::Arc<dyn Store>,
    pub bus: EventBus,
}

/// See the module docs.
pub struct Journal {
    outlets: Outlets,
    conversation_id: Uuid,
    last_seq: i64,
    status: ConversationStatus,
    acp_session_id: Option<String>,
    turn_id: Option<Uuid>,
    /// What the agent reports about its session, when that changed since
    /// the last commit.
    state: Option<AgentReport>,
    /// The prompt queue, once it changed (written with the next commit).
    queue: Option<Vec<QueuedPrompt>>,
    /// The conversation's owner, carried along with published events (and
    /// its usage records: spend is the owner's).
    owner: Option<String>,
    /// The conversation's agent profile, for its usage records.
    agent: String,
    /// What has not been committed yet.
    batch: Batch,
    dirty: bool,
    /// Something clients wait for is buffered (a status change, a permission
    /// request): commit it now, not with the next batch.
    urgent: bool,
    /// Since when the oldest thing buffered waits to be committed.
    buffered_since: Option<tokio::time::Instant>,
    /// Text buffered in joined message chunks, in bytes.
    buffered_text: usize,
    /// Most events buffered while riding out a database outage (see
    /// [`Journal::ride_out_outages`]); 0: outages fail the writer.
    max_buffered: usize,
    /// While the database is unreachable: when to try again, and how long
    /// to wait after that.
    outage: Option<Outage>,
    /// The newest seq already published (events are published once, in
    /// order; during an outage, before they are committed).
    published: i64,
    /// How many of its events the write-buffer gauge counts now.
    gauged: usize,
    /// Who waits for the next commit.
    lane: CommitQueue,
    /// The owner epoch every write is conditional on (see
    /// [`crate::store::Batch::fence`]).
    fence: Option<i64>,
    /// An agent under a shim: its link state goes with every commit (see
    /// [`Journal::link_to`]).
    link: Option<AgentLink>,
    /// How far the agent's output is committed, since the session task
    /// last asked (see [`Journal::committed_output`]).
    committed_output: Option<Processed>,
    /// The agent's output was dealt with further than is committed, and
    /// nothing else waits: the link alone is to be committed (see
    /// [`Journal::output_moved`]).
    output_due: bool,
}

/// Longest wait between two tries to reach the database.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// A database outage the journal is riding out.
#[derive(Debug, Clone, Copy)]
struct Outage {
    retry_at: tokio::time::Instant,
    backoff: Duration,
}

impl Journal {
    pub fn new(outlets: Outlets, conversation: &Conversation, turn_id: Option<Uuid>) -> Self {
        Journal {
            outlets,
            conversation_id: conversation.id,
            last_seq: conversation.last_seq,
            status: conversation.status,
            acp_session_id: conversation.acp_session_id.clone(),
            turn_id,
            state: None,
            queue: None,
            owner: conversation.owner.clone(),
            agent: conversation.agent.clone(),
            batch: Batch::default(),
            dirty: false,
            urgent: false,
            buffered_since: None,
            buffered_text: 0,
            max_buffered: 0,
            outage: None,
            published: conversation.last_seq,
            gauged: 0,
            lane: CommitQueue::Person,
            fence: None,
            link: None,
            committed_output: None,
            output_due: false,
        }
    }

    /// Commits `link` (kept up to date through [`Journal::link_mut`] and
    /// [`Journal::output_at`]) with every batch.
    pub fn link_to(&mut self, link: AgentLink) {
        self.link = Some(link);
    }

    /// Everything of the agent's output before `at` is dealt with: the next
    /// commit writes so with the link, for a gateway taking over to read on
    /// from there. Given by the session task before each commit.
    pub fn output_at(&mut self, at: Processed) {
        if let Some(link) = &mut self.link {
            link.output_to = at.to;
            link.output_inside_long_line = at.inside_long_line;
        }
    }

    /// How far the agent's output is committed by the commits since this
    /// was last asked (`None`: none wrote the link): its shim may forget
    /// what lies before.
    pub fn committed_output(&mut self) -> Option<Processed> {
        self.committed_output.take()
    }

    /// The agent's output was dealt with further than is committed (lines
    /// dropped, too long, a message ignored): when nothing else waits to
    /// be, the link alone is committed when the batch window closes, so its
    /// shim lets go of that output as surely as of output that made events.
    /// (A shim holding only such output would otherwise fill up, stop
    /// reading its agent and wedge the conversation.) When something else
    /// waits, the link goes with it anyway.
    pub fn output_moved(&mut self) {
        if self.link.is_none() || self.output_due || self.dirty || !self.batch.is_empty() {
            return;
        }
        self.output_due = true;
        self.start_window();
    }

    /// The link state committed with the next batch (an agent under a shim).
    pub fn link_mut(&mut self) -> Option<&mut AgentLink> {
        self.link.as_mut()
    }

    /// Writes only while the conversation's owner epoch is `fence` (see
    /// [`crate::store::Batch::fence`]).
    pub fn fenced_at(mut self, fence: Option<i64>) -> Self {
        self.fence = fence;
        self
    }

    /// Who waits for what is committed from now on: a person (the default:
    /// a journal works for a call) or, in a running session between
    /// commands, its agent.
    pub fn serve(&mut self, lane: CommitQueue) {
        self.lane = lane;
    }

    /// The seq of the newest event, committed or not.
    pub fn last_seq(&self) -> i64 {
        self.last_seq
    }

    pub fn store(&self) -> &dyn Store {
        &*self.outlets.store
    }

    /// Records how much the conversation's worktree differs from its base,
    /// for the list (a failure is logged: the next record mends it). Holds
    /// no borrow of the journal while it runs.
    pub fn record_change_totals(
        &self,
        totals: &crate::model::ChangeTotals,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let (id, store, totals) = (self.conversation_id, self.outlets.store.clone(), *totals);
        async move {
            if let Err(e) = store.set_change_totals(id, &totals).await {
                tracing::warn!(conversation_id = %id, error = %e, "could not record the worktree's change totals");
            }
        }
    }

    pub fn conversation_id(&self) -> Uuid {
        self.conversation_id
    }

    /// The conversation's status as of the newest append.
    pub fn status(&self) -> ConversationStatus {
        self.status
    }

    /// Whether what is buffered should be committed now rather than joined by
    /// more: it is urgent, it has waited `window`, or it held `max_text`
    /// bytes of text or `max_events` events. Streaming agents write many
    /// small chunks; committing them together costs a few rows per batch
    /// instead of a few per chunk.
    pub fn commit_due(&self, window: Duration, max_events: usize, max_text: usize) -> bool {
        self.urgent
            || self.batch.events.len() >= max_events
            || self.buffered_text >= max_text
            || self
                .buffered_since
                .is_some_and(|since| since.elapsed() >= window)
    }

    /// Resolves when what is buffered has waited `window` (never while nothing
    /// is buffered, or while an outage governs when to write).
    pub async fn window_closes(&self, window: Duration) {
        match self.buffered_since {
            Some(since) if self.outage.is_none() => tokio::time::sleep_until(since + window).await,
            _ => std::future::pending().await,
        }
    }

    fn start_window(&mut self) {
        if self.buffered_since.is_none() {
            self.buffered_since = Some(tokio::time::Instant::now());
        }
    }

    /// Appends an event of a type the gateway defines (its typed `data`,
    /// e.g. a [`TurnEnded`]).
    pub fn append(&mut self, body: impl Into<EventBody>) {
        self.event(body.into());
    }

    /// Appends a `session_update` event carrying the agent's `update`
    /// verbatim (moved, not copied: it may be megabytes long).
    pub fn session_update(&mut self, update: Value, turn_id: Option<Uuid>) {
        self.event(EventBody::SessionUpdate(SessionUpdate::new(
            turn_id, update,
        )));
    }

    /// Like [`Journal::session_update`] for a `usage_update`, which is also
    /// kept as a usage record (`reading`: what it says, with its cost
    /// increase), written in the same commit as its event.
    pub fn usage_update(&mut self, update: Value, turn_id: Option<Uuid>, reading: UsageReading) {
        self.session_update(update, turn_id);
        let (cost_amount, cost_currency) = match reading.cost {
            Some(cost) => (Some(cost.amount), Some(cost.currency)),
            None => (None, None),
        };
        let at = self.batch.events.last().map_or_else(model::now, |e| e.at);
        self.batch.usage.push(UsageRecord {
            id: model::new_id(),
            conversation_id: self.conversation_id,
            turn_id,
            owner: self.owner.clone(),
            agent: self.agent.clone(),
            at,
            seq: Some(self.last_seq),
            used: reading.used,
            size: reading.size,
            cost_amount,
            cost_currency,
            delta: reading.delta,
        });
    }

    /// Like [`Journal::session_update`] for a message chunk, but a plain
    /// text chunk joins the previous uncommitted event when that is a chunk
    /// of the same kind and turn that differs only in its text (see
    /// [`SessionUpdate::join_chunk`]): streaming costs one event per batch.
    pub fn chunk(&mut self, update: Value, turn_id: Option<Uuid>) {
        if let Some(last) = self.joinable(turn_id) {
            if last.join_chunk(&update) {
                self.buffered_text += update["content"]["text"].as_str().map_or(0, str::len);
                return;
            }
        }
        self.session_update(update, turn_id);
    }

    /// [`Journal::chunk`] for a plain text chunk of `kind` read on the fast
    /// path: the same events, without building its JSON unless it starts
    /// one.
    pub fn text_chunk(&mut self, kind: ChunkKind, text: &str, turn_id: Option<Uuid>) {
        let prev = self
            .joinable(turn_id)
            .and_then(|last| last.chunk_text_mut(kind));
        match prev {
            Some(prev) => {
                prev.push_str(text);
                self.buffered_text += text.len();
            }
            None => self.session_update(kind.text_update(text), turn_id),
        }
    }

    /// The newest event's data, if it is an unpublished `session_update` of
    /// this turn (what a chunk may join).
    fn joinable(&mut self, turn_id: Option<Uuid>) -> Option<&mut SessionUpdate> {
        let last = self
            .batch
            .events
            .last_mut()
            .filter(|last| last.seq > self.published)?;
        match &mut last.body {
            EventBody::SessionUpdate(update) if update.turn_id() == turn_id => Some(update),
            _ => None,
        }
    }

    /// A new permission request, announced by `permission_requested` and
    /// stored with the batch; `decided` (by policy) resolves it in the same
    /// batch, announced by `permission_resolved`, so nobody can answer in
    /// between.
    pub fn add_permission_request(
        &mut self,
        request: &PermissionRequest,
        decided: Option<(PermissionStatus, Decision)>,
    ) {
        self.event(EventBody::asked(request.clone()));
        self.urgent = true;
        match decided {
            None => self.batch.new_permissions.push(request.clone()),
            Some((status, decision)) => {
                let resolved = PermissionRequest {
                    status,
                    decision: Some(decision),
                    ..request.clone()
                };
                self.batch.new_permissions.push(resolved.clone());
                self.event(EventBody::resolved(resolved));
            }
        }
    }

    /// What was added to a message, written with the batch.
    pub fn save_message(&mut self, part: MessagePart) {
        self.batch.messages.push(part);
    }

    /// A tool call's current state, written with the batch.
    pub fn save_tool_call(&mut self, call: ToolCall) {
        self.batch.tool_calls.push(call);
    }

    fn event(&mut self, body: EventBody) {
        self.start_window();
        let event = self.next_event(body);
        self.last_seq = event.seq;
        self.batch.events.push(event);
    }

    fn next_event(&self, body: EventBody) -> Event {
        Event {
            seq: self.last_seq + 1,
            conversation_id: self.conversation_id,
            at: model::now(),
            body,
        }
    }

    pub fn set_status(&mut self, status: ConversationStatus) {
        if self.status != status {
            self.status = status;
            self.changed(true);
        }
    }

    pub fn set_acp_session_id(&mut self, id: String) {
        self.acp_session_id = Some(id);
        self.changed(true);
    }

    pub fn set_turn(&mut self, turn_id: Option<Uuid>) {
        self.turn_id = turn_id;
        self.changed(true);
    }

    /// Records what the agent now reports about its session.
    pub fn set_state(&mut self, state: &AgentReport) {
        self.state = Some(state.clone());
        self.changed(false);
    }

    /// Records the prompt queue as it is now.
    pub fn set_queue(&mut self, queue: &[QueuedPrompt]) {
        self.queue = Some(queue.to_vec());
        self.changed(true);
    }

    fn changed(&mut self, urgent: bool) {
        self.dirty = true;
        self.urgent |= urgent;
        self.start_window();
    }

    /// The conversation's state is committed: nothing of it waits.
    fn committed(&mut self) {
        self.dirty = false;
        self.output_due = false;
        self.urgent = false;
        self.buffered_since = None;
        self.buffered_text = 0;
        self.state = None;
        self.queue = None;
    }

    fn patch(&self, last_seq: i64) -> ConversationPatch {
        ConversationPatch {
            status: self.status,
            acp_session_id: self.acp_session_id.clone(),
            last_seq,
            current_turn_id: self.turn_id,
            updated_at: model::now(),
            state: self.state.clone(),
            queue: self.queue.clone(),
        }
    }

    /// Commits the batch and publishes its events. Transient database errors
    /// are retried a few times; the batch is kept if they persist (or, for
    /// a writer that rides out outages, held while the database is away:
    /// see `journal/outage.rs`). A batch the database refuses for what it
    /// held is written piece by piece instead (see `Journal::commit_piecewise`),
    /// so one bad value never blocks the conversation.
    pub async fn flush(&mut self) -> Result<()> {
        let link_alone = self.batch.is_empty() && !self.dirty;
        if link_alone && !self.output_due {
            self.outage = None;
            self.buffered_since = None;
            return Ok(());
        }
        // The link alone leaves the conversation as it is (its
        // `updated_at` included).
        if !link_alone {
            self.batch.conversation = Some(self.patch(self.last_seq));
        }
        self.batch.lane = self.lane;
        if self.outage.is_some() && self.still_away().await {
            return Ok(());
        }
        self.gauge();
        let committed = self.commit().await;
        self.gauge();
        match committed {
            Err(e) if e.is_transient() && self.max_buffered > 0 => {
                self.went_away(&e);
                Ok(())
            }
            Err(e) => Err(e),
            Ok(()) => {
                self.came_back();
                Ok(())
            }
        }
    }

    /// Commits the batch (a writer that does not ride out outages tries a
    /// transient error again a few times), then publishes its events.
    async fn commit(&mut self) -> Result<()> {
        self.batch.fence = self.fence;
        self.batch.link = self.link.clone();
        let mut attempt = 0;
        loop {
            let started = std::time::Instant::now();
            let committed = self
                .outlets
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
                    self.output_committed(link.as_ref());
                    return Ok(());
                }
            }
        }
        let batch = std::mem::take(&mut self.batch);
        self.output_committed(batch.link.as_ref());
        self.committed();
        telemetry::events_written(batch.events.len());
        self.publish_committed(batch.events);
        Ok(())
    }

    /// `link` is committed: how far the agent's output is, for the session
    /// task to tell its shim (see [`Journal::committed_output`]).
    fn output_committed(&mut self, link: Option<&AgentLink>) {
        if let Some(link) = link {
            self.committed_output = Some(Processed {
                to: link.output_to,
                inside_long_line: link.output_inside_long_line,
            });
        }
    }

    /// Publishes what the commit made durable, except what went out early
    /// during an outage (see [`Journal::early_ones_committed`]).
    fn publish_committed(&mut self, mut events: Vec<Event>) {
        if events.first().is_some_and(|e| e.seq <= self.published) {
            self.early_ones_committed(&events);
            events.retain(|e| e.seq > self.published);
        }
        if let Some(last) = events.last() {
            self.published = last.seq;
            self.outlets.bus.publish(self.owner.as_deref(), events);
        }
    }

    /// Keeps the write-buffer gauge at what this journal held.
    fn gauge(&mut self) {
        let buffered = self.batch.events.len();
        telemetry::buffered(buffered as f64 - self.gauged as f64);
        self.gauged = buffered;
    }

    /// Commits what is buffered, then applies `resolution` if the request is
    /// still pending, together with its `permission_resolved` event and the
    /// conversation's columns. `None`: someone else resolved it first.
    pub async fn resolve(&mut self, resolution: &Resolution) -> Result<Option<PermissionRequest>> {
        // Held events go first. A change of the conversation's own columns
        // alone (its status, say) needs no commit of its own: the resolution
        // writes them.
        if !self.batch.is_empty() || self.in_outage() {
            self.flush().await?;
        }
        if self.in_outage() {
            // Its event would come before the buffered ones: wait for them.
            return Err(crate::error::Error::Unavailable(
                "the database is unreachable; try again".into(),
            ));
        }
        let mut moved = false;
        let resolved = loop {
            // The store fills in the request as it resolved it.
            let event = self.next_event(EventBody::resolved(resolution.resolved()));
            let patch = self.patch(event.seq);
            let resolved = self
                .outlets
                .store
                .resolve_permission(resolution, event, &patch, self.fence)
                .await;
            match resolved {
                // Its seq is taken (this journal is behind what is stored:
                // see `Journal::move_past`): once more, after it.
                Err(e) if e.is_unique_violation() && !moved => {
                    let newest = self
                        .outlets
                        .store
                        .last_event_seq(self.conversation_id)
                        .await?;
                    moved = self.move_past(newest);
                    if !moved {
                        return Err(e);
                    }
                }
                other => break other?,
            }
        };
        match resolved {
            Some((request, event)) => {
                telemetry::events_written(1);
                self.last_seq = event.seq;
                self.published = event.seq;
                self.committed();
                self.outlets.bus.publish(self.owner.as_deref(), [event]);
                Ok(Some(request))
            }
            None => Ok(None),
        }
    }

    /// The store holds events up to `newest`, past what this journal took
    /// for stored: it started behind them (a conversation's `last_seq` left
    /// behind them by an earlier run) or went on behind them (a resolution
    /// committed whose answer was lost). What is buffered moves past them,
    /// in order, so no seq that is stored is used again; what was published
    /// early under the old seqs goes out again under the new. Whether
    /// anything moved.
    fn move_past(&mut self, newest: i64) -> bool {
        let first = self
            .batch
            .events
            .first()
            .map_or(self.last_seq + 1, |e| e.seq);
        let shift = newest + 1 - first;
        if shift <= 0 {
            return false;
        }
        tracing::warn!(conversation_id = %self.conversation_id, from = first, to = first + shift,
            "the store holds events this journal did not count: going on after them");
        for event in &mut self.batch.events {
            event.seq += shift;
        }
        // The usage records of the events that moved move with them.
        for record in &mut self.batch.usage {
            match &mut record.seq {
                Some(seq) if *seq >= first => *seq += shift,
                _ => {}
            }
        }
        self.last_seq += shift;
        self.published = self.published.min(newest);
        if let Some(patch) = &mut self.batch.conversation {
            patch.last_seq = self.last_seq;
        }
        true
    }

    /// Records that the conversation's agent is gone: the running turn (if
    /// any) ends with `turn_ended`, then `agent_status` says how the agent
    /// went, and the conversation is left in `status`.
    pub async fn agent_gone(
        &mut self,
        turn_ended: Option<TurnEnded>,
        agent: AgentStatus,
        status: ConversationStatus,
    ) -> Result<()> {
        if let Some(turn_ended) = turn_ended {
            self.append(turn_ended);
        }
        self.append(agent);
        self.set_turn(None);
        self.set_status(status);
        self.flush().await
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        // What it still held is no longer waiting anywhere.
        telemetry::buffered(-(self.gauged as f64));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A journal of a new conversation in a SQLite database in `dir`, as a
    /// gateway starts one, and what it writes to.
    pub(super) async fn journal_in(dir: &std::path::Path) -> (Journal, Outlets) {
        let url = format!("sqlite://{}", dir.join("gateway.db").display());
        let store = crate::store::open(&url).await.unwrap();
        let conversation = Conversation {
            id: model::new_id(),
            agent: "demo".into(),
            title: None,
            cwd: "/tmp".into(),
            status: ConversationStatus::Idle,
            acp_session_id: None,
            last_seq: 0,
            created_at: model::now(),
            updated_at: model::now(),
            owner: None,
            state: Default::default(),
            node_id: None,
            queue: Vec::new(),
            forked_from: None,
            adopted_session: None,
            worktree: None,
            changes: None,
            spend: Vec::new(),
            sharing: Default::default(),
        };
        store.insert_conversation(&conversation).await.unwrap();
        let outlets = Outlets {
            store,
            bus: EventBus::new(16),
        };
        (Journal::new(outlets.clone(), &conversation, None), outlets)
    }

    fn at(to: u64) -> Processed {
        Processed {
            to,
            inside_long_line: false,
        }
    }

    /// The position the task gives goes with the next commit, events or
    /// the link alone, and the journal then says once how far that commit
    /// took the agent's output (for the task to tell the shim); without a
    /// link there is nothing to say.
    #[tokio::test]
    async fn a_commit_says_once_how_far_it_took_the_agents_output() {
        let dir = tempfile::tempdir().unwrap();
        let (mut journal, _) = journal_in(dir.path()).await;
        journal.output_at(at(7));
        journal.append(AgentStatus::new(model::AgentState::Ready, None));
        journal.flush().await.unwrap();
        assert_eq!(journal.committed_output(), None, "no link, nothing said");

        journal.link_to(AgentLink::default());
        journal.output_at(at(42));
        journal.session_update(json!({"sessionUpdate": "usage_update"}), None);
        assert_eq!(journal.committed_output(), None, "not before the commit");
        journal.flush().await.unwrap();
        assert_eq!(journal.committed_output(), Some(at(42)));
        assert_eq!(journal.committed_output(), None, "said once");

        // Output dealt with by the reader alone: the link goes by itself.
        journal.output_at(at(50));
        journal.output_moved();
        journal.flush().await.unwrap();
        assert_eq!(journal.committed_output(), Some(at(50)));
    }
}
