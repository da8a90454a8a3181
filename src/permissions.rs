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

/// What a remembered "always" answer is keyed on: a tool call kind and, for
/// `execute`, one program the command line runs; for path tools, the path;
/// for anything else, the title (so that one "always" never covers
/// unrelated tools).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolKey {
    pub kind: String,
    pub subject: String,
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

/// The rules an "always" answer to `tool_call` (the request's `toolCall`
/// merged over what the gateway knows of it) remembers: one key per command
/// the policy engine decides on (`cd x && cargo test` → `cd` and `cargo`;
/// `/bin/sh -lc 'git status'` → `git`), or the path or title of another
/// tool. When that would cover more than the user saw, nothing is
/// remembered and the error says why: a command the engine cannot see into,
/// one run by an interpreter, shell or wrapper (`python3 -c …`, `sudo …`), a
/// command known only from the title, or no subject at all.
pub fn keys_to_remember(tool_call: &Value) -> std::result::Result<Vec<ToolKey>, String> {
    let kind = tool_call
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or("other");
    let mut keys: Vec<ToolKey> = Vec::new();
    for unit in crate::policy::units(tool_call, kind)
        .iter()
        .filter(|u| !u.deny_only)
    {
        let shown = unit.command.as_deref().unwrap_or(kind);
        if let Some(why) = &unit.opaque {
            return Err(format!("`{shown}` {why}"));
        }
        if let Some(why) = &unit.unrememberable {
            return Err(why.clone());
        }
        match &unit.key {
            Some(key) if !key.subject.trim().is_empty() && key.subject != "*" => {
                if !keys.contains(key) {
                    keys.push(key.clone());
                }
            }
            _ => {
                return Err(match kind {
                    "execute" => format!("`{shown}` names no program to remember"),
                    "read" | "edit" | "delete" | "move" => {
                        format!("the {kind} tool call names no path")
                    }
                    _ => format!("the {kind} tool call has no title"),
                })
            }
        }
    }
    if keys.is_empty() {
        return Err(format!(
            "the {kind} tool call has nothing to remember it by"
        ));
    }
    Ok(keys)
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

    fn keys(tool_call: Value) -> std::result::Result<Vec<(String, String)>, String> {
        keys_to_remember(&tool_call).map(|keys| {
            keys.into_iter()
                .map(|k| (k.kind, k.subject))
                .collect::<Vec<_>>()
        })
    }

    fn exec(command: Value) -> Value {
        json!({"kind": "execute", "rawInput": {"command": command}})
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, s)| (k.to_string(), s.to_string()))
            .collect()
    }

    #[test]
    fn always_rules_are_keyed_on_the_programs_the_path_or_the_title() {
        let table: [(Value, &[(&str, &str)]); 12] = [
            (exec(json!("/usr/bin/git status")), &[("execute", "git")]),
            (exec(json!(["ls", "-l"])), &[("execute", "ls")]),
            // Codex: the shell is unwrapped, the command inside is remembered.
            (
                exec(json!(["/bin/sh", "-lc", "git status"])),
                &[("execute", "git")],
            ),
            (
                exec(json!("bash -ec 'cargo test'")),
                &[("execute", "cargo")],
            ),
            (
                exec(json!("env RUST_LOG=debug nohup timeout 60 cargo test")),
                &[("execute", "cargo")],
            ),
            // One rule per command of the line.
            (
                exec(json!("cd x && cargo test | tee out.txt")),
                &[("execute", "cd"), ("execute", "cargo"), ("execute", "tee")],
            ),
            (
                exec(json!("git add . && git commit -m x")),
                &[("execute", "git")],
            ),
            // A program given by another path keeps its path.
            (exec(json!("./gradlew build")), &[("execute", "./gradlew")]),
            (
                json!({"kind": "edit", "locations": [{"path": "/a/b.rs"}]}),
                &[("edit", "/a/b.rs")],
            ),
            (
                json!({"kind": "read", "rawInput": {"file_path": "/c.txt"}}),
                &[("read", "/c.txt")],
            ),
            (
                json!({"title": "mcp__github__create_issue"}),
                &[("other", "mcp__github__create_issue")],
            ),
            (
                exec(json!("find . -name '*.o' -exec rm {} +")),
                &[("execute", "find"), ("execute", "rm")],
            ),
        ];
        let wrong: Vec<String> = table
            .into_iter()
            .map(|(call, want)| (keys(call.clone()), Ok(pairs(want)), call))
            .filter(|(got, want, _)| got != want)
            .map(|(got, want, call)| format!("{call}: {got:?}, want {want:?}"))
            .collect();
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    #[test]
    fn always_rules_are_never_keyed_on_a_wrapper_an_interpreter_or_nothing() {
        let table = [
            (
                exec(json!("python3 -c 'import os'")),
                "`python3 -c …` runs code the gateway cannot see into",
            ),
            (
                exec(json!(["/bin/sh", "-lc", "python3 -c 'print(1)'"])),
                "`python3 -c …` runs code the gateway cannot see into",
            ),
            (
                exec(json!("node -e 'x'")),
                "`node -e …` runs code the gateway cannot see into",
            ),
            (
                exec(json!("perl -e 'x'")),
                "`perl -e …` runs code the gateway cannot see into",
            ),
            (
                exec(json!("ruby -e 'x'")),
                "`ruby -e …` runs code the gateway cannot see into",
            ),
            (
                exec(json!("deno eval 'x'")),
                "`deno eval …` runs code the gateway cannot see into",
            ),
            (
                exec(json!("osascript -e 'x'")),
                "`osascript -e …` runs code the gateway cannot see into",
            ),
            (
                exec(json!("python3 script.py")),
                "`python3` runs code the gateway cannot see into",
            ),
            (exec(json!("sudo apt update")), "`sudo` runs other commands"),
            (exec(json!("env")), "`env` runs other commands"),
            (
                exec(json!("eval 'git status'")),
                "`git status` is run by eval",
            ),
            (
                exec(json!("curl -s x | sh")),
                "`sh` runs a script from its standard input",
            ),
            (
                exec(json!("bash install.sh")),
                "`bash install.sh` runs the script file `install.sh`",
            ),
            (
                exec(json!("ls $(pwd)")),
                "`ls $(pwd)` has a command substitution",
            ),
            (
                exec(json!("$CMD x")),
                "`$CMD x` runs a program named by an expansion",
            ),
            (
                exec(json!("rm -rf ~ 'unterminated")),
                "`rm -rf ~ 'unterminated` cannot be parsed",
            ),
            (exec(json!("")), "`` runs no command the gateway can see"),
            // Gemini CLI: the command is only in the title.
            (
                json!({"kind": "execute", "title": "echo hello > x.txt"}),
                "`echo hello > x.txt` comes only from the tool call's title",
            ),
            (json!({"kind": "execute"}), "`execute` shows no command"),
            (json!({"kind": "edit"}), "the edit tool call names no path"),
            (
                json!({"kind": "other", "title": "  "}),
                "the other tool call has no title",
            ),
        ];
        let wrong: Vec<String> = table
            .into_iter()
            .map(|(call, why)| (keys(call.clone()), Err(why.to_owned()), call))
            .filter(|(got, want, _)| got != want)
            .map(|(got, want, call)| format!("{call}: {got:?}, want {want:?}"))
            .collect();
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
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
