//! `fs/read_text_file` and `fs/write_text_file`, served inside the workspace.

use std::io::{BufRead, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use agent_client_protocol_schema::v1 as acp;
use serde_json::{json, Value};

use super::{as_user, Refusal, Workspace};
use crate::model::FileWritten;

/// Most text one read returns (a larger file is read in parts, with `line`
/// and `limit`).
pub const MAX_READ_BYTES: usize = 10 * 1024 * 1024;
/// Most text one write may carry.
pub const MAX_WRITE_BYTES: usize = 10 * 1024 * 1024;
/// Most of a diff published; the rest is cut, with a marker saying so.
pub const MAX_DIFF_BYTES: usize = 64 * 1024;
/// How long a diff may search for the smallest edit before it settles for
/// a larger one (two big, very different files).
const DIFF_TIME: std::time::Duration = std::time::Duration::from_millis(500);

/// `fs/read_text_file`: the file's text, from `line` (1-based) for `limit`
/// lines when given.
pub async fn read(workspace: &Workspace, params: Value) -> Result<Value, Refusal> {
    let request: acp::ReadTextFileRequest = parse(params)?;
    let path = workspace.resolve(&request.path)?;
    let (line, limit) = (request.line, request.limit);
    let shown = path.clone();
    let content = as_user(workspace.user.clone(), move || {
        read_text(&path, line, limit)
    })
    .await
    .map_err(|e| Refusal::io(&shown, e))??;
    Ok(json!({ "content": content }))
}

/// `fs/write_text_file`: the file replaced at once (a new file beside it,
/// renamed over it, its mode kept), and what changed.
pub async fn write(workspace: &Workspace, params: Value) -> Result<FileWritten, Refusal> {
    let request: acp::WriteTextFileRequest = parse(params)?;
    if request.content.len() > MAX_WRITE_BYTES {
        return Err(Refusal::invalid(format!(
            "the content is {} bytes; a write may carry at most {MAX_WRITE_BYTES}",
            request.content.len()
        )));
    }
    let path = workspace.resolve(&request.path)?;
    let shown = path.clone();
    let content = request.content;
    // The diff is made on the file thread too: it is work in proportion to
    // the file, which the session's loop should not wait on.
    let diff = as_user(workspace.user.clone(), move || {
        replace(&path, content.as_bytes())
            .map(|previous| unified_diff(&path, previous.as_deref(), &content))
    })
    .await
    .map_err(|e| Refusal::io(&shown, e))??;
    Ok(FileWritten {
        path: shown.display().to_string(),
        diff,
    })
}

fn parse<T: serde::de::DeserializeOwned>(params: Value) -> Result<T, Refusal> {
    serde_json::from_value(params).map_err(|e| Refusal::invalid(format!("invalid params: {e}")))
}

fn read_text(path: &Path, line: Option<u32>, limit: Option<u32>) -> Result<String, Refusal> {
    let io = |e| Refusal::io(path, e);
    let file = std::fs::File::open(path).map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if meta.is_dir() {
        return Err(Refusal::invalid(format!(
            "{} is a directory",
            path.display()
        )));
    }
    let not_text = || Refusal::invalid(format!("{} is not UTF-8 text", path.display()));
    let too_big = || {
        Refusal::invalid(format!(
            "{} holds more than the {MAX_READ_BYTES} bytes a read returns; read it in parts \
             with line and limit",
            path.display()
        ))
    };
    if line.is_none() && limit.is_none() {
        if meta.len() > MAX_READ_BYTES as u64 {
            return Err(too_big());
        }
        let mut text = String::new();
        return match std::io::Read::read_to_string(&mut &file, &mut text) {
            Ok(_) => Ok(text),
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => Err(not_text()),
            Err(e) => Err(io(e)),
        };
    }
    let skip = line.unwrap_or(1).max(1) - 1;
    let take = limit.map_or(usize::MAX, |n| n as usize);
    let mut reader = std::io::BufReader::new(file);
    let mut text = String::new();
    let mut buf = String::new();
    let (mut seen, mut taken) = (0u32, 0usize);
    while taken < take {
        buf.clear();
        match reader.read_line(&mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => return Err(not_text()),
            Err(e) => return Err(io(e)),
        }
        if seen < skip {
            seen += 1;
            continue;
        }
        if text.len() + buf.len() > MAX_READ_BYTES {
            return Err(too_big());
        }
        text.push_str(&buf);
        taken += 1;
    }
    Ok(text)
}

/// Replaces the file's content; what it held before (`None`: it is new).
fn replace(path: &Path, content: &[u8]) -> Result<Option<Vec<u8>>, Refusal> {
    let io = |e| Refusal::io(path, e);
    let (previous, mode) = match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => {
            return Err(Refusal::invalid(format!(
                "{} is a directory",
                path.display()
            )))
        }
        Ok(meta) => (
            Some(std::fs::read(path).map_err(io)?),
            Some(meta.permissions().mode() & 0o7777),
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => (None, None),
        Err(e) => return Err(io(e)),
    };
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(Refusal::invalid(format!(
            "{} names no file",
            path.display()
        )));
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    let mut temp = PathBuf::from(dir);
    temp.push(format!(
        ".{}.{}.acp-gateway",
        name.to_string_lossy(),
        uuid::Uuid::now_v7().simple()
    ));
    let written = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode.unwrap_or(0o666))
            .open(&temp)?;
        file.write_all(content)?;
        if let Some(mode) = mode {
            // The umask may have taken bits of the old mode.
            file.set_permissions(std::fs::Permissions::from_mode(mode))?;
        }
        file.sync_all()?;
        std::fs::rename(&temp, path)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&temp);
        return Err(io(e));
    }
    Ok(previous)
}

