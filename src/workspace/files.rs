//! `fs/read_text_file` and `fs/write_text_file`, served inside the workspace.
//!
//! Every path is reached beneath the conversation's directory through
//! descriptors ([`super::beneath`]): what the policies are asked about, what
//! is read, and what is replaced are one and the same file. Only regular
//! files are read or replaced (a FIFO, a socket or a device is refused
//! before it is opened for reading), and no more is ever read than a limit
//! allows, whatever the file's size says.

use std::ffi::OsString;
use std::io::{BufRead, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use agent_client_protocol_schema::v1 as acp;
use serde_json::{json, Value};

use super::beneath::{self, Destination, Resolver, Root};
use super::{as_user, Refusal, Workspace};
use crate::model::FileWritten;

/// Most text one read returns (a larger file is read in parts, with `line`
/// and `limit`).
pub const MAX_READ_BYTES: usize = 10 * 1024 * 1024;
/// Most text one write may carry.
pub const MAX_WRITE_BYTES: usize = 10 * 1024 * 1024;
/// Most of a diff published; the rest is cut, with a marker saying so.
pub const MAX_DIFF_BYTES: usize = 64 * 1024;
/// Most of a file's previous content a write's diff is made from: a larger
/// file is replaced without being read, and its event says the diff was
/// too large (`diff_too_large`).
pub const MAX_DIFF_SOURCE_BYTES: usize = 1024 * 1024;
/// How long a diff may search for the smallest edit before it settles for
/// a larger one (two big, very different files).
const DIFF_TIME: std::time::Duration = std::time::Duration::from_millis(500);
/// How often a path is located again when its last component was swapped
/// (a file for a symlink) between being located and being opened.
const ATTEMPTS: usize = 16;

/// What the operator's policies say of the real path a request reaches:
/// asked after the path is resolved and before anything is read or written.
pub type Gate = Box<dyn Fn(&Path) -> Result<(), Refusal> + Send>;

/// A gate that lets everything through.
pub fn open_gate() -> Gate {
    Box::new(|_| Ok(()))
}

/// `fs/read_text_file`: the file's text, from `line` (1-based) for `limit`
/// lines when given; `gate` is asked about the real path first.
pub async fn read(workspace: &Workspace, params: Value, gate: Gate) -> Result<Value, Refusal> {
    let request: acp::ReadTextFileRequest = parse(params)?;
    let (line, limit) = (request.line, request.limit);
    let ws = workspace.clone();
    let path = request.path;
    let shown = path.clone();
    let content = as_user(
        workspace.user.clone(),
        workspace.sandbox.clone(),
        move || {
            let root = ws.root(Resolver::detect())?;
            read_in(&root, &path, line, limit, &gate)
        },
    )
    .await
    .map_err(|e| Refusal::io(&shown, e))??;
    Ok(json!({ "content": content }))
}

/// `fs/write_text_file`: the file replaced at once (a new file beside it,
/// renamed over it, its mode kept), and what changed; `gate` is asked about
/// the real path first.
pub async fn write(
    workspace: &Workspace,
    params: Value,
    gate: Gate,
) -> Result<FileWritten, Refusal> {
    let request: acp::WriteTextFileRequest = parse(params)?;
    if request.content.len() > MAX_WRITE_BYTES {
        return Err(Refusal::invalid(format!(
            "the content is {} bytes; a write may carry at most {MAX_WRITE_BYTES}",
            request.content.len()
        )));
    }
    let ws = workspace.clone();
    let path = request.path;
    let shown = path.clone();
    let content = request.content;
    // The diff is made on the file thread too: it is work in proportion to
    // the file, which the session's loop should not wait on.
    as_user(
        workspace.user.clone(),
        workspace.sandbox.clone(),
        move || {
            let root = ws.root(Resolver::detect())?;
            write_in(&root, &path, &content, &gate)
        },
    )
    .await
    .map_err(|e| Refusal::io(&shown, e))?
}

fn parse<T: serde::de::DeserializeOwned>(params: Value) -> Result<T, Refusal> {
    serde_json::from_value(params).map_err(|e| Refusal::invalid(format!("invalid params: {e}")))
}

/// `path` (absolute, beginning with the root) located beneath the root,
/// with `gate` asked about its real path, and the regular file there (if
/// any) opened to read. Located again when swapped meanwhile.
fn open_in(
    root: &Root,
    path: &Path,
    gate: &dyn Fn(&Path) -> Result<(), Refusal>,
) -> Result<(Destination, Option<std::fs::File>), Refusal> {
    if !path.is_absolute() {
        return Err(Refusal::invalid(format!(
            "{} is not an absolute path",
            path.display()
        )));
    }
    let refuse = |e| refusal(root, path, e);
    let rel = root.relative(path).map_err(refuse)?;
    for _ in 0..ATTEMPTS {
        let destination = root.locate(&rel).map_err(refuse)?;
        gate(&destination.path())?;
        match destination.open_regular() {
            Err(beneath::Error::Unstable) => continue,
            Err(e) => return Err(refuse(e)),
            Ok(file) => return Ok((destination, file)),
        }
    }
    Err(refuse(beneath::Error::Unstable))
}

/// Why a path cannot be served, in words naming it.
fn refusal(root: &Root, path: &Path, error: beneath::Error) -> Refusal {
    let shown = path.display();
    match error {
        beneath::Error::Outside => {
            // Only said: what is reached never depends on this.
            let cwd = root.path().display();
            match super::paths::resolve(path) {
                Ok(real) if !real.starts_with(root.path()) => Refusal::invalid(format!(
                    "{shown} resolves to {}, outside the conversation's directory {cwd}",
                    real.display()
                )),
                _ => Refusal::invalid(format!(
                    "{shown} leads outside the conversation's directory {cwd}"
                )),
            }
        }
        beneath::Error::Directory => Refusal::invalid(format!("{shown} is a directory")),
        beneath::Error::NotRegular(kind) => Refusal::invalid(format!(
            "{shown} is {kind}: only regular files are read and written"
        )),
        beneath::Error::Unstable => Refusal::invalid(format!(
            "{shown} kept changing while it was opened; nothing was read or written"
        )),
        beneath::Error::Io(e) => Refusal::io(path, e),
    }
}

fn read_in(
    root: &Root,
    path: &Path,
    line: Option<u32>,
    limit: Option<u32>,
    gate: &dyn Fn(&Path) -> Result<(), Refusal>,
) -> Result<String, Refusal> {
    let (_, file) = open_in(root, path, gate)?;
    let Some(file) = file else {
        return Err(Refusal::not_found(format!(
            "{}: No such file or directory",
            path.display()
        )));
    };
    read_text(file, path, line, limit)
}

/// The text of an open regular file, never reading more than
/// [`MAX_READ_BYTES`] and one byte of what is returned.
fn read_text(
    file: std::fs::File,
    path: &Path,
    line: Option<u32>,
    limit: Option<u32>,
) -> Result<String, Refusal> {
    let io = |e| Refusal::io(path, e);
    let not_text = || Refusal::invalid(format!("{} is not UTF-8 text", path.display()));
    let too_big = || {
        Refusal::invalid(format!(
            "{} holds more than the {MAX_READ_BYTES} bytes a read returns; read it in parts \
             with line and limit",
            path.display()
        ))
    };
    let bound = MAX_READ_BYTES as u64 + 1;
    if line.is_none() && limit.is_none() {
        let size = file.metadata().map_err(io)?.len();
        if size > MAX_READ_BYTES as u64 {
            return Err(too_big());
        }
        // The size said is a hint: the file may have grown since.
        let mut bytes = Vec::with_capacity(size as usize);
        file.take(bound).read_to_end(&mut bytes).map_err(io)?;
        if bytes.len() > MAX_READ_BYTES {
            return Err(too_big());
        }
        return String::from_utf8(bytes).map_err(|_| not_text());
    }
    let skip = line.unwrap_or(1).max(1) - 1;
    let take = limit.map_or(usize::MAX, |n| n as usize);
    let mut reader = std::io::BufReader::with_capacity(64 * 1024, file);
    // Skipped lines are passed over, never held: one may be longer than
    // memory.
    let mut skipped = 0u32;
    while skipped < skip {
        let buf = reader.fill_buf().map_err(io)?;
        if buf.is_empty() {
            return Ok(String::new());
        }
        match buf.iter().position(|&b| b == b'\n') {
            Some(end) => {
                reader.consume(end + 1);
                skipped += 1;
            }
            None => {
                let all = buf.len();
                reader.consume(all);
            }
        }
    }
    let mut text: Vec<u8> = Vec::new();
    let mut taken = 0usize;
    while taken < take {
        let room = bound - text.len() as u64;
        let n = (&mut reader)
            .take(room)
            .read_until(b'\n', &mut text)
            .map_err(io)?;
        if text.len() > MAX_READ_BYTES {
            return Err(too_big());
        }
        if n == 0 {
            break;
        }
        taken += 1;
    }
    String::from_utf8(text).map_err(|_| not_text())
}

/// What a file held before it was replaced, as far as a diff needs it.
enum Previous {
    /// There was no file.
    None,
    /// Its content (at most [`MAX_DIFF_SOURCE_BYTES`]).
    Text(Vec<u8>),
    /// More than a diff is made from: its size (or at least that much).
    TooLarge(u64),
}

fn write_in(
    root: &Root,
    path: &Path,
    content: &str,
    gate: &dyn Fn(&Path) -> Result<(), Refusal>,
) -> Result<FileWritten, Refusal> {
    let (mut destination, old) = open_in(root, path, gate)?;
    let real = destination.path();
    let io = |e| Refusal::io(&real, e);
    let (previous, mode) = match old {
        Some(file) => {
            let meta = file.metadata().map_err(io)?;
            let mode = meta.permissions().mode() & 0o7777;
            // Decided from the size first: a large file is not read at all.
            let previous = if meta.len() > MAX_DIFF_SOURCE_BYTES as u64 {
                Previous::TooLarge(meta.len())
            } else {
                let mut bytes = Vec::with_capacity(meta.len() as usize);
                file.take(MAX_DIFF_SOURCE_BYTES as u64 + 1)
                    .read_to_end(&mut bytes)
                    .map_err(io)?;
                if bytes.len() > MAX_DIFF_SOURCE_BYTES {
                    Previous::TooLarge(bytes.len() as u64)
                } else {
                    Previous::Text(bytes)
                }
            };
            (previous, Some(mode))
        }
        None => (Previous::None, None),
    };
    destination
        .make_dirs()
        .map_err(|e| refusal(root, path, e))?;
    replace(&destination, content.as_bytes(), mode).map_err(io)?;
    let (diff, diff_too_large) = match previous {
        Previous::None => (unified_diff(&real, None, content), false),
        Previous::Text(old) => (unified_diff(&real, Some(&old), content), false),
        Previous::TooLarge(size) => (too_large_diff(&real, size), true),
    };
    Ok(FileWritten {
        path: real.display().to_string(),
        diff,
        diff_too_large,
    })
}

/// Replaces the file at `destination` with `content`: a new file beside it
/// (created beneath the root, never through a symlink), renamed over it in
/// the same directory. `mode`: the old file's, kept.
fn replace(destination: &Destination, content: &[u8], mode: Option<u32>) -> std::io::Result<()> {
    // A name too long for a directory entry is cut: the temporary name must
    // fit in one as well.
    let name = destination.name().as_bytes();
    let mut temp = b".".to_vec();
    temp.extend_from_slice(&name[..name.len().min(100)]);
    temp.extend_from_slice(format!(".{}.acp-gateway", uuid::Uuid::now_v7().simple()).as_bytes());
    let temp = OsString::from(std::ffi::OsStr::from_bytes(&temp));
    let mut file = destination.create_beside(&temp, mode.unwrap_or(0o666))?;
    let written = (|| {
        file.write_all(content)?;
        if let Some(mode) = mode {
            // The umask may have taken bits of the old mode.
            file.set_permissions(std::fs::Permissions::from_mode(mode))?;
        }
        file.sync_all()?;
        destination.rename_over(&temp)
    })();
    if written.is_err() {
        let _ = destination.remove_beside(&temp);
    }
    written
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

/// The diff of a file whose previous content was too large to diff: its
/// header and a line saying so.
fn too_large_diff(path: &Path, size: u64) -> String {
    let shown = path.display();
    format!(
        "--- {shown}\n+++ {shown}\n[diff too large: the previous content is {size} bytes, \
         more than the {MAX_DIFF_SOURCE_BYTES} a diff is made from]\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// A resolved temporary directory.
    fn cwd() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let cwd = std::fs::canonicalize(dir.path()).unwrap();
        (dir, cwd)
    }

    fn pass(_: &Path) -> Result<(), Refusal> {
        Ok(())
    }

    #[test]
    fn reads_whole_files_and_line_ranges() {
        let (_dir, cwd) = cwd();
        let path = cwd.join("a.txt");
        for resolver in Resolver::all() {
            let root = Root::open(&cwd, resolver).unwrap();
            let read = |line, limit| read_in(&root, &path, line, limit, &pass);
            std::fs::write(&path, "one\ntwo\nthree\nfour").unwrap();
            assert_eq!(read(None, None).unwrap(), "one\ntwo\nthree\nfour");
            assert_eq!(read(Some(2), Some(2)).unwrap(), "two\nthree\n");
            assert_eq!(read(Some(3), None).unwrap(), "three\nfour");
            assert_eq!(read(None, Some(1)).unwrap(), "one\n");
            assert_eq!(read(Some(9), Some(1)).unwrap(), "");
            std::fs::write(&path, b"\xff\xfe").unwrap();
            assert!(read(None, None).unwrap_err().message.contains("not UTF-8"));
            let missing = read_in(&root, &cwd.join("none"), None, None, &pass).unwrap_err();
            assert_eq!(missing.code, super::super::NOT_FOUND, "{missing:?}");
            let dir = read_in(&root, &cwd, None, None, &pass).unwrap_err();
            assert!(dir.message.contains("is a directory"), "{dir:?}");
        }
    }

    #[test]
    fn replacing_keeps_the_mode_and_leaves_no_temporary_file() {
        for resolver in Resolver::all() {
            let (_dir, cwd) = cwd();
            let root = Root::open(&cwd, resolver).unwrap();
            let path = cwd.join("run.sh");
            std::fs::write(&path, "old\n").unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o750)).unwrap();
            let written = write_in(&root, &path, "new\n", &pass).unwrap();
            assert_eq!(written.path, path.display().to_string());
            assert!(written.diff.contains("-old\n+new\n"), "{}", written.diff);
            assert!(!written.diff_too_large);
            assert_eq!(std::fs::read_to_string(&path).unwrap(), "new\n");
            let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
            assert_eq!(mode, 0o750);
            assert_eq!(std::fs::read_dir(&cwd).unwrap().count(), 1);
            let nested = cwd.join("a/b/c.txt");
            let written = write_in(&root, &nested, "x", &pass).unwrap();
            assert!(
                written.diff.starts_with("--- /dev/null"),
                "{}",
                written.diff
            );
            assert_eq!(std::fs::read_to_string(nested).unwrap(), "x");
            // A very long name still has room for its temporary file.
            let long = cwd.join("l".repeat(250));
            write_in(&root, &long, "y", &pass).unwrap();
            assert_eq!(std::fs::read_to_string(long).unwrap(), "y");
        }
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
            sandbox: None,
            capabilities: Default::default(),
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

        let whole = read(&workspace, params(json!({})), open_gate())
            .await
            .unwrap_err();
        assert_eq!(whole.code, super::super::INVALID_PARAMS);
        assert!(whole.message.contains("read it in parts"), "{whole:?}");
        // From the first line on, without a limit, it is still too much ...
        let unbounded = read(&workspace, params(json!({"line": 1})), open_gate())
            .await
            .unwrap_err();
        assert!(unbounded.message.contains("read it in parts"));
        // ... but in parts it all comes.
        let first = read(
            &workspace,
            params(json!({"line": 1, "limit": lines})),
            open_gate(),
        )
        .await
        .unwrap();
        assert_eq!(
            first["content"].as_str().unwrap().len(),
            MAX_READ_BYTES - MAX_READ_BYTES % line.len()
        );
        let rest = read(&workspace, params(json!({"line": lines + 1})), open_gate())
            .await
            .unwrap();
        assert_eq!(rest["content"], line);

        let target = cwd.join("target.txt");
        std::fs::write(&target, "kept\n").unwrap();
        let content = "y".repeat(MAX_WRITE_BYTES + 1);
        let refused = write(
            &workspace,
            json!({"sessionId": "s", "path": target, "content": content}),
            open_gate(),
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
            open_gate(),
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

    /// Makes each link (to `inside`) and flips it between `inside` and
    /// `outside` (each time a new symlink renamed over it: the link is
    /// always there) until `stop`.
    fn flipper(
        links: Vec<(PathBuf, PathBuf, PathBuf)>,
        stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    ) -> std::thread::JoinHandle<usize> {
        for (link, inside, _) in &links {
            std::os::unix::fs::symlink(inside, link).unwrap();
        }
        std::thread::spawn(move || {
            let mut flips = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for (link, inside, outside) in &links {
                    let target = if flips % 2 == 0 { outside } else { inside };
                    let temp = link.with_extension("flipping");
                    let _ = std::fs::remove_file(&temp);
                    // Gone (the test ended early): nothing left to flip.
                    if std::os::unix::fs::symlink(target, &temp).is_err()
                        || std::fs::rename(&temp, link).is_err()
                    {
                        return flips;
                    }
                }
                flips += 1;
            }
            flips
        })
    }

    /// The probe that found 85 of 400 reads outside: a symlink in the cwd
    /// flipped between a place inside and one outside while reads and
    /// writes go through it. Whatever the timing, nothing outside is read,
    /// written, or left behind, and a write names the file it wrote.
    #[test]
    fn a_symlink_swapped_in_a_loop_never_leads_outside() {
        const ROUNDS: usize = 1000;
        for resolver in Resolver::all() {
            let (_dir, base) = cwd();
            let (work, outside) = (base.join("work"), base.join("outside"));
            std::fs::create_dir_all(work.join("sub")).unwrap();
            std::fs::create_dir_all(&outside).unwrap();
            std::fs::write(work.join("sub/secret.txt"), "inside\n").unwrap();
            std::fs::write(outside.join("secret.txt"), "outside\n").unwrap();
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            // A directory in the middle of the path (relative inside,
            // absolute outside), and the last component itself.
            let flips = flipper(
                vec![
                    (work.join("dir"), "sub".into(), outside.clone()),
                    (
                        work.join("last"),
                        work.join("sub/secret.txt"),
                        outside.join("secret.txt"),
                    ),
                ],
                stop.clone(),
            );
            let root = Root::open(&work, resolver).unwrap();
            let (mut read, mut written, mut refused) = (0, 0, 0);
            for round in 0..ROUNDS {
                for path in [work.join("dir/secret.txt"), work.join("last")] {
                    match read_in(&root, &path, None, None, &pass) {
                        Ok(text) => {
                            assert_eq!(text, "inside\n", "{resolver:?}: read outside");
                            read += 1;
                        }
                        Err(refusal) => {
                            assert!(refusal.message.contains("outside"), "{refusal:?}");
                            refused += 1;
                        }
                    }
                }
                let new = work.join(format!("dir/new-{}.txt", round % 4));
                for (path, content) in [(new, "new\n"), (work.join("last"), "inside\n")] {
                    match write_in(&root, &path, content, &pass) {
                        Ok(w) => {
                            let at = Path::new(&w.path);
                            assert!(at.starts_with(work.join("sub")), "{resolver:?}: {at:?}");
                            assert_eq!(std::fs::read_to_string(at).unwrap(), content);
                            written += 1;
                        }
                        Err(refusal) => {
                            assert!(refusal.message.contains("outside"), "{refusal:?}");
                            refused += 1;
                        }
                    }
                }
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            let flips = flips.join().unwrap();
            let left: Vec<_> = std::fs::read_dir(&outside)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(left, ["secret.txt"], "{resolver:?}: left outside");
            assert_eq!(
                std::fs::read_to_string(outside.join("secret.txt")).unwrap(),
                "outside\n"
            );
            assert!(read > 0 && written > 0, "{resolver:?}: {read} {written}");
            eprintln!(
                "{resolver:?}: {read} reads and {written} writes inside, {refused} refused, \
                 {flips} flips"
            );
        }
    }
}
