//! What the gateway asks of the operating system: finding an executable the
//! way a shell would (and whether a user can run it, interpreter included),
//! looking up the user an agent runs as, whether we are root, keeping other
//! processes out of ours, and how the allocator returns memory; where the
//! system keeps its programs ([`SYSTEM`], [`KERNEL_VIEWS`], a program's
//! [`installation_of`]); Linux capabilities ([`capabilities`]).

pub mod capabilities;

use std::path::{Path, PathBuf};

/// The system's own directories: its programs, libraries and settings
/// (every box may read and run them).
pub const SYSTEM: &[&str] = &[
    "/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin", "/etc", "/opt",
];
/// What programs read of themselves and of the machine (`/proc/self`, the
/// CPU count, cgroup limits); another box's processes stay out of reach
/// there too (Landlock forbids tracing them, and so reading their memory
/// and environment).
pub const KERNEL_VIEWS: &[&str] = &["/proc", "/sys"];
/// Where a program is installed, as far as its path tells: its directory
/// and, when that is a `bin`, the prefix above it (`/opt/x/bin/x` needs
/// `/opt/x/lib`; `node_modules/.bin/x` needs `node_modules`). A symlinked
/// program (`node_modules/.bin`, a virtualenv's `python`) counts at both
/// ends: it is named here as given and as it resolves.
pub fn installation_of(program: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut add = |program: &Path| {
        let Some(dir) = program.parent().filter(|d| d != &Path::new("/")) else {
            return;
        };
        let bin = dir.file_name().is_some_and(|n| n == "bin" || n == ".bin");
        match dir.parent().filter(|p| bin && p != &Path::new("/")) {
            Some(prefix) => found.push(prefix.to_path_buf()),
            None => found.push(dir.to_path_buf()),
        }
    };
    add(program);
    if let Ok(real) = std::fs::canonicalize(program) {
        if real != program {
            add(&real);
        }
    }
    found
}

/// Finds the executable a command names, the way a shell would.
pub fn resolve_command(command: &str, path_override: Option<&str>) -> Result<PathBuf, String> {
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
    candidates(command, path_override)
        .next()
        .ok_or_else(|| format!("{command} not found in PATH"))
}

/// Whether `p` is a file with an execute bit (as the gateway sees it).
fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// The executables named `command` in `path` (else the gateway's `PATH`),
/// in its order.
fn candidates(command: &str, path: Option<&str>) -> impl Iterator<Item = PathBuf> {
    let path = path
        .map(str::to_owned)
        .or_else(|| std::env::var("PATH").ok())
        .unwrap_or_default();
    let command = command.to_owned();
    std::env::split_paths(&path)
        .map(move |dir| dir.join(&command))
        .filter(|p| is_executable(p))
        .collect::<Vec<_>>()
        .into_iter()
}

/// Whether `user` (its uid and primary group, as agents run: without
/// supplementary groups) may run `program`: search permission on every
/// directory the kernel passes through on the way (symlinks followed, each
/// hop's own directories included), execute permission on the file. The
/// reason when not.
pub fn executable_by(program: &Path, user: &SystemUser) -> Result<(), String> {
    let real = walk_as(program, user)?;
    let meta = std::fs::metadata(&real).map_err(|e| format!("{}: {e}", real.display()))?;
    if permits(&meta, user, 0o1) {
        Ok(())
    } else {
        Err(format!("{} is not executable by {user}", program.display()))
    }
}

/// Whether the `bits` (`0o1` execute or search, `0o4` read) of `meta`'s
/// mode that apply to `user` (owner, group, others) are set; root may read
/// and search anything, and run any file with an execute bit.
fn permits(meta: &std::fs::Metadata, user: &SystemUser, bits: u32) -> bool {
    use std::os::unix::fs::MetadataExt;
    let mode = meta.mode();
    if user.uid == 0 {
        return bits != 0o1 || meta.is_dir() || mode & 0o111 != 0;
    }
    let shift = if meta.uid() == user.uid {
        6
    } else if meta.gid() == user.gid {
        3
    } else {
        0
    };
    mode & (bits << shift) != 0
}

/// Most symlinks followed on one path, as Linux allows.
const MAX_SYMLINKS: usize = 40;

