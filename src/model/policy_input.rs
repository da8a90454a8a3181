//! What a policy rule may say, as `PUT /api/v1/policies` and the config
//! file's `[[policies]]` take it. Each rule here is one the OpenAPI document
//! states, checked with the very pattern the document shows (the schema
//! builders below are the document's), so that a client that follows the
//! document is never refused and one that does not always is:
//!
//! - `name`: at most 100 characters, no control character, not only white
//!   space ([`NAME_PATTERN`]);
//! - `agents`: at least one;
//! - `commands`: regexes valid as JSON Schema's `format: regex` says
//!   (ECMAScript) that the Rust `regex` crate, which runs them, also
//!   compiles; what ECMAScript has and Rust lacks (look-around,
//!   backreferences, `\0`, `[]`) is the one rule the document can only say
//!   in words;
//! - `paths`: globs of the grammar [`GLOB_PATTERN`], narrower than `globset`
//!   takes (no nested `{a,{b}}`, no ranges in classes) so that a pattern can
//!   say it exactly; every glob it admits `globset` builds;
//! - `max_auto_per` and `remember` only on `allow` rules (the document's
//!   `oneOf`), `count` from 1 to [`COUNT_MAX`], `window` of the grammar
//!   [`WINDOW_PATTERN`] (every part positive, at most 64 characters);
//! - at most [`limits::POLICY_MAX_RULES`] rules, and names unique in the
//!   list: the one rule no JSON Schema states, answered 409
//!   `duplicate_name` (not 422: the body is valid, the list is not).
//!
//! Rules stored by an older version are not checked again
//! (`crate::permissions::policy::Policies::compile_stored`).

use std::sync::LazyLock;

use regex::Regex;
use utoipa::openapi::schema::{
    ArrayBuilder, KnownFormat, Object, ObjectBuilder, SchemaFormat, Type,
};

use super::permission::{Action, PolicyRule};
use crate::limits;

/// A rule's name: no control character (Unicode `Cc`, what
/// `char::is_control` says), and one character besides them that is not
/// white space (Unicode `White_Space`, what `str::trim` removes). Explicit
/// classes: `\s` and `\p{..}` mean different things to different engines.
pub const NAME_PATTERN: &str = concat!(
    r"^[^\u0000-\u001f\u007f-\u009f]*",
    r"[^\u0000-\u0020\u007f-\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]",
    r"[^\u0000-\u001f\u007f-\u009f]*$",
);

/// One part of a glob: a character but `\ [ { }`; `\` and any character but
/// `{`; `{cwd}`; or a class `[…]` (`!` or `^` negates; `]` or `-` first is
/// a member, `-` last too; no other `-`, so no ranges; no `}`).
macro_rules! glob_part {
    () => {
        r"(?:[^\\\[{}]|\\[^{]|\{cwd\}|\[(?:[!^][^}]|[^}!^])[^\]\-}]*-?\])"
    };
}

/// A path glob: parts, and alternatives `{a,b}` of parts (not nested).
pub const GLOB_PATTERN: &str = concat!("^(?:", glob_part!(), r"|\{", glob_part!(), r"*\})*$");

/// A rate limit's window: parts of a positive whole number (up to 9
/// digits) and a unit `humantime` knows (`µs` spelled `us`), each maybe
/// followed by a space, as is a number by its unit: `15m`, `1h 30m`,
/// `90 seconds`.
pub const WINDOW_PATTERN: &str = concat!(
    "^(?:[1-9][0-9]{0,8} ?(?:",
    "nanos|nsec|ns|usec|us|millis|msec|ms|seconds|second|secs|sec|s|",
    "minutes|minute|mins|min|m|hours|hour|hrs|hr|h|days|day|d|",
    "weeks|week|wks|wk|w|months|month|M|years|year|yrs|yr|y",
    ") ?)+$",
);

/// A window's length, in characters: short enough that no sum of its parts
/// overflows.
pub const WINDOW_MAX_CHARS: usize = 64;

/// The most automatic approvals a rate limit counts: as many hits as the
/// limiter keeps.
pub const COUNT_MAX: u32 = crate::ratelimit::MAX_HITS_PER_KEY as u32;

fn compiled(pattern: &str) -> Regex {
    Regex::new(pattern).expect("the document's patterns compile")
}

static NAME: LazyLock<Regex> = LazyLock::new(|| compiled(NAME_PATTERN));
static GLOB: LazyLock<Regex> = LazyLock::new(|| compiled(GLOB_PATTERN));
static WINDOW: LazyLock<Regex> = LazyLock::new(|| compiled(WINDOW_PATTERN));

/// Whether `name` is one the document admits (its length aside).
pub fn is_name(name: &str) -> bool {
    NAME.is_match(name)
}

/// Whether `glob` is of the grammar the document states.
pub fn is_glob(glob: &str) -> bool {
    GLOB.is_match(glob)
}

/// Whether `window` is of the grammar the document states.
pub fn is_window(window: &str) -> bool {
    window.chars().count() <= WINDOW_MAX_CHARS && WINDOW.is_match(window)
}

