//! SQLite serves one gateway node: while a gateway serves a SQLite file it
//! holds an exclusive lock on `<file>.lock`, which names it to a second one.

use anyhow::Context;

use crate::process::procs::Host;

/// Takes the lock of a SQLite database file (`<file>.lock`), or says which
/// gateway holds it. In-memory databases need none. The lock is held until
/// the file returned is closed (or the process ends, however it ends).
pub fn lock_sqlite(url: &str) -> anyhow::Result<Option<std::fs::File>> {
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
    Ok(Some(lock))
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
}