/// Resolves `path` the way the kernel does for `user`: component by
/// component, following symlinks wherever they are, and failing at the
/// first directory `user` may not search. Where it really leads.
fn walk_as(path: &Path, user: &SystemUser) -> Result<PathBuf, String> {
    use std::collections::VecDeque;
    use std::path::Component;
    let start = std::path::absolute(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut pending: VecDeque<std::ffi::OsString> = VecDeque::new();
    let push_front = |pending: &mut VecDeque<_>, p: &Path| {
        for component in p.components().rev() {
            match component {
                Component::Normal(name) => pending.push_front(name.to_owned()),
                Component::ParentDir => pending.push_front("..".into()),
                Component::RootDir | Component::Prefix(_) | Component::CurDir => {}
            }
        }
    };
    push_front(&mut pending, &start);
    let mut current = PathBuf::from("/");
    let mut links = 0;
    while let Some(name) = pending.pop_front() {
        let meta =
            std::fs::metadata(&current).map_err(|e| format!("{}: {e}", current.display()))?;
        if !meta.is_dir() {
            return Err(format!("{} is not a directory", current.display()));
        }
        if !permits(&meta, user, 0o1) {
            return Err(format!(
                "{} cannot be searched by {user}",
                current.display()
            ));
        }
        if name == ".." {
            current.pop();
            continue;
        }
        let next = current.join(&name);
        let is_link = std::fs::symlink_metadata(&next)
            .map_err(|e| format!("{}: {e}", next.display()))?
            .file_type()
            .is_symlink();
        if !is_link {
            current = next;
            continue;
        }
        links += 1;
        if links > MAX_SYMLINKS {
            return Err(format!(
                "{}: too many levels of symbolic links",
                path.display()
            ));
        }
        let target = std::fs::read_link(&next).map_err(|e| format!("{}: {e}", next.display()))?;
        if target.is_absolute() {
            current = PathBuf::from("/");
        }
        push_front(&mut pending, &target);
    }
    Ok(current)
}

/// Whether `program` can be started, by `user` when there is one (else by
/// the gateway's own user, whose rights are not checked): the program
/// itself, its symlinks followed, and, for a script, its `#!`
/// interpreter the same way (`#!/usr/bin/env NAME` looks NAME up in
/// `path`, the agent's `PATH`); the script must also be readable by the
/// user, since the interpreter opens it. The reason names the path that
/// cannot be reached.
pub fn runnable_by(
    program: &Path,
    user: Option<&SystemUser>,
    path: Option<&str>,
) -> Result<(), String> {
    runnable(program, user, path, 0)
}

/// Linux follows at most this many `#!` interpreters that are scripts
/// themselves (`BINPRM_MAX_RECURSION`).
const MAX_INTERPRETERS: usize = 4;

fn runnable(
    program: &Path,
    user: Option<&SystemUser>,
    path: Option<&str>,
    depth: usize,
) -> Result<(), String> {
    if depth > MAX_INTERPRETERS {
        return Err(format!(
            "{}: too many levels of #! interpreters",
            program.display()
        ));
    }
    let real = std::fs::canonicalize(program).map_err(|e| format!("{}: {e}", program.display()))?;
    match user {
        Some(user) => executable_by(program, user)?,
        None => {
            use std::os::unix::fs::PermissionsExt;
            let meta = std::fs::metadata(&real).map_err(|e| format!("{}: {e}", real.display()))?;
            if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
                return Err(format!("{} is not an executable file", real.display()));
            }
        }
    }
    let Some(line) = shebang(&real) else {
        return Ok(());
    };
    if let Some(user) = user {
        readable_by(&real, user)?;
    }
    let script = program.display();
    let (interpreter, argument) = match line.split_once([' ', '\t']) {
        Some((interpreter, argument)) => (interpreter, argument.trim()),
        None => (line.as_str(), ""),
    };
    if interpreter.is_empty() {
        return Err(format!("{script}: its #! line names no interpreter"));
    }
    let interpreter = Path::new(interpreter);
    runnable(interpreter, user, path, depth + 1)
        .map_err(|why| format!("the interpreter of {script}: {why}"))?;
    if interpreter.file_name().is_some_and(|name| name == "env") {
        // `#!/usr/bin/env NAME` (or `env -S NAME ARGS`): NAME is looked up
        // in the PATH the agent gets.
        let name = argument
            .split_whitespace()
            .find(|word| !word.starts_with('-') && !word.contains('='))
            .unwrap_or_default();
        if name.is_empty() {
            return Ok(());
        }
        // As env does (execvp): the first one the user can run, past those
        // it cannot; else what stopped the first.
        let how = format!(
            "the interpreter of {script} ({} {name})",
            interpreter.display()
        );
        let mut first_refusal = None;
        for candidate in candidates(name, path) {
            match runnable(&candidate, user, path, depth + 1) {
                Ok(()) => return Ok(()),
                Err(why) => {
                    first_refusal.get_or_insert(why);
                }
            }
        }
        return Err(match first_refusal {
            Some(why) => format!("{how}: {why}"),
            None => format!("{how}: {name} not found in PATH"),
        });
    }
    Ok(())
}

