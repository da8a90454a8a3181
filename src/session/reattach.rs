//! Reattaching: the agents an earlier run of this gateway left under their
//! shims on this machine (it crashed, or it was stopped with
//! `on_shutdown = "detach"`) are taken up again where that run's last
//! commit left them, so their turns go on and their requests can still be
//! answered. A shim that cannot be reached (the machine rebooted, the shim
//! died) is settled as `recover` settles any agent that is gone; the next
//! prompt starts the agent again and resumes its session. Shims of closed
//! or deleted conversations are stopped.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use uuid::Uuid;

use super::journal::Journal;
use super::recover::{kill_recorded, recover_conversation};
use super::spawn::agent_box_of;
use super::task::reattached::{self as task, Reattached};
use super::Sessions;
use crate::acp::agent::{stop_shim, AgentProcess};
use crate::cluster::Claim;
use crate::model::ConversationStatus;
use crate::process::procs;
use crate::store::{AgentProcessRecord, PermissionFilter};

/// How long a stopped shim's agent gets before it is killed.
const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(2);
/// How old a key with no socket beside it must be before it is taken for
/// a leftover (a shim reads its key within moments of its start).
const KEY_LEFT_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

/// Why a shim was not reattached.
enum NotReattached {
    /// Its conversation is closed or gone: the shim was told to stop.
    Stopped,
    /// Another live node runs the conversation: left alone.
    Elsewhere,
    /// It could not be: the conversation is settled as one whose agent
    /// is gone.
    Failed(String),
}

impl Sessions {
    /// Reattaches to the shims `records` name (those
    /// [`recover`](super::recover::recover) left alone), then stops the
    /// shims left in the shims' directory whose conversations are closed
    /// or deleted.
    pub async fn reattach(&self, records: Vec<AgentProcessRecord>) -> anyhow::Result<()> {
        // Each conversation's running turn, as stored (read once).
        let turns: HashMap<Uuid, Option<Uuid>> = self
            .store()
            .live_conversations()
            .await?
            .into_iter()
            .map(|(c, turn)| (c.id, turn))
            .collect();
        for record in records {
            let id = record.conversation_id;
            let turn_id = turns.get(&id).copied().flatten();
            let outcome = self.gated(id, self.reattach_one(&record, turn_id)).await;
            match outcome {
                Ok(()) => tracing::info!(conversation_id = %id, "reattached to the agent's shim"),
                Err(NotReattached::Stopped) => {
                    let _ = self.store().forget_agent_process(&record).await;
                }
                Err(NotReattached::Elsewhere) => {}
                Err(NotReattached::Failed(why)) => {
                    tracing::warn!(conversation_id = %id, reason = %why,
                        "cannot reattach to the agent's shim; settling the conversation");
                    self.settle_unreachable(record, turn_id).await?;
                }
            }
        }
        if let Some(shim) = &self.inner.setup.shim {
            self.stop_strays(&shim.dir).await;
        }
        Ok(())
    }

    async fn reattach_one(
        &self,
        record: &AgentProcessRecord,
        turn_id: Option<Uuid>,
    ) -> Result<(), NotReattached> {
        let failed = |e: &dyn std::fmt::Display| NotReattached::Failed(e.to_string());
        let id = record.conversation_id;
        let socket = PathBuf::from(record.shim_socket.as_deref().unwrap_or_default());
        let conversation = self
            .store()
            .get_conversation(id)
            .await
            .map_err(|e| failed(&e))?;
        let Some(conversation) = conversation.filter(|c| c.status != ConversationStatus::Closed)
        else {
            tracing::info!(conversation_id = %id, "stopping the shim of a closed conversation");
            if let Err(e) = stop_shim(&socket, STOP_GRACE).await {
                tracing::warn!(conversation_id = %id, error = %e, "cannot reach the shim to stop it");
            }
            return Err(NotReattached::Stopped);
        };
        let Some(profile) = self.inner.profiles.get(&conversation.agent) else {
            return Err(failed(&format!(
                "its agent profile {:?} is no longer configured",
                conversation.agent
            )));
        };
        let profile = crate::sandbox::profile::for_user(profile, conversation.owner.as_deref());
        // Its terminals and files go in the box its agent is in.
        let agent_box = agent_box_of(&profile, &conversation, &self.inner.setup.homes)
            .map_err(|e| failed(&e))?;
        let Some(session_id) = conversation.acp_session_id.clone() else {
            return Err(failed(&"its agent never opened a session"));
        };
        let fence = match self.inner.node.claim(id).await.map_err(|e| failed(&e))? {
            Claim::Elsewhere(_) => return Err(NotReattached::Elsewhere),
            Claim::Mine { epoch, .. } => epoch,
        };
        let link = record.agent_link().unwrap_or_default();
        let shim = u64::try_from(record.start_time)
            .ok()
            .map(|start_time| (record.pid, start_time));
        let reattached =
            AgentProcess::reattach(&socket, link.output_to, shim, id, &profile.name).await;
        let (process, pipes) = match reattached {
            Ok(attached) => attached,
            Err(e) => {
                self.inner.node.release(id).await;
                return Err(failed(&format!("{e:#}")));
            }
        };
        let pending = self
            .store()
            .list_permissions(&PermissionFilter {
                pending_only: true,
                conversation_id: Some(id),
                owner: None,
                kind: None,
            })
            .await
            .map_err(|e| failed(&e))?;
        let journal =
            Journal::new(self.inner.setup.outlets.clone(), &conversation, turn_id).fenced_at(fence);
        let started = task::reattach(Reattached {
            setup: self.inner.setup.clone(),
            journal,
            process,
            pipes,
            record: record.clone(),
            link,
            session_id,
            profile,
            conversation: &conversation,
            turn_id,
            pending,
            agent_box,
        })
        .await;
        match started {
            Ok((handle, task)) => {
                self.register(id, handle, task);
                Ok(())
            }
            Err(e) => {
                self.inner.node.release(id).await;
                Err(failed(&e))
            }
        }
    }

