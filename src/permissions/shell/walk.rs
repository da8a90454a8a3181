//! Walking the parsed tree: every list, pipeline, compound command, test,
//! redirection, here-document and arithmetic expression of a line, down to the
//! simple commands it runs, which become [`Part`]s; each word on the way has
//! its quotes removed and its substitutions walked in turn. Also the checks
//! that keep text the parser would choke on away from it.

use brush_parser::ast;
use brush_parser::ParserOptions;

use brush_parser::word::WordPiece;

use super::parts::{
    opaque_text, Ctx, Part, Tail, Walker, MAX_CALLS, MAX_DEPTH, MAX_NESTING, MAX_PARTS, MAX_TEXT,
    MAX_UNCLOSED,
};
use super::programs::steers_execution;
use super::words::{ansi_c, is_brace_pattern, unescape_backquoted, Arg};
use super::wrappers::note_unseen;

impl Walker {
    /// Whether `text` may go to the parser: it is bounded in size and in
    /// unclosed nesting (which the parser's backtracking is exponential in),
    /// and so is the number of calls for one tool call.
    pub(super) fn may_parse(&mut self, text: &str) -> bool {
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

    pub(super) fn finish(mut self, whole: &str) -> Vec<Part> {
        if self.overflow {
            self.parts.push(opaque_text(
                whole,
                "is too long or complex for the gateway to look into",
            ));
        }
        self.parts
    }

    pub(super) fn push(&mut self, mut part: Part, ctx: &Ctx) {
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
    pub(super) fn line(&mut self, text: &str, ctx: &Ctx) -> bool {
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

    pub(super) fn list(&mut self, list: &ast::CompoundList, ctx: &Ctx) {
        for ast::CompoundListItem(and_or, _) in &list.0 {
            self.pipeline(&and_or.first, ctx);
            for next in &and_or.additional {
                match next {
                    ast::AndOr::And(p) | ast::AndOr::Or(p) => self.pipeline(p, ctx),
                }
            }
        }
    }

    pub(super) fn pipeline(&mut self, pipeline: &ast::Pipeline, ctx: &Ctx) {
        for command in &pipeline.seq {
            self.command(command, ctx);
        }
    }

    pub(super) fn command(&mut self, command: &ast::Command, ctx: &Ctx) {
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

    pub(super) fn compound(&mut self, compound: &ast::CompoundCommand, ctx: &Ctx) {
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

    pub(super) fn extended_test(&mut self, expr: &ast::ExtendedTestExpr, ctx: &Ctx) {
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
    pub(super) fn redirect_list(&mut self, list: Option<&ast::RedirectList>, ctx: &Ctx) {
        let mut tail = Tail::default();
        for redirect in list.into_iter().flat_map(|l| &l.0) {
            self.redirect(redirect, &mut tail, ctx);
        }
        if let Some(reason) = tail.opaque {
            let text = tail.redirects.trim().to_owned();
            self.push(opaque_text(&text, &reason), ctx);
        }
    }

    pub(super) fn simple(&mut self, command: &ast::SimpleCommand, ctx: &Ctx) {
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

    pub(super) fn item(
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

    pub(super) fn redirect(&mut self, redirect: &ast::IoRedirect, tail: &mut Tail, ctx: &Ctx) {
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

    pub(super) fn redirect_word(&mut self, raw: &str, tail: &mut Tail, ctx: &Ctx) -> String {
        let arg = self.word(raw, ctx);
        note_unseen(&arg, tail);
        arg.text
    }

    /// Walks the substitutions of an expanding here-document; true if any.
    pub(super) fn heredoc_substitutes(&mut self, body: &str, ctx: &Ctx) -> bool {
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
    pub(super) fn arithmetic(&mut self, expr: &str, ctx: &Ctx) {
        let arg = self.word(expr, ctx);
        if arg.substitutes {
            self.push(opaque_text(expr, "has a command substitution"), ctx);
        }
    }
}

/// A here-document delimiter with `$` or a backquote in it (`<<e$(…`): no
/// real script has one, and brush-parser's tokenizer can loop forever on it.
pub(super) fn expanding_heredoc_delimiter(text: &str) -> bool {
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

/// The deepest nesting of parentheses and braces in `text` and how many are
/// left open at its end, quotes ignored.
pub(super) fn nesting(text: &str) -> (usize, usize) {
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

impl Walker {
    /// A word with its quotes removed; its substitutions are walked.
    pub(super) fn word(&mut self, raw: &str, ctx: &Ctx) -> Arg {
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

    pub(super) fn pieces(
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
}
