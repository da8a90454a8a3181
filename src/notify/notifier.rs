//! The notifier: one task that follows the bus's global channel and who is
//! present, feeds the [`rules`](super::rules), and hands each notification
//! they find due to the outbox ([`Enqueue`]) with a complete body.
//!
//! One timer for everything: the task sleeps until the rules' next
//! deadline (or the next fact), never one sleep per request.
//!
//! Each node notifies for the conversations whose events it commits itself
//! (events relayed from other nodes are skipped: their own node notifies);
//! presence is counted on this node. On start (and after falling behind on
//! the bus) it reads the store's pending requests of its own conversations,
//! so that anything past its grace and not yet notified is notified: the
//! outbox's keys stop duplicates.
//!
//! The store failing is never the end of something due: an event whose
//! conversation could not be read waits, with the events of that
//! conversation after it, until the store answers (during an outage the
//! journal publishes events before it can commit them, so nothing else
//! would bring them back); a catch-up that failed is tried again; a
//! notification that could not be handed over is tried again.

use std::collections::HashMap;
use std::sync::Arc;

use chrono::Utc;
use serde_json::Value;
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::presence::{Presence, PresenceChange};
use super::rules::{Due, Fact, Rules, Settings};
use super::{
    Action, ConversationRef, Enqueue, Notification, NotificationEvent, Outgoing, RequestRef,
    TurnRef,
};
use crate::bus::EventBus;
use crate::cluster::Node;
use crate::config::Config;
use crate::error::Result;
use crate::model::{
    event_type, AgentState, AgentStatus, Conversation, Event, EventBody, MessageRole,
    PermissionRequest, QueueHeld, TurnEnded, TurnStarted, WaitingKind,
};
use crate::store::{PermissionFilter, Store};

/// How often expired action tokens are deleted.
const SWEEP: std::time::Duration = std::time::Duration::from_secs(3600);
/// How soon what met a store error (a notification not handed over, an
/// event whose conversation could not be read, a catch-up) is tried again.
const RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// Mints the action URLs of a request's options for a user (see
/// `crate::api::actions`); none without `base_url`.
#[async_trait::async_trait]
pub trait MintActions: Send + Sync {
    async fn mint(&self, request: &PermissionRequest, user: &str) -> Result<Vec<Action>>;
}

/// What the notifier needs, passed in.
pub struct Notifier {
    pub config: Config,
    pub store: Arc<dyn Store>,
    pub bus: EventBus,
    pub node: Node,
    pub presence: Presence,
    pub enqueue: Arc<dyn Enqueue>,
    pub actions: Option<Arc<dyn MintActions>>,
}

/// What the notifier remembers of a conversation.
struct Known {
    conversation: Conversation,
    last_turn: Option<Uuid>,
    /// Its members who answer its requests (approvers, collaborators):
    /// each is notified of them as its owner is (kept up to date by the
    /// `member_*` events).
    answering: Vec<String>,
}

struct State {
    rules: Rules,
    conversations: HashMap<Uuid, Known>,
    requests: HashMap<Uuid, PermissionRequest>,
    /// Per conversation, the events that wait for the store to answer
    /// about it (their owner with them), in order: the first needed the
    /// conversation and could not read it; the others came after.
    deferred: HashMap<Uuid, Vec<(Event, String)>>,
    /// A catch-up failed: it is tried again.
    catch_up_again: bool,
}

