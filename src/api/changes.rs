//! `/api/v1/conversations/{id}/changes`: what a conversation made on a
//! repository changed in its worktree (files, lines, commits; a unified
//! diff), and a person's commit, land and discard of that work.

use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::{router::OpenApiRouter, routes};

use super::conversations::ConversationPath;
use super::extract::{Acting, AppJson, AppQuery, Visible, COLLABORATOR, OWNER};
use super::state::AppState;
use crate::auth::Caller;
use crate::error::{Error, Result};
use crate::limits;
use crate::model::{
    Changes, ChangesCommitted, ChangesDiscarded, ChangesLanded, Conversation, ConversationStatus,
    LandStrategy, Signature, Worktree,
};
use crate::session::work::{git_of, no_worktree, source_of};
use crate::session::{ChangeDone, ChangeOp};

/// A commit message, in characters.
pub const MESSAGE_MAX_CHARS: usize = 10_000;
/// A diff's `path`, in characters.
pub const DIFF_PATH_MAX_CHARS: usize = 1024;

/// A diff's `path`: relative (not starting with `/`), no `..` part, no NUL
/// (empty parts, `.` and names like `..x` are fine): what the git room
/// takes, as a JSON Schema pattern (no look-around, so that every engine
/// reads it alike).
pub const DIFF_PATH_PATTERN: &str = concat!(
    r"^(?:[^/.\u0000][^/\u0000]*|\.|\.[^/.\u0000][^/\u0000]*|\.\.[^/\u0000]+)",
    r"(?:/(?:[^/.\u0000][^/\u0000]*|\.|\.[^/.\u0000][^/\u0000]*|\.\.[^/\u0000]+)?)*$",
);

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(changes))
        .routes(routes!(diff))
        .routes(routes!(commit))
        .routes(routes!(land))
        .routes(routes!(discard))
}

/// The conversation's worktree (409 `no_worktree` without one).
fn worktree_of(conversation: &Conversation) -> Result<&Worktree> {
    conversation.worktree.as_ref().ok_or_else(no_worktree)
}

/// What differs from the base: the files (committed, uncommitted and
/// untracked, against the merge base of the base and the branch), each with
/// its status and lines added and removed, and the branch's commits. Once
/// the conversation is closed (its worktree removed), what its branch
/// holds.
#[utoipa::path(
    get, operation_id = "listChanges", path = "/api/v1/conversations/{id}/changes", tag = "changes",
    params(ConversationPath),
    responses(
        (status = 200, description = "What differs from the base", body = Changes),
        (status = 404, description = "No such conversation (or not the caller's)"),
        (status = 409, description = "`no_worktree`: the conversation was not made on a repository"),
        (status = 502, description = "`repository_failed`: the repository or worktree is out of this node's reach, or git failed on it (the detail says which)"),
    )
)]
async fn changes(Visible { state, item, .. }: Visible<Conversation>) -> Result<Json<Changes>> {
    let worktree = worktree_of(&item)?;
    let git = git_of(
        &state.config().git_program(),
        state.config().agent(&item.agent).as_ref(),
    );
    Ok(Json(git.changes(worktree, source_of(&item)).await?))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct DiffQuery {
    /// One file's path, relative to the worktree (default: every file), 1
    /// to 1024 characters. One that leads out of it (absolute, or with a
    /// `..` part) is 400 `invalid_path`.
    #[param(schema_with = diff_path_schema)]
    path: Option<String>,
}

/// A diff's `path` as the document states it ([`DIFF_PATH_PATTERN`]).
fn diff_path_schema() -> utoipa::openapi::schema::Object {
    utoipa::openapi::schema::ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::Type::String)
        .min_length(Some(1))
        .max_length(Some(DIFF_PATH_MAX_CHARS))
        .pattern(Some(DIFF_PATH_PATTERN))
        .build()
}

/// A unified diff.
#[derive(Serialize, ToSchema)]
#[schema(as = ChangesDiff)]
struct DiffView {
    /// The file it is of (`null`: every file).
    path: Option<String>,
    /// The diff against the merge base, as `git diff` shows it; a binary
    /// file is named (`Binary files … differ`), not shown.
    diff: String,
    /// More followed: it was cut at a line's end (at most
    /// `max_page_bytes`, 1 MiB by default).
    truncated: bool,
}

