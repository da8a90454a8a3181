//! The agent's permission requests: judged by the operator's policies and
//! the remembered rules, else parked for a person; answered by a person, a
//! timeout or the end of the session, or withdrawn by the agent. An answer
//! is persisted first, then the agent hears it.
//!
//! Its part of the task is [`Requests`](super::parts::Requests).

use std::time::Duration;

use serde_json::Value;
use uuid::Uuid;

use super::Task;
use crate::acp::client::Opened;
use crate::acp::rpc::{IncomingRequest, INVALID_PARAMS};
use crate::error::{Error, Result};
use crate::model::{self, Answer, Decision, PermissionRequest, PermissionStatus, WaitingKind};
use crate::permissions::policy::{self, Facts};
use crate::permissions::question;
use crate::permissions::{agent_away, answer_resolved, Judged};
use crate::session::command::AnswerNote;
use crate::session::pending::Parked;
use crate::store::{PermissionFilter, Resolution};

/// What became of a request a session was to resolve.
pub(super) enum Resolved {
    /// It was not waiting in this session (answered or withdrawn meanwhile).
    NotHeld,
    /// Resolved as asked: the request as stored.
    Ours(PermissionRequest),
    /// The store had it resolved already (it is the arbiter): the request
    /// as it is, if it still exists.
    Already(Option<PermissionRequest>),
}

/// How often an ending tries again to record an answer while the database
/// is away.
const SETTLE_RETRY: Duration = Duration::from_millis(200);
/// How long a remote agent back after a lost connection has to ask again
/// what it asked before (see [`Task::take_up_held`]).
const ASK_AGAIN_WITHIN: Duration = Duration::from_secs(10);

impl Task {
    pub(super) async fn on_permission_request(&mut self, request: IncomingRequest) -> Result<()> {
        let params = &request.params;
        let tool_call = params.get("toolCall").filter(|v| v.is_object()).cloned();
        let options = params.get("options").and_then(Value::as_array).cloned();
        let (Some(tool_call), Some(options)) = (tool_call, options) else {
            request.responder.respond_error(
                INVALID_PARAMS,
                "session/request_permission needs toolCall (object) and options (array)",
                None,
            );
            return Ok(());
        };
        let turn_id = self.turns.id();
        // The request's toolCall is an update of a call the agent may have
        // announced before (Mistral Vibe sends only its id): what it says
        // goes into the call's record, and the request is stored, shown and
        // judged with the whole call, so a person approves what the policies
        // judged.
        self.transcript.apply_tool_call_update(&tool_call, turn_id);
        let tool_call = self.transcript.known_tool_call(&tool_call);
        // A remote agent back after a lost connection asks again what it
        // asked before: the request people see already, answerable now.
        let call_id = tool_call.get("toolCallId").and_then(Value::as_str);
        let asks = |r: &PermissionRequest| {
            r.kind == WaitingKind::Permission
                && r.tool_call.get("toolCallId").and_then(Value::as_str) == call_id
        };
        let again = call_id.and_then(|_| self.requests.pending.asked_again(asks));
        if let Some(held) = again {
            tracing::info!(permission_id = %held.id, "the remote agent asks again since it is back");
            self.requests.pending.park_restored(held, request.responder);
            self.keep_rpc_ids();
            self.journal.set_status(self.status_now());
            return Ok(());
        }
        let permission = PermissionRequest {
            id: model::new_id(),
            conversation_id: self.journal.conversation_id(),
            turn_id,
            tool_call,
            options,
            status: PermissionStatus::Pending,
            decision: None,
            created_at: model::now(),
            kind: Default::default(),
        };
        tracing::info!(permission_id = %permission.id, "agent asks permission");
        if self.crossed_the_cancel() {
            // It crossed the turn's cancel: answered as the requests waiting
            // when the cancel was sent were (the ACP cancel rule), neither
            // by a person nor by a policy.
            return self.cancelled_at_once(request, permission).await;
        }
        // With the database away: the policies as last seen, no remembered
        // answers (a person is asked rather than anything assumed).
        let policies = match self.requests.policies.refresh(self.journal.store()).await {
            Err(e) if e.is_outage() => self.requests.policies.current(),
            other => other?,
        };
        let remembered = match self
            .journal
            .store()
            .list_rules(permission.conversation_id)
            .await
        {
            Err(e) if e.is_outage() => Vec::new(),
            other => other?,
        };
        // Its paths as they really are too: a symlink hides nothing from a
        // deny (the agent reaches them itself; this is as of now).
        let given = policy::tool_paths(&permission.tool_call, &self.requests.cwd);
        let real_paths = self.served.real_paths(given).await;
        let facts = Facts {
            agent: &self.requests.profile_name,
            tool_call: &permission.tool_call,
            cwd: &self.requests.cwd,
            mode: self.requests.mode,
            real_paths: &real_paths,
        };
        match self
            .requests
            .pending
            .decide(&permission, &policies, &facts, &remembered)
        {
            Some((status, decision)) => {
                self.answer_at_once(request, permission, status, decision)
                    .await?;
            }
            None => {
                self.journal.add_permission_request(&permission, None);
                self.requests.pending.park(permission, request.responder);
                // Answered on this id after a restart too.
                self.keep_rpc_ids();
                self.journal.set_status(self.status_now());
            }
        }
        Ok(())
    }

