//! YAML that reads the same to a YAML 1.1 parser as to a YAML 1.2 one, for
//! the committed OpenAPI document. Its emitter (`yaml_serde`, YAML 1.2)
//! quotes a string only where YAML 1.2 would read it as something else, so
//! `off`, `yes` or `y` come out plain, and PyYAML (what schemathesis and
//! Python client generators load the document with) reads them as booleans,
//! `2024-01-01` as a date and `1_000` or `1:20` as numbers. Here every plain
//! scalar that YAML 1.1 would not read as a string is single-quoted, and the
//! result is checked to hold exactly the values it was made from.

use std::sync::LazyLock;

use anyhow::{ensure, Context};
use regex::Regex;

/// The plain scalars YAML 1.1 resolves to something other than a string:
/// the implicit types of its schema (bool, with `y` and `n`; null; int and
/// float with `_`, base prefixes and base 60; timestamp; merge `<<`; value
/// `=`), as the YAML 1.1 type pages and PyYAML's resolver write them.
static NOT_A_STRING: LazyLock<Regex> = LazyLock::new(|| {
    let bool = "y|Y|yes|Yes|YES|n|N|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF";
    let null = "~|null|Null|NULL";
    let int = r"[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+|[-+]?[1-9][0-9_]*(?::[0-5]?[0-9])+";
    // PyYAML's floats, and the spec's looser `1.2.3`-like ones.
    let float = r"[-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+][0-9]+)?|[-+]?(?:[0-9][0-9_]*)?\.[0-9.]*(?:[eE][-+][0-9]+)?|[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)";
    let timestamp = r"[0-9]{4}-[0-9]{2}-[0-9]{2}|[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}(?:[Tt]|[ \t]+)[0-9]{1,2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]*)?(?:[ \t]*(?:Z|[-+][0-9]{1,2}(?::[0-9]{2})?))?";
    let merge_and_value = "<<|=";
    Regex::new(&format!(
        "^(?:{bool}|{null}|{int}|{float}|{timestamp}|{merge_and_value})$"
    ))
    .expect("a valid pattern")
});

/// Whether YAML 1.1 reads `scalar`, written plain, as anything but that string.
pub fn ambiguous_in_yaml_1_1(scalar: &str) -> bool {
    NOT_A_STRING.is_match(scalar)
}

/// `yaml` as `yaml_serde` writes it (block style, no line width, multi-line
/// strings as literal blocks) with each plain string key or value that
/// YAML 1.1 reads as a non-string single-quoted. Fails if the result does not hold
/// the same values as `yaml` (a layout this does not know).
pub fn quote_for_yaml_1_1(yaml: &str) -> anyhow::Result<String> {
    let mut out = String::with_capacity(yaml.len() + 256);
    let mut block: Option<Block> = None;
    for line in yaml.split_inclusive('\n') {
        let text = line.strip_suffix('\n').unwrap_or(line);
        let indent = text.len() - text.trim_start_matches(' ').len();
        let blank = text.trim().is_empty();
        if let Some(open) = &mut block {
            let inside = match open.content_indent {
                _ if blank => true,
                Some(content) => indent >= content,
                None => indent > open.header_indent,
            };
            if inside {
                open.content_indent.get_or_insert(indent);
                out.push_str(line);
                continue;
            }
        }
        let (quoted, opens) = quote_line(text, indent);
        out.push_str(&quoted);
        out.push_str(&line[text.len()..]);
        block = opens;
    }
    let before: serde_json::Value =
        yaml_serde::from_str(yaml).context("Failed to read the emitted YAML")?;
    let after: serde_json::Value =
        yaml_serde::from_str(&out).context("Failed to read the requoted YAML")?;
    ensure!(
        before == after,
        "quoting the YAML 1.1 booleans and the like changed the document's values"
    );
    Ok(out)
}

/// A literal or folded block scalar being passed over: its content is the
/// lines indented at least as its first one (more than its header line).
struct Block {
    header_indent: usize,
    /// With an explicit indentation indicator the first line may be indented
    /// more than the rest; any line indented past the header then counts.
    content_indent: Option<usize>,
}

/// One line outside block scalars: `- `, `? `, `: ` prefixes, then a key
/// and its value, or a value alone. Returns the line with its ambiguous
/// plain scalars quoted, and the block scalar its value opens, if any.
fn quote_line(text: &str, indent: usize) -> (String, Option<Block>) {
    let mut start = indent;
    while let Some(rest) = text.get(start..) {
        if ["- ", "? ", ": "].iter().any(|p| rest.starts_with(p)) {
            start += 2;
        } else {
            break;
        }
    }
    let mut out = text[..start].to_owned();
    let rest = &text[start..];
    let (value, opens) = match key_length(rest) {
        Some(key_len) => {
            out.push_str(&quoted_plain(&rest[..key_len]));
            out.push(':');
            match rest[key_len + 1..].strip_prefix(' ') {
                Some(value) => {
                    out.push(' ');
                    (value, block_header(value, indent))
                }
                None => ("", None),
            }
        }
        None => (rest, block_header(rest, indent)),
    };
    if opens.is_some() {
        out.push_str(value);
    } else {
        out.push_str(&quoted_plain(value));
    }
    (out, opens)
}

