//! The node's work for the others while the gateway runs (Postgres only):
//! renewing the lease, sweeping for dead nodes' conversations, carrying out
//! the commands sent to it, relaying events committed elsewhere to its bus,
//! and announcing its own. Every task of it is the node's (see
//! [`Node::stop`]) and ends with the shutdown token.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::commands::{parse_answer_notice, parse_command_notice};
use super::relay::{announce, parse_announced, relay, Relayed};
use super::{ClusterMember, Node};
use crate::bus::EventBus;
use crate::store::cluster::Channel;
use crate::store::Store;

/// Answered commands are deleted by their sender; ones left behind (a
/// sender that stopped while waiting) after this long.
const COMMAND_RETENTION: Duration = Duration::from_secs(600);

impl Node {
    /// Starts the node's work for the others (see [`run`]) in a task of the
    /// node's own; it ends once `shutdown` is cancelled.
    pub fn start(
        &self,
        store: Arc<dyn Store>,
        bus: EventBus,
        member: Arc<dyn ClusterMember>,
        shutdown: CancellationToken,
    ) {
        self.inner
            .tasks
            .spawn(run(self.clone(), store, bus, member, shutdown));
    }
}

/// The node's work for the others while the gateway runs (Postgres only):
/// renews the lease, sweeps for dead nodes' conversations, runs commands sent
/// to it, relays events committed elsewhere to its bus, and announces its own.
/// What it starts runs in the node's tasks.
async fn run(
    node: Node,
    store: Arc<dyn Store>,
    bus: EventBus,
    member: Arc<dyn ClusterMember>,
    shutdown: CancellationToken,
) {
    let Some(shared) = node.inner.shared.clone() else {
        return;
    };
    let announced = node.inner.announced.lock().unwrap().take();
    let Some(announced) = announced else { return };
    let tasks = &node.inner.tasks;
    let (relay_tx, relay_rx) = mpsc::unbounded_channel();
    tasks.spawn(announce(
        shared.clone(),
        node.id(),
        announced,
        relay_tx.clone(),
        shutdown.clone(),
    ));
    tasks.spawn(relay(store, bus, relay_rx, shutdown.clone()));
    let mut listener = loop {
        match shared.listen().await {
            Ok(listener) => break listener,
            Err(e) => {
                tracing::warn!(error = %e, "could not listen for other nodes; trying again");
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(node.inner.lease / 3) => {}
                }
            }
        }
    };
    let mut tick = tokio::time::interval(node.inner.lease / 3);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let me = node.id().to_string();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {
                node.renew(&*shared).await;
                node.receive_commands(&shared, &member).await;
                let member = member.clone();
                tasks.spawn(async move { member.adopt_orphans().await });
                let _ = shared.delete_commands_older_than(COMMAND_RETENTION).await;
            }
            received = listener.recv() => match received {
                Ok(Some(notice)) => {
                    let payload = notice.payload.as_str();
                    match notice.channel {
                        Channel::Events => {
                            if let Some(announced) = parse_announced(payload, &me) {
                                let _ = relay_tx.send(Relayed::Events(announced));
                            }
                        }
                        Channel::Commands => {
                            if let Some(id) = parse_command_notice(payload, &me) {
                                node.spawn_command(&shared, &member, id);
                            }
                        }
                        Channel::Answers => {
                            if let Some(id) = parse_answer_notice(payload) {
                                node.answered(id);
                            }
                        }
                    }
                }
                // The connection was lost and is made again: what was said
                // meanwhile is looked up.
                Ok(None) => {
                    tracing::warn!("lost the connection that listens to other nodes; reconnecting");
                    node.receive_commands(&shared, &member).await;
                    let _ = relay_tx.send(Relayed::CatchUp);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "listening to other nodes failed; trying again");
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(node.inner.lease / 3) => {}
                    }
                }
            }
        }
    }
}
