//! Processes as the operating system sees them: waiting for one to end
//! (pidfds), the shims under a state directory, an agent's and its shim's
//! pids, and `/proc` figures.

use std::path::Path;

use super::{agent_process_records, TestDb, WAIT};

/// The conversation's agent and its shim (pids), as its process record
/// names them.
pub async fn agent_and_shim(db: &TestDb, id: &str) -> (i32, i32) {
    let records = agent_process_records(db).await;
    let record = records
        .iter()
        .find(|r| r.conversation_id.to_string() == id)
        .expect("the agent's process is on record");
    assert!(record.shim_socket.is_some(), "the agent runs under a shim");
    (
        record.agent_link().unwrap_or_default().agent_pid,
        record.pid,
    )
}

/// A process to wait for: a pidfd, opened while the process runs, becomes
/// readable when it ends (an event to wait on; no polling). Whoever its
/// parent is, and even when its pid is reused afterwards.
pub struct ProcessWatch {
    pub pid: i32,
    fd: std::os::fd::OwnedFd,
    /// Killed when the watch is dropped (see [`ProcessWatch::killing`]).
    kill_on_drop: bool,
}

impl ProcessWatch {
    /// Must be called while the process runs.
    pub fn new(pid: i32) -> ProcessWatch {
        use std::os::fd::FromRawFd;
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
        assert!(fd >= 0, "process {pid} runs");
        // SAFETY: the fd was just opened and is owned by nothing else.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        ProcessWatch {
            pid,
            fd,
            kill_on_drop: false,
        }
    }

    /// A watch that kills the process when it is dropped if it still runs:
    /// for processes a test expects the gateway to kill, which must not
    /// outlive the test when it fails.
    pub fn killing(pid: i32) -> ProcessWatch {
        let mut watch = ProcessWatch::new(pid);
        watch.kill_on_drop = true;
        watch
    }

    /// Whether it has ended by now (does not wait).
    pub fn has_ended(&self) -> bool {
        use std::os::fd::AsRawFd;
        poll_readable(self.fd.as_raw_fd(), 0)
    }

    /// Waits (at most [`WAIT`]) until it has ended; whether it did.
    pub async fn ended(&self) -> bool {
        use std::os::fd::AsRawFd;
        // The fd stays open meanwhile: `self` is borrowed until this returns.
        let fd = self.fd.as_raw_fd();
        tokio::task::spawn_blocking(move || poll_readable(fd, WAIT.as_millis() as i32))
            .await
            .unwrap()
    }
}

impl Drop for ProcessWatch {
    fn drop(&mut self) {
        use std::os::fd::AsRawFd;
        if self.kill_on_drop && !self.has_ended() {
            // SAFETY: a pidfd we own: the signal reaches this process only.
            unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    self.fd.as_raw_fd(),
                    libc::SIGKILL,
                    std::ptr::null::<libc::siginfo_t>(),
                    0,
                );
            }
        }
    }
}

fn poll_readable(fd: i32, timeout_ms: i32) -> bool {
    let mut poll = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut poll, 1, timeout_ms) == 1 }
}

/// A `/proc/<pid>/status` figure in KiB (e.g. `VmRSS:`), for benchmarks;
/// 0 when the process is gone. `pid` may be `self`.
pub fn proc_status_kib(pid: impl std::fmt::Display, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The pids of the shims serving sockets under `dir`.
pub fn shims_under(dir: &Path) -> Vec<i32> {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let needle = format!("--socket\0{}/", dir.display());
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline);
            cmdline.contains("\0shim\0") && cmdline.contains(&needle)
        })
        .collect()
}

/// Kills every shim serving a socket under `dir`, with everything below it
/// (its agent and what that started), and says how many shims it found.
pub fn kill_shims_under(dir: &Path) -> usize {
    let shims = shims_under(dir);
    if shims.is_empty() {
        return 0;
    }
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut parents: Vec<(i32, i32)> = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            let after = stat.rsplit_once(')').map(|(_, a)| a).unwrap_or("");
            let ppid = after.split_whitespace().nth(1).and_then(|p| p.parse().ok());
            if let Some(ppid) = ppid {
                parents.push((pid, ppid));
            }
        }
    }
    // The shims and everything below them.
    let mut doomed = shims.clone();
    let mut i = 0;
    while i < doomed.len() {
        let parent = doomed[i];
        for (pid, ppid) in &parents {
            if *ppid == parent && !doomed.contains(pid) {
                doomed.push(*pid);
            }
        }
        i += 1;
    }
    for pid in &doomed {
        // SAFETY: kill takes no pointers.
        unsafe {
            libc::kill(*pid, libc::SIGKILL);
        }
    }
    shims.len()
}