/// The unified diff of one file, or of every file, against the merge base
/// (uncommitted and untracked files included while the conversation is
/// open), bounded in bytes as pages are.
#[utoipa::path(
    get, operation_id = "getChangesDiff", path = "/api/v1/conversations/{id}/changes/diff", tag = "changes",
    params(ConversationPath, DiffQuery),
    responses(
        (status = 200, description = "The diff", body = DiffView),
        (status = 400, description = "`invalid_path`: the path leads out of the worktree"),
        (status = 404, description = "No such conversation (or not the caller's)"),
        (status = 409, description = "`no_worktree`"),
        (status = 422, description = "Invalid query"),
        (status = 502, description = "`repository_failed`"),
    )
)]
async fn diff(
    Visible { state, item, .. }: Visible<Conversation>,
    AppQuery(q): AppQuery<DiffQuery>,
) -> Result<Json<DiffView>> {
    let worktree = worktree_of(&item)?;
    if let Some(path) = &q.path {
        if path.is_empty() || path.chars().count() > DIFF_PATH_MAX_CHARS {
            return Err(Error::Unprocessable(format!(
                "path must be 1 to {DIFF_PATH_MAX_CHARS} characters"
            )));
        }
        static SHAPE: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
            regex::Regex::new(DIFF_PATH_PATTERN).expect("the pattern compiles")
        });
        if !SHAPE.is_match(path) {
            return Err(Error::BadPath(format!(
                "path {path:?} leads out of the worktree (relative, without a .. part)"
            )));
        }
    }
    let git = git_of(
        &state.config().git_program(),
        state.config().agent(&item.agent).as_ref(),
    );
    let max = state.config().max_page_bytes;
    let diff = git
        .diff(worktree, source_of(&item), q.path.as_deref(), max)
        .await?;
    Ok(Json(DiffView {
        path: q.path,
        diff: diff.text,
        truncated: diff.truncated,
    }))
}

/// A commit of everything the worktree holds.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = ChangesCommit)]
struct CommitBody {
    /// The commit message: 1 to 10000 characters, lines allowed.
    #[schema(
        min_length = 1,
        max_length = 10000,
        pattern = "^[^\\u0000-\\u0008\\u000b-\\u001f\\u007f-\\u009f]*[^\\u0000-\\u0020\\u007f-\\u00a0][^\\u0000-\\u0008\\u000b-\\u001f\\u007f-\\u009f]*$"
    )]
    message: String,
}

/// Commits everything in the worktree (untracked files too, ignored ones
/// not) on the conversation's branch: the author is the caller, the
/// committer the gateway. Recorded as `changes_committed`. Refused while
/// a turn runs.
#[utoipa::path(
    post, operation_id = "commitChanges", path = "/api/v1/conversations/{id}/changes/commit", tag = "changes",
    params(ConversationPath),
    request_body = CommitBody,
    responses(
        (status = 200, description = "Committed", body = ChangesCommitted),
        (status = 404, description = "No such conversation (or not the caller's)"),
        (status = 409, description = "`no_worktree`, `turn_in_progress`, `nothing_to_commit`, `repository_busy` (another commit, land or discard runs on the repository) or `conversation_closed`"),
        (status = 422, description = "Invalid message"),
        (status = 502, description = "`repository_failed`: git failed; nothing changed"),
    )
)]
async fn commit(
    Acting(visible): Acting<COLLABORATOR>,
    AppJson(body): AppJson<CommitBody>,
) -> Result<Json<ChangesCommitted>> {
    let Visible {
        state,
        caller,
        item,
    } = visible;
    worktree_of(&item)?;
    check_message(&body.message)?;
    open_only(&item)?;
    let op = ChangeOp::Commit {
        message: body.message,
        author: author(&caller),
    };
    match state
        .sessions()
        .change_work(&item, op, caller.decided_by())
        .await?
    {
        ChangeDone::Committed(c) => Ok(Json(c)),
        other => Err(unexpected(other)),
    }
}

/// A land of the branch into its base.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = ChangesLand)]
struct LandBody {
    strategy: LandStrategy,
    /// The message of the merge or squash commit (default: one that names
    /// the branch).
    #[schema(
        min_length = 1,
        max_length = 10000,
        pattern = "^[^\\u0000-\\u0008\\u000b-\\u001f\\u007f-\\u009f]*[^\\u0000-\\u0020\\u007f-\\u00a0][^\\u0000-\\u0008\\u000b-\\u001f\\u007f-\\u009f]*$"
    )]
    message: Option<String>,
}