/// A regex for `commands`: valid ECMAScript (`format: regex`), compiled
/// with the Rust `regex` crate.
pub fn command_regex(pattern: &str) -> Result<Regex, String> {
    if !jsonschema_regex::is_valid_ecma_regex(pattern) {
        return Err(
            "not a valid regex in ECMAScript syntax, which the document's `format: regex` \
             means (Rust-only syntax such as `(?i)` or `\\z` is not taken: write `(?i:…)`)"
                .into(),
        );
    }
    Regex::new(pattern).map_err(|e| format!("invalid regex: {e}"))
}

/// Why a list of rules is refused; the message names the rule and the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// A rule says what the API does not take (422).
    #[error("{0}")]
    Invalid(String),
    /// A name used by an earlier rule (409 `duplicate_name`): each rule is
    /// valid, the list is not, and no JSON Schema can say so.
    #[error("{0}")]
    DuplicateName(String),
}

/// Checks rules as the API and the config file take them (what the OpenAPI
/// document states). A repeated name is reported only for a list that is
/// otherwise valid.
pub fn check_rules(rules: &[PolicyRule]) -> Result<(), Refused> {
    if rules.len() > limits::POLICY_MAX_RULES {
        return Err(Refused::Invalid(format!(
            "policies: at most {} rules",
            limits::POLICY_MAX_RULES
        )));
    }
    let mut names = std::collections::HashSet::new();
    let mut repeated = None;
    for (i, rule) in rules.iter().enumerate() {
        let at = format!("policies[{i}] ({:?})", rule.name);
        check(&at, rule).map_err(Refused::Invalid)?;
        if !names.insert(rule.name.as_str()) && repeated.is_none() {
            repeated = Some(format!("{at}.name: used by an earlier rule"));
        }
    }
    match repeated {
        Some(repeated) => Err(Refused::DuplicateName(repeated)),
        None => Ok(()),
    }
}

/// Checks one rule, `at` naming it in the message; all but the uniqueness
/// of its name.
fn check(at: &str, rule: &PolicyRule) -> Result<(), String> {
    let chars = rule.name.chars().count();
    if chars > limits::POLICY_NAME_MAX_CHARS {
        return Err(format!(
            "{at}.name: must be at most {} characters",
            limits::POLICY_NAME_MAX_CHARS
        ));
    }
    if !is_name(&rule.name) {
        return Err(format!(
            "{at}.name: must be one line, without control characters, and not only white space"
        ));
    }
    if rule.agents.is_empty() {
        return Err(format!("{at}.agents: name at least one agent, or \"*\""));
    }
    for (j, pattern) in rule.commands.iter().enumerate() {
        command_regex(pattern).map_err(|e| format!("{at}.commands[{j}]: {e}"))?;
    }
    for (j, glob) in rule.paths.iter().enumerate() {
        if !is_glob(glob) {
            return Err(format!(
                "{at}.paths[{j}]: invalid glob: {glob:?} (`*`, `**`, `?`, `{{cwd}}`, `\\` escapes, \
                 classes like `[abc]` or `[!/]` without ranges, alternatives like `{{a,b}}` not nested)"
            ));
        }
    }
    if let Some(limit) = &rule.max_auto_per {
        if rule.decision != Action::Allow {
            return Err(format!(
                "{at}.max_auto_per: only allow rules are rate limited"
            ));
        }
        if !(1..=COUNT_MAX).contains(&limit.count) {
            return Err(format!(
                "{at}.max_auto_per.count: must be from 1 to {COUNT_MAX}"
            ));
        }
        if !is_window(limit.window.as_str()) {
            return Err(format!(
                "{at}.max_auto_per.window: {:?} is not a duration like \"15m\" or \"1h 30m\" \
                 (positive whole numbers with a unit, at most {WINDOW_MAX_CHARS} characters)",
                limit.window.as_str()
            ));
        }
    }
    if rule.remember && rule.decision != Action::Allow {
        return Err(format!("{at}.remember: only allow rules can remember"));
    }
    Ok(())
}

// The document's schemas for the fields above (`schema_with`).

fn string() -> ObjectBuilder {
    ObjectBuilder::new().schema_type(Type::String)
}

/// `name`.
pub fn name_schema() -> Object {
    string()
        .description(Some(
            "Unique in the list (a repeated name is 409 `duplicate_name`); one line of at most \
             100 characters, not only white space.",
        ))
        .max_length(Some(limits::POLICY_NAME_MAX_CHARS))
        .pattern(Some(NAME_PATTERN))
        .build()
}

/// `agents`.
pub fn agents_schema() -> ArrayBuilder {
    ArrayBuilder::new()
        .items(string())
        .min_items(Some(1))
        .description(Some(
            "Profile names, or `\"*\"` for every agent (the default).",
        ))
}

/// `kinds`.
pub fn kinds_schema() -> ArrayBuilder {
    ArrayBuilder::new()
        .items(string())
        .description(Some("Tool call kinds it covers (empty: every kind)."))
}

