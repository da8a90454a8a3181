//! The processes the gateway starts for conversations (agents and terminal
//! commands), and everything those start in turn.
//!
//! - **Their environment** starts from nothing: a few harmless variables of
//!   the gateway's own ([`ALLOWED`], `LC_*`), the identity of the user they
//!   run as, the profile's `env`, then the variables its `pass_env` names.
//!   Nothing else of the gateway's (its database URL, its settings, its
//!   tokens) ever reaches them. [`environment`] is the one place it is made.
//! - **Their trees.** Each one leads a session (so a process group) of its
//!   own and is a *child subreaper*: what it starts and then orphans (a
//!   double fork, a `setsid` daemon) is re-parented to it, not to init, so
//!   while it lives everything it started is below it. [`Tree::kill`] kills
//!   all of that, then it.
//! - **Orphans.** When one of them dies, what is still below it goes to the
//!   nearest subreaper above: the gateway's own process, which declared
//!   itself one at start ([`adopt_orphans`], in `acp-gateway serve`), kills
//!   and reaps every such process ([`reap_orphans`]). It can tell them from
//!   its own children because every process it starts is registered here
//!   (under a lock held across the spawn) with its start time: a child of the
//!   gateway's process that is not in the registry was not started by it,
//!   so it was re-parented to it, so it was below one of its agents or
//!   terminals. A process that embeds the gateway (the in-process tests)
//!   may have children of its own, started elsewhere, which the registry
//!   cannot know: it never adopts orphans, and there only what is below a
//!   live agent or terminal, or in its process group, goes with it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use crate::process::procs::{self, ProcStat};
use crate::sys::SystemUser;

/// The gateway's own variables every agent and terminal gets (with
/// [`ALLOWED_PREFIX`]); the rest only when a profile's `pass_env` names them.
pub const ALLOWED: &[&str] = &[
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "TERM", "TZ", "TMPDIR",
];
/// The locale variables (`LC_ALL`, `LC_CTYPE`, …) are passed as well.
pub const ALLOWED_PREFIX: &str = "LC_";

/// An environment for a child, variable by variable.
pub type Environment = BTreeMap<OsString, OsString>;

/// The environment of an agent of a profile with this `env` and `pass_env`,
/// running as `user` (`None`: as the gateway); a terminal command of its
/// gets the same plus what its request asks for.
pub fn environment(
    env: &BTreeMap<String, String>,
    pass_env: &[String],
    user: Option<&SystemUser>,
) -> Environment {
    environment_from(std::env::vars_os(), env, pass_env, user)
}

/// [`environment`] with the gateway's variables given (pure).
fn environment_from(
    gateway: impl IntoIterator<Item = (OsString, OsString)>,
    env: &BTreeMap<String, String>,
    pass_env: &[String],
    user: Option<&SystemUser>,
) -> Environment {
    let gateway: Environment = gateway.into_iter().collect();
    let allowed = |name: &OsStr| {
        name.to_str()
            .is_some_and(|name| ALLOWED.contains(&name) || name.starts_with(ALLOWED_PREFIX))
    };
    let mut out: Environment = gateway
        .iter()
        .filter(|(name, _)| allowed(name))
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect();
    if let Some(user) = user {
        for (name, value) in [
            ("HOME", &user.home),
            ("USER", &user.name),
            ("LOGNAME", &user.name),
        ] {
            out.insert(name.into(), value.into());
        }
    }
    for (name, value) in env {
        out.insert(name.into(), value.into());
    }
    for name in pass_env {
        if let Some(value) = gateway.get(OsStr::new(name)) {
            out.insert(name.into(), value.clone());
        }
    }
    out
}

/// The `PATH` of an environment, where a command is looked up.
pub fn path_of(environment: &Environment) -> Option<&str> {
    environment.get(OsStr::new("PATH")).and_then(|p| p.to_str())
}

