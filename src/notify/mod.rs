//! Notifications that reach a person: an agent waiting for an answer is
//! never left unseen.
//!
//! The parts, and the one way data flows through them:
//! - **when** (`rules`, pure; `notifier`): the session only announces facts
//!   on the bus; the notifier follows them (and who is present), and hands
//!   what the rules find due to the outbox as [`Outgoing`];
//! - **the outbox** (`outbox`): durable, in the database; one delivery per
//!   target of the user that wants the event, claimed by one node, retried
//!   with backoff, every attempt recorded;
//! - **channels** (`webhook`, `ntfy`, `web_push`, `fcm`): each turns a
//!   [`Notification`] into one HTTP request to its service and says what
//!   came of it ([`DeliveryOutcome`]); none knows about sessions;
//! - **answers** (`actions`): single-use capability URLs, one per option of
//!   a request, answered through the same path as `POST …/respond`;
//! - **fit** (`fit`, pure): what the agent wrote, cut so that every
//!   channel's payload fits what its service carries.
//!
//! This file holds only what those parts share: the body every channel
//! carries, and the hand-over from the rules to the outbox.

pub mod outbox;
pub mod actions;
pub mod fcm;
pub mod notifier;
pub mod ntfy;
pub mod webhook;
pub mod guard;
pub mod web_push;
pub mod fit;
pub mod http;
pub mod render;
pub mod rules;
pub mod presence;
pub mod vapid;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// What a notification is about (a target's `events` names these).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NotificationEvent {
    /// A permission request still pending after the grace, its owner away.
    PermissionWaiting,
    /// A request about to be answered by its profile's `permission_timeout`.
    PermissionReminder,
    /// A long turn ended while its owner was away.
    TurnEnded,
    /// The agent could not start, or died during a turn.
    AgentFailed,
    /// Prompts were queued and the turn ended other than with `end_turn`:
    /// they wait for a person.
    QueueHeld,
    /// A budget is 80 % spent (to the owner and the operators).
    BudgetWarning,
    /// A budget is spent (to the owner and the operators).
    BudgetExceeded,
    /// `POST /api/v1/notification-targets/{id}/test`.
    Test,
}

impl NotificationEvent {
    /// The events a target gets when it names none.
    pub const ALL: [NotificationEvent; 7] = [
        NotificationEvent::PermissionWaiting,
        NotificationEvent::PermissionReminder,
        NotificationEvent::TurnEnded,
        NotificationEvent::AgentFailed,
        NotificationEvent::QueueHeld,
        NotificationEvent::BudgetWarning,
        NotificationEvent::BudgetExceeded,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::PermissionWaiting => "permission_waiting",
            Self::PermissionReminder => "permission_reminder",
            Self::TurnEnded => "turn_ended",
            Self::AgentFailed => "agent_failed",
            Self::QueueHeld => "queue_held",
            Self::BudgetWarning => "budget_warning",
            Self::BudgetExceeded => "budget_exceeded",
            Self::Test => "test",
        }
    }
}

/// The one body every channel carries (JSON as is for webhooks and Web
/// Push; ntfy and FCM map it onto their own formats).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Notification {
    pub event: NotificationEvent,
    /// One per delivery to one target (retries keep it): receivers
    /// deduplicate on it. Set by the outbox.
    pub delivery_id: Uuid,
    pub at: DateTime<Utc>,
    /// The gateway user the notification is for.
    pub user: String,
    /// `None` only for a test notification.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conversation: Option<ConversationRef>,
    /// The (first) request waiting, for permission events.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request: Option<RequestRef>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub turn: Option<TurnRef>,
    /// How many requests this one notification stands for (a burst of
    /// requests that became due together makes one notification).
    pub count: u32,
    /// One per option of `request`: a single-use URL answering it.
    pub actions: Vec<Action>,
    /// The budget a `budget_warning` or `budget_exceeded` is about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<crate::model::BudgetStanding>,
}

