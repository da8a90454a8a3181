//! The directory a conversation runs in: the one a client asks for, else
//! its profile's, checked against the profile's `allowed_roots` and
//! resolved ([`conversation_cwd`]); a user's own made on first use.

use std::path::{Path, PathBuf};

use crate::config::AgentProfile;
use crate::error::{Error, Result};

/// The directory a conversation of `user`'s with `profile` runs in:
/// the one asked for, else the profile's, else the gateway's own;
/// absolute, inside the `allowed_roots` (403 otherwise, whether it is
/// there or not), an existing directory (404 otherwise), and resolved
/// (`..` by name, then symlinks), so the agent gets it as it really
/// is. A profile's `cwd` with `{user}` in it is the user's own, made
/// (for the agent's user alone) when it is first needed. The policy dry
/// run resolves its `cwd` the same way.
pub fn conversation_cwd(
    profile: &AgentProfile,
    requested: Option<&str>,
    user: Option<&str>,
) -> Result<PathBuf> {
    if let Some(requested) = requested {
        crate::limits::path("cwd", requested, crate::limits::CWD_MAX_CHARS)?;
    }
    let own = crate::sandbox::profile::for_user(profile, user);
    let asked = match requested.map(PathBuf::from).or_else(|| own.cwd.clone()) {
        Some(cwd) => cwd,
        None => std::env::current_dir().map_err(anyhow::Error::from)?,
    };
    if !asked.is_absolute() {
        return Err(Error::Unprocessable(format!(
            "cwd {asked:?} must be an absolute path"
        )));
    }
    // `..` by name, before anything is looked at: where the path leads
    // then depends on nothing outside the roots.
    let cwd = lexically_normal(&asked);
    let users_own = requested.is_none()
        && profile
            .cwd
            .as_deref()
            .is_some_and(|c| c.to_string_lossy().contains("{user}"));
    if users_own && !cwd.exists() {
        make_users_workspace(&own, &cwd)?;
    }
    // Outside the allowed roots, whether a directory exists is none of the
    // caller's business: checked first, and one answer for both. Inside,
    // nothing there (or a file) is 404.
    check_allowed_root(&own, &cwd, &asked, "cwd")?;
    if !cwd.is_dir() {
        return Err(Error::NotFound(format!("cwd {asked:?} is not a directory")));
    }
    Ok(std::fs::canonicalize(&cwd).map_err(anyhow::Error::from)?)
}

/// The repository a conversation of `user`'s with `profile` is made on:
/// the one asked for, else the profile's (`{user}` filled in), else none;
/// absolute, inside the `allowed_roots` (403 otherwise, there or not), a
/// directory (422 otherwise: not a repository), and resolved.
pub fn conversation_repository(
    profile: &AgentProfile,
    requested: Option<&str>,
    user: Option<&str>,
) -> Result<Option<PathBuf>> {
    if let Some(requested) = requested {
        crate::limits::path("repository", requested, crate::limits::CWD_MAX_CHARS)?;
    }
    let own = crate::sandbox::profile::for_user(profile, user);
    let Some(asked) = requested
        .map(PathBuf::from)
        .or_else(|| own.repository.clone())
    else {
        return Ok(None);
    };
    if !asked.is_absolute() {
        return Err(Error::Unprocessable(format!(
            "repository {asked:?} must be an absolute path"
        )));
    }
    let path = lexically_normal(&asked);
    check_allowed_root(&own, &path, &asked, "repository")?;
    if !path.is_dir() {
        return Err(Error::Unprocessable(format!(
            "repository {asked:?} is not a git repository (no such directory on this node)"
        )));
    }
    Ok(Some(
        std::fs::canonicalize(&path).map_err(anyhow::Error::from)?,
    ))
}

/// A user's own workspace (the profile's `cwd` with `{user}`): made in
/// its parent, which the operator made, for the agent's user alone.
fn make_users_workspace(profile: &AgentProfile, dir: &Path) -> Result<()> {
    make_agents_dir(profile, dir)
        .map_err(|e| Error::Unprocessable(format!("cannot make the workspace {dir:?}: {e}")))
}

/// Makes `dir` (its parent there) for the profile's agent's user alone:
/// mode 0700, theirs where the gateway runs as root. One there already is
/// left as it is.
pub fn make_agents_dir(profile: &AgentProfile, dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(()),
        Err(e) => return Err(e),
    }
    let owner = profile
        .user
        .as_deref()
        .and_then(|name| crate::sys::lookup_user(name).ok())
        .filter(|_| crate::sys::running_as_root());
    if let Some(owner) = owner {
        std::os::unix::fs::chown(dir, Some(owner.uid), Some(owner.gid))?;
    }
    Ok(())
}

/// `allowed_roots`: where the cwd (lexically normal) leads, whether it
/// is there or not ([`real_location`]), must be inside one of them.
/// `asked` is the path as the caller wrote it, and `what` its name, for
/// the answer.
fn check_allowed_root(profile: &AgentProfile, cwd: &Path, asked: &Path, what: &str) -> Result<()> {
    if profile.allowed_roots.is_empty() {
        return Ok(());
    }
    let inside = real_location(cwd).is_some_and(|real| {
        profile
            .allowed_roots
            .iter()
            .any(|root| std::fs::canonicalize(root).is_ok_and(|root| real.starts_with(root)))
    });
    if inside {
        Ok(())
    } else {
        Err(Error::Forbidden(format!(
            "{what} {asked:?} is outside the agent's allowed_roots"
        )))
    }
}

/// `path` (absolute) with `.` and `..` taken away by name, as `cd -L` does:
/// `/a/link/../b` is `/a/b` whatever `link` is.
fn lexically_normal(path: &Path) -> PathBuf {
    let mut normal = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                normal.pop();
            }
            other => normal.push(other),
        }
    }
    normal
}

/// Where `path` (absolute, lexically normal) leads, whether it is there or
/// not: its longest leading part that is there, with symlinks resolved, then
/// the rest as named. `None` where a part that is there cannot be resolved
/// (a dangling or looping symlink): it is not known to lead anywhere.
fn real_location(path: &Path) -> Option<PathBuf> {
    let mut there = path;
    while there.symlink_metadata().is_err() {
        there = there.parent()?;
    }
    let real = std::fs::canonicalize(there).ok()?;
    let rest = path.strip_prefix(there).ok()?;
    Some(if rest.as_os_str().is_empty() {
        real
    } else {
        real.join(rest)
    })
}