impl Notifier {
    /// Runs until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        // Subscribed before reading the store: nothing falls between them.
        let mut events = self.bus.subscribe_all();
        let mut presence = self.presence.watch();
        let n = &self.config.notifications;
        let mut state = State {
            rules: Rules::new(Settings {
                grace: n.grace,
                reminder_before: n.reminder_before,
                min_turn: n.min_turn,
            }),
            conversations: HashMap::new(),
            requests: HashMap::new(),
            deferred: HashMap::new(),
            catch_up_again: false,
        };
        self.catch_up(&mut state).await;
        // What could not be handed over (the database away): tried again.
        let mut unsent: Vec<Due> = Vec::new();
        // When what met a store error is tried again (an instant, so that a
        // stream of events does not put it off).
        let mut retry_at: Option<tokio::time::Instant> = None;
        let mut sweep = tokio::time::interval(SWEEP);
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            let mut sleep = state.rules.next_deadline().map(|at| {
                (at - Utc::now())
                    .to_std()
                    .unwrap_or(std::time::Duration::ZERO)
            });
            if let Some(at) = retry_at {
                let wait = at.saturating_duration_since(tokio::time::Instant::now());
                sleep = Some(sleep.map_or(wait, |s| s.min(wait)));
            }
            let mut due = tokio::select! {
                _ = shutdown.cancelled() => return,
                received = events.recv() => match received {
                    Ok(published) if published.relayed => continue,
                    Ok(published) => match parse(&published.json) {
                        Some(event) => self.event(&mut state, event, published.owner.as_deref()).await,
                        None => continue,
                    },
                    Err(RecvError::Lagged(_)) => {
                        self.catch_up(&mut state).await;
                        Vec::new()
                    }
                    Err(RecvError::Closed) => return,
                },
                change = presence.recv() => match change {
                    Some(PresenceChange { user, present }) => {
                        state.rules.observe(Fact::Presence { user, present }, Utc::now())
                    }
                    None => return,
                },
                _ = sleep_for(sleep) => {
                    let mut due = state.rules.due(Utc::now());
                    if retry_at.is_some_and(|at| at <= tokio::time::Instant::now()) {
                        retry_at = None;
                        due.extend(self.try_again(&mut state).await);
                    }
                    due
                }
                _ = sweep.tick() => {
                    self.sweep_action_tokens().await;
                    Vec::new()
                }
            };
            due.append(&mut unsent);
            for due in due {
                if let Err(e) = self.hand_over(&mut state, due.clone()).await {
                    tracing::warn!(error = %e, "a due notification could not be enqueued; trying again");
                    unsent.push(due);
                }
            }
            let waiting = !unsent.is_empty() || !state.deferred.is_empty() || state.catch_up_again;
            if !waiting {
                retry_at = None;
            } else if retry_at.is_none() {
                retry_at = Some(tokio::time::Instant::now() + RETRY);
            }
        }
    }

    /// Tries again what met a store error: a catch-up, then each
    /// conversation's deferred events, in order, once the conversation can
    /// be read. What becomes due.
    async fn try_again(&self, state: &mut State) -> Vec<Due> {
        if state.catch_up_again {
            self.catch_up(state).await;
        }
        let mut due = Vec::new();
        let waiting: Vec<Uuid> = state.deferred.keys().copied().collect();
        for conversation in waiting {
            if let Err(e) = self.known(state, conversation).await {
                tracing::debug!(error = %e, "the store still fails; trying again later");
                break;
            }
            let events = state.deferred.remove(&conversation).unwrap_or_default();
            tracing::info!(conversation_id = %conversation, events = events.len(),
                "the store answers again: taking in what waited for it");
            for (event, user) in events {
                due.extend(self.event(state, event, Some(&user)).await);
            }
        }
        due
    }

    /// Deletes expired action tokens (they would answer 410 anyway).
    async fn sweep_action_tokens(&self) {
        if self.actions.is_none() {
            return;
        }
        match self.store.delete_expired_action_tokens(Utc::now()).await {
            Ok(0) => {}
            Ok(n) => tracing::debug!(deleted = n, "expired action tokens deleted"),
            Err(e) => tracing::warn!(error = %e, "could not delete expired action tokens"),
        }
    }

    /// Takes in the store's pending requests of this node's conversations
    /// (and forgets those no longer pending).
    async fn catch_up(&self, state: &mut State) {
        state.catch_up_again = false;
        let pending = match self
            .store
            .list_permissions(&PermissionFilter {
                pending_only: true,
                conversation_id: None,
                owner: None,
                kind: None,
            })
            .await
        {
            Ok(pending) => pending,
            Err(e) => {
                tracing::warn!(error = %e, "could not read the pending requests to notify; trying again");
                state.catch_up_again = true;
                return;
            }
        };
        // Those answered while this task was not following (fallen behind).
        let still: std::collections::HashSet<Uuid> = pending.iter().map(|r| r.id).collect();
        let gone: Vec<Uuid> = state
            .requests
            .keys()
            .filter(|id| !still.contains(id))
            .copied()
            .collect();
        for request in gone {
            state.requests.remove(&request);
            state.rules.observe(Fact::Answered { request }, Utc::now());
        }
        // Each conversation read again, once: which node runs it, and who
        // answers there, may have changed since it was remembered.
        let mut read = std::collections::HashSet::new();
        for request in pending {
            let id = request.conversation_id;
            if read.insert(id) {
                if let Err(e) = self.read(state, id).await {
                    tracing::warn!(error = %e, "could not read a conversation to notify about; trying again");
                    state.catch_up_again = true;
                    read.remove(&id);
                    continue;
                }
            }
            let Some(known) = state.conversations.get(&id) else {
                continue;
            };
            let own = !self.node.is_shared() || known.conversation.node_id == Some(self.node.id());
            if own {
                self.asked(state, request);
            }
        }
    }

    /// The conversation, read once (`None`: there is no such conversation;
    /// an error: the store failed, and nothing is remembered).
    async fn known<'a>(&self, state: &'a mut State, id: Uuid) -> Result<Option<&'a Known>> {
        if !state.conversations.contains_key(&id) {
            self.read(state, id).await?;
        }
        Ok(state.conversations.get(&id))
    }

    /// The conversation and its answering members read again (what was
    /// remembered of it may be stale: it ran on another node meanwhile,
    /// whose membership changes this node does not follow). When the store
    /// fails, what was remembered is kept and the error returned.
    async fn read(&self, state: &mut State, id: Uuid) -> Result<()> {
        let Some(conversation) = self.store.get_conversation(id).await? else {
            state.conversations.remove(&id);
            return Ok(());
        };
        let answering = self
            .store
            .list_members(id)
            .await?
            .into_iter()
            .filter(|m| m.role.answers())
            .map(|m| m.user)
            .collect();
        let last_turn = state.conversations.get(&id).and_then(|k| k.last_turn);
        state.conversations.insert(
            id,
            Known {
                conversation,
                last_turn,
                answering,
            },
        );
        Ok(())
    }

    fn asked(&self, state: &mut State, request: PermissionRequest) {
        let Some(known) = state.conversations.get(&request.conversation_id) else {
            return;
        };
        let Some(owner) = known.conversation.owner.clone() else {
            return;
        };
        let timeout_at = self
            .config
            .agent(&known.conversation.agent)
            .and_then(|p| p.permission_timeout)
            .and_then(|t| chrono::Duration::from_std(t).ok())
            .map(|t| request.created_at + t);
        // Due to its owner and to each member who answers there.
        let users = std::iter::once(owner).chain(known.answering.iter().cloned());
        for user in users.collect::<Vec<_>>() {
            let fact = Fact::Asked {
                request: request.id,
                conversation: request.conversation_id,
                user,
                at: request.created_at,
                timeout_at,
            };
            state.rules.observe(fact, Utc::now());
        }
        state.requests.insert(request.id, request);
    }

    /// An event this node committed.
    async fn event(&self, state: &mut State, event: Event, owner: Option<&str>) -> Vec<Due> {
        let Some(user) = owner.map(str::to_owned) else {
            return Vec::new();
        };
        let conversation = event.conversation_id;
        // After an event that waits for the store, in order behind it (an
        // answer must not come before its request).
        if let Some(waiting) = state.deferred.get_mut(&conversation) {
            // Only what the rules look at: an outage's streaming is not
            // kept a second time here.
            if concerns_the_rules(&event.body) {
                waiting.push((event, user));
            }
            return Vec::new();
        }
        // Read again at each of these: this node runs the conversation now,
        // and may not have while its members changed. Should the store fail,
        // what is remembered of it serves; else the event waits for it.
        if needs_conversation(&event.body) {
            if let Err(e) = self.read(state, conversation).await {
                if !state.conversations.contains_key(&conversation) {
                    tracing::warn!(conversation_id = %conversation, error = %e,
                        "could not read a conversation to notify about; trying again");
                    state.deferred.insert(conversation, vec![(event, user)]);
                    return Vec::new();
                }
                tracing::debug!(conversation_id = %conversation, error = %e,
                    "could not read a conversation again; notifying with what is remembered");
            }
        }
        let (seq, at) = (event.seq, event.at);
        let now = Utc::now();
        // A stand-in for an event the database refused counts for what it
        // still says (see `EventBody::lenient`).
        let body = match event.body.lenient() {
            // A stand-in answer keeps the request's id: that is all the rules
            // need to forget it (else it would be notified as waiting).
            EventBody::Verbatim { kind, data } if kind == event_type::PERMISSION_RESOLVED => {
                let Some(request) = data
                    .get("id")
                    .and_then(Value::as_str)
                    .and_then(|t| Uuid::parse_str(t).ok())
                else {
                    return Vec::new();
                };
                state.requests.remove(&request);
                return state.rules.observe(Fact::Answered { request }, now);
            }
            EventBody::Verbatim { kind, data } => match stand_in_turn(&kind, &data) {
                Some(body) => body,
                None => return Vec::new(),
            },
            body => body,
        };
        // A question waits, and is notified, as a permission request does.
        let body = match body {
            EventBody::QuestionAsked(q) => EventBody::PermissionRequested(q.into()),
            EventBody::QuestionResolved(q) => EventBody::PermissionResolved(q.into()),
            body => body,
        };
        match body {
            EventBody::PermissionRequested(request) => {
                // Read above (absent: the conversation is gone).
                if state.conversations.contains_key(&conversation) {
                    self.asked(state, request);
                }
                Vec::new()
            }
            EventBody::MemberAdded(change) | EventBody::MemberChanged(change) => {
                let answers = change.role.answers();
                self.member_changed(state, conversation, change.user, answers);
                Vec::new()
            }
            EventBody::MemberRemoved(change) => {
                self.member_changed(state, conversation, change.user, false);
                Vec::new()
            }
            EventBody::PermissionResolved(request) => {
                state.requests.remove(&request.id);
                state.rules.observe(
                    Fact::Answered {
                        request: request.id,
                    },
                    now,
                )
            }
            EventBody::TurnStarted(TurnStarted { turn_id: turn, .. }) => {
                if let Some(known) = state.conversations.get_mut(&conversation) {
                    known.last_turn = Some(turn);
                }
                state.rules.observe(
                    Fact::TurnStarted {
                        conversation,
                        turn,
                        at,
                    },
                    now,
                )
            }
            EventBody::QueueHeld(QueueHeld {
                turn_id: turn,
                stop_reason,
                queued,
                ..
            }) => state.rules.observe(
                Fact::QueueHeld {
                    conversation,
                    user,
                    turn,
                    stop_reason,
                    queued,
                },
                now,
            ),
            EventBody::TurnEnded(TurnEnded {
                turn_id: turn,
                stop_reason,
                ..
            }) => state.rules.observe(
                Fact::TurnEnded {
                    conversation,
                    user,
                    turn,
                    at,
                    stop_reason,
                },
                now,
            ),
            EventBody::BudgetWarning(notice) => {
                self.budget(state, (conversation, seq), user, false, notice)
                    .await
            }
            EventBody::BudgetExceeded(notice) => {
                self.budget(state, (conversation, seq), user, true, notice)
                    .await
            }
            EventBody::AgentStatus(AgentStatus {
                status: AgentState::Failed,

                detail,
                ..
            }) => {
                let turn = state
                    .conversations
                    .get_mut(&conversation)
                    .and_then(|k| k.last_turn.take());
                state.rules.observe(
                    Fact::AgentFailed {
                        conversation,
                        seq,
                        user,
                        turn,
                        detail,
                    },
                    now,
                )
            }
            _ => Vec::new(),
        }
    }

    /// A budget 80 % or all spent (`exceeded`), as the event `at` (its
    /// conversation and seq) says: told to the owner and the operators.
    async fn budget(
        &self,
        state: &mut State,
        (conversation, seq): (Uuid, i64),
        owner: String,
        exceeded: bool,
        notice: crate::model::BudgetNotice,
    ) -> Vec<Due> {
        let mut users = vec![owner];
        match self.store.operators().await {
            Ok(operators) => users.extend(operators),
            Err(e) => {
                tracing::warn!(error = %e, "could not read the operators to tell of a budget")
            }
        }
        users.sort();
        users.dedup();
        state.rules.observe(
            Fact::Budget {
                conversation,
                seq,
                users,
                exceeded,
                notice,
            },
            Utc::now(),
        )
    }

    /// `user` answers in the conversation now (`answers`), or no longer:
    /// the requests waiting there are due to them from now on, or nothing
    /// more of it is.
    fn member_changed(&self, state: &mut State, conversation: Uuid, user: String, answers: bool) {
        if !answers {
            if let Some(known) = state.conversations.get_mut(&conversation) {
                known.answering.retain(|u| *u != user);
            }
            state
                .rules
                .observe(Fact::Left { conversation, user }, Utc::now());
            return;
        }
        // Read when a request of it is asked, with its members then.
        let Some(known) = state.conversations.get_mut(&conversation) else {
            return;
        };
        known.answering.retain(|u| *u != user);
        known.answering.push(user.clone());
        let waiting: Vec<PermissionRequest> = state
            .requests
            .values()
            .filter(|r| r.conversation_id == conversation)
            .cloned()
            .collect();
        let timeout = self
            .config
            .agent(&known.conversation.agent)
            .and_then(|p| p.permission_timeout)
            .and_then(|t| chrono::Duration::from_std(t).ok());
        for request in waiting {
            let fact = Fact::Asked {
                request: request.id,
                conversation,
                user: user.clone(),
                at: request.created_at,
                timeout_at: timeout.map(|t| request.created_at + t),
            };
            state.rules.observe(fact, Utc::now());
        }
    }

    /// Builds the notification's body and enqueues it.
    async fn hand_over(&self, state: &mut State, mut due: Due) -> Result<()> {
        // Tried again later: requests answered meanwhile are left out.
        match &mut due {
            Due::Waiting { requests, .. } => {
                requests.retain(|r| state.requests.contains_key(r));
                if requests.is_empty() {
                    return Ok(());
                }
            }
            Due::Reminder { request, .. } if !state.requests.contains_key(request) => {
                return Ok(());
            }
            _ => {}
        }
        let user = due.user().to_owned();
        // A removed user's conversations go on; nothing of them reaches
        // the user any more, and no action URL is minted for them.
        if self.store.user_removed(&user).await? {
            tracing::debug!(user = %user, "not notified: the user was removed");
            return Ok(());
        }
        let keys = due.keys();
        let (event, conversation_id, request, turn, count) = match &due {
            Due::Waiting { requests, .. } => {
                let first = state.requests.get(&requests[0]);
                (
                    NotificationEvent::PermissionWaiting,
                    first.map(|r| r.conversation_id),
                    first.cloned(),
                    None,
                    requests.len() as u32,
                )
            }
            Due::Reminder { request, .. } => {
                let request = state.requests.get(request);
                (
                    NotificationEvent::PermissionReminder,
                    request.map(|r| r.conversation_id),
                    request.cloned(),
                    None,
                    1,
                )
            }
            Due::TurnEnded {
                conversation,
                turn,
                stop_reason,
                ..
            } => {
                let summary = self.summary(*conversation, *turn).await;
                (
                    NotificationEvent::TurnEnded,
                    Some(*conversation),
                    None,
                    Some(TurnRef {
                        id: *turn,
                        stop_reason: Some(stop_reason.clone()),
                        summary,
                    }),
                    0,
                )
            }
            Due::QueueHeld {
                conversation,
                turn,
                stop_reason,
                queued,
                ..
            } => (
                NotificationEvent::QueueHeld,
                Some(*conversation),
                None,
                Some(TurnRef {
                    id: *turn,
                    stop_reason: Some(stop_reason.clone()),
                    summary: Some(match queued {
                        1 => "1 queued prompt waits".to_owned(),
                        n => format!("{n} queued prompts wait"),
                    }),
                }),
                *queued,
            ),
            Due::Budget {
                conversation,
                exceeded,
                ..
            } => (
                if *exceeded {
                    NotificationEvent::BudgetExceeded
                } else {
                    NotificationEvent::BudgetWarning
                },
                Some(*conversation),
                None,
                None,
                0,
            ),
            Due::AgentFailed {
                conversation,
                turn,
                detail,
                ..
            } => (
                NotificationEvent::AgentFailed,
                Some(*conversation),
                None,
                turn.map(|id| TurnRef {
                    id,
                    stop_reason: Some("error".into()),
                    summary: detail.clone(),
                }),
                0,
            ),
        };
        let conversation = match conversation_id {
            Some(id) => self.known(state, id).await?.map(|k| ConversationRef {
                id,
                title: k.conversation.title.clone(),
                agent: k.conversation.agent.clone(),
            }),
            None => None,
        };
        let actions = match (&request, &self.actions) {
            (Some(request), Some(minter)) => minter.mint(request, &user).await?,
            _ => Vec::new(),
        };
        let mut body = Notification {
            event,
            delivery_id: Uuid::nil(),
            at: Utc::now(),
            user,
            conversation,
            request: request.as_ref().map(request_ref),
            turn,
            count,
            actions,
            budget: match &due {
                Due::Budget { notice, .. } => Some(notice.standing.clone()),
                _ => None,
            },
        };
        // What the agent wrote, of any length, cut to its bounds.
        super::fit::bound(&mut body);
        let outgoing = Outgoing {
            keys,
            collapse_key: conversation_id.map(|id| id.to_string()),
            body,
        };
        let (event, count) = (outgoing.body.event, outgoing.body.count);
        let fresh = self.enqueue.enqueue(outgoing).await?;
        tracing::debug!(
            conversation_id = ?conversation_id,
            event = event.as_str(),
            count,
            fresh,
            "notification handed to the outbox"
        );
        Ok(())
    }

    /// The start of the agent's last message of the turn.
    async fn summary(&self, conversation: Uuid, turn: Uuid) -> Option<String> {
        let messages = self.store.list_messages(conversation).await.ok()?;
        let last = messages
            .iter()
            .rev()
            .find(|m| m.role == MessageRole::Agent && m.turn_id == Some(turn))?;
        let mut text: String = last
            .content
            .iter()
            .filter_map(|b| b.get("text").and_then(Value::as_str))
            .collect();
        super::fit::shorten(&mut text, super::fit::SUMMARY_CHARS);
        Some(text)
    }
}