    /// The agent asks a person a question (`elicitation/create`): held
    /// like a permission request (same timeout, cancel rule and answers'
    /// road), never answered by a policy. A form whose schema is not of
    /// ACP's restricted subset, or a mode this gateway does not know, is
    /// refused.
    pub(super) async fn on_question(&mut self, request: IncomingRequest) -> Result<()> {
        let mut params = request.params.clone();
        let refused = match params.get("mode").and_then(Value::as_str) {
            _ if !params.get("message").is_some_and(Value::is_string) => {
                Some("elicitation/create needs a message (string)".to_owned())
            }
            Some("form") => params
                .get("requestedSchema")
                .map_or(Err("a form needs a requestedSchema".to_owned()), |s| {
                    question::check_schema(s)
                })
                .err(),
            Some("url") => {
                let url = params.get("url").and_then(Value::as_str);
                let id = params.get("elicitationId").and_then(Value::as_str);
                match (url.map(url::Url::parse), id) {
                    (Some(Ok(u)), Some(_)) if matches!(u.scheme(), "https" | "http") => None,
                    _ => {
                        Some("a URL question needs an http(s) url and an elicitationId".to_owned())
                    }
                }
            }
            other => Some(format!(
                "elicitation mode {other:?} is not supported (form or url)"
            )),
        };
        if let Some(why) = refused {
            request.responder.respond_error(INVALID_PARAMS, &why, None);
            return Ok(());
        }
        if let Some(params) = params.as_object_mut() {
            params.remove("sessionId");
            params.remove("_meta");
        }
        // A remote agent back after a lost connection asks again what it
        // asked before: the question people see already (the same URL
        // interaction, or the same form), answerable now.
        let asks =
            |q: &PermissionRequest| q.kind == WaitingKind::Question && same_question(q, &params);
        if let Some(held) = self.requests.pending.asked_again(asks) {
            tracing::info!(question_id = %held.id, "the remote agent asks again since it is back");
            self.requests.pending.park_restored(held, request.responder);
            self.keep_rpc_ids();
            self.journal.set_status(self.status_now());
            return Ok(());
        }
        let question = PermissionRequest {
            id: model::new_id(),
            conversation_id: self.journal.conversation_id(),
            turn_id: self.turns.id(),
            tool_call: params,
            options: Vec::new(),
            status: PermissionStatus::Pending,
            decision: None,
            created_at: model::now(),
            kind: WaitingKind::Question,
        };
        tracing::info!(question_id = %question.id, "agent asks a question");
        if self.crossed_the_cancel() {
            return self.cancelled_at_once(request, question).await;
        }
        self.journal.add_permission_request(&question, None);
        self.requests.pending.park(question, request.responder);
        self.keep_rpc_ids();
        self.journal.set_status(self.status_now());
        Ok(())
    }

