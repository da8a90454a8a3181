//! Several gateway nodes on one Postgres. A node is one gateway process
//! with an id of its own (a UUID made at start). It owns the conversations
//! whose agents it runs (`conversations.node_id`) while its lease (the
//! `nodes` row, renewed three times a `node_lease`) lasts. Postgres carries
//! the rest:
//!
//! - **Events:** the owner commits them as ever, then announces
//!   `(conversation, first seq, last seq)` on `NOTIFY acp_gateway_events`. A
//!   node with subscribers of that conversation (or of the inbox) reads them
//!   from the event table and publishes them on its own bus, so its
//!   WebSockets see what the owner's see, in the same order.
//! - **Commands:** one that reaches a node that does not own the
//!   conversation is written to `commands` for the owner (`NOTIFY
//!   acp_gateway_commands`), which runs it as if it had arrived there and
//!   writes the answer back (`NOTIFY acp_gateway_answers`). Whoever marks a
//!   command taken runs it: the owner, or the sender once the owner is dead.
//! - **Failover:** a node is dead once its lease ran out, or at once when it
//!   ran on this machine and its process is gone. The next command for one
//!   of its conversations claims it (and recovers what it left: pending
//!   requests expire, a running turn ends); every node also sweeps for such
//!   conversations each renewal.
//!
//! SQLite serves one node: the file is locked while a gateway serves it.
//!
//! The parts: this file is the node (join, lease, leave, liveness);
//! `claims.rs` who owns which conversation, and the orphans of dead nodes;
//! `commands.rs` commands forwarded to an owner and received from others;
//! `relay.rs` events between nodes; `lock.rs` the SQLite file lock;
//! `run.rs` the node's work while the gateway runs, every task of it owned
//! by the node. What the nodes share is read and written through
//! [`crate::store::cluster`].

mod run;
mod commands;
mod claims;
mod relay;
pub mod lock;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use crate::bus::Announced;
use crate::error::{Problem, Result};
use crate::process::procs::{self, Host};
use crate::store::cluster::NodeRecord;
use crate::store::{ClusterStore, Store};

/// This node: cheap to clone.
#[derive(Clone)]
pub struct Node {
    inner: Arc<NodeState>,
}

/// What every handle to this node shares: who it is, its lease, and what it
/// waits for and runs for the others.
struct NodeState {
    id: Uuid,
    lease: Duration,
    /// Postgres: what the nodes share. `None` on SQLite.
    shared: Option<Arc<dyn ClusterStore>>,
    /// SQLite: the lock that keeps a second gateway off the file.
    lock: Mutex<Option<lock::SqliteLock>>,
    /// Commands this node sent and waits for, by id.
    waiting: Mutex<HashMap<Uuid, oneshot::Sender<()>>>,
    announce: mpsc::UnboundedSender<Announced>,
    announced: Mutex<Option<mpsc::UnboundedReceiver<Announced>>>,
    /// Every task the node runs for the others (see [`Node::start`]).
    tasks: TaskTracker,
}

/// Who runs a conversation's agent, as [`Node::claim`] found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// This node, from now on; `took_from` the dead node that had it.
    /// `epoch` is the ownership epoch this claim raised the conversation to
    /// (`None` for a node alone, which no other can take it from): the
    /// owner's writes are conditional on it.
    Mine {
        took_from: Option<Uuid>,
        epoch: Option<i64>,
    },
    /// Another node, alive.
    Elsewhere(Uuid),
}

/// What became of a command sent to another node.
#[derive(Debug)]
pub enum Forwarded {
    /// The owner's answer.
    Answered(std::result::Result<Value, Box<Problem>>),
    /// The owner died before taking it: nothing was done.
    OwnerGone,
}

/// What a node does for the others: run the commands sent to it, and recover
/// the conversations of dead nodes.
#[async_trait::async_trait]
pub trait ClusterMember: Send + Sync + 'static {
    async fn execute(
        &self,
        conversation: Uuid,
        command: Value,
    ) -> std::result::Result<Value, Box<Problem>>;
    async fn adopt_orphans(&self);
}

