//! What an agent reaches through the gateway rather than on its own, when
//! its profile offers it: files (`fs/read_text_file`, `fs/write_text_file`,
//! with `client_fs`) and terminals (`terminal/*`, with `client_terminal`);
//! and the directory they are in, each conversation's ([`cwd`]).
//!
//! The gateway enforces the workspace itself: a file's path is resolved by
//! the kernel beneath a descriptor of the conversation's cwd ([`beneath`]),
//! so `..` and symlinks never lead out of it, not even when swapped while a
//! request is served; only regular files are read and written; files are
//! reached with the agent's user's rights, never the gateway's. Nothing here
//! knows about sessions or the database: the session task hands requests in
//! and journals what comes out ([`crate::model::FileWritten`], terminal
//! output).

pub mod cwd;
pub mod files;
pub mod terminals;
pub mod beneath;
pub mod paths;

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
        use std::io::ErrorKind::*;
        match error.kind() {
            NotFound => Refusal::not_found(message),
            // What the request names cannot be served as asked: the
            // agent's doing, not the gateway's failing.
            PermissionDenied | NotADirectory | IsADirectory | InvalidFilename | InvalidInput => {
                Refusal::invalid(message)
            }
            _ if error.raw_os_error() == Some(libc::ELOOP) => Refusal::invalid(message),
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
    /// The conversation's box, which its terminal commands and the files
    /// reached for it are in too (`None`: unconfined).
    pub sandbox: Option<std::sync::Arc<crate::sandbox::Rules>>,
    /// The capabilities its terminal commands keep (the profile's).
    pub capabilities: crate::sandbox::capabilities::CapSet,
}

impl Workspace {
    /// A path the agent named, resolved and checked to be inside (for a
    /// terminal's cwd; files are reached through [`Workspace::root`]).
    pub fn resolve(&self, path: &Path) -> Result<PathBuf, Refusal> {
        paths::resolve_inside(path, &self.cwd, &self.allowed_roots).map_err(Refusal::invalid)
    }

    /// The cwd, opened as the root every file is reached beneath (on the
    /// thread that then reaches them: it is opened with its rights).
    ///
    /// Beneath the cwd is inside the `allowed_roots` when the cwd is: that
    /// was checked when the conversation was made, and is checked again
    /// here (the roots may have changed since); the cwd is opened without
    /// following any symlink, so it is the directory that was checked.
    pub fn root(&self, resolver: beneath::Resolver) -> Result<beneath::Root, Refusal> {
        let within = |root: &PathBuf| {
            std::fs::canonicalize(root).is_ok_and(|root| self.cwd.starts_with(root))
        };
        if !self.allowed_roots.is_empty() && !self.allowed_roots.iter().any(within) {
            return Err(Refusal::invalid(format!(
                "the conversation's directory {} is outside the agent's allowed_roots",
                self.cwd.display()
            )));
        }
        beneath::Root::open(&self.cwd, resolver).map_err(|e| Refusal::io(&self.cwd, e))
    }
}

/// The real places of `given` (see [`paths::real_paths`]), looked up with
/// `user`'s rights (for the policies, which judge both forms).
pub async fn real_paths(user: Option<SystemUser>, given: Vec<PathBuf>) -> Vec<PathBuf> {
    if given.is_empty() {
        return given;
    }
    let asked = given.clone();
    as_user(user, None, move || paths::real_paths(&asked))
        .await
        .unwrap_or(given)
}

/// Runs `work` on a thread of its own whose file system rights are `user`'s
/// (when the gateway is root and there is a user to be) inside `sandbox`
/// (the agent's box, where it has one), so a file the agent could not touch
/// itself cannot be touched through the gateway either. The thread ends
/// with the work: the rights it took go with it.
pub async fn as_user<T: Send + 'static>(
    user: Option<SystemUser>,
    sandbox: Option<std::sync::Arc<crate::sandbox::Rules>>,
    work: impl FnOnce() -> T + Send + 'static,
) -> std::io::Result<T> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("workspace-io".into())
        .spawn(move || {
            let confined = || match &sandbox {
                Some(rules) => crate::sandbox::landlock::confine_this_thread(rules),
                None => Ok(()),
            };
            let outcome = match user.filter(|_| crate::sys::running_as_root()) {
                Some(user) => crate::sys::become_for_files(&user).and_then(|()| confined()),
                None => confined(),
            }
            .map(|()| work());
            let _ = tx.send(outcome);
        })?;
    rx.await
        .unwrap_or_else(|_| Err(std::io::Error::other("the file thread panicked")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    /// Files are reached from inside the agent's box: beneath the cwd, but
    /// outside what the box holds, the kernel refuses (where it offers
    /// Landlock).
    #[tokio::test]
    async fn files_are_reached_from_inside_the_agents_box() {
        if crate::sandbox::landlock::kernel_abi().is_none() {
            eprintln!("no Landlock on this kernel: skipped");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let cwd = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::write(cwd.join("a.txt"), "mine\n").unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let boxed = |read_write: &Path| Workspace {
            cwd: cwd.clone(),
            allowed_roots: Vec::new(),
            user: None,
            files: true,
            terminals: false,
            sandbox: Some(std::sync::Arc::new(crate::sandbox::Rules {
                read_write: vec![read_write.to_path_buf()],
                read_only: vec![PathBuf::from("/proc")],
                resolved: Vec::new(),
                tcp_ports: None,
            })),
            capabilities: Default::default(),
        };
        let params = |name: &str, content: Option<&str>| {
            let mut p = serde_json::json!({"sessionId": "s", "path": cwd.join(name)});
            if let Some(content) = content {
                p["content"] = content.into();
            }
            p
        };
        let inside = boxed(&cwd);
        let read = files::read(&inside, params("a.txt", None), files::open_gate())
            .await
            .unwrap();
        assert_eq!(read["content"], "mine\n");
        files::write(&inside, params("b.txt", Some("b")), files::open_gate())
            .await
            .unwrap();

        let outside = boxed(elsewhere.path());
        let refused = files::read(&outside, params("a.txt", None), files::open_gate())
            .await
            .unwrap_err();
        assert!(refused.message.contains("ermission denied"), "{refused:?}");
        let refused = files::write(&outside, params("c.txt", Some("c")), files::open_gate())
            .await
            .unwrap_err();
        assert!(refused.message.contains("ermission denied"), "{refused:?}");
        assert!(!cwd.join("c.txt").exists());
    }

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
            sandbox: None,
            capabilities: Default::default(),
        };
        let params = |path: &Path, content: Option<&str>| {
            let mut p = serde_json::json!({"sessionId": "s", "path": path});
            if let Some(content) = content {
                p["content"] = content.into();
            }
            p
        };

        let refused = files::read(&workspace, params(&private, None), files::open_gate())
            .await
            .unwrap_err();
        assert!(refused.message.contains("ermission denied"), "{refused:?}");
        let refused = files::write(
            &workspace,
            params(&cwd.join("new.txt"), Some("x")),
            files::open_gate(),
        )
        .await
        .unwrap_err();
        assert!(refused.message.contains("ermission denied"), "{refused:?}");
        assert!(!cwd.join("new.txt").exists());

        // Where the user may write, what it writes is its own.
        std::fs::set_permissions(&cwd, std::fs::Permissions::from_mode(0o777)).unwrap();
        files::write(
            &workspace,
            params(&cwd.join("new.txt"), Some("x")),
            files::open_gate(),
        )
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
