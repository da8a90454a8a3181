//! Linux capabilities: every agent, shim and terminal command starts with
//! none ([`Shedding`], between fork and exec), whatever user it runs as, so
//! that an agent running as root (a profile naming no `user` on a gateway
//! running as root) cannot read or trace the gateway or another agent,
//! change files' owners, bind low ports or load anything into the kernel. A
//! profile names those its agents truly need (`capabilities`, parsed into
//! a [`CapSet`]); they keep those and no other.
//!
//! Between fork and exec, in this order: the bounding set is emptied of
//! what is not kept (which needs `CAP_SETPCAP`, so before anything else is
//! dropped), the user is switched to (with the kept ones carried over it),
//! the permitted, effective and inheritable sets become the kept ones, the
//! ambient set holds exactly those (so that a program run as another user
//! than root keeps them over `exec`), and `no_new_privs` is set (nothing
//! run later gains any: not a set-user-ID program, not file capabilities).
//! All of it is system calls with integer arguments and buffers made before
//! the fork: nothing allocates, nothing takes a lock.

use std::ffi::CString;
use std::io;
use std::path::Path;

pub use crate::sys::capabilities::CapSet;
use crate::sys::capabilities::{Data, Header, VERSION_3};

/// How a child sheds its privileges between fork and exec: every
/// capability but those kept, and (where one is named) its user's identity
/// taken on the way.
#[derive(Debug)]
pub struct Shedding {
    keep: CapSet,
    /// uid and gid (no supplementary groups).
    user: Option<(u32, u32)>,
    /// The child's directory, entered again as the user: it must be able
    /// to (the spawn entered it with the gateway's rights).
    cwd: Option<CString>,
}

impl Shedding {
    /// Sheds all but `keep`, taking on `user`'s identity (when the process
    /// may: as root, or as that user already) in `cwd`. Fails where the
    /// calling process does not hold what is to be kept.
    pub fn new(
        keep: CapSet,
        user: Option<&crate::sys::SystemUser>,
        cwd: Option<&Path>,
    ) -> io::Result<Shedding> {
        let missing = keep.without(CapSet::held()?);
        if !missing.is_empty() {
            return Err(io::Error::other(format!(
                "cannot keep {}: the gateway does not hold it",
                missing.names().join(", ")
            )));
        }
        let cwd = match cwd.filter(|_| user.is_some()) {
            Some(cwd) => {
                use std::os::unix::ffi::OsStrExt;
                Some(CString::new(cwd.as_os_str().as_bytes()).map_err(io::Error::other)?)
            }
            None => None,
        };
        Ok(Shedding {
            keep,
            user: user.map(|u| (u.uid, u.gid)),
            cwd,
        })
    }

    /// Has `command`'s child shed them before it runs its program (before
    /// anything registered after this; a box's rules come after).
    pub fn on_child(self, command: &mut tokio::process::Command) {
        // SAFETY: `shed` is async-signal-safe (see the module's doc).
        unsafe {
            command.pre_exec(move || self.shed());
        }
    }

