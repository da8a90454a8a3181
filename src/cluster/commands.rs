//! Commands between nodes: one for a conversation another node runs is
//! forwarded to that owner, who receives it, carries it out and answers. The
//! texts of their notifications are written and read here.

use std::sync::Arc;

use serde_json::Value;
use tokio::sync::oneshot;
use uuid::Uuid;

use super::{ClusterMember, Forwarded, Node};
use crate::error::{Error, Problem, Result};
use crate::store::cluster::SentCommand;
use crate::store::ClusterStore;

impl Node {
    /// Sends `command` for `conversation` to its owner `owner` and waits for
    /// the answer.
    pub async fn forward(
        &self,
        conversation: Uuid,
        owner: Uuid,
        command: Value,
    ) -> Result<Forwarded> {
        let Some(shared) = &self.inner.shared else {
            return Ok(Forwarded::OwnerGone);
        };
        let id = Uuid::now_v7();
        let (tx, mut rx) = oneshot::channel();
        self.inner.waiting.lock().unwrap().insert(id, tx);
        let _forget = Forget(self, id);
        let kind = command
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let sent = SentCommand {
            id,
            node: owner,
            conversation,
            kind: &kind,
            body: &command,
        };
        shared
            .send_command(sent, &command_notice(owner, id))
            .await?;
        tracing::debug!(conversation_id = %conversation, %owner, kind, "sent a command to the owning node");
        let check = self.inner.lease / 3;
        let mut told = false;
        loop {
            tokio::select! {
                _ = &mut rx, if !told => told = true,
                _ = tokio::time::sleep(check) => {}
            }
            if let Some(answer) = shared.command_answer(id).await? {
                shared.delete_command(id).await?;
                return Ok(Forwarded::Answered(decode_answer(answer)));
            }
            if self.alive(owner).await? {
                continue;
            }
            // Dead: take the command back unless it was taken.
            if shared.withdraw_command(id).await? {
                return Ok(Forwarded::OwnerGone);
            }
            if let Some(answer) = shared.delete_answered_command(id).await? {
                return Ok(Forwarded::Answered(decode_answer(answer)));
            }
            return Err(Error::Unavailable(
                "the gateway node running this conversation stopped while carrying out the request; \
                 try again"
                    .into(),
            ));
        }
    }

    /// Tells the sender waiting for the command `id` that it was answered.
    pub(super) fn answered(&self, id: Uuid) {
        if let Some(tx) = self.inner.waiting.lock().unwrap().remove(&id) {
            let _ = tx.send(());
        }
    }

    /// Carries out the commands sent to this node that nobody took yet
    /// (each in a task of the node's own).
    pub(super) async fn receive_commands(
        &self,
        shared: &Arc<dyn ClusterStore>,
        member: &Arc<dyn ClusterMember>,
    ) {
        match shared.waiting_commands(self.id()).await {
            Ok(ids) => {
                for id in ids {
                    self.spawn_command(shared, member, id);
                }
            }
            Err(e) => tracing::warn!(error = %e, "could not look for commands sent to this node"),
        }
    }

    /// Carries out the command `id`, in a task of the node's own.
    pub(super) fn spawn_command(
        &self,
        shared: &Arc<dyn ClusterStore>,
        member: &Arc<dyn ClusterMember>,
        id: Uuid,
    ) {
        let (node, shared, member) = (self.clone(), shared.clone(), member.clone());
        self.inner.tasks.spawn(async move {
            if let Err(e) = node.run_command(&*shared, &member, id).await {
                tracing::warn!(command = %id, error = %e, "could not carry out a command from another node");
            }
        });
    }

    /// Marks the command taken, unless another call did, carries it out and
    /// writes the answer back.
    async fn run_command(
        &self,
        shared: &dyn ClusterStore,
        member: &Arc<dyn ClusterMember>,
        id: Uuid,
    ) -> Result<()> {
        let Some((conversation, command)) = shared.mark_command_taken(id, self.id()).await? else {
            return Ok(());
        };
        let answer = match member.execute(conversation, command).await {
            Ok(value) => serde_json::json!({"ok": value}),
            Err(problem) => serde_json::json!({"problem": problem}),
        };
        shared.answer_command(id, &answer, &answer_notice(id)).await
    }
}

/// The notification of a command: `node id`.
fn command_notice(node: Uuid, id: Uuid) -> String {
    format!("{node} {id}")
}

/// The command a notification tells of, when it is for `me`.
pub(super) fn parse_command_notice(payload: &str, me: &str) -> Option<Uuid> {
    let mut parts = payload.split(' ');
    if parts.next() != Some(me) {
        return None;
    }
    parts.next().map(Uuid::parse_str)?.ok()
}

/// The notification of an answer: the command's id.
fn answer_notice(id: Uuid) -> String {
    id.to_string()
}

/// The command an answer's notification tells of.
pub(super) fn parse_answer_notice(payload: &str) -> Option<Uuid> {
    Uuid::parse_str(payload).ok()
}

/// Forgets a waiting command when its sender stops waiting.
struct Forget<'a>(&'a Node, Uuid);

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.0.inner.waiting.lock().unwrap().remove(&self.1);
    }
}

fn decode_answer(answer: Value) -> std::result::Result<Value, Box<Problem>> {
    if let Some(problem) = answer.get("problem") {
        return Err(Box::new(
            serde_json::from_value(problem.clone()).unwrap_or_else(|_| Problem {
                status: 500,
                code: "internal_error".into(),
                detail: "the owning node gave an answer this node cannot read".into(),
                extra: None,
                retry_after: None,
            }),
        ));
    }
    Ok(answer.get("ok").cloned().unwrap_or(Value::Null))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_decode_to_values_and_problems() {
        assert_eq!(
            decode_answer(serde_json::json!({"ok": 5})),
            Ok(serde_json::json!(5))
        );
        let problem = decode_answer(
            serde_json::json!({"problem": {"status": 409, "code": "x", "detail": "d"}}),
        )
        .unwrap_err();
        assert_eq!((problem.status, problem.code.as_str()), (409, "x"));
        assert_eq!(
            decode_answer(serde_json::json!({"problem": 1}))
                .unwrap_err()
                .status,
            500
        );
    }

    #[test]
    fn command_notices_reach_only_their_node() {
        let (me, other, id) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
        let notice = command_notice(me, id);
        assert_eq!(parse_command_notice(&notice, &me.to_string()), Some(id));
        assert_eq!(parse_command_notice(&notice, &other.to_string()), None);
        assert_eq!(parse_command_notice(&me.to_string(), &me.to_string()), None);
        assert_eq!(parse_answer_notice(&answer_notice(id)), Some(id));
        assert_eq!(parse_answer_notice("garbage"), None);
    }
}
