//! Permission requests: how answers are checked, what a timeout answers, and
//! the "always" rules a conversation remembers. Everything here is pure; the
//! session applies it.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::time::Instant;
use uuid::Uuid;

use crate::error::{Error, Result};
use crate::model::{PermissionRequest, PermissionStatus};

/// A user's answer to a permission request.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    Option(String),
    Cancelled,
}

/// Checks an answer against a request: the option must exist (422).
pub fn validate_answer(request: &PermissionRequest, answer: &Answer) -> Result<PermissionStatus> {
    match answer {
        Answer::Cancelled => Ok(PermissionStatus::Cancelled),
        Answer::Option(id) => request.status_for_option(id).ok_or_else(|| {
            Error::Unprocessable(format!(
                "option_id {id:?} is not one of the request's options"
            ))
        }),
    }
}

/// The reply to an answer for a request that is already resolved: the same
/// answer again succeeds (a retrying phone), a different one is a conflict
/// that carries the current request.
pub fn answer_resolved(request: PermissionRequest, answer: &Answer) -> Result<PermissionRequest> {
    let same = match (&request.decision, answer) {
        (Some(d), Answer::Option(id)) => {
            d.outcome == "selected" && d.option_id.as_ref() == Some(id)
        }
        (Some(d), Answer::Cancelled) => d.outcome == "cancelled",
        (None, _) => false,
    };
    if same {
        return Ok(request);
    }
    Err(Error::Conflict {
        code: "already_resolved",
        detail: format!(
            "permission request {} is already {}",
            request.id,
            request.status.as_str()
        ),
        extra: Some(json!({ "request": request })),
    })
}

/// What a profile's `permission_timeout` answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OnTimeout {
    /// The request's `reject_once` option, or the cancelled outcome if it has none.
    #[default]
    Reject,
    /// The cancelled outcome.
    Cancel,
}

/// The option a timed-out request is answered with (`None`: cancelled).
pub fn timeout_option(request: &PermissionRequest, on_timeout: OnTimeout) -> Option<String> {
    match on_timeout {
        OnTimeout::Reject => option_of_kind(request, "reject_once"),
        OnTimeout::Cancel => None,
    }
}

fn option_of_kind(request: &PermissionRequest, kind: &str) -> Option<String> {
    request
        .options
        .iter()
        .find(|o| o.get("kind").and_then(Value::as_str) == Some(kind))
        .and_then(|o| o.get("optionId").and_then(Value::as_str))
        .map(str::to_owned)
}

/// When pending requests run out of time. Owned by one session; waiting on
/// [`Deadlines::due`] is cancel-safe, so it can sit in a `select!`.
#[derive(Debug, Default)]
pub struct Deadlines {
    at: HashMap<Uuid, Instant>,
}

impl Deadlines {
    /// `id` times out `after` from now.
    pub fn set(&mut self, id: Uuid, after: Duration) {
        self.at.insert(id, Instant::now() + after);
    }

    /// `id` was answered: it no longer times out.
    pub fn remove(&mut self, id: Uuid) {
        self.at.remove(&id);
    }

    /// Waits until a deadline has passed, then returns every id that is due,
    /// earliest first. Never returns while there is none.
    pub async fn due(&self) -> Vec<Uuid> {
        let Some(next) = self.at.values().min().copied() else {
            return std::future::pending().await;
        };
        tokio::time::sleep_until(next).await;
        let now = Instant::now();
        let mut due: Vec<(Instant, Uuid)> = self
            .at
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(id, at)| (*at, *id))
            .collect();
        due.sort();
        due.into_iter().map(|(_, id)| id).collect()
    }
}

/// The kind of an option the request offers.
pub fn option_kind<'a>(request: &'a PermissionRequest, option_id: &str) -> Option<&'a str> {
    request.option(option_id)?.get("kind")?.as_str()
}

/// What a tool call is, for remembering "always" answers: its kind and, for
/// `execute`, the program; for path tools, the path; for anything else, the
/// title (so that one "always" never covers unrelated tools).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolKey {
    pub kind: String,
    pub subject: String,
}

