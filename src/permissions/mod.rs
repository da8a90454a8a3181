//! Permission requests: how a user's answer is checked, what a timeout or a
//! policy verdict answers, and the operator policies in force
//! ([`PolicyHandle`]). The pure engine that decides tool calls is
//! [`policy`], on the shell splitter [`shell`]; the session applies all of it.

pub mod policy;
pub mod question;
pub mod shell;

use std::sync::{Arc, RwLock};

use serde_json::{json, Value};

use crate::error::{Error, Result};
use crate::model::{
    Answer, PermissionRequest, PermissionStatus, PolicyRule, Question, WaitingKind,
};
use crate::store::Store;
use policy::{Action, Policies, Verdict};

pub use crate::config::profile::OnTimeout;
pub use policy::{keys_to_remember, ToolKey};

/// Checks an answer against a request: the option must be one it offers
/// (else 409 `not_offered`: the document cannot know the options); a
/// question's reply must be `accept` with content that matches the schema
/// it asked with (else 422 naming each field), `decline` or `cancel`.
pub fn validate_answer(request: &PermissionRequest, answer: &Answer) -> Result<PermissionStatus> {
    match (request.kind, answer) {
        (_, Answer::Cancelled) => Ok(PermissionStatus::Cancelled),
        (WaitingKind::Permission, Answer::Option(id)) => {
            request.status_for_option(id).ok_or_else(|| {
                Error::conflict(
                    "not_offered",
                    format!("option_id {id:?} is not one of the request's options"),
                )
            })
        }
        (WaitingKind::Permission, Answer::Reply { .. }) => Err(Error::Unprocessable(
            "a permission request is answered with option_id or outcome".into(),
        )),
        (WaitingKind::Question, Answer::Option(_)) => Err(Error::Unprocessable(
            "a question is answered with action (accept, decline or cancel)".into(),
        )),
        (WaitingKind::Question, Answer::Reply { action, content }) => {
            if action != "accept" && content.is_some() {
                return Err(Error::Unprocessable(
                    "content goes only with action accept".into(),
                ));
            }
            match action.as_str() {
                "accept" => {
                    check_reply(request, content.as_ref())?;
                    Ok(PermissionStatus::Approved)
                }
                "decline" => Ok(PermissionStatus::Rejected),
                "cancel" => Ok(PermissionStatus::Cancelled),
                other => Err(Error::Unprocessable(format!(
                    "action must be accept, decline or cancel, not {other:?}"
                ))),
            }
        }
    }
}

/// An accepted question's content against the schema it asked with (a
/// form; a URL question takes none).
fn check_reply(request: &PermissionRequest, content: Option<&Value>) -> Result<()> {
    match request.tool_call.get("requestedSchema") {
        Some(schema) => {
            let empty = json!({});
            question::check_content(schema, content.unwrap_or(&empty))
                .map_err(|wrong| Error::Unprocessable(wrong.join("; ")))
        }
        None if content.is_some() => Err(Error::Unprocessable(
            "content goes only with a question in form mode".into(),
        )),
        None => Ok(()),
    }
}

/// What a person's answer does to a request: the status it resolves it
/// with and, for an "always" option, what would be remembered.
pub struct Judged {
    pub status: PermissionStatus,
    /// For an `*_always` option: its kind, and the keys of the rules to
    /// remember, or why none are (they would cover more than was shown).
    pub always: Option<(String, std::result::Result<Vec<ToolKey>, String>)>,
}

/// Checks a person's answer against a request (see [`validate_answer`])
/// and reads what an "always" option would remember: from the call as the
/// request showed it (merged with what the agent had said of it by then);
/// what the agent said of the call since was not shown, and decides nothing.
pub fn judge_answer(request: &PermissionRequest, answer: &Answer) -> Result<Judged> {
    let status = validate_answer(request, answer)?;
    let always = answer
        .option_id()
        .and_then(|o| option_kind(request, o))
        .filter(|kind| kind.ends_with("_always"))
        .map(|kind| (kind.to_owned(), keys_to_remember(&request.tool_call)));
    Ok(Judged { status, always })
}

