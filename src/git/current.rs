//! The branch a repository has checked out: a conversation's base where
//! neither the request nor the profile names one.

use std::path::Path;

use super::{Git, GitError};

impl Git {
    /// The branch checked out in `repository` (its `HEAD`); NotARepository
    /// where it is none, UnknownBase where `HEAD` is detached.
    pub async fn current_branch(&self, repository: &Path) -> Result<String, GitError> {
        let output = tokio::process::Command::new(&self.program)
            .arg("-c")
            .arg("safe.directory=*")
            .arg("-C")
            .arg(repository)
            .args(["symbolic-ref", "--short", "-q", "HEAD"])
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("LC_ALL", "C")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output()
            .await
            .map_err(|e| GitError::Failed(format!("cannot run git: {e}")))?;
        let named = String::from_utf8_lossy(&output.stdout).trim().to_owned();
        match (output.status.code(), named.is_empty()) {
            (Some(0), false) => Ok(named),
            (Some(1), _) => Err(GitError::UnknownBase(format!(
                "{} has no branch checked out: name a base",
                repository.display()
            ))),
            _ => Err(GitError::NotARepository(format!(
                "{} is not a git repository",
                repository.display()
            ))),
        }
    }
}
