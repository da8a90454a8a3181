//! Who runs which conversation's agent: claiming a conversation for this
//! node, finding it runs elsewhere, giving it up, and claiming the
//! conversations of dead nodes (their orphans).

use std::collections::{HashMap, HashSet};

use uuid::Uuid;

use super::{Claim, Node};
use crate::error::{Error, Result};

impl Node {
    /// Makes this node the owner of `conversation` unless a live node is.
    pub async fn claim(&self, conversation: Uuid) -> Result<Claim> {
        let Some(shared) = &self.inner.shared else {
            return Ok(Claim::Mine {
                took_from: None,
                epoch: None,
            });
        };
        loop {
            let Some(owner) = shared.conversation_node(conversation).await? else {
                return Err(Error::NotFound(format!("no conversation {conversation}")));
            };
            let took_from = match owner {
                Some(node) if node != self.id() => {
                    if self.alive(node).await? {
                        return Ok(Claim::Elsewhere(node));
                    }
                    Some(node)
                }
                _ => None,
            };
            let moved = shared
                .move_conversation(conversation, owner, self.id())
                .await?;
            if let Some(epoch) = moved {
                if let Some(dead) = took_from {
                    tracing::info!(conversation_id = %conversation, dead_node = %dead, epoch,
                        "took over a conversation of a dead node");
                }
                return Ok(Claim::Mine {
                    took_from,
                    epoch: Some(epoch),
                });
            }
            // Claimed by someone else meanwhile: look again.
        }
    }

    /// The live node other than this one that owns `conversation`, if any.
    pub async fn runs_elsewhere(&self, conversation: Uuid) -> Result<Option<Uuid>> {
        let Some(shared) = &self.inner.shared else {
            return Ok(None);
        };
        let owner = shared.conversation_node(conversation).await?;
        match owner.flatten() {
            Some(node) if node != self.id() && self.alive(node).await? => Ok(Some(node)),
            _ => Ok(None),
        }
    }

    /// Gives up ownership (its agent is gone from this node).
    pub async fn release(&self, conversation: Uuid) {
        let Some(shared) = &self.inner.shared else {
            return;
        };
        if let Err(e) = shared.release_conversation(conversation, self.id()).await {
            tracing::warn!(conversation_id = %conversation, error = %e,
                "could not release the conversation (it passes to another node once this node's lease runs out)");
        }
    }

    /// Gives up every conversation this node owns (none of its agents runs).
    pub async fn release_all(&self) -> Result<()> {
        let Some(shared) = &self.inner.shared else {
            return Ok(());
        };
        shared.release_all(self.id()).await
    }

    /// The conversations that live nodes other than this one own.
    pub async fn owned_elsewhere(&self) -> Result<HashSet<Uuid>> {
        let Some(shared) = &self.inner.shared else {
            return Ok(HashSet::new());
        };
        let owned = shared.owned_by_others(self.id()).await?;
        let mut alive = HashMap::new();
        let mut elsewhere = HashSet::new();
        for (conversation, node) in owned {
            let live = match alive.get(&node) {
                Some(live) => *live,
                None => {
                    let live = self.alive(node).await?;
                    alive.insert(node, live);
                    live
                }
            };
            if live {
                elsewhere.insert(conversation);
            }
        }
        Ok(elsewhere)
    }

    /// The conversations of dead nodes: `(conversation, dead node)`. They
    /// stay the dead node's until [`Node::take_orphan`] takes each.
    pub async fn orphans(&self) -> Result<Vec<(Uuid, Uuid)>> {
        let Some(shared) = &self.inner.shared else {
            return Ok(Vec::new());
        };
        let mut orphans = Vec::new();
        for node in shared.other_owners(self.id()).await? {
            if self.alive(node).await? {
                continue;
            }
            let ids = shared.owned_by(node).await?;
            orphans.extend(ids.into_iter().map(|id| (id, node)));
        }
        Ok(orphans)
    }

    /// Makes this node the owner of `conversation` if the dead node `dead`
    /// still owns it; `false` when another claim took it first (a command's
    /// start here, which recovers it itself, or another node).
    pub async fn take_orphan(&self, conversation: Uuid, dead: Uuid) -> Result<bool> {
        let Some(shared) = &self.inner.shared else {
            return Ok(false);
        };
        let moved = shared
            .move_conversation(conversation, Some(dead), self.id())
            .await?;
        Ok(moved.is_some())
    }

    /// Deletes the rows of dead nodes that own nothing any more.
    pub async fn forget_dead_nodes(&self) -> Result<()> {
        let Some(shared) = &self.inner.shared else {
            return Ok(());
        };
        shared.delete_dead_nodes().await
    }

    /// Takes every conversation of a dead node that no one took first:
    /// `(conversation, dead node)`; the caller recovers them and gives them
    /// up. For a gateway's start, before anything runs here (while sessions
    /// run, each is taken under the gate a command's start takes: see
    /// `Sessions::recover_orphans`).
    pub async fn claim_orphans(&self) -> Result<Vec<(Uuid, Uuid)>> {
        let mut claimed = Vec::new();
        for (id, dead) in self.orphans().await? {
            if self.take_orphan(id, dead).await? {
                claimed.push((id, dead));
            }
        }
        self.forget_dead_nodes().await?;
        Ok(claimed)
    }
}
