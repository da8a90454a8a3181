//! Permission requests and their answers, remembered answers (rules), the
//! roles of users, and operator policy rules.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use uuid::Uuid;

use super::stamp::now;

/// Where a permission request stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum PermissionStatus {
    Pending,
    Approved,
    Rejected,
    Cancelled,
    Expired,
    TimedOut,
}

impl PermissionStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Approved => "approved",
            Self::Rejected => "rejected",
            Self::Cancelled => "cancelled",
            Self::Expired => "expired",
            Self::TimedOut => "timed_out",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "pending" => Self::Pending,
            "approved" => Self::Approved,
            "rejected" => Self::Rejected,
            "cancelled" => Self::Cancelled,
            "expired" => Self::Expired,
            "timed_out" => Self::TimedOut,
            _ => return None,
        })
    }
}

/// A person's (or the gateway's) answer to a permission request: one of the
/// options the agent offered, or none (the ACP `cancelled` outcome). The one
/// shape of an answer from the API's body to the agent's result: a
/// [`Decision`] records it, and [`Answer::acp_result`] is what the agent
/// receives. Its serde form (`{"Option": "<id>"}` or `"Cancelled"`) is what
/// gateway nodes send each other in a forwarded command, so it never changes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Answer {
    Option(String),
    Cancelled,
    /// A person's reply to an agent's question (ACP elicitation): `accept`
    /// (with the content asked for), `decline` or `cancel`.
    Reply {
        action: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        content: Option<Value>,
    },
}

impl Answer {
    /// The option chosen (`None`: the cancelled outcome).
    pub fn option_id(&self) -> Option<&str> {
        match self {
            Answer::Option(id) => Some(id),
            Answer::Cancelled | Answer::Reply { .. } => None,
        }
    }

    /// The ACP outcome: `selected` or `cancelled`; a reply's action.
    pub fn outcome(&self) -> &str {
        match self {
            Answer::Option(_) => "selected",
            Answer::Cancelled => "cancelled",
            Answer::Reply { action, .. } => action,
        }
    }

    /// The ACP result the agent receives for a request of `kind`: of
    /// `session/request_permission` (`{"outcome"}`), or of
    /// `elicitation/create` (`{"action", "content"?}`; no answer but a
    /// reply is `cancel`).
    pub fn acp_result(&self, kind: WaitingKind) -> Value {
        match (kind, self) {
            (WaitingKind::Question, Answer::Reply { action, content }) => match content {
                Some(content) if action == "accept" => {
                    serde_json::json!({"action": action, "content": content})
                }
                _ => serde_json::json!({"action": action}),
            },
            (WaitingKind::Question, _) => serde_json::json!({"action": "cancel"}),
            (WaitingKind::Permission, Answer::Option(option_id)) => {
                serde_json::json!({"outcome": {"outcome": "selected", "optionId": option_id}})
            }
            (WaitingKind::Permission, _) => {
                serde_json::json!({"outcome": {"outcome": "cancelled"}})
            }
        }
    }
}

/// What waits for a person's answer: an agent's permission request, or its
/// question (ACP `elicitation/create`). Both are held, stored, notified and
/// answered the same way; a question's `tool_call` holds the agent's
/// `elicitation/create` parameters and it has no options.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitingKind {
    #[default]
    Permission,
    Question,
}

impl WaitingKind {
    pub fn as_str(self) -> &'static str {
        match self {
            WaitingKind::Permission => "permission",
            WaitingKind::Question => "question",
        }
    }

    pub fn parse(s: &str) -> Option<WaitingKind> {
        match s {
            "permission" => Some(WaitingKind::Permission),
            "question" => Some(WaitingKind::Question),
            _ => None,
        }
    }

    pub fn is_permission(&self) -> bool {
        *self == WaitingKind::Permission
    }

    /// The ACP method the agent asks with.
    pub fn method(self) -> &'static str {
        match self {
            WaitingKind::Permission => "session/request_permission",
            WaitingKind::Question => "elicitation/create",
        }
    }
}