/// A script's `#!` line (without the `#!` and the line end), as the kernel
/// reads it: at most its first 256 bytes. `None` for anything else, or
/// when the file cannot be read.
fn shebang(program: &Path) -> Option<String> {
    use std::io::Read;
    let mut head = Vec::with_capacity(256);
    std::fs::File::open(program)
        .ok()?
        .take(256)
        .read_to_end(&mut head)
        .ok()?;
    let rest = head.strip_prefix(b"#!")?;
    let line = rest.split(|&b| b == b'\n').next().unwrap_or_default();
    Some(String::from_utf8_lossy(line).trim().to_owned())
}

/// Whether `user` (as in [`executable_by`]) may read `file`.
fn readable_by(file: &Path, user: &SystemUser) -> Result<(), String> {
    let meta = std::fs::metadata(file).map_err(|e| format!("{}: {e}", file.display()))?;
    if permits(&meta, user, 0o4) {
        Ok(())
    } else {
        Err(format!(
            "{} is a script that {user} cannot read",
            file.display()
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

impl std::fmt::Display for SystemUser {
    /// `user NAME (uid N)`, as errors name it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "user {} (uid {})", self.name, self.uid)
    }
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

/// Opens the directory `dir` (`O_PATH`, close-on-exec): an absolute path
/// stored resolved (a conversation's cwd), walked one component at a time
/// without following any symlink. One found on the way or at its end was
/// swapped in since the path was resolved, and following it could lead
/// anywhere (another user's workspace): an error that says so, rather than
/// what it leads to.
pub fn open_dir_without_links(dir: &Path) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::AsFd;
    use std::path::Component;
    check_resolved(dir)?;
    let mut fd = open_path_at(None, Path::new("/"))?;
    for part in dir.components() {
        let Component::Normal(name) = part else {
            continue;
        };
        // O_PATH with O_NOFOLLOW opens a symlink itself.
        let next = open_path_at(Some(fd.as_fd()), Path::new(name))?;
        let file = std::fs::File::from(next);
        let kind = file.metadata()?.file_type();
        if kind.is_symlink() {
            return Err(swapped_for_a_link(dir));
        }
        if !kind.is_dir() {
            return Err(std::io::Error::from_raw_os_error(libc::ENOTDIR));
        }
        fd = file.into();
    }
    Ok(fd)
}

/// That `dir` is absolute, with no `..` in it (a path stored resolved).
pub fn check_resolved(dir: &Path) -> std::io::Result<()> {
    use std::path::Component;
    if !dir.is_absolute() || dir.components().any(|c| c == Component::ParentDir) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{} is not an absolute, resolved path", dir.display()),
        ));
    }
    Ok(())
}

/// What opening a resolved directory answers when a symlink is there now.
pub fn swapped_for_a_link(dir: &Path) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        format!(
            "{} is no longer the directory it was (a symlink is on its path now)",
            dir.display()
        ),
    )
}

