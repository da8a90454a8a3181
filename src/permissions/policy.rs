//! Operator auto-approve policies: one engine for every agent.
//!
//! Rules are evaluated in order and the first that matches decides (`allow`,
//! `deny` or `ask`); nothing matching means `ask`. What a rule can look at:
//! the agent profile, the tool call's `kind`, its shell command (for
//! `execute`) and its paths (`locations` and path arguments). Evaluation is a
//! pure function of the rules, the tool call, the conversation's remembered
//! "always" rules and a per-conversation rate limiter, so the dry run
//! (`POST /api/v1/policies/evaluate`) and the live path agree by
//! construction.
//!
//! Safety properties the matcher keeps:
//! - a shell line is parsed as bash parses it ([`super::shell`]) into every
//!   command it runs, wrappers (`sh -c`, `env`, `sudo`, `nohup`, `xargs`, …)
//!   unwrapped; every command must be allowed for the line to be allowed, and
//!   any denied command (or wrapper) denies the line;
//! - what the engine cannot see into (a line that does not parse, a
//!   substitution, `$CMD args`, `eval`, a script fed to a shell, a command
//!   known only from the tool call's title) is never allowed without a
//!   person, not even in trusted mode, though deny rules still apply to what
//!   is visible;
//! - paths are normalised (`.`, `..`, repeated slashes, relative to the
//!   conversation's cwd) before matching, and an `allow` rule with `paths`
//!   matches only when every path of the tool call is inside its globs;
//! - a `deny` rule beats everything, including remembered answers and the
//!   profile's `mode`.

use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::time::Instant;

use super::shell;
use crate::model::{PolicyRule, RateLimit, Rule};
use crate::ratelimit::SlidingWindow;

pub use crate::model::Action;

/// A profile's shortcut over the rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// The rules decide; what they do not cover asks a person.
    #[default]
    Ask,
    /// Every edit, delete, move and execute is denied.
    ReadOnly,
    /// Everything a rule does not deny is allowed.
    Trusted,
}

/// A rule with its regexes compiled.
#[derive(Debug, Clone)]
struct Compiled {
    rule: PolicyRule,
    commands: Vec<regex::Regex>,
}

/// A validated, ordered list of rules.
#[derive(Debug, Clone, Default)]
pub struct Policies {
    rules: Vec<Compiled>,
}

impl Policies {
    /// Checks and compiles rules; the error names the rule and the field.
    pub fn compile(rules: &[PolicyRule]) -> Result<Policies, String> {
        let mut names = std::collections::HashSet::new();
        let mut compiled = Vec::with_capacity(rules.len());
        for (i, rule) in rules.iter().enumerate() {
            let at = format!("policies[{i}] ({:?})", rule.name);
            if rule.name.trim().is_empty() {
                return Err(format!("policies[{i}].name: must not be empty"));
            }
            if !names.insert(rule.name.as_str()) {
                return Err(format!("{at}.name: used by an earlier rule"));
            }
            if rule.agents.is_empty() {
                return Err(format!("{at}.agents: name at least one agent, or \"*\""));
            }
            let mut commands = Vec::new();
            for (j, pattern) in rule.commands.iter().enumerate() {
                let re = regex::Regex::new(pattern)
                    .map_err(|e| format!("{at}.commands[{j}]: invalid regex: {e}"))?;
                commands.push(re);
            }
            for (j, glob) in rule.paths.iter().enumerate() {
                glob_matcher(glob, Path::new("/cwd"))
                    .map_err(|e| format!("{at}.paths[{j}]: invalid glob: {e}"))?;
            }
            if let Some(limit) = &rule.max_auto_per {
                if limit.count == 0 || limit.window.is_zero() {
                    return Err(format!(
                        "{at}.max_auto_per: count and window must be positive"
                    ));
                }
                if rule.decision != Action::Allow {
                    return Err(format!(
                        "{at}.max_auto_per: only allow rules are rate limited"
                    ));
                }
            }
            if rule.remember && rule.decision != Action::Allow {
                return Err(format!("{at}.remember: only allow rules can remember"));
            }
            compiled.push(Compiled {
                rule: rule.clone(),
                commands,
            });
        }
        Ok(Policies { rules: compiled })
    }

    pub fn rules(&self) -> Vec<PolicyRule> {
        self.rules.iter().map(|c| c.rule.clone()).collect()
    }
}

fn glob_matcher(glob: &str, cwd: &Path) -> Result<globset::GlobMatcher, globset::Error> {
    let cwd = globset::escape(&cwd.to_string_lossy());
    let glob = glob.replace("{cwd}", &cwd);
    Ok(globset::GlobBuilder::new(&glob)
        .literal_separator(true)
        .build()?
        .compile_matcher())
}

/// What a tool call is, as far as the rules care.
#[derive(Debug)]
pub struct Facts<'a> {
    pub agent: &'a str,
    /// The request's `toolCall` merged over what the gateway knows of it.
    pub tool_call: &'a Value,
    pub cwd: &'a Path,
    pub mode: Mode,
    /// The tool call's paths as they really are (symlinks resolved, by the
    /// caller: this engine touches no file system), or none when not known.
    /// A deny matching the given paths or these denies; allowing needs both.
    pub real_paths: &'a [PathBuf],
}

/// The outcome of evaluating a tool call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Verdict {
    pub decision: Action,
    /// The rule that decided (`remembered`, `mode:read_only`, `mode:trusted`
    /// for the built-in ones), or none when nothing matched.
    pub rule: Option<String>,
    /// Answer with `allow_always` rather than `allow_once`.
    #[serde(skip)]
    pub remember: bool,
    /// Why, in words, for the decision's `reason`.
    #[serde(skip)]
    pub reason: String,
    /// Allow rules with a rate limit that this verdict uses, with their window.
    #[serde(skip)]
    limited: Vec<(String, Duration)>,
}

/// Per-conversation counts of automatic approvals, for `max_auto_per`.
#[derive(Debug, Default)]
pub struct RateLimiter {
    hits: SlidingWindow<String>,
}

impl RateLimiter {
    fn exhausted(&self, rule: &str, limit: &RateLimit, now: Instant) -> bool {
        self.hits
            .wait(rule, limit.count, limit.window, now)
            .is_some()
    }

