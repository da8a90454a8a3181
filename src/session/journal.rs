//! The write side of one conversation: assigns `seq`, collects events and the
//! state they imply into a [`Batch`], commits it, then publishes the events.
//!
//! A conversation has exactly one `Journal` at a time (its session task, or
//! the recovery pass at start-up), which is what makes `seq` gap-free without
//! a database round-trip per event. Writers append through its typed
//! methods (events, chunks joined while uncommitted, requests, messages,
//! tool calls, the end of an agent); the batch itself is private.

use std::time::Duration;

use serde_json::Value;
use uuid::Uuid;

use super::transcript;
use crate::acp::chunk::TextChunk;
use crate::bus::EventBus;
use crate::error::Result;
use crate::model::{
    self, AgentStatus, Conversation, ConversationStatus, Decision, Event, EventBody, MessagePart,
    PermissionRequest, PermissionStatus, SessionState, SessionUpdate, ToolCall, TurnEnded,
};
use crate::store::{Batch, ConversationPatch, Lane, Resolution, Store};
use crate::telemetry;

/// Forms of a value that a database refusing the original can still hold.
mod storable {
    use serde_json::{json, Map, Value};

    use crate::model::{Event, EventBody, ToolCall};

    /// Longest string kept in a stand-in.
    const MAX_STRING: usize = 4096;

    /// `value` with NUL characters replaced and long strings cut.
    pub fn lossy(value: &Value) -> Value {
        match value {
            Value::String(s) => Value::String(lossy_str(s)),
            Value::Array(items) => Value::Array(items.iter().map(lossy).collect()),
            Value::Object(map) => {
                Value::Object(map.iter().map(|(k, v)| (lossy_str(k), lossy(v))).collect())
            }
            other => other.clone(),
        }
    }

    fn lossy_str(s: &str) -> String {
        let mut end = s.len().min(MAX_STRING);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        let mut out = s[..end].replace('\0', "\u{FFFD}");
        if end < s.len() {
            out.push_str("…[cut: could not be stored]");
        }
        out
    }

    pub fn lossy_tool_call(call: &ToolCall) -> ToolCall {
        let text = |s: &Option<String>| s.as_deref().map(lossy_str);
        let doc = |v: &Option<Value>| v.as_ref().map(lossy);
        ToolCall {
            tool_call_id: lossy_str(&call.tool_call_id),
            turn_id: call.turn_id,
            title: text(&call.title),
            kind: text(&call.kind),
            status: text(&call.status),
            content: doc(&call.content),
            locations: doc(&call.locations),
            raw_input: doc(&call.raw_input),
            raw_output: doc(&call.raw_output),
            created_at: call.created_at,
            updated_at: call.updated_at,
        }
    }

    /// What to store instead of an event the database refused, best first:
    /// its data made lossy, then only the small members clients rely on
    /// (`turn_id`, `stop_reason`, `status`). Both say `unstorable`.
    pub fn event_stand_ins(event: &Event) -> Vec<Event> {
        let note = "the database could not store this event as the agent sent it";
        let data = event.data_value();
        let mut lossy = match lossy(&data) {
            Value::Object(map) => map,
            other => Map::from_iter([("value".to_owned(), other)]),
        };
        lossy.insert("unstorable".into(), json!(note));
        let mut minimal = Map::new();
        for key in ["turn_id", "stop_reason", "status"] {
            if let Some(Value::String(s)) = data.get(key) {
                if s.len() <= 64 && !s.contains('\0') {
                    minimal.insert(key.into(), json!(s));
                }
            }
        }
        minimal.insert("unstorable".into(), json!(note));
        [lossy, minimal]
            .into_iter()
            .map(|data| Event {
                body: EventBody::Verbatim {
                    kind: event.body.kind().to_owned(),
                    data: Value::Object(data),
                },
                ..event.clone()
            })
            .collect()
    }
}

/// Shared services a journal writes to.
#[derive(Clone)]
pub struct Sink {
    pub store: std::sync::Arc<dyn Store>,
    pub bus: EventBus,
}