/// Every process the gateway started that it has not reaped yet: pid →
/// start time (`None` without `/proc`).
static SPAWNED: Mutex<BTreeMap<i32, Option<u64>>> = Mutex::new(BTreeMap::new());
/// Whether this process adopts and kills orphans ([`adopt_orphans`]).
static ADOPTING: AtomicBool = AtomicBool::new(false);

fn spawned() -> std::sync::MutexGuard<'static, BTreeMap<i32, Option<u64>>> {
    SPAWNED.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Starts `command` as the root of a tree: in a session of its own, a
/// subreaper for what it starts, and registered (see the module's doc).
/// Set its environment (from [`environment`]) first.
pub fn spawn(command: &mut tokio::process::Command) -> io::Result<(tokio::process::Child, Tree)> {
    // SAFETY: the closure runs between fork and exec; it only makes two
    // system calls, which allocate nothing and take no locks.
    unsafe {
        command.pre_exec(become_tree_root);
    }
    // Held across the spawn: a sweep for orphans never sees the new child
    // before it is registered.
    let mut registry = spawned();
    let child = command.spawn()?;
    let pid = child
        .id()
        .ok_or_else(|| io::Error::other("a child just spawned has no pid"))? as i32;
    // Not reaped before we wait for it: even a child that exited at once
    // still has its stat.
    let start_time = procs::stat(pid).map(|stat| stat.start_time);
    registry.insert(pid, start_time);
    drop(registry);
    Ok((child, Tree::new(pid, start_time)))
}

