//! Where a conversation's command runs: on its live session here (starting
//! its agent again first if it is gone), or on the gateway node that owns
//! it (see [`crate::cluster`]), forwarded as a [`Command`]; and what this
//! node does with the commands the others forward to it ([`ClusterMember`]).

use std::future::Future;
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::Value;
use uuid::Uuid;

use super::answer::Answerer;
use super::command::{Command, Handle, Prompted, Setting, WhileRunning};
use super::journal::Journal;
use super::queue::{self, QueueEdit};
use super::recover::settle_pending;
use super::Sessions;
use crate::cluster::{Claim, ClusterMember, Forwarded};
use crate::error::{Error, Problem, Result};
use crate::model::{Conversation, ConversationStatus, PermissionStatus, QueueChanged};

/// How often a remote agent whose connection was lost is tried again,
/// unless its profile's `reconnect_tries` says otherwise.
const RECONNECT_TRIES: u32 = 10;
/// The longest wait between two of those tries.
const RECONNECT_MAX_DELAY: Duration = Duration::from_secs(30);

impl Sessions {
    /// The live session of a conversation; one whose agent is gone (a
    /// crash, an idle stop, a restart of the gateway) has it started again
    /// on this node and resumed, unless another live node runs it (then
    /// that node). Concurrent callers wait for one start.
    async fn attach(&self, conversation: &Conversation) -> Result<Attached> {
        let id = conversation.id;
        if let Some(session) = self.live(id) {
            return Ok(Attached::Here(session));
        }
        self.gated(id, async {
            if let Some(session) = self.live(id) {
                return Ok(Attached::Here(session));
            }
            // As stored now: its `last_seq` and status are the journal's.
            let conversation = self.stored(id).await?;
            if conversation.status == ConversationStatus::Closed {
                return Err(not_live(&conversation));
            }
            let profile = self.inner.profiles.get(&conversation.agent);
            let profile = profile.map(|p| self.inner.client_mcp.profile(id, p));
            let profile = profile.ok_or_else(|| {
                Error::conflict(
                    "agent_unavailable",
                    format!(
                        "the conversation's agent profile {:?} is no longer configured",
                        conversation.agent
                    ),
                )
            })?;
            let (conversation, fence) = match self.inner.node.claim(id).await? {
                Claim::Elsewhere(node) => return Ok(Attached::There(node)),
                Claim::Mine {
                    took_from: None,
                    epoch,
                } => (conversation, epoch),
                Claim::Mine {
                    took_from: Some(dead),
                    epoch,
                } => {
                    self.recover_taken(id, dead).await?;
                    (self.stored(id).await?, epoch)
                }
            };
            match self
                .launch(profile, conversation, true, fence, super::Origin::Plain)
                .await
            {
                Ok((session, _)) => Ok(Attached::Here(session)),
                Err(e) => {
                    self.inner.node.release(id).await;
                    Err(e)
                }
            }
        })
        .await
    }

