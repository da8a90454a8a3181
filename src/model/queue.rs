//! A conversation's prompt queue: prompts sent while a turn runs, started
//! one after the other as turns end, and the events that show it.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use uuid::Uuid;

/// A prompt waiting for the running turn to end.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct QueuedPrompt {
    /// The prompt's id, and the id of the turn it starts.
    pub id: Uuid,
    /// ACP content blocks.
    pub content: Vec<Value>,
    /// Who queued it: `user:<name>` (a reason given with an answer is
    /// queued by whoever answered).
    #[schema(example = "user:alice")]
    pub queued_by: String,
    pub queued_at: DateTime<Utc>,
    /// Starts when the running turn ends however it ends (sent with
    /// `"steer": true`, which cancels that turn); the others start only
    /// after a turn that ended with `end_turn`.
    pub steer: bool,
    /// The permission request whose answer's `reason` this tells the agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub reason_for: Option<Uuid>,
}

/// `queue_changed`: a prompt was queued, edited, moved, removed, or
/// started; `queue` is the whole queue now, in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct QueueChanged {
    /// `queued`, `edited`, `moved`, `removed` or `started`.
    #[schema(example = "queued")]
    pub change: String,
    /// The prompt it concerns.
    pub prompt_id: Uuid,
    /// Who changed it (`user:<name>`); `null` for a start.
    pub by: Option<String>,
    pub queue: Vec<QueuedPrompt>,
}

/// `queue_held`: a turn ended other than with `end_turn` (cancelled,
/// refused, an error, the agent gone), or a budget was spent during it,
/// while prompts were queued: they wait until a person sends one
/// (`POST …/queue/resume`) or a new prompt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct QueueHeld {
    /// The turn that ended.
    pub turn_id: Uuid,
    pub stop_reason: String,
    /// How many prompts wait.
    pub queued: u32,
    /// The budget spent during the turn, which holds the queue (absent:
    /// the turn's end holds it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<String>,
}
