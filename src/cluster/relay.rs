//! Events between nodes: this node announces what it committed (coalesced,
//! one notification per conversation), and publishes on its own bus what
//! other nodes announced, in order, while it has subscribers for it. The
//! text of an announcement is written and read here.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::bus::{Announced, EventBus};
use crate::store::{ClusterStore, Store};

/// Events read per page while relaying.
const RELAY_PAGE: i64 = 1000;

/// `node conversation first last`, unless this node sent it.
pub(super) fn parse_announced(payload: &str, me: &str) -> Option<Announced> {
    let mut parts = payload.split(' ');
    if parts.next()? == me {
        return None;
    }
    Some(Announced {
        conversation: Uuid::parse_str(parts.next()?).ok()?,
        first: parts.next()?.parse().ok()?,
        last: parts.next()?.parse().ok()?,
    })
}

/// Sends this node's announcements, as many as are queued in one statement
/// (one per conversation), and tells the relay of them (`relay`): what this
/// node published itself is never relayed to it again.
pub(super) async fn announce(
    shared: Arc<dyn ClusterStore>,
    me: Uuid,
    mut rx: mpsc::UnboundedReceiver<Announced>,
    relay: mpsc::UnboundedSender<Relayed>,
    shutdown: CancellationToken,
) {
    loop {
        let first = tokio::select! {
            _ = shutdown.cancelled() => return,
            first = rx.recv() => match first { Some(a) => a, None => return },
        };
        let mut merged: HashMap<Uuid, Announced> = HashMap::new();
        merge(&mut merged, first);
        while let Ok(a) = rx.try_recv() {
            merge(&mut merged, a);
        }
        for a in merged.values() {
            let _ = relay.send(Relayed::Own(*a));
        }
        let payloads: Vec<String> = merged
            .values()
            .map(|a| format!("{me} {} {} {}", a.conversation, a.first, a.last))
            .collect();
        if let Err(e) = shared.notify_events(&payloads).await {
            // Other nodes catch up with the next announcement.
            tracing::warn!(error = %e, "could not tell other nodes of new events");
        }
    }
}

/// Adds `a` to what is known of its conversation: one span from the lowest
/// seq to the highest.
fn merge(spans: &mut HashMap<Uuid, Announced>, a: Announced) {
    spans
        .entry(a.conversation)
        .and_modify(|m| {
            m.first = m.first.min(a.first);
            m.last = m.last.max(a.last);
        })
        .or_insert(a);
}

/// What the relay is asked to read.
pub(super) enum Relayed {
    Events(Announced),
    /// Notifications may have been missed: read what is new everywhere.
    CatchUp,
    /// This node published these itself (it owned the conversation): a
    /// cursor left behind them from when another node did moves past them,
    /// so they are not published here twice when another node owns the
    /// conversation again.
    Own(Announced),
}

/// Publishes other nodes' events on this node's bus, in order, while this
/// node has subscribers for them.
pub(super) async fn relay(
    store: Arc<dyn Store>,
    bus: EventBus,
    mut rx: mpsc::UnboundedReceiver<Relayed>,
    shutdown: CancellationToken,
) {
    // Per conversation: the last seq relayed, and its owner (user).
    let mut cursors: HashMap<Uuid, i64> = HashMap::new();
    let mut owners: HashMap<Uuid, Option<String>> = HashMap::new();
    loop {
        let first = tokio::select! {
            _ = shutdown.cancelled() => return,
            first = rx.recv() => match first { Some(r) => r, None => return },
        };
        let mut wanted: HashMap<Uuid, Announced> = HashMap::new();
        let mut take = |r: Relayed, cursors: &mut HashMap<Uuid, i64>| match r {
            Relayed::Events(a) => merge(&mut wanted, a),
            Relayed::Own(a) => {
                // Only where nothing of another node's lies between (that
                // is read as announced).
                if let Some(cursor) = cursors.get_mut(&a.conversation) {
                    if *cursor + 1 >= a.first {
                        *cursor = (*cursor).max(a.last);
                    }
                }
            }
            Relayed::CatchUp => {
                for (&conversation, &mut cursor) in cursors.iter_mut() {
                    wanted.entry(conversation).or_insert(Announced {
                        conversation,
                        first: cursor + 1,
                        last: i64::MAX,
                    });
                }
            }
        };
        take(first, &mut cursors);
        while let Ok(r) = rx.try_recv() {
            take(r, &mut cursors);
        }
        for (conversation, a) in wanted {
            if !bus.has_subscribers(conversation) {
                cursors.remove(&conversation);
                continue;
            }
            let owner = match owners.get(&conversation) {
                Some(owner) => owner.clone(),
                None => match store.get_conversation(conversation).await {
                    Ok(Some(c)) => {
                        owners.insert(conversation, c.owner.clone());
                        c.owner
                    }
                    Ok(None) => continue,
                    Err(e) => {
                        tracing::warn!(conversation_id = %conversation, error = %e, "could not read a conversation to relay its events");
                        continue;
                    }
                },
            };
            let mut after = cursors.get(&conversation).copied().unwrap_or(a.first - 1);
            loop {
                let page = match store.list_events(conversation, after, RELAY_PAGE).await {
                    Ok(page) => page,
                    Err(e) => {
                        tracing::warn!(conversation_id = %conversation, error = %e, "could not read events to relay");
                        break;
                    }
                };
                let full = page.len() as i64 == RELAY_PAGE;
                if let Some(last) = page.last() {
                    after = last.seq;
                }
                bus.publish_relayed(owner.as_deref(), page);
                if !full || after >= a.last {
                    break;
                }
            }
            cursors.insert(conversation, after);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn announcements_of_this_node_are_skipped() {
        let me = Uuid::now_v7().to_string();
        let c = Uuid::now_v7();
        assert!(parse_announced(&format!("{me} {c} 1 5"), &me).is_none());
        let other = Uuid::now_v7();
        let a = parse_announced(&format!("{other} {c} 3 9"), &me).unwrap();
        assert_eq!((a.conversation, a.first, a.last), (c, 3, 9));
        assert!(parse_announced("garbage", &me).is_none());
    }
}
