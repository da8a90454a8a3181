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

use serde::Serialize;
use serde_json::Value;
use tokio::time::Instant;

use super::shell;
use crate::model::{PolicyRule, RateLimit, Rule};
use crate::ratelimit::SlidingWindow;

pub use crate::config::profile::Mode;
pub use crate::model::policy_input::{self as input, Refused};
pub use crate::model::Action;

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
    /// Checks rules as the API and the config file take them (what the
    /// OpenAPI document states, see [`input`]) and compiles them.
    pub fn compile(rules: &[PolicyRule]) -> Result<Policies, Refused> {
        input::check_rules(rules)?;
        Self::compile_stored(rules).map_err(Refused::Invalid)
    }

    /// Compiles rules that were checked when they were stored, perhaps by
    /// an older version that took more: only what evaluating needs (their
    /// regexes) is checked again, so a stored set always comes back.
    pub fn compile_stored(rules: &[PolicyRule]) -> Result<Policies, String> {
        let mut compiled = Vec::with_capacity(rules.len());
        for (i, rule) in rules.iter().enumerate() {
            let mut commands = Vec::new();
            for (j, pattern) in rule.commands.iter().enumerate() {
                let re = regex::Regex::new(pattern).map_err(|e| {
                    format!(
                        "policies[{i}] ({:?}).commands[{j}]: invalid regex: {e}",
                        rule.name
                    )
                })?;
                commands.push(re);
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
    let glob = glob.replace("{cwd}", &escape(&cwd.to_string_lossy()));
    Ok(globset::GlobBuilder::new(&glob)
        .literal_separator(true)
        .build()?
        .compile_matcher())
}

/// A path as a glob that matches just that path: every character globs
/// treat specially in a class (`globset::escape` leaves `\`, which would
/// escape the next character, and `,`, which would split alternatives).
fn escape(path: &str) -> String {
    let mut escaped = String::with_capacity(path.len());
    for c in path.chars() {
        if matches!(c, '?' | '*' | '[' | ']' | '{' | '}' | '\\' | ',') {
            escaped.extend(['[', c, ']']);
        } else {
            escaped.push(c);
        }
    }
    escaped
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
            .wait(rule, limit.count, limit.window.duration(), now)
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

/// The kinds of tool whose calls are known by their path.
const PATH_KINDS: [&str; 4] = ["read", "edit", "delete", "move"];

/// What a whole tool call of a kind other than `execute` is known by: the
/// path of a path tool, else the title (empty when it has none).
pub(crate) fn subject(tool_call: &Value, kind: &str) -> String {
    let raw_input = tool_call.get("rawInput");
    match kind {
        _ if PATH_KINDS.contains(&kind) => tool_call
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

/// Whether a remembered answer to a path tool, keyed on the path
/// `subject`, covers the call's `paths` (as given, or as they really are):
/// each of them must be that path. A second path (a move's destination, a
/// second location) or a symlink that leads elsewhere was never answered.
/// Other kinds are not keyed on paths.
fn answered_paths(kind: &str, subject: &str, cwd: &Path, paths: &[PathBuf]) -> bool {
    if !PATH_KINDS.contains(&kind) {
        return true;
    }
    let answered = normalize(cwd, Path::new(subject));
    !paths.is_empty() && paths.iter().all(|path| *path == answered)
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
                if unit.opaque.is_none() && answered_paths(kind, &rule.subject, facts.cwd, paths) {
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
                                limited.push((c.rule.name.clone(), limit.window.duration()));
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
mod tests;

/// Property tests for the command parser behind the policy engine; run many
/// more cases with `scripts/fuzz` (or `PROPTEST_CASES=…`).
#[cfg(test)]
mod props;
