//! Reaching files beneath one directory without races.
//!
//! Checking a path and then opening it by name lets a symlink swapped in
//! between lead anywhere. Here every path is resolved relative to a
//! descriptor of the root, by the kernel (`openat2(2)` with
//! `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS`) or, where the kernel has no
//! `openat2` (before Linux 5.6, or a seccomp filter that refuses it), by a
//! walk of one component at a time (`O_NOFOLLOW`, every symlink read and
//! resolved here, never above the root). Whatever is then read, made or
//! renamed goes through the descriptors so found.
//!
//! The last component of a path is never followed by the kernel: a symlink
//! there is read and its target resolved beneath the root again, so that a
//! write replaces the file the link leads to (as writing through a link
//! does) while the rename that does it stays in a directory beneath the root.
//! An absolute symlink is followed when it points beneath the root.

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Component, Path, PathBuf};
use std::sync::OnceLock;

/// How many symlinks one path may go through (the kernel's own limit).
const MAX_LINKS: usize = 40;
/// How often `openat2` is asked again when a rename elsewhere made it give
/// up (`EAGAIN`) before the walk does it.
const KERNEL_RETRIES: usize = 8;

/// How paths are resolved beneath the root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolver {
    /// `openat2(2)` with `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS`; what it
    /// opened is named through `/proc/self/fd`.
    Kernel,
    /// One component at a time with `O_NOFOLLOW`, symlinks resolved here.
    Walk,
}

impl Resolver {
    /// Every resolver this kernel has: the kernel's (where it has openat2)
    /// and the walk, forced (tests run each).
    #[cfg(test)]
    pub(crate) fn all() -> Vec<Resolver> {
        let mut all = vec![Resolver::detect(), Resolver::Walk];
        all.dedup();
        all
    }

    /// The kernel's where it has `openat2` and `/proc` names what it opens,
    /// else the walk (probed once).
    pub fn detect() -> Resolver {
        static DETECTED: OnceLock<Resolver> = OnceLock::new();
        *DETECTED.get_or_init(|| {
            let probe = openat2(None, Path::new("/"), libc::O_PATH | libc::O_DIRECTORY, 0)
                .and_then(|fd| fd_path(fd.as_fd()));
            match probe {
                Ok(path) if path == Path::new("/") => Resolver::Kernel,
                outcome => {
                    tracing::warn!(
                        ?outcome,
                        "openat2 is not available: files are reached one path component at a time"
                    );
                    Resolver::Walk
                }
            }
        })
    }
}

/// Why a path cannot be reached.
#[derive(Debug)]
pub enum Error {
    /// It leads outside the root (`..` above it, a symlink out of it, an
    /// absolute path elsewhere).
    Outside,
    /// It names a directory where a file is wanted.
    Directory,
    /// It is not a regular file (a FIFO, a socket, a device): its kind.
    NotRegular(&'static str),
    /// It kept changing while it was opened (swapped between a symlink and
    /// a file, again and again).
    Unstable,
    Io(io::Error),
}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Error {
        match e.raw_os_error() {
            Some(libc::EXDEV) => Error::Outside,
            _ => Error::Io(e),
        }
    }
}

/// A directory everything is reached beneath.
#[derive(Debug)]
pub struct Root {
    fd: OwnedFd,
    path: PathBuf,
    resolver: Resolver,
}

/// Where a path leads: the directory that holds it (open, beneath the
/// root), the directories missing in between (not made yet) and its name.
#[derive(Debug)]
pub struct Destination {
    dir: OwnedFd,
    dir_path: PathBuf,
    missing: Vec<OsString>,
    name: OsString,
}