/// `-old`/`+new` lines against the previous content, cut beyond
/// [`MAX_DIFF_BYTES`] with a marker.
pub fn unified_diff(path: &Path, previous: Option<&[u8]>, content: &str) -> String {
    let shown = path.display().to_string();
    let old = previous.map(String::from_utf8_lossy).unwrap_or_default();
    let before = if previous.is_some() {
        shown.as_str()
    } else {
        "/dev/null"
    };
    // Past the time bound the diff is still right, only less minimal.
    let mut diff = similar::TextDiff::configure()
        .timeout(DIFF_TIME)
        .diff_lines(old.as_ref(), content)
        .unified_diff()
        .context_radius(3)
        .header(before, &shown)
        .to_string();
    if diff.len() > MAX_DIFF_BYTES {
        let mut cut = MAX_DIFF_BYTES;
        while !diff.is_char_boundary(cut) {
            cut -= 1;
        }
        let left_out = diff.len() - cut;
        diff.truncate(cut);
        if !diff.ends_with('\n') {
            diff.push('\n');
        }
        diff.push_str(&format!("[diff truncated: {left_out} more bytes]\n"));
    }
    diff
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_whole_files_and_line_ranges() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.txt");
        std::fs::write(&path, "one\ntwo\nthree\nfour").unwrap();
        assert_eq!(
            read_text(&path, None, None).unwrap(),
            "one\ntwo\nthree\nfour"
        );
        assert_eq!(read_text(&path, Some(2), Some(2)).unwrap(), "two\nthree\n");
        assert_eq!(read_text(&path, Some(3), None).unwrap(), "three\nfour");
        assert_eq!(read_text(&path, None, Some(1)).unwrap(), "one\n");
        assert_eq!(read_text(&path, Some(9), Some(1)).unwrap(), "");
        std::fs::write(&path, b"\xff\xfe").unwrap();
        assert!(read_text(&path, None, None)
            .unwrap_err()
            .message
            .contains("not UTF-8"));
        let missing = read_text(&dir.path().join("none"), None, None).unwrap_err();
        assert_eq!(missing.code, super::super::NOT_FOUND);
    }

    #[test]
    fn replacing_keeps_the_mode_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.sh");
        std::fs::write(&path, "old\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o750)).unwrap();
        assert_eq!(
            replace(&path, b"new\n").unwrap().as_deref(),
            Some(&b"old\n"[..])
        );
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new\n");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o750);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        let nested = dir.path().join("a/b/c.txt");
        assert_eq!(replace(&nested, b"x").unwrap(), None);
        assert_eq!(std::fs::read_to_string(nested).unwrap(), "x");
    }

    #[tokio::test]
    async fn reads_and_writes_beyond_the_size_limits_are_refused_and_change_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let cwd = std::fs::canonicalize(dir.path()).unwrap();
        let workspace = Workspace {
            cwd: cwd.clone(),
            allowed_roots: Vec::new(),
            user: None,
            files: true,
            terminals: false,
        };
        // One line short of the limit, and one line more: 1 KiB lines.
        let line = format!("{}\n", "x".repeat(1023));
        let lines = MAX_READ_BYTES / line.len();
        let big = cwd.join("big.txt");
        std::fs::write(&big, line.repeat(lines + 1)).unwrap();
        let params = |extra: Value| {
            let mut p = json!({"sessionId": "s", "path": big});
            p.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            p
        };

        let whole = read(&workspace, params(json!({}))).await.unwrap_err();
        assert_eq!(whole.code, super::super::INVALID_PARAMS);
        assert!(whole.message.contains("read it in parts"), "{whole:?}");
        // From the first line on, without a limit, it is still too much ...
        let unbounded = read(&workspace, params(json!({"line": 1})))
            .await
            .unwrap_err();
        assert!(unbounded.message.contains("read it in parts"));
        // ... but in parts it all comes.
        let first = read(&workspace, params(json!({"line": 1, "limit": lines})))
            .await
            .unwrap();
        assert_eq!(
            first["content"].as_str().unwrap().len(),
            MAX_READ_BYTES - MAX_READ_BYTES % line.len()
        );
        let rest = read(&workspace, params(json!({"line": lines + 1})))
            .await
            .unwrap();
        assert_eq!(rest["content"], line);

        let target = cwd.join("target.txt");
        std::fs::write(&target, "kept\n").unwrap();
        let content = "y".repeat(MAX_WRITE_BYTES + 1);
        let refused = write(
            &workspace,
            json!({"sessionId": "s", "path": target, "content": content}),
        )
        .await
        .unwrap_err();
        assert_eq!(refused.code, super::super::INVALID_PARAMS);
        assert!(refused.message.contains("at most"), "{refused:?}");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "kept\n");
        // At the limit exactly, it is written.
        let content = "y".repeat(MAX_WRITE_BYTES);
        write(
            &workspace,
            json!({"sessionId": "s", "path": target, "content": content}),
        )
        .await
        .unwrap();
        assert_eq!(
            std::fs::metadata(&target).unwrap().len(),
            MAX_WRITE_BYTES as u64
        );
        assert_eq!(std::fs::read_dir(&cwd).unwrap().count(), 2);
    }

    #[test]
    fn diffs_say_what_changed_and_are_cut_with_a_marker() {
        let path = Path::new("/w/a.txt");
        let diff = unified_diff(path, Some(b"a\nb\nc\n"), "a\nB\nc\n");
        assert!(diff.contains("--- /w/a.txt\n+++ /w/a.txt\n"), "{diff}");
        assert!(diff.contains("-b\n+B\n"), "{diff}");
        let created = unified_diff(path, None, "hello\n");
        assert!(created.contains("--- /dev/null") && created.contains("+hello\n"));
        let big = "é\n".repeat(MAX_DIFF_BYTES);
        let cut = unified_diff(path, None, &big);
        assert!(cut.len() < MAX_DIFF_BYTES + 100);
        assert!(cut.ends_with("more bytes]\n"), "{}", &cut[cut.len() - 80..]);
    }
}