    /// Counts an automatic approval that `verdict` made.
    pub fn record(&mut self, verdict: &Verdict, now: Instant) {
        for (rule, window) in &verdict.limited {
            self.hits.hit(rule.clone(), *window, now);
        }
    }
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
    for unit in units(tool_call, kind).iter().filter(|u| !u.deny_only) {
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

/// One thing to decide: a whole tool call, or one part of a shell line.
#[derive(Debug)]
pub(crate) struct Unit {
    /// The command part as the rules' regexes see it (execute only).
    pub(crate) command: Option<String>,
    /// Other forms of it that deny rules also see (the program's basename;
    /// for text that did not parse, every run of its words).
    pub(crate) also: Vec<String>,
    /// What a remembered rule for it is keyed on; `None`: it is never
    /// remembered, and no remembered rule matches it.
    pub(crate) key: Option<ToolKey>,
    /// Why it is never allowed without a person (the engine cannot see into
    /// it); deny rules still apply.
    pub(crate) opaque: Option<String>,
    /// A wrapper around other units: only deny rules look at it.
    pub(crate) deny_only: bool,
    /// Why no remembered rule may be keyed on it.
    pub(crate) unrememberable: Option<String>,
}

const WRITE_KINDS: [&str; 4] = ["edit", "delete", "move", "execute"];

impl Policies {
    /// Decides a tool call. `remembered` are the conversation's "always"
    /// rules; `limiter` is `None` for a dry run. With real paths known the
    /// call is decided on the paths as given and as they really are, and
    /// the stricter verdict wins: a symlink can neither hide a path from a
    /// deny nor bring one under an allow.
    pub fn evaluate(
        &self,
        facts: &Facts<'_>,
        remembered: &[Rule],
        limiter: Option<&RateLimiter>,
        now: Instant,
    ) -> Verdict {
        let given = tool_paths(facts.tool_call, facts.cwd);
        let as_given = self.evaluate_paths(facts, &given, remembered, limiter, now);
        let mut real: Vec<PathBuf> = facts
            .real_paths
            .iter()
            .map(|p| normalize(facts.cwd, p))
            .collect();
        real.sort();
        real.dedup();
        if real.is_empty() || real == given {
            return as_given;
        }
        let as_real = self.evaluate_paths(facts, &real, remembered, limiter, now);
        stricter(as_given, as_real)
    }

    fn evaluate_paths(
        &self,
        facts: &Facts<'_>,
        paths: &[PathBuf],
        remembered: &[Rule],
        limiter: Option<&RateLimiter>,
        now: Instant,
    ) -> Verdict {
        let kind = facts
            .tool_call
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or("other");
        let units = units(facts.tool_call, kind);
        let mut allowed_by: Vec<String> = Vec::new();
        let mut limited: Vec<(String, Duration)> = Vec::new();
        let mut asked: Option<Verdict> = None;
        let mut remember = false;
        for unit in &units {
            let op = self.first_match(facts, kind, unit.command.as_deref(), paths);
            let denied = std::iter::once(op)
                .chain(
                    unit.also
                        .iter()
                        .map(|also| self.first_match(facts, kind, Some(also), paths)),
                )
                .flatten()
                .find(|r| r.rule.decision == Action::Deny);
            if let Some(rule) = denied {
                return verdict(
                    Action::Deny,
                    Some(&rule.rule.name),
                    describe(unit, "denied"),
                );
            }
            if unit.deny_only {
                continue;
            }
            let remembered_rule = unit.key.as_ref().and_then(|key| {
                remembered.iter().find(|r| {
                    !r.subject.trim().is_empty()
                        && r.tool_kind == key.kind
                        && r.subject == key.subject
                })
            });
            if let Some(rule) = remembered_rule {
                if rule.option_kind == "reject_always" {
                    return verdict(
                        Action::Deny,
                        Some("remembered"),
                        describe(unit, "rejected before, always"),
                    );
                }
                if unit.opaque.is_none() {
                    allowed_by.push("remembered".into());
                    continue;
                }
            }
            let unit_verdict = match (op, &unit.opaque) {
                (Some(c), None) if c.rule.decision == Action::Allow => {
                    match (&c.rule.max_auto_per, limiter) {
                        (Some(limit), Some(l)) if l.exhausted(&c.rule.name, limit, now) => verdict(
                            Action::Ask,
                            Some(&c.rule.name),
                            format!(
                                "rule {:?} reached its limit of {} automatic approvals",
                                c.rule.name, limit.count
                            ),
                        ),
                        _ => {
                            if let Some(limit) = &c.rule.max_auto_per {
                                limited.push((c.rule.name.clone(), limit.window));
                            }
                            remember |= c.rule.remember;
                            allowed_by.push(c.rule.name.clone());
                            continue;
                        }
                    }
                }
                (c, Some(why)) => verdict(
                    Action::Ask,
                    c.map(|c| c.rule.name.as_str()),
                    describe(unit, why),
                ),
                (Some(c), None) => verdict(
                    Action::Ask,
                    Some(&c.rule.name),
                    describe(unit, "asks a person"),
                ),
                (None, None) => verdict(Action::Ask, None, describe(unit, "matches no rule")),
            };
            asked.get_or_insert(unit_verdict);
        }
        // What the engine cannot see into is never allowed without a person,
        // not even in trusted mode.
        let unseen = units.iter().find(|u| !u.deny_only && u.opaque.is_some());
        let mut result = match asked {
            Some(ask) => ask,
            None => {
                allowed_by.dedup();
                let names = allowed_by.join(", ");
                let mut v = verdict(Action::Allow, Some(&names), format!("allowed by {names}"));
                v.remember = remember;
                v.limited = limited;
                v
            }
        };
        match facts.mode {
            Mode::ReadOnly if WRITE_KINDS.contains(&kind) => {
                result = verdict(
                    Action::Deny,
                    Some("mode:read_only"),
                    format!("{kind} is not allowed in read-only mode"),
                );
            }
            Mode::Trusted if result.decision == Action::Ask && unseen.is_some() => {
                let unit = unseen.expect("checked");
                let why = unit.opaque.as_deref().unwrap_or_default();
                result = verdict(
                    Action::Ask,
                    None,
                    describe(unit, &format!("{why}: even trusted mode asks a person")),
                );
            }
            Mode::Trusted if result.decision == Action::Ask => {
                result = verdict(
                    Action::Allow,
                    Some("mode:trusted"),
                    "trusted mode allows what no rule denies".into(),
                );
            }
            _ => {}
        }
        result
    }

    fn first_match(
        &self,
        facts: &Facts<'_>,
        kind: &str,
        command: Option<&str>,
        paths: &[PathBuf],
    ) -> Option<&Compiled> {
        self.rules.iter().find(|c| {
            let rule = &c.rule;
            let agent_ok = rule.agents.iter().any(|a| a == "*" || a == facts.agent);
            let kind_ok = rule.kinds.is_empty() || rule.kinds.iter().any(|k| k == kind);
            let command_ok = c.commands.is_empty()
                || command.is_some_and(|cmd| c.commands.iter().any(|re| re.is_match(cmd)));
            agent_ok && kind_ok && command_ok && paths_ok(rule, paths, facts.cwd)
        })
    }
}

fn paths_ok(rule: &PolicyRule, paths: &[PathBuf], cwd: &Path) -> bool {
    if rule.paths.is_empty() {
        return true;
    }
    let cwd = normalize(cwd, Path::new("."));
    let globs: Vec<_> = rule
        .paths
        .iter()
        .filter_map(|g| glob_matcher(g, &cwd).ok())
        .collect();
    let inside = |p: &PathBuf| globs.iter().any(|g| g.is_match(p));
    match rule.decision {
        // Allowing needs every path inside; one outside is not covered.
        Action::Allow => !paths.is_empty() && paths.iter().all(inside),
        Action::Deny | Action::Ask => paths.iter().any(inside),
    }
}

/// Of a verdict on the paths as given and one on the paths as they really
/// are, the stricter (deny, then ask, then allow); two allows count every
/// rate limit either used and remember only if both would.
fn stricter(given: Verdict, real: Verdict) -> Verdict {
    let weight = |a: Action| match a {
        Action::Deny => 2,
        Action::Ask => 1,
        Action::Allow => 0,
    };
    if weight(real.decision) > weight(given.decision) {
        let reason = format!("{} (its paths as resolved, symlinks followed)", real.reason);
        return Verdict { reason, ..real };
    }
    let mut given = given;
    if given.decision == Action::Allow && real.decision == Action::Allow {
        given.remember &= real.remember;
        for limit in real.limited {
            if !given.limited.contains(&limit) {
                given.limited.push(limit);
            }
        }
    }
    given
}

fn verdict(decision: Action, rule: Option<&str>, reason: String) -> Verdict {
    Verdict::new(decision, rule, reason)
}

impl Verdict {
    pub fn new(decision: Action, rule: Option<&str>, reason: String) -> Verdict {
        Verdict {
            decision,
            rule: rule.map(str::to_owned),
            remember: false,
            reason,
            limited: Vec::new(),
        }
    }
}

fn describe(unit: &Unit, what: &str) -> String {
    match (&unit.command, &unit.key) {
        (Some(cmd), _) => format!("`{cmd}` {what}"),
        (None, Some(key)) => format!("{} {what}", key.kind),
        (None, None) => format!("the tool call {what}"),
    }
}

/// Every path a tool call touches, normalised against `cwd`.
pub fn tool_paths(tool_call: &Value, cwd: &Path) -> Vec<PathBuf> {
    let mut raw: Vec<&str> = Vec::new();
    if let Some(locations) = tool_call.get("locations").and_then(Value::as_array) {
        raw.extend(locations.iter().filter_map(|l| l.get("path")?.as_str()));
    }
    if let Some(input) = tool_call.get("rawInput").and_then(Value::as_object) {
        for key in [
            "path",
            "file_path",
            "filePath",
            "abs_path",
            "source",
            "destination",
            "target",
            "old_path",
            "new_path",
            "from",
            "to",
        ] {
            if let Some(p) = input.get(key).and_then(Value::as_str) {
                raw.push(p);
            }
        }
        if let Some(list) = input.get("paths").and_then(Value::as_array) {
            raw.extend(list.iter().filter_map(Value::as_str));
        }
    }
    let mut paths: Vec<PathBuf> = raw
        .into_iter()
        .map(|p| normalize(cwd, Path::new(p)))
        .collect();
    paths.sort();
    paths.dedup();
    paths
}

/// Lexical normalisation: absolute, no `.`, no `..` (never above `/`), no
/// repeated slashes. Symlinks are not resolved: the agent has not touched the
/// path yet.
pub fn normalize(cwd: &Path, path: &Path) -> PathBuf {
    let joined = if path.is_absolute() {
        path.to_path_buf()
    } else {
        cwd.join(path)
    };
    let mut out = PathBuf::from("/");
    for component in joined.components() {
        match component {
            Component::Normal(part) => out.push(part),
            Component::ParentDir => {
                out.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

/// Splits what a tool call runs into the units the rules decide on: the
/// whole tool call, or for `execute` every part of its command line (see
/// [`super::shell`]).
pub(crate) fn units(tool_call: &Value, kind: &str) -> Vec<Unit> {
    if kind != "execute" {
        let subject = subject(tool_call, kind);
        return vec![Unit {
            command: None,
            also: Vec::new(),
            key: (!subject.trim().is_empty()).then(|| ToolKey {
                kind: kind.to_owned(),
                subject,
            }),
            opaque: None,
            deny_only: false,
            unrememberable: None,
        }];
    }
    let command = tool_call
        .get("rawInput")
        .and_then(|i| i.get("command").or_else(|| i.get("cmd")));
    let title = tool_call
        .get("title")
        .and_then(Value::as_str)
        .filter(|t| !t.trim().is_empty());
    let (line, parts, from_title) = match (command, title) {
        (Some(Value::String(line)), _) => (line.clone(), shell::parse_line(line), false),
        (Some(Value::Array(argv)), _) => {
            let words: Option<Vec<&str>> = argv.iter().map(Value::as_str).collect();
            match words {
                Some(words) => (words.join(" "), shell::parse_argv(&words), false),
                None => {
                    return vec![opaque_unit(
                        Some(Value::Array(argv.clone()).to_string()),
                        "is not a list of words",
                    )]
                }
            }
        }
        // Gemini CLI sends no rawInput: the title is the command line.
        (None, Some(title)) => (title.to_owned(), shell::parse_line(title), true),
        (Some(other), _) => {
            return vec![opaque_unit(
                Some(other.to_string()),
                "is not a command line",
            )]
        }
        (None, None) => return vec![opaque_unit(None, "shows no command")],
    };
    let mut units: Vec<Unit> = parts
        .into_iter()
        .map(|part| {
            let key = (!from_title && part.unrememberable.is_none() && !part.program.is_empty())
                .then(|| ToolKey {
                    kind: "execute".into(),
                    subject: part.program.clone(),
                });
            let opaque = match from_title {
                true => part.opaque.or_else(|| Some(TITLE_ONLY.into())),
                false => part.opaque,
            };
            Unit {
                command: Some(part.text),
                also: part.also,
                key,
                opaque,
                deny_only: part.wrapper,
                unrememberable: part.unrememberable,
            }
        })
        .collect();
    if !units.iter().any(|u| !u.deny_only) {
        units.push(opaque_unit(
            Some(line.trim().to_owned()),
            "runs no command the gateway can see",
        ));
    }
    units
}

/// Why a command taken from a title is never allowed automatically.
const TITLE_ONLY: &str = "comes only from the tool call's title";

fn opaque_unit(command: Option<String>, reason: &str) -> Unit {
    Unit {
        command,
        also: Vec::new(),
        key: None,
        opaque: Some(reason.into()),
        deny_only: false,
        unrememberable: None,
    }
}

#[cfg(test)]
mod remembered_keys {
    use super::*;
    use serde_json::json;

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
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The rules of the issue's example, in its order.
    fn example() -> Policies {
        let rules: Vec<PolicyRule> = toml::from_str::<toml::Value>(
            r#"
            [[policies]]
            name = "read-only tools"
            kinds = ["read", "search", "think", "fetch"]
            decision = "allow"
            [[policies]]
            name = "no destructive shell"
            kinds = ["execute"]
            commands = ['^rm\s+-rf\b', '^git\s+push\s+.*--force']
            decision = "deny"
            [[policies]]
            name = "safe shell"
            kinds = ["execute"]
            commands = ['^ls\b', '^git\s+(status|log|diff)\b', '^cat\b']
            decision = "allow"
            [[policies]]
            name = "edits inside the workspace"
            kinds = ["edit", "delete", "move"]
            paths = ["{cwd}/**"]
            decision = "allow"
            max_auto_per = { count = 2, window = "15m" }
            "#,
        )
        .unwrap()["policies"]
            .clone()
            .try_into()
            .unwrap();
        Policies::compile(&rules).unwrap()
    }

    fn decide(p: &Policies, tool_call: Value) -> (Action, Option<String>) {
        decide_as(p, "claude", Mode::Ask, tool_call)
    }

    fn decide_as(
        p: &Policies,
        agent: &str,
        mode: Mode,
        tool_call: Value,
    ) -> (Action, Option<String>) {
        let facts = Facts {
            agent,
            tool_call: &tool_call,
            cwd: Path::new("/srv/work"),
            mode,
            real_paths: &[],
        };
        let v = p.evaluate(&facts, &[], Some(&RateLimiter::default()), Instant::now());
        (v.decision, v.rule)
    }

    fn exec(cmd: &str) -> Value {
        json!({"kind": "execute", "rawInput": {"command": cmd}})
    }

    fn edit(path: &str) -> Value {
        json!({"kind": "edit", "locations": [{"path": path}]})
    }

    use Action::*;

    #[test]
    fn kinds_decide_in_rule_order_and_nothing_matching_asks() {
        let p = example();
        let table = [
            (
                json!({"kind": "read", "locations": [{"path": "/etc/passwd"}]}),
                Allow,
                Some("read-only tools"),
            ),
            (json!({"kind": "search"}), Allow, Some("read-only tools")),
            (
                json!({"kind": "fetch", "rawInput": {"url": "https://x"}}),
                Allow,
                Some("read-only tools"),
            ),
            (json!({"kind": "other", "title": "mcp__x__y"}), Ask, None),
            (json!({"title": "no kind at all"}), Ask, None),
            (json!({"kind": "switch_mode"}), Ask, None),
        ];
        for (call, decision, rule) in table {
            assert_eq!(
                decide(&p, call.clone()),
                (decision, rule.map(str::to_owned)),
                "{call}"
            );
        }
    }

    #[test]
    fn globs_see_normalised_paths_and_never_allow_an_escape() {
        let p = example();
        let table = [
            ("/srv/work/src/main.rs", Allow),
            ("src/main.rs", Allow),
            ("./src/../src/lib.rs", Allow),
            ("/srv/work//a///b.rs", Allow),
            ("/srv/work/../etc/passwd", Ask),
            ("../../etc/passwd", Ask),
            ("/srv/work/src/../../../etc/shadow", Ask),
            ("/srv/workshop/x", Ask),
            ("/etc/hosts", Ask),
        ];
        for (path, decision) in table {
            assert_eq!(decide(&p, edit(path)).0, decision, "{path}");
        }
        // Every path must be inside: a move out of the workspace is not covered.
        let out =
            json!({"kind": "move", "rawInput": {"source": "/srv/work/a", "destination": "/tmp/a"}});
        assert_eq!(decide(&p, out).0, Ask);
        let inside =
            json!({"kind": "move", "rawInput": {"source": "/srv/work/a", "destination": "b/a"}});
        assert_eq!(decide(&p, inside).0, Allow);
        // No path at all: an allow rule with paths does not cover it.
        assert_eq!(decide(&p, json!({"kind": "edit"})).0, Ask);
        assert_eq!(
            normalize(Path::new("/a/b"), Path::new("../../../x")),
            PathBuf::from("/x")
        );
    }

    #[test]
    fn real_paths_are_judged_too_and_the_stricter_verdict_wins() {
        let rules: Vec<PolicyRule> = serde_json::from_value(json!([
            {"name": "docs ask", "agents": ["*"], "kinds": ["edit"],
             "paths": ["{cwd}/docs/**"], "decision": "ask"},
            {"name": "no secrets", "agents": ["*"], "paths": ["{cwd}/secret/**"],
             "decision": "deny"},
            {"name": "no etc", "agents": ["*"], "paths": ["/etc/**"], "decision": "deny"},
            {"name": "workspace", "agents": ["*"], "kinds": ["edit", "read"],
             "paths": ["{cwd}/**"], "decision": "allow", "remember": true},
        ]))
        .unwrap();
        let p = Policies::compile(&rules).unwrap();
        let decide_real = |call: Value, real: &[&str]| {
            let real: Vec<PathBuf> = real.iter().map(PathBuf::from).collect();
            let facts = Facts {
                agent: "claude",
                tool_call: &call,
                cwd: Path::new("/srv/work"),
                mode: Mode::Ask,
                real_paths: &real,
            };
            p.evaluate(&facts, &[], None, Instant::now())
        };
        // A link inside the cwd to secret/: denied through either form.
        let v = decide_real(edit("/srv/work/link/key"), &["/srv/work/secret/key"]);
        assert_eq!((v.decision, v.rule.as_deref()), (Deny, Some("no secrets")));
        assert!(v.reason.contains("as resolved"), "{}", v.reason);
        let v = decide_real(edit("/srv/work/secret/key"), &["/srv/work/public/key"]);
        assert_eq!((v.decision, v.rule.as_deref()), (Deny, Some("no secrets")));
        // An ask rule matching one form does not hide a deny on the other.
        let v = decide_real(edit("/srv/work/secret/a"), &["/srv/work/docs/a"]);
        assert_eq!(v.decision, Deny, "{v:?}");
        let v = decide_real(edit("/srv/work/docs/a"), &["/srv/work/secret/a"]);
        assert_eq!(v.decision, Deny, "{v:?}");
        // A link out of the cwd: an allow on the cwd no longer covers it.
        let v = decide_real(edit("/srv/work/out/hosts"), &["/etc/hosts"]);
        assert_eq!((v.decision, v.rule.as_deref()), (Deny, Some("no etc")));
        let v = decide_real(edit("/srv/work/out/x"), &["/var/x"]);
        assert_eq!(v.decision, Ask, "{v:?}");
        // Nor does a link into the cwd bring an outside path under it.
        let v = decide_real(edit("/var/x"), &["/srv/work/x"]);
        assert_eq!(v.decision, Ask, "{v:?}");
        // Both allowed: allowed, remembered only as the given form would be.
        let v = decide_real(edit("/srv/work/a.rs"), &["/srv/work/src/a.rs"]);
        assert_eq!((v.decision, v.remember), (Allow, true), "{v:?}");
        // The same paths, or none known: as before.
        let v = decide_real(edit("/srv/work/secret/../a.rs"), &["/srv/work/a.rs"]);
        assert_eq!(v.decision, Allow, "{v:?}");
        assert_eq!(decide_real(edit("/srv/work/link/key"), &[]).decision, Allow);
    }

    #[test]
    fn every_part_of_a_shell_line_must_be_allowed_and_any_denied_part_denies() {
        let p = example();
        let table = [
            ("ls -la", Allow, Some("safe shell")),
            ("ls; rm -rf /", Deny, Some("no destructive shell")),
            ("ls && rm -rf /", Deny, Some("no destructive shell")),
            ("ls || rm -rf build", Deny, Some("no destructive shell")),
            ("cat x | rm -rf /", Deny, Some("no destructive shell")),
            ("ls\nrm -rf /", Deny, Some("no destructive shell")),
            ("ls & rm -rf /", Deny, Some("no destructive shell")),
            ("ls && git status", Allow, Some("safe shell")),
            ("ls; make install", Ask, None),
            (
                "git push origin main --force",
                Deny,
                Some("no destructive shell"),
            ),
            ("git push origin main", Ask, None),
            ("echo hi", Ask, None),
        ];
        for (cmd, decision, rule) in table {
            assert_eq!(
                decide(&p, exec(cmd)),
                (decision, rule.map(str::to_owned)),
                "{cmd}"
            );
        }
    }

    #[test]
    fn quoting_wrapping_and_substitution_do_not_hide_a_command() {
        let p = example();
        let table = [
            (r#"rm -rf "/""#, Deny),
            (r#""rm" -rf /"#, Deny),
            (r#"'rm' '-rf' '/'"#, Deny),
            (r"r\m -rf /", Deny),
            ("rm  -rf   /", Deny),
            (r#"bash -c "rm -rf /""#, Deny),
            (r#"sh -c 'ls; rm -rf /'"#, Deny),
            (r#"/bin/bash -c 'ls'"#, Allow),
            ("ls $(rm -rf /)", Deny),
            ("ls `rm -rf /`", Deny),
            (r#"ls "$(whoami)""#, Ask),
            ("ls $(echo .)", Ask),
            ("echo 'a; rm -rf /'", Ask),
            (r#"ls "a && b""#, Allow),
        ];
        for (cmd, decision) in table {
            assert_eq!(decide(&p, exec(cmd)).0, decision, "{cmd}");
        }
        // An argv array is one command, its words quoted as needed.
        let argv = json!({"kind": "execute", "rawInput": {"command": ["rm", "-rf", "/"]}});
        assert_eq!(decide(&p, argv).0, Deny);
        let argv = json!({"kind": "execute", "rawInput": {"command": ["ls", "a; rm -rf /"]}});
        assert_eq!(decide(&p, argv).0, Allow);
    }

    fn argv(words: &[&str]) -> Value {
        json!({"kind": "execute", "rawInput": {"command": words}})
    }

    /// A Gemini CLI request: no rawInput, the command only in the title.
    fn titled(title: &str) -> Value {
        json!({"kind": "execute", "title": title})
    }

    /// Every way of writing `rm -rf ~` the issue lists, and more.
    const HIDDEN_RM: &[&str] = &[
        "rm -rf ~",
        "bash -ec 'rm -rf ~'",
        "bash --login -c 'rm -rf ~'",
        "sh -xc 'rm -rf ~'",
        "/bin/sh -lc 'rm -rf ~'",
        "bash -o pipefail -c 'rm -rf ~'",
        "zsh -c 'rm -rf ~'",
        "env FOO=1 rm -rf ~",
        "env -i rm -rf ~",
        "env -u HOME rm -rf ~",
        "env -- rm -rf ~",
        "env -S 'rm -rf ~'",
        "FOO=1 rm -rf ~",
        "/bin/rm -rf ~",
        "/usr/bin/rm -rf ~",
        "/usr//bin/../bin/rm -rf ~",
        "./rm -rf ~",
        "sudo rm -rf ~",
        "sudo -u root rm -rf ~",
        "sudo -E -u root -- rm -rf ~",
        "doas rm -rf ~",
        "su -c 'rm -rf ~'",
        "su root -c 'rm -rf ~'",
        "nohup rm -rf ~",
        "nice -n 5 rm -rf ~",
        "nice -5 rm -rf ~",
        "ionice -c 3 rm -rf ~",
        "timeout 5 rm -rf ~",
        "timeout -s KILL 5 rm -rf ~",
        "timeout --signal=KILL -k 1 5s rm -rf ~",
        "time rm -rf ~",
        "time -p rm -rf ~",
        "/usr/bin/time -v rm -rf ~",
        "command rm -rf ~",
        "builtin command rm -rf ~",
        "exec rm -rf ~",
        "exec -a x rm -rf ~",
        "echo ~ | xargs rm -rf",
        "xargs -0 rm -rf",
        "xargs -n 1 -P 4 rm -rf",
        "xargs -I{} rm -rf {}",
        "stdbuf -oL rm -rf ~",
        "stdbuf -o L rm -rf ~",
        "setsid rm -rf ~",
        "flock /tmp/l rm -rf ~",
        "flock /tmp/l -c 'rm -rf ~'",
        "chroot / rm -rf ~",
        "unbuffer rm -rf ~",
        "watch -n 1 rm -rf ~",
        "busybox rm -rf ~",
        "find . -exec rm -rf {} +",
        "find . -name x -execdir rm -rf {} \\;",
        "eval 'rm -rf ~'",
        "eval rm -rf '~'",
        "trap 'rm -rf ~' EXIT",
        "sudo env X=1 nohup bash -lc \"rm -rf ~\"",
        "env FOO=1 env FOO=1 sudo -E -- FOO=1 rm -rf ~ &",
        "busybox flock /tmp/l su root -c 'rm -rf   ~'",
        "xargs FOO=1 rm -rf ~",
        "env FOO=1 echo $( case x in *) \\rm -rf ~;; esac ) &",
        "env nice -n 1 timeout 5 sudo -u me sh -c 'nohup rm -rf ~ &'",
        "(rm -rf ~)",
        "{ rm -rf ~; }",
        "( (rm -rf ~) )",
        "((rm -rf ~))",
        "if true; then rm -rf ~; fi",
        "if false; then :; else rm -rf ~; fi",
        "for f in a; do rm -rf ~; done",
        "while true; do rm -rf ~; done",
        "until false; do rm -rf ~; done",
        "case x in x) rm -rf ~;; esac",
        "f() { rm -rf ~; }; f",
        "function f { rm -rf ~; }",
        "coproc rm -rf ~",
        "! rm -rf ~",
        "true && rm -rf ~",
        "false || rm -rf ~",
        "ls; rm -rf ~",
        "ls & rm -rf ~",
        "ls | rm -rf ~",
        "ls\nrm -rf ~",
        "bash <<EOF\nrm -rf ~\nEOF",
        "sh <<'EOF'\nrm -rf ~\nEOF",
        "bash <<< 'rm -rf ~'",
        "$(rm -rf ~)",
        "echo $(rm -rf ~)",
        "echo \"$(rm -rf ~)\"",
        "echo `rm -rf ~`",
        "echo $(echo $(rm -rf ~))",
        "echo ${X:-$(rm -rf ~)}",
        "echo $((1 + $(rm -rf ~)))",
        "X=$(rm -rf ~)",
        "ls > $(rm -rf ~)",
        "cat <(rm -rf ~)",
        "cat < <(rm -rf ~)",
        "tee >(rm -rf ~)",
        "[[ -n $(rm -rf ~) ]]",
        "cat <<EOF\n$(rm -rf ~)\nEOF",
        "r''m -rf ~",
        "\"rm\" -rf ~",
        "'rm' '-rf' '~'",
        "\\rm -rf ~",
        "r\\m -rf ~",
        "$'\\x72m' -rf ~",
        "$'\\162m' -rf ~",
        "rm  -rf   ~",
        "rm -rf ~ 'unterminated",
        "rm -rf ~ \"unterminated",
        "rm -rf ~ $(unterminated",
    ];

    #[test]
    fn wrappers_quoting_and_nesting_never_hide_a_denied_command() {
        let p = example();
        let mut missed = Vec::new();
        for line in HIDDEN_RM {
            // As a command line, and as Codex sends it.
            for call in [exec(line), argv(&["/bin/sh", "-lc", line])] {
                for mode in [Mode::Ask, Mode::Trusted] {
                    let got = decide_as(&p, "codex", mode, call.clone());
                    if got != (Deny, Some("no destructive shell".into())) {
                        missed.push(format!("{call} ({mode:?}): {got:?}"));
                    }
                }
            }
        }
        assert!(missed.is_empty(), "not denied:\n{}", missed.join("\n"));
        for words in [
            &["/bin/rm", "-rf", "~"][..],
            &["env", "X=1", "rm", "-rf", "~"],
            &["sudo", "-u", "root", "/bin/rm", "-rf", "~"],
            &["bash", "-ec", "rm -rf ~"],
            &["xargs", "-0", "rm", "-rf"],
        ] {
            assert_eq!(decide(&p, argv(words)).0, Deny, "{words:?}");
        }
        // Gemini CLI: the title is the command line, and deny rules see it.
        for line in ["rm -rf ~", "bash -lc 'rm -rf ~'", "ls && sudo rm -rf ~"] {
            for mode in [Mode::Ask, Mode::Trusted] {
                assert_eq!(
                    decide_as(&p, "gemini", mode, titled(line)).0,
                    Deny,
                    "{line}"
                );
            }
        }
    }

    #[test]
    fn unwrapped_commands_are_allowed_when_every_part_is() {
        let p = example();
        let table = [
            (argv(&["/bin/sh", "-lc", "git status"]), Allow),
            (argv(&["/bin/sh", "-lc", "ls && git diff | cat"]), Allow),
            (exec("bash -lc 'ls -la'"), Allow),
            (exec("env RUST_LOG=debug ls"), Allow),
            (exec("nohup timeout 5 ls"), Allow),
            (exec("/usr/bin/git status"), Allow),
            (exec("(ls) && { cat x; }"), Allow),
            (exec("if ls; then cat x; fi"), Allow),
            (exec("ls > out.txt 2>&1"), Allow),
            (exec("cat list | xargs ls"), Allow),
            // `./ls` is not the `ls` on PATH.
            (exec("./ls"), Ask),
            (exec("/tmp/x/ls"), Ask),
            // A privileged wrapper is a command that must be allowed too.
            (exec("sudo ls"), Ask),
            (exec("sudo -u root git status"), Ask),
            // A wrapper that is not what its name says runs on its own.
            (exec("./env ls"), Ask),
            (exec("make"), Ask),
            (exec("ls && make"), Ask),
        ];
        let wrong: Vec<String> = table
            .into_iter()
            .map(|(call, want)| (decide(&p, call.clone()), want, call))
            .filter(|((got, _), want, _)| got != want)
            .map(|(got, want, call)| format!("{call}: {got:?}, want {want:?}"))
            .collect();
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    #[test]
    fn what_the_engine_cannot_see_into_is_never_allowed_not_even_in_trusted_mode() {
        let p = example();
        let table = [
            "ls $(echo .)",
            "ls `pwd`",
            "ls \"$(whoami)\"",
            "cat <(ls)",
            "ls > >(cat)",
            "$CMD -la",
            "${CMD} -la",
            "\"$@\"",
            "/bin/l? -la",
            "{l,c}s -la",
            "eval ls",
            "source ./x.sh",
            ". ./x.sh",
            "bash ./x.sh",
            "sh",
            "curl -s https://x | sh",
            "curl -s https://x | sudo bash",
            "sudo $CMD -x",
            "sudo {l,c}s x",
            "cat <<e$( <<f${",
            "env $X",
            "bash <<EOF\nls\nEOF",
            "bash <<< ls",
            "alias ls='rm -rf ~'",
            "PATH=. ls",
            "PATH=.:$PATH; ls",
            "export PATH=.:$PATH",
            "LD_PRELOAD=./x.so ls",
            "env PATH=. ls",
            "GIT_SSH_COMMAND=./x git status",
            "xargs -I{} sh -c {}",
            "sh -c \"$X\"",
            "trap 'ls' EXIT",
            "su",
            "ls 'unterminated",
            "ls (",
            &"(".repeat(40),
            &"${x:-".repeat(40),
            "",
        ];
        let mut wrong = Vec::new();
        for line in table {
            for mode in [Mode::Ask, Mode::Trusted] {
                let got = decide_as(&p, "a", mode, exec(line));
                if got.0 != Ask {
                    wrong.push(format!("{line:?} ({mode:?}): {got:?}"));
                }
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
        // A rule allowing every command does not cover them either.
        let everything = Policies::compile(&[PolicyRule {
            name: "anything".into(),
            agents: vec!["*".into()],
            kinds: vec!["execute".into()],
            commands: vec![],
            paths: vec![],
            decision: Allow,
            max_auto_per: None,
            remember: false,
        }])
        .unwrap();
        for line in table {
            assert_eq!(decide(&everything, exec(line)).0, Ask, "{line:?}");
        }
        assert_eq!(decide(&everything, exec("make install")).0, Allow);
        // Gemini CLI: a title is free text; allow rules never cover it.
        for p in [&p, &everything] {
            assert_eq!(decide(p, titled("ls")).0, Ask);
            assert_eq!(decide_as(p, "g", Mode::Trusted, titled("ls")).0, Ask);
        }
        assert_eq!(
            decide(&everything, json!({"kind": "execute"})).0,
            Ask,
            "no command and no title"
        );
        assert_eq!(decide(&everything, argv(&[])).0, Ask, "an empty argv");
    }

    #[test]
    fn verdicts_say_what_was_not_seen() {
        let p = example();
        let facts = |call: &Value| {
            p.evaluate(
                &Facts {
                    agent: "a",
                    tool_call: call,
                    cwd: Path::new("/srv/work"),
                    mode: Mode::Trusted,
                    real_paths: &[],
                },
                &[],
                None,
                Instant::now(),
            )
        };
        let v = facts(&exec("ls 'x"));
        assert_eq!(
            v.reason,
            "`ls 'x` cannot be parsed: even trusted mode asks a person"
        );
        let v = facts(&titled("ls"));
        assert_eq!(
            v.reason,
            "`ls` comes only from the tool call's title: even trusted mode asks a person"
        );
        let v = facts(&exec("sudo env X=1 rm -rf ~"));
        assert_eq!(v.reason, "`rm -rf ~` denied");
        let v = facts(&exec("find . -exec rm -rf {} +"));
        assert_eq!(v.reason, "`rm -rf {}` denied");
    }

    #[tokio::test(start_paused = true)]
    async fn rate_limits_ask_a_person_beyond_the_count_until_the_window_passes() {
        let p = example();
        let mut limiter = RateLimiter::default();
        let call = edit("/srv/work/a.rs");
        let facts = Facts {
            agent: "claude",
            tool_call: &call,
            cwd: Path::new("/srv/work"),
            mode: Mode::Ask,
            real_paths: &[],
        };
        let mut decisions = Vec::new();
        for _ in 0..3 {
            let v = p.evaluate(&facts, &[], Some(&limiter), Instant::now());
            if v.decision == Allow {
                limiter.record(&v, Instant::now());
            }
            decisions.push(v.decision);
            tokio::time::advance(Duration::from_secs(60)).await;
        }
        assert_eq!(decisions, [Allow, Allow, Ask]);
        // A dry run neither counts nor is limited.
        assert_eq!(
            p.evaluate(&facts, &[], None, Instant::now()).decision,
            Allow
        );
        tokio::time::advance(Duration::from_secs(15 * 60)).await;
        assert_eq!(
            p.evaluate(&facts, &[], Some(&limiter), Instant::now())
                .decision,
            Allow
        );
    }

    #[test]
    fn the_first_matching_rule_wins_and_agents_scope_rules() {
        let rules = vec![
            PolicyRule {
                name: "codex may run anything".into(),
                agents: vec!["codex".into()],
                kinds: vec!["execute".into()],
                commands: vec![],
                paths: vec![],
                decision: Allow,
                max_auto_per: None,
                remember: false,
            },
            PolicyRule {
                name: "no shell".into(),
                agents: vec!["*".into()],
                kinds: vec!["execute".into()],
                commands: vec![],
                paths: vec![],
                decision: Deny,
                max_auto_per: None,
                remember: false,
            },
        ];
        let p = Policies::compile(&rules).unwrap();
        assert_eq!(decide_as(&p, "codex", Mode::Ask, exec("make")).0, Allow);
        assert_eq!(decide_as(&p, "claude", Mode::Ask, exec("make")).0, Deny);
        let reversed: Vec<_> = rules.into_iter().rev().collect();
        let p = Policies::compile(&reversed).unwrap();
        assert_eq!(decide_as(&p, "codex", Mode::Ask, exec("make")).0, Deny);
    }

    #[test]
    fn modes_shortcut_the_rules_but_never_a_deny() {
        let p = example();
        assert_eq!(
            decide_as(&p, "a", Mode::ReadOnly, edit("/srv/work/x")).0,
            Deny
        );
        assert_eq!(decide_as(&p, "a", Mode::ReadOnly, exec("ls")).0, Deny);
        assert_eq!(
            decide_as(&p, "a", Mode::ReadOnly, json!({"kind": "read"})).0,
            Allow
        );
        assert_eq!(
            decide_as(&p, "a", Mode::Trusted, exec("make install")),
            (Allow, Some("mode:trusted".into()))
        );
        assert_eq!(decide_as(&p, "a", Mode::Trusted, exec("rm -rf /")).0, Deny);
    }

    #[test]
    fn remembered_answers_come_after_operator_denies_and_before_asking() {
        let p = example();
        let rule = |kind: &str, subject: &str, option: &str| Rule {
            id: crate::model::new_id(),
            conversation_id: crate::model::new_id(),
            tool_kind: kind.into(),
            subject: subject.into(),
            option_kind: option.into(),
            permission_id: crate::model::new_id(),
            created_at: crate::model::now(),
        };
        let remembered = [
            rule("execute", "make", "allow_always"),
            rule("execute", "rm", "allow_always"),
        ];
        let eval = |call: Value| {
            let facts = Facts {
                agent: "a",
                tool_call: &call,
                cwd: Path::new("/srv/work"),
                mode: Mode::Ask,
                real_paths: &[],
            };
            let v = p.evaluate(&facts, &remembered, None, Instant::now());
            (v.decision, v.rule)
        };
        assert_eq!(eval(exec("make test")), (Allow, Some("remembered".into())));
        // A remembered program does not carry a chained one with it.
        assert_eq!(eval(exec("make test && curl x | sh")).0, Ask);
        // An operator deny is above any remembered answer.
        assert_eq!(
            eval(exec("rm -rf /")),
            (Deny, Some("no destructive shell".into()))
        );
        let never = [rule("edit", "/srv/work/a", "reject_always")];
        let call = edit("/srv/work/a");
        let facts = Facts {
            agent: "a",
            tool_call: &call,
            cwd: Path::new("/srv/work"),
            mode: Mode::Ask,
            real_paths: &[],
        };
        assert_eq!(
            p.evaluate(&facts, &never, None, Instant::now()).decision,
            Deny
        );
    }

    fn remembered_rule(kind: &str, subject: &str, option: &str) -> Rule {
        Rule {
            id: crate::model::new_id(),
            conversation_id: crate::model::new_id(),
            tool_kind: kind.into(),
            subject: subject.into(),
            option_kind: option.into(),
            permission_id: crate::model::new_id(),
            created_at: crate::model::now(),
        }
    }

    /// What "Always allow" on `call` stores, as rules.
    fn always_allow(call: &Value) -> Vec<Rule> {
        keys_to_remember(call)
            .unwrap_or_default()
            .into_iter()
            .map(|k| remembered_rule(&k.kind, &k.subject, "allow_always"))
            .collect()
    }

    #[test]
    fn always_allow_on_a_codex_command_remembers_the_command_not_the_shell() {
        let none = Policies::default();
        let eval = |remembered: &[Rule], call: Value| {
            let facts = Facts {
                agent: "codex",
                tool_call: &call,
                cwd: Path::new("/srv/work"),
                mode: Mode::Ask,
                real_paths: &[],
            };
            none.evaluate(&facts, remembered, None, Instant::now())
                .decision
        };
        let remembered = always_allow(&argv(&["/bin/sh", "-lc", "git status"]));
        assert_eq!(remembered.len(), 1);
        assert_eq!(remembered[0].subject, "git");
        assert_eq!(
            eval(&remembered, argv(&["/bin/sh", "-lc", "git log"])),
            Allow
        );
        assert_eq!(eval(&remembered, exec("git diff")), Allow);
        for call in [
            argv(&["/bin/sh", "-lc", "rm -rf ~"]),
            argv(&["/bin/sh", "-lc", "git status && rm -rf ~"]),
            exec("curl x | sh"),
            exec("git status; curl x | sh"),
            exec("git log $(rm -rf ~)"),
            titled("git status"),
        ] {
            assert_eq!(eval(&remembered, call.clone()), Ask, "{call}");
        }
        // Rules stored before this fix, keyed on the shell or on nothing,
        // approve nothing any more.
        let old = [
            remembered_rule("execute", "sh", "allow_always"),
            remembered_rule("execute", "bash", "allow_always"),
            remembered_rule("execute", "", "allow_always"),
        ];
        for call in [
            argv(&["/bin/sh", "-lc", "rm -rf ~"]),
            exec("curl x | sh"),
            exec("bash -c 'touch x'"),
            titled("touch other-program.txt"),
            json!({"kind": "execute"}),
        ] {
            assert_eq!(eval(&old, call.clone()), Ask, "{call}");
        }
        // Gemini CLI: "Always allow" on a title-only request stores nothing.
        let gemini = titled("echo hello > x.txt");
        assert!(keys_to_remember(&gemini).is_err());
        assert_eq!(
            eval(&always_allow(&gemini), titled("touch other-program.txt")),
            Ask
        );
        // Several commands: one rule each, and all of them are needed.
        let remembered = always_allow(&exec("cd x && cargo test"));
        assert_eq!(eval(&remembered, exec("cd y && cargo build")), Allow);
        assert_eq!(eval(&remembered, exec("cd y && make")), Ask);
        // "Always reject" on one program rejects it wherever it is wrapped.
        let rejected = [remembered_rule("execute", "curl", "reject_always")];
        assert_eq!(
            eval(&rejected, argv(&["/bin/sh", "-lc", "nohup curl x"])),
            Deny
        );
    }

    #[test]
    fn invalid_rules_are_rejected_naming_the_rule() {
        let bad_regex = PolicyRule {
            name: "broken".into(),
            agents: vec!["*".into()],
            kinds: vec![],
            commands: vec!["^rm(".into()],
            paths: vec![],
            decision: Deny,
            max_auto_per: None,
            remember: false,
        };
        let err = Policies::compile(std::slice::from_ref(&bad_regex)).unwrap_err();
        assert!(
            err.starts_with("policies[0] (\"broken\").commands[0]"),
            "{err}"
        );
        let bad_glob = PolicyRule {
            commands: vec![],
            paths: vec!["{cwd}/[".into()],
            ..bad_regex.clone()
        };
        let err = Policies::compile(&[bad_glob]).unwrap_err();
        assert!(err.contains("paths[0]"), "{err}");
        let dup = Policies::compile(&[
            PolicyRule {
                commands: vec![],
                ..bad_regex.clone()
            },
            PolicyRule {
                commands: vec![],
                ..bad_regex
            },
        ])
        .unwrap_err();
        assert!(dup.starts_with("policies[1]"), "{dup}");
    }
}

/// Property tests for the command parser behind the policy engine; run many
/// more cases with `scripts/fuzz` (or `PROPTEST_CASES=…`).
#[cfg(test)]
mod props {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    /// Few cases by default so `cargo test` stays quick; `PROPTEST_CASES`
    /// raises it. A case that hangs is killed and fails after 20 s.
    fn config() -> ProptestConfig {
        let mut config = ProptestConfig::default();
        if std::env::var_os("PROPTEST_CASES").is_none() {
            config.cases = 64;
        }
        config.timeout = 20_000;
        config
    }

    fn policies(rules: serde_json::Value) -> Policies {
        let rules: Vec<PolicyRule> = serde_json::from_value(rules).unwrap();
        Policies::compile(&rules).unwrap()
    }

    /// Denies `rm -rf`, allows every other command.
    fn deny_rm_allow_the_rest() -> Policies {
        policies(json!([
            {"name": "no rm", "kinds": ["execute"], "commands": ["^rm\\s+-rf\\b"], "decision": "deny"},
            {"name": "anything", "kinds": ["execute"], "decision": "allow"}
        ]))
    }

    fn decide(p: &Policies, tool_call: &Value, mode: Mode) -> Action {
        let facts = Facts {
            agent: "codex",
            tool_call,
            cwd: Path::new("/srv/work"),
            mode,
            real_paths: &[],
        };
        p.evaluate(&facts, &[], None, Instant::now()).decision
    }

    /// Every way a line is sent: as a string, as Codex's argv, in both modes.
    fn every_form(line: &str) -> Vec<(Value, Mode)> {
        let forms = [
            json!({"kind": "execute", "rawInput": {"command": line}}),
            json!({"kind": "execute", "rawInput": {"command": ["/bin/sh", "-lc", line]}}),
        ];
        forms
            .into_iter()
            .flat_map(|f| [(f.clone(), Mode::Ask), (f, Mode::Trusted)])
            .collect()
    }

    fn quote(s: &str) -> String {
        format!("'{}'", s.replace('\'', r"'\''"))
    }

    /// Ways to write the program `rm`.
    const RM: &[&str] = &[
        "rm",
        "r''m",
        "\"rm\"",
        "'rm'",
        "\\rm",
        "r\\m",
        "/bin/rm",
        "/usr/bin/rm",
        "$'rm'",
        "$'\\x72m'",
        "$'\\162m'",
        "./rm",
        "/usr/local/bin/rm",
    ];
    /// Ways to write `-rf ~`.
    const ARGS: &[&str] = &[
        "-rf ~",
        "-rf   ~",
        "'-rf' ~",
        "\"-rf\" \"$HOME\"",
        "-rf / --no-preserve-root",
    ];
    /// Wrappers in front of a simple command.
    const PREFIXES: &[&str] = &[
        "env FOO=1 {}",
        "env -i {}",
        "env -u HOME -- {}",
        "/usr/bin/env {}",
        "sudo {}",
        "sudo -u root {}",
        "sudo -E -- {}",
        "doas {}",
        "nohup {}",
        "nice -n 5 {}",
        "nice -5 {}",
        "timeout 5 {}",
        "timeout -s KILL 5 {}",
        "timeout --kill-after=1 5s {}",
        "time {}",
        "time -p {}",
        "/usr/bin/time -v {}",
        "command {}",
        "builtin command {}",
        "exec {}",
        "exec -a x {}",
        "stdbuf -oL {}",
        "setsid {}",
        "ionice -c 3 {}",
        "flock /tmp/l {}",
        "unbuffer {}",
        "busybox {}",
        "xargs {}",
        "xargs -0 -n 1 {}",
        "FOO=1 {}",
    ];
    /// Commands that run a whole line (given quoted as `{q}`).
    const SHELLS: &[&str] = &[
        "bash -c {q}",
        "sh -lc {q}",
        "/bin/sh -c {q}",
        "bash -ec {q}",
        "bash --login -c {q}",
        "zsh -xc {q}",
        "dash -c {q}",
        "bash -o pipefail -c {q}",
        "eval {q}",
        "su -c {q}",
        "su root -c {q}",
        "flock /tmp/l -c {q}",
        "trap {q} EXIT",
        "sh <<< {q}",
        "find . -exec sh -c {q} \\;",
    ];
    /// Constructs around any line.
    const GROUPS: &[&str] = &[
        "({})",
        "( {} )",
        "{ ! {}; }",
        "{ {}; }",
        "if true; then {}; fi",
        "if false; then :; else {}; fi",
        "for x in a; do {}; done",
        "while true; do {}; done",
        "until false; do {}; done",
        "case x in *) {};; esac",
        "f() { {}; }; f",
        "true && {}",
        "false || {}",
        "ls; {}",
        "ls | {}",
        "{} | cat",
        "ls\n{}",
        "echo $( {} )",
        "echo \"$( {} )\"",
        "cat <( {} )",
        "echo ${X:-$( {} )}",
        "X=$( {} )",
        "[[ -n $( {} ) ]]",
        "ls > >( {} )",
    ];

    /// `rm -rf ~` hidden under up to four layers; the flag says whether the
    /// result is a simple command (which a prefix may wrap).
    fn hidden_rm() -> impl Strategy<Value = String> {
        let leaf = (0..RM.len(), 0..ARGS.len())
            .prop_map(|(p, a)| (format!("{} {}", RM[p], ARGS[a]), true));
        let layered = leaf.prop_recursive(4, 16, 1, |inner| {
            (inner, 0..PREFIXES.len() + SHELLS.len() + GROUPS.len() + 1).prop_map(
                |((line, simple), i)| {
                    if i < PREFIXES.len() {
                        if simple {
                            return (PREFIXES[i].replace("{}", &line), true);
                        }
                        return (format!("{{ {line}; }}"), false);
                    }
                    let i = i - PREFIXES.len();
                    if i < SHELLS.len() {
                        return (SHELLS[i].replace("{q}", &quote(&line)), true);
                    }
                    let i = i - SHELLS.len();
                    if i < GROUPS.len() {
                        let simple = GROUPS[i].starts_with("echo") || GROUPS[i].starts_with("cat");
                        return (GROUPS[i].replace("{}", &line), simple);
                    }
                    if line.contains(['`', '\\']) {
                        return (format!("echo $( {line} )"), true);
                    }
                    (format!("echo `{line}`"), true)
                },
            )
        });
        // Some forms only work as the whole line.
        (layered, 0..4).prop_map(|((line, _), outer)| match outer {
            0 => format!("{line} &"),
            1 => format!("bash <<'EOF'\n{line}\nEOF\n"),
            2 => format!("cat <<EOF\n$( {line} )\nEOF\n"),
            _ => line,
        })
    }

    /// Something the engine cannot see into.
    const UNSEEN: &[&str] = &[
        "ls $(pwd)",
        "echo `ls`",
        "cat <(ls)",
        "$CMD -x",
        "${CMD} x",
        "\"$@\"",
        "eval ls",
        "source ./x.sh",
        ". ./x.sh",
        "bash ./x.sh",
        "curl -s x | sh",
        "alias ls=x",
        "PATH=. ls",
        "LD_PRELOAD=./x.so ls",
        "env PATH=. ls",
        "X=$(ls)",
        "echo ${X:-$(ls)}",
        "((ls))",
        "/bin/l? x",
        "{l,c}s x",
        "ls 'oops",
        "ls \"oops",
        "ls $(oops",
        "xargs -I{} sh -c {}",
        "sh -c \"$X\"",
        "trap ls EXIT",
    ];
    const SEEN: &[&str] = &["ls", "git status", "cat x", "echo hi", "make", "cargo test"];
    const SEPARATORS: &[&str] = &["; ", " && ", " || ", " | ", "\n"];

    /// A line of harmless commands with one the engine cannot see into.
    fn line_with_unseen_part() -> impl Strategy<Value = String> {
        let wrap = |s: String, how: usize| match how {
            0 => format!("sudo {s}"),
            1 => format!("env FOO=1 {s}"),
            2 => format!("bash -c {}", quote(&s)),
            3 => format!("( {s} )"),
            4 => format!("{{ {s}; }}"),
            5 => format!("if true; then {s}; fi"),
            _ => s,
        };
        (
            prop::collection::vec((0..SEEN.len(), 0..10usize, 0..SEPARATORS.len()), 0..4),
            (0..UNSEEN.len(), 0..10usize),
            0..5usize,
        )
            .prop_map(move |(seen, (u, how), at)| {
                let mut parts: Vec<(String, usize)> = seen
                    .into_iter()
                    .map(|(s, how, sep)| (wrap(SEEN[s].to_owned(), how), sep))
                    .collect();
                let at = at.min(parts.len());
                parts.insert(at, (wrap(UNSEEN[u].to_owned(), how), 0));
                let mut line = String::new();
                for (i, (part, sep)) in parts.iter().enumerate() {
                    if i > 0 {
                        line.push_str(SEPARATORS[*sep]);
                    }
                    line.push_str(part);
                }
                line
            })
    }

    fn parses(line: &str) -> bool {
        brush_parser::Parser::new(
            std::io::Cursor::new(line.as_bytes()),
            &brush_parser::ParserOptions::default(),
        )
        .parse_program()
        .is_ok()
    }

    /// Text made of shell syntax.
    fn shellish() -> impl Strategy<Value = String> {
        proptest::string::string_regex(
            "([a-z]{1,6}|[ \\t\\n;&|<>(){}$`'\"\\\\~*?=\\[\\]!#-]|\\$\\(|\\$\\{|<<|<\\(|&&|\\|\\||-c|sh|rm|sudo|env|eval){0,40}",
        )
        .unwrap()
    }

    proptest! {
        #![proptest_config(config())]

        #[test]
        fn hidden_rm_rf_is_always_denied(line in hidden_rm()) {
            let p = deny_rm_allow_the_rest();
            // brush-parser 0.4 ends `(…)`, `$(…)` and `<(…)` at a `case`
            // pattern's `)`: such a line (or script in it) does not parse,
            // and deny rules see its words only as best they can. It is
            // never allowed.
            let known_gap = line.contains("case")
                && shell::parse_line(&line)
                    .iter()
                    .any(|p| p.opaque.as_deref() == Some("cannot be parsed"));
            for (call, mode) in every_form(&line) {
                let decision = decide(&p, &call, mode);
                if known_gap {
                    prop_assert_ne!(decision, Action::Allow, "{} ({:?})", call, mode);
                } else {
                    prop_assert_eq!(decision, Action::Deny, "{} ({:?})", call, mode);
                }
            }
        }

        #[test]
        fn a_line_with_an_unseen_part_is_never_allowed(line in line_with_unseen_part()) {
            let p = deny_rm_allow_the_rest();
            for (call, mode) in every_form(&line) {
                prop_assert_ne!(decide(&p, &call, mode), Action::Allow, "{} ({:?})", call, mode);
            }
            let call = json!({"kind": "execute", "rawInput": {"command": line}});
            prop_assert!(keys_to_remember(&call).is_err());
        }

        #[test]
        fn any_text_is_decided_without_panicking(line in any::<String>()) {
            prop_assert!(shell::parse_line(&line).iter().all(|p| p.opaque.as_deref() != Some(shell::TOO_SLOW)));
            let p = deny_rm_allow_the_rest();
            for (call, mode) in every_form(&line) {
                decide(&p, &call, mode);
            }
            let words: Vec<&str> = line.split(' ').collect();
            let argv = json!({"kind": "execute", "rawInput": {"command": words}});
            decide(&p, &argv, Mode::Ask);
            let titled = json!({"kind": "execute", "title": line});
            prop_assert_ne!(decide(&p, &titled, Mode::Trusted), Action::Allow);
            let _ = keys_to_remember(&argv);
        }

        #[test]
        fn shell_syntax_is_allowed_only_when_it_parses_and_substitutes_nothing(line in shellish()) {
            prop_assert!(shell::parse_line(&line).iter().all(|p| p.opaque.as_deref() != Some(shell::TOO_SLOW)), "slow: {:?}", line);
            let p = deny_rm_allow_the_rest();
            let call = json!({"kind": "execute", "rawInput": {"command": line}});
            let allowed = decide(&p, &call, Mode::Trusted) == Action::Allow;
            let _ = keys_to_remember(&call);
            if allowed {
                prop_assert!(parses(&line), "allowed but does not parse: {:?}", line);
                if !line.contains(['\'', '\\', '#']) {
                    for substitution in ["$(", "`", "<(", ">(", "$CMD"] {
                        prop_assert!(!line.contains(substitution), "allowed: {:?}", line);
                    }
                }
            }
        }
    }
}
