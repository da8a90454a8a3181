//! Live fan-out of published events: one broadcast channel per conversation
//! (for its WebSocket) and one for everything (the `/api/v1/ws` inbox).
//!
//! Events reach the bus after they are committed, so a subscriber that falls
//! behind (a lagged broadcast receiver) can catch up from the store. The one
//! exception is a database outage: a conversation's journal then publishes
//! what it holds before it can commit it (committed later, unchanged, under
//! the same `seq`), and a subscriber that catches up meanwhile finds the
//! store short of them; `api::ws` then waits for them there rather than skip
//! them, and the journal [`EventBus::remind`]s it once they are committed.
//!
//! Each event is serialized once, here, not once per subscriber; a
//! `session_update`'s data (a streamed chunk, possibly megabytes) is not
//! serialized again at all: its text is the one made when the store wrote
//! it (see [`crate::model::SessionUpdate`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::{broadcast, mpsc};
use uuid::Uuid;

use crate::model::{Event, EventBody, MemberRole};

/// An event's JSON text (its only copy on the bus: an event may be
/// megabytes long), shared by all subscribers.
#[derive(Debug)]
pub struct Published {
    pub conversation_id: Uuid,
    pub seq: i64,
    /// Shared, not copied, by every WebSocket that sends it.
    pub json: axum::extract::ws::Utf8Bytes,
    /// The user whose conversation it is, for filtering the inbox.
    pub owner: Option<String>,
    /// Committed by another node and relayed here (this node does not
    /// notify for it: its own node does).
    pub relayed: bool,
    /// The change of membership it records (`member_*`), for the sockets
    /// of the member it names.
    pub member: Option<MemberNote>,
}

/// A member of a conversation and their role now (`None`: removed).
#[derive(Debug, Clone, PartialEq)]
pub struct MemberNote {
    pub user: String,
    pub role: Option<MemberRole>,
}

impl MemberNote {
    /// What a `member_*` event says of its member.
    pub fn of(body: &EventBody) -> Option<MemberNote> {
        let (change, role) = match body {
            EventBody::MemberAdded(c) | EventBody::MemberChanged(c) => (c, Some(c.role)),
            EventBody::MemberRemoved(c) => (c, None),
            _ => return None,
        };
        Some(MemberNote {
            user: change.user.clone(),
            role,
        })
    }
}

/// A cheap-to-clone handle to the fan-out.
#[derive(Clone)]
pub struct EventBus {
    inner: Arc<Channels>,
}

/// The broadcast channels every handle shares: one for all events, one per
/// conversation with subscribers.
struct Channels {
    global: broadcast::Sender<Arc<Published>>,
    per_conversation: Mutex<HashMap<Uuid, broadcast::Sender<Arc<Published>>>>,
    capacity: usize,
    /// Where this node's own published events are announced to other nodes
    /// (see [`crate::cluster`]).
    announce: OnceLock<mpsc::UnboundedSender<Announced>>,
}

/// Events of one conversation published here, `first..=last` (seqs):
/// committed, except during a database outage (see
/// [`EventBus::announce_committed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Announced {
    pub conversation: Uuid,
    pub first: i64,
    pub last: i64,
}

impl EventBus {
    /// `capacity` is how many events a subscriber may lag behind before it
    /// has to catch up from the store.
    pub fn new(capacity: usize) -> Self {
        EventBus {
            inner: Arc::new(Channels {
                global: broadcast::channel(capacity * 4).0,
                per_conversation: Mutex::new(HashMap::new()),
                capacity,
                announce: OnceLock::new(),
            }),
        }
    }

    /// From now on, tells `announce` of every batch [`EventBus::publish`]
    /// publishes.
    pub fn announce_to(&self, announce: mpsc::UnboundedSender<Announced>) {
        let _ = self.inner.announce.set(announce);
    }

    /// Publishes events of a conversation owned by `owner`, in order, and
    /// announces them to other nodes. The journal publishes what it has
    /// committed, except during a database outage: then what it holds, at
    /// once, before it can commit it (see the module docs).
    pub fn publish(&self, owner: Option<&str>, events: impl IntoIterator<Item = Event>) {
        let span = self.send(owner, events, false);
        if let (Some(announce), Some(announced)) = (self.inner.announce.get(), span) {
            let _ = announce.send(announced);
        }
    }

