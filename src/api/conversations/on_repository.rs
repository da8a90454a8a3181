//! A conversation made on a repository: its worktree, made before its
//! agent starts (the worktree is its `cwd`) and removed again, with its
//! branch, where the start fails.

use std::path::{Path, PathBuf};

use super::super::state::AppState;
use crate::config::AgentProfile;
use crate::error::{Error, Result};
use crate::git::Git;
use crate::limits;
use crate::model::{Conversation, Signature, Worktree};

/// A branch or base name a request gives, in characters.
pub(crate) const BRANCH_MAX_CHARS: usize = 200;

/// What a request (or its profile) asks of the repository.
#[derive(Debug, Clone, Default)]
pub(crate) struct OnRepository {
    pub(crate) base: Option<String>,
    pub(crate) branch: Option<String>,
}

impl OnRepository {
    /// The names as given: one line each, 1 to 200 characters (git
    /// checks the rest).
    pub(crate) fn check(&self) -> Result<()> {
        for (name, value) in [("base", &self.base), ("branch", &self.branch)] {
            if let Some(value) = value {
                limits::line(name, value, BRANCH_MAX_CHARS)?;
                if value.is_empty() {
                    return Err(Error::Unprocessable(format!("{name} must not be empty")));
                }
            }
        }
        Ok(())
    }
}

/// git as a profile's conversations run it: as the agent's user.
fn git_for(state: &AppState, profile: &AgentProfile) -> Git {
    crate::session::work::git_of(&state.config().git_program(), Some(profile))
}

/// The conversation's own branch unless the request named one:
/// `acp/<the last 8 hex digits of its id>` (the id's random part).
pub(crate) fn default_branch(conversation: &Conversation) -> String {
    let simple = conversation.id.simple().to_string();
    format!("acp/{}", &simple[simple.len() - 8..])
}

/// Makes the conversation's worktree on `repository` (in
/// `<state_dir>/worktrees/<id>`, owned by the agent's user) and makes it
/// the conversation's `cwd`.
pub(crate) async fn make_worktree(
    state: &AppState,
    profile: &AgentProfile,
    conversation: &mut Conversation,
    repository: &Path,
    on: &OnRepository,
) -> Result<()> {
    let git = git_for(state, profile);
    let base = match on.base.clone().or_else(|| profile.base.clone()) {
        Some(base) => base,
        None => git.current_branch(repository).await?,
    };
    let branch = on
        .branch
        .clone()
        .unwrap_or_else(|| default_branch(conversation));
    let path = worktree_dir(state, profile, conversation)?;
    let made = git.add_worktree(repository, &base, &branch, &path).await;
    match made {
        Ok(worktree) => {
            conversation.cwd = worktree.path.clone();
            conversation.worktree = Some(worktree);
            Ok(())
        }
        Err(e) => {
            let _ = std::fs::remove_dir(&path);
            Err(e.into())
        }
    }
}

/// `<state_dir>/worktrees/<id>`, made empty for the agent's user (git
/// fills it).
fn worktree_dir(
    state: &AppState,
    profile: &AgentProfile,
    conversation: &Conversation,
) -> Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let root = state.config().worktrees_dir();
    let failed = |e: std::io::Error| {
        Error::Internal(anyhow::anyhow!("cannot make the worktree's directory: {e}"))
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o711)
        .create(&root)
        .map_err(failed)?;
    let dir = root.join(conversation.id.to_string());
    crate::workspace::cwd::make_agents_dir(profile, &dir).map_err(failed)?;
    Ok(dir)
}

/// Removes a worktree made for a start that failed, and its branch
/// (nothing was done on it).
pub(crate) async fn unmake_worktree(state: &AppState, profile: &AgentProfile, worktree: &Worktree) {
    let git = git_for(state, profile);
    if let Err(e) = git
        .remove_worktree(worktree, true, &Signature::gateway())
        .await
    {
        tracing::warn!(worktree = %worktree.path, error = %e, "could not remove a failed start's worktree");
    }
}