/// See the module docs.
pub struct Journal {
    sink: Sink,
    conversation_id: Uuid,
    last_seq: i64,
    status: ConversationStatus,
    acp_session_id: Option<String>,
    turn_id: Option<Uuid>,
    /// What the agent reports about its session, when that changed since
    /// the last commit.
    state: Option<SessionState>,
    /// The conversation's owner, carried along with published events.
    owner: Option<String>,
    /// What has not been committed yet.
    batch: Batch,
    dirty: bool,
    /// Something clients wait for is held (a status change, a permission
    /// request): commit it now, not with the next batch.
    urgent: bool,
    /// Since when the oldest thing held waits to be committed.
    held_since: Option<tokio::time::Instant>,
    /// Text held in joined message chunks, in bytes.
    held_text: usize,
    /// Most events held while riding out a database outage (see
    /// [`Journal::ride_out_outages`]); 0: outages fail the writer.
    holds: usize,
    /// While the database is unreachable: when to try again, and how long
    /// to wait after that.
    outage: Option<Outage>,
    /// The newest seq already published (events are published once, in
    /// order; during an outage, before they are committed).
    published: i64,
    /// How many of its events the write-buffer gauge counts now.
    gauged: usize,
    /// Who waits for the next commit.
    lane: Lane,
}

/// A database outage the journal is riding out.
#[derive(Debug, Clone, Copy)]
struct Outage {
    retry_at: tokio::time::Instant,
    backoff: Duration,
}

/// Longest wait between two tries to reach the database.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

impl Journal {
    pub fn new(sink: Sink, conversation: &Conversation, turn_id: Option<Uuid>) -> Self {
        Journal {
            sink,
            conversation_id: conversation.id,
            last_seq: conversation.last_seq,
            status: conversation.status,
            acp_session_id: conversation.acp_session_id.clone(),
            turn_id,
            state: None,
            owner: conversation.owner.clone(),
            batch: Batch::default(),
            dirty: false,
            urgent: false,
            held_since: None,
            held_text: 0,
            holds: 0,
            outage: None,
            published: conversation.last_seq,
            gauged: 0,
            lane: Lane::Person,
        }
    }

    /// From now on a database outage does not fail [`Journal::flush`]: what
    /// is appended waits in memory, in order (the writer takes no more once
    /// it holds `max_events`: see [`Journal::is_full`]), its events are
    /// published live meanwhile, and commits are tried again with back-off
    /// until the database answers; `seq` stays gap-free. For a session's
    /// writer, which lives on to keep trying; others fail.
    pub fn ride_out_outages(&mut self, max_events: usize) {
        self.holds = max_events.max(1);
    }

    /// Who waits for what is committed from now on: a person (the default:
    /// a journal works for a call) or, in a running session between
    /// commands, its agent.
    pub fn serve(&mut self, lane: Lane) {
        self.lane = lane;
    }

    /// Whether the database is unreachable and writes are waiting.
    pub fn in_outage(&self) -> bool {
        self.outage.is_some()
    }

    /// Whether the buffer is full: take nothing more until it drains.
    pub fn is_full(&self) -> bool {
        self.outage.is_some() && self.batch.events.len() >= self.holds
    }

    /// Resolves when it is time to try the database again (never while it
    /// answers).
    pub async fn retry_due(&self) {
        match self.outage {
            Some(outage) => tokio::time::sleep_until(outage.retry_at).await,
            None => std::future::pending().await,
        }
    }

    /// The seq of the newest event, committed or not.
    pub fn last_seq(&self) -> i64 {
        self.last_seq
    }

    pub fn store(&self) -> &dyn Store {
        &*self.sink.store
    }

    pub fn conversation_id(&self) -> Uuid {
        self.conversation_id
    }

    /// The conversation's status as of the newest append.
    pub fn status(&self) -> ConversationStatus {
        self.status
    }

    /// Whether what is held should be committed now rather than joined by
    /// more: it is urgent, it has waited `window`, or it holds `max_text`
    /// bytes of text or `max_events` events. Streaming agents write many
    /// small chunks; committing them together costs a few rows per batch
    /// instead of a few per chunk.
    pub fn commit_due(&self, window: Duration, max_events: usize, max_text: usize) -> bool {
        self.urgent
            || self.batch.events.len() >= max_events
            || self.held_text >= max_text
            || self
                .held_since
                .is_some_and(|since| since.elapsed() >= window)
    }