    /// Publishes committed events another node announced.
    pub fn publish_relayed(&self, owner: Option<&str>, events: impl IntoIterator<Item = Event>) {
        self.send(owner, events, true);
    }

    /// Whether anyone here listens to the conversation's events (its own
    /// subscribers or the inbox's).
    pub fn has_subscribers(&self, conversation_id: Uuid) -> bool {
        self.inner.global.receiver_count() > 0
            || self
                .inner
                .per_conversation
                .lock()
                .unwrap()
                .contains_key(&conversation_id)
    }

    fn send(
        &self,
        owner: Option<&str>,
        events: impl IntoIterator<Item = Event>,
        relayed: bool,
    ) -> Option<Announced> {
        let map = self.inner.per_conversation.lock().unwrap();
        let mut span: Option<Announced> = None;
        for event in events {
            let published = Arc::new(Published {
                conversation_id: event.conversation_id,
                seq: event.seq,
                json: serde_json::to_string(&event)
                    .expect("events serialize")
                    .into(),
                owner: owner.map(str::to_owned),
                relayed,
                member: MemberNote::of(&event.body),
            });
            drop(event);
            match &mut span {
                Some(span) => span.last = published.seq,
                None => {
                    span = Some(Announced {
                        conversation: published.conversation_id,
                        first: published.seq,
                        last: published.seq,
                    })
                }
            }
            if let Some(tx) = map.get(&published.conversation_id) {
                let _ = tx.send(published.clone());
            }
            let _ = self.inner.global.send(published);
        }
        span
    }

    /// Tells other nodes that the events of `committed` are in the store
    /// now: they were published here early (during a database outage), and
    /// the announcement [`EventBus::publish`] made of them then came before
    /// the store held them, so the nodes that read it found nothing.
    pub fn announce_committed(&self, committed: Announced) {
        if let Some(announce) = self.inner.announce.get() {
            let _ = announce.send(committed);
        }
    }

    /// Sends an event that was published early (during a database outage)
    /// again, once it is committed, to the conversation's own subscribers
    /// only: one that already has it skips it (its `seq` is behind it), one
    /// that waited for the store to hold it refills from there (see
    /// `api::ws`). Not for the inbox; other nodes are told with
    /// [`EventBus::announce_committed`].
    pub fn remind(&self, owner: Option<&str>, event: &Event) {
        let map = self.inner.per_conversation.lock().unwrap();
        if let Some(tx) = map.get(&event.conversation_id) {
            let _ = tx.send(Arc::new(Published {
                conversation_id: event.conversation_id,
                seq: event.seq,
                json: serde_json::to_string(event)
                    .expect("events serialize")
                    .into(),
                owner: owner.map(str::to_owned),
                relayed: false,
                member: MemberNote::of(&event.body),
            }));
        }
    }

    /// Live events of one conversation from now on.
    pub fn subscribe(&self, conversation_id: Uuid) -> Subscription {
        let mut map = self.inner.per_conversation.lock().unwrap();
        let rx = map
            .entry(conversation_id)
            .or_insert_with(|| broadcast::channel(self.inner.capacity).0)
            .subscribe();
        Subscription {
            rx,
            bus: self.clone(),
            conversation_id,
        }
    }

    /// Live events of every conversation from now on.
    pub fn subscribe_all(&self) -> broadcast::Receiver<Arc<Published>> {
        self.inner.global.subscribe()
    }
}

/// A receiver of one conversation's events; dropping the last one frees the
/// channel.
pub struct Subscription {
    pub rx: broadcast::Receiver<Arc<Published>>,
    bus: EventBus,
    conversation_id: Uuid,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut map = self.bus.inner.per_conversation.lock().unwrap();
        // Our receiver still counts until this drop returns.
        if map
            .get(&self.conversation_id)
            .is_some_and(|tx| tx.receiver_count() <= 1)
        {
            map.remove(&self.conversation_id);
        }
    }
}