/// `commands`.
pub fn commands_schema() -> ArrayBuilder {
    ArrayBuilder::new()
        .items(string().format(Some(SchemaFormat::KnownFormat(KnownFormat::Regex))))
        .description(Some(
            "Regexes; the rule covers a shell command part that one of them matches. Each must \
             be valid ECMAScript (`format: regex`) and compile with the Rust `regex` crate, which \
             runs it: no look-around, backreferences, `\\0` or `\\cX` escapes, or empty classes \
             (`[]`); `(?i:…)` for case-insensitive parts.",
        ))
}

/// `paths`.
pub fn paths_schema() -> ArrayBuilder {
    ArrayBuilder::new()
        .items(string().pattern(Some(GLOB_PATTERN)))
        .description(Some(
            "Globs over normalised paths; `{cwd}` is the conversation's directory. `*` (not \
             across `/`), `**`, `?`, `\\` escaping the next character (not `{`), classes `[abc]`, \
             `[!abc]` (no ranges; `]` or `-` first is a member, `-` last too; no `}`), \
             alternatives `{a,b}` (not nested).",
        ))
}

/// `max_auto_per.count`.
pub fn count_schema() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::Integer)
        .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int32)))
        .minimum(Some(1))
        .maximum(Some(COUNT_MAX))
        .build()
}

/// `max_auto_per.window`.
pub fn window_schema() -> Object {
    string()
        .description(Some(
            "A duration: positive whole numbers with a unit (`s`, `m`, `h`, `d`, `w`, … as \
             `humantime` spells them), e.g. `\"30s\"`, `\"15m\"`, `\"1h 30m\"`.",
        ))
        .max_length(Some(WINDOW_MAX_CHARS))
        .pattern(Some(WINDOW_PATTERN))
        .examples(["15m"])
        .build()
}

/// `decision` of an `allow` rule.
pub fn allow_schema() -> Object {
    string().enum_values(Some(["allow"])).build()
}

/// `decision` of a `deny` or `ask` rule.
pub fn deny_or_ask_schema() -> Object {
    string().enum_values(Some(["deny", "ask"])).build()
}

/// `max_auto_per` of a `deny` or `ask` rule: at most `null`.
pub fn no_limit_schema() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::Null)
        .description(Some("Only allow rules are rate limited."))
        .build()
}

/// `remember` of a `deny` or `ask` rule: at most `false`.
pub fn no_remember_schema() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::Boolean)
        .enum_values(Some([false]))
        .description(Some("Only allow rules remember."))
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The predicate the name pattern stands for.
    fn name_ok(name: &str) -> bool {
        !name.trim().is_empty() && !name.chars().any(char::is_control)
    }

    #[test]
    fn the_name_pattern_is_one_line_not_only_white_space_for_every_character() {
        let wrong: Vec<String> = (0..=0x10FFFFu32)
            .filter_map(char::from_u32)
            .flat_map(|c| {
                [
                    c.to_string(),
                    format!("a{c}"),
                    format!("{c} "),
                    format!(" {c}b"),
                ]
            })
            .filter(|s| is_name(s) != name_ok(s))
            .take(10)
            .collect();
        assert!(wrong.is_empty(), "{wrong:?}");
        for (name, ok) in [
            ("", false),
            (" \u{3000}\t", false),
            ("a\nb", false),
            ("ok", true),
        ] {
            assert_eq!(is_name(name), ok, "{name:?}");
        }
    }

    #[test]
    fn every_window_of_the_grammar_is_a_positive_duration() {
        let units = [
            "nanos", "nsec", "ns", "usec", "us", "millis", "msec", "ms", "seconds", "second",
            "secs", "sec", "s", "minutes", "minute", "mins", "min", "m", "hours", "hour", "hrs",
            "hr", "h", "days", "day", "d", "weeks", "week", "wks", "wk", "w", "months", "month",
            "M", "years", "year", "yrs", "yr", "y",
        ];
        for unit in units {
            for text in [
                format!("1{unit}"),
                format!("999999999 {unit} "),
                format!("2{unit}3s"),
            ] {
                assert!(is_window(&text), "{text}");
                let window = super::super::permission::Window::parse(&text).unwrap();
                assert!(!window.duration().is_zero(), "{text}");
            }
        }
        // The largest sum the length allows does not overflow.
        let longest = "999999999y".repeat(6);
        assert!(is_window(&longest));
        assert!(super::super::permission::Window::parse(&longest).is_ok());
        for text in [
            "", "0s", "15", "1.5h", " 1m", "1m  2s", "2µs", "01m", "1 2s", "1x",
        ] {
            assert!(!is_window(text), "{text:?}");
        }
        assert!(!is_window(&"1s".repeat(33)));
    }

    #[test]
    fn command_regexes_are_ecmascript_that_rust_compiles() {
        for ok in [
            r"^rm\s+-rf\b",
            r"(?i:^git)\s",
            r"^git\s+(status|log)\b",
            "a{2,4}?",
        ] {
            assert!(command_regex(ok).is_ok(), "{ok}");
        }
        // Rust-only syntax; ECMAScript-only syntax; neither.
        for bad in ["(?i)^rm", r"\z", "a]", "(?=x)", r"(a)\1", "[]", "^rm("] {
            assert!(command_regex(bad).is_err(), "{bad}");
        }
    }
}