/// An option, or (`None`) the cancelled outcome.
impl From<Option<String>> for Answer {
    fn from(option_id: Option<String>) -> Answer {
        option_id.map_or(Answer::Cancelled, Answer::Option)
    }
}

// Its `option_id` and `outcome` are an `Answer` as stored and shown: read
// it back with `Decision::answer`.
/// How a permission request was answered.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct Decision {
    /// The option chosen; `null` with the `cancelled` outcome.
    pub option_id: Option<String>,
    /// `selected` or `cancelled`, as in ACP.
    #[schema(example = "selected")]
    pub outcome: String,
    /// `user:<name>`, `policy:<rule name>` or `system`.
    #[schema(example = "user:alice")]
    pub decided_by: String,
    /// Why: the person's own words where they gave a reason with their
    /// answer; else why the gateway or a policy decided (or a note on an
    /// "always" answer not remembered).
    pub reason: Option<String>,
    pub decided_at: DateTime<Utc>,
    /// How a person's answer came: `notification` (an action URL); absent
    /// for the API and the web client.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, example = "notification")]
    pub via: Option<String>,
    /// A question's accepted content (absent for permission requests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(ignore)]
    pub content: Option<Value>,
}

impl Decision {
    /// A decision made now: `answer` (an option, or `None` for the
    /// cancelled outcome), by `decided_by`, for `reason`.
    pub fn new(answer: impl Into<Answer>, decided_by: String, reason: Option<String>) -> Decision {
        let answer = answer.into();
        Decision {
            outcome: answer.outcome().to_owned(),
            option_id: answer.option_id().map(str::to_owned),
            decided_by,
            reason,
            decided_at: now(),
            via: None,
            content: match answer {
                Answer::Reply { content, .. } => content,
                _ => None,
            },
        }
    }

    /// The answer it records (an option only with the `selected` outcome;
    /// a reply with a question's action).
    pub fn answer(&self) -> Answer {
        match (&self.option_id, self.outcome.as_str()) {
            (Some(option_id), "selected") => Answer::Option(option_id.clone()),
            (None, action @ ("accept" | "decline" | "cancel")) => Answer::Reply {
                action: action.to_owned(),
                content: self.content.clone(),
            },
            _ => Answer::Cancelled,
        }
    }

    /// The ACP result sent back to the agent for a request of `kind`.
    pub fn acp_result(&self, kind: WaitingKind) -> Value {
        self.answer().acp_result(kind)
    }
}

/// An agent's `session/request_permission`, parked until answered.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct PermissionRequest {
    pub id: Uuid,
    pub conversation_id: Uuid,
    pub turn_id: Option<Uuid>,
    /// The ACP `toolCall` of the request laid over what the agent announced
    /// of that call before: the call as the policies judged it.
    pub tool_call: Value,
    /// The ACP options, verbatim: `optionId`, `name`, `kind` (`allow_once`,
    /// `allow_always`, `reject_once`, `reject_always`).
    pub options: Vec<Value>,
    pub status: PermissionStatus,
    pub decision: Option<Decision>,
    pub created_at: DateTime<Utc>,
    /// A permission request, or an agent's question (not part of a
    /// permission request's API object; a question's is [`Question`]).
    #[serde(default, skip_serializing_if = "WaitingKind::is_permission")]
    #[schema(ignore)]
    pub kind: WaitingKind,
}

impl PermissionRequest {
    /// The option with this id, if the agent offered it.
    pub fn option(&self, option_id: &str) -> Option<&Value> {
        self.options
            .iter()
            .find(|o| o.get("optionId").and_then(Value::as_str) == Some(option_id))
    }

    /// The status a selected option leads to: its kind decides.
    pub fn status_for_option(&self, option_id: &str) -> Option<PermissionStatus> {
        let kind = self.option(option_id)?.get("kind").and_then(Value::as_str);
        Some(match kind {
            Some(k) if k.starts_with("allow") => PermissionStatus::Approved,
            _ => PermissionStatus::Rejected,
        })
    }
}

/// What a user may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Sees and answers only their own conversations.
    User,
    /// Sees everything; alone changes policies and tokens.
    Operator,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::User => "user",
            Role::Operator => "operator",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "user" => Some(Role::User),
            "operator" => Some(Role::Operator),
            _ => None,
        }
    }
}

