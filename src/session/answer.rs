//! A person's answer to a permission request or to an agent's question
//! (two kinds of one waiting item): the one road every answerer takes (the
//! APIs' `respond`, a notification's action URL, and another node
//! forwarding either). It looks in this node's index of waiting
//! requests, then in the store, then asks the node that runs the
//! conversation, each once; what no live agent holds is answered from the
//! stored decision.

use uuid::Uuid;

use super::command::{AnswerNote, Command};
use super::Sessions;
use crate::access::Access;
use crate::auth::Caller;
use crate::error::{Error, Result};
use crate::model::{Answer, PermissionRequest, PermissionStatus, WaitingKind};
use crate::permissions::{agent_away, answer_without_agent, validate_answer};
use crate::store::Store;

/// Who answers a permission request, and how it came.
pub struct Answerer<'a> {
    /// Recorded as the decision's `decided_by` (`user:<name>`).
    pub decided_by: String,
    /// How the answer came (`notification`), if not over the API.
    pub via: Option<String>,
    /// Why, in their words (stored with the decision, told to the agent).
    pub reason: Option<String>,
    /// The reason is told at once: the running turn is cancelled.
    pub steer: bool,
    /// What they answer: a permission request or a question (one of the
    /// other kind is 404, as if it did not exist); `None`: either (another
    /// node checked).
    pub kind: Option<WaitingKind>,
    /// Who they are, for their access to the request's conversation (see
    /// [`crate::access`]): one they may not see is 404, as if it did not
    /// exist; one they see but may not answer in (a viewer), 403. `None`:
    /// whoever handed the answer on checked it (another node).
    pub caller: Option<&'a Caller>,
}

impl Answerer<'_> {
    /// What they said besides the option.
    fn note(&self) -> AnswerNote {
        AnswerNote {
            via: self.via.clone(),
            reason: self.reason.clone(),
            steer: self.steer,
        }
    }

    /// Whether they may answer in the conversation `id` of `owner`'s:
    /// `missing` where they may not see it, 403 where they only view it.
    async fn may_answer(
        &self,
        store: &dyn Store,
        id: Uuid,
        owner: Option<&str>,
        missing: impl Fn() -> Error,
    ) -> Result<()> {
        let Some(caller) = self.caller else {
            return Ok(());
        };
        match Access::find(store, caller, id, owner).await? {
            None => Err(missing()),
            Some(access) => access.require(Access::Approver, "answer its requests and questions"),
        }
    }

    /// Whether they answer an item of `kind`.
    fn answers(&self, kind: WaitingKind) -> bool {
        self.kind.is_none_or(|k| k == kind)
    }
}

impl Sessions {
    /// The requests waiting in live sessions on this node whose
    /// conversations `can_see` (given their id and owner) lets the caller
    /// see: what
    /// an inbox's snapshot adds to the database's pending requests, which
    /// lack those asked while the database was away until they are
    /// committed (their events went out before).
    pub fn waiting_here(
        &self,
        can_see: impl Fn(Uuid, Option<&str>) -> bool,
    ) -> Vec<PermissionRequest> {
        self.inner
            .setup
            .waiting
            .lock()
            .unwrap()
            .values()
            .filter(|w| can_see(w.request.conversation_id, w.owner.as_deref()))
            .map(|w| w.request.clone())
            .collect()
    }

    /// `who`'s answer to the permission request `id`: recorded, then the
    /// agent hears it, then `permission_resolved` is published. The answer
    /// given again is a success; another after the first is 409
    /// `already_resolved`; one for a request no live agent holds, 409
    /// `agent_gone` (`agent_away` where a remote agent's connection was
    /// lost and it may ask again once it is back).
    ///
    /// A request waiting in a live session here is answered without
    /// reading the database (the common case); otherwise the stored request
    /// says whether anyone still waits, and a pending one is answered by
    /// the node that runs its conversation.
    pub async fn answer(
        &self,
        id: Uuid,
        who: &Answerer<'_>,
        answer: Answer,
    ) -> Result<PermissionRequest> {
        let missing = || match who.kind {
            Some(WaitingKind::Question) => Error::NotFound(format!("no question {id}")),
            _ => Error::NotFound(format!("no permission request {id}")),
        };
        let held = {
            let waiting = self.inner.setup.waiting.lock().unwrap();
            let held = waiting.get(&id);
            held.map(|w| (w.request.conversation_id, w.owner.clone(), w.request.kind))
        };
        let mut asked_here = false;
        if let Some((conversation_id, owner, kind)) = held {
            if !who.answers(kind) {
                return Err(missing());
            }
            who.may_answer(self.store(), conversation_id, owner.as_deref(), missing)
                .await?;
            if let Some(answered) = self.answer_here(conversation_id, id, who, &answer).await {
                return answered;
            }
            asked_here = true;
        }
        // Answered or withdrawn meanwhile, not held here, or its session
        // ending: the stored request tells.
        let request = self.store().get_permission(id).await?.ok_or_else(missing)?;
        if !who.answers(request.kind) {
            return Err(missing());
        }
        if who.caller.is_some() {
            let conversation = self.store().get_conversation(request.conversation_id);
            let owner = conversation.await?.ok_or_else(missing)?.owner;
            who.may_answer(
                self.store(),
                request.conversation_id,
                owner.as_deref(),
                missing,
            )
            .await?;
        }
        if request.status != PermissionStatus::Pending {
            return answer_without_agent(request, &answer);
        }
        let conversation_id = request.conversation_id;
        if !asked_here && self.live(conversation_id).is_some() {
            // Claimed here to be resolved just as the index was read: the
            // session answers once that is done, and what it stored then
            // is read again if it no longer holds the request.
            if let Some(answered) = self.answer_here(conversation_id, id, who, &answer).await {
                return answered;
            }
            let request = self.store().get_permission(id).await?.ok_or_else(missing)?;
            return answer_without_agent(request, &answer);
        }
        if let Some(node) = self.runs_elsewhere(conversation_id).await? {
            let remote = Command::Respond {
                request: id,
                answer: answer.clone(),
                decided_by: who.decided_by.clone(),
                via: who.via.clone(),
                reason: who.reason.clone(),
                steer: who.steer,
                reply: Default::default(),
            };
            if let Some(answered) = self.forward(conversation_id, node, &remote).await? {
                return answered;
            }
        }
        // Left pending by a remote agent whose connection was lost: it may
        // ask again once it is back.
        if self.remote_agent_of(conversation_id).await {
            validate_answer(&request, &answer)?;
            return Err(agent_away());
        }
        answer_without_agent(request, &answer)
    }

    /// Whether the conversation's agent is a remote one (its profile has a
    /// `url`).
    async fn remote_agent_of(&self, conversation_id: Uuid) -> bool {
        let Ok(conversation) = self.stored(conversation_id).await else {
            return false;
        };
        let profile = self.inner.profiles.get(&conversation.agent);
        profile.is_some_and(|p| p.url.is_some())
    }

    /// Has the live session of `conversation_id` on this node answer `id`;
    /// `None` when it holds no such request (any more), or has ended.
    async fn answer_here(
        &self,
        conversation_id: Uuid,
        id: Uuid,
        who: &Answerer<'_>,
        answer: &Answer,
    ) -> Option<Result<PermissionRequest>> {
        let session = self.live(conversation_id)?;
        let asked = session.answer(id, answer.clone(), who.decided_by.clone(), who.note());
        asked.await?.transpose()
    }
}