    /// After a remote agent's connection was lost: connects again (and
    /// resumes or loads its session, as a prompt would), RECONNECT_TRIES
    /// times at most, one second after the loss and twice as long after
    /// each failure (at most RECONNECT_MAX_DELAY); each try shows in the
    /// conversation's `agent_status` (`starting`, then `ready` or
    /// `failed`). Stops when the conversation is closed, started again
    /// meanwhile (a prompt), or the gateway shuts down. Nothing for a
    /// started agent that crashed: the next prompt starts it again.
    pub(super) async fn reconnect(&self, id: Uuid) {
        let remote = |conversation: &Conversation| {
            self.inner
                .profiles
                .get(&conversation.agent)
                .is_some_and(|p| p.url.is_some())
        };
        let Ok(conversation) = self.stored(id).await else {
            return;
        };
        if !remote(&conversation) {
            return;
        }
        let tries = self
            .inner
            .profiles
            .get(&conversation.agent)
            .and_then(|p| p.reconnect_tries)
            .unwrap_or(RECONNECT_TRIES);
        let mut delay = Duration::from_secs(1);
        for _ in 0..tries {
            tokio::select! {
                _ = self.inner.setup.shutdown.cancelled() => return,
                _ = tokio::time::sleep(delay) => {}
            }
            if self.live(id).is_some() {
                return;
            }
            let Ok(conversation) = self.stored(id).await else {
                return;
            };
            if !remote(&conversation) || conversation.status == ConversationStatus::Closed {
                return;
            }
            match self.attach(&conversation).await {
                Ok(_) => return,
                Err(e) => {
                    tracing::info!(conversation_id = %id, error = %e, "the remote agent is still away")
                }
            }
            delay = (delay * 2).min(RECONNECT_MAX_DELAY);
        }
        // The requests it left pending will not be answered.
        let detail = match tries {
            0 => "the remote agent's connection was lost (reconnect_tries = 0)".to_owned(),
            1 => "the remote agent's connection was lost and it did not come back in 1 try"
                .to_owned(),
            n => format!(
                "the remote agent's connection was lost and it did not come back in {n} tries"
            ),
        };
        let settled = self
            .gated(id, async {
                if self.live(id).is_some() || self.runs_elsewhere(id).await?.is_some() {
                    return Ok(());
                }
                let conversation = self.stored(id).await?;
                let mut journal =
                    Journal::new(self.inner.setup.outlets.clone(), &conversation, None);
                settle_pending(&mut journal, PermissionStatus::Expired, &detail).await?;
                journal.flush().await
            })
            .await;
        if let Err(e) = settled {
            tracing::warn!(conversation_id = %id, error = %e, "could not expire what the remote agent left pending");
        }
    }

    /// At start: the conversations whose remote agents' connections an
    /// earlier run lost with requests pending (or which that run's end
    /// cut) are connected again, as [`Sessions::reconnect`] does after a
    /// loss: the agent's server may have kept the session and still ask.
    pub async fn reconnect_remote_agents(&self) -> Result<()> {
        let pending = self
            .store()
            .list_permissions(&crate::store::PermissionFilter {
                pending_only: true,
                conversation_id: None,
                owner: None,
                kind: None,
            })
            .await?;
        let mut ids: Vec<Uuid> = pending.iter().map(|r| r.conversation_id).collect();
        ids.sort();
        ids.dedup();
        for id in ids {
            if self.live(id).is_some() {
                continue;
            }
            let sessions = self.clone();
            self.inner
                .tasks
                .spawn(async move { sessions.reconnect(id).await });
        }
        Ok(())
    }

    /// Runs `command` on the conversation's live session, starting the
    /// agent again first if it is gone; where another node runs it, that
    /// node runs `remote` (the same command, sent as JSON) and its answer
    /// is this one.
    async fn on_live<T, F, Fut>(
        &self,
        conversation: &Conversation,
        command: F,
        remote: Command,
    ) -> Result<T>
    where
        F: Fn(Handle) -> Fut,
        Fut: Future<Output = Option<Result<T>>>,
        T: serde::de::DeserializeOwned,
    {
        if conversation.status == ConversationStatus::Closed {
            return Err(not_live(conversation));
        }
        // A few rounds: an agent may go away (or its node die) just then.
        for _ in 0..3 {
            match self.attach(conversation).await? {
                Attached::Here(session) => {
                    if let Some(result) = command(session.clone()).await {
                        return result;
                    }
                    // Its agent went away just then (the session was
                    // ending): once it has ended, start it again, as for
                    // any gone agent.
                    session.ended().await;
                }
                Attached::There(node) => {
                    if let Some(answer) = self.forward(conversation.id, node, &remote).await? {
                        return answer;
                    }
                }
            }
        }
        Err(not_live(&self.stored(conversation.id).await?))
    }

    /// Has `node` run `command`: its answer, or `None` when it died before
    /// taking it.
    pub(super) async fn forward<T: serde::de::DeserializeOwned>(
        &self,
        conversation_id: Uuid,
        node: Uuid,
        command: &Command,
    ) -> Result<Option<Result<T>>> {
        Ok(
            match self
                .inner
                .node
                .forward(conversation_id, node, command.to_value())
                .await?
            {
                Forwarded::Answered(Ok(value)) => Some(decode(value)),
                Forwarded::Answered(Err(problem)) => Some(Err(Error::Remote(problem))),
                Forwarded::OwnerGone => None,
            },
        )
    }

