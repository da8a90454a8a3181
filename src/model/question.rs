//! An agent's question to a person (ACP `elicitation/create`), as the API
//! shows it. Inside, a question waits as a [`PermissionRequest`] of kind
//! [`WaitingKind::Question`] (one store, one inbox, one road for answers):
//! this is its view, and back.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use utoipa::ToSchema;
use uuid::Uuid;

use super::permission::{Decision, PermissionRequest, PermissionStatus, WaitingKind};

/// Where a question stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum QuestionStatus {
    Pending,
    Accepted,
    Declined,
    Cancelled,
    Expired,
    TimedOut,
}

impl QuestionStatus {
    fn of(status: PermissionStatus) -> QuestionStatus {
        match status {
            PermissionStatus::Pending => QuestionStatus::Pending,
            PermissionStatus::Approved => QuestionStatus::Accepted,
            PermissionStatus::Rejected => QuestionStatus::Declined,
            PermissionStatus::Cancelled => QuestionStatus::Cancelled,
            PermissionStatus::Expired => QuestionStatus::Expired,
            PermissionStatus::TimedOut => QuestionStatus::TimedOut,
        }
    }

    fn stored(self) -> PermissionStatus {
        match self {
            QuestionStatus::Pending => PermissionStatus::Pending,
            QuestionStatus::Accepted => PermissionStatus::Approved,
            QuestionStatus::Declined => PermissionStatus::Rejected,
            QuestionStatus::Cancelled => PermissionStatus::Cancelled,
            QuestionStatus::Expired => PermissionStatus::Expired,
            QuestionStatus::TimedOut => PermissionStatus::TimedOut,
        }
    }
}

/// An agent's question, waiting for a person's reply or replied to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Question {
    pub id: Uuid,
    pub conversation_id: Uuid,
    pub turn_id: Option<Uuid>,
    /// `form` (fill in `requested_schema`) or `url` (open `url`).
    #[schema(example = "form")]
    pub mode: String,
    /// What the agent asks, in its words.
    pub message: String,
    /// Form mode: the fields asked for, a flat JSON Schema object (string
    /// with `enum`, `oneOf` or `format` email, uri, date, date-time;
    /// number; integer; boolean; multi-select `array`), verbatim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub requested_schema: Option<Value>,
    /// URL mode: where the person goes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub url: Option<String>,
    /// URL mode: the agent's id of the interaction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub elicitation_id: Option<String>,
    /// The tool call it is about, if the agent said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub tool_call_id: Option<String>,
    pub status: QuestionStatus,
    pub answer: Option<QuestionAnswer>,
    pub created_at: DateTime<Utc>,
}

/// How a question was answered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct QuestionAnswer {
    /// `accept`, `decline` or `cancel`.
    #[schema(example = "accept")]
    pub action: String,
    /// What the person filled in (`accept` in form mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub content: Option<Value>,
    /// `user:<name>`, or `system` (a timeout, a cancelled turn, the agent
    /// gone, or the agent saying a URL interaction is complete).
    pub decided_by: String,
    /// Why, when the gateway decided.
    pub reason: Option<String>,
    pub decided_at: DateTime<Utc>,
    /// `notification` where a person answered with a notification's
    /// action URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub via: Option<String>,
}

impl From<&PermissionRequest> for Question {
    fn from(asked: &PermissionRequest) -> Question {
        let params = &asked.tool_call;
        let text = |key: &str| params.get(key).and_then(Value::as_str).map(str::to_owned);
        Question {
            id: asked.id,
            conversation_id: asked.conversation_id,
            turn_id: asked.turn_id,
            mode: text("mode").unwrap_or_else(|| "form".into()),
            message: text("message").unwrap_or_default(),
            requested_schema: params.get("requestedSchema").cloned(),
            url: text("url"),
            elicitation_id: text("elicitationId"),
            tool_call_id: text("toolCallId"),
            status: QuestionStatus::of(asked.status),
            answer: asked.decision.as_ref().map(|d| QuestionAnswer {
                action: match d.outcome.as_str() {
                    action @ ("accept" | "decline") => action.to_owned(),
                    _ => "cancel".to_owned(),
                },
                content: d.content.clone(),
                decided_by: d.decided_by.clone(),
                reason: d.reason.clone(),
                decided_at: d.decided_at,
                via: d.via.clone(),
            }),
            created_at: asked.created_at,
        }
    }
}

impl From<Question> for PermissionRequest {
    fn from(q: Question) -> PermissionRequest {
        let mut params = Map::new();
        params.insert("mode".into(), json!(q.mode));
        params.insert("message".into(), json!(q.message));
        let optional = [
            ("requestedSchema", q.requested_schema),
            ("url", q.url.map(Value::from)),
            ("elicitationId", q.elicitation_id.map(Value::from)),
            ("toolCallId", q.tool_call_id.map(Value::from)),
        ];
        for (key, value) in optional {
            if let Some(value) = value {
                params.insert(key.into(), value);
            }
        }
        PermissionRequest {
            id: q.id,
            conversation_id: q.conversation_id,
            turn_id: q.turn_id,
            tool_call: Value::Object(params),
            options: Vec::new(),
            status: q.status.stored(),
            decision: q.answer.map(|a| Decision {
                option_id: None,
                outcome: a.action,
                decided_by: a.decided_by,
                reason: a.reason,
                decided_at: a.decided_at,
                via: a.via,
                content: a.content,
            }),
            created_at: q.created_at,
            kind: WaitingKind::Question,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_question_reads_back_as_it_was_stored() {
        let asked = PermissionRequest {
            id: Uuid::now_v7(),
            conversation_id: Uuid::now_v7(),
            turn_id: None,
            tool_call: json!({"mode": "form", "message": "Which?",
                "requestedSchema": {"type": "object", "properties": {"a": {"type": "boolean"}}}}),
            options: Vec::new(),
            status: PermissionStatus::Approved,
            decision: Some(Decision {
                content: Some(json!({"a": true})),
                ..Decision::new(
                    super::super::permission::Answer::Reply {
                        action: "accept".into(),
                        content: Some(json!({"a": true})),
                    },
                    "user:alice".into(),
                    None,
                )
            }),
            created_at: super::super::stamp::now(),
            kind: WaitingKind::Question,
        };
        let shown = Question::from(&asked);
        assert_eq!(shown.status, QuestionStatus::Accepted);
        assert_eq!(shown.answer.as_ref().unwrap().action, "accept");
        assert_eq!(PermissionRequest::from(shown), asked);
    }
}
