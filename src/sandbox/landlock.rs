//! Landlock, applied: what the kernel offers ([`kernel_abi`]), a box's
//! rules made into a ruleset before a fork ([`Prepared::new`], with the
//! `landlock` crate), and that ruleset enforced on the child between fork
//! and exec ([`Prepared::confine`]), or on one thread of ours
//! ([`confine_this_thread`], for files reached for an agent).
//!
//! Enforcing is two system calls (`prctl(PR_SET_NO_NEW_PRIVS)` and
//! `landlock_restrict_self`), which allocate nothing and take no lock: safe
//! in a child forked from a process with many threads. The ruleset's
//! descriptor is close-on-exec: the agent never holds it.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::sync::OnceLock;

use landlock::{
    Access, AccessFs, AccessNet, NetPort, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreatedAttr, Scope, ABI,
};

use super::Rules;

/// The rights asked for (the kernel's own subset is used: best effort).
const FS_ABI: ABI = ABI::V7;
/// `LANDLOCK_CREATE_RULESET_VERSION`.
const CREATE_RULESET_VERSION: libc::c_uint = 1;

/// The Landlock ABI version this kernel offers (`None`: none), asked once.
pub fn kernel_abi() -> Option<u32> {
    static ABI: OnceLock<Option<u32>> = OnceLock::new();
    *ABI.get_or_init(ask_kernel)
}

fn ask_kernel() -> Option<u32> {
    // SAFETY: with a null attribute, a size of 0 and the VERSION flag, the
    // call reads nothing and only answers a number (or fails: ENOSYS,
    // EOPNOTSUPP where Landlock is not enabled).
    let answer = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            CREATE_RULESET_VERSION,
        )
    };
    u32::try_from(answer).ok().filter(|&abi| abi > 0)
}

/// A box's ruleset, ready to be enforced.
#[derive(Debug)]
pub struct Prepared {
    fd: OwnedFd,
}

impl Prepared {
    /// The ruleset of `rules` (paths that do not exist are left out).
    /// Fails where the kernel enforces nothing, or a path cannot be opened.
    pub fn new(rules: &Rules) -> io::Result<Prepared> {
        let fail = |e: landlock::RulesetError| io::Error::other(format!("landlock: {e}"));
        let mut ruleset = Ruleset::default()
            .handle_access(AccessFs::from_all(FS_ABI))
            .map_err(fail)?
            .scope(Scope::from_all(FS_ABI))
            .map_err(fail)?;
        if rules.tcp_ports.is_some() {
            ruleset = ruleset.handle_access(AccessNet::ConnectTcp).map_err(fail)?;
        }
        let mut created = ruleset.create().map_err(fail)?;
        let all = AccessFs::from_all(FS_ABI);
        let read = AccessFs::from_read(FS_ABI);
        // Opened first, each with no symlink on its path: a swap is found
        // even where another rule covers the directory.
        let mut resolved = rules
            .resolved
            .iter()
            .map(|dir| {
                crate::sys::open_dir_without_links(dir)
                    .map(|fd| (dir, fd))
                    .map_err(|e| io::Error::other(format!("landlock: {e}")))
            })
            .collect::<io::Result<Vec<_>>>()?;
        for (paths, access) in [(&rules.read_write, all), (&rules.read_only, read)] {
            for path in paths {
                let fd: OwnedFd = match resolved.iter().position(|(dir, _)| *dir == path) {
                    Some(at) => resolved.swap_remove(at).1,
                    None => match open_path(path)? {
                        Some(fd) => fd.as_fd().try_clone_to_owned()?,
                        None => continue,
                    },
                };
                // Rights only directories have are dropped for a file.
                let access = if is_dir(path) {
                    access
                } else {
                    access & AccessFs::from_file(FS_ABI)
                };
                created = created
                    .add_rule(PathBeneath::new(fd, access))
                    .map_err(fail)?;
            }
        }
        for &port in rules.tcp_ports.iter().flatten() {
            created = created
                .add_rule(NetPort::new(port, AccessNet::ConnectTcp))
                .map_err(fail)?;
        }
        let fd: Option<OwnedFd> = created.into();
        let fd = fd.ok_or_else(|| io::Error::other("this kernel does not enforce Landlock"))?;
        Ok(Prepared { fd })
    }

    /// Enforces the ruleset on the calling thread and what it starts from
    /// now on. Async-signal-safe: for `pre_exec`.
    pub fn confine(&self) -> io::Result<()> {
        // SAFETY: two system calls with integer arguments; the descriptor
        // is ours and open for as long as `self` lives.
        unsafe {
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::syscall(libc::SYS_landlock_restrict_self, self.fd.as_raw_fd(), 0u32) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }

    /// Has `command`'s child enforce the ruleset before it runs its
    /// program (the ruleset stays open as long as `command` does).
    pub fn confine_child(self, command: &mut tokio::process::Command) {
        // SAFETY: `confine` is async-signal-safe (see above).
        unsafe {
            command.pre_exec(move || self.confine());
        }
    }
}

/// Confines the calling thread (a thread of its own that ends with its
/// work: the rights go with it) to `rules`.
pub fn confine_this_thread(rules: &Rules) -> io::Result<()> {
    Prepared::new(rules)?.confine()
}

/// `Ok(None)` where nothing is there.
fn open_path(path: &Path) -> io::Result<Option<PathFd>> {
    match PathFd::new(path) {
        Ok(fd) => Ok(Some(fd)),
        Err(_) if std::fs::symlink_metadata(path).is_err() => Ok(None),
        Err(e) => Err(io::Error::other(format!(
            "landlock: {}: {e}",
            path.display()
        ))),
    }
}

fn is_dir(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_dir())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// A thread confined to a box reaches what it allows and nothing else
    /// (where the kernel offers Landlock; elsewhere the test says so).
    #[test]
    fn a_confined_thread_reaches_its_box_alone() {
        if kernel_abi().is_none() {
            eprintln!("no Landlock on this kernel: skipped");
            return;
        }
        let inside = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "bob's").unwrap();
        let rules = Rules {
            read_write: vec![inside.path().to_path_buf(), PathBuf::from("/nonexistent/x")],
            read_only: vec![PathBuf::from("/usr"), PathBuf::from("/etc/hostname")],
            resolved: Vec::new(),
            tcp_ports: None,
        };
        let (inside, outside) = (inside.path().to_path_buf(), outside.path().to_path_buf());
        let theirs = outside.clone();
        std::thread::spawn(move || {
            confine_this_thread(&rules).unwrap();
            std::fs::write(inside.join("mine"), "x").unwrap();
            assert!(std::fs::read_dir("/usr").is_ok());
            let denied = std::fs::read_to_string(outside.join("secret")).unwrap_err();
            assert_eq!(denied.kind(), io::ErrorKind::PermissionDenied);
            let denied = std::fs::write(outside.join("new"), "x").unwrap_err();
            assert_eq!(denied.kind(), io::ErrorKind::PermissionDenied);
            let denied = std::fs::write("/etc/hostname", "x").unwrap_err();
            assert_eq!(denied.kind(), io::ErrorKind::PermissionDenied);
        })
        .join()
        .unwrap();
        // The test's other threads keep their rights.
        assert!(std::fs::read_to_string(theirs.join("secret")).is_ok());
    }
}