    /// The agent says a URL question's interaction is complete: one still
    /// waiting is answered `accept` (the person did what it asked, where
    /// the URL led); one answered already stays as it is.
    pub(super) async fn on_question_complete(&mut self, params: Value) -> Result<()> {
        let Some(elicitation) = params.get("elicitationId").and_then(Value::as_str) else {
            return Ok(());
        };
        let waiting = self.requests.pending.ids().into_iter().find(|id| {
            self.requests.pending.get(*id).is_some_and(|q| {
                q.kind == WaitingKind::Question
                    && q.tool_call.get("elicitationId").and_then(Value::as_str) == Some(elicitation)
            })
        });
        let Some(id) = waiting else {
            tracing::debug!(elicitation, "completion of a question no longer waiting");
            return Ok(());
        };
        let answer = Answer::Reply {
            action: "accept".into(),
            content: None,
        };
        let why = "the agent says the interaction at the URL is complete";
        let decision = Decision::new(answer, "system".into(), Some(why.into()));
        self.resolve(id, PermissionStatus::Approved, decision)
            .await
            .map(drop)
    }

    /// Whether a request asked now crossed the running turn's cancel.
    fn crossed_the_cancel(&self) -> bool {
        let turn = self.turns.turn.as_ref();
        turn.is_some_and(|turn| turn.cancel_requested)
    }

    /// Answers a request that crossed the turn's cancel as the cancel rule
    /// says: cancelled, by the system.
    async fn cancelled_at_once(
        &mut self,
        request: IncomingRequest,
        asked: PermissionRequest,
    ) -> Result<()> {
        let why = Some("asked after the turn was cancelled".into());
        let decision = Decision::new(Answer::Cancelled, "system".into(), why);
        self.answer_at_once(request, asked, PermissionStatus::Cancelled, decision)
            .await
    }

    /// Answers a request as it arrives (by policy, or cancelled): requested
    /// and resolved are committed together and both published, so the
    /// audit trail shows what was decided without a person, and why.
    async fn answer_at_once(
        &mut self,
        request: IncomingRequest,
        permission: PermissionRequest,
        status: PermissionStatus,
        decision: Decision,
    ) -> Result<()> {
        let result = decision.acp_result(permission.kind);
        self.journal
            .add_permission_request(&permission, Some((status, decision)));
        // The request stays in hand until answered (see `record_write`).
        self.flush().await?;
        request.responder.respond(result);
        Ok(())
    }

