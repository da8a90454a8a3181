//! What a crashed gateway's agents left running, and killing it without
//! touching anything else.
//!
//! Every agent runs in its own process group (its pid is the group id). While
//! it runs, the gateway records its pid, its start time and where that pid
//! means something (the boot and the pid namespace). A gateway starting after
//! a crash looks through `/proc` for what is left of each recorded group and
//! kills it, but only processes that are genuinely the agent's: in the group,
//! started no earlier than the agent, and never anything of a group whose pid
//! now belongs to a later process. Linux only: without `/proc` there is
//! nothing to look at, and the caller says so.

use std::io;
use std::path::Path;
use std::sync::OnceLock;

/// The machine facts a recorded pid is only valid under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// `/proc/sys/kernel/random/boot_id`: changes on every boot.
    pub boot_id: String,
    /// The gateway's pid namespace (`/proc/self/ns/pid`, e.g. `pid:[4026531836]`):
    /// containers on one machine share the boot id but not their pids.
    pub pid_namespace: String,
    /// For the logs: which machine a record came from.
    pub hostname: String,
}

impl Host {
    /// Reads this machine's facts; an error when there is no `/proc`.
    pub fn current() -> io::Result<Host> {
        let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")?;
        let pid_namespace = std::fs::read_link("/proc/self/ns/pid")
            .map(|p| p.to_string_lossy().into_owned())
            // Kernels without namespaces: everything shares the one table.
            .unwrap_or_default();
        let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        Ok(Host {
            boot_id: boot_id.trim().to_owned(),
            pid_namespace,
            hostname: hostname.trim().to_owned(),
        })
    }

    /// This machine's facts, read once; `None` without `/proc`.
    pub fn here() -> Option<&'static Host> {
        static HERE: OnceLock<Option<Host>> = OnceLock::new();
        HERE.get_or_init(|| Host::current().ok()).as_ref()
    }

    /// Whether a pid recorded under `boot_id` and `pid_namespace` names a
    /// process of this process table (rather than one of an earlier boot, of
    /// another machine, or of another container).
    pub fn sees(&self, boot_id: &str, pid_namespace: &str) -> bool {
        self.boot_id == boot_id && self.pid_namespace == pid_namespace
    }
}

/// The fields of `/proc/<pid>/stat` that decide whether a process is an agent's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcStat {
    pub pid: i32,
    /// The command name, for the logs.
    pub comm: String,
    /// `R`, `S`, `D`, `Z` (zombie), …
    pub state: char,
    /// Parent pid (field 4): after its parent died, the nearest subreaper
    /// above it (or init).
    pub ppid: i32,
    /// Process group id (field 5).
    pub pgrp: i32,
    /// Session id (field 6).
    pub session: i32,
    /// Clock ticks after boot when the process started (field 22).
    pub start_time: u64,
}

impl ProcStat {
    /// Whether it still runs: a zombie has exited already and only waits to
    /// be reaped (a signal changes nothing for it).
    pub fn is_running(&self) -> bool {
        !matches!(self.state, 'Z' | 'X' | 'x')
    }

    /// Whether both describe the same process (its state and name may have
    /// changed in between).
    pub fn same_process(&self, other: &ProcStat) -> bool {
        self.pid == other.pid && self.start_time == other.start_time
    }
}

/// Parses one `/proc/<pid>/stat` line. The command name may contain spaces
/// and parentheses, so the fields after it are counted from the last `)`.
pub fn parse_stat(line: &str) -> Option<ProcStat> {
    let open = line.find('(')?;
    let close = line.rfind(')')?;
    if close < open {
        return None;
    }
    let pid = line[..open].trim().parse().ok()?;
    let comm = line[open + 1..close].to_owned();
    // Field 3 (state) is the first one after the name.
    let rest: Vec<&str> = line[close + 1..].split_whitespace().collect();
    let state = rest.first()?.chars().next()?;
    let field = |n: usize| rest.get(n - 3);
    let ppid = field(4)?.parse().ok()?;
    let pgrp = field(5)?.parse().ok()?;
    let session = field(6)?.parse().ok()?;
    let start_time = field(22)?.parse().ok()?;
    Some(ProcStat {
        pid,
        comm,
        state,
        ppid,
        pgrp,
        session,
        start_time,
    })
}