/// The length of the key `node` begins with, if it is a `key: value` or
/// `key:` line: a quoted scalar or a plain one (which holds no `: `)
/// followed by `:` and a space or the end.
fn key_length(node: &str) -> Option<usize> {
    let end = match node.chars().next()? {
        '\'' => {
            let mut i = 1;
            loop {
                let at = i + node[i..].find('\'')?;
                if node[at + 1..].starts_with('\'') {
                    i = at + 2;
                } else {
                    break at + 1;
                }
            }
        }
        '"' => {
            let mut escaped = false;
            let at = node[1..].char_indices().find_map(|(i, c)| {
                let closes = c == '"' && !escaped;
                escaped = c == '\\' && !escaped;
                closes.then_some(i)
            })?;
            at + 2
        }
        // A plain key holds no `: `; a plain value cannot end in `:`.
        _ => {
            return match node.find(": ") {
                Some(end) => Some(end),
                None => node.strip_suffix(':').map(str::len),
            };
        }
    };
    let after = &node[end..];
    (after == ":" || after.starts_with(": ")).then_some(end)
}

/// `scalar` single-quoted if it is a plain string (as YAML 1.2 reads it:
/// numbers, booleans and nulls stay as they are) that YAML 1.1 reads as
/// something else, else as it is.
fn quoted_plain(scalar: &str) -> String {
    let plain = !scalar.starts_with(['\'', '"', '[', '{', '&', '*', '!', '|', '>']);
    let string =
        || yaml_serde::from_str::<serde_json::Value>(scalar).is_ok_and(|value| value.is_string());
    if plain && ambiguous_in_yaml_1_1(scalar) && string() {
        format!("'{scalar}'")
    } else {
        scalar.to_owned()
    }
}

/// The block scalar a value opens (`|`, `|-`, `>2+` …), if it is one.
fn block_header(value: &str, header_indent: usize) -> Option<Block> {
    let mut chars = value.chars();
    if !matches!(chars.next(), Some('|' | '>')) {
        return None;
    }
    let hints = chars.as_str();
    if !hints
        .chars()
        .all(|c| c.is_ascii_digit() || c == '-' || c == '+')
    {
        return None;
    }
    Some(Block {
        header_indent,
        content_indent: if hints.chars().any(|c| c.is_ascii_digit()) {
            Some(header_indent + 1)
        } else {
            None
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_1_1_booleans_nulls_numbers_and_dates_are_ambiguous_and_words_are_not() {
        for scalar in [
            "off",
            "On",
            "YES",
            "no",
            "y",
            "N",
            "true",
            "~",
            "null",
            "010",
            "1_000",
            "0x1F",
            "1:20",
            "1.5",
            "0.1.0",
            ".inf",
            "2024-01-01",
            "<<",
            "=",
        ] {
            assert!(ambiguous_in_yaml_1_1(scalar), "{scalar}");
        }
        for scalar in [
            "auto",
            "required",
            "offline",
            "yes please",
            "o",
            "x1",
            "v1.2",
            "0o",
        ] {
            assert!(!ambiguous_in_yaml_1_1(scalar), "{scalar}");
        }
    }

    #[test]
    fn plain_keys_and_values_are_quoted_where_yaml_1_1_reads_them_otherwise() {
        let yaml = "\
a:
  enum:
  - auto
  - off
  off: 'yes'
  nested:
  - - y
    - n: on
  version: 0.1.0
  words: turn it off
  count: 3
  ratio: 0.5
  flag: true
  none: null
  text: |-
    off
    - on
    key: no
  after: no
? off
: 2024-01-01
";
        let quoted = quote_for_yaml_1_1(yaml).unwrap();
        assert_eq!(
            quoted,
            "\
a:
  enum:
  - auto
  - 'off'
  'off': 'yes'
  nested:
  - - 'y'
    - 'n': 'on'
  version: '0.1.0'
  words: turn it off
  count: 3
  ratio: 0.5
  flag: true
  none: null
  text: |-
    off
    - on
    key: no
  after: 'no'
? 'off'
: '2024-01-01'
"
        );
    }

    #[test]
    fn a_block_scalar_ends_where_its_indentation_does() {
        let yaml = "- key: |\n    on\n    off\n  other: off\n- off\n";
        assert_eq!(
            quote_for_yaml_1_1(yaml).unwrap(),
            "- key: |\n    on\n    off\n  other: 'off'\n- 'off'\n"
        );
    }
}
