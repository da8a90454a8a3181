//! Words, apart from the walk: the [`Arg`] a word becomes (its text with
//! quotes removed, and whether it expands, substitutes or is a pattern), how
//! a program word is known (a path in a system directory by its basename),
//! assignments, brace patterns, and decoding `$'…'` and backquoted text
//! (`r''m`, `"rm"`, `\rm` and `$'\x72m'` are all `rm`).

use brush_parser::ParserOptions;

/// Directories whose programs are known by their basename.
pub(super) const SYSTEM_DIRS: [&str; 8] = [
    "/bin",
    "/sbin",
    "/usr/bin",
    "/usr/sbin",
    "/usr/local/bin",
    "/usr/local/sbin",
    "/opt/homebrew/bin",
    "/run/current-system/sw/bin",
];

/// One word of a command, quotes removed.
#[derive(Debug, Clone, Default)]
pub(super) struct Arg {
    pub(super) text: String,
    /// Holds a parameter expansion, arithmetic or substitution: its value is
    /// known only when it runs.
    pub(super) expands: bool,
    /// Holds a command or process substitution.
    pub(super) substitutes: bool,
    /// An unquoted glob or brace pattern.
    pub(super) pattern: bool,
    /// The word itself did not parse.
    pub(super) broken: bool,
}

impl Arg {
    pub(super) fn literal(text: &str) -> Arg {
        Arg {
            text: text.to_owned(),
            ..Arg::default()
        }
    }

    pub(super) fn is_literal(&self) -> bool {
        !self.expands && !self.substitutes && !self.pattern && !self.broken
    }
}

pub(super) fn is_assignment(word: &str) -> bool {
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
pub(super) fn program_forms(word: &str) -> (String, String, bool) {
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

/// `text` with every `$'…'` replaced by what it stands for.
pub(super) fn decode_ansi_c_quotes(text: &str) -> String {
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

/// `{a,b}` or `{1..3}` outside quotes: brace expansion makes several words.
pub(super) fn is_brace_pattern(raw: &str) -> bool {
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
pub(super) fn unescape_backquoted(script: &str) -> String {
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
pub(super) fn ansi_c(text: &str) -> String {
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
pub(super) fn digits(
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