    /// A shim that could not be reached: what is left of it and its agent
    /// is killed, the record forgotten, and the conversation settled as
    /// one whose agent is gone (the next prompt starts it again).
    async fn settle_unreachable(
        &self,
        record: AgentProcessRecord,
        turn_id: Option<Uuid>,
    ) -> anyhow::Result<()> {
        let id = record.conversation_id;
        if let Some(socket) = record.shim_socket.as_deref() {
            // Reachable after all (it refused us): told to stop.
            let _ = stop_shim(Path::new(socket), STOP_GRACE).await;
        }
        if let Some(link) = record.agent_link() {
            if let (pid, Some(start_time)) = (link.agent_pid, link.agent_start_time) {
                if pid > 0 {
                    let _ =
                        tokio::task::spawn_blocking(move || procs::kill_leftovers(pid, start_time))
                            .await;
                }
            }
        }
        kill_recorded(self.store(), vec![record], |_| true).await?;
        let Some(conversation) = self.store().get_conversation(id).await? else {
            return Ok(());
        };
        if conversation.status == ConversationStatus::Closed {
            return Ok(());
        }
        recover_conversation(
            self.outlets(),
            &conversation,
            turn_id,
            "the gateway restarted; the agent's shim could not be reached",
        )
        .await?;
        Ok(())
    }

    /// Stops the shims in `dir` that nobody will use again: those whose
    /// conversation is gone (deleted: its record went with it), and those
    /// no record names any more (the conversation was closed, or another
    /// node took it over and runs its agent now). A shim on record here that
    /// another gateway on this machine serves is left alone.
    async fn stop_strays(&self, dir: &Path) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        let Ok(records) = self.store().list_agent_processes().await else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            // Sockets only: a key beside one goes with it, and a key whose
            // shim never came to be (it could not start) goes once it is
            // surely not one whose shim is starting now.
            if path.extension().is_some_and(|e| e == "key") {
                let stale = entry
                    .metadata()
                    .and_then(|m| m.modified())
                    .is_ok_and(|t| t.elapsed().is_ok_and(|age| age > KEY_LEFT_AFTER));
                if stale && !path.with_extension("sock").exists() {
                    let _ = std::fs::remove_file(&path);
                }
                continue;
            }
            if path.extension().is_none_or(|e| e != "sock") {
                continue;
            }
            let Some(id) = path
                .file_stem()
                .and_then(|s| s.to_str())
                .and_then(|s| Uuid::parse_str(s).ok())
            else {
                continue;
            };
            if self.live(id).is_some() {
                continue;
            }
            let named = records.iter().any(|r| {
                r.conversation_id == id
                    && r.shim_socket.as_deref().map(Path::new) == Some(path.as_path())
            });
            if named {
                continue;
            }
            tracing::info!(conversation_id = %id, "stopping a shim no conversation uses any more");
            if stop_shim(&path, STOP_GRACE).await.is_err() {
                // Nobody serves it: leftover files.
                let _ = std::fs::remove_file(&path);
                let _ = std::fs::remove_file(crate::shim::key_of(&path));
            }
        }
    }
}