/// One process's stat; `None` when it does not exist (or there is no `/proc`).
pub fn stat(pid: i32) -> Option<ProcStat> {
    let line = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&line)
}

/// Every process visible in `/proc` (those that vanish while we look are
/// left out).
pub fn scan() -> io::Result<Vec<ProcStat>> {
    scan_dir(Path::new("/proc"))
}

fn scan_dir(proc: &Path) -> io::Result<Vec<ProcStat>> {
    let mut processes = Vec::new();
    for entry in std::fs::read_dir(proc)? {
        let Ok(entry) = entry else { continue };
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(line) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        if let Some(stat) = parse_stat(&line).filter(|s| s.pid == pid) {
            processes.push(stat);
        }
    }
    Ok(processes)
}

/// This process's children (as `/proc/self/task/*/children` lists them:
/// cheap however many processes the machine runs), else those of a whole
/// [`scan`] whose parent is this process.
pub fn children_of_self() -> io::Result<Vec<ProcStat>> {
    let me = std::process::id() as i32;
    let listed = (|| -> io::Result<Vec<i32>> {
        let mut pids = Vec::new();
        for task in std::fs::read_dir("/proc/self/task")? {
            let children = std::fs::read_to_string(task?.path().join("children"))?;
            pids.extend(
                children
                    .split_whitespace()
                    .filter_map(|p| p.parse::<i32>().ok()),
            );
        }
        Ok(pids)
    })();
    match listed {
        Ok(pids) => Ok(pids
            .into_iter()
            .filter_map(stat)
            .filter(|p| p.ppid == me)
            .collect()),
        // A kernel without the lists (CONFIG_PROC_CHILDREN).
        Err(_) => Ok(scan()?.into_iter().filter(|p| p.ppid == me).collect()),
    }
}

/// What is left of a recorded agent process group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Leftovers {
    /// Nothing of it runs any more.
    Nothing,
    /// A process started at another time has the recorded pid now: the pid
    /// was reused, and whatever group it leads is not the agent's.
    PidReused(ProcStat),
    /// These still run and are the agent's: the agent itself, and members of
    /// its group that started no earlier than it did.
    Kill(Vec<ProcStat>),
}

/// Decides which of `processes` belong to the agent recorded with `pid` and
/// `start_time` (pure: the caller scanned `/proc`).
///
/// Linux keeps a pid allocated while any process is in the group it names,
/// so as long as the group lives the pid cannot go to anyone else; a live
/// process with the pid and another start time means the agent's group died
/// out and the pid was handed on.
pub fn leftovers(pid: i32, start_time: u64, processes: &[ProcStat]) -> Leftovers {
    if let Some(leader) = processes.iter().find(|p| p.pid == pid) {
        if leader.start_time != start_time {
            return Leftovers::PidReused(leader.clone());
        }
    }
    let ours: Vec<ProcStat> = processes
        .iter()
        .filter(|p| p.is_running())
        .filter(|p| p.pid == pid || (p.pgrp == pid && p.start_time >= start_time))
        .cloned()
        .collect();
    if ours.is_empty() {
        Leftovers::Nothing
    } else {
        Leftovers::Kill(ours)
    }
}