    /// Whether a live node other than this one runs the conversation's
    /// agent (without claiming it).
    pub(super) async fn runs_elsewhere(&self, conversation_id: Uuid) -> Result<Option<Uuid>> {
        if !self.inner.node.is_shared() || self.live(conversation_id).is_some() {
            return Ok(None);
        }
        self.inner.node.runs_elsewhere(conversation_id).await
    }

    /// Starts a turn, starting the agent again first if it is gone (the
    /// turn's id once `turn_started` is committed); while one runs, the
    /// prompt is refused, queued or steers, as `while_running` says.
    pub async fn prompt(
        &self,
        conversation: &Conversation,
        content: Vec<Value>,
        while_running: WhileRunning,
        by: Option<String>,
    ) -> Result<Prompted> {
        let remote = Command::Prompt {
            content: content.clone(),
            while_running,
            by: by.clone(),
            reply: Default::default(),
        };
        self.on_live(
            conversation,
            |session| {
                let (content, by) = (content.clone(), by.clone());
                async move { session.prompt(content, while_running, by).await }
            },
            remote,
        )
        .await
    }

    /// A person's change to one of the conversation's queued prompts: made
    /// by its live session (here or on the node that runs it), else to the
    /// stored queue (no agent runs, so nothing starts meanwhile). A prompt
    /// that no longer waits is 404, or 409 `already_started` where it
    /// started a turn.
    pub async fn edit_queue(
        &self,
        conversation: &Conversation,
        edit: QueueEdit,
        by: String,
    ) -> Result<QueueChanged> {
        let prompt = edit.prompt();
        let remote = Command::Queue {
            edit: edit.clone(),
            by: by.clone(),
            reply: Default::default(),
        };
        let session = |session: Handle| {
            let (edit, by) = (edit.clone(), by.clone());
            async move { session.edit_queue(edit, by).await }
        };
        let changed = self
            .unattended(conversation, session, remote, |journal, stored| {
                let (edit, by) = (edit.clone(), by.clone());
                Box::pin(async move {
                    let mut queue = stored.queue;
                    let changed = queue::apply(&mut queue, edit, &by)?;
                    journal.append(changed.clone());
                    journal.set_queue(&queue);
                    journal.flush().await?;
                    Ok(changed)
                })
            })
            .await;
        match changed {
            Err(Error::NotFound(why)) => {
                let started = self.store().turn_exists(conversation.id, prompt).await?;
                Err(match started {
                    true => Error::conflict(
                        "already_started",
                        format!("the queued prompt {prompt} has started (turn {prompt})"),
                    ),
                    false => Error::NotFound(why),
                })
            }
            changed => changed,
        }
    }

    /// Starts the first queued prompt now, starting the agent again first
    /// if it is gone; the new turn's id.
    pub async fn resume_queue(&self, conversation: &Conversation) -> Result<Uuid> {
        if self.live(conversation.id).is_none()
            && self.runs_elsewhere(conversation.id).await?.is_none()
        {
            let stored = self.stored(conversation.id).await?;
            if stored.queue.is_empty() {
                return Err(Error::conflict("queue_empty", "no prompt is queued"));
            }
        }
        let remote = Command::Resume {
            reply: Default::default(),
        };
        self.on_live(
            conversation,
            |session| async move { session.resume_queue().await },
            remote,
        )
        .await
    }

    /// Changes a session setting (the agent's session mode or one of its
    /// configuration options), between turns or during one; returns once
    /// the agent accepted and the change is recorded. What the agent does
    /// not offer is refused (422) without asking it, and without starting
    /// an agent that is gone.
    pub async fn change(
        &self,
        conversation: &Conversation,
        setting: Setting,
        changed_by: String,
    ) -> Result<()> {
        if self.live(conversation.id).is_none() {
            setting
                .check(&conversation.state)
                .map_err(|why| Error::conflict("not_offered", why))?;
        }
        let remote = Command::Change {
            setting: setting.clone(),
            changed_by: changed_by.clone(),
            reply: Default::default(),
        };
        self.on_live(
            conversation,
            |session| {
                let (setting, changed_by) = (setting.clone(), changed_by.clone());
                async move { session.change(setting, changed_by).await }
            },
            remote,
        )
        .await
    }

