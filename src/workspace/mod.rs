//! What an agent reaches through the gateway rather than on its own, when
//! its profile offers it: files (`fs/read_text_file`, `fs/write_text_file`,
//! with `client_fs`) and terminals (`terminal/*`, with `client_terminal`).
//!
//! The gateway enforces the workspace itself: a path must resolve (`..` and
//! symlinks followed) to a place inside the conversation's cwd and the
//! profile's `allowed_roots`; files are read and written with the agent's
//! user's rights, never the gateway's. Nothing here knows about sessions or
//! the database: the session task hands requests in and journals what comes
//! out ([`files::Written`], terminal output).

pub mod beneath;
pub mod files;
pub mod paths;
pub mod terminals;

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::sys::SystemUser;

/// JSON-RPC's "invalid params": the request cannot be served as asked.
pub const INVALID_PARAMS: i64 = -32602;
/// ACP's "resource not found" (a file, a terminal).
pub const NOT_FOUND: i64 = -32002;
/// JSON-RPC's "internal error": the gateway failed (an I/O error).
pub const INTERNAL_ERROR: i64 = -32603;

/// Why a request of the agent's is refused: the JSON-RPC error it gets.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    pub code: i64,
    pub message: String,
    pub data: Option<Value>,
}

impl Refusal {
    pub fn invalid(message: impl Into<String>) -> Refusal {
        Refusal {
            code: INVALID_PARAMS,
            message: message.into(),
            data: None,
        }
    }

    pub fn not_found(message: impl Into<String>) -> Refusal {
        Refusal {
            code: NOT_FOUND,
            message: message.into(),
            data: None,
        }
    }

    /// An I/O error, said with the path it happened on.
    pub fn io(path: &Path, error: std::io::Error) -> Refusal {
        let message = format!("{}: {error}", path.display());
        match error.kind() {
            std::io::ErrorKind::NotFound => Refusal::not_found(message),
            std::io::ErrorKind::PermissionDenied => Refusal::invalid(message),
            _ => Refusal {
                code: INTERNAL_ERROR,
                message,
                data: None,
            },
        }
    }
}

/// One conversation's workspace: where the agent may reach, and as whom.
#[derive(Debug, Clone)]
pub struct Workspace {
    /// The conversation's cwd (as stored: already resolved).
    pub cwd: PathBuf,
    /// The profile's `allowed_roots` (empty: no limit beyond the cwd).
    pub allowed_roots: Vec<PathBuf>,
    /// The agent's user, when the gateway switches to one.
    pub user: Option<SystemUser>,
    /// Files served (`client_fs`).
    pub files: bool,
    /// Terminals served (`client_terminal`).
    pub terminals: bool,
}

impl Workspace {
    /// A path the agent named, resolved and checked to be inside.
    pub fn resolve(&self, path: &Path) -> Result<PathBuf, Refusal> {
        paths::resolve_inside(path, &self.cwd, &self.allowed_roots).map_err(Refusal::invalid)
    }
}

/// The real places of `given` (see [`paths::real_paths`]), looked up with
/// `user`'s rights (for the policies, which judge both forms).
pub async fn real_paths(user: Option<SystemUser>, given: Vec<PathBuf>) -> Vec<PathBuf> {
    if given.is_empty() {
        return given;
    }
    let asked = given.clone();
    as_user(user, move || paths::real_paths(&asked))
        .await
        .unwrap_or(given)
}

/// Runs `work` on a thread of its own whose file system rights are `user`'s
/// (when the gateway is root and there is a user to be), so a file the agent
/// could not touch itself cannot be touched through the gateway either. The
/// thread ends with the work: the rights it took go with it.
pub async fn as_user<T: Send + 'static>(
    user: Option<SystemUser>,
    work: impl FnOnce() -> T + Send + 'static,
) -> std::io::Result<T> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("workspace-io".into())
        .spawn(move || {
            let outcome = match user.filter(|_| crate::sys::running_as_root()) {
                Some(user) => crate::sys::become_for_files(&user).map(|()| work()),
                None => Ok(work()),
            };
            let _ = tx.send(outcome);
        })?;
    rx.await
        .unwrap_or_else(|_| Err(std::io::Error::other("the file thread panicked")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    /// Files are reached with the agent's user's rights, not the gateway's
    /// (only where the gateway is root and the system has `nobody`).
    #[tokio::test]
    async fn files_are_reached_with_the_agents_rights() {
        let Some(nobody) = crate::sys::nobody_if_root() else {
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let cwd = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::set_permissions(&cwd, std::fs::Permissions::from_mode(0o755)).unwrap();
        let private = cwd.join("private.txt");
        std::fs::write(&private, "root only\n").unwrap();
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o600)).unwrap();
        let workspace = Workspace {
            cwd: cwd.clone(),
            allowed_roots: Vec::new(),
            user: Some(nobody.clone()),
            files: true,
            terminals: false,
        };
        let params = |path: &Path, content: Option<&str>| {
            let mut p = serde_json::json!({"sessionId": "s", "path": path});
            if let Some(content) = content {
                p["content"] = content.into();
            }
            p
        };

        let refused = files::read(&workspace, params(&private, None))
            .await
            .unwrap_err();
        assert!(refused.message.contains("ermission denied"), "{refused:?}");
        let refused = files::write(&workspace, params(&cwd.join("new.txt"), Some("x")))
            .await
            .unwrap_err();
        assert!(refused.message.contains("ermission denied"), "{refused:?}");
        assert!(!cwd.join("new.txt").exists());

        // Where the user may write, what it writes is its own.
        std::fs::set_permissions(&cwd, std::fs::Permissions::from_mode(0o777)).unwrap();
        files::write(&workspace, params(&cwd.join("new.txt"), Some("x")))
            .await
            .unwrap();
        assert_eq!(
            std::fs::metadata(cwd.join("new.txt")).unwrap().uid(),
            nobody.uid
        );
        // The gateway's own threads keep their rights.
        assert_eq!(std::fs::read_to_string(&private).unwrap(), "root only\n");
    }
}
