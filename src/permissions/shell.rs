//! What a shell command line runs, as the policy engine sees it.
//!
//! A line is parsed with `brush-parser` (POSIX and bash syntax) and walked for
//! every command it can run: the parts of `;`, `&&`, `||`, `&` and pipelines,
//! subshells, brace groups, `if`/`for`/`while`/`until`/`case`, function
//! bodies, `coproc`, and the commands inside command substitutions (`$(…)`,
//! backticks) and process substitutions (`<(…)`, `>(…)`), wherever they
//! appear: in words, assignments, redirections, here-documents, `[[ … ]]` and
//! arithmetic. Words have their quotes and escapes removed (`r''m`, `"rm"`,
//! `\rm` and `$'\x72m'` are all `rm`).
//!
//! Wrappers are unwrapped to the command they run: shells given a script with
//! `-c` in any option cluster (`sh -lc`, `bash -ec`, `bash --login -c`),
//! `env`, `sudo`, `doas`, `su -c`, `nohup`, `nice`, `ionice`, `timeout`,
//! `time`, `command`, `builtin`, `exec`, `xargs`, `stdbuf`, `setsid`,
//! `chroot`, `flock`, `unbuffer`, `watch`, `busybox`, `eval`, `trap`, and the
//! commands of `find -exec`, each with its own options, nested to any depth.
//! A program given by a path in a system directory is known by its basename
//! (`/bin/rm` is `rm`); one given by any other path keeps it (`./ls` is not
//! `ls`), and deny rules see both forms.
//!
//! Nothing is expanded or run: this is a pure function of the text. What the
//! engine cannot see into is marked *opaque* (never allowed without a person,
//! though deny rules still look at what is visible): a line that does not
//! parse, a command with a substitution, a program named by an expansion or a
//! pattern (`$CMD args`, `/bin/r?`), a script from a file or from standard
//! input (`bash x.sh`, `curl … | sh`, `bash <<EOF`), `eval`, `source`,
//! `alias`, and commands run with variables that choose what runs (`PATH=…`,
//! `LD_PRELOAD=…`, …).

use brush_parser::ast;
use brush_parser::word::WordPiece;
use brush_parser::ParserOptions;

/// One command a line runs (or a wrapper around one), for the rules to decide on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// What the rules' regexes see: the words, quotes removed, the program
    /// first, then the redirections.
    pub text: String,
    /// Other forms deny rules look at too: the text with the program as its
    /// basename when it was given by a path outside the system directories;
    /// for text that could not be parsed, every run of its words.
    pub also: Vec<String>,
    /// The program as [`Part::text`] shows it (empty when none is visible).
    pub program: String,
    /// A wrapper: deny rules apply to it, the commands inside decide the rest.
    pub wrapper: bool,
    /// Why the engine cannot see what this runs (`None`: it can).
    pub opaque: Option<String>,
    /// Why an "always" answer must not be keyed on this program.
    pub unrememberable: Option<String>,
}

/// How deep substitutions, `sh -c` scripts and wrappers may nest.
const MAX_DEPTH: usize = 16;
/// How many parts one tool call may have before the rest is not looked at.
const MAX_PARTS: usize = 256;
/// The longest text handed to the parser.
const MAX_TEXT: usize = 64 * 1024;
/// The deepest bracket nesting handed to the parser: its backtracking is
/// exponential in unclosed brackets, so such text is not parsed at all.
const MAX_NESTING: usize = 12;
/// The most brackets left open in text handed to the parser.
const MAX_UNCLOSED: usize = 6;
/// How many times one tool call may call the parser.
const MAX_CALLS: usize = 4096;

/// Directories whose programs are known by their basename.
const SYSTEM_DIRS: [&str; 8] = [
    "/bin",
    "/sbin",
    "/usr/bin",
    "/usr/sbin",
    "/usr/local/bin",
    "/usr/local/sbin",
    "/opt/homebrew/bin",
    "/run/current-system/sw/bin",
];

/// Shells: `-c` runs their argument as a command line.
const SHELLS: [&str; 16] = [
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
const INTERPRETERS: [&str; 36] = [
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
const INLINE_CODE: [&str; 9] = [
    "-c", "-e", "-E", "--eval", "-p", "--print", "-r", "eval", "-Command",
];

/// How a wrapper's options look, so the command after them can be found.
struct Wrapper {
    name: &'static str,
    /// Short options that take a value (attached or in the next word).
    short_values: &'static str,
    /// Short options whose value can only be attached (`xargs -i{}`).
    short_attached: &'static str,
    /// Short options without a value.
    short_flags: &'static str,
    /// Long options that take a value (`--name value` or `--name=value`).
    long_values: &'static [&'static str],
    /// Long options without a value (or with an attached `=value`).
    long_flags: &'static [&'static str],
    /// Words between the options and the command (`timeout`'s duration).
    operands: usize,
    /// `NAME=value` words may come before the command.
    assignments: bool,
    /// Runs the command as another user or in another root: the wrapper is a
    /// command that must be allowed as well.
    privileged: bool,
}

