//! The branch a repository has checked out: a conversation's base where
//! neither the request nor the profile names one.

use std::path::Path;

use super::{Git, GitError};

impl Git {
    /// The branch checked out in `repository` (its `HEAD`); NotARepository
    /// where it is none, UnknownBase where `HEAD` is detached.
    pub async fn current_branch(&self, repository: &Path) -> Result<String, GitError> {
        if !repository.is_dir() {
            return Err(not_a_repository(repository));
        }
        let output = self
            .at(repository)
            .args(["symbolic-ref", "--short", "-q", "HEAD"])
            .output()
            .await?;
        let named = String::from_utf8_lossy(&output.stdout).trim().to_owned();
        match (output.status.code(), named.is_empty()) {
            (Some(0), false) => Ok(named),
            (Some(1), _) => Err(GitError::UnknownBase(format!(
                "{} has no branch checked out: name a base",
                repository.display()
            ))),
            _ => Err(GitError::NotARepository(format!(
                "{} is not a git repository: {}",
                repository.display(),
                String::from_utf8_lossy(&output.stderr).trim()
            ))),
        }
    }
}

fn not_a_repository(repository: &Path) -> GitError {
    GitError::NotARepository(format!("{} is not a git repository", repository.display()))
}
