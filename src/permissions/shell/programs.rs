//! The programs known to run other code (shells, interpreters, wrappers such
//! as `env`, `sudo`, `xargs`, `timeout`, `watch`), the shape of each wrapper's
//! options, and reading those options to find the command a wrapper runs.

use super::words::{is_assignment, Arg};

/// Shells: `-c` runs their argument as a command line.
pub(super) const SHELLS: [&str; 16] = [
    "sh",
    "bash",
    "rbash",
    "dash",
    "zsh",
    "ksh",
    "ksh93",
    "mksh",
    "pdksh",
    "ash",
    "yash",
    "posh",
    "fish",
    "csh",
    "tcsh",
    "busybox-sh",
];

/// Programs that run code given inline, from a file or from standard input.
pub(super) const INTERPRETERS: [&str; 36] = [
    "python",
    "python2",
    "python3",
    "pypy",
    "pypy3",
    "node",
    "nodejs",
    "deno",
    "bun",
    "perl",
    "ruby",
    "irb",
    "php",
    "lua",
    "luajit",
    "tclsh",
    "wish",
    "expect",
    "Rscript",
    "R",
    "osascript",
    "pwsh",
    "powershell",
    "awk",
    "gawk",
    "mawk",
    "nawk",
    "julia",
    "jshell",
    "groovy",
    "ts-node",
    "tsx",
    "npx",
    "bunx",
    "pnpx",
    "uvx",
];

/// Flags that hand an interpreter code inline.
pub(super) const INLINE_CODE: [&str; 9] = [
    "-c", "-e", "-E", "--eval", "-p", "--print", "-r", "eval", "-Command",
];

/// How a wrapper's options look, so the command after them can be found.
pub(super) struct Wrapper {
    pub(super) name: &'static str,
    /// Short options that take a value (attached or in the next word).
    pub(super) short_values: &'static str,
    /// Short options whose value can only be attached (`xargs -i{}`).
    pub(super) short_attached: &'static str,
    /// Short options without a value.
    pub(super) short_flags: &'static str,
    /// Long options that take a value (`--name value` or `--name=value`).
    pub(super) long_values: &'static [&'static str],
    /// Long options without a value (or with an attached `=value`).
    pub(super) long_flags: &'static [&'static str],
    /// Words between the options and the command (`timeout`'s duration).
    pub(super) operands: usize,
    /// `NAME=value` words may come before the command.
    pub(super) assignments: bool,
    /// Runs the command as another user or in another root: the wrapper is a
    /// command that must be allowed as well.
    pub(super) privileged: bool,
}

pub(super) const fn wrapper(name: &'static str) -> Wrapper {
    Wrapper {
        name,
        short_values: "",
        short_attached: "",
        short_flags: "",
        long_values: &[],
        long_flags: &[],
        operands: 0,
        assignments: false,
        privileged: false,
    }
}

/// `su` and the wrappers that take its options.
const fn su(name: &'static str) -> Wrapper {
    Wrapper {
        short_values: "cgGsw",
        short_flags: "lmpPf",
        long_values: &[
            "command",
            "group",
            "supp-group",
            "shell",
            "whitelist-environment",
        ],
        long_flags: &["login", "preserve-environment", "pty", "fast"],
        privileged: true,
        ..wrapper(name)
    }
}

