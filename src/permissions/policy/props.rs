//! Property tests for the command parser behind the policy engine; run many
//! more cases with `scripts/fuzz` (or `PROPTEST_CASES=…`).

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
    let leaf =
        (0..RM.len(), 0..ARGS.len()).prop_map(|(p, a)| (format!("{} {}", RM[p], ARGS[a]), true));
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
