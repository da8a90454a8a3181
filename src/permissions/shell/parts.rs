//! What a walk collects and carries: the [`Part`]s a line runs, the
//! `Walker` that gathers them within its bounds (depth, parts, parser calls,
//! text size and nesting), the context inherited down the walk, and the
//! opaque part that stands for text the engine cannot see into.

use super::words::{decode_ansi_c_quotes, program_forms};

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
pub(super) const MAX_DEPTH: usize = 16;

/// How many parts one tool call may have before the rest is not looked at.
pub(super) const MAX_PARTS: usize = 256;

/// The longest text handed to the parser.
pub(super) const MAX_TEXT: usize = 64 * 1024;

/// The deepest bracket nesting handed to the parser: its backtracking is
/// exponential in unclosed brackets, so such text is not parsed at all.
pub(super) const MAX_NESTING: usize = 12;

/// The most brackets left open in text handed to the parser.
pub(super) const MAX_UNCLOSED: usize = 6;

/// How many times one tool call may call the parser.
pub(super) const MAX_CALLS: usize = 4096;

/// Inherited down the walk.
#[derive(Debug, Clone, Default)]
pub(super) struct Ctx {
    pub(super) depth: usize,
    /// Every part found here is opaque for this reason (inside `eval`, …).
    pub(super) opaque: Option<String>,
    /// Found only by unwrapping a program that may not be what its name
    /// says (`./env rm …`): deny rules look, nothing else counts.
    pub(super) deny_only: bool,
}

impl Ctx {
    pub(super) fn deeper(&self) -> Ctx {
        Ctx {
            depth: self.depth + 1,
            ..self.clone()
        }
    }

    pub(super) fn opaque(&self, reason: impl Into<String>) -> Ctx {
        Ctx {
            opaque: self.opaque.clone().or_else(|| Some(reason.into())),
            ..self.clone()
        }
    }
}

/// What a simple command has besides its words.
#[derive(Debug, Clone, Default)]
pub(super) struct Tail {
    /// The redirections as text, appended to every part's text.
    pub(super) redirects: String,
    /// Here-documents and here-strings: what the command reads on stdin.
    pub(super) stdin: Vec<String>,
    /// Why every part of this command is opaque.
    pub(super) opaque: Option<String>,
}

#[derive(Default)]
pub(super) struct Walker {
    pub(super) parts: Vec<Part>,
    /// More parts than [`MAX_PARTS`] were found, or the parser was called
    /// [`MAX_CALLS`] times.
    pub(super) overflow: bool,
    /// Calls to the parser so far.
    pub(super) calls: usize,
}

pub(super) fn join<'a>(words: impl Iterator<Item = &'a str>, redirects: &str) -> String {
    let mut text = words.collect::<Vec<_>>().join(" ");
    if !redirects.is_empty() {
        text.push(' ');
        text.push_str(redirects);
    }
    text
}

/// A part for text the engine cannot see into.
pub(super) fn opaque_text(text: &str, reason: &str) -> Part {
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
pub(super) fn fragments(text: &str) -> Vec<String> {
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
