//! What the gateway asks of the operating system: finding an executable the
//! way a shell would, looking up the user an agent runs as, whether we are
//! root, and how the allocator returns memory.

use std::path::{Path, PathBuf};

/// Finds the executable a command names, the way a shell would.
pub fn resolve_command(command: &str, path_override: Option<&str>) -> Result<PathBuf, String> {
    use std::os::unix::fs::PermissionsExt;
    let is_executable = |p: &Path| {
        std::fs::metadata(p)
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    };
    if command.contains('/') {
        let p = PathBuf::from(command);
        return if is_executable(&p) {
            // Absolute, so that the agent's own cwd does not change its meaning;
            // symlinks are kept (a venv's python must stay the venv's).
            Ok(std::path::absolute(&p).unwrap_or(p))
        } else if p.exists() {
            Err(format!("{command} is not an executable file"))
        } else {
            Err(format!("{command} does not exist"))
        };
    }
    let path = path_override
        .map(str::to_owned)
        .or_else(|| std::env::var("PATH").ok())
        .unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(command))
        .find(|p| is_executable(p))
        .ok_or_else(|| format!("{command} not found in PATH"))
}

/// Whether `user` (its uid and primary group, as agents run: without
/// supplementary groups) may run `program`: search permission on every
/// directory on the way, execute permission on the file. The reason when
/// not.
pub fn executable_by(program: &Path, user: &SystemUser) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let allowed = |meta: &std::fs::Metadata| {
        let mode = meta.mode();
        if user.uid == 0 {
            // root may search any directory and run any file with an x bit.
            return meta.is_dir() || mode & 0o111 != 0;
        }
        let bit = if meta.uid() == user.uid {
            0o100
        } else if meta.gid() == user.gid {
            0o010
        } else {
            0o001
        };
        mode & bit != 0
    };
    let mut dirs: Vec<&Path> = program.ancestors().skip(1).collect();
    dirs.reverse();
    for dir in dirs.into_iter().filter(|d| !d.as_os_str().is_empty()) {
        let meta = std::fs::metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        if !allowed(&meta) {
            return Err(format!(
                "{} cannot be searched by user {} (uid {})",
                dir.display(),
                user.name,
                user.uid
            ));
        }
    }
    let meta = std::fs::metadata(program).map_err(|e| format!("{}: {e}", program.display()))?;
    if allowed(&meta) {
        Ok(())
    } else {
        Err(format!(
            "{} is not executable by user {} (uid {})",
            program.display(),
            user.name,
            user.uid
        ))
    }
}

/// A system account agents can run as.
#[derive(Debug, Clone)]
pub struct SystemUser {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: String,
}

/// Looks a user up in the system's user database.
pub fn lookup_user(name: &str) -> Result<SystemUser, String> {
    let c_name = std::ffi::CString::new(name).map_err(|_| format!("invalid user name {name:?}"))?;
    let mut buf = vec![0u8; 16 * 1024];
    // SAFETY: getpwnam_r writes only into `pwd` and `buf` (whose length we
    // pass) and sets `result` to null or to `&pwd`.
    unsafe {
        let mut pwd: libc::passwd = std::mem::zeroed();
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        let rc = libc::getpwnam_r(
            c_name.as_ptr(),
            &mut pwd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut result,
        );
        if rc != 0 || result.is_null() {
            return Err(format!("no system user named {name:?}"));
        }
        let home = if pwd.pw_dir.is_null() {
            "/".to_owned()
        } else {
            std::ffi::CStr::from_ptr(pwd.pw_dir)
                .to_string_lossy()
                .into_owned()
        };
        Ok(SystemUser {
            name: name.to_owned(),
            uid: pwd.pw_uid,
            gid: pwd.pw_gid,
            home,
        })
    }
}

/// Whether the gateway itself runs as root.
pub fn running_as_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// glibc raises its mmap threshold each time a large block is freed, up to
/// 32 MiB, after which big blocks (a long agent line, its JSON) come from the
/// heap and their memory is kept after use. A fixed threshold keeps every
/// block over 256 KiB in its own mapping, returned to the system when freed.
pub fn return_large_allocations_to_the_system() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; called before the
    // gateway starts its work.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 * 1024);
    }
}

/// The memory this process may use, in bytes: the machine's (`MemTotal` in
/// `/proc/meminfo`), or its cgroup's limit (`memory.max`, cgroup v2) where
/// that is lower; `None` where neither can be read.
pub fn usable_memory_bytes() -> Option<u64> {
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|kib| kib * 1024)?;
    let limit = std::fs::read_to_string("/sys/fs/cgroup/memory.max")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok());
    Some(limit.map_or(total, |limit| limit.min(total)))
}

/// How many CPUs this process may use (its affinity and cgroup quota
/// count); 1 where that cannot be known.
pub fn usable_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// Gives the calling thread, and only it, `user`'s rights on files: its
/// file system uid and gid become the user's, its supplementary groups none
/// (as the agent's own process has them), and with a uid other than 0 the
/// kernel drops the thread's power to override file permissions. Meant for
/// a thread that ends when its work is done (see `workspace::as_user`).
#[cfg(target_os = "linux")]
pub fn become_for_files(user: &SystemUser) -> std::io::Result<()> {
    // SAFETY: raw syscalls, so they change the calling thread's credentials
    // only (glibc's wrappers of setgroups would change every thread's); the
    // null list with a length of 0 is what setgroups expects for "none".
    unsafe {
        if libc::syscall(libc::SYS_setgroups, 0usize, std::ptr::null::<libc::gid_t>()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        libc::syscall(libc::SYS_setfsgid, user.gid);
        libc::syscall(libc::SYS_setfsuid, user.uid);
        // Both answer the value before the call: asking again tells whether
        // the change took.
        let gid = libc::syscall(libc::SYS_setfsgid, user.gid) as u32;
        let uid = libc::syscall(libc::SYS_setfsuid, user.uid) as u32;
        if (uid, gid) != (user.uid, user.gid) {
            return Err(std::io::Error::other(format!(
                "cannot take the rights of user {:?}",
                user.name
            )));
        }
    }
    Ok(())
}

#[cfg(not(target_os = "linux"))]
pub fn become_for_files(user: &SystemUser) -> std::io::Result<()> {
    Err(std::io::Error::other(format!(
        "acting as user {:?} on files needs Linux",
        user.name
    )))
}

/// For tests of running as another user: `nobody`, where the process is
/// root and the system has such a user (else the test says it is skipped).
#[cfg(test)]
pub fn nobody_if_root() -> Option<SystemUser> {
    let nobody = lookup_user("nobody").ok().filter(|_| running_as_root());
    if nobody.is_none() {
        eprintln!("skipped: needs root and a user named nobody");
    }
    nobody
}
