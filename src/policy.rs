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
//! - a shell line is split on `;`, `&&`, `||`, `|`, `&` and newlines (outside
//!   quotes); every part must be allowed for the line to be allowed, and any
//!   part that is denied denies the line; `sh -c '…'` and command
//!   substitutions are looked into, and a part containing a substitution is
//!   never allowed without a person;
//! - paths are normalised (`.`, `..`, repeated slashes, relative to the
//!   conversation's cwd) before matching, and an `allow` rule with `paths`
//!   matches only when every path of the tool call is inside its globs;
//! - a `deny` rule beats everything, including remembered answers and the
//!   profile's `mode`.

use std::collections::{HashMap, VecDeque};
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::time::Instant;

use crate::permissions::{Rule, ToolKey};

/// What a rule decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    Allow,
    Deny,
    Ask,
}

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

/// At most `count` automatic approvals by one rule per `window`, per
/// conversation; beyond it, a person is asked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    pub count: u32,
    #[serde(with = "humantime_serde")]
    pub window: Duration,
}

/// One operator rule, as written in the config file or sent to the API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyRule {
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
    pub decision: Decision,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_auto_per: Option<RateLimit>,
    /// Answer `allow` with the agent's `allow_always` option.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub remember: bool,
}

fn every_agent() -> Vec<String> {
    vec!["*".into()]
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
                if rule.decision != Decision::Allow {
                    return Err(format!(
                        "{at}.max_auto_per: only allow rules are rate limited"
                    ));
                }
            }
            if rule.remember && rule.decision != Decision::Allow {
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
}

/// The outcome of evaluating a tool call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Verdict {
    pub decision: Decision,
    /// The rule that decided (`remembered`, `mode:read_only`, `mode:trusted`
    /// for the built-in ones), or none when nothing matched.
    pub rule: Option<String>,
    /// Answer with `allow_always` rather than `allow_once`.
    #[serde(skip)]
    pub remember: bool,
    /// Why, in words, for the decision's `reason`.
    #[serde(skip)]
    pub reason: String,
    /// Allow rules with a rate limit that this verdict uses.
    #[serde(skip)]
    limited: Vec<String>,
}

/// Per-conversation counts of automatic approvals, for `max_auto_per`.
#[derive(Debug, Default)]
pub struct RateLimiter {
    hits: HashMap<String, VecDeque<Instant>>,
}

impl RateLimiter {
    fn exhausted(&self, rule: &str, limit: &RateLimit, now: Instant) -> bool {
        let recent = self.hits.get(rule).map_or(0, |hits| {
            hits.iter()
                .filter(|t| now.duration_since(**t) < limit.window)
                .count()
        });
        recent >= limit.count as usize
    }

    /// Counts an automatic approval that `verdict` made.
    pub fn record(&mut self, verdict: &Verdict, now: Instant) {
        for rule in &verdict.limited {
            let hits = self.hits.entry(rule.clone()).or_default();
            hits.push_back(now);
            // Older hits than any window we could be asked about are noise.
            while hits.len() > 10_000 {
                hits.pop_front();
            }
        }
    }
}

/// One thing to decide: a whole tool call, or one part of a shell line.
#[derive(Debug)]
struct Unit {
    /// The normalised command part (execute only).
    command: Option<String>,
    /// What a remembered rule is keyed on.
    key: ToolKey,
    /// The part hides a command substitution: never allowed automatically.
    opaque: bool,
}

const WRITE_KINDS: [&str; 4] = ["edit", "delete", "move", "execute"];