    /// Resolves when what is held has waited `window` (never while nothing
    /// is held, or while an outage governs when to write).
    pub async fn window_closes(&self, window: Duration) {
        match self.held_since {
            Some(since) if self.outage.is_none() => tokio::time::sleep_until(since + window).await,
            _ => std::future::pending().await,
        }
    }

    fn hold(&mut self) {
        if self.held_since.is_none() {
            self.held_since = Some(tokio::time::Instant::now());
        }
    }

    /// Appends an event of a type the gateway defines (its typed `data`,
    /// e.g. a [`TurnEnded`]).
    pub fn append(&mut self, body: impl Into<EventBody>) {
        self.event(body.into());
    }

    /// Appends a `session_update` event carrying the agent's `update`
    /// verbatim (moved, not copied: it may be megabytes long).
    pub fn session_update(&mut self, turn_id: Option<Uuid>, update: Value) {
        self.event(EventBody::SessionUpdate(SessionUpdate { turn_id, update }));
    }

    /// Like [`Journal::session_update`] for a message chunk, but a plain
    /// text chunk joins the previous uncommitted event when that is a chunk
    /// of the same kind and turn that differs only in its text (see
    /// [`transcript::join_chunk`]): streaming costs one event per batch.
    pub fn chunk(&mut self, turn_id: Option<Uuid>, update: Value) {
        if let Some(last) = self.joinable(turn_id) {
            if transcript::join_chunk(&mut last.update, &update) {
                self.held_text += update["content"]["text"].as_str().map_or(0, str::len);
                return;
            }
        }
        self.session_update(turn_id, update);
    }