    /// Answers the requests whose `permission_timeout` ran out.
    pub(super) async fn time_out(&mut self, due: Vec<Uuid>) -> Result<()> {
        let reason = self.requests.pending.timeout_reason();
        for id in due {
            if let Some(held) = self.requests.pending.take_held(id) {
                let why = format!(
                    "the remote agent came back but did not ask again within {}s, so it no \
                     longer waits for this answer",
                    ASK_AGAIN_WITHIN.as_secs()
                );
                self.expire_held(held, &why).await?;
                continue;
            }
            let Some(answer) = self.requests.pending.expire(id) else {
                continue;
            };
            let resolved = self
                .resolve(
                    id,
                    PermissionStatus::TimedOut,
                    Decision::new(answer, "system".into(), Some(reason.clone())),
                )
                .await;
            match resolved {
                Ok(_) => {}
                // Answered once the database can record it.
                Err(e) if e.is_outage() => self
                    .requests
                    .pending
                    .retry_later(id, Duration::from_secs(1)),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// The agent withdrew one of its own requests.
    pub(super) async fn on_cancel_request(&mut self, params: Value) -> Result<()> {
        let Some(request_id) = params.get("requestId") else {
            return Ok(());
        };
        if let Some(id) = self.requests.pending.find_by_rpc_id(request_id) {
            let decision = Decision::new(
                Answer::Cancelled,
                "system".into(),
                Some("withdrawn by the agent".into()),
            );
            self.resolve(id, PermissionStatus::Cancelled, decision)
                .await?;
        }
        Ok(())
    }

    /// The agent's JSON-RPC ids of the requests that wait, as the link to
    /// its shim keeps them with each commit: a gateway taking the agent up
    /// after a restart answers them on those ids. Derived from the waiting
    /// requests whenever they change; a request being resolved keeps its id
    /// until its resolution is committed, so a restart in between answers
    /// the agent again with the stored decision (see `Task::take_up`).
    pub(super) fn keep_rpc_ids(&mut self) {
        let ids = self.requests.pending.rpc_ids();
        if let Some(link) = self.journal.link_mut() {
            link.waiting = ids;
        }
    }

    /// Decides a pending request, once what is buffered before it is
    /// committed (see [`Task::resolve_claimed`]).
    pub(super) async fn resolve(
        &mut self,
        id: Uuid,
        status: PermissionStatus,
        decision: Decision,
    ) -> Result<Resolved> {
        self.flush().await?;
        let Some(parked) = self.requests.pending.claim(id) else {
            return Ok(Resolved::NotHeld);
        };
        self.resolve_claimed(parked, status, decision).await
    }

    /// Decides a request claimed from those pending, once what was buffered
    /// before it is committed: persisted first, then the agent is answered,
    /// then `permission_resolved` is published.
    async fn resolve_claimed(
        &mut self,
        parked: Parked,
        status: PermissionStatus,
        decision: Decision,
    ) -> Result<Resolved> {
        let id = parked.request.id;
        let kind = parked.request.kind;
        let result = decision.acp_result(kind);
        self.journal.set_status(self.status_now());
        let resolution = Resolution {
            request: parked.request.clone(),
            status,
            decision: decision.clone(),
        };
        match self.journal.resolve(&resolution).await {
            Ok(Some(request)) => {
                self.keep_rpc_ids();
                parked.responder.respond(result);
                Ok(Resolved::Ours(request))
            }
            Ok(None) => {
                self.keep_rpc_ids();
                // Resolved elsewhere (cannot happen while we own it, but the
                // store is the arbiter): answer the agent with what won.
                let current = self.journal.store().get_permission(id).await?;
                if let Some(d) = current.as_ref().and_then(|c| c.decision.as_ref()) {
                    parked.responder.respond(d.acp_result(kind));
                }
                Ok(Resolved::Already(current))
            }
            Err(e) => {
                // Not persisted: it is pending as before, so nothing is lost
                // (its agent's id and its deadline with it).
                self.requests.pending.put_back(parked);
                self.journal.set_status(self.status_now());
                Err(e)
            }
        }
    }

    /// Resolves every request still waiting as `status`, decided by the
    /// system for `reason`. With `patience` (an ending), a database that is
    /// away is waited for until then (each request tried again every
    /// [`SETTLE_RETRY`]), and what cannot be recorded by then stays pending
    /// for the next start to settle while the ending goes on: stopping at
    /// the first refusal left the agent killed, the session's end
    /// unrecorded and what waited in memory unwritten.
    pub(super) async fn resolve_all(
        &mut self,
        status: PermissionStatus,
        reason: &str,
        patience: Option<tokio::time::Instant>,
    ) -> Result<()> {
        for id in self.requests.pending.ids() {
            loop {
                let decision =
                    Decision::new(Answer::Cancelled, "system".into(), Some(reason.to_owned()));
                let Err(e) = self.resolve(id, status, decision).await else {
                    break;
                };
                match patience {
                    Some(until) if e.is_outage() && tokio::time::Instant::now() < until => {
                        tokio::time::sleep(SETTLE_RETRY).await;
                    }
                    Some(_) if e.is_outage() => {
                        tracing::warn!(permission_id = %id, error = %e,
                            "the database is away: the request stays pending until the next start");
                        break;
                    }
                    _ => return Err(e),
                }
            }
        }
        Ok(())
    }

    /// A user's answer to a request this session holds (`None`: it holds
    /// none with that id), checked against the options once, before it is
    /// written; what was buffered before it is committed already (see
    /// `Task::handle_command`). An "always" answer is remembered as rules.
    /// A reason the person gave is stored with the decision and told to the
    /// agent (see `Task::tell_reason`).
    pub(super) async fn answer(
        &mut self,
        id: Uuid,
        answer: Answer,
        decided_by: &str,
        note: AnswerNote,
    ) -> Result<Option<PermissionRequest>> {
        if self.requests.pending.is_held(id) {
            return Err(agent_away());
        }
        let Some(claimed) = self.requests.pending.claim_answered(id, &answer) else {
            return Ok(None);
        };
        let (parked, Judged { status, always }) = claimed?;
        // An "always" that would cover more than the user saw is not
        // remembered; the answer applies to this request, and says why.
        let not_remembered = match &always {
            Some((_, Err(why))) => Some(format!("not remembered: {why}")),
            _ => None,
        };
        let reason = match (&note.reason, not_remembered) {
            (Some(said), Some(note)) => Some(format!("{said} ({note})")),
            (said, note) => said.clone().or(note),
        };
        let decision = Decision {
            via: note.via,
            ..Decision::new(answer.clone(), decided_by.to_owned(), reason)
        };
        let request = match self.resolve_claimed(parked, status, decision).await? {
            Resolved::Ours(request) => {
                // The answer is recorded (and the reason with it) whatever
                // becomes of telling the agent.
                if let Some(said) = &note.reason {
                    let told = self.tell_reason(&request, said, decided_by, note.steer);
                    if let Err(e) = told.await {
                        tracing::warn!(permission_id = %id, error = %e, "could not queue the reason for the agent");
                    }
                }
                request
            }
            // Only an answer stored before ours is checked again: the same
            // one is a repeat, another a conflict.
            Resolved::Already(Some(request)) => answer_resolved(request, &answer)?,
            Resolved::Already(None) | Resolved::NotHeld => {
                return Err(Error::NotFound(format!("no permission request {id}")))
            }
        };
        match always {
            Some((option_kind, Ok(keys))) => {
                for key in keys {
                    let rule = model::Rule {
                        id: model::new_id(),
                        conversation_id: request.conversation_id,
                        tool_kind: key.kind,
                        subject: key.subject,
                        option_kind: option_kind.clone(),
                        permission_id: request.id,
                        created_at: model::now(),
                    };
                    let rule = self.journal.store().upsert_rule(&rule).await?;
                    tracing::info!(rule_id = %rule.id, kind = %rule.tool_kind,
                        subject = %rule.subject, "remembered {}", rule.option_kind);
                }
            }
            Some((option_kind, Err(why))) => {
                tracing::info!(permission_id = %id, %why, "{option_kind} not remembered");
            }
            None => {}
        }
        Ok(Some(request))
    }

    /// A remote agent connected again after a lost connection (`opened`
    /// says how its session came back): the requests it asked before,
    /// still pending, wait for it to ask again for [`ASK_AGAIN_WITHIN`]
    /// where it resumed or loaded its session; where it could not, it
    /// forgot them, and they expire now.
    pub(super) async fn take_up_held(&mut self, opened: Opened) -> Result<()> {
        let store = self.journal.store();
        let pending = store
            .list_permissions(&PermissionFilter {
                pending_only: true,
                conversation_id: Some(self.journal.conversation_id()),
                owner: None,
                kind: None,
            })
            .await?;
        let remembers = matches!(opened, Opened::Resumed | Opened::Loaded);
        for request in pending {
            if remembers {
                tracing::info!(permission_id = %request.id, "waiting for the remote agent to ask again");
                self.requests.pending.hold(request, ASK_AGAIN_WITHIN);
            } else {
                let why = "the remote agent came back without its earlier session, so it no \
                           longer waits for this answer";
                self.expire_held(request, why).await?;
            }
        }
        Ok(())
    }

    /// Resolves a held request `expired`: its agent will not hear an
    /// answer to it.
    async fn expire_held(&mut self, request: PermissionRequest, why: &str) -> Result<()> {
        tracing::info!(permission_id = %request.id, "{why}");
        let resolution = Resolution {
            request,
            status: PermissionStatus::Expired,
            decision: Decision::new(Answer::Cancelled, "system".into(), Some(why.into())),
        };
        self.journal.resolve(&resolution).await?;
        self.flush().await
    }
}

/// Whether a held question is the one `params` asks: the same URL
/// interaction (its `elicitationId`), or the same message and form.
fn same_question(held: &PermissionRequest, params: &Value) -> bool {
    let asked = &held.tool_call;
    match params.get("elicitationId") {
        Some(id) => asked.get("elicitationId") == Some(id),
        None => {
            asked.get("message") == params.get("message")
                && asked.get("requestedSchema") == params.get("requestedSchema")
        }
    }
}