/// The reply to an answer for a request that is already resolved: the same
/// answer again succeeds (a retrying phone), a different one is a conflict
/// that carries the current request.
pub fn answer_resolved(request: PermissionRequest, answer: &Answer) -> Result<PermissionRequest> {
    match &request.decision {
        Some(d) if d.answer() == *answer => Ok(request),
        _ => Err(already_resolved(request)),
    }
}

/// 409 `already_resolved`: someone answered `request` first; the conflict
/// carries it as it is now.
pub fn already_resolved(request: PermissionRequest) -> Error {
    if request.kind == WaitingKind::Question {
        let question = Question::from(&request);
        return Error::Conflict {
            code: "already_resolved",
            detail: format!(
                "question {} is already {}",
                request.id,
                request.status.as_str()
            ),
            extra: Some(json!({ "question": question })),
        };
    }
    Error::Conflict {
        code: "already_resolved",
        detail: format!(
            "permission request {} is already {}",
            request.id,
            request.status.as_str()
        ),
        extra: Some(json!({ "request": request })),
    }
}

/// The reply to an answer for a request no live agent holds: a repeat of
/// the recorded decision succeeds; a request still `pending` in the store
/// belongs to an agent that is gone (409 `agent_gone`).
pub fn answer_without_agent(
    request: PermissionRequest,
    answer: &Answer,
) -> Result<PermissionRequest> {
    validate_answer(&request, answer)?;
    if request.status == PermissionStatus::Pending {
        return Err(Error::conflict(
            "agent_gone",
            "the agent that asked is no longer running",
        ));
    }
    answer_resolved(request, answer)
}

/// An answer to a request whose remote agent is away, or back but has not
/// asked again yet: 409, and the request stays pending.
pub fn agent_away() -> Error {
    Error::conflict(
        "agent_away",
        "the remote agent's connection was lost; this request can be answered once the agent \
         is back and asks again (it stays pending until then, or expires if the agent forgot it)",
    )
}

/// The answer a timed-out request gets.
pub fn timeout_answer(request: &PermissionRequest, on_timeout: OnTimeout) -> Answer {
    match on_timeout {
        OnTimeout::Reject => option_of_kind(request, "reject_once").into(),
        OnTimeout::Cancel => Answer::Cancelled,
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

/// The kind of an option the request offers.
pub fn option_kind<'a>(request: &'a PermissionRequest, option_id: &str) -> Option<&'a str> {
    request.option(option_id)?.get("kind")?.as_str()
}

/// How a policy verdict answers a request: the answer (an option, or the
/// cancelled outcome) and the status it leads to; `None` when a person must
/// decide. `allow` picks `allow_once` (`allow_always` only for a rule that
/// remembers, or a remembered answer); `deny` picks `reject_once`
/// (`reject_always` for a remembered answer), or the cancelled outcome when
/// the agent offered no way to reject.
pub fn automatic_answer(
    request: &PermissionRequest,
    verdict: &Verdict,
) -> Option<(PermissionStatus, Answer)> {
    let remembered = verdict.rule.as_deref() == Some("remembered");
    let pick = |kinds: &[&str]| kinds.iter().find_map(|k| option_of_kind(request, k));
    match verdict.decision {
        Action::Ask => None,
        Action::Allow => {
            let kinds: &[&str] = if remembered || verdict.remember {
                &["allow_always", "allow_once"]
            } else {
                &["allow_once"]
            };
            pick(kinds).map(|option| (PermissionStatus::Approved, Answer::Option(option)))
        }
        Action::Deny => {
            let kinds: &[&str] = if remembered {
                &["reject_always", "reject_once"]
            } else {
                &["reject_once"]
            };
            Some((PermissionStatus::Rejected, pick(kinds).into()))
        }
    }
}

/// The policies in force, shared by the API and every session. The store's
/// newest policy set wins over the config file's rules; [`PolicyHandle::refresh`]
/// picks up a set another gateway node saved.
#[derive(Clone)]
pub struct PolicyHandle {
    inner: Arc<RwLock<Current>>,
    from_config: Arc<Vec<PolicyRule>>,
}

