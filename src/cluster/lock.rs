//! SQLite serves one gateway node: while a gateway serves a SQLite file it
//! holds an exclusive lock on `<file>.lock`, which names it to a second one.

use anyhow::Context;

use crate::process::procs::Host;

/// A SQLite database file's lock, held until dropped (or the process ends,
/// however it ends).
#[derive(Debug)]
pub struct SqliteLock(std::fs::File);

impl Drop for SqliteLock {
    fn drop(&mut self) {
        // Let go of explicitly, before the file is closed: a process being
        // started at this moment (between its fork and its exec) holds a
        // copy of the descriptor, and a flock lasts until every copy is
        // closed, so closing this one alone could leave the lock held a
        // little longer, and a gateway started right after this one stopped
        // would be refused. LOCK_UN lets go of it for every copy.
        use std::os::fd::AsRawFd;
        // SAFETY: flock on a descriptor this value owns.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// Takes the lock of a SQLite database file (`<file>.lock`), or says which
/// gateway holds it. In-memory databases need none.
pub fn lock_sqlite(url: &str) -> anyhow::Result<Option<SqliteLock>> {
    use std::io::{Read, Seek, Write};
    let Some(file) = crate::store::sqlite_file(url)? else {
        return Ok(None);
    };
    // A first start: the database's directory is made here, before the
    // store would make it.
    if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("Failed to create {}", dir.display()))?;
    }
    let mut path = file.clone();
    path.as_mut_os_string().push(".lock");
    let mut lock = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .with_context(|| format!("Failed to open {}", path.display()))?;
    // flock(2): held by this open file until it is closed (or the process
    // ends, however it ends).
    use std::os::fd::AsRawFd;
    // SAFETY: flock on a descriptor this function owns.
    let locked = unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    let error = std::io::Error::last_os_error();
    match locked {
        0 => {}
        _ if error.raw_os_error() == Some(libc::EWOULDBLOCK) => {
            let mut holder = String::new();
            let _ = lock.read_to_string(&mut holder);
            anyhow::bail!(
                "another gateway ({}) is serving the SQLite database {}: SQLite serves one \
                 gateway node. Stop it, or use Postgres to run several nodes on one database",
                holder.trim(),
                file.display()
            );
        }
        _ => return Err(error).with_context(|| format!("Failed to lock {}", path.display())),
    }
    lock.set_len(0)?;
    lock.rewind()?;
    let host = Host::here().map_or("", |h| h.hostname.as_str());
    write!(lock, "pid {} on {host}", std::process::id())?;
    Ok(Some(SqliteLock(lock)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_gateway_cannot_take_a_sqlite_file() {
        let dir = tempfile::tempdir().unwrap();
        // In a directory that does not exist yet, as on a first start.
        let url = format!("sqlite://{}", dir.path().join("new/g.db").display());
        let held = lock_sqlite(&url).unwrap();
        assert!(held.is_some());
        let err = lock_sqlite(&url).unwrap_err().to_string();
        assert!(err.contains("SQLite serves one gateway node"), "{err}");
        assert!(
            err.contains(&format!("pid {}", std::process::id())),
            "{err}"
        );
        drop(held);
        assert!(lock_sqlite(&url).unwrap().is_some());
        assert!(lock_sqlite("sqlite::memory:").unwrap().is_none());
    }

    /// A copy of the descriptor elsewhere (as a process being started holds
    /// one until its exec) does not keep the lock once it is let go of.
    #[test]
    fn a_copy_of_the_descriptor_does_not_keep_the_lock() {
        use std::os::fd::AsFd;
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("g.db").display());
        let held = lock_sqlite(&url).unwrap().unwrap();
        // What a fork copies: the same open file description.
        let copy = held.0.as_fd().try_clone_to_owned().unwrap();
        drop(held);
        let again = lock_sqlite(&url);
        assert!(
            matches!(again, Ok(Some(_))),
            "the lock is let go of although a copy is open: {again:?}"
        );
        drop(copy);
    }
}