impl Node {
    /// Joins the database `store` opened as a new node: on Postgres, a
    /// `nodes` row with a lease; on SQLite, holding `lock`, the file's lock
    /// (see [`lock::lock_sqlite`]), until the node leaves.
    pub async fn join(
        store: &dyn Store,
        lock: Option<lock::SqliteLock>,
        lease: Duration,
    ) -> anyhow::Result<Node> {
        let (tx, rx) = mpsc::unbounded_channel();
        let node = NodeState {
            id: Uuid::now_v7(),
            lease,
            shared: store.cluster(),
            lock: Mutex::new(lock),
            waiting: Mutex::new(HashMap::new()),
            announce: tx,
            announced: Mutex::new(Some(rx)),
            tasks: TaskTracker::new(),
        };
        if let Some(shared) = &node.shared {
            register(&**shared, node.id, lease, false)
                .await
                .context("Failed to register this gateway node")?;
        }
        tracing::info!(node_id = %node.id, shared = node.shared.is_some(), "joined as a gateway node");
        Ok(Node {
            inner: Arc::new(node),
        })
    }

    pub fn id(&self) -> Uuid {
        self.inner.id
    }

    /// Whether other nodes may share the database (Postgres).
    pub fn is_shared(&self) -> bool {
        self.inner.shared.is_some()
    }

    /// Where the bus tells of committed events, for other nodes (sent,
    /// coalesced, by the task [`Node::start`] starts); `None` on SQLite.
    pub fn announcer(&self) -> Option<mpsc::UnboundedSender<Announced>> {
        self.is_shared().then(|| self.inner.announce.clone())
    }

    /// Waits, at most `grace`, for every task the node runs for the others
    /// to end (they end once the shutdown token given to [`Node::start`] is
    /// cancelled; a command being carried out is finished first); whether
    /// they did.
    pub async fn stop(&self, grace: Duration) -> bool {
        self.inner.tasks.close();
        tokio::time::timeout(grace, self.inner.tasks.wait())
            .await
            .is_ok()
    }

    /// Whether the node was stopped and none of its tasks still runs.
    pub fn is_stopped(&self) -> bool {
        self.inner.tasks.is_closed() && self.inner.tasks.is_empty()
    }

    /// Leaves on a clean stop: gives up every conversation, deletes the
    /// node's row, lets go of the SQLite file.
    pub async fn leave(&self) {
        self.inner.lock.lock().unwrap().take();
        let Some(shared) = &self.inner.shared else {
            return;
        };
        let left = async {
            self.release_all().await?;
            shared.delete_node(self.id()).await
        };
        match left.await {
            Ok(()) => tracing::info!(node_id = %self.id(), "left the cluster"),
            Err(e) => {
                tracing::warn!(error = %e, "could not sign this node off; its lease runs out on its own")
            }
        }
    }

    /// Whether `node` is alive: its lease holds and, when it ran on this
    /// machine, its process is still there.
    async fn alive(&self, node: Uuid) -> Result<bool> {
        if node == self.id() {
            return Ok(true);
        }
        let Some(shared) = &self.inner.shared else {
            return Ok(false);
        };
        let Some(lease) = shared.node_lease(node).await? else {
            return Ok(false);
        };
        let gone_here = Host::here().is_some_and(|h| h.sees(&lease.boot_id, &lease.pid_namespace))
            && !procs::stat(lease.pid)
                .is_some_and(|s| s.is_running() && s.start_time as i64 == lease.start_time);
        Ok(lease.leased && !gone_here)
    }

    /// Renews the lease; registers again when another node took this one
    /// for dead and deleted its row.
    async fn renew(&self, shared: &dyn ClusterStore) {
        match shared.renew_lease(self.id(), self.inner.lease).await {
            Ok(false) => {
                tracing::error!(node_id = %self.id(),
                    "this node's lease was given up by another node (it was taken for dead); \
                     registering again");
                if let Err(e) = register(shared, self.id(), self.inner.lease, true).await {
                    tracing::warn!(error = %e, "could not register this node again");
                }
            }
            Ok(true) => {}
            Err(e) => tracing::warn!(error = %e, "could not renew this node's lease"),
        }
    }
}

/// Writes this process's `nodes` row, its lease starting now (`again`: it
/// may be there already).
async fn register(shared: &dyn ClusterStore, id: Uuid, lease: Duration, again: bool) -> Result<()> {
    let host = Host::here();
    let pid = std::process::id() as i32;
    let record = NodeRecord {
        id,
        hostname: host.map_or("", |h| h.hostname.as_str()).to_owned(),
        boot_id: host.map_or("", |h| h.boot_id.as_str()).to_owned(),
        pid_namespace: host.map_or("", |h| h.pid_namespace.as_str()).to_owned(),
        pid,
        start_time: procs::stat(pid).map_or(0, |s| s.start_time as i64),
    };
    shared.register_node(&record, lease, again).await
}