/// The members of a process tree, as found in `processes` (pure: the caller
/// scanned `/proc`): every process below `root` (whose parent, or its
/// parent's parent…, is the root or one of the `known` members still
/// running as the process they were), and with `group`, every process of
/// the root's process group or session that started no earlier than the
/// root. Only running processes, the root left out (it goes last).
///
/// `group` may only be asked for while the root's pid is still its own
/// (running, or exited and not yet reaped): after that a new process could
/// lead a group or session with that number.
pub fn tree_members(
    root: &ProcStat,
    known: &[ProcStat],
    group: bool,
    processes: &[ProcStat],
) -> Vec<ProcStat> {
    use std::collections::{HashMap, HashSet};
    let mut children: HashMap<i32, Vec<&ProcStat>> = HashMap::new();
    for p in processes {
        children.entry(p.ppid).or_default().push(p);
    }
    let mut inside: HashSet<(i32, u64)> = HashSet::new();
    let mut queue: Vec<&ProcStat> = Vec::new();
    let seeds = processes.iter().filter(|p| {
        p.same_process(root)
            || known.iter().any(|k| k.same_process(p))
            || (group
                && (p.pgrp == root.pid || p.session == root.pid)
                && p.start_time >= root.start_time)
    });
    for p in seeds {
        if inside.insert((p.pid, p.start_time)) {
            queue.push(p);
        }
    }
    while let Some(parent) = queue.pop() {
        for child in children.get(&parent.pid).into_iter().flatten() {
            // A child never started before its parent; the parent is the
            // process judged, so its children are really its own.
            if child.start_time >= parent.start_time && inside.insert((child.pid, child.start_time))
            {
                queue.push(child);
            }
        }
    }
    processes
        .iter()
        .filter(|p| inside.contains(&(p.pid, p.start_time)))
        .filter(|p| p.is_running() && !p.same_process(root))
        .cloned()
        .collect()
}

/// What [`kill_leftovers`] did.
#[derive(Debug)]
pub enum Sweep {
    /// Nothing of the agent's group ran any more.
    Nothing,
    /// The recorded pid belongs to a later process: nothing was touched.
    PidReused(ProcStat),
    /// SIGKILL went to `killed`; `failed` could not be signalled.
    Killed {
        killed: Vec<ProcStat>,
        failed: Vec<(ProcStat, io::Error)>,
    },
}

/// At most this many rounds of look-and-kill (each round catches what the
/// previous round's processes forked before their signal arrived).
const MAX_ROUNDS: usize = 16;

/// Kills what is left of the agent recorded with `pid` and `start_time`
/// (see [`leftovers`]). Each process is signalled through a pidfd after its
/// stat was read again, so a pid reused between the scan and the signal is
/// never hit.
pub fn kill_leftovers(pid: i32, start_time: u64) -> io::Result<Sweep> {
    let mut killed: Vec<ProcStat> = Vec::new();
    let mut failed: Vec<(ProcStat, io::Error)> = Vec::new();
    for _ in 0..MAX_ROUNDS {
        let members = match leftovers(pid, start_time, &scan()?) {
            Leftovers::Nothing => break,
            Leftovers::PidReused(now) if killed.is_empty() && failed.is_empty() => {
                return Ok(Sweep::PidReused(now));
            }
            Leftovers::PidReused(_) => break,
            Leftovers::Kill(members) => members,
        };
        let tried = |p: &ProcStat| {
            killed
                .iter()
                .chain(failed.iter().map(|(f, _)| f))
                .any(|k| k.same_process(p))
        };
        let fresh: Vec<ProcStat> = members.into_iter().filter(|p| !tried(p)).collect();
        if fresh.is_empty() {
            // Signalled already, on their way out.
            break;
        }
        for process in fresh {
            match kill_same(&process) {
                Ok(true) => killed.push(process),
                Ok(false) => {}
                Err(e) => failed.push((process, e)),
            }
        }
    }
    if killed.is_empty() && failed.is_empty() {
        Ok(Sweep::Nothing)
    } else {
        Ok(Sweep::Killed { killed, failed })
    }
}

/// SIGKILLs `process` if its pid still names the same process (`false`: it
/// is gone or is another one now).
fn kill_same(process: &ProcStat) -> io::Result<bool> {
    signal_if(process, libc::SIGKILL, still_same)
}