/// In the child, before exec: its own session (and process group), so a
/// signal to the group reaches what it starts, a Ctrl-C on the gateway's
/// terminal does not reach it, and it has no controlling terminal to reach
/// the operator's; and a subreaper, which survives exec.
fn become_tree_root() -> io::Result<()> {
    // SAFETY: setsid and prctl take no pointers.
    unsafe {
        if libc::setsid() < 0 {
            return Err(io::Error::last_os_error());
        }
        #[cfg(target_os = "linux")]
        if libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// At most this many rounds of look-and-kill: each catches what the
/// previous round's processes started before their signal arrived.
const MAX_ROUNDS: usize = 16;

/// A process the gateway started (the root) and everything below it.
#[derive(Debug)]
pub struct Tree {
    pid: i32,
    /// The root as read at its start: `None` without `/proc`, where only its
    /// process group can be reached.
    root: Option<ProcStat>,
    /// Becomes readable when the root exits (before it is reaped).
    exit: Option<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>>,
    /// Processes found below the root before it exited: after it, they are
    /// elsewhere (re-parented), but they are still its.
    known: Mutex<Vec<ProcStat>>,
    /// Set once the root has been reaped: its pid (and so its group's and
    /// session's number) may be another process's from then on.
    reaped: AtomicBool,
}

impl Tree {
    fn new(pid: i32, start_time: Option<u64>) -> Tree {
        let root = start_time.map(|start_time| ProcStat {
            pid,
            comm: String::new(),
            state: 'S',
            ppid: 0,
            pgrp: pid,
            session: pid,
            start_time,
        });
        let exit = procs::pidfd(pid)
            .ok()
            .flatten()
            .filter(|_| tokio::runtime::Handle::try_current().is_ok())
            .and_then(|fd| {
                // SAFETY: the AsyncFd owns the OwnedFd, which stays open and
                // the same for as long as it lives.
                unsafe {
                    tokio::io::unix::AsyncFd::register_with_interest(
                        fd,
                        tokio::io::Interest::READABLE,
                    )
                }
                .ok()
            });
        Tree {
            pid,
            root,
            exit,
            known: Mutex::new(Vec::new()),
            reaped: AtomicBool::new(false),
        }
    }

    /// The root's pid (also its session's and process group's id).
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The root's start time (clock ticks after boot); `None` without `/proc`.
    pub fn start_time(&self) -> Option<u64> {
        self.root.as_ref().map(|root| root.start_time)
    }

    /// Whether [`Tree::exited`] can tell when the root exits (Linux 5.3+).
    pub fn watches_exit(&self) -> bool {
        self.exit.is_some()
    }

    /// Resolves once the root has exited, before it is reaped (never, when
    /// [`Tree::watches_exit`] is false). Cancel-safe; at once afterwards.
    pub async fn exited(&self) {
        match &self.exit {
            // Readiness is not cleared: it stays readable.
            Some(fd) => drop(fd.readable().await),
            None => std::future::pending().await,
        }
    }

    /// Remembers what is below the root now, so that it is killed with the
    /// tree even after the root has gone (call before asking it to stop).
    pub fn remember(&self) {
        let (Some(root), Ok(all)) = (&self.root, procs::scan()) else {
            return;
        };
        let mut known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        let found = procs::tree_members(root, &known, self.group_counts(), &all);
        for process in found {
            if !known.iter().any(|k| k.same_process(&process)) {
                known.push(process);
            }
        }
    }

    /// Sends `signal` to the root's process group and to the processes
    /// [`Tree::remember`] found (a polite request to stop).
    pub fn signal(&self, signal: i32) {
        if self.group_counts() {
            // SAFETY: killpg has no memory-safety preconditions; the group
            // is the root's own (not reaped yet), or empty (ESRCH).
            unsafe {
                libc::killpg(self.pid, signal);
            }
        }
        for process in self
            .known
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
        {
            let _ = procs::signal_exact(process, signal);
        }
    }

    /// Kills the whole tree: the root is stopped first (it starts nothing
    /// more), everything below it and in its group is killed until nothing
    /// is left, then the root.
    pub fn kill(&self) {
        let Some(root) = &self.root else {
            self.kill_group();
            return;
        };
        if self.reaped.load(Ordering::Acquire) {
            self.kill_below(root);
            return;
        }
        let _ = procs::signal_exact(root, libc::SIGSTOP);
        self.kill_below(root);
        let _ = procs::signal_exact(root, libc::SIGKILL);
        // Should the kill have failed, it must not stay stopped.
        let _ = procs::signal_exact(root, libc::SIGCONT);
    }

    /// Kills what the root left when it exited: what is in its group or
    /// session and what was below it when [`Tree::remember`] looked (and
    /// what those started). Call it before the root is reaped.
    pub fn kill_left(&self) {
        match &self.root {
            Some(root) => self.kill_below(root),
            None => self.kill_group(),
        }
    }

    /// The root has been reaped: from now on its pid means nothing.
    pub fn reaped(&self) {
        if self.reaped.swap(true, Ordering::AcqRel) {
            return;
        }
        let mut registry = spawned();
        if registry.get(&self.pid) == Some(&self.start_time()) {
            registry.remove(&self.pid);
        }
    }

    fn group_counts(&self) -> bool {
        !self.reaped.load(Ordering::Acquire)
    }

    fn kill_group(&self) {
        if self.group_counts() {
            // SAFETY: as in `signal`.
            unsafe {
                libc::killpg(self.pid, libc::SIGKILL);
            }
        }
    }

    fn kill_below(&self, root: &ProcStat) {
        let known = self
            .known
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        kill_members(root, &known, self.group_counts());
    }
}

/// Kills the members of a tree (see [`procs::tree_members`]) until none is
/// left running, or none is new (the rest are on their way out); at most
/// [`MAX_ROUNDS`] looks. How many were signalled.
fn kill_members(root: &ProcStat, known: &[ProcStat], group: bool) -> usize {
    let mut tried: HashSet<(i32, u64)> = HashSet::new();
    for _ in 0..MAX_ROUNDS {
        let Ok(all) = procs::scan() else { break };
        let fresh: Vec<ProcStat> = procs::tree_members(root, known, group, &all)
            .into_iter()
            .filter(|p| !tried.contains(&(p.pid, p.start_time)))
            .collect();
        if fresh.is_empty() {
            break;
        }
        for process in fresh {
            if let Err(e) = procs::signal_exact(&process, libc::SIGKILL) {
                tracing::warn!(pid = process.pid, error = %e, "cannot kill a process of a conversation");
            }
            tried.insert((process.pid, process.start_time));
        }
    }
    tried.len()
}

/// Makes this process the adoptive parent of whatever its agents and
/// terminals leave behind, to be killed by [`reap_orphans`]. Only for a
/// process whose every child is started through [`spawn`] (see the
/// module's doc): `acp-gateway serve` calls it at start.
pub fn adopt_orphans() -> io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: prctl with integer arguments only.
        if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
            return Err(io::Error::last_os_error());
        }
        ADOPTING.store(true, Ordering::Release);
        Ok(())
    }
    #[cfg(not(target_os = "linux"))]
    Err(io::Error::other("adopting orphans needs Linux"))
}