/// Derives the key of a tool call (`tool_call` is the request's `toolCall`
/// merged over what the gateway knows of that tool call).
pub fn tool_key(tool_call: &Value) -> ToolKey {
    let kind = tool_call
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or("other")
        .to_owned();
    let subject = match kind.as_str() {
        "execute" => tool_call
            .get("rawInput")
            .and_then(program)
            .unwrap_or_default(),
        _ => subject(tool_call, &kind),
    };
    ToolKey { kind, subject }
}

/// What a whole tool call of a kind other than `execute` is known by: the
/// path of a path tool, else the title (empty when it has none).
pub(crate) fn subject(tool_call: &Value, kind: &str) -> String {
    let raw_input = tool_call.get("rawInput");
    match kind {
        "read" | "edit" | "delete" | "move" => tool_call
            .get("locations")
            .and_then(|l| l.get(0))
            .and_then(|l| l.get("path"))
            .and_then(Value::as_str)
            .or_else(|| {
                ["path", "file_path", "filePath", "abs_path"]
                    .iter()
                    .find_map(|k| raw_input?.get(*k)?.as_str())
            })
            .unwrap_or_default()
            .to_owned(),
        _ => tool_call
            .get("title")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
    }
}

/// The program a command runs: the first word of a command line, or the first
/// element of an argv array.
fn program(raw_input: &Value) -> Option<String> {
    let command = raw_input.get("command").or_else(|| raw_input.get("cmd"))?;
    let first = match command {
        Value::String(line) => line.split_whitespace().next()?.to_owned(),
        Value::Array(argv) => argv.first()?.as_str()?.to_owned(),
        _ => return None,
    };
    // `/usr/bin/git` and `git` are the same program to a user.
    Some(first.rsplit('/').next().unwrap_or(&first).to_owned())
}

/// A remembered "always" answer, scoped to one conversation.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
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

