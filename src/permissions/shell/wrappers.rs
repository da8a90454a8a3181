//! Commands that run other commands: shells given `-c`, interpreters,
//! `env`, `sudo`, `xargs`, `timeout`, `find -exec`, `watch` and the other
//! wrappers, each with its own options, unwrapped to the command they run.

use super::parts::{join, opaque_text, Ctx, Part, Tail, Walker, MAX_DEPTH};
use super::programs::{
    is_interpreter, parse_options, runs_other_code, steers_execution, Wrapper, INLINE_CODE, SHELLS,
    WATCH, WRAPPERS,
};
use super::words::{is_assignment, program_forms, Arg};

impl Walker {
    /// A command's words (and what it has besides them), wrappers unwrapped.
    pub(super) fn invocation(&mut self, args: &[Arg], tail: &Tail, ctx: &Ctx) {
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
    pub(super) fn shell(
        &mut self,
        mut part: Part,
        args: &[Arg],
        tail: &Tail,
        ctx: &Ctx,
        inner: &Ctx,
    ) {
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
    pub(super) fn wrapped(
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
    pub(super) fn find_exec(&mut self, args: &[Arg], tail: &Tail, ctx: &Ctx) {
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

/// A word with a substitution, or one that could not be read, makes its
/// command opaque.
pub(super) fn note_unseen(arg: &Arg, tail: &mut Tail) {
    if arg.substitutes {
        tail.opaque
            .get_or_insert_with(|| "has a command substitution".into());
    } else if arg.broken {
        tail.opaque
            .get_or_insert_with(|| "has a word the gateway cannot read".into());
    }
}