    /// Does it, to the calling (single-threaded, freshly forked) process.
    pub fn shed(&self) -> io::Result<()> {
        let fail = || Err(io::Error::last_os_error());
        // SAFETY: prctl and raw system calls with integer arguments, and
        // pointers to buffers that live on this stack or in `self`.
        unsafe {
            // 1. The bounding set, while CAP_SETPCAP is still ours.
            for cap in 0..64u32 {
                if self.keep.has(cap) {
                    continue;
                }
                let held = libc::prctl(libc::PR_CAPBSET_READ, cap as libc::c_ulong, 0, 0, 0);
                if held < 0 {
                    // Beyond the kernel's last capability.
                    break;
                }
                if held == 1
                    && libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) != 0
                {
                    if errno() == libc::EPERM {
                        // Without CAP_SETPCAP (a gateway that is not root)
                        // it stays; with no capability in any other set and
                        // no_new_privs, nothing can be gained through it.
                        break;
                    }
                    return fail();
                }
            }
            // 2. The user, the kept capabilities carried over the switch.
            if let Some((uid, gid)) = self.user {
                let keep_over = libc::c_ulong::from(!self.keep.is_empty());
                if libc::prctl(libc::PR_SET_KEEPCAPS, keep_over, 0, 0, 0) != 0 {
                    return fail();
                }
                // As std does: without CAP_SETGID there are none to drop.
                if libc::syscall(libc::SYS_setgroups, 0usize, std::ptr::null::<libc::gid_t>()) != 0
                    && errno() != libc::EPERM
                {
                    return fail();
                }
                if libc::syscall(libc::SYS_setresgid, gid, gid, gid) != 0
                    || libc::syscall(libc::SYS_setresuid, uid, uid, uid) != 0
                {
                    return fail();
                }
                if let Some(cwd) = &self.cwd {
                    if libc::chdir(cwd.as_ptr()) != 0 {
                        return fail();
                    }
                }
            }
            // 3. Permitted, effective and inheritable: the kept ones.
            let (low, high) = (self.keep.bits() as u32, (self.keep.bits() >> 32) as u32);
            let data = [
                Data {
                    effective: low,
                    permitted: low,
                    inheritable: low,
                },
                Data {
                    effective: high,
                    permitted: high,
                    inheritable: high,
                },
            ];
            let header = Header {
                version: VERSION_3,
                pid: 0,
            };
            if libc::syscall(libc::SYS_capset, &header as *const Header, data.as_ptr()) != 0 {
                return fail();
            }
            // 4. Ambient: exactly the kept ones (a kernel before 4.3 has
            // no ambient set: EINVAL, and nothing to clear).
            if libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
                && errno() != libc::EINVAL
            {
                return fail();
            }
            for cap in 0..64u32 {
                if self.keep.has(cap)
                    && libc::prctl(
                        libc::PR_CAP_AMBIENT,
                        libc::PR_CAP_AMBIENT_RAISE as libc::c_ulong,
                        cap as libc::c_ulong,
                        0,
                        0,
                    ) != 0
                {
                    return fail();
                }
            }
            // 5. Nothing gained later.
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return fail();
            }
        }
        Ok(())
    }
}

fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A child run as root, with or without a user switch, has nothing but
    /// what is kept in any set, and no_new_privs (where the test is root).
    #[test]
    fn a_child_keeps_only_what_it_is_told_to() {
        if !crate::sys::running_as_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let run = |keep: CapSet, user: Option<&crate::sys::SystemUser>| {
            let shedding = Shedding::new(keep, user, Some(Path::new("/"))).unwrap();
            let mut command = std::process::Command::new("/bin/cat");
            command.arg("/proc/self/status");
            // SAFETY: as in `on_child`.
            unsafe {
                std::os::unix::process::CommandExt::pre_exec(&mut command, move || shedding.shed());
            }
            let out = command.output().unwrap();
            assert!(out.status.success(), "{out:?}");
            String::from_utf8(out.stdout).unwrap()
        };
        let status = run(CapSet::EMPTY, None);
        for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
            assert!(
                CapSet::of_process(&status, set).unwrap().is_empty(),
                "{set}: {status}"
            );
        }
        assert!(status.contains("NoNewPrivs:\t1"), "{status}");
        let bind = CapSet::parse(&["CAP_NET_BIND_SERVICE".into()]).unwrap();
        let status = run(bind, None);
        for set in ["CapPrm", "CapEff", "CapBnd"] {
            assert_eq!(CapSet::of_process(&status, set), Some(bind), "{set}");
        }
        if let Some(nobody) = crate::sys::nobody_if_root() {
            let status = run(bind, Some(&nobody));
            assert!(status.contains(&format!("Uid:\t{0}\t{0}", nobody.uid)));
            for set in ["CapPrm", "CapEff", "CapBnd", "CapAmb"] {
                assert_eq!(CapSet::of_process(&status, set), Some(bind), "{set}");
            }
            let status = run(CapSet::EMPTY, Some(&nobody));
            assert!(CapSet::of_process(&status, "CapBnd").unwrap().is_empty());
        }
    }
}
