//! One conversation attached to one ACP connection: its events, replayed
//! from the store where the client asks (`session/load`, or a cursor) and
//! then live from the bus, turned into what an ACP client expects of an
//! agent: `session/update` notifications in order (no gap, no duplicate,
//! as `ws.rs` does it), `session/request_permission` requests for the
//! requests that wait for a person, `$/cancel_request` when one is
//! resolved elsewhere, and the answer to a `session/prompt` of this client
//! when its turn ends.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::wire;
use crate::api::state::AppState;
use crate::bus::Subscription;
use crate::error::Result;
use crate::model::{Event, EventBody, PermissionStatus, WaitingKind};
use crate::store::PermissionFilter;

/// Events read from the store per page while replaying.
const REPLAY_PAGE: i64 = 500;
/// How many ended turns are remembered for a `session/prompt` whose answer
/// arrives after its turn ended.
const ENDED_KEPT: usize = 16;

/// What a connection's attachments share: the way out to the client and
/// the permission requests shown to it.
pub struct Peer {
    pub out: mpsc::Sender<String>,
    next_id: AtomicI64,
    /// The gateway's requests to the client not answered yet: JSON-RPC id
    /// → (conversation, permission request).
    asked: Mutex<HashMap<i64, (Uuid, Uuid)>>,
}

impl Peer {
    pub fn new(out: mpsc::Sender<String>) -> Peer {
        Peer {
            out,
            next_id: AtomicI64::new(1),
            asked: Mutex::new(HashMap::new()),
        }
    }

    /// The permission request a response of the client answers (once).
    pub fn answered(&self, id: &Value) -> Option<(Uuid, Uuid)> {
        let id = id.as_i64()?;
        self.asked.lock().unwrap().remove(&id)
    }

    async fn send(&self, text: String) -> Result<(), Gone> {
        self.out.send(text).await.map_err(|_| Gone)
    }
}

/// The client's connection is gone.
struct Gone;

/// The turns of a conversation as this client sees them.
#[derive(Default)]
pub struct Turns {
    /// The content of prompts this client sent whose `turn_started` was not
    /// seen yet: not echoed back as `user_message_chunk`s.
    own: Vec<Vec<Value>>,
    /// A turn → the `session/prompt` request waiting for its end.
    waiting: HashMap<Uuid, Value>,
    /// Turns seen ending that no request waited for (yet).
    ended: VecDeque<(Uuid, String)>,
}

/// A conversation attached to a connection; dropping it detaches.
pub struct Attachment {
    pub turns: Arc<Mutex<Turns>>,
    stop: CancellationToken,
}

impl Drop for Attachment {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Where an attachment starts, and what it answers once caught up.
pub struct Start {
    /// Send the events after this seq first (from the store).
    pub after: i64,
    /// The events after `after` are history (`session/load`): a turn that
    /// ended there answers no prompt of this client.
    pub history: bool,
    /// The request to answer once caught up (its id and result).
    pub request: Option<(Value, Value)>,
}

impl Attachment {
    /// Subscribes to the conversation's events now, and forwards them from
    /// a task of its own; once the events after `start.after` were sent,
    /// the requests that still wait are shown and `start.request` (id,
    /// result) is answered, with the cursor (the seq of the last event
    /// accounted for) in the result's `_meta`. `turns` are those of an attachment it replaces (a session loaded
    /// again), so that a prompt waiting there is still answered.
    pub fn start(
        state: &AppState,
        peer: Arc<Peer>,
        id: Uuid,
        start: Start,
        turns: Option<Arc<Mutex<Turns>>>,
    ) -> Attachment {
        let sub = state.bus().subscribe(id);
        let turns = turns.unwrap_or_default();
        let stop = CancellationToken::new();
        let mut forward = Forward {
            state: state.clone(),
            peer,
            id,
            turns: turns.clone(),
            last: start.after,
            shown: HashMap::new(),
            catching_up: true,
            history: start.history,
        };
        let stopped = stop.clone();
        // Tracked with the sockets: a stopping gateway waits for it.
        tokio::spawn(state.track_socket(async move {
            tokio::select! {
                _ = forward.run(sub, start.request) => {}
                _ = stopped.cancelled() => {}
            }
        }));
        Attachment { turns, stop }
    }

    /// Notes a prompt this client is about to send (not echoed back).
    pub fn prompting(&self, content: &[Value]) {
        self.turns.lock().unwrap().own.push(content.to_vec());
    }