const fn wrapper(name: &'static str) -> Wrapper {
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

const WRAPPERS: [Wrapper; 20] = [
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
        ..wrapper("su")
    },
    Wrapper {
        short_values: "cgGsuw",
        short_flags: "lmpPf",
        long_values: &[
            "command",
            "group",
            "supp-group",
            "shell",
            "user",
            "whitelist-environment",
        ],
        long_flags: &["login", "preserve-environment", "pty", "fast"],
        privileged: true,
        ..wrapper("runuser")
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
const WATCH: Wrapper = Wrapper {
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

/// Parses a command line into the parts it runs. Never fails: what does not
/// parse is one opaque part holding the line.
pub fn parse_line(line: &str) -> Vec<Part> {
    let owned = line.to_owned();
    guarded(line, move |walker| {
        walker.line(&owned, &Ctx::default());
    })
}

/// The parts an argv array runs: its words are taken literally (no shell
/// reads them), then unwrapped like a line's.
pub fn parse_argv(argv: &[&str]) -> Vec<Part> {
    let args: Vec<Arg> = argv.iter().map(|w| Arg::literal(w)).collect();
    guarded(&argv.join(" "), move |walker| {
        if !args.is_empty() {
            walker.invocation(&args, &Tail::default(), &Ctx::default());
        }
    })
}

/// How long one parse may take before its text counts as opaque.
const PARSE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(2);
/// Parses still running past their deadline; beyond two, nothing more is
/// parsed until they end (each holds a thread).
static OVERDUE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
const MAX_OVERDUE: usize = 2;
/// Why a part is opaque when its parse took too long.
pub const TOO_SLOW: &str = "took too long to parse";

/// Walks on a thread of its own, waiting at most [`PARSE_DEADLINE`]: a
/// parser that loops (brush-parser has inputs it never finishes) leaves the
/// text opaque instead of stalling the conversation.
fn guarded(whole: &str, walk: impl FnOnce(&mut Walker) + Send + 'static) -> Vec<Part> {
    within(PARSE_DEADLINE, move || {
        let mut walker = Walker::default();
        walk(&mut walker);
        walker
    })
    .map_or_else(
        || vec![opaque_text(whole, TOO_SLOW)],
        |walker| walker.finish(whole),
    )
}

/// Runs `f` on a thread of its own and waits at most `deadline` for it.
/// `None` when it is late (it goes on and is counted until it ends) or when
/// too many earlier calls are still overdue.
fn within<T: Send + 'static>(
    deadline: std::time::Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    use std::sync::atomic::Ordering;
    use std::sync::{Arc, Mutex};
    if OVERDUE.load(Ordering::SeqCst) >= MAX_OVERDUE {
        return None;
    }
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    // Set by the waiter when it gives up, under the lock, so the worker
    // knows whether to take itself off the overdue count.
    let abandoned = Arc::new(Mutex::new(false));
    let worker_abandoned = abandoned.clone();
    let spawned = std::thread::Builder::new()
        .name("shell-parse".into())
        .spawn(move || {
            let value = f();
            let abandoned = worker_abandoned.lock().unwrap_or_else(|e| e.into_inner());
            if *abandoned {
                OVERDUE.fetch_sub(1, Ordering::SeqCst);
            } else {
                let _ = tx.send(value);
            }
        });
    if spawned.is_err() {
        return None;
    }
    match rx.recv_timeout(deadline) {
        Ok(value) => Some(value),
        Err(_) => {
            let mut gave_up = abandoned.lock().unwrap_or_else(|e| e.into_inner());
            // The value may have arrived while we took the lock.
            if let Ok(value) = rx.try_recv() {
                return Some(value);
            }
            *gave_up = true;
            OVERDUE.fetch_add(1, Ordering::SeqCst);
            tracing::error!(
                "a shell command line took over {deadline:?} to parse; treating it as opaque"
            );
            None
        }
    }
}

/// Whether `name` is an interpreter, shell or wrapper: something a remembered
/// rule must never be keyed on.
pub fn runs_other_code(name: &str) -> bool {
    SHELLS.contains(&name)
        || is_interpreter(name)
        || WRAPPERS.iter().any(|w| w.name == name)
        || matches!(name, "watch" | "busybox" | "eval" | "source" | "." | "trap")
}

fn is_interpreter(name: &str) -> bool {
    INTERPRETERS.contains(&name)
        || ["python", "pypy", "ruby", "perl", "php", "node", "lua"]
            .iter()
            .any(|p| {
                name.strip_prefix(p).is_some_and(|v| {
                    !v.is_empty() && v.chars().all(|c| c.is_ascii_digit() || c == '.')
                })
            })
}

/// Variables that choose what program runs or what code it loads: a command
/// run with one of them set is opaque.
fn steers_execution(name: &str) -> bool {
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

/// Inherited down the walk.
#[derive(Debug, Clone, Default)]
struct Ctx {
    depth: usize,
    /// Every part found here is opaque for this reason (inside `eval`, …).
    opaque: Option<String>,
    /// Found only by unwrapping a program that may not be what its name
    /// says (`./env rm …`): deny rules look, nothing else counts.
    deny_only: bool,
}

impl Ctx {
    fn deeper(&self) -> Ctx {
        Ctx {
            depth: self.depth + 1,
            ..self.clone()
        }
    }

    fn opaque(&self, reason: impl Into<String>) -> Ctx {
        Ctx {
            opaque: self.opaque.clone().or_else(|| Some(reason.into())),
            ..self.clone()
        }
    }
}

/// One word of a command, quotes removed.
#[derive(Debug, Clone, Default)]
struct Arg {
    text: String,
    /// Holds a parameter expansion, arithmetic or substitution: its value is
    /// known only when it runs.
    expands: bool,
    /// Holds a command or process substitution.
    substitutes: bool,
    /// An unquoted glob or brace pattern.
    pattern: bool,
    /// The word itself did not parse.
    broken: bool,
}

impl Arg {
    fn literal(text: &str) -> Arg {
        Arg {
            text: text.to_owned(),
            ..Arg::default()
        }
    }

    fn is_literal(&self) -> bool {
        !self.expands && !self.substitutes && !self.pattern && !self.broken
    }
}

/// What a simple command has besides its words.
#[derive(Debug, Clone, Default)]
struct Tail {
    /// The redirections as text, appended to every part's text.
    redirects: String,
    /// Here-documents and here-strings: what the command reads on stdin.
    stdin: Vec<String>,
    /// Why every part of this command is opaque.
    opaque: Option<String>,
}

#[derive(Default)]
struct Walker {
    parts: Vec<Part>,
    /// More parts than [`MAX_PARTS`] were found, or the parser was called
    /// [`MAX_CALLS`] times.
    overflow: bool,
    /// Calls to the parser so far.
    calls: usize,
}

impl Walker {
    /// Whether `text` may go to the parser: it is bounded in size and in
    /// unclosed nesting (which the parser's backtracking is exponential in),
    /// and so is the number of calls for one tool call.
    fn may_parse(&mut self, text: &str) -> bool {
        self.calls += 1;
        if self.calls > MAX_CALLS {
            self.overflow = true;
            return false;
        }
        let (deepest, unclosed) = nesting(text);
        text.len() <= MAX_TEXT
            && deepest <= MAX_NESTING
            && unclosed <= MAX_UNCLOSED
            && !expanding_heredoc_delimiter(text)
    }

    fn finish(mut self, whole: &str) -> Vec<Part> {
        if self.overflow {
            self.parts.push(opaque_text(
                whole,
                "is too long or complex for the gateway to look into",
            ));
        }
        self.parts
    }

    fn push(&mut self, mut part: Part, ctx: &Ctx) {
        if self.parts.len() >= MAX_PARTS {
            self.overflow = true;
            return;
        }
        if part.opaque.is_none() {
            part.opaque = ctx.opaque.clone();
        }
        if ctx.deny_only {
            part.wrapper = true;
        }
        if !self.parts.contains(&part) {
            self.parts.push(part);
        }
    }

    /// A command line, parsed; false when it could not be.
    fn line(&mut self, text: &str, ctx: &Ctx) -> bool {
        if text.trim().is_empty() {
            return true;
        }
        if ctx.depth > MAX_DEPTH {
            self.push(opaque_text(text, "nests too deeply to look into"), ctx);
            return false;
        }
        if !self.may_parse(text) {
            self.push(opaque_text(text, "is too long or nested to parse"), ctx);
            return false;
        }
        let options = ParserOptions::default();
        let parsed = std::panic::catch_unwind(|| {
            brush_parser::Parser::new(std::io::Cursor::new(text.as_bytes()), &options)
                .parse_program()
        });
        match parsed {
            Ok(Ok(program)) => {
                for list in &program.complete_commands {
                    self.list(list, ctx);
                }
                true
            }
            _ => {
                self.push(opaque_text(text, "cannot be parsed"), ctx);
                false
            }
        }
    }

    fn list(&mut self, list: &ast::CompoundList, ctx: &Ctx) {
        for ast::CompoundListItem(and_or, _) in &list.0 {
            self.pipeline(&and_or.first, ctx);
            for next in &and_or.additional {
                match next {
                    ast::AndOr::And(p) | ast::AndOr::Or(p) => self.pipeline(p, ctx),
                }
            }
        }
    }

    fn pipeline(&mut self, pipeline: &ast::Pipeline, ctx: &Ctx) {
        for command in &pipeline.seq {
            self.command(command, ctx);
        }
    }

    fn command(&mut self, command: &ast::Command, ctx: &Ctx) {
        match command {
            ast::Command::Simple(simple) => self.simple(simple, ctx),
            ast::Command::Compound(compound, redirects) => {
                self.compound(compound, ctx);
                self.redirect_list(redirects.as_ref(), ctx);
            }
            ast::Command::Function(function) => {
                // A body may run whenever the function is called: its
                // commands count as if they ran here.
                self.compound(&function.body.0, ctx);
                self.redirect_list(function.body.1.as_ref(), ctx);
            }
            ast::Command::ExtendedTest(test, redirects) => {
                self.extended_test(&test.expr, ctx);
                self.redirect_list(redirects.as_ref(), ctx);
            }
        }
    }

    fn compound(&mut self, compound: &ast::CompoundCommand, ctx: &Ctx) {
        use ast::CompoundCommand as C;
        match compound {
            C::Arithmetic(a) => {
                self.arithmetic(&a.expr.value, ctx);
                // dash runs `((cmd))` as two nested subshells, and the parser
                // reads `( (cmd) )` as arithmetic: its text may be commands.
                let ctx = ctx.deeper().opaque("may run as a command (`((…))`)");
                self.line(&a.expr.value, &ctx);
            }
            C::ArithmeticForClause(f) => {
                for expr in [&f.initializer, &f.condition, &f.updater]
                    .into_iter()
                    .flatten()
                {
                    self.arithmetic(&expr.value, ctx);
                }
                self.list(&f.body.list, ctx);
            }
            C::BraceGroup(g) => self.list(&g.list, ctx),
            C::Subshell(s) => self.list(&s.list, ctx),
            C::ForClause(f) => {
                for word in f.values.iter().flatten() {
                    self.word(&word.value, ctx);
                }
                self.list(&f.body.list, ctx);
            }
            C::CaseClause(c) => {
                self.word(&c.value.value, ctx);
                for item in &c.cases {
                    for pattern in &item.patterns {
                        self.word(&pattern.value, ctx);
                    }
                    if let Some(list) = &item.cmd {
                        self.list(list, ctx);
                    }
                }
            }
            C::IfClause(i) => {
                self.list(&i.condition, ctx);
                self.list(&i.then, ctx);
                for clause in i.elses.iter().flatten() {
                    if let Some(condition) = &clause.condition {
                        self.list(condition, ctx);
                    }
                    self.list(&clause.body, ctx);
                }
            }
            C::WhileClause(w) | C::UntilClause(w) => {
                self.list(&w.0, ctx);
                self.list(&w.1.list, ctx);
            }
            C::Coprocess(c) => self.command(&c.body, ctx),
        }
    }

    fn extended_test(&mut self, expr: &ast::ExtendedTestExpr, ctx: &Ctx) {
        use ast::ExtendedTestExpr as E;
        match expr {
            E::And(a, b) | E::Or(a, b) => {
                self.extended_test(a, ctx);
                self.extended_test(b, ctx);
            }
            E::Not(e) | E::Parenthesized(e) => self.extended_test(e, ctx),
            E::UnaryTest(_, w) => {
                self.word(&w.value, ctx);
            }
            E::BinaryTest(_, a, b) => {
                self.word(&a.value, ctx);
                self.word(&b.value, ctx);
            }
        }
    }

    /// Redirections of a compound command: only their substitutions matter.
    fn redirect_list(&mut self, list: Option<&ast::RedirectList>, ctx: &Ctx) {
        let mut tail = Tail::default();
        for redirect in list.into_iter().flat_map(|l| &l.0) {
            self.redirect(redirect, &mut tail, ctx);
        }
        if let Some(reason) = tail.opaque {
            let text = tail.redirects.trim().to_owned();
            self.push(opaque_text(&text, &reason), ctx);
        }
    }

    fn simple(&mut self, command: &ast::SimpleCommand, ctx: &Ctx) {
        use ast::CommandPrefixOrSuffixItem as Item;
        let mut args: Vec<Arg> = Vec::new();
        let mut tail = Tail::default();
        let mut assignments: Vec<String> = Vec::new();
        let mut steered: Option<String> = None;
        let prefix = command.prefix.iter().flat_map(|p| &p.0);
        for item in prefix {
            match item {
                Item::AssignmentWord(assignment, word) => {
                    let arg = self.word(&word.value, ctx);
                    note_unseen(&arg, &mut tail);
                    let (ast::AssignmentName::VariableName(name)
                    | ast::AssignmentName::ArrayElementName(name, _)) = &assignment.name;
                    if steers_execution(name) {
                        steered.get_or_insert(name.clone());
                    }
                    assignments.push(arg.text);
                }
                other => self.item(other, &mut args, &mut tail, ctx),
            }
        }
        if let Some(word) = &command.word_or_name {
            let arg = self.word(&word.value, ctx);
            args.push(arg);
        }
        for item in command.suffix.iter().flat_map(|s| &s.0) {
            self.item(item, &mut args, &mut tail, ctx);
        }
        if let Some(name) = steered {
            tail.opaque.get_or_insert(if args.is_empty() {
                format!("sets {name} for the commands after it")
            } else {
                format!("runs with {name} set on its command line")
            });
        }
        if args.is_empty() {
            // Only assignments and redirections: `> file` still writes.
            if tail.opaque.is_some() || !tail.redirects.is_empty() {
                let text = [assignments.join(" "), tail.redirects.clone()]
                    .iter()
                    .filter(|s| !s.is_empty())
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(" ");
                self.push(
                    Part {
                        text,
                        also: Vec::new(),
                        program: String::new(),
                        wrapper: false,
                        opaque: tail.opaque.clone(),
                        unrememberable: Some("it runs no program".into()),
                    },
                    ctx,
                );
            }
            return;
        }
        self.invocation(&args, &tail, ctx);
    }

    fn item(
        &mut self,
        item: &ast::CommandPrefixOrSuffixItem,
        args: &mut Vec<Arg>,
        tail: &mut Tail,
        ctx: &Ctx,
    ) {
        use ast::CommandPrefixOrSuffixItem as Item;
        match item {
            Item::IoRedirect(redirect) => self.redirect(redirect, tail, ctx),
            Item::Word(word) | Item::AssignmentWord(_, word) => {
                let arg = self.word(&word.value, ctx);
                note_unseen(&arg, tail);
                args.push(arg);
            }
            Item::ProcessSubstitution(kind, subshell) => {
                self.list(&subshell.list, &ctx.deeper());
                tail.opaque
                    .get_or_insert("has a process substitution".into());
                args.push(Arg {
                    text: format!("{kind}{subshell}"),
                    expands: true,
                    substitutes: true,
                    ..Arg::default()
                });
            }
        }
    }

    fn redirect(&mut self, redirect: &ast::IoRedirect, tail: &mut Tail, ctx: &Ctx) {
        use ast::IoFileRedirectKind as K;
        use ast::IoFileRedirectTarget as T;
        let fd = |fd: &Option<i32>| fd.map(|n| n.to_string()).unwrap_or_default();
        let text = match redirect {
            ast::IoRedirect::File(n, kind, target) => {
                let op = match kind {
                    K::Read => "<",
                    K::Write => ">",
                    K::Append => ">>",
                    K::ReadAndWrite => "<>",
                    K::Clobber => ">|",
                    K::DuplicateInput => "<&",
                    K::DuplicateOutput => ">&",
                };
                let target = match target {
                    T::Filename(w) => format!(" {}", self.redirect_word(&w.value, tail, ctx)),
                    T::Fd(n) => n.to_string(),
                    T::Duplicate(w) => self.redirect_word(&w.value, tail, ctx),
                    T::ProcessSubstitution(kind, subshell) => {
                        self.list(&subshell.list, &ctx.deeper());
                        tail.opaque
                            .get_or_insert("has a process substitution".into());
                        format!(" {kind}{subshell}")
                    }
                };
                format!("{}{op}{target}", fd(n))
            }
            ast::IoRedirect::HereDocument(n, doc) => {
                let body = &doc.doc.value;
                if doc.requires_expansion && self.heredoc_substitutes(body, ctx) {
                    tail.opaque
                        .get_or_insert("has a command substitution".into());
                }
                tail.stdin.push(body.clone());
                let end = self.word(&doc.here_end.value, ctx).text;
                format!("{}<<{end}", fd(n))
            }
            ast::IoRedirect::HereString(n, w) => {
                let arg = self.word(&w.value, ctx);
                note_unseen(&arg, tail);
                tail.stdin.push(arg.text.clone());
                format!("{}<<< {}", fd(n), arg.text)
            }
            ast::IoRedirect::OutputAndError(w, append) => {
                let target = self.redirect_word(&w.value, tail, ctx);
                format!("{} {target}", if *append { "&>>" } else { "&>" })
            }
        };
        if !tail.redirects.is_empty() {
            tail.redirects.push(' ');
        }
        tail.redirects.push_str(&text);
    }

    fn redirect_word(&mut self, raw: &str, tail: &mut Tail, ctx: &Ctx) -> String {
        let arg = self.word(raw, ctx);
        note_unseen(&arg, tail);
        arg.text
    }

    /// Walks the substitutions of an expanding here-document; true if any.
    fn heredoc_substitutes(&mut self, body: &str, ctx: &Ctx) -> bool {
        if !self.may_parse(body) {
            self.push(opaque_text(body, "is too long or nested to parse"), ctx);
            return true;
        }
        let options = ParserOptions::default();
        let pieces = std::panic::catch_unwind(|| brush_parser::word::parse_heredoc(body, &options));
        match pieces {
            Ok(Ok(pieces)) => {
                let mut arg = Arg::default();
                self.pieces(body, &pieces, false, &mut arg, ctx);
                arg.substitutes
            }
            _ => {
                self.push(opaque_text(body, "cannot be parsed"), ctx);
                true
            }
        }
    }

    /// An arithmetic expression: only its substitutions matter.
    fn arithmetic(&mut self, expr: &str, ctx: &Ctx) {
        let arg = self.word(expr, ctx);
        if arg.substitutes {
            self.push(opaque_text(expr, "has a command substitution"), ctx);
        }
    }

    /// A word with its quotes removed; its substitutions are walked.
    fn word(&mut self, raw: &str, ctx: &Ctx) -> Arg {
        let mut arg = Arg::default();
        if ctx.depth > MAX_DEPTH || !self.may_parse(raw) {
            self.push(opaque_text(raw, "is too long or nested to parse"), ctx);
            return Arg {
                text: raw.to_owned(),
                broken: true,
                expands: true,
                ..Arg::default()
            };
        }
        let options = ParserOptions::default();
        let pieces = std::panic::catch_unwind(|| brush_parser::word::parse(raw, &options));
        match pieces {
            Ok(Ok(pieces)) => self.pieces(raw, &pieces, false, &mut arg, ctx),
            _ => {
                arg.text = raw.to_owned();
                arg.broken = true;
                arg.expands = true;
            }
        }
        if !arg.pattern && is_brace_pattern(raw) {
            arg.pattern = true;
        }
        arg
    }

    fn pieces(
        &mut self,
        raw: &str,
        pieces: &[brush_parser::word::WordPieceWithSource],
        quoted: bool,
        arg: &mut Arg,
        ctx: &Ctx,
    ) {
        for piece in pieces {
            let source = raw.get(piece.start_index..piece.end_index).unwrap_or("");
            match &piece.piece {
                WordPiece::Text(text) => {
                    if !quoted && text.contains(['*', '?', '[']) {
                        arg.pattern = true;
                    }
                    // A `$` the word parser left as text before `{` or `(`
                    // is an expansion it could not read (`${x<(y)}`).
                    let next = raw.get(piece.end_index..).unwrap_or("");
                    if text.ends_with('$') && next.starts_with(['{', '(']) {
                        arg.broken = true;
                        arg.expands = true;
                    }
                    arg.text.push_str(text);
                }
                WordPiece::SingleQuotedText(text) => arg.text.push_str(text),
                WordPiece::AnsiCQuotedText(text) => arg.text.push_str(&ansi_c(text)),
                WordPiece::DoubleQuotedSequence(inner)
                | WordPiece::GettextDoubleQuotedSequence(inner) => {
                    self.pieces(raw, inner, true, arg, ctx);
                }
                WordPiece::TildeExpansion(_) => arg.text.push_str(source),
                WordPiece::ParameterExpansion(_) => {
                    arg.expands = true;
                    arg.text.push_str(source);
                    // `${X:-$(cmd)}`: what is inside the braces is a word too.
                    if let Some(inner) = source.strip_prefix("${").and_then(|s| s.strip_suffix('}'))
                    {
                        if inner.contains(['$', '`']) {
                            let inner = self.word(inner, &ctx.deeper());
                            arg.substitutes |= inner.substitutes;
                        }
                    }
                }
                WordPiece::CommandSubstitution(script) => {
                    arg.expands = true;
                    arg.substitutes = true;
                    arg.text.push_str(source);
                    if !self.line(script, &ctx.deeper()) {
                        // The word parser may have ended the substitution
                        // early (`$(case x in *) …)`): deny rules see it all.
                        self.push(opaque_text(raw, "cannot be parsed"), ctx);
                    }
                }
                WordPiece::BackquotedCommandSubstitution(script) => {
                    arg.expands = true;
                    arg.substitutes = true;
                    arg.text.push_str(source);
                    if !self.line(&unescape_backquoted(script), &ctx.deeper()) {
                        self.push(opaque_text(raw, "cannot be parsed"), ctx);
                    }
                }
                WordPiece::EscapeSequence(escaped) => {
                    let mut chars = escaped.chars();
                    chars.next(); // the backslash
                    let rest = chars.as_str();
                    if rest != "\n" {
                        arg.text.push_str(rest);
                    }
                }
                WordPiece::ArithmeticExpression(expr) => {
                    arg.expands = true;
                    arg.text.push_str(source);
                    let inner = self.word(&expr.value, &ctx.deeper());
                    arg.substitutes |= inner.substitutes;
                }
            }
        }
    }

    /// A command's words (and what it has besides them), wrappers unwrapped.
    fn invocation(&mut self, args: &[Arg], tail: &Tail, ctx: &Ctx) {
        let Some(first) = args.first() else { return };
        let ctx = &match &tail.opaque {
            Some(reason) => ctx.opaque(reason.clone()),
            None => ctx.clone(),
        };
        if ctx.depth > MAX_DEPTH {
            let text = join(args.iter().map(|a| a.text.as_str()), &tail.redirects);
            return self.push(opaque_text(&text, "nests too deeply to look into"), ctx);
        }
        let (shown, basename, known) = program_forms(&first.text);
        let rest: Vec<&str> = args[1..].iter().map(|a| a.text.as_str()).collect();
        let text = join(
            std::iter::once(shown.as_str()).chain(rest.iter().copied()),
            &tail.redirects,
        );
        let also: Vec<String> = (!known)
            .then(|| {
                join(
                    std::iter::once(basename.as_str()).chain(rest.iter().copied()),
                    &tail.redirects,
                )
            })
            .into_iter()
            .collect();
        let mut part = Part {
            text,
            also,
            program: shown.clone(),
            wrapper: false,
            opaque: None,
            unrememberable: None,
        };
        if first.is_literal() && is_assignment(&first.text) && args.len() > 1 {
            // A program named `A=1` (`xargs A=1 rm`) is odd: look past it.
            part.opaque = Some("runs a program named like an assignment".into());
            self.push(part, ctx);
            let inner = ctx.opaque("follows a program named like an assignment");
            return self.invocation(&args[1..], tail, &inner.deeper());
        }
        if !first.is_literal() {
            part.program = String::new();
            part.opaque = Some(if first.pattern {
                "runs a program named by a pattern".into()
            } else {
                "runs a program named by an expansion".into()
            });
            return self.push(part, ctx);
        }
        // What is inside a program that may not be what its name says is
        // looked at by deny rules only.
        let inner = if known {
            ctx.deeper()
        } else {
            Ctx {
                deny_only: true,
                ..ctx.deeper()
            }
        };
        let name = basename.as_str();
        if runs_other_code(name) {
            part.unrememberable = Some(format!("`{name}` runs other commands"));
        }
        if SHELLS.contains(&name) {
            return self.shell(part, args, tail, ctx, &inner);
        }
        if is_interpreter(name) {
            let inline = args
                .get(1)
                .filter(|a| INLINE_CODE.contains(&a.text.as_str()));
            part.unrememberable = Some(match inline {
                Some(flag) => format!(
                    "`{name} {} …` runs code the gateway cannot see into",
                    flag.text
                ),
                None => format!("`{name}` runs code the gateway cannot see into"),
            });
            return self.push(part, ctx);
        }
        match name {
            "eval" => {
                part.wrapper = !inner.deny_only;
                self.push(part, ctx);
                let script = rest.join(" ");
                self.line(&script, &inner.opaque("is run by eval"));
            }
            "source" | "." => {
                let file = rest.first().copied().unwrap_or("");
                part.opaque = Some(format!("runs the script file `{file}`"));
                self.push(part, ctx);
            }
            "trap" if args.len() > 2 && !rest[0].starts_with('-') => {
                part.wrapper = !inner.deny_only;
                self.push(part, ctx);
                self.line(rest[0], &inner.opaque("runs later, from a trap"));
            }
            "alias" => {
                part.opaque = Some("defines an alias".into());
                self.push(part, ctx);
            }
            "hash" | "enable"
                if rest
                    .iter()
                    .any(|a| a.starts_with('-') && a.contains(['p', 'f'])) =>
            {
                part.opaque = Some("changes which program a name runs".into());
                self.push(part, ctx);
            }
            "export" | "declare" | "typeset" | "local" | "readonly" => {
                if let Some(var) = rest
                    .iter()
                    .filter_map(|a| a.split_once('=').map(|(n, _)| n))
                    .find(|n| steers_execution(n))
                {
                    part.opaque = Some(format!("sets {var} for the commands after it"));
                }
                self.push(part, ctx);
            }
            "find" => {
                self.push(part, ctx);
                self.find_exec(&args[1..], tail, &inner);
            }
            "busybox" if args.len() > 1 => {
                part.wrapper = !inner.deny_only;
                self.push(part, ctx);
                self.invocation(&args[1..], tail, &inner);
            }
            "watch" => self.wrapped(&WATCH, part, args, tail, ctx, &inner),
            _ => match WRAPPERS.iter().find(|w| w.name == name) {
                Some(spec) => self.wrapped(spec, part, args, tail, ctx, &inner),
                None => self.push(part, ctx),
            },
        }
    }

    /// `sh -c 'script'`, `bash script.sh`, `… | sh`, `bash <<EOF`.
    fn shell(&mut self, mut part: Part, args: &[Arg], tail: &Tail, ctx: &Ctx, inner: &Ctx) {
        let mut command = false;
        let mut stdin = false;
        let mut i = 1;
        while let Some(arg) = args.get(i) {
            let w = arg.text.as_str();
            if !arg.is_literal() {
                part.opaque = Some("has shell options the gateway cannot read".into());
                break;
            }
            if w == "--" || w == "-" {
                i += 1;
                break;
            }
            if let Some(long) = w.strip_prefix("--") {
                if long == "command" {
                    command = true;
                }
                let takes_value =
                    ["rcfile", "init-file", "emulate", "init-command"].contains(&long);
                i += if takes_value { 2 } else { 1 };
                continue;
            }
            if w.len() > 1 && (w.starts_with('-') || w.starts_with('+')) {
                let mut values = 0;
                for c in w[1..].chars() {
                    match c {
                        'c' if w.starts_with('-') => command = true,
                        's' => stdin = true,
                        'o' | 'O' => values += 1,
                        _ => {}
                    }
                }
                i += 1 + values;
                continue;
            }
            break;
        }
        if command {
            part.wrapper = part.opaque.is_none() && !inner.deny_only;
            let script = args.get(i);
            match script {
                Some(script) if script.is_literal() => {
                    self.push(part, ctx);
                    self.line(&script.text, inner);
                }
                Some(script) => {
                    part.opaque = Some("runs a script built from expansions".into());
                    part.wrapper = false;
                    self.push(part, ctx);
                    self.line(
                        &script.text,
                        &inner.opaque("is part of a script built from expansions"),
                    );
                }
                None => {
                    part.wrapper = false;
                    part.opaque = Some("has no script after -c".into());
                    self.push(part, ctx);
                }
            }
            return;
        }
        match args.get(i) {
            Some(file) if !stdin => {
                part.opaque = Some(format!("runs the script file `{}`", file.text));
            }
            _ => {
                part.opaque = Some("runs a script from its standard input".into());
                for script in &tail.stdin {
                    self.line(
                        script,
                        &inner.opaque("is fed to a shell on its standard input"),
                    );
                }
            }
        }
        self.push(part, ctx);
    }

    /// A wrapper from the table: its options, then the command it runs.
    fn wrapped(
        &mut self,
        spec: &Wrapper,
        mut part: Part,
        args: &[Arg],
        tail: &Tail,
        ctx: &Ctx,
        inner: &Ctx,
    ) {
        let parsed = parse_options(spec, &args[1..]);
        let mut inner = inner.clone();
        if let Some(reason) = &parsed.opaque {
            inner = inner.opaque(reason.clone());
            part.opaque = Some(reason.clone());
        }
        let value = |keys: &[&str]| {
            parsed
                .values
                .iter()
                .find(|(k, _)| keys.contains(&k.as_str()))
                .map(|(_, v)| v.clone())
        };
        let mut command: &[Arg] = parsed.command.map_or(&[], |i| &args[1 + i..]);
        // Around a command the wrapper only lets deny rules look at it; a
        // privileged one must be allowed as well.
        part.wrapper = !inner.deny_only && !spec.privileged;
        let mut script = match spec.name {
            // `su root -c 'cmd'`: su takes its options after the user too.
            "su" | "runuser" => value(&["c", "command"]).or_else(|| {
                let at = command
                    .iter()
                    .position(|a| matches!(a.text.as_str(), "-c" | "--command"))?;
                command.get(at + 1).map(|a| a.text.clone())
            }),
            _ => None,
        };
        if spec.name == "flock" {
            // `flock FILE -c 'command line'`.
            script = value(&["c", "command"]);
            if let [flag, line, ..] = command {
                if matches!(flag.text.as_str(), "-c" | "--command") {
                    script = Some(line.text.clone());
                }
            }
        }
        if let Some(script) = script {
            self.push(part, ctx);
            self.line(&script, &inner);
            return;
        }
        if spec.name == "su" || (spec.name == "runuser" && value(&["u", "user"]).is_none()) {
            // `su [user [args…]]` hands the args to the user's shell.
            part.wrapper = false;
            part.opaque = Some("starts the user's shell".into());
            return self.push(part, ctx);
        }
        if spec.name == "command" && parsed.flags.contains(['v', 'V']) {
            // `command -v x` only looks `x` up.
            command = &[];
        }
        let mut command = command.to_vec();
        if let Some(split) = value(&["S", "split-string"]) {
            // `env -S 'rm -rf ~'`: env splits the string into words itself.
            command = split
                .split_whitespace()
                .map(Arg::literal)
                .chain(command)
                .collect();
            inner = inner.opaque("is split out of `env -S`");
        }
        if command.is_empty() {
            // Nothing to run but the wrapper itself (`env`, `sudo -l`).
            part.wrapper = false;
            if spec.name == "chroot" {
                part.opaque = Some("starts a shell".into());
            }
            return self.push(part, ctx);
        }
        self.push(part, ctx);
        if spec.name == "watch" && !parsed.flags.contains('x') {
            // `watch` joins its words and runs them with `sh -c`.
            let words: Vec<&str> = command.iter().map(|a| a.text.as_str()).collect();
            self.line(&words.join(" "), &inner);
            return;
        }
        if spec.name == "xargs"
            && (value(&["I", "i", "replace"]).is_some() || parsed.flags.contains('i'))
        {
            inner = inner.opaque("gets its words from `xargs -I`");
        }
        self.invocation(&command, tail, &inner);
    }

    /// `find … -exec cmd {} ;` runs `cmd`.
    fn find_exec(&mut self, args: &[Arg], tail: &Tail, ctx: &Ctx) {
        let mut i = 0;
        while i < args.len() {
            let w = args[i].text.as_str();
            if matches!(w, "-exec" | "-execdir" | "-ok" | "-okdir") {
                let start = i + 1;
                let mut end = start;
                while end < args.len() && !matches!(args[end].text.as_str(), ";" | "+") {
                    end += 1;
                }
                if end > start {
                    let tail = Tail {
                        redirects: String::new(),
                        stdin: Vec::new(),
                        opaque: tail.opaque.clone(),
                    };
                    self.invocation(&args[start..end], &tail, ctx);
                }
                i = end;
            }
            i += 1;
        }
    }
}

/// A wrapper's options as read.
#[derive(Debug, Default)]
struct Options {
    /// Index (in the words after the program) where the command starts.
    command: Option<usize>,
    /// Options with values, by name (`u`, `user`, …).
    values: Vec<(String, String)>,
    /// Short flags seen.
    flags: String,
    /// Why the command found may not be the one that runs.
    opaque: Option<String>,
}

fn parse_options(spec: &Wrapper, args: &[Arg]) -> Options {
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

/// A word with a substitution, or one that could not be read, makes its
/// command opaque.
fn note_unseen(arg: &Arg, tail: &mut Tail) {
    if arg.substitutes {
        tail.opaque
            .get_or_insert_with(|| "has a command substitution".into());
    } else if arg.broken {
        tail.opaque
            .get_or_insert_with(|| "has a word the gateway cannot read".into());
    }
}

/// Steps over a wrapper's operands (`timeout 5`, `chroot /root`).
fn skip_operands(i: &mut usize, operands: &mut usize, args: &[Arg]) {
    while *operands > 0 && *i < args.len() {
        *operands -= 1;
        *i += 1;
    }
}

fn is_assignment(word: &str) -> bool {
    match word.split_once('=') {
        Some((name, _)) => {
            !name.is_empty()
                && !name.starts_with(|c: char| c.is_ascii_digit())
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        }
        None => false,
    }
}

/// How a program word is shown, its basename, and whether it is known by
/// its basename (a bare name, or a path in a system directory).
fn program_forms(word: &str) -> (String, String, bool) {
    let Some((dir, base)) = word.rsplit_once('/') else {
        return (word.to_owned(), word.to_owned(), true);
    };
    if base.is_empty() {
        return (word.to_owned(), word.to_owned(), false);
    }
    // `/usr//bin/../bin/rm` is still in `/usr/bin`.
    let mut parts: Vec<&str> = Vec::new();
    for part in dir.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            part => parts.push(part),
        }
    }
    let dir = format!("/{}", parts.join("/"));
    let system = word.starts_with('/') && SYSTEM_DIRS.contains(&dir.as_str());
    if system {
        (base.to_owned(), base.to_owned(), true)
    } else {
        (word.to_owned(), base.to_owned(), false)
    }
}

fn join<'a>(words: impl Iterator<Item = &'a str>, redirects: &str) -> String {
    let mut text = words.collect::<Vec<_>>().join(" ");
    if !redirects.is_empty() {
        text.push(' ');
        text.push_str(redirects);
    }
    text
}

/// A part for text the engine cannot see into.
fn opaque_text(text: &str, reason: &str) -> Part {
    let text = text.trim();
    Part {
        text: text.to_owned(),
        also: fragments(text),
        program: String::new(),
        wrapper: false,
        opaque: Some(reason.to_owned()),
        unrememberable: None,
    }
}

/// Every run of words in text that could not be parsed, from each word to
/// the next shell operator, quotes and backslashes dropped and the first
/// word as its basename: whatever the text would run, deny rules see it.
fn fragments(text: &str) -> Vec<String> {
    const MAX_FRAGMENTS: usize = 4096;
    const MAX_FRAGMENT: usize = 512;
    let cleaned: String = decode_ansi_c_quotes(text)
        .chars()
        .filter(|c| !matches!(c, '\'' | '"' | '\\'))
        .collect();
    let operator = |c: char| ";&|(){}`<>\n".contains(c);
    let mut out: Vec<String> = Vec::new();
    for segment in cleaned.split(operator) {
        let words: Vec<&str> = segment.split_whitespace().collect();
        for start in 0..words.len() {
            let (_, base, _) = program_forms(words[start].trim_start_matches('$'));
            let mut fragment = base;
            for word in &words[start + 1..] {
                if fragment.len() > MAX_FRAGMENT {
                    break;
                }
                fragment.push(' ');
                fragment.push_str(word);
            }
            if fragment != text && !out.contains(&fragment) {
                out.push(fragment);
            }
            if out.len() >= MAX_FRAGMENTS {
                return out;
            }
        }
    }
    out
}

/// A here-document delimiter with `$` or a backquote in it (`<<e$(…`): no
/// real script has one, and brush-parser's tokenizer can loop forever on it.
fn expanding_heredoc_delimiter(text: &str) -> bool {
    let mut rest = text;
    while let Some(at) = rest.find("<<") {
        rest = &rest[at + 2..];
        if rest.starts_with('<') {
            rest = &rest[1..];
            continue;
        }
        let delimiter = rest
            .trim_start_matches('-')
            .trim_start_matches([' ', '\t'])
            .split(|c: char| c.is_whitespace() || ";&|<>".contains(c))
            .next()
            .unwrap_or("");
        if delimiter.contains(['$', '`']) {
            return true;
        }
    }
    false
}

/// `text` with every `$'…'` replaced by what it stands for.
fn decode_ansi_c_quotes(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("$'") {
        out.push_str(&rest[..start]);
        let body = &rest[start + 2..];
        // The closing quote is the first one not escaped by a backslash.
        let mut end = None;
        let mut escaped = false;
        for (i, c) in body.char_indices() {
            match c {
                '\\' if !escaped => escaped = true,
                '\'' if !escaped => {
                    end = Some(i);
                    break;
                }
                _ => escaped = false,
            }
        }
        match end {
            Some(end) => {
                out.push_str(&ansi_c(&body[..end]));
                rest = &body[end + 1..];
            }
            None => {
                out.push_str(&rest[start..]);
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
}

/// The deepest nesting of parentheses and braces in `text` and how many are
/// left open at its end, quotes ignored.
fn nesting(text: &str) -> (usize, usize) {
    let (mut depth, mut max) = (0usize, 0usize);
    for c in text.chars() {
        match c {
            '(' | '{' => {
                depth += 1;
                max = max.max(depth);
            }
            ')' | '}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    (max, depth)
}

/// `{a,b}` or `{1..3}` outside quotes: brace expansion makes several words.
fn is_brace_pattern(raw: &str) -> bool {
    let options = ParserOptions::default();
    raw.contains('{')
        && std::panic::catch_unwind(|| brush_parser::word::parse_brace_expansions(raw, &options))
            .map_or(true, |r| match r {
                Ok(Some(pieces)) => pieces
                    .iter()
                    .any(|p| matches!(p, brush_parser::word::BraceExpressionOrText::Expr(_))),
                Ok(None) => false,
                Err(_) => true,
            })
}

/// The text of a backquoted substitution as the shell reads it: `\$`,
/// `` \` `` and `\\` lose their backslash.
fn unescape_backquoted(script: &str) -> String {
    let mut out = String::with_capacity(script.len());
    let mut chars = script.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\\' {
            if let Some(&next) = chars.peek() {
                if matches!(next, '$' | '`' | '\\') {
                    out.push(next);
                    chars.next();
                    continue;
                }
            }
        }
        out.push(c);
    }
    out
}

/// Decodes the escapes of `$'…'` as bash does.
fn ansi_c(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        let Some(e) = chars.next() else {
            out.push('\\');
            break;
        };
        let decoded = match e {
            'a' => Some(0x07),
            'b' => Some(0x08),
            'e' | 'E' => Some(0x1b),
            'f' => Some(0x0c),
            'n' => Some(0x0a),
            'r' => Some(0x0d),
            't' => Some(0x09),
            'v' => Some(0x0b),
            '\\' | '\'' | '"' | '?' => Some(e as u32),
            '0'..='7' => {
                let (rest, count) = digits(&mut chars, 8, 2);
                Some((e as u32 - '0' as u32) * 8u32.pow(count) + rest)
            }
            'x' => Some(digits(&mut chars, 16, 2))
                .filter(|d| d.1 > 0)
                .map(|d| d.0),
            'u' => Some(digits(&mut chars, 16, 4))
                .filter(|d| d.1 > 0)
                .map(|d| d.0),
            'U' => Some(digits(&mut chars, 16, 8))
                .filter(|d| d.1 > 0)
                .map(|d| d.0),
            'c' => chars.next().map(|c| (c as u32) & 0x1f),
            _ => None,
        };
        match decoded.and_then(char::from_u32) {
            Some(c) => out.push(c),
            None => {
                out.push('\\');
                out.push(e);
            }
        }
    }
    out
}

/// Up to `max` digits in `radix`: their value and how many there were.
fn digits(
    chars: &mut std::iter::Peekable<std::str::Chars<'_>>,
    radix: u32,
    max: u32,
) -> (u32, u32) {
    let (mut value, mut count) = (0u32, 0u32);
    while count < max {
        let Some(d) = chars.peek().and_then(|c| c.to_digit(radix)) else {
            break;
        };
        value = value.saturating_mul(radix).saturating_add(d);
        chars.next();
        count += 1;
    }
    (value, count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_late_parse_is_given_up_and_counted_until_it_ends() {
        let (release, wait) = std::sync::mpsc::channel::<()>();
        let (done_tx, done) = std::sync::mpsc::channel::<()>();
        let late = within(std::time::Duration::from_millis(10), move || {
            let _ = wait.recv();
            let _ = done_tx.send(());
        });
        assert!(late.is_none());
        assert!(OVERDUE.load(std::sync::atomic::Ordering::SeqCst) >= 1);
        release.send(()).unwrap();
        done.recv_timeout(std::time::Duration::from_secs(10))
            .unwrap();
        assert_eq!(within(std::time::Duration::from_secs(10), || 7), Some(7));
    }

    #[test]
    fn parts_show_the_unwrapped_command_its_program_and_what_is_unseen() {
        let parts =
            parse_line("sudo -u me env A=1 /usr/bin/git status > out.txt && ./gradlew build");
        let shown: Vec<(&str, &str, bool)> = parts
            .iter()
            .map(|p| (p.text.as_str(), p.program.as_str(), p.wrapper))
            .collect();
        assert_eq!(
            shown,
            [
                (
                    "sudo -u me env A=1 /usr/bin/git status > out.txt",
                    "sudo",
                    false
                ),
                ("env A=1 /usr/bin/git status > out.txt", "env", true),
                ("git status > out.txt", "git", false),
                ("./gradlew build", "./gradlew", false),
            ]
        );
        assert_eq!(parts[3].also, ["gradlew build"]);
        assert_eq!(ansi_c(r"\x72\155\u00e9\n\q"), "rmé\n\\q");
        assert_eq!(decode_ansi_c_quotes(r"a $'\x72m' b"), "a rm b");
        assert_eq!(
            parse_line("ls 'x")[0].also,
            ["ls x", "x"],
            "unparsed text: every run of words"
        );
        assert!(expanding_heredoc_delimiter("cat <<e$( <<f${"));
        assert!(!expanding_heredoc_delimiter(
            "cat <<'EOF'\n$x\nEOF\n <<< $y"
        ));
    }
}