/// What a notification says of a request: from its tool call.
pub fn request_ref(request: &PermissionRequest) -> RequestRef {
    let call = &request.tool_call;
    let text = |k: &str| call.get(k).and_then(Value::as_str).map(str::to_owned);
    let command = call
        .get("rawInput")
        .and_then(|input| input.get("command"))
        .and_then(|c| match c {
            Value::String(s) => Some(s.clone()),
            Value::Array(parts) => Some(
                parts
                    .iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join(" "),
            ),
            _ => None,
        });
    if request.kind == WaitingKind::Question {
        // What the agent asks, as the title; its kind says it is a question.
        return RequestRef {
            id: request.id,
            title: text("message"),
            kind: Some("question".into()),
            command: None,
        };
    }
    RequestRef {
        id: request.id,
        title: text("title"),
        kind: text("kind"),
        command,
    }
}

/// The events the rules care about, parsed; others (streamed chunks, of
/// any size) are only scanned for their type.
fn parse(json: &str) -> Option<Event> {
    #[derive(serde::Deserialize)]
    struct Head<'a> {
        #[serde(rename = "type", borrow)]
        kind: std::borrow::Cow<'a, str>,
    }
    let head: Head = serde_json::from_str(json).ok()?;
    rules_look_at(&head.kind)
        .then(|| serde_json::from_str(json).ok())
        .flatten()
}