/// Sends `signal` to `process` if its pid still names the process that was
/// read (same pid and start time; `false`: it is gone or is another one now).
/// Whatever it did since (a new session, a new group) does not matter.
pub fn signal_exact(process: &ProcStat, signal: i32) -> io::Result<bool> {
    signal_if(process, signal, |p| {
        stat(p.pid).is_some_and(|now| now.start_time == p.start_time)
    })
}

/// Signals `process` if `same` (asked after the process was pinned) says
/// it is still the one that was judged.
#[cfg(target_os = "linux")]
fn signal_if(
    process: &ProcStat,
    signal: i32,
    same: impl Fn(&ProcStat) -> bool,
) -> io::Result<bool> {
    use std::os::fd::AsRawFd;
    let fd = match pidfd(process.pid) {
        Ok(Some(fd)) => fd,
        Ok(None) => return Ok(false),
        // Before Linux 5.3: check, then signal (a window of microseconds).
        Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {
            return signal_checked(process, signal, same)
        }
        Err(e) => return Err(e),
    };
    // The pidfd pins the process it was opened on: if the pid still names the
    // process we judged, the signal reaches that process and no other.
    if !same(process) {
        return Ok(false);
    }
    // SAFETY: a valid pidfd, a signal number, no siginfo, no flags.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    signal_result(rc as i32)
}

#[cfg(not(target_os = "linux"))]
fn signal_if(
    process: &ProcStat,
    signal: i32,
    same: impl Fn(&ProcStat) -> bool,
) -> io::Result<bool> {
    signal_checked(process, signal, same)
}

/// A pidfd of `pid` (`None`: no such process), to wait for it or signal it
/// without a reused pid ever being hit.
#[cfg(target_os = "linux")]
pub fn pidfd(pid: i32) -> io::Result<Option<std::os::fd::OwnedFd>> {
    use std::os::fd::FromRawFd;
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        let err = io::Error::last_os_error();
        return match err.raw_os_error() {
            Some(libc::ESRCH) => Ok(None),
            _ => Err(err),
        };
    }
    // SAFETY: the fd was just opened and nothing else owns it.
    Ok(Some(unsafe {
        std::os::fd::OwnedFd::from_raw_fd(fd as i32)
    }))
}

#[cfg(not(target_os = "linux"))]
pub fn pidfd(_pid: i32) -> io::Result<Option<std::os::fd::OwnedFd>> {
    Err(io::Error::from_raw_os_error(libc::ENOSYS))
}

fn signal_checked(
    process: &ProcStat,
    signal: i32,
    same: impl Fn(&ProcStat) -> bool,
) -> io::Result<bool> {
    if !same(process) {
        return Ok(false);
    }
    // SAFETY: kill(2) has no memory-safety preconditions.
    let rc = unsafe { libc::kill(process.pid, signal) };
    signal_result(rc)
}

fn still_same(process: &ProcStat) -> bool {
    stat(process.pid)
        .is_some_and(|now| now.start_time == process.start_time && now.pgrp == process.pgrp)
}

