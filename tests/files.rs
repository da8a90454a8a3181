//! What an agent's `fs/read_text_file` and `fs/write_text_file` cost the
//! gateway, through the same functions the session calls: a named pipe is
//! refused at once (no thread left waiting on it, nothing of what is fed
//! into it held), a symlink swapped while files are reached never leads
//! outside, and no more of a file is read than a limit allows.
//!
//! Threads and memory are the process's: the tests here take turns.

mod common;

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use acp_gateway::workspace::files::{self, MAX_DIFF_SOURCE_BYTES, MAX_READ_BYTES};
use acp_gateway::workspace::Workspace;
use common::Flipping;
use serde_json::{json, Value};

/// The longest any one request may take before the test fails (a request
/// that blocks never answers).
const WAIT: Duration = Duration::from_secs(10);
const MIB: u64 = 1024 * 1024;

/// One test at a time: they measure the whole process.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn workspace() -> (tempfile::TempDir, PathBuf, Workspace) {
    let dir = tempfile::tempdir().unwrap();
    let base = std::fs::canonicalize(dir.path()).unwrap();
    let cwd = base.join("work");
    std::fs::create_dir(&cwd).unwrap();
    let workspace = Workspace {
        cwd: cwd.clone(),
        allowed_roots: Vec::new(),
        user: None,
        files: true,
        terminals: false,
        sandbox: None,
        capabilities: Default::default(),
    };
    (dir, cwd, workspace)
}

fn params(path: &Path, content: Option<&str>) -> Value {
    let mut p = json!({"sessionId": "s", "path": path});
    if let Some(content) = content {
        p["content"] = content.into();
    }
    p
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

/// The process's threads.
fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

/// A `/proc/self/status` figure in KiB (`VmRSS:`, `VmHWM:`).
fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

/// Bytes the process has read with `read(2)` and its kin so far (`None`
/// where `/proc/self/io` cannot be read).
fn bytes_read() -> Option<u64> {
    std::fs::read_to_string("/proc/self/io")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("rchar:"))?
        .trim()
        .parse()
        .ok()
}

#[tokio::test]
async fn a_fifo_is_refused_at_once_and_no_thread_is_left_waiting_on_it() {
    let _turn = SERIAL.lock().await;
    let (_dir, cwd, workspace) = workspace();
    let pipe = cwd.join("pipe");
    mkfifo(&pipe);
    let before = threads();
    for _ in 0..50 {
        let read = tokio::time::timeout(
            WAIT,
            files::read(&workspace, params(&pipe, None), files::open_gate()),
        )
        .await
        .expect("a read of a FIFO nobody writes is answered at once")
        .unwrap_err();
        assert!(read.message.contains("named pipe (FIFO)"), "{read:?}");
        assert!(read.message.contains("only regular files"), "{read:?}");
        let write = tokio::time::timeout(
            WAIT,
            files::write(&workspace, params(&pipe, Some("x")), files::open_gate()),
        )
        .await
        .expect("a write onto a FIFO is answered at once")
        .unwrap_err();
        assert!(write.message.contains("named pipe (FIFO)"), "{write:?}");
    }
    // Each request's thread ends with it (one may still be on its way out).
    let after = threads();
    assert!(
        after <= before + 2,
        "threads: {before} before, {after} after"
    );
    eprintln!("100 FIFO requests: {before} threads before, {after} after");
    // Nothing was written in its place, and nothing beside it.
    let meta = std::fs::symlink_metadata(&pipe).unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_fifo(&meta.file_type()));
    assert_eq!(std::fs::read_dir(&cwd).unwrap().count(), 1);
}

#[tokio::test]
async fn a_fifo_fed_more_than_the_limit_is_refused_without_holding_what_it_is_fed() {
    let _turn = SERIAL.lock().await;
    let (_dir, cwd, workspace) = workspace();
    let pipe = cwd.join("fed");
    mkfifo(&pipe);
    // A writer with 100 MiB to give, feeding as fast as it is read. A
    // reader of the test's own holds the pipe open first, so the writer's
    // open never waits (whenever its thread runs) and it fills the pipe.
    let held = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&pipe)
        .unwrap();
    let (opened, writing) = std::sync::mpsc::channel();
    let feeder = {
        let pipe = pipe.clone();
        std::thread::spawn(move || {
            let mut fifo = std::fs::OpenOptions::new().write(true).open(pipe)?;
            let _ = opened.send(());
            let chunk = vec![b'a'; MIB as usize];
            for _ in 0..100 {
                fifo.write_all(&chunk)?;
            }
            std::io::Result::Ok(())
        })
    };
    writing
        .recv_timeout(WAIT)
        .expect("the feeder opens the pipe");
    let rss = status_kib("VmRSS:");
    let read = tokio::time::timeout(
        WAIT,
        files::read(&workspace, params(&pipe, None), files::open_gate()),
    )
    .await
    .expect("a read of a fed FIFO is answered at once")
    .unwrap_err();
    assert!(read.message.contains("named pipe (FIFO)"), "{read:?}");
    let grown = status_kib("VmRSS:").saturating_sub(rss);
    assert!(grown < 16 * 1024, "memory grew by {grown} KiB");
    eprintln!("fed FIFO refused: memory +{grown} KiB");
    // The gateway never read it: the only reader goes, and the feeder ends
    // on a broken pipe.
    drop(held);
    let fed = tokio::time::timeout(WAIT, tokio::task::spawn_blocking(move || feeder.join()))
        .await
        .expect("the feeder ends")
        .unwrap()
        .unwrap();
    assert_eq!(fed.unwrap_err().kind(), std::io::ErrorKind::BrokenPipe);
}