    /// Cancels the running turn, if any.
    pub async fn cancel(&self, conversation: &Conversation) -> Result<()> {
        if let Some(session) = self.live(conversation.id) {
            if let Some(result) = session.cancel().await {
                return result;
            }
        }
        if conversation.status == ConversationStatus::Closed {
            return Err(not_live(conversation));
        }
        if let Some(node) = self.runs_elsewhere(conversation.id).await? {
            let cancel = Command::Cancel {
                reply: Default::default(),
            };
            if let Some(answer) = self.forward(conversation.id, node, &cancel).await? {
                return answer;
            }
        }
        // No agent, so no turn: nothing to cancel.
        Ok(())
    }

    /// Closes a conversation: its live session stops its agent (cancelling
    /// its turn and requests), here or on the node that runs it; one without
    /// an agent is just marked closed.
    pub async fn close(&self, conversation: &Conversation) -> Result<()> {
        self.inner.client_mcp.forget(conversation.id);
        if conversation.status == ConversationStatus::Closed && self.live(conversation.id).is_none()
        {
            return Ok(());
        }
        let remote = Command::Close {
            reply: Default::default(),
        };
        let session = |session: Handle| async move {
            // Answered once the agent is gone (`None`: it was going).
            session.close().await;
            Some(Ok(()))
        };
        self.unattended(conversation, session, remote, |journal, _| {
            Box::pin(async move {
                // Left pending by a remote agent that is away.
                settle_pending(journal, PermissionStatus::Cancelled, "conversation closed").await?;
                journal.set_status(ConversationStatus::Closed);
                journal.flush().await
            })
        })
        .await
    }

    /// Runs a command that needs no agent: on the conversation's live
    /// session (`command`), here or on the node that runs it (`remote`);
    /// else here on what is stored (`write`, with a journal fenced at the
    /// claim this takes, under the gate a start takes too, so no session
    /// starts meanwhile), without starting its agent.
    pub(super) async fn unattended<T, F, Fut, W>(
        &self,
        conversation: &Conversation,
        command: F,
        remote: Command,
        write: W,
    ) -> Result<T>
    where
        F: Fn(Handle) -> Fut,
        Fut: Future<Output = Option<Result<T>>>,
        T: serde::de::DeserializeOwned,
        W: for<'j> Fn(&'j mut Journal, Conversation) -> BoxFuture<'j, Result<T>>,
    {
        let id = conversation.id;
        // A few rounds: a session may start or end, or a node die, just then.
        for _ in 0..3 {
            if let Some(session) = self.live(id) {
                if let Some(result) = command(session.clone()).await {
                    return result;
                }
                session.ended().await;
                continue;
            }
            let here = self
                .gated(id, async {
                    if self.live(id).is_some() {
                        // Started here meanwhile.
                        return Ok(Unattended::Again);
                    }
                    let (took_from, epoch) = match self.inner.node.claim(id).await? {
                        Claim::Elsewhere(node) => return Ok(Unattended::Elsewhere(node)),
                        Claim::Mine { took_from, epoch } => (took_from, epoch),
                    };
                    let written = async {
                        if let Some(dead) = took_from {
                            self.recover_taken(id, dead).await?;
                        }
                        let stored = self.stored(id).await?;
                        let mut journal =
                            Journal::new(self.inner.setup.outlets.clone(), &stored, None)
                                .fenced_at(epoch);
                        write(&mut journal, stored).await
                    }
                    .await;
                    self.inner.node.release(id).await;
                    written.map(Unattended::Done)
                })
                .await?;
            match here {
                Unattended::Done(done) => return Ok(done),
                Unattended::Again => {}
                Unattended::Elsewhere(node) => {
                    if let Some(answer) = self.forward(id, node, &remote).await? {
                        return answer;
                    }
                }
            }
        }
        Err(not_live(&self.stored(id).await?))
    }
}