fn signal_result(rc: i32) -> io::Result<bool> {
    if rc == 0 {
        return Ok(true);
    }
    let err = io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::ESRCH) => Ok(false),
        _ => Err(err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(pid: i32, pgrp: i32, start_time: u64) -> ProcStat {
        ProcStat {
            pid,
            comm: format!("p{pid}"),
            state: 'S',
            ppid: 1,
            pgrp,
            session: pgrp,
            start_time,
        }
    }

    fn zombie(pid: i32, pgrp: i32, start_time: u64) -> ProcStat {
        ProcStat {
            state: 'Z',
            ..p(pid, pgrp, start_time)
        }
    }

    /// A real line (a `sleep` in group 4242), with `comm` swapped in.
    fn line(comm: &str) -> String {
        format!(
            "4243 ({comm}) S 1 4242 4242 0 -1 4194304 100 0 0 0 0 0 0 0 20 0 1 0 \
             987654 8298496 230 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0"
        )
    }

    #[test]
    fn stat_lines_parse_by_counting_after_the_last_parenthesis() {
        let parsed = parse_stat(&line("sleep")).unwrap();
        assert_eq!(parsed, {
            let mut want = p(4243, 4242, 987654);
            want.comm = "sleep".into();
            want
        });
        // A name with spaces and parentheses shifts nothing.
        let parsed = parse_stat(&line("a) b (c) d")).unwrap();
        assert_eq!(parsed.comm, "a) b (c) d");
        assert_eq!((parsed.pgrp, parsed.start_time), (4242, 987654));
    }

    #[test]
    fn broken_stat_lines_are_refused() {
        assert_eq!(parse_stat(""), None);
        assert_eq!(parse_stat("12 (x) S 1 12"), None);
        assert_eq!(parse_stat("x (sleep) S 1 2 3"), None);
        assert_eq!(parse_stat(") 12 ("), None);
    }

    #[test]
    fn zombies_do_not_run() {
        let mut stat = parse_stat(&line("sleep")).unwrap();
        assert!(stat.is_running());
        stat.state = 'Z';
        assert!(!stat.is_running());
    }

    #[test]
    fn a_live_agent_is_killed_with_its_group_but_not_with_older_or_foreign_processes() {
        let agent = p(100, 100, 5000);
        let child = p(101, 100, 5001);
        let same_tick = p(102, 100, 5000);
        let older = p(50, 100, 4000);
        let stranger = p(103, 103, 6000);
        let all = [
            older,
            agent.clone(),
            child.clone(),
            same_tick.clone(),
            stranger,
        ];
        assert_eq!(
            leftovers(100, 5000, &all),
            Leftovers::Kill(vec![agent, child, same_tick])
        );
    }

    #[test]
    fn a_reused_pid_means_nothing_of_its_group_is_killed() {
        // The pid now leads a group of a process started later, with children.
        let now = p(100, 100, 9000);
        let all = [now.clone(), p(101, 100, 9001), p(102, 100, 9002)];
        assert_eq!(leftovers(100, 5000, &all), Leftovers::PidReused(now));
        // Also when the newcomer is not a group leader.
        let now = p(100, 7, 9000);
        assert_eq!(
            leftovers(100, 5000, std::slice::from_ref(&now)),
            Leftovers::PidReused(now)
        );
    }

    #[test]
    fn a_dead_agents_children_are_still_its_leftovers() {
        let child = p(101, 100, 5001);
        let grandchild = p(105, 100, 5100);
        let all = [
            child.clone(),
            grandchild.clone(),
            zombie(106, 100, 5200),
            p(50, 100, 4000),
            p(200, 200, 6000),
        ];
        assert_eq!(
            leftovers(100, 5000, &all),
            Leftovers::Kill(vec![child, grandchild])
        );
    }

    #[test]
    fn a_zombie_agent_still_vouches_for_its_group() {
        let child = p(101, 100, 5001);
        let all = [zombie(100, 100, 5000), child.clone()];
        assert_eq!(leftovers(100, 5000, &all), Leftovers::Kill(vec![child]));
        // A zombie with the pid but another start time is a reused pid.
        let all = [zombie(100, 100, 9000), p(101, 100, 9001)];
        assert_eq!(
            leftovers(100, 5000, &all),
            Leftovers::PidReused(zombie(100, 100, 9000))
        );
    }

    #[test]
    fn nothing_left_means_nothing_to_kill() {
        assert_eq!(leftovers(100, 5000, &[]), Leftovers::Nothing);
        let all = [zombie(101, 100, 5001), p(200, 200, 1)];
        assert_eq!(leftovers(100, 5000, &all), Leftovers::Nothing);
    }

    /// `p` with a parent and a session of its own.
    fn under(pid: i32, ppid: i32, start_time: u64) -> ProcStat {
        ProcStat {
            ppid,
            session: pid,
            ..p(pid, pid, start_time)
        }
    }

    #[test]
    fn a_tree_is_what_is_below_its_root_whatever_session_it_made() {
        let root = p(100, 100, 5000);
        let all = [
            root.clone(),
            under(101, 100, 5001), // setsid'd child
            under(102, 101, 5002), // its child
            under(103, 100, 5003), // an orphan re-parented to the root
            ProcStat {
                state: 'Z',
                ..under(104, 100, 5004) // exited already
            },
            p(105, 100, 5005),     // in its group, its parent elsewhere
            under(200, 1, 4000),   // a stranger
            under(201, 200, 6000), // a stranger's child
            under(300, 100, 4999), // "below" a root younger than itself: a reused ppid
        ];
        let pids = |members: Vec<ProcStat>| members.iter().map(|m| m.pid).collect::<Vec<_>>();
        assert_eq!(
            pids(tree_members(&root, &[], true, &all)),
            [101, 102, 103, 105]
        );
        // Once the root's pid is no longer its own, its group does not count.
        assert_eq!(pids(tree_members(&root, &[], false, &all)), [101, 102, 103]);
    }

    #[test]
    fn what_was_below_a_root_stays_its_own_after_the_root_has_gone() {
        let root = p(100, 100, 5000);
        let known = [under(101, 100, 5001)];
        // The root is gone; its child was re-parented to init and started one.
        let all = [
            under(101, 1, 5001),
            under(102, 101, 5002),
            under(103, 1, 5003),
        ];
        let members = tree_members(&root, &known, false, &all);
        assert_eq!(
            members.iter().map(|m| m.pid).collect::<Vec<_>>(),
            [101, 102]
        );
        // A known pid now naming another process is not followed.
        let all = [under(101, 1, 9000), under(102, 101, 9001)];
        assert!(tree_members(&root, &known, false, &all).is_empty());
    }

    #[test]
    fn records_of_another_boot_or_pid_namespace_name_no_process_here() {
        let here = Host {
            boot_id: "b1".into(),
            pid_namespace: "pid:[1]".into(),
            hostname: "node-a".into(),
        };
        assert!(here.sees("b1", "pid:[1]"));
        assert!(!here.sees("b0", "pid:[1]"), "a previous boot");
        assert!(!here.sees("b1", "pid:[2]"), "another container");
        assert!(!here.sees("b2", "pid:[3]"), "another machine");
    }

    #[test]
    fn this_host_is_known_when_there_is_a_proc() {
        if !Path::new("/proc/self/stat").exists() {
            return;
        }
        let here = Host::here().expect("/proc is there");
        assert!(!here.boot_id.is_empty());
        assert!(here.sees(&here.boot_id, &here.pid_namespace));
        let me = std::process::id() as i32;
        assert!(
            scan().unwrap().iter().any(|p| p.pid == me),
            "we see ourselves"
        );
    }

    /// A `sleep` in a process group of its own, as agents are started.
    fn group_leader() -> std::process::Child {
        use std::os::unix::process::CommandExt;
        std::process::Command::new("sleep")
            .arg("600")
            .process_group(0)
            .spawn()
            .unwrap()
    }

    #[test]
    fn a_live_process_recorded_with_another_start_time_is_left_alone() {
        if !Path::new("/proc/self/stat").exists() {
            return;
        }
        let mut child = group_leader();
        let pid = child.id() as i32;
        let me = stat(pid).unwrap();
        assert_eq!(me.pgrp, pid, "its own group");
        // As if the record were of an earlier process that had this pid.
        match kill_leftovers(pid, me.start_time - 1).unwrap() {
            Sweep::PidReused(now) => assert_eq!(now.pid, pid),
            other => panic!("expected the pid to count as reused: {other:?}"),
        }
        assert!(child.try_wait().unwrap().is_none(), "still running");
        // Recorded as it is, it goes.
        match kill_leftovers(pid, me.start_time).unwrap() {
            Sweep::Killed { killed, failed } => {
                assert_eq!(killed.len(), 1, "{killed:?}");
                assert!(killed[0].same_process(&me), "{killed:?}");
                assert!(failed.is_empty(), "{failed:?}");
            }
            other => panic!("expected a kill: {other:?}"),
        }
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGKILL));
    }
}