/// Whether this process adopts orphans.
pub fn adopting() -> bool {
    ADOPTING.load(Ordering::Acquire)
}

/// How often orphans are looked for besides when a child exits (each exit
/// is what hands the gateway orphans; this is in case a signal was lost).
const ORPHAN_SWEEP: Duration = Duration::from_secs(10);

/// Kills and reaps the orphans re-parented to this process until `stop`
/// (nothing, unless it [adopts](adopt_orphans) them): whenever a child of
/// it exits, and every [`ORPHAN_SWEEP`].
pub async fn reap_orphans(stop: tokio_util::sync::CancellationToken) {
    if !adopting() {
        return;
    }
    use tokio::signal::unix::{signal, SignalKind};
    let mut child_exited = match signal(SignalKind::child()) {
        Ok(signal) => signal,
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch for SIGCHLD; orphans are looked for every {ORPHAN_SWEEP:?}");
            return reap_orphans_every(stop).await;
        }
    };
    let mut tick = tokio::time::interval(ORPHAN_SWEEP);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = child_exited.recv() => {}
            _ = tick.tick() => {}
        }
        let _ = tokio::task::spawn_blocking(sweep_orphans).await;
    }
}

async fn reap_orphans_every(stop: tokio_util::sync::CancellationToken) {
    let mut tick = tokio::time::interval(ORPHAN_SWEEP);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let _ = tokio::task::spawn_blocking(sweep_orphans).await;
    }
}

/// One look for orphans (blocking: it reads `/proc`): every child of this
/// process that it did not start is killed with everything below it, and
/// reaped once it has exited (by its own pid: the children it started are
/// tokio's to wait for). Nothing unless this process adopts orphans.
pub fn sweep_orphans() {
    if !adopting() {
        return;
    }
    let me = std::process::id() as i32;
    // Held throughout: no child is started (and not yet registered) while
    // children are judged.
    let mut registry = spawned();
    // Its children alone: a look costs the same with a thousand agents
    // (each shim looks too) as with one.
    let Ok(all) = procs::children_of_self() else {
        return;
    };
    // Forgotten: what was reaped without a word (dropped children, reaped
    // by tokio in the background); until reaped, a child is still there.
    registry.retain(|pid, start| {
        all.iter()
            .any(|p| p.pid == *pid && start.is_none_or(|start| start == p.start_time))
    });
    let ours = |p: &ProcStat| {
        registry
            .get(&p.pid)
            .is_some_and(|start| start.is_none_or(|start| start == p.start_time))
    };
    let orphans: Vec<&ProcStat> = all.iter().filter(|p| p.ppid == me && !ours(p)).collect();
    let mut by_comm: HashMap<&str, usize> = HashMap::new();
    for orphan in orphans {
        if orphan.is_running() {
            // Below it first (it is stopped so as to start nothing more).
            let _ = procs::signal_exact(orphan, libc::SIGSTOP);
            kill_members(orphan, &[], false);
            let _ = procs::signal_exact(orphan, libc::SIGKILL);
            let _ = procs::signal_exact(orphan, libc::SIGCONT);
            *by_comm.entry(&orphan.comm).or_default() += 1;
        }
        reap(orphan.pid);
    }
    drop(registry);
    for (comm, count) in by_comm {
        tracing::info!(
            process = comm,
            count,
            "killed processes an agent or a terminal command left behind"
        );
    }
}