struct Current {
    /// The policy set the compiled rules come from (`None`: the config file).
    set_id: Option<uuid::Uuid>,
    policies: Arc<Policies>,
}

impl PolicyHandle {
    /// Starts from the config file's (already validated) rules.
    pub fn new(config_rules: Vec<PolicyRule>) -> std::result::Result<PolicyHandle, String> {
        let policies = Policies::compile(&config_rules).map_err(|e| e.to_string())?;
        Ok(PolicyHandle {
            inner: Arc::new(RwLock::new(Current {
                set_id: None,
                policies: Arc::new(policies),
            })),
            from_config: Arc::new(config_rules),
        })
    }

    /// The rules of the config file.
    pub fn config_rules(&self) -> &[PolicyRule] {
        &self.from_config
    }

    /// The policies in force after looking at the store's newest set.
    pub async fn refresh(&self, store: &dyn Store) -> Result<Arc<Policies>> {
        let newest = store.current_policies().await?;
        let mut current = self.inner.write().unwrap();
        if let Some(set) = newest {
            if current.set_id != Some(set.id) {
                let policies = Policies::compile_stored(&set.rules).map_err(|e| {
                    Error::Internal(anyhow::anyhow!("stored policy set {}: {e}", set.id))
                })?;
                *current = Current {
                    set_id: Some(set.id),
                    policies: Arc::new(policies),
                };
            }
        }
        Ok(current.policies.clone())
    }

    /// The policies in force as last seen (when the store cannot be asked).
    pub fn current(&self) -> Arc<Policies> {
        self.inner.read().unwrap().policies.clone()
    }

    /// Puts a validated set in force on this node.
    pub fn replace(&self, set_id: uuid::Uuid, policies: Policies) {
        *self.inner.write().unwrap() = Current {
            set_id: Some(set_id),
            policies: Arc::new(policies),
        };
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
            kind: Default::default(),
        }
    }

    #[test]
    fn timeouts_answer_reject_once_or_cancel() {
        let r = request(json!([
            {"optionId": "a", "name": "A", "kind": "allow_once"},
            {"optionId": "r", "name": "R", "kind": "reject_once"}
        ]));
        let r_option = Answer::Option("r".into());
        assert_eq!(timeout_answer(&r, OnTimeout::Reject), r_option);
        assert_eq!(timeout_answer(&r, OnTimeout::Cancel), Answer::Cancelled);
        let only_allow = request(json!([{"optionId": "a", "name": "A", "kind": "allow_once"}]));
        assert_eq!(
            timeout_answer(&only_allow, OnTimeout::Reject),
            Answer::Cancelled
        );
    }

    #[test]
    fn verdicts_pick_once_options_unless_remembering() {
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
        let answer = |verdict| automatic_answer(&r, &verdict);
        use PermissionStatus::*;
        for (verdict, expected) in [
            (v(Action::Allow, "read-only", false), Some((Approved, "a1"))),
            (v(Action::Allow, "edits", true), Some((Approved, "aa"))),
            (
                v(Action::Allow, "remembered", false),
                Some((Approved, "aa")),
            ),
            (v(Action::Deny, "no rm", false), Some((Rejected, "r1"))),
            (v(Action::Deny, "remembered", false), Some((Rejected, "ra"))),
            (v(Action::Ask, "ask", false), None),
        ] {
            let expected = expected.map(|(status, option)| (status, Answer::Option(option.into())));
            assert_eq!(answer(verdict), expected);
        }
        let only_allow = request(json!([{"optionId": "a1", "name": "A", "kind": "allow_once"}]));
        assert_eq!(
            automatic_answer(&only_allow, &v(Action::Deny, "no rm", false)),
            Some((Rejected, Answer::Cancelled))
        );
        let only_always = request(json!([{"optionId": "aa", "name": "A", "kind": "allow_always"}]));
        assert_eq!(
            automatic_answer(&only_always, &v(Action::Allow, "read-only", false)),
            None
        );
    }
}