    /// The prompt was refused: forget it.
    pub fn not_prompted(&self, content: &[Value]) {
        let mut turns = self.turns.lock().unwrap();
        if let Some(i) = turns.own.iter().position(|c| c == content) {
            turns.own.remove(i);
        }
    }

    /// The request `id` waits for `turn` to end: its answer, if it ended
    /// already (then the caller sends it), else it is answered when it does.
    pub fn await_turn(&self, turn: Uuid, id: Value) -> Option<String> {
        let mut turns = self.turns.lock().unwrap();
        if let Some(i) = turns.ended.iter().position(|(t, _)| *t == turn) {
            let (_, stop_reason) = turns.ended.remove(i).expect("found");
            return Some(prompt_result(&id, &stop_reason));
        }
        turns.waiting.insert(turn, id);
        None
    }
}

fn prompt_result(id: &Value, stop_reason: &str) -> String {
    wire::result(id, json!({"stopReason": stop_reason}))
}

/// The task that forwards one conversation's events.
struct Forward {
    state: AppState,
    peer: Arc<Peer>,
    id: Uuid,
    turns: Arc<Mutex<Turns>>,
    /// The seq of the last event handled.
    last: i64,
    /// Permission requests shown to the client: request → JSON-RPC id.
    shown: HashMap<Uuid, i64>,
    /// Sending the events after the start's `after`, before going live.
    catching_up: bool,
    /// Those events are history (see [`Start::history`]).
    history: bool,
}

impl Drop for Forward {
    /// Detached: the client's answers to what it was shown are no longer
    /// taken (another attachment of the same conversation shows its own).
    fn drop(&mut self) {
        let mut asked = self.peer.asked.lock().unwrap();
        for rpc_id in self.shown.values() {
            asked.remove(rpc_id);
        }
    }
}

impl Forward {
    async fn run(&mut self, mut sub: Subscription, request: Option<(Value, Value)>) {
        let caught_up = async {
            self.replay(None).await?;
            (self.catching_up, self.history) = (false, false);
            self.show_waiting().await?;
            if let Some((id, mut result)) = request {
                result["_meta"]["acpGateway"]["cursor"] = json!(self.last);
                self.peer.send(wire::result(&id, result)).await?;
            }
            Ok::<(), Gone>(())
        };
        if caught_up.await.is_err() {
            return;
        }
        loop {
            let handled = match sub.rx.recv().await {
                Ok(published) => {
                    let seq = published.seq;
                    if seq <= self.last {
                        continue;
                    }
                    if seq > self.last + 1 {
                        self.replay(Some(seq)).await
                    } else {
                        match serde_json::from_str::<Event>(&published.json) {
                            Ok(event) => self.event(event).await,
                            Err(e) => {
                                tracing::warn!(conversation_id = %self.id, error = %e, "an event did not read back");
                                self.last = seq;
                                Ok(())
                            }
                        }
                    }
                }
                Err(RecvError::Lagged(_)) => self.replay(None).await,
                Err(RecvError::Closed) => return,
            };
            if handled.is_err() {
                return;
            }
        }
    }

    /// Handles the stored events after `last` up to `until` (or all).
    async fn replay(&mut self, until: Option<i64>) -> Result<(), Gone> {
        let max_bytes = self.state.config().max_page_bytes;
        loop {
            let page = self
                .state
                .store()
                .list_events_page(self.id, self.last, REPLAY_PAGE, max_bytes)
                .await;
            let page = match page {
                Ok(page) => page,
                Err(e) => {
                    // Asked again at the next event.
                    tracing::warn!(conversation_id = %self.id, error = %e, "could not replay events");
                    return Ok(());
                }
            };
            let more = page.more;
            for event in page.items {
                if until.is_some_and(|u| event.seq > u) {
                    return Ok(());
                }
                self.event(event).await?;
            }
            if !more {
                return Ok(());
            }
        }
    }