pub(super) const WRAPPERS: [Wrapper; 20] = [
    Wrapper {
        short_values: "uCSP",
        short_flags: "i0v",
        long_values: &["unset", "chdir", "split-string"],
        long_flags: &[
            "ignore-environment",
            "null",
            "debug",
            "block-signal",
            "default-signal",
            "ignore-signal",
            "list-signal-handling",
        ],
        assignments: true,
        ..wrapper("env")
    },
    Wrapper {
        short_values: "CDghpRrtTUu",
        short_flags: "AbEeHiKklnPSsVv",
        long_values: &[
            "close-from",
            "chdir",
            "group",
            "host",
            "prompt",
            "chroot",
            "role",
            "type",
            "command-timeout",
            "other-user",
            "user",
        ],
        long_flags: &[
            "askpass",
            "background",
            "preserve-env",
            "edit",
            "set-home",
            "login",
            "remove-timestamp",
            "reset-timestamp",
            "list",
            "non-interactive",
            "preserve-groups",
            "stdin",
            "shell",
            "validate",
        ],
        assignments: true,
        privileged: true,
        ..wrapper("sudo")
    },
    Wrapper {
        short_values: "uC",
        short_flags: "nsL",
        privileged: true,
        ..wrapper("doas")
    },
    su("su"),
    // runuser: su's options and `-u`/`--user`.
    Wrapper {
        short_values: "cgGsuw",
        long_values: &[
            "command",
            "group",
            "supp-group",
            "shell",
            "user",
            "whitelist-environment",
        ],
        ..su("runuser")
    },
    Wrapper {
        long_values: &["user"],
        long_flags: &["disable-internal-agent", "keep-cwd"],
        privileged: true,
        ..wrapper("pkexec")
    },
    Wrapper {
        long_values: &["userspec", "groups"],
        long_flags: &["skip-chdir"],
        operands: 1,
        privileged: true,
        ..wrapper("chroot")
    },
    wrapper("nohup"),
    Wrapper {
        short_values: "n",
        long_values: &["adjustment"],
        ..wrapper("nice")
    },
    Wrapper {
        short_values: "cnpPu",
        short_flags: "t",
        long_values: &["class", "classdata", "pid", "pgid", "uid"],
        long_flags: &["ignore"],
        ..wrapper("ionice")
    },
    Wrapper {
        short_values: "sk",
        short_flags: "v",
        long_values: &["signal", "kill-after"],
        long_flags: &["preserve-status", "foreground", "verbose"],
        operands: 1,
        ..wrapper("timeout")
    },
    Wrapper {
        short_values: "of",
        short_flags: "apqv",
        long_values: &["output", "format"],
        long_flags: &["append", "portability", "quiet", "verbose"],
        ..wrapper("time")
    },
    Wrapper {
        short_flags: "pvV",
        ..wrapper("command")
    },
    wrapper("builtin"),
    Wrapper {
        short_values: "a",
        short_flags: "cl",
        ..wrapper("exec")
    },
    Wrapper {
        short_values: "adEILnPs",
        short_attached: "eil",
        short_flags: "0oprtx",
        long_values: &[
            "arg-file",
            "delimiter",
            "max-args",
            "max-procs",
            "max-chars",
            "process-slot-var",
        ],
        long_flags: &[
            "null",
            "no-run-if-empty",
            "open-tty",
            "interactive",
            "verbose",
            "exit",
            "show-limits",
            "replace",
            "eof",
            "max-lines",
        ],
        ..wrapper("xargs")
    },
    Wrapper {
        short_values: "ioe",
        long_values: &["input", "output", "error"],
        ..wrapper("stdbuf")
    },
    Wrapper {
        short_flags: "cfw",
        long_flags: &["ctty", "fork", "wait"],
        ..wrapper("setsid")
    },
    Wrapper {
        short_values: "wEc",
        short_flags: "sxenuoFv",
        long_values: &["timeout", "wait", "conflict-exit-code", "command"],
        long_flags: &[
            "shared",
            "exclusive",
            "nonblock",
            "nb",
            "unlock",
            "close",
            "no-fork",
            "verbose",
        ],
        operands: 1,
        ..wrapper("flock")
    },
    Wrapper {
        short_flags: "p",
        ..wrapper("unbuffer")
    },
];

/// `watch` runs its arguments, joined, with `sh -c`.
pub(super) const WATCH: Wrapper = Wrapper {
    short_values: "nq",
    short_flags: "bcdegtxwpr",
    long_values: &["interval", "equexit"],
    long_flags: &[
        "beep",
        "color",
        "no-color",
        "differences",
        "errexit",
        "chgexit",
        "exec",
        "no-title",
        "no-wrap",
        "precise",
        "no-rerun",
    ],
    ..wrapper("watch")
};

pub(super) fn is_interpreter(name: &str) -> bool {
    INTERPRETERS.contains(&name)
        || ["python", "pypy", "ruby", "perl", "php", "node", "lua"]
            .iter()
            .any(|p| {
                name.strip_prefix(p).is_some_and(|v| {
                    !v.is_empty() && v.chars().all(|c| c.is_ascii_digit() || c == '.')
                })
            })
}

/// A wrapper's options as read.
#[derive(Debug, Default)]
pub(super) struct Options {
    /// Index (in the words after the program) where the command starts.
    pub(super) command: Option<usize>,
    /// Options with values, by name (`u`, `user`, …).
    pub(super) values: Vec<(String, String)>,
    /// Short flags seen.
    pub(super) flags: String,
    /// Why the command found may not be the one that runs.
    pub(super) opaque: Option<String>,
}