/// Reaps `pid`, a child of this process, if it has exited (never waits).
fn reap(pid: i32) {
    let mut status = 0;
    // SAFETY: waitpid on one pid, writing into a local.
    unsafe {
        libc::waitpid(pid, &mut status, libc::WNOHANG);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        pairs
            .iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v)))
            .collect()
    }

    fn names(env: &Environment) -> Vec<&str> {
        env.keys().map(|k| k.to_str().unwrap()).collect()
    }

    #[test]
    fn only_the_allowlist_of_the_gateways_environment_is_passed() {
        let gateway = vars(&[
            ("PATH", "/usr/bin"),
            ("HOME", "/root"),
            ("LANG", "C.UTF-8"),
            ("LC_ALL", "C"),
            ("TZ", "UTC"),
            ("DATABASE_URL", "postgres://secret"),
            ("ACP_GATEWAY_LISTEN", "0.0.0.0:8080"),
            ("POSTGRES_PASSWORD", "secret"),
            ("ANTHROPIC_API_KEY", "sk"),
            ("LCX", "not a locale"),
        ]);
        let env = environment_from(gateway, &BTreeMap::new(), &[], None);
        assert_eq!(names(&env), ["HOME", "LANG", "LC_ALL", "PATH", "TZ"]);
        assert_eq!(env[OsStr::new("HOME")], "/root");
    }

    #[test]
    fn the_profile_adds_its_env_then_what_pass_env_names() {
        let gateway = vars(&[
            ("PATH", "/usr/bin"),
            ("ANTHROPIC_API_KEY", "sk-from-gateway"),
            ("DATABASE_URL", "postgres://secret"),
        ]);
        let env: BTreeMap<String, String> = [
            ("PATH".to_owned(), "/opt/agent/bin".to_owned()),
            ("MODEL".to_owned(), "big".to_owned()),
            ("ANTHROPIC_API_KEY".to_owned(), "sk-from-profile".to_owned()),
        ]
        .into();
        let pass = [
            "ANTHROPIC_API_KEY".to_owned(),
            "NOT_SET_ANYWHERE".to_owned(),
        ];
        let out = environment_from(gateway, &env, &pass, None);
        assert_eq!(names(&out), ["ANTHROPIC_API_KEY", "MODEL", "PATH"]);
        assert_eq!(out[OsStr::new("PATH")], "/opt/agent/bin");
        assert_eq!(out[OsStr::new("ANTHROPIC_API_KEY")], "sk-from-gateway");
        assert_eq!(path_of(&out), Some("/opt/agent/bin"));
    }

    #[test]
    fn another_users_agent_gets_that_users_identity_unless_the_profile_says_otherwise() {
        let nobody = SystemUser {
            name: "nobody".into(),
            uid: 65534,
            gid: 65534,
            home: "/nonexistent".into(),
        };
        let gateway = vars(&[("HOME", "/root"), ("USER", "root"), ("LOGNAME", "root")]);
        let out = environment_from(gateway.clone(), &BTreeMap::new(), &[], Some(&nobody));
        assert_eq!(out[OsStr::new("HOME")], "/nonexistent");
        assert_eq!(out[OsStr::new("USER")], "nobody");
        assert_eq!(out[OsStr::new("LOGNAME")], "nobody");
        let env = [("HOME".to_owned(), "/srv/agent".to_owned())].into();
        let out = environment_from(gateway, &env, &[], Some(&nobody));
        assert_eq!(out[OsStr::new("HOME")], "/srv/agent");
    }
}