/// How a policy verdict answers a request: the option to pick (`None`: the
/// cancelled outcome) and the status it leads to; `None` when a person must
/// decide. `allow` picks `allow_once` (`allow_always` only for a rule that
/// remembers, or a remembered answer); `deny` picks `reject_once`
/// (`reject_always` for a remembered answer), or the cancelled outcome when
/// the agent offered no way to reject.
pub fn automatic_answer(
    request: &PermissionRequest,
    verdict: &crate::policy::Verdict,
) -> Option<(PermissionStatus, Option<String>)> {
    use crate::policy::Decision;
    let remembered = verdict.rule.as_deref() == Some("remembered");
    let pick = |kinds: &[&str]| kinds.iter().find_map(|k| option_of_kind(request, k));
    match verdict.decision {
        Decision::Ask => None,
        Decision::Allow => {
            let kinds: &[&str] = if remembered || verdict.remember {
                &["allow_always", "allow_once"]
            } else {
                &["allow_once"]
            };
            pick(kinds).map(|option| (PermissionStatus::Approved, Some(option)))
        }
        Decision::Deny => {
            let kinds: &[&str] = if remembered {
                &["reject_always", "reject_once"]
            } else {
                &["reject_once"]
            };
            Some((PermissionStatus::Rejected, pick(kinds)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model;

    fn request(options: Value) -> PermissionRequest {
        PermissionRequest {
            id: model::new_id(),
            conversation_id: model::new_id(),
            turn_id: None,
            tool_call: json!({}),
            options: serde_json::from_value(options).unwrap(),
            status: PermissionStatus::Pending,
            decision: None,
            created_at: model::now(),
        }
    }

    #[test]
    fn tool_keys_name_the_program_the_path_or_the_title() {
        let k =
            tool_key(&json!({"kind": "execute", "rawInput": {"command": "/usr/bin/git status"}}));
        assert_eq!((k.kind.as_str(), k.subject.as_str()), ("execute", "git"));
        let k = tool_key(&json!({"kind": "execute", "rawInput": {"command": ["ls", "-l"]}}));
        assert_eq!(k.subject, "ls");
        let k = tool_key(&json!({"kind": "edit", "locations": [{"path": "/a/b.rs"}]}));
        assert_eq!(k.subject, "/a/b.rs");
        let k = tool_key(&json!({"kind": "read", "rawInput": {"file_path": "/c.txt"}}));
        assert_eq!(k.subject, "/c.txt");
        let k = tool_key(&json!({"title": "mcp__github__create_issue"}));
        assert_eq!(
            (k.kind.as_str(), k.subject.as_str()),
            ("other", "mcp__github__create_issue")
        );
    }

    #[test]
    fn timeouts_answer_reject_once_or_cancel() {
        let r = request(json!([
            {"optionId": "a", "name": "A", "kind": "allow_once"},
            {"optionId": "r", "name": "R", "kind": "reject_once"}
        ]));
        assert_eq!(timeout_option(&r, OnTimeout::Reject).as_deref(), Some("r"));
        assert_eq!(timeout_option(&r, OnTimeout::Cancel), None);
        let only_allow = request(json!([{"optionId": "a", "name": "A", "kind": "allow_once"}]));
        assert_eq!(timeout_option(&only_allow, OnTimeout::Reject), None);
    }

    #[tokio::test(start_paused = true)]
    async fn deadlines_fire_in_order_as_time_passes_and_answered_ones_never() {
        let (a, b, c) = (model::new_id(), model::new_id(), model::new_id());
        let mut deadlines = Deadlines::default();
        let start = Instant::now();
        deadlines.set(b, Duration::from_secs(20));
        deadlines.set(a, Duration::from_secs(10));
        deadlines.set(c, Duration::from_secs(15));
        deadlines.remove(c); // answered in time
        assert_eq!(deadlines.due().await, [a]);
        assert_eq!(start.elapsed(), Duration::from_secs(10));
        deadlines.remove(a);
        assert_eq!(deadlines.due().await, [b]);
        assert_eq!(start.elapsed(), Duration::from_secs(20));
        deadlines.remove(b);
        let nothing = tokio::time::timeout(Duration::from_secs(3600), deadlines.due()).await;
        assert!(nothing.is_err(), "no deadline, nothing due");
    }

    #[tokio::test(start_paused = true)]
    async fn deadlines_that_passed_together_are_returned_together() {
        let (a, b) = (model::new_id(), model::new_id());
        let mut deadlines = Deadlines::default();
        deadlines.set(a, Duration::from_secs(5));
        deadlines.set(b, Duration::from_secs(1));
        tokio::time::advance(Duration::from_secs(6)).await;
        assert_eq!(deadlines.due().await, [b, a]);
    }

    #[test]
    fn verdicts_pick_once_options_unless_remembering() {
        use crate::policy::{Decision, Verdict};
        let r = request(json!([
            {"optionId": "a1", "name": "A", "kind": "allow_once"},
            {"optionId": "aa", "name": "AA", "kind": "allow_always"},
            {"optionId": "r1", "name": "R", "kind": "reject_once"},
            {"optionId": "ra", "name": "RA", "kind": "reject_always"}
        ]));
        let v = |decision, rule: &str, remember| {
            let mut v = Verdict::new(decision, Some(rule), String::new());
            v.remember = remember;
            v
        };
        let answer =
            |verdict| automatic_answer(&r, &verdict).map(|(s, o)| (s, o.unwrap_or_default()));
        use PermissionStatus::*;
        assert_eq!(
            answer(v(Decision::Allow, "read-only", false)),
            Some((Approved, "a1".into()))
        );
        assert_eq!(
            answer(v(Decision::Allow, "edits", true)),
            Some((Approved, "aa".into()))
        );
        assert_eq!(
            answer(v(Decision::Allow, "remembered", false)),
            Some((Approved, "aa".into()))
        );
        assert_eq!(
            answer(v(Decision::Deny, "no rm", false)),
            Some((Rejected, "r1".into()))
        );
        assert_eq!(
            answer(v(Decision::Deny, "remembered", false)),
            Some((Rejected, "ra".into()))
        );
        assert_eq!(answer(v(Decision::Ask, "ask", false)), None);
        let only_allow = request(json!([{"optionId": "a1", "name": "A", "kind": "allow_once"}]));
        assert_eq!(
            automatic_answer(&only_allow, &v(Decision::Deny, "no rm", false)),
            Some((Rejected, None))
        );
        let only_always = request(json!([{"optionId": "aa", "name": "A", "kind": "allow_always"}]));
        assert_eq!(
            automatic_answer(&only_always, &v(Decision::Allow, "read-only", false)),
            None
        );
    }
}