/// A remembered "always" answer, scoped to one conversation.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct Rule {
    pub id: Uuid,
    pub conversation_id: Uuid,
    /// The tool call kind it covers.
    pub tool_kind: String,
    /// The program (`execute`), the path (path tools) or the title (others).
    pub subject: String,
    /// `allow_always` or `reject_always`.
    pub option_kind: String,
    /// The request whose answer created it.
    pub permission_id: Uuid,
    pub created_at: DateTime<Utc>,
}

/// What an operator policy rule decides (the rule's `decision`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    Allow,
    Deny,
    Ask,
}

/// At most `count` automatic approvals by one rule per `window`, per
/// conversation; beyond it, a person is asked.
/// (`RateLimit` in the OpenAPI document, with the rules of
/// [`crate::permissions::policy::input`].)
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    #[serde(deserialize_with = "whole_number")]
    pub count: u32,
    pub window: Window,
}

/// A count as JSON Schema's `integer` reads it: any number without a
/// fractional part, so `78.0` is 78 (a generated client may send it so).
fn whole_number<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<u32, D::Error> {
    use serde::de::{Error, Unexpected, Visitor};
    struct Whole;
    impl Visitor<'_> for Whole {
        type Value = u32;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a whole number from 0 to 4294967295")
        }
        fn visit_u64<E: Error>(self, v: u64) -> Result<u32, E> {
            u32::try_from(v).map_err(|_| E::invalid_value(Unexpected::Unsigned(v), &self))
        }
        fn visit_i64<E: Error>(self, v: i64) -> Result<u32, E> {
            u32::try_from(v).map_err(|_| E::invalid_value(Unexpected::Signed(v), &self))
        }
        fn visit_f64<E: Error>(self, v: f64) -> Result<u32, E> {
            if v.fract() == 0.0 && (0.0..=f64::from(u32::MAX)).contains(&v) {
                Ok(v as u32)
            } else {
                Err(E::invalid_value(Unexpected::Float(v), &self))
            }
        }
    }
    deserializer.deserialize_any(Whole)
}

/// A rate limit's window: the text as written (`"15m"`, `"1h 30m"`), given
/// back as it came, and the duration it names. Reading takes whatever
/// `humantime` parses, so that rules stored by an older version still load;
/// what the API and the config file accept is narrower
/// ([`crate::permissions::policy::input`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    text: String,
    duration: Duration,
}

impl Window {
    pub fn parse(text: &str) -> Result<Window, String> {
        let duration = humantime_serde::re::humantime::parse_duration(text)
            .map_err(|e| format!("{text:?} is not a duration: {e}"))?;
        Ok(Window {
            text: text.to_owned(),
            duration,
        })
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    pub fn duration(&self) -> Duration {
        self.duration
    }
}

impl Serialize for Window {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.text)
    }
}

impl<'de> Deserialize<'de> for Window {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Window::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// One operator rule, as written in the config file or sent to the API.
/// What the API takes is documented by `PolicyRule` in the OpenAPI
/// document (an `allow` rule or a `deny`/`ask` one; see
/// [`crate::permissions::policy::input`]), which describes this type.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyRule {
    /// Unique in the list; at most 100 characters, one line.
    pub name: String,
    /// Profile names, or `"*"` for every agent (the default).
    #[serde(default = "every_agent")]
    pub agents: Vec<String>,
    /// Tool call kinds it covers (empty: every kind).
    #[serde(default)]
    pub kinds: Vec<String>,
    /// Regexes; the rule covers a shell command part that one of them matches.
    #[serde(default)]
    pub commands: Vec<String>,
    /// Globs over normalised paths; `{cwd}` is the conversation's directory.
    #[serde(default)]
    pub paths: Vec<String>,
    pub decision: Action,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_auto_per: Option<RateLimit>,
    /// Answer `allow` with the agent's `allow_always` option.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub remember: bool,
}

fn every_agent() -> Vec<String> {
    vec!["*".into()]
}
