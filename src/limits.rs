//! Limits on what users send, each answered with a 422 that names the field.
//! `docs/security.md` lists them; the request body as a whole is limited by
//! `max_body_bytes` (413).

use crate::error::{Error, Result};

/// A conversation's title, in characters.
pub const TITLE_MAX_CHARS: usize = 200;
/// A token's label, in characters.
pub const LABEL_MAX_CHARS: usize = 200;
/// A conversation's working directory, in characters (at most 4 bytes
/// each: within Linux' `PATH_MAX` of 4096 bytes).
pub const CWD_MAX_CHARS: usize = 1024;
/// An agent profile's name, in bytes.
pub const AGENT_NAME_MAX_BYTES: usize = 64;
/// What an agent profile's name is made of (the config file's rule), as
/// the OpenAPI document states it.
pub const AGENT_NAME_PATTERN: &str = "^[a-z0-9_-]+$";
/// Content blocks in one prompt.
pub const PROMPT_MAX_BLOCKS: usize = 1000;
/// A policy rule's name, in characters.
pub const POLICY_NAME_MAX_CHARS: usize = 100;
/// Rules in one policy list.
pub const POLICY_MAX_RULES: usize = 1000;
/// A session mode id, configuration option id or value, in characters.
pub const SETTING_ID_MAX_CHARS: usize = 200;
/// A reason a person gives with an answer, in characters.
pub const REASON_MAX_CHARS: usize = 2000;

/// [`line`]'s rule as a JSON Schema pattern (no C0 or C1 control
/// character, as [`char::is_control`]).
pub const LINE_PATTERN: &str = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$";

/// One line of text a person typed: at most `max` characters, no control
/// characters (a NUL in particular, which Postgres text cannot hold).
pub fn line(field: &str, value: &str, max: usize) -> Result<()> {
    if value.chars().count() > max {
        return Err(Error::Unprocessable(format!(
            "{field} must be at most {max} characters"
        )));
    }
    if value.chars().any(char::is_control) {
        return Err(Error::Unprocessable(format!(
            "{field} must not contain control characters"
        )));
    }
    Ok(())
}

/// Text a person typed, over lines: at most `max` characters, no control
/// characters but newlines and tabs.
pub fn text(field: &str, value: &str, max: usize) -> Result<()> {
    if value.chars().count() > max {
        return Err(Error::Unprocessable(format!(
            "{field} must be at most {max} characters"
        )));
    }
    if value
        .chars()
        .any(|c| c.is_control() && c != '\n' && c != '\t')
    {
        return Err(Error::Unprocessable(format!(
            "{field} must not contain control characters other than newlines and tabs"
        )));
    }
    Ok(())
}

/// An id a person picked: a [`line`] of at least one character.
pub fn id(field: &str, value: &str, max: usize) -> Result<()> {
    if value.is_empty() {
        return Err(Error::Unprocessable(format!("{field} must not be empty")));
    }
    line(field, value, max)
}

/// [`path`]'s rule as a JSON Schema pattern (its length aside).
pub const PATH_PATTERN: &str = "^/[^\\u0000]*$";

/// A path: absolute, at most `max` characters, no NUL; named without being
/// echoed back.
pub fn path(field: &str, value: &str, max: usize) -> Result<()> {
    if !value.starts_with('/') {
        return Err(Error::Unprocessable(format!(
            "{field} must be an absolute path"
        )));
    }
    if value.chars().count() > max {
        return Err(Error::Unprocessable(format!(
            "{field} must be at most {max} characters"
        )));
    }
    if value.contains('\0') {
        return Err(Error::Unprocessable(format!(
            "{field} must not contain NUL characters"
        )));
    }
    Ok(())
}

/// An agent profile's name as a request gives it: of the shape every
/// profile's name has ([`AGENT_NAME_PATTERN`], at most
/// [`AGENT_NAME_MAX_BYTES`]), so that the OpenAPI document can say which
/// names are well-formed (422 otherwise) and a well-formed unknown one is a
/// 404.
pub fn agent_name(field: &str, value: &str) -> Result<()> {
    let shaped = !value.is_empty()
        && value
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if !shaped || value.len() > AGENT_NAME_MAX_BYTES {
        return Err(Error::Unprocessable(format!(
            "{field} must be a profile name: 1 to {AGENT_NAME_MAX_BYTES} of a-z, 0-9, _ and -"
        )));
    }
    Ok(())
}

/// At most `max` items.
pub fn count(field: &str, len: usize, max: usize) -> Result<()> {
    if len > max {
        return Err(Error::Unprocessable(format!(
            "{field} must have at most {max} items"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_bounded_and_free_of_control_characters() {
        assert!(line("title", "a normal title", TITLE_MAX_CHARS).is_ok());
        assert!(line("title", &"é".repeat(200), TITLE_MAX_CHARS).is_ok());
        assert!(line("title", &"é".repeat(201), TITLE_MAX_CHARS).is_err());
        assert!(line("title", "nul\0here", TITLE_MAX_CHARS).is_err());
        assert!(line("title", "two\nlines", TITLE_MAX_CHARS).is_err());
        assert!(path("cwd", "/tmp", CWD_MAX_CHARS).is_ok());
        assert!(path("cwd", "tmp", CWD_MAX_CHARS).is_err());
        assert!(path("cwd", "", CWD_MAX_CHARS).is_err());
        assert!(path("cwd", "/tmp/\0", CWD_MAX_CHARS).is_err());
        assert!(path("cwd", &format!("/{}", "é".repeat(1023)), CWD_MAX_CHARS).is_ok());
        assert!(path("cwd", &format!("/{}", "a".repeat(1024)), CWD_MAX_CHARS).is_err());
        assert!(count("content", 1001, PROMPT_MAX_BLOCKS).is_err());
    }

    #[test]
    fn agent_names_are_what_the_pattern_says() {
        let pattern = regex::Regex::new(AGENT_NAME_PATTERN).unwrap();
        for name in [
            "demo",
            "claude-code",
            "a_1",
            "",
            "Demo",
            "a b",
            "é",
            "a\n",
            "a\0",
            "x.y",
        ] {
            let by_pattern = pattern.is_match(name) && name.len() <= AGENT_NAME_MAX_BYTES;
            assert_eq!(agent_name("agent", name).is_ok(), by_pattern, "{name:?}");
        }
        assert!(agent_name("agent", &"a".repeat(64)).is_ok());
        assert!(agent_name("agent", &"a".repeat(65)).is_err());
    }
}
