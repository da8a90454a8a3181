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
        let (elsewhere, _) = self.owned_by_others().await?;
        Ok(elsewhere
            .into_iter()
            .map(|(conversation, _)| conversation)
            .collect())
    }

    /// The conversations of dead nodes: `(conversation, dead node)`. They
    /// stay the dead node's until [`Node::take_orphan`] takes each.
    pub async fn orphans(&self) -> Result<Vec<(Uuid, Uuid)>> {
        let (_, orphans) = self.owned_by_others().await?;
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

    /// The conversations other nodes own, with their owner: those of live
    /// nodes, then those of dead ones.
    async fn owned_by_others(&self) -> Result<(Vec<(Uuid, Uuid)>, Vec<(Uuid, Uuid)>)> {
        let Some(shared) = &self.inner.shared else {
            return Ok((Vec::new(), Vec::new()));
        };
        let owned = shared.owned_by_others(self.id()).await?;
        let mut alive = HashMap::new();
        let (mut live, mut dead) = (Vec::new(), Vec::new());
        for (conversation, node) in owned {
            let is_alive = match alive.get(&node) {
                Some(is_alive) => *is_alive,
                None => {
                    let is_alive = self.alive(node).await?;
                    alive.insert(node, is_alive);
                    is_alive
                }
            };
            if is_alive {
                live.push((conversation, node));
            } else {
                dead.push((conversation, node));
            }
        }
        Ok((live, dead))
    }

    /// Claims every conversation of a dead node at once: `(conversation,
    /// dead node)`. Only for a start, before anything runs here: the caller
    /// recovers them and gives them up. (While sessions run, each is taken
    /// with [`Node::take_orphan`] under the gate a command's start takes.)
    pub async fn claim_orphans(&self) -> Result<Vec<(Uuid, Uuid)>> {
        let Some(shared) = &self.inner.shared else {
            return Ok(Vec::new());
        };
        let mut claimed = Vec::new();
        for node in shared.other_owners(self.id()).await? {
            if self.alive(node).await? {
                continue;
            }
            let ids = shared.move_all(node, self.id()).await?;
            claimed.extend(ids.into_iter().map(|id| (id, node)));
        }
        // Dead nodes with nothing left go.
        shared.delete_dead_nodes().await?;
        Ok(claimed)
    }
}