/// `openat(at, path, O_PATH | O_NOFOLLOW | O_CLOEXEC)`.
fn open_path_at(
    at: Option<std::os::fd::BorrowedFd<'_>>,
    path: &Path,
) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::{AsRawFd, FromRawFd};
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    let dir = at.map_or(libc::AT_FDCWD, |fd| fd.as_raw_fd());
    // SAFETY: a valid (or AT_FDCWD) descriptor and a NUL-terminated path.
    let fd = unsafe {
        libc::openat(
            dir,
            c.as_ptr(),
            libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor just opened, owned by nobody else.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// Whether the gateway itself runs as root.
pub fn running_as_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Makes this process non-dumpable: a process of the same user can then
/// neither read its memory and environment (`/proc/<pid>/mem`, `environ`)
/// nor attach a debugger to it, and it leaves no core dump. Its `/proc`
/// entries belong to root from then on (it still reads its own).
pub fn forbid_inspection() -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    // SAFETY: prctl with integer arguments only.
    unsafe {
        if libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, PermissionsExt};

    #[test]
    fn a_programs_installation_is_its_directory_or_the_prefix_of_its_bin() {
        assert_eq!(
            installation_of(Path::new("/nonexistent/x/bin/agent")),
            [PathBuf::from("/nonexistent/x")]
        );
        assert_eq!(
            installation_of(Path::new("/nonexistent/app/node_modules/.bin/agent")),
            [PathBuf::from("/nonexistent/app/node_modules")]
        );
        assert_eq!(
            installation_of(Path::new("/nonexistent/tools/agent.sh")),
            [PathBuf::from("/nonexistent/tools")]
        );
        // Never the whole file system.
        assert!(installation_of(Path::new("/bin/sh"))
            .iter()
            .all(|p| p != Path::new("/")));
    }

    fn mode(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    fn script(path: &Path, shebang: &str) {
        std::fs::write(path, format!("#!{shebang}\nexit 0\n")).unwrap();
        mode(path, 0o755);
    }

    #[test]
    fn a_scripts_interpreter_is_read_from_its_first_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        std::fs::write(&path, "#! /usr/bin/env  -S python3 -u \r\nprint()\n").unwrap();
        assert_eq!(
            shebang(&path).as_deref(),
            Some("/usr/bin/env  -S python3 -u")
        );
        std::fs::write(&path, "\x7fELF…").unwrap();
        assert_eq!(shebang(&path), None);
    }

    #[test]
    fn without_a_user_a_missing_interpreter_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent");
        script(&path, "/nonexistent/python3");
        let why = runnable_by(&path, None, None).unwrap_err();
        assert!(why.starts_with("the interpreter of"), "{why}");
        assert!(why.contains("/nonexistent/python3"), "{why}");
        script(&path, "/usr/bin/env no-such-interpreter-xyz");
        let why = runnable_by(&path, None, Some("/usr/bin:/bin")).unwrap_err();
        assert!(
            why.contains("no-such-interpreter-xyz not found in PATH"),
            "{why}"
        );
        script(&path, "/bin/sh");
        runnable_by(&path, None, None).unwrap();
    }

    /// Every hop of a chain of symlinks is walked through, not only where
    /// it ends (only where the gateway is root and the system has `nobody`).
    #[test]
    fn the_directories_of_every_symlink_on_the_way_must_be_searchable() {
        let Some(nobody) = nobody_if_root() else {
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        mode(&root, 0o755);
        let (open, closed) = (root.join("open"), root.join("closed"));
        std::fs::create_dir(&open).unwrap();
        std::fs::create_dir(&closed).unwrap();
        mode(&closed, 0o700);
        // open/python -> closed/python3 -> /bin/sh: where it ends is fine.
        symlink("/bin/sh", closed.join("python3")).unwrap();
        symlink(closed.join("python3"), open.join("python")).unwrap();
        let why = executable_by(&open.join("python"), &nobody).unwrap_err();
        assert_eq!(
            why,
            format!(
                "{} cannot be searched by user nobody (uid {})",
                closed.display(),
                nobody.uid
            )
        );
        executable_by(Path::new("/bin/sh"), &nobody).unwrap();
        // A script is read by its interpreter: nobody must be able to.
        let private = open.join("private");
        script(&private, "/bin/sh");
        mode(&private, 0o711);
        let why = runnable_by(&private, Some(&nobody), None).unwrap_err();
        assert!(why.contains("cannot read"), "{why}");
    }
}