/// What this node does for the others (see [`crate::cluster`]).
#[async_trait::async_trait]
impl ClusterMember for Sessions {
    async fn execute(&self, conversation_id: Uuid, command: Value) -> Result<Value, Box<Problem>> {
        let run = async {
            let command: Command = decode(command)?;
            let conversation = self.stored(conversation_id).await?;
            Ok::<Value, Error>(match command {
                Command::Prompt {
                    content,
                    while_running,
                    by,
                    ..
                } => serde_json::to_value(
                    self.prompt(&conversation, content, while_running, by)
                        .await?,
                )
                .expect("ids serialize"),
                Command::Queue { edit, by, .. } => {
                    serde_json::to_value(self.edit_queue(&conversation, edit, by).await?)
                        .expect("queues serialize")
                }
                Command::Resume { .. } => {
                    serde_json::to_value(self.resume_queue(&conversation).await?)
                        .expect("ids serialize")
                }
                Command::Cancel { .. } => {
                    self.cancel(&conversation).await?;
                    Value::Null
                }
                Command::Close { .. } => {
                    self.close(&conversation).await?;
                    Value::Null
                }
                Command::Respond {
                    request,
                    answer,
                    decided_by,
                    via,
                    reason,
                    steer,
                    ..
                } => {
                    // The node that sent it checked who may answer.
                    let who = Answerer {
                        decided_by,
                        via,
                        reason,
                        steer,
                        kind: None,
                        caller: None,
                    };
                    serde_json::to_value(self.answer(request, &who, answer).await?)
                        .expect("requests serialize")
                }
                Command::Change {
                    setting,
                    changed_by,
                    ..
                } => {
                    self.change(&conversation, setting, changed_by).await?;
                    Value::Null
                }
                Command::Changes { op, by, .. } => {
                    serde_json::to_value(self.change_work(&conversation, op, by).await?)
                        .expect("changes serialize")
                }
                Command::Budget { word, .. } => {
                    self.budget(&conversation, word).await?;
                    Value::Null
                }
                Command::Members { op, by, .. } => {
                    serde_json::to_value(self.change_members(&conversation, op, by).await?)
                        .expect("members serialize")
                }
                // Never sent to another node (it cannot be read from JSON).
                Command::Release { .. } => {
                    return Err(Error::Internal(anyhow::anyhow!(
                        "another node asked to release an agent"
                    )))
                }
            })
        };
        run.await.map_err(|e| Box::new(e.problem()))
    }

    async fn adopt_orphans(&self) {
        if let Err(e) = self.recover_orphans().await {
            tracing::warn!(error = %e, "could not recover the conversations of a dead node");
        }
    }
}

/// What became of a command with no live session to run it (see
/// [`Sessions::unattended`]).
enum Unattended<T> {
    Done(T),
    /// A session started here meanwhile: it runs the command.
    Again,
    /// A live node other than this one runs the conversation.
    Elsewhere(Uuid),
}

/// Where a conversation's agent runs.
enum Attached {
    Here(Handle),
    /// On this other live node.
    There(Uuid),
}

/// The value another node's answer carries back.
fn decode<T: serde::de::DeserializeOwned>(value: Value) -> Result<T> {
    serde_json::from_value(value).map_err(|e| {
        Error::Internal(anyhow::anyhow!(
            "another node's answer is not what this node expects: {e}"
        ))
    })
}

/// Why a conversation cannot take a command: it is closed, or its agent
/// went away while the command waited.
fn not_live(conversation: &Conversation) -> Error {
    match conversation.status {
        ConversationStatus::Closed => {
            Error::conflict("conversation_closed", "the conversation is closed")
        }
        _ => Error::conflict(
            "agent_unavailable",
            format!(
                "the conversation's agent is not running (status {})",
                conversation.status.as_str()
            ),
        ),
    }
}