    /// [`Journal::chunk`] for a chunk read on the fast path: the same
    /// events, without building its JSON unless it starts one.
    pub fn text_chunk(&mut self, turn_id: Option<Uuid>, chunk: &TextChunk) {
        let prev = self
            .joinable(turn_id)
            .and_then(|last| transcript::chunk_text_mut(&mut last.update, chunk.kind));
        match prev {
            Some(prev) => {
                prev.push_str(&chunk.text);
                self.held_text += chunk.text.len();
            }
            None => self.session_update(turn_id, chunk.update()),
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
            EventBody::SessionUpdate(update) if update.turn_id == turn_id => Some(update),
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
        self.event(EventBody::PermissionRequested(request.clone()));
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
                self.event(EventBody::PermissionResolved(resolved));
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
        self.hold();
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
    pub fn set_state(&mut self, state: &SessionState) {
        self.state = Some(state.clone());
        self.changed(false);
    }

    fn changed(&mut self, urgent: bool) {
        self.dirty = true;
        self.urgent |= urgent;
        self.hold();
    }

    /// The conversation's state is committed: nothing of it waits.
    fn committed(&mut self) {
        self.dirty = false;
        self.urgent = false;
        self.held_since = None;
        self.held_text = 0;
        self.state = None;
    }

    fn patch(&self, last_seq: i64) -> ConversationPatch {
        ConversationPatch {
            status: self.status,
            acp_session_id: self.acp_session_id.clone(),
            last_seq,
            current_turn_id: self.turn_id,
            updated_at: model::now(),
            state: self.state.clone(),
        }
    }

    /// Commits the batch and publishes its events. Transient database errors
    /// are retried a few times; the batch is kept if they persist. A batch
    /// the database refuses for what it holds is written piece by piece
    /// instead (see `Journal::commit_piecewise`), so one bad value never
    /// blocks the conversation.
    pub async fn flush(&mut self) -> Result<()> {
        if self.batch.is_empty() && !self.dirty {
            self.outage = None;
            self.held_since = None;
            return Ok(());
        }
        self.batch.conversation = Some(self.patch(self.last_seq));
        self.batch.lane = self.lane;
        if let Some(outage) = self.outage {
            // Not yet time, or the database still does not answer (asked
            // briefly, so that the session keeps serving meanwhile).
            let now = tokio::time::Instant::now();
            if now < outage.retry_at || !self.database_answers().await {
                if now >= outage.retry_at {
                    let backoff = (outage.backoff * 2).min(MAX_BACKOFF);
                    self.outage = Some(Outage {
                        retry_at: now + backoff,
                        backoff,
                    });
                }
                self.publish_early();
                self.gauge();
                return Ok(());
            }
        }
        self.gauge();
        let committed = self.commit_with_retries().await;
        self.gauge();
        match committed {
            Err(e) if e.is_transient() && self.holds > 0 => {
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
                Ok(())
            }
            Err(e) => Err(e),
            Ok(()) => {
                if self.outage.take().is_some() {
                    tracing::info!(conversation_id = %self.conversation_id,
                        "the database answers again: held writes committed");
                }
                Ok(())
            }
        }
    }

    /// Keeps the write-buffer gauge at what this journal holds.
    fn gauge(&mut self) {
        let held = self.batch.events.len();
        telemetry::buffered(held as f64 - self.gauged as f64);
        self.gauged = held;
    }

    /// Whether the database answers a ping within a moment.
    async fn database_answers(&self) -> bool {
        let ping = self.sink.store.ping();
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
            .cloned()
            .collect();
        if let Some(last) = fresh.last() {
            self.published = last.seq;
            self.sink.bus.publish(self.owner.as_deref(), fresh);
        }
    }

    /// Publishes what the commit made durable, except what went out early;
    /// of that, the last is sent again to the conversation's sockets, now
    /// that the store holds it (a socket that reconnected during the outage
    /// waits for the store, not for the next event).
    fn publish_committed(&mut self, mut events: Vec<Event>) {
        let published = self.published;
        if let Some(early) = events.iter().rev().find(|e| e.seq <= published) {
            self.sink.bus.remind(self.owner.as_deref(), early);
        }
        events.retain(|e| e.seq > published);
        if let Some(last) = events.last() {
            self.published = last.seq;
            self.sink.bus.publish(self.owner.as_deref(), events);
        }
    }

    /// Tries to commit what is held until it is (or `deadline` passes);
    /// whether everything is committed.
    pub async fn settle(&mut self, deadline: tokio::time::Instant) -> bool {
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
                    "the database stayed unreachable: events held in memory are lost");
                return false;
            }
            tokio::time::sleep_until(retry_at).await;
        }
    }

    async fn commit_with_retries(&mut self) -> Result<()> {
        let mut attempt = 0;
        loop {
            let started = std::time::Instant::now();
            let committed = self
                .sink
                .store
                .commit(self.conversation_id, &self.batch)
                .await;
            telemetry::commit_took(started.elapsed());
            match committed {
                Ok(()) => break,
                // A writer that rides out outages tries again later instead.
                Err(e) if e.is_transient() && attempt < 3 && self.holds == 0 => {
                    attempt += 1;
                    tracing::warn!(conversation_id = %self.conversation_id, error = %e, attempt, "commit failed; retrying");
                    tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
                }
                Err(e) if e.is_transient() => return Err(e),
                Err(e) => {
                    tracing::warn!(conversation_id = %self.conversation_id, error = %e,
                        "the database refused a batch; writing it piece by piece");
                    return self.commit_piecewise().await;
                }
            }
        }
        let batch = std::mem::take(&mut self.batch);
        self.committed();
        telemetry::events_written(batch.events.len());
        self.publish_committed(batch.events);
        Ok(())
    }

    /// Writes the batch one piece per transaction, in order (requests before
    /// the events announcing them, events in `seq` order, then messages, tool
    /// calls and the conversation's state), publishing each event once it is
    /// stored. A piece refused again is replaced by a form the database can
    /// hold: an event keeps its `seq` and `type` and says in `data.unstorable`
    /// why its content is missing; a message, tool call or request keeps its
    /// identity with long or unusual strings cut. Only a transient error stops
    /// this early, and then what is not written yet stays in the batch.
    async fn commit_piecewise(&mut self) -> Result<()> {
        while let Some(request) = self.batch.new_permissions.first() {
            let piece = Batch {
                new_permissions: vec![request.clone()],
                ..Batch::default()
            };
            let mut lossy = request.clone();
            lossy.tool_call = storable::lossy(&lossy.tool_call);
            lossy.options = lossy.options.iter().map(storable::lossy).collect();
            let stand_in = Batch {
                new_permissions: vec![lossy],
                ..Batch::default()
            };
            self.commit_piece(piece, [stand_in]).await?;
            self.batch.new_permissions.remove(0);
        }
        while let Some(event) = self.batch.events.first() {
            let piece = Batch {
                events: vec![event.clone()],
                ..Batch::default()
            };
            let stand_ins = storable::event_stand_ins(event).into_iter().map(|e| Batch {
                events: vec![e],
                ..Batch::default()
            });
            if let Some(written) = self.commit_piece(piece, stand_ins).await? {
                telemetry::events_written(written.events.len());
                self.publish_committed(written.events);
            }
            self.batch.events.remove(0);
        }
        while let Some(message) = self.batch.messages.first() {
            // Its own copy of a prompt: the event holding it may have been
            // stored as a stand-in without it.
            let message = MessagePart {
                content_in_event: None,
                ..message.clone()
            };
            let piece = Batch {
                messages: vec![message.clone()],
                ..Batch::default()
            };
            let mut lossy = message.clone();
            lossy.message.content = lossy.message.content.iter().map(storable::lossy).collect();
            let stand_in = Batch {
                messages: vec![lossy],
                ..Batch::default()
            };
            self.commit_piece(piece, [stand_in]).await?;
            self.batch.messages.remove(0);
        }
        while let Some(call) = self.batch.tool_calls.first() {
            let piece = Batch {
                tool_calls: vec![call.clone()],
                ..Batch::default()
            };
            let stand_in = Batch {
                tool_calls: vec![storable::lossy_tool_call(call)],
                ..Batch::default()
            };
            self.commit_piece(piece, [stand_in]).await?;
            self.batch.tool_calls.remove(0);
        }
        let patch = Batch {
            conversation: self.batch.conversation.take(),
            ..Batch::default()
        };
        self.sink.store.commit(self.conversation_id, &patch).await?;
        self.batch = Batch::default();
        self.committed();
        Ok(())
    }

    /// Commits `piece`, else the first of `stand_ins` the database accepts;
    /// `None` when it refused them all (the piece is dropped, loudly).
    async fn commit_piece(
        &self,
        piece: Batch,
        stand_ins: impl IntoIterator<Item = Batch>,
    ) -> Result<Option<Batch>> {
        let mut refused = match self.sink.store.commit(self.conversation_id, &piece).await {
            Ok(()) => return Ok(Some(piece)),
            Err(e) if e.is_transient() => return Err(e),
            Err(e) => e,
        };
        for stand_in in stand_ins {
            tracing::warn!(conversation_id = %self.conversation_id, error = %refused,
                "the database refused part of a batch; storing a stand-in");
            match self
                .sink
                .store
                .commit(self.conversation_id, &stand_in)
                .await
            {
                Ok(()) => return Ok(Some(stand_in)),
                Err(e) if e.is_transient() => return Err(e),
                Err(e) => refused = e,
            }
        }
        tracing::error!(conversation_id = %self.conversation_id, error = %refused,
            "the database refused part of a batch and every stand-in; it is not stored");
        Ok(None)
    }

    /// Commits what is held, then applies `resolution` if the request is
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
            // Its event would come before the held ones: wait for them.
            return Err(crate::error::Error::Unavailable(
                "the database is unreachable; try again".into(),
            ));
        }
        // The store fills in the request as it resolved it.
        let event = self.next_event(EventBody::PermissionResolved(resolution.resolved()));
        let patch = self.patch(event.seq);
        match self
            .sink
            .store
            .resolve_permission(resolution, event, &patch)
            .await?
        {
            Some((request, event)) => {
                telemetry::events_written(1);
                self.last_seq = event.seq;
                self.published = event.seq;
                self.committed();
                self.sink.bus.publish(self.owner.as_deref(), [event]);
                Ok(Some(request))
            }
            None => Ok(None),
        }
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
        // What it still holds is no longer waiting anywhere.
        telemetry::buffered(-(self.gauged as f64));
    }
}
