//! What a [`GitError`] is to the API: its status and problem code.

use super::GitError;
use crate::error::Error;

impl From<GitError> for Error {
    /// A git error as the API answers it.
    fn from(e: GitError) -> Error {
        use serde_json::json;
        let detail = e.to_string();
        match e {
            GitError::NotARepository(_) | GitError::UnknownBase(_) | GitError::InvalidBranch(_) => {
                Error::Unprocessable(detail)
            }
            GitError::BranchExists(_) => Error::conflict("branch_exists", detail),
            GitError::Dirty { tree, files } => Error::Conflict {
                code: "uncommitted_changes",
                detail,
                extra: Some(json!({ "tree": tree, "files": files })),
            },
            GitError::Conflict { files } => Error::Conflict {
                code: "conflict",
                detail,
                extra: Some(json!({ "files": files })),
            },
            GitError::NothingToCommit => Error::conflict("nothing_to_commit", detail),
            GitError::NothingToLand(_) => Error::conflict("nothing_to_land", detail),
            GitError::Busy(_) => Error::conflict("repository_busy", detail),
            GitError::BaseMoved(_) => Error::conflict("base_moved", detail),
            GitError::Gone(_) => Error::conflict("branch_gone", detail),
            GitError::BadPath(_) => Error::BadPath(detail),
            GitError::Failed(_) => Error::Repository(detail),
        }
    }
}