impl Policies {
    /// Decides a tool call. `remembered` are the conversation's "always"
    /// rules; `limiter` is `None` for a dry run.
    pub fn evaluate(
        &self,
        facts: &Facts<'_>,
        remembered: &[Rule],
        limiter: Option<&RateLimiter>,
        now: Instant,
    ) -> Verdict {
        let kind = facts
            .tool_call
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or("other");
        let paths = tool_paths(facts.tool_call, facts.cwd);
        let units = units(facts.tool_call, kind);
        let mut allowed_by: Vec<String> = Vec::new();
        let mut limited: Vec<String> = Vec::new();
        let mut asked: Option<Verdict> = None;
        let mut remember = false;
        for unit in &units {
            let op = self.first_match(facts, kind, unit, &paths);
            if let Some(rule) = op.filter(|r| r.rule.decision == Decision::Deny) {
                return verdict(
                    Decision::Deny,
                    Some(&rule.rule.name),
                    describe(unit, "denied"),
                );
            }
            if let Some(rule) = remembered
                .iter()
                .find(|r| r.tool_kind == unit.key.kind && r.subject == unit.key.subject)
            {
                if rule.option_kind == "reject_always" {
                    return verdict(
                        Decision::Deny,
                        Some("remembered"),
                        describe(unit, "rejected before, always"),
                    );
                }
                if !unit.opaque {
                    allowed_by.push("remembered".into());
                    continue;
                }
            }
            let unit_verdict = match op {
                Some(c) if c.rule.decision == Decision::Allow && !unit.opaque => {
                    match (&c.rule.max_auto_per, limiter) {
                        (Some(limit), Some(l)) if l.exhausted(&c.rule.name, limit, now) => verdict(
                            Decision::Ask,
                            Some(&c.rule.name),
                            format!(
                                "rule {:?} reached its limit of {} automatic approvals",
                                c.rule.name, limit.count
                            ),
                        ),
                        _ => {
                            if c.rule.max_auto_per.is_some() {
                                limited.push(c.rule.name.clone());
                            }
                            remember |= c.rule.remember;
                            allowed_by.push(c.rule.name.clone());
                            continue;
                        }
                    }
                }
                Some(c) if unit.opaque => verdict(
                    Decision::Ask,
                    Some(&c.rule.name),
                    describe(unit, "has a command substitution"),
                ),
                Some(c) => verdict(
                    Decision::Ask,
                    Some(&c.rule.name),
                    describe(unit, "asks a person"),
                ),
                None => verdict(Decision::Ask, None, describe(unit, "matches no rule")),
            };
            asked.get_or_insert(unit_verdict);
        }
        let mut result = match asked {
            Some(ask) => ask,
            None => {
                allowed_by.dedup();
                let names = allowed_by.join(", ");
                let mut v = verdict(Decision::Allow, Some(&names), format!("allowed by {names}"));
                v.remember = remember;
                v.limited = limited;
                v
            }
        };
        match facts.mode {
            Mode::ReadOnly if WRITE_KINDS.contains(&kind) => {
                result = verdict(
                    Decision::Deny,
                    Some("mode:read_only"),
                    format!("{kind} is not allowed in read-only mode"),
                );
            }
            Mode::Trusted if result.decision == Decision::Ask => {
                result = verdict(
                    Decision::Allow,
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
        unit: &Unit,
        paths: &[PathBuf],
    ) -> Option<&Compiled> {
        self.rules.iter().find(|c| {
            let rule = &c.rule;
            let agent_ok = rule.agents.iter().any(|a| a == "*" || a == facts.agent);
            let kind_ok = rule.kinds.is_empty() || rule.kinds.iter().any(|k| k == kind);
            let command_ok = c.commands.is_empty()
                || unit
                    .command
                    .as_deref()
                    .is_some_and(|cmd| c.commands.iter().any(|re| re.is_match(cmd)));
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
        Decision::Allow => !paths.is_empty() && paths.iter().all(inside),
        Decision::Deny | Decision::Ask => paths.iter().any(inside),
    }
}

fn verdict(decision: Decision, rule: Option<&str>, reason: String) -> Verdict {
    Verdict::new(decision, rule, reason)
}

impl Verdict {
    pub fn new(decision: Decision, rule: Option<&str>, reason: String) -> Verdict {
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
    match &unit.command {
        Some(cmd) => format!("`{cmd}` {what}"),
        None => format!("{} {what}", unit.key.kind),
    }
}

/// Every path a tool call touches, normalised against `cwd`.
fn tool_paths(tool_call: &Value, cwd: &Path) -> Vec<PathBuf> {
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

/// Splits what a tool call runs into the units the rules decide on.
fn units(tool_call: &Value, kind: &str) -> Vec<Unit> {
    let whole = || Unit {
        command: None,
        key: crate::permissions::tool_key(tool_call),
        opaque: false,
    };
    if kind != "execute" {
        return vec![whole()];
    }
    let line = match tool_call
        .get("rawInput")
        .and_then(|i| i.get("command").or_else(|| i.get("cmd")))
    {
        Some(Value::String(line)) => line.clone(),
        Some(Value::Array(argv)) => argv
            .iter()
            .filter_map(Value::as_str)
            .map(quote)
            .collect::<Vec<_>>()
            .join(" "),
        _ => return vec![whole()],
    };
    let mut units = Vec::new();
    command_units(&line, 0, &mut units);
    if units.is_empty() {
        units.push(whole());
    }
    units
}

fn quote(word: &str) -> String {
    if !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c))
    {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// Shells that run their `-c` argument as a command line.
const SHELLS: [&str; 5] = ["sh", "bash", "zsh", "dash", "ksh"];

fn command_units(line: &str, depth: usize, out: &mut Vec<Unit>) {
    for part in split_shell(line) {
        if part.words.is_empty() {
            continue;
        }
        for inner in &part.substitutions {
            if depth < 4 {
                command_units(inner, depth + 1, out);
            }
        }
        let program = part.words[0]
            .rsplit('/')
            .next()
            .unwrap_or(&part.words[0])
            .to_owned();
        // `bash -c 'rm -rf /'` is `rm -rf /`.
        if SHELLS.contains(&program.as_str()) && depth < 4 {
            if let Some(i) = part.words.iter().position(|w| w == "-c") {
                if let Some(script) = part.words.get(i + 1) {
                    command_units(script, depth + 1, out);
                    continue;
                }
            }
        }
        out.push(Unit {
            command: Some(part.words.join(" ")),
            key: ToolKey {
                kind: "execute".into(),
                subject: program,
            },
            opaque: !part.substitutions.is_empty(),
        });
    }
}

/// One simple command of a shell line: its words with quotes removed.
#[derive(Debug, Default, PartialEq)]
struct Part {
    words: Vec<String>,
    /// The text inside `$(…)` and backticks.
    substitutions: Vec<String>,
}

/// Splits a shell line on `;`, `&`, `|` (so also `&&`, `||`) and newlines
/// outside quotes, removing quotes and backslash escapes from the words.
fn split_shell(line: &str) -> Vec<Part> {
    let mut parts = Vec::new();
    let mut part = Part::default();
    let mut word: Option<String> = None;
    let mut chars = line.chars().peekable();
    let end_word = |part: &mut Part, word: &mut Option<String>| {
        if let Some(w) = word.take() {
            part.words.push(w);
        }
    };
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                let w = word.get_or_insert_with(String::new);
                for c in chars.by_ref() {
                    if c == '\'' {
                        break;
                    }
                    w.push(c);
                }
            }
            '"' => {
                let w = word.get_or_insert_with(String::new);
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' => {
                            if let Some(next) = chars.next() {
                                w.push(next);
                            }
                        }
                        '$' if chars.peek() == Some(&'(') => {
                            chars.next();
                            part.substitutions.push(take_until_close(&mut chars));
                        }
                        '`' => part
                            .substitutions
                            .push(chars.by_ref().take_while(|c| *c != '`').collect()),
                        c => w.push(c),
                    }
                }
            }
            '\\' => {
                if let Some(next) = chars.next() {
                    if next != '\n' {
                        word.get_or_insert_with(String::new).push(next);
                    }
                }
            }
            '$' if chars.peek() == Some(&'(') => {
                chars.next();
                part.substitutions.push(take_until_close(&mut chars));
                word.get_or_insert_with(String::new).push_str("$(…)");
            }
            '`' => {
                part.substitutions
                    .push(chars.by_ref().take_while(|c| *c != '`').collect());
                word.get_or_insert_with(String::new).push_str("$(…)");
            }
            ';' | '&' | '|' | '\n' => {
                end_word(&mut part, &mut word);
                parts.push(std::mem::take(&mut part));
            }
            '(' | ')' | '{' | '}' if word.is_none() => {
                // Grouping: the commands inside are parts of their own.
                end_word(&mut part, &mut word);
                parts.push(std::mem::take(&mut part));
            }
            c if c.is_whitespace() => end_word(&mut part, &mut word),
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    end_word(&mut part, &mut word);
    parts.push(part);
    parts.retain(|p| !p.words.is_empty() || !p.substitutions.is_empty());
    parts
}

/// The text up to the `)` closing a `$(` (nesting counted).
fn take_until_close(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) -> String {
    let mut depth = 1;
    let mut inner = String::new();
    for c in chars.by_ref() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            _ => {}
        }
        inner.push(c);
    }
    inner
}

/// The policies in force, shared by the API and every session. The store's
/// newest policy set wins over the config file's rules; [`PolicyHandle::refresh`]
/// picks up a set another gateway node saved.
#[derive(Clone)]
pub struct PolicyHandle {
    inner: std::sync::Arc<std::sync::RwLock<Current>>,
    from_config: std::sync::Arc<Vec<PolicyRule>>,
}

struct Current {
    /// The policy set the compiled rules come from (`None`: the config file).
    set_id: Option<uuid::Uuid>,
    policies: std::sync::Arc<Policies>,
}

impl PolicyHandle {
    /// Starts from the config file's (already validated) rules.
    pub fn new(config_rules: Vec<PolicyRule>) -> Result<PolicyHandle, String> {
        let policies = Policies::compile(&config_rules)?;
        Ok(PolicyHandle {
            inner: std::sync::Arc::new(std::sync::RwLock::new(Current {
                set_id: None,
                policies: std::sync::Arc::new(policies),
            })),
            from_config: std::sync::Arc::new(config_rules),
        })
    }