pub(super) fn parse_options(spec: &Wrapper, args: &[Arg]) -> Options {
    let mut out = Options::default();
    let mut operands = spec.operands;
    let mut i = 0;
    let name = spec.name;
    while let Some(arg) = args.get(i) {
        let w = arg.text.as_str();
        if !arg.is_literal() {
            // `env $X rm …`: $X may be an option, an assignment or the program.
            out.opaque
                .get_or_insert_with(|| format!("follows `{name}` words the gateway cannot read"));
            i += 1;
            continue;
        }
        if w == "--" {
            i += 1;
            // `env -- A=1 cmd`, `sudo -- A=1 cmd`: assignments still come first.
            while spec.assignments && args.get(i).is_some_and(|a| is_assignment(&a.text)) {
                let var = args[i].text.split_once('=').map_or("", |(n, _)| n);
                if steers_execution(var) {
                    out.opaque
                        .get_or_insert_with(|| format!("runs with {var} set on its command line"));
                }
                i += 1;
            }
            skip_operands(&mut i, &mut operands, args);
            break;
        }
        if spec.assignments && is_assignment(w) {
            let var = w.split_once('=').map_or(w, |(n, _)| n);
            if steers_execution(var) {
                out.opaque
                    .get_or_insert_with(|| format!("runs with {var} set on its command line"));
            }
            i += 1;
            continue;
        }
        if let Some(long) = w.strip_prefix("--").filter(|l| !l.is_empty()) {
            let (key, attached) = match long.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (long, None),
            };
            if spec.long_values.contains(&key) {
                let value = match attached {
                    Some(v) => v.to_owned(),
                    None => {
                        i += 1;
                        args.get(i).map(|a| a.text.clone()).unwrap_or_default()
                    }
                };
                out.values.push((key.to_owned(), value));
            } else if spec.long_flags.contains(&key) {
                out.values
                    .push((key.to_owned(), attached.unwrap_or_default().to_owned()));
            } else {
                out.opaque.get_or_insert_with(|| {
                    format!("follows `{name}` option `--{key}`, unknown to the gateway")
                });
            }
            i += 1;
            continue;
        }
        if w == "-" && name == "env" {
            i += 1;
            continue;
        }
        if let Some(cluster) = w.strip_prefix('-').filter(|c| !c.is_empty()) {
            if name == "nice" && cluster.trim_start_matches('-').parse::<i32>().is_ok() {
                i += 1;
                continue;
            }
            for (at, c) in cluster.char_indices() {
                let rest = &cluster[at + c.len_utf8()..];
                if spec.short_values.contains(c) {
                    let value = if rest.is_empty() {
                        i += 1;
                        args.get(i).map(|a| a.text.clone()).unwrap_or_default()
                    } else {
                        rest.to_owned()
                    };
                    out.values.push((c.to_string(), value));
                    break;
                }
                if spec.short_attached.contains(c) {
                    out.values.push((c.to_string(), rest.to_owned()));
                    out.flags.push(c);
                    break;
                }
                if !spec.short_flags.contains(c) {
                    out.opaque.get_or_insert_with(|| {
                        format!("follows `{name}` option `-{c}`, unknown to the gateway")
                    });
                }
                out.flags.push(c);
            }
            i += 1;
            continue;
        }
        skip_operands(&mut i, &mut operands, args);
        break;
    }
    if i < args.len() {
        out.command = Some(i);
    }
    out
}

/// Whether `name` is an interpreter, shell or wrapper: something a remembered
/// rule must never be keyed on.
pub fn runs_other_code(name: &str) -> bool {
    SHELLS.contains(&name)
        || is_interpreter(name)
        || WRAPPERS.iter().any(|w| w.name == name)
        || matches!(name, "watch" | "busybox" | "eval" | "source" | "." | "trap")
}

/// Variables that choose what program runs or what code it loads: a command
/// run with one of them set is opaque.
pub(super) fn steers_execution(name: &str) -> bool {
    let name = name.to_ascii_uppercase();
    const EXACT: [&str; 18] = [
        "PATH",
        "IFS",
        "ENV",
        "BASH_ENV",
        "SHELLOPTS",
        "BASHOPTS",
        "PS4",
        "PROMPT_COMMAND",
        "EDITOR",
        "VISUAL",
        "PAGER",
        "HOME",
        "XDG_CONFIG_HOME",
        "ZDOTDIR",
        "LESSOPEN",
        "LESSCLOSE",
        "CC",
        "RUSTC",
    ];
    const PREFIXES: [&str; 5] = ["LD_", "DYLD_", "BASH_FUNC_", "GIT_", "NPM_CONFIG_"];
    const SUFFIXES: [&str; 11] = [
        "PATH", "LIB", "_COMMAND", "_EDITOR", "_PAGER", "_WRAPPER", "_ASKPASS", "_SSH", "OPT",
        "OPTS", "OPTIONS",
    ];
    EXACT.contains(&name.as_str())
        || PREFIXES.iter().any(|p| name.starts_with(p))
        || SUFFIXES.iter().any(|s| name.ends_with(s))
        || name.ends_with("SHELL")
}

/// Steps over a wrapper's operands (`timeout 5`, `chroot /root`).
pub(super) fn skip_operands(i: &mut usize, operands: &mut usize, args: &[Arg]) {
    while *operands > 0 && *i < args.len() {
        *operands -= 1;
        *i += 1;
    }
}