impl Notification {
    /// What a budget notification says of its budget: what was spent of
    /// it, and when it resets.
    pub fn budget_line(&self) -> String {
        let Some(b) = &self.budget else {
            return "a budget".to_owned();
        };
        let figure = |n: f64| {
            let text = format!("{n:.2}");
            text.trim_end_matches('0').trim_end_matches('.').to_owned()
        };
        let unit = match &b.limit {
            crate::model::BudgetLimit::Cost { currency, .. } => format!(" {currency}"),
            crate::model::BudgetLimit::Turns { .. } => " turns".to_owned(),
            crate::model::BudgetLimit::Context { .. } => " tokens in context".to_owned(),
        };
        let resets = b
            .resets_at
            .map(|at| format!("; resets {}", at.format("%Y-%m-%d %H:%M UTC")))
            .unwrap_or_default();
        format!(
            "Budget {}: {} of {}{unit} spent{resets}",
            b.budget,
            figure(b.spent),
            figure(b.limit.figure())
        )
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConversationRef {
    pub id: Uuid,
    pub title: Option<String>,
    pub agent: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestRef {
    pub id: Uuid,
    pub title: Option<String>,
    pub kind: Option<String>,
    /// The command it would run; left out at `detail = "minimal"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnRef {
    pub id: Uuid,
    pub stop_reason: Option<String>,
    /// The start of the agent's last message; left out at `detail =
    /// "minimal"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
}

/// An answer one tap away: `POST url` answers the request with `option_id`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Action {
    pub label: String,
    pub option_id: String,
    pub url: String,
}

/// What the rules hand to the outbox: a notification due for `body.user`.
#[derive(Debug, Clone, PartialEq)]
pub struct Outgoing {
    /// What makes it "the same" notification: the outbox keeps each key and
    /// enqueues nothing when every key was seen before (nothing twice for
    /// the same request and event, restarts included). E.g.
    /// `permission_waiting:<request id>`, one per request of a burst.
    pub keys: Vec<String>,
    /// The same conversation's next notification replaces this one where
    /// the channel can (Web Push `Topic`, FCM collapse key).
    pub collapse_key: Option<String>,
    /// The body, complete (`detail = "full"`); `delivery_id` is set per
    /// delivery, and channels the operator does not control get it reduced
    /// to `minimal` by the outbox.
    pub body: Notification,
}

/// What came of one attempt to deliver to one target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeliveryOutcome {
    /// The service took it (2xx).
    Delivered { status: u16 },
    /// Try again later: a timeout, a refused connection, 429, 5xx, …
    Failed { status: Option<u16>, error: String },
    /// The target is no more (404 or 410 from a push service): disable it.
    Gone { status: u16 },
}

/// Where the rules put what is due: the durable outbox (`outbox`), or in a
/// test, whatever records it.
#[async_trait::async_trait]
pub trait Enqueue: Send + Sync {
    /// Persists `outgoing` for delivery to each of its user's targets that
    /// want its event, in one transaction with its keys; `Ok(false)` (and
    /// nothing enqueued) when every one of its keys was seen before.
    async fn enqueue(&self, outgoing: Outgoing) -> crate::error::Result<bool>;
}

/// A notification of `event` about one request, for tests.
#[cfg(test)]
pub(crate) fn sample(event: NotificationEvent, count: u32) -> Notification {
    Notification {
        event,
        delivery_id: Uuid::nil(),
        at: chrono::Utc::now(),
        user: "ana".into(),
        conversation: Some(ConversationRef {
            id: Uuid::nil(),
            title: Some("Fix the build".into()),
            agent: "Claude Code".into(),
        }),
        request: Some(RequestRef {
            id: Uuid::nil(),
            title: Some("Run rm -rf build".into()),
            kind: Some("execute".into()),
            command: None,
        }),
        turn: None,
        count,
        budget: None,
        actions: vec![],
    }
}
