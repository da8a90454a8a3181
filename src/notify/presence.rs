//! Who is present: a client is present while it holds a WebSocket (inbox or
//! conversation) on which it last sent `{"type":"presence","visible":true}`;
//! `visible: false`, closing or disconnecting makes it not present. Clients
//! that never send the frame count for nothing. Counted per user, on this
//! node only (a client on another node of a cluster is not seen here).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

/// A user's presence changed: `present` is whether any client of theirs
/// is present now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PresenceChange {
    pub user: String,
    pub present: bool,
}

/// Present clients per user; cheap to clone.
#[derive(Clone, Default)]
pub struct Presence {
    inner: Arc<Mutex<Clients>>,
}

/// How many visible clients each user has, and who watches the changes.
#[derive(Default)]
struct Clients {
    clients: HashMap<String, usize>,
    watchers: Vec<mpsc::UnboundedSender<PresenceChange>>,
}

impl Clients {
    fn tell(&mut self, user: &str, present: bool) {
        let change = PresenceChange {
            user: user.to_owned(),
            present,
        };
        self.watchers.retain(|w| w.send(change.clone()).is_ok());
    }
}

impl Presence {
    /// Every change from now on, after the users present now (as changes).
    pub fn watch(&self) -> mpsc::UnboundedReceiver<PresenceChange> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut inner = self.inner.lock().unwrap();
        for user in inner.clients.keys() {
            let _ = tx.send(PresenceChange {
                user: user.clone(),
                present: true,
            });
        }
        inner.watchers.push(tx);
        rx
    }

    pub fn is_present(&self, user: &str) -> bool {
        self.inner.lock().unwrap().clients.contains_key(user)
    }

    /// One WebSocket of `user`, not present until it says it is visible.
    pub fn client(&self, user: &str) -> PresenceClient {
        PresenceClient {
            presence: self.clone(),
            user: user.to_owned(),
            visible: false,
        }
    }

    fn set(&self, user: &str, visible: bool) {
        let mut inner = self.inner.lock().unwrap();
        let count = inner.clients.entry(user.to_owned()).or_default();
        let was = *count;
        if visible {
            *count += 1;
        } else {
            *count = count.saturating_sub(1);
        }
        let now = *count;
        if now == 0 {
            inner.clients.remove(user);
        }
        if (was == 0) != (now == 0) {
            inner.tell(user, now > 0);
        }
    }
}

/// One client's presence; dropping it (the socket ended) makes it absent.
pub struct PresenceClient {
    presence: Presence,
    user: String,
    visible: bool,
}

impl PresenceClient {
    /// Applies a text frame from the client if it is a presence frame.
    pub fn frame(&mut self, text: &str) {
        #[derive(serde::Deserialize)]
        struct Frame {
            #[serde(rename = "type")]
            kind: String,
            visible: bool,
        }
        match serde_json::from_str::<Frame>(text) {
            Ok(frame) if frame.kind == "presence" => self.set_visible(frame.visible),
            _ => {}
        }
    }

    pub fn set_visible(&mut self, visible: bool) {
        if visible != self.visible {
            self.visible = visible;
            self.presence.set(&self.user, visible);
        }
    }
}

impl Drop for PresenceClient {
    fn drop(&mut self) {
        self.set_visible(false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_is_present_while_one_visible_client_is() {
        let presence = Presence::default();
        let mut changes = presence.watch();
        let mut phone = presence.client("alice");
        let mut laptop = presence.client("alice");
        assert!(!presence.is_present("alice"));
        phone.frame(r#"{"type":"presence","visible":true}"#);
        laptop.frame(r#"{"type":"presence","visible":true}"#);
        laptop.frame(r#"{"type":"presence","visible":true}"#);
        assert!(presence.is_present("alice"));
        phone.frame(r#"{"type":"presence","visible":false}"#);
        assert!(presence.is_present("alice"));
        phone.frame("not json");
        drop(laptop);
        assert!(!presence.is_present("alice"));
        let got: Vec<_> = std::iter::from_fn(|| changes.try_recv().ok()).collect();
        assert_eq!(
            got,
            vec![
                PresenceChange {
                    user: "alice".into(),
                    present: true
                },
                PresenceChange {
                    user: "alice".into(),
                    present: false
                },
            ]
        );
    }
}