impl Root {
    /// Opens `dir` (absolute, with no symlink in it: the conversation's cwd
    /// is stored resolved, so a symlink there now is a swap) as the root.
    pub fn open(dir: &Path, resolver: Resolver) -> io::Result<Root> {
        crate::sys::check_resolved(dir)?;
        let fd = match resolver {
            Resolver::Kernel => openat2(
                None,
                dir,
                libc::O_PATH | libc::O_DIRECTORY,
                libc::RESOLVE_NO_SYMLINKS,
            )
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ELOOP) => crate::sys::swapped_for_a_link(dir),
                _ => e,
            }),
            Resolver::Walk => crate::sys::open_dir_without_links(dir),
        }?;
        Ok(Root {
            fd,
            path: dir.to_path_buf(),
            resolver,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// An absolute `path` as a path relative to the root, when it starts
    /// with the root (what follows, `..` included, is the kernel's to
    /// resolve beneath it).
    pub fn relative(&self, path: &Path) -> Result<PathBuf, Error> {
        path.strip_prefix(&self.path)
            .map(Path::to_path_buf)
            .map_err(|_| Error::Outside)
    }

    /// Where `rel` leads: directories resolved beneath the root, a symlink
    /// in the last component followed while it stays beneath.
    pub fn locate(&self, rel: &Path) -> Result<Destination, Error> {
        let mut rel = rel.to_path_buf();
        for _ in 0..=MAX_LINKS {
            let Some(Component::Normal(name)) = rel.components().next_back() else {
                return Err(Error::Directory);
            };
            let name = name.to_owned();
            let parent = rel.parent().unwrap_or(Path::new("")).to_path_buf();
            let (dir, dir_path, missing) = self.open_dir(&parent)?;
            let destination = Destination {
                dir,
                dir_path,
                missing,
                name,
            };
            if !destination.missing.is_empty() {
                return Ok(destination);
            }
            let fd = match destination.probe() {
                Ok(Some(fd)) => fd,
                Ok(None) => return Ok(destination),
                Err(e) => return Err(e.into()),
            };
            if file_type(fd.as_fd())? != libc::S_IFLNK {
                return Ok(destination);
            }
            let target = PathBuf::from(OsString::from_vec(read_link(fd.as_fd())?));
            rel = if target.is_absolute() {
                self.relative(&target)?
            } else {
                parent.join(target)
            };
        }
        Err(Error::Io(io::Error::from_raw_os_error(libc::ELOOP)))
    }

    /// The directory `rel` names, opened beneath the root, its real path,
    /// and the trailing components that do not exist yet.
    fn open_dir(&self, rel: &Path) -> Result<(OwnedFd, PathBuf, Vec<OsString>), Error> {
        if self.resolver == Resolver::Kernel {
            match self.open_dir_kernel(rel) {
                // An absolute symlink (which may point beneath the root) or
                // an escape: the walk says which.
                Err(Error::Outside) => {}
                Err(Error::Io(e)) if e.raw_os_error() == Some(libc::EAGAIN) => {}
                other => return other,
            }
        }
        self.open_dir_walking(rel)
    }

    fn open_dir_kernel(&self, rel: &Path) -> Result<(OwnedFd, PathBuf, Vec<OsString>), Error> {
        let mut existing = rel.to_path_buf();
        let mut missing: Vec<OsString> = Vec::new();
        loop {
            match self.openat2_retrying(&existing) {
                Ok(fd) => {
                    let path = fd_path(fd.as_fd())?;
                    // The kernel promises this; said again, cheaply.
                    if !path.starts_with(&self.path) {
                        return Err(Error::Outside);
                    }
                    missing.reverse();
                    return Ok((fd, path, only_names(missing)?));
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    match existing.components().next_back() {
                        Some(part) => missing.push(part.as_os_str().to_owned()),
                        None => return Err(Error::Io(e)),
                    }
                    existing.pop();
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    fn openat2_retrying(&self, rel: &Path) -> io::Result<OwnedFd> {
        let rel = if rel.as_os_str().is_empty() {
            Path::new(".")
        } else {
            rel
        };
        let mut tries = 0;
        loop {
            match openat2(
                Some(self.fd.as_fd()),
                rel,
                libc::O_PATH | libc::O_DIRECTORY,
                libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS,
            ) {
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) && tries < KERNEL_RETRIES => {
                    tries += 1;
                }
                other => return other,
            }
        }
    }

    /// The walk: each component opened with `O_NOFOLLOW` relative to the
    /// one before, symlinks read and their targets walked in turn, `..`
    /// taken back along the directories walked (never above the root).
    fn open_dir_walking(&self, rel: &Path) -> Result<(OwnedFd, PathBuf, Vec<OsString>), Error> {
        let mut walked: Vec<(OwnedFd, OsString)> = Vec::new();
        let mut queue: std::collections::VecDeque<OsString> =
            rel.components().map(|c| c.as_os_str().to_owned()).collect();
        let mut links = 0;
        while let Some(part) = queue.pop_front() {
            match Path::new(&part).components().next() {
                Some(Component::CurDir) | None => continue,
                Some(Component::ParentDir) => {
                    if walked.pop().is_none() {
                        return Err(Error::Outside);
                    }
                    continue;
                }
                Some(Component::RootDir | Component::Prefix(_)) => return Err(Error::Outside),
                Some(Component::Normal(_)) => {}
            }
            let at = walked.last().map_or(self.fd.as_fd(), |(fd, _)| fd.as_fd());
            let fd = match open_at(Some(at), Path::new(&part), libc::O_PATH | libc::O_NOFOLLOW) {
                Ok(fd) => fd,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    queue.push_front(part);
                    return self.walked(walked, queue.into_iter().collect());
                }
                Err(e) => return Err(e.into()),
            };
            match file_type(fd.as_fd())? {
                libc::S_IFDIR => walked.push((fd, part)),
                libc::S_IFLNK => {
                    links += 1;
                    if links > MAX_LINKS {
                        return Err(Error::Io(io::Error::from_raw_os_error(libc::ELOOP)));
                    }
                    let target = PathBuf::from(OsString::from_vec(read_link(fd.as_fd())?));
                    if target.is_absolute() {
                        walked.clear();
                    }
                    let target = if target.is_absolute() {
                        self.relative(&target)?
                    } else {
                        target
                    };
                    for part in target.components().rev() {
                        queue.push_front(part.as_os_str().to_owned());
                    }
                }
                _ => return Err(Error::Io(io::Error::from_raw_os_error(libc::ENOTDIR))),
            }
        }
        self.walked(walked, Vec::new())
    }

    fn walked(
        &self,
        mut walked: Vec<(OwnedFd, OsString)>,
        missing: Vec<OsString>,
    ) -> Result<(OwnedFd, PathBuf, Vec<OsString>), Error> {
        let mut path = self.path.clone();
        path.extend(walked.iter().map(|(_, name)| name));
        let fd = match walked.pop() {
            Some((fd, _)) => fd,
            None => self.fd.try_clone()?,
        };
        // A directory moved out of the root while it was walked: what is
        // beneath it now is not beneath the root (the kernel checks as much).
        if !self.holds(fd.as_fd())? {
            return Err(Error::Outside);
        }
        Ok((fd, path, only_names(missing)?))
    }

    /// Whether the directory `dir` is the root or beneath it, by its `..`.
    fn holds(&self, dir: BorrowedFd<'_>) -> io::Result<bool> {
        let root = stat(self.fd.as_fd())?;
        let mut at = dir.try_clone_to_owned()?;
        let mut here = stat(at.as_fd())?;
        // Deeper than any path can be (PATH_MAX / 2).
        for _ in 0..2048 {
            if (here.st_dev, here.st_ino) == (root.st_dev, root.st_ino) {
                return Ok(true);
            }
            let up = open_at(
                Some(at.as_fd()),
                Path::new(".."),
                libc::O_PATH | libc::O_DIRECTORY,
            )?;
            let above = stat(up.as_fd())?;
            if (above.st_dev, above.st_ino) == (here.st_dev, here.st_ino) {
                return Ok(false);
            }
            (at, here) = (up, above);
        }
        Ok(false)
    }
}

/// Missing components may only be names: `missing/..` does not exist.
fn only_names(missing: Vec<OsString>) -> Result<Vec<OsString>, Error> {
    let mut names = Vec::with_capacity(missing.len());
    for part in missing {
        match Path::new(&part).components().next() {
            Some(Component::Normal(_)) => names.push(part),
            Some(Component::CurDir) | None => {}
            _ => return Err(Error::Io(io::Error::from_raw_os_error(libc::ENOENT))),
        }
    }
    Ok(names)
}

impl Destination {
    /// Its real path: symlinks resolved, beneath the root.
    pub fn path(&self) -> PathBuf {
        let mut path = self.dir_path.clone();
        path.extend(&self.missing);
        path.push(&self.name);
        path
    }

    /// Its name in its directory.
    pub fn name(&self) -> &OsStr {
        &self.name
    }

    /// The entry itself, unfollowed, opened for nothing but `fstat`
    /// (`None`: there is none).
    fn probe(&self) -> io::Result<Option<OwnedFd>> {
        if !self.missing.is_empty() {
            return Ok(None);
        }
        match open_at(
            Some(self.dir.as_fd()),
            Path::new(&self.name),
            libc::O_PATH | libc::O_NOFOLLOW,
        ) {
            Ok(fd) => Ok(Some(fd)),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The regular file there, opened to read (`None`: there is none).
    /// Its type is looked at on a descriptor that cannot block or touch a
    /// device (`O_PATH`) before it is opened for reading, non-blocking,
    /// and checked again to be the same file. [`Error::Unstable`] when it
    /// was swapped for a symlink meanwhile: locate it again.
    pub fn open_regular(&self) -> Result<Option<std::fs::File>, Error> {
        let Some(probe) = self.probe()? else {
            return Ok(None);
        };
        let seen = stat(probe.as_fd())?;
        check_regular(seen.st_mode)?;
        let fd = match open_at(
            Some(self.dir.as_fd()),
            Path::new(&self.name),
            libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_NOCTTY,
        ) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Err(Error::Unstable),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Err(Error::Unstable),
            Err(e) => return Err(e.into()),
        };
        let opened = stat(fd.as_fd())?;
        check_regular(opened.st_mode)?;
        if (opened.st_dev, opened.st_ino) != (seen.st_dev, seen.st_ino) {
            return Err(Error::Unstable);
        }
        clear_nonblocking(fd.as_fd())?;
        Ok(Some(std::fs::File::from(fd)))
    }

    /// Whatever is there must be a regular file, or nothing.
    pub fn check_replaceable(&self) -> Result<(), Error> {
        match self.probe()? {
            Some(fd) => match stat(fd.as_fd())?.st_mode & libc::S_IFMT {
                libc::S_IFLNK => Err(Error::Unstable),
                mode => check_regular(mode),
            },
            None => Ok(()),
        }
    }

    /// Makes the missing directories, each beneath the one before
    /// (`mkdirat`, then opened without following a symlink).
    pub fn make_dirs(&mut self) -> Result<(), Error> {
        for name in std::mem::take(&mut self.missing) {
            match mkdir_at(self.dir.as_fd(), &name) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e.into()),
            }
            let fd = open_at(
                Some(self.dir.as_fd()),
                Path::new(&name),
                libc::O_PATH | libc::O_NOFOLLOW | libc::O_DIRECTORY,
            )?;
            if file_type(fd.as_fd())? != libc::S_IFDIR {
                return Err(Error::Unstable);
            }
            self.dir = fd;
            self.dir_path.push(name);
        }
        Ok(())
    }

    /// Creates a new file `name` in the same directory (`O_EXCL`, never
    /// following a symlink), for writing.
    pub fn create_beside(&self, name: &OsStr, mode: u32) -> io::Result<std::fs::File> {
        let c = cstring(Path::new(name))?;
        // SAFETY: a valid directory descriptor and a NUL-terminated name.
        let fd = unsafe {
            libc::openat(
                self.dir.as_raw_fd(),
                c.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                mode as libc::c_uint,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a descriptor just opened, owned by nobody else.
        Ok(std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Renames `from` (in the same directory) over this place's name.
    pub fn rename_over(&self, from: &OsStr) -> io::Result<()> {
        let (from, to) = (cstring(Path::new(from))?, cstring(Path::new(&self.name))?);
        let dir = self.dir.as_raw_fd();
        // SAFETY: valid descriptors and NUL-terminated names.
        if unsafe { libc::renameat(dir, from.as_ptr(), dir, to.as_ptr()) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Removes `name` from the same directory.
    pub fn remove_beside(&self, name: &OsStr) -> io::Result<()> {
        let c = cstring(Path::new(name))?;
        // SAFETY: a valid descriptor and a NUL-terminated name.
        if unsafe { libc::unlinkat(self.dir.as_raw_fd(), c.as_ptr(), 0) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

fn check_regular(mode: libc::mode_t) -> Result<(), Error> {
    match mode & libc::S_IFMT {
        libc::S_IFREG => Ok(()),
        libc::S_IFDIR => Err(Error::Directory),
        libc::S_IFIFO => Err(Error::NotRegular("a named pipe (FIFO)")),
        libc::S_IFSOCK => Err(Error::NotRegular("a socket")),
        libc::S_IFCHR => Err(Error::NotRegular("a character device")),
        libc::S_IFBLK => Err(Error::NotRegular("a block device")),
        libc::S_IFLNK => Err(Error::Unstable),
        _ => Err(Error::NotRegular("not a regular file")),
    }
}

fn cstring(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a path with a NUL byte"))
}

/// `openat(2)` with `O_CLOEXEC` (`at`: `None` for the process's cwd).
fn open_at(at: Option<BorrowedFd<'_>>, path: &Path, flags: libc::c_int) -> io::Result<OwnedFd> {
    let c = cstring(path)?;
    let dir = at.map_or(libc::AT_FDCWD, |fd| fd.as_raw_fd());
    // SAFETY: a valid (or AT_FDCWD) descriptor and a NUL-terminated path.
    let fd = unsafe { libc::openat(dir, c.as_ptr(), flags | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor just opened, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `openat2(2)` with `O_CLOEXEC` and the `RESOLVE_*` flags given.
fn openat2(
    at: Option<BorrowedFd<'_>>,
    path: &Path,
    flags: libc::c_int,
    resolve: u64,
) -> io::Result<OwnedFd> {
    let c = cstring(path)?;
    let dir = at.map_or(libc::AT_FDCWD, |fd| fd.as_raw_fd());
    // SAFETY: open_how is plain data; zero is "nothing asked" for every field.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | libc::O_CLOEXEC) as u64;
    how.resolve = resolve;
    // SAFETY: a valid descriptor, a NUL-terminated path, and open_how with
    // its size, as openat2 expects.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir,
            c.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor just opened, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

fn stat(fd: BorrowedFd<'_>) -> io::Result<libc::stat> {
    // SAFETY: stat is plain data, filled by fstat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and a stat to fill.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

fn file_type(fd: BorrowedFd<'_>) -> io::Result<libc::mode_t> {
    Ok(stat(fd)?.st_mode & libc::S_IFMT)
}

/// The target of the symlink `fd` was opened on (`O_PATH | O_NOFOLLOW`).
fn read_link(fd: BorrowedFd<'_>) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: a valid descriptor, an empty path (the descriptor itself) and
    // a buffer of the length given.
    let n = unsafe {
        libc::readlinkat(
            fd.as_raw_fd(),
            c"".as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

fn mkdir_at(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
    let c = cstring(Path::new(name))?;
    // SAFETY: a valid descriptor and a NUL-terminated name.
    if unsafe { libc::mkdirat(dir.as_raw_fd(), c.as_ptr(), 0o777) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn clear_nonblocking(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: fcntl on a valid descriptor.
    unsafe {
        let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Where the kernel says a descriptor leads.
fn fd_path(fd: BorrowedFd<'_>) -> io::Result<PathBuf> {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_kernel_resolves_beneath_itself() {
        // Linux 5.6 and later: the walk is only for older kernels (and is
        // tested by being forced).
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let mut parts = release
            .trim()
            .split(['.', '-'])
            .map(|p| p.parse::<u32>().unwrap_or(0));
        let version = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
        if version >= (5, 6) {
            assert_eq!(Resolver::detect(), Resolver::Kernel, "{release}");
        }
    }

    /// A resolved directory holding `work` (the root) and `outside`.
    fn dirs() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        let (work, outside) = (base.join("work"), base.join("outside"));
        std::fs::create_dir_all(work.join("src")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        (dir, work, outside)
    }

    #[test]
    fn paths_lead_beneath_the_root_or_are_refused() {
        let (_dir, work, outside) = dirs();
        let link = |target: &Path, name: &str| std::os::unix::fs::symlink(target, work.join(name));
        link(Path::new("/etc"), "etc-link").unwrap();
        link(&work.join("src"), "abs-link").unwrap();
        link(Path::new("src"), "rel-link").unwrap();
        link(Path::new("../outside"), "up-link").unwrap();
        link(Path::new("src/a.rs"), "file-link").unwrap();
        link(&outside.join("x"), "file-out").unwrap();
        link(Path::new("loop"), "loop").unwrap();
        std::fs::write(work.join("src/a.rs"), "a").unwrap();

        for resolver in Resolver::all() {
            let root = Root::open(&work, resolver).unwrap();
            let at = |rel: &str| root.locate(Path::new(rel)).map(|p| p.path());
            let inside = |rel: &str, expected: &str| {
                assert_eq!(at(rel).unwrap(), work.join(expected), "{resolver:?} {rel}");
            };
            inside("src/a.rs", "src/a.rs");
            inside("abs-link/a.rs", "src/a.rs");
            inside("rel-link/a.rs", "src/a.rs");
            inside("src/../c.rs", "c.rs");
            inside("file-link", "src/a.rs");
            inside("./src//b.rs", "src/b.rs");
            inside("new/dir/b.rs", "new/dir/b.rs");
            let escapes = |rel: &str| {
                let e = at(rel).unwrap_err();
                assert!(matches!(e, Error::Outside), "{resolver:?} {rel}: {e:?}");
            };
            escapes("../x");
            escapes("src/../../x");
            escapes("etc-link/passwd");
            escapes("up-link/x");
            escapes("file-out");
            assert!(
                matches!(at("new/../x"), Err(Error::Io(e)) if e.kind() == io::ErrorKind::NotFound)
            );
            assert!(
                matches!(at("loop/x"), Err(Error::Io(e)) if e.raw_os_error() == Some(libc::ELOOP))
            );
            assert!(matches!(at("src/.."), Err(Error::Directory)));
            assert!(matches!(at(""), Err(Error::Directory)));
            assert!(matches!(
                root.relative(&outside.join("x")),
                Err(Error::Outside)
            ));
            assert!(matches!(
                root.relative(Path::new("/etc/passwd")),
                Err(Error::Outside)
            ));
            assert_eq!(root.relative(&work.join("a/b")).unwrap(), Path::new("a/b"));
        }
    }

    #[test]
    fn a_root_that_became_a_symlink_is_not_opened() {
        let (_dir, work, outside) = dirs();
        let swapped = outside.parent().unwrap().join("swapped");
        std::os::unix::fs::symlink(&outside, &swapped).unwrap();
        for resolver in Resolver::all() {
            let e = Root::open(&swapped, resolver).unwrap_err();
            assert!(e.to_string().contains("symlink"), "{resolver:?}: {e}");
            assert!(Root::open(&work, resolver).is_ok());
            assert!(Root::open(Path::new("relative"), resolver).is_err());
        }
    }

    #[test]
    fn only_regular_files_are_opened_and_without_blocking() {
        let (_dir, work, _) = dirs();
        let fifo = work.join("pipe");
        let c = cstring(&fifo).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let _socket = std::os::unix::net::UnixListener::bind(work.join("sock")).unwrap();
        std::fs::write(work.join("file"), "text").unwrap();
        for resolver in Resolver::all() {
            let root = Root::open(&work, resolver).unwrap();
            let open = |rel: &str| root.locate(Path::new(rel)).unwrap().open_regular();
            assert!(matches!(open("pipe"), Err(Error::NotRegular(kind)) if kind.contains("FIFO")));
            assert!(
                matches!(open("sock"), Err(Error::NotRegular(kind)) if kind.contains("socket"))
            );
            assert!(matches!(open("src"), Err(Error::Directory)));
            assert!(open("none").unwrap().is_none());
            let mut file = open("file").unwrap().unwrap();
            let mut text = String::new();
            std::io::Read::read_to_string(&mut file, &mut text).unwrap();
            assert_eq!(text, "text");
            // SAFETY: fcntl on a valid descriptor.
            let flags = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
            assert_eq!(flags & libc::O_NONBLOCK, 0, "left non-blocking");
        }
    }

    #[test]
    fn missing_directories_are_made_beneath_and_a_file_replaced_in_its_own() {
        let (_dir, work, _) = dirs();
        for resolver in Resolver::all() {
            let root = Root::open(&work, resolver).unwrap();
            let mut destination = root
                .locate(Path::new(&format!("{resolver:?}/deep/er/f.txt")))
                .unwrap();
            assert!(destination.open_regular().unwrap().is_none());
            destination.make_dirs().unwrap();
            let temp = OsStr::new(".f.tmp");
            std::io::Write::write_all(&mut destination.create_beside(temp, 0o644).unwrap(), b"x")
                .unwrap();
            destination.rename_over(temp).unwrap();
            let made = work.join(format!("{resolver:?}/deep/er/f.txt"));
            assert_eq!(destination.path(), made);
            assert_eq!(std::fs::read_to_string(&made).unwrap(), "x");
            // O_EXCL: never over something already there.
            assert!(destination
                .create_beside(OsStr::new("f.txt"), 0o644)
                .is_err());
        }
    }

    #[test]
    fn a_directory_moved_out_of_the_root_is_not_held() {
        let (_dir, work, outside) = dirs();
        let root = Root::open(&work, Resolver::Walk).unwrap();
        std::fs::create_dir_all(work.join("a/b")).unwrap();
        let fd = open_at(Some(root.fd.as_fd()), Path::new("a/b"), libc::O_PATH).unwrap();
        assert!(root.holds(fd.as_fd()).unwrap());
        assert!(root.holds(root.fd.as_fd()).unwrap());
        std::fs::rename(work.join("a"), outside.join("a")).unwrap();
        assert!(!root.holds(fd.as_fd()).unwrap());
    }
}