    /// What one event means to the client.
    async fn event(&mut self, event: Event) -> Result<(), Gone> {
        self.last = event.seq;
        let seq = event.seq;
        match event.body {
            EventBody::SessionUpdate(update) => {
                self.update(update.update().clone(), seq).await?;
            }
            EventBody::TurnStarted(started) => {
                let own = {
                    let mut turns = self.turns.lock().unwrap();
                    let at = turns.own.iter().position(|c| *c == started.content);
                    at.map(|i| turns.own.remove(i)).is_some()
                };
                if !own {
                    for block in started.content {
                        let update =
                            json!({"sessionUpdate": "user_message_chunk", "content": block});
                        self.update(update, seq).await?;
                    }
                }
            }
            EventBody::TurnEnded(ended) => {
                let waiting = {
                    let mut turns = self.turns.lock().unwrap();
                    let waiting = turns.waiting.remove(&ended.turn_id);
                    if waiting.is_none() && !self.history {
                        turns
                            .ended
                            .push_back((ended.turn_id, ended.stop_reason.clone()));
                        if turns.ended.len() > ENDED_KEPT {
                            turns.ended.pop_front();
                        }
                    }
                    waiting
                };
                if let Some(id) = waiting {
                    self.peer
                        .send(prompt_result(&id, &ended.stop_reason))
                        .await?;
                }
            }
            // While catching up, what still waits is shown after (see
            // `show_waiting`).
            EventBody::PermissionRequested(request)
                if request.status == PermissionStatus::Pending
                    && !self.catching_up
                    && !self.shown.contains_key(&request.id)
                    && self.still_pending(request.id).await =>
            {
                self.show(&request).await?;
            }
            EventBody::PermissionResolved(request) => {
                if let Some(rpc_id) = self.shown.remove(&request.id) {
                    // Still asked: the client did not answer it.
                    let asked = self.peer.asked.lock().unwrap().remove(&rpc_id);
                    if asked.is_some() {
                        let cancel =
                            wire::notification("$/cancel_request", json!({"requestId": rpc_id}));
                        self.peer.send(cancel).await?;
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }

    async fn update(&self, update: Value, seq: i64) -> Result<(), Gone> {
        let params = json!({
            "sessionId": self.id,
            "update": update,
            "_meta": {"acpGateway": {"seq": seq}},
        });
        self.peer
            .send(wire::notification("session/update", params))
            .await
    }

    /// Whether a request announced as pending still waits: one a policy
    /// decided at once is resolved in the same commit, and never shown.
    async fn still_pending(&self, id: Uuid) -> bool {
        match self.state.store().get_permission(id).await {
            Ok(Some(stored)) => stored.status == PermissionStatus::Pending,
            // Asked while the database is away: it waits.
            Ok(None) | Err(_) => true,
        }
    }

    /// Shows the conversation's requests that wait for a person and were
    /// not shown yet: once caught up, those asked before (the store's, and
    /// those waiting here that it does not hold yet, asked while the
    /// database is away).
    async fn show_waiting(&mut self) -> Result<(), Gone> {
        let filter = PermissionFilter {
            pending_only: true,
            conversation_id: Some(self.id),
            owner: None,
            kind: Some(WaitingKind::Permission),
        };
        let mut waiting = match self.state.store().list_permissions(&filter).await {
            Ok(waiting) => waiting,
            Err(e) => {
                tracing::warn!(conversation_id = %self.id, error = %e, "could not list the waiting requests");
                Vec::new()
            }
        };
        let here = self.state.sessions().waiting_here(|_, _| true);
        for request in here {
            // A question is for the phone and the web client (see docs/ide.md).
            let permission = request.kind == WaitingKind::Permission;
            if permission
                && request.conversation_id == self.id
                && !waiting.iter().any(|w| w.id == request.id)
            {
                waiting.push(request);
            }
        }
        // Ids are UUIDv7: their order is the order of asking.
        waiting.sort_by_key(|r| r.id);
        for request in waiting {
            if request.status == PermissionStatus::Pending && !self.shown.contains_key(&request.id)
            {
                self.show(&request).await?;
            }
        }
        Ok(())
    }

    async fn show(&mut self, request: &crate::model::PermissionRequest) -> Result<(), Gone> {
        let rpc_id = self.peer.next_id.fetch_add(1, Ordering::Relaxed);
        self.peer
            .asked
            .lock()
            .unwrap()
            .insert(rpc_id, (self.id, request.id));
        self.shown.insert(request.id, rpc_id);
        let params = json!({
            "sessionId": self.id,
            "toolCall": request.tool_call,
            "options": request.options,
            "_meta": {"acpGateway": {"permissionId": request.id}},
        });
        self.peer
            .send(wire::request(rpc_id, "session/request_permission", params))
            .await
    }
}