/// The probe that took the gateway from 20 to 620 MB: a 300 MiB (sparse)
/// file overwritten. Its old content is not read at all, and the event
/// says the diff was too large to make.
#[tokio::test]
async fn a_large_file_is_overwritten_without_being_read_and_its_diff_says_so() {
    let _turn = SERIAL.lock().await;
    let (_dir, cwd, workspace) = workspace();
    let big = cwd.join("big.log");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(300 * MIB)
        .unwrap();
    let (peak, read) = (status_kib("VmHWM:"), bytes_read());

    let written = files::write(
        &workspace,
        params(&big, Some("small\n")),
        files::open_gate(),
    )
    .await
    .unwrap();

    let grown = status_kib("VmHWM:").saturating_sub(peak);
    assert!(grown < 32 * 1024, "peak memory grew by {grown} KiB");
    if let (Some(before), Some(after)) = (read, bytes_read()) {
        assert!(after - before < MIB, "{} bytes read", after - before);
        eprintln!("300 MiB overwritten: {} bytes read", after - before);
    }
    eprintln!("300 MiB overwritten: peak memory +{grown} KiB");
    assert!(written.diff_too_large);
    assert!(
        written
            .diff
            .contains("[diff too large: the previous content is 314572800 bytes")
            && written.diff.contains(&MAX_DIFF_SOURCE_BYTES.to_string()),
        "{}",
        written.diff
    );
    assert_eq!(written.path, big.display().to_string());
    assert_eq!(std::fs::read_to_string(&big).unwrap(), "small\n");

    // At the bound exactly, the diff is made.
    let edge = cwd.join("edge.txt");
    std::fs::write(&edge, "x\n".repeat(MAX_DIFF_SOURCE_BYTES / 2)).unwrap();
    let written = files::write(&workspace, params(&edge, Some("y\n")), files::open_gate())
        .await
        .unwrap();
    assert!(!written.diff_too_large);
    assert!(
        written.diff.contains("@@ -1,524288 +1 @@\n-x\n"),
        "{}",
        &written.diff[..200]
    );
}

/// A line longer than a read returns is never held whole: refused after
/// the limit and one byte, or passed over when it is skipped.
#[tokio::test]
async fn reads_stop_at_the_limit_whatever_the_file_holds() {
    let _turn = SERIAL.lock().await;
    let (_dir, cwd, workspace) = workspace();
    let big = cwd.join("one-line.bin");
    let mut file = std::fs::File::create(&big).unwrap();
    file.set_len(300 * MIB).unwrap();
    // A second line after the 300 MiB first one.
    use std::io::Seek;
    file.seek(std::io::SeekFrom::End(0)).unwrap();
    file.write_all(b"\nsecond\n").unwrap();
    drop(file);
    let read = |line: u32, limit: u32| {
        files::read(
            &workspace,
            json!({"sessionId": "s", "path": big, "line": line, "limit": limit}),
            files::open_gate(),
        )
    };
    let (peak, before) = (status_kib("VmHWM:"), bytes_read());
    let whole = files::read(&workspace, params(&big, None), files::open_gate())
        .await
        .unwrap_err();
    assert!(whole.message.contains("read it in parts"), "{whole:?}");
    let first = read(1, 1).await.unwrap_err();
    assert!(first.message.contains("read it in parts"), "{first:?}");
    if let (Some(before), Some(after)) = (before, bytes_read()) {
        let limit = MAX_READ_BYTES as u64 + 1;
        assert!(
            after - before <= limit + MIB,
            "{} bytes read",
            after - before
        );
        eprintln!("a 300 MiB line refused: {} bytes read", after - before);
    }
    let second = read(2, 1).await.unwrap();
    assert_eq!(second["content"], "second\n");
    let grown = status_kib("VmHWM:").saturating_sub(peak);
    assert!(grown < 48 * 1024, "peak memory grew by {grown} KiB");
    eprintln!("a 300 MiB line refused and skipped: peak memory +{grown} KiB");
}

/// The probe that read outside 85 times in 400 and wrote there 50 times:
/// 1000 rounds of reads and writes through symlinks retargeted, and
/// through a directory and a file exchanged with symlinks out, all along.
#[tokio::test]
async fn a_symlink_swapped_while_files_are_reached_never_leads_outside() {
    let _turn = SERIAL.lock().await;
    let (dir, cwd, workspace) = workspace();
    let outside = std::fs::canonicalize(dir.path()).unwrap().join("outside");
    let flipping = Flipping::start(&cwd, &outside);
    let (mut inside, mut refused) = (0, 0);
    for round in 0..1000 {
        for path in flipping.reads() {
            match files::read(&workspace, params(&path, None), files::open_gate()).await {
                Ok(read) => {
                    assert_eq!(read["content"], "inside\n", "{path:?} read outside");
                    inside += 1;
                }
                Err(refusal) => {
                    assert!(refusal.message.contains("outside"), "{refusal:?}");
                    refused += 1;
                }
            }
        }
        for (path, content) in flipping.writes(round) {
            match files::write(&workspace, params(&path, Some(content)), files::open_gate()).await {
                Ok(written) => {
                    let at = Path::new(&written.path);
                    assert!(
                        at.starts_with(&cwd) && !at.starts_with(&outside),
                        "wrote {at:?}"
                    );
                    inside += 1;
                }
                Err(refusal) => {
                    assert!(refusal.message.contains("outside"), "{refusal:?}");
                    refused += 1;
                }
            }
        }
    }
    flipping.assert_outside_untouched();
    let flips = flipping.stop();
    assert!(
        inside > 0,
        "nothing got through ({refused} refused, {flips} flips)"
    );
}
