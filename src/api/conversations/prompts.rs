//! `POST /api/v1/conversations/{id}/prompts`: a prompt starts a turn, or
//! (while one runs) is queued, refused or steers; and a prompt's content as
//! every prompt is checked (over REST, in the queue, from an ACP client).

use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use utoipa::ToSchema;
use uuid::Uuid;

use super::super::extract::{exactly_one, Acting, AppJson, Visible, COLLABORATOR};
use super::super::openapi::ContentBlock;
use super::super::responses::{AgentTimeout, AtCapacity, BudgetSpent, NoConversation};
use super::paths::ConversationPath;
use crate::auth::Limited;
use crate::error::{Error, Result};
use crate::limits;
use crate::session::command::{Prompted, WhileRunning};

/// A prompt: exactly one of `text` and `content`.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
#[schema(as = Prompt)]
pub(super) enum PromptBody {
    Text(TextPrompt),
    Content(ContentPrompt),
}

/// A prompt of plain text (one text block).
#[derive(Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct TextPrompt {
    text: String,
    /// While a turn runs: queue the prompt (the default) or refuse it
    /// (`false`: 409 `turn_in_progress`).
    #[serde(default)]
    queue: Option<bool>,
    /// Cancel the running turn and send this prompt next, ahead of the
    /// queue (default `false`).
    #[serde(default)]
    steer: Option<bool>,
}

/// A prompt of ACP content blocks.
#[derive(Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ContentPrompt {
    /// 1 to 1000 blocks, each with a string `type`.
    #[schema(value_type = Vec<ContentBlock>, min_items = 1, max_items = 1000)]
    content: Vec<Value>,
    /// While a turn runs: queue the prompt (the default) or refuse it
    /// (`false`: 409 `turn_in_progress`).
    #[serde(default)]
    queue: Option<bool>,
    /// Cancel the running turn and send this prompt next, ahead of the
    /// queue (default `false`).
    #[serde(default)]
    steer: Option<bool>,
}

impl<'de> Deserialize<'de> for PromptBody {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        exactly_one(
            d,
            ("text", PromptBody::Text),
            ("content", PromptBody::Content),
        )
    }
}

impl PromptBody {
    /// Its content, checked, and what it does while a turn runs.
    fn read(self) -> Result<(Vec<Value>, WhileRunning)> {
        let (content, queue, steer) = match self {
            PromptBody::Text(TextPrompt { text, queue, steer }) => {
                (vec![json!({"type": "text", "text": text})], queue, steer)
            }
            PromptBody::Content(ContentPrompt {
                content,
                queue,
                steer,
            }) => (content, queue, steer),
        };
        let while_running = match (steer, queue) {
            (Some(true), _) => WhileRunning::Steer,
            (_, Some(false)) => WhileRunning::Refuse,
            _ => WhileRunning::Queue,
        };
        Ok((prompt_content(content)?, while_running))
    }
}

/// A prompt's ACP content blocks, checked as every prompt is (over REST or
/// from an ACP client): 1 to 1000 blocks, each with a string `type`.
pub(crate) fn prompt_content(content: Vec<Value>) -> Result<Vec<Value>> {
    if content.is_empty() {
        return Err(Error::Unprocessable("content must not be empty".into()));
    }
    limits::count("content", content.len(), limits::PROMPT_MAX_BLOCKS)?;
    for (i, block) in content.iter().enumerate() {
        if block.get("type").and_then(Value::as_str).is_none() {
            return Err(Error::Unprocessable(format!(
                "content[{i}] must be an ACP ContentBlock with a string \"type\""
            )));
        }
    }
    Ok(content)
}

/// What became of a prompt: a turn started, or (while one runs) it was
/// queued.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
#[schema(as = PromptAccepted)]
pub(super) enum Accepted {
    Started(Started),
    Queued(Queued),
}

/// The turn a prompt started.
#[derive(Serialize, ToSchema)]
#[schema(as = TurnStartedAnswer)]
pub(crate) struct Started {
    /// `false`.
    queued: bool,
    turn_id: Uuid,
}

impl Started {
    pub(crate) fn new(turn_id: Uuid) -> Started {
        Started {
            queued: false,
            turn_id,
        }
    }
}

/// A prompt queued while a turn runs.
#[derive(Serialize, ToSchema)]
#[schema(as = PromptQueuedAnswer)]
pub(super) struct Queued {
    /// `true`.
    queued: bool,
    /// The queued prompt's id (`…/queue/{prompt_id}`), which is also the id
    /// of the turn it starts.
    id: Uuid,
    /// Its place in the queue: 0 starts next.
    position: usize,
}

/// Starts a turn; it streams as events. An agent that has gone is started
/// again first. While a turn runs, the prompt is queued (202 with
/// `"queued": true`; it starts when that turn ends with `end_turn`), or
/// refused with `"queue": false`, or (`"steer": true`) sent next: the
/// running turn is cancelled.
#[utoipa::path(
    post, operation_id = "prompt", path = "/api/v1/conversations/{id}/prompts", tag = "conversations",
    params(ConversationPath),
    request_body = PromptBody,
    responses(
        (status = 202, description = "The turn started, or the prompt was queued", body = Accepted),
        NoConversation,
        BudgetSpent,
        (status = 409, description = "`turn_in_progress` (with `\"queue\": false`), `queue_full`, `conversation_closed` or `agent_unavailable`"),
        (status = 422, description = "Invalid prompt"),
        (status = 429, description = "Too many prompts for the token, or the agent has to be started again and all the agents the owner may run are busy (`max_agents_per_user`); `Retry-After`"),
        (status = 502, description = "The agent could not be started again"),
        AtCapacity,
        AgentTimeout,
    )
)]
pub(super) async fn prompt(
    Acting(visible): Acting<COLLABORATOR>,
    AppJson(body): AppJson<PromptBody>,
) -> Result<impl IntoResponse> {
    let Visible {
        state,
        caller,
        item,
    } = visible;
    let (content, while_running) = body.read()?;
    state.auth().check_rate(&caller, Limited::Prompt)?;
    state.budgets().admit(&item).await?;
    let prompted = state
        .sessions()
        .prompt(&item, content, while_running, Some(caller.decided_by()))
        .await?;
    let accepted = match prompted {
        Prompted::Started(turn_id) => Accepted::Started(Started::new(turn_id)),
        Prompted::Queued { id, position } => Accepted::Queued(Queued {
            queued: true,
            id,
            position,
        }),
    };
    Ok((StatusCode::ACCEPTED, Json(accepted)))
}