    /// The rules of the config file.
    pub fn config_rules(&self) -> &[PolicyRule] {
        &self.from_config
    }

    /// The policies in force after looking at the store's newest set.
    pub async fn refresh(
        &self,
        store: &dyn crate::store::Store,
    ) -> crate::error::Result<std::sync::Arc<Policies>> {
        let newest = store.current_policies().await?;
        let mut current = self.inner.write().unwrap();
        if let Some(set) = newest {
            if current.set_id != Some(set.id) {
                let policies = Policies::compile(&set.rules).map_err(|e| {
                    crate::error::Error::Internal(anyhow::anyhow!(
                        "stored policy set {}: {e}",
                        set.id
                    ))
                })?;
                *current = Current {
                    set_id: Some(set.id),
                    policies: std::sync::Arc::new(policies),
                };
            }
        }
        Ok(current.policies.clone())
    }

    /// Puts a validated set in force on this node.
    pub fn replace(&self, set_id: uuid::Uuid, policies: Policies) {
        *self.inner.write().unwrap() = Current {
            set_id: Some(set_id),
            policies: std::sync::Arc::new(policies),
        };
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

    fn decide(p: &Policies, tool_call: Value) -> (Decision, Option<String>) {
        decide_as(p, "claude", Mode::Ask, tool_call)
    }

    fn decide_as(
        p: &Policies,
        agent: &str,
        mode: Mode,
        tool_call: Value,
    ) -> (Decision, Option<String>) {
        let facts = Facts {
            agent,
            tool_call: &tool_call,
            cwd: Path::new("/srv/work"),
            mode,
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

    use Decision::*;

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
        };
        assert_eq!(
            p.evaluate(&facts, &never, None, Instant::now()).decision,
            Deny
        );
    }

    #[test]
    fn invalid_rules_are_rejected_naming_the_rule() {
        let bad_regex = PolicyRule {
            name: "broken".into(),
            agents: every_agent(),
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