/// Whether the rules look at an event of this kind at all (chunks, mode
/// changes and terminal output they do not).
fn concerns_the_rules(body: &EventBody) -> bool {
    rules_look_at(body.kind())
}

fn rules_look_at(kind: &str) -> bool {
    matches!(
        kind,
        event_type::PERMISSION_REQUESTED
            | event_type::PERMISSION_RESOLVED
            | event_type::TURN_STARTED
            | event_type::TURN_ENDED
            | event_type::AGENT_STATUS
            | event_type::QUEUE_HELD
            | event_type::QUESTION_ASKED
            | event_type::QUESTION_RESOLVED
            | event_type::BUDGET_WARNING
            | event_type::BUDGET_EXCEEDED
            | event_type::MEMBER_ADDED
            | event_type::MEMBER_CHANGED
            | event_type::MEMBER_REMOVED
    )
}

/// Whether handling an event of this kind reads its conversation (a
/// request, or a turn's start, stand-in or not).
fn needs_conversation(body: &EventBody) -> bool {
    matches!(
        body.kind(),
        event_type::PERMISSION_REQUESTED | event_type::QUESTION_ASKED | event_type::TURN_STARTED
    )
}

/// The turn a stand-in `turn_started` or `turn_ended` still names (with
/// its `stop_reason`, else none), as such an event; `None` for others.
fn stand_in_turn(kind: &str, data: &Value) -> Option<EventBody> {
    let turn_id = data
        .get("turn_id")
        .and_then(Value::as_str)
        .and_then(|t| Uuid::parse_str(t).ok())?;
    match kind {
        event_type::TURN_STARTED => Some(EventBody::TurnStarted(TurnStarted {
            turn_id,
            content: Vec::new(),
            by: None,
        })),
        event_type::TURN_ENDED => Some(EventBody::TurnEnded(TurnEnded {
            turn_id,
            stop_reason: data
                .get("stop_reason")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            error: None,
        })),
        _ => None,
    }
}

async fn sleep_for(duration: Option<std::time::Duration>) {
    match duration {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}