/// Brings the branch into its base: where the base is checked out in a
/// working tree (a clone with `main` checked out), that tree fast-forwards
/// to the result, as a person's would (one with uncommitted changes is 409
/// `uncommitted_changes` naming them); where it is checked out nowhere, the
/// base branch itself moves. `merge` makes a merge commit, `squash` one
/// commit of everything, `rebase` replays the branch's commits on the base;
/// after `squash` and `rebase` the conversation's branch moves to the
/// result. A conflict is 409 `conflict` naming the files. Whatever fails,
/// nothing changed. Recorded as `changes_landed`. A base in the profile's
/// `protected_bases` is the operators' to land on (403).
#[utoipa::path(
    post, operation_id = "landChanges", path = "/api/v1/conversations/{id}/changes/land", tag = "changes",
    params(ConversationPath),
    request_body = LandBody,
    responses(
        (status = 200, description = "Landed", body = ChangesLanded),
        (status = 403, description = "The base is protected: only an operator lands on it"),
        (status = 404, description = "No such conversation (or not the caller's)"),
        (status = 409, description = "`no_worktree`, `turn_in_progress`, `uncommitted_changes` (the worktree's, or the base's working tree's: `files` names them), `conflict` (`files`), `nothing_to_land`, `base_moved` or `repository_busy` (another land runs)"),
        (status = 422, description = "Invalid strategy or message"),
        (status = 502, description = "`repository_failed`: git failed; nothing changed"),
    )
)]
async fn land(
    Acting(visible): Acting<OWNER>,
    AppJson(body): AppJson<LandBody>,
) -> Result<Json<ChangesLanded>> {
    let Visible {
        state,
        caller,
        item,
    } = visible;
    let worktree = worktree_of(&item)?;
    if let Some(message) = &body.message {
        check_message(message)?;
    }
    check_protected(&state, &caller, &item, worktree)?;
    let op = ChangeOp::Land {
        strategy: body.strategy,
        message: body.message,
        author: author(&caller),
    };
    match state
        .sessions()
        .change_work(&item, op, caller.decided_by())
        .await?
    {
        ChangeDone::Landed(l) => Ok(Json(l)),
        other => Err(unexpected(other)),
    }
}

/// Throws away what the worktree holds since its last commit (uncommitted
/// changes and untracked files; ignored files stay). Recorded as
/// `changes_discarded`. Refused while a turn runs.
#[utoipa::path(
    post, operation_id = "discardChanges", path = "/api/v1/conversations/{id}/changes/discard", tag = "changes",
    params(ConversationPath),
    responses(
        (status = 200, description = "Discarded", body = ChangesDiscarded),
        (status = 404, description = "No such conversation (or not the caller's)"),
        (status = 409, description = "`no_worktree`, `turn_in_progress`, `repository_busy` or `conversation_closed`"),
        (status = 502, description = "`repository_failed`"),
    )
)]
async fn discard(Acting(visible): Acting<OWNER>) -> Result<Json<ChangesDiscarded>> {
    let Visible {
        state,
        caller,
        item,
    } = visible;
    worktree_of(&item)?;
    open_only(&item)?;
    match state
        .sessions()
        .change_work(&item, ChangeOp::Discard, caller.decided_by())
        .await?
    {
        ChangeDone::Discarded(d) => Ok(Json(d)),
        other => Err(unexpected(other)),
    }
}

/// A commit message: 1 to 10000 characters over lines, not only white
/// space (422).
fn check_message(message: &str) -> Result<()> {
    limits::text("message", message, MESSAGE_MAX_CHARS)?;
    match message.trim().is_empty() {
        true => Err(Error::Unprocessable("message must not be empty".to_owned())),
        false => Ok(()),
    }
}

/// Commit and discard need the worktree, which a closed conversation no
/// longer has.
fn open_only(conversation: &Conversation) -> Result<()> {
    match conversation.status {
        ConversationStatus::Closed => Err(Error::conflict(
            "conversation_closed",
            "the conversation is closed: its worktree is gone (its branch stays)",
        )),
        _ => Ok(()),
    }
}

/// A land on a base the profile protects is an operator's (403 else).
fn check_protected(
    state: &AppState,
    caller: &Caller,
    conversation: &Conversation,
    worktree: &Worktree,
) -> Result<()> {
    if caller.is_operator() {
        return Ok(());
    }
    let Some(profile) = state.config().agent(&conversation.agent) else {
        return Ok(());
    };
    let protected = profile.protected_bases.iter().any(|pattern| {
        globset::Glob::new(pattern)
            .map(|g| g.compile_matcher().is_match(&worktree.base))
            .unwrap_or(false)
    });
    match protected {
        true => Err(Error::Forbidden(format!(
            "the base {:?} is protected: only an operator lands on it",
            worktree.base
        ))),
        false => Ok(()),
    }
}

/// The caller as a commit's author.
fn author(caller: &Caller) -> Signature {
    Signature {
        name: caller.user.clone(),
        email: format!("{}@acp-gateway.invalid", caller.user),
    }
}

fn unexpected(done: ChangeDone) -> Error {
    Error::Internal(anyhow::anyhow!("the worktree did something else: {done:?}"))
}
