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
//!
//! This file holds the public API ([`parse_line`], [`parse_argv`],
//! [`runs_other_code`]) and the deadline every parse runs under. Under
//! `shell/`: `walk.rs` walks the parsed tree, `words.rs` reads words,
//! `wrappers.rs` unwraps the commands that run other commands,
//! `programs.rs` knows which those are and how their options look, and
//! `parts.rs` holds what the walk collects and carries.

mod walk;
mod wrappers;
#[cfg(test)]
mod tests;
mod programs;
mod parts;
mod words;

pub use self::parts::Part;
pub use self::programs::runs_other_code;

use self::parts::{opaque_text, Ctx, Tail, Walker};
use self::words::Arg;

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
