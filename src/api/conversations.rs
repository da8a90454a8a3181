//! `/api/v1/conversations`: create, list, prompt, cancel, close, and read a
//! conversation's history.

use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::{router::OpenApiRouter, routes};
use uuid::Uuid;

use super::extract::{
    Acting, AppJson, AppPath, AppQuery, Authed, Find, Visible, COLLABORATOR, OWNER,
};
use super::openapi::{
    ConversationList, EventList, FileChangeList, MessageList, RuleList, ToolCallList,
};
use super::page::{cut, newest_first, paged, paged_as, whole};
use super::responses::{
    no_content_if, AgentTimeout, AtCapacity, InvalidPage, NoConversation, NoRule, SettingChange,
};
use super::state::AppState;
use crate::auth::{Caller, Limited};
use crate::error::{Error, Result};
use crate::limits;
use crate::model::{
    event_type, Conversation, ConversationView, Event, EventBody, FileChange, Message, Page, Rule,
    ToolCall,
};
use crate::session::Setting;
pub(crate) use paths::ConversationPath;
pub(crate) use prompts::{prompt_content, Started};
use starting::{NewConversation, OnRepository};

mod prompts;
mod starting;
mod on_repository;
mod paths;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create, list))
        .routes(routes!(show, close))
        .routes(routes!(prompts::prompt))
        .routes(routes!(cancel))
        .routes(routes!(set_mode))
        .routes(routes!(set_config_option))
        .routes(routes!(messages))
        .routes(routes!(tool_calls))
        .routes(routes!(files))
        .routes(routes!(events))
        .routes(routes!(list_rules, forget_rules))
        .routes(routes!(show_rule, forget_rule))
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = NewConversation)]
struct CreateBody {
    #[schema(schema_with = agent_schema)]
    agent: String,
    /// One line, at most 200 characters.
    #[schema(max_length = 200, pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$")]
    title: Option<String>,
    #[schema(schema_with = cwd_schema)]
    cwd: Option<String>,
    /// An agent session begun elsewhere to take over (its `session_id` in
    /// `GET /api/v1/agents/{name}/sessions`): the conversation loads it
    /// (`session/load`, its history replayed into the conversation) or
    /// resumes it (`session/resume`) and goes on from there. One of the
    /// caller's, for this `cwd`; one held by an open conversation already is
    /// 409 `already_held`; one the agent does not know (for this user and
    /// `cwd`) is 404, and leaves no conversation behind.
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$"
    )]
    adopt: Option<String>,
    /// A git repository to make the conversation on (default: the
    /// profile's `repository`): it gets a worktree of its own
    /// (`<state_dir>/worktrees/<id>`, its `cwd`) on a new branch from
    /// `base`. Inside the profile's `allowed_roots` (403), a repository
    /// (422); not with `cwd` (422).
    #[schema(schema_with = repository_schema)]
    repository: Option<String>,
    /// The branch to start from and land on (default: the profile's
    /// `base`, else the branch the repository has checked out); one that
    /// is not there is 422.
    #[schema(schema_with = branch_schema)]
    base: Option<String>,
    /// The conversation's new branch (default `acp/<the last 8 hex digits
    /// of its id>`): in a folder (`feature/x`, not `x`, and not the base's
    /// folder), since the agent's box may write that folder's refs; one
    /// that exists is 409 `branch_exists`, one git refuses 422.
    #[schema(schema_with = branch_schema)]
    branch: Option<String>,
}

/// A request's repository: an absolute path, as a `cwd` is.
pub(super) fn repository_schema() -> utoipa::openapi::schema::Object {
    use utoipa::openapi::schema::{SchemaType, Type};
    utoipa::openapi::schema::ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::String, Type::Null]))
        .description(Some(
            "An absolute path, 1 to 1024 characters, of a git repository (its top directory). \
             One outside the profile's `allowed_roots` is 403; one that is not a repository, 422.",
        ))
        .min_length(Some(1))
        .max_length(Some(limits::CWD_MAX_CHARS))
        .pattern(Some(limits::PATH_PATTERN))
        .build()
}

/// A request's branch name: one line of at most 200 bytes (git checks
/// the rest: 422).
pub(super) fn branch_schema() -> utoipa::openapi::schema::Object {
    use utoipa::openapi::schema::{SchemaType, Type};
    utoipa::openapi::schema::ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::String, Type::Null]))
        .description(Some("A branch name, 1 to 200 characters, one line."))
        .min_length(Some(1))
        .max_length(Some(on_repository::BRANCH_MAX_CHARS))
        .pattern(Some(limits::LINE_PATTERN))
        .build()
}

/// A request's agent profile name: of the shape every profile's name has
/// ([`limits::agent_name`]; 422 otherwise), 404 where no profile has it.
pub(super) fn agent_schema() -> utoipa::openapi::schema::Object {
    utoipa::openapi::schema::ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::Type::String)
        .description(Some(
            "An agent profile's name (422 unless of this shape, 404 if there is no such profile).",
        ))
        .max_length(Some(limits::AGENT_NAME_MAX_BYTES))
        .pattern(Some(limits::AGENT_NAME_PATTERN))
        .examples([serde_json::json!("demo")])
        .build()
}

/// A request's conversation directory, as [`crate::workspace::cwd::conversation_cwd`]
/// takes it ([`limits::path`]).
pub(super) fn cwd_schema() -> utoipa::openapi::schema::Object {
    use utoipa::openapi::schema::{SchemaType, Type};
    utoipa::openapi::schema::ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::String, Type::Null]))
        .description(Some(
            "An absolute directory, 1 to 1024 characters (default: the profile's `cwd`). One \
             outside the profile's `allowed_roots` (`..` taken away by name, then symlinks \
             resolved), there or not, is 403; one inside that is not there (or is a file), 404.",
        ))
        .min_length(Some(1))
        .max_length(Some(limits::CWD_MAX_CHARS))
        .pattern(Some(limits::PATH_PATTERN))
        .build()
}

/// Starts a conversation: once its agent runs and `session/new` answered.
#[utoipa::path(
    post, operation_id = "createConversation", path = "/api/v1/conversations", tag = "conversations",
    request_body = CreateBody,
    responses(
        (status = 201, description = "Started", body = ConversationView),
        (status = 403, description = "`cwd` is outside the profile's `allowed_roots`"),
        (status = 404, description = "No such agent profile, or no directory at `cwd`; with `adopt`: the agent has no such session for the caller in `cwd`"),
        (status = 409, description = "With `adopt`: `already_held` (an open conversation holds that session), or `not_supported` (the agent offers neither `session/load` nor `session/resume`)"),
        (status = 422, description = "Invalid input"),
        (status = 429, description = "Too many new conversations for the user (`conversations_per_minute`), or all the agents the user may run are busy (`max_agents_per_user`); `Retry-After`"),
        (status = 502, description = "The agent could not be started (the detail says why, with its last stderr lines)"),
        (status = 503, description = "All `max_agents` agents are busy (`Retry-After`)"),
        AgentTimeout,
    )
)]
async fn create(
    Authed { state, caller }: Authed,
    AppJson(body): AppJson<CreateBody>,
) -> Result<impl IntoResponse> {
    let on = OnRepository {
        base: body.base,
        branch: body.branch,
    };
    let conversation = match body.adopt {
        None => {
            let place = Place {
                cwd: body.cwd.as_deref(),
                repository: body.repository.as_deref(),
                on,
            };
            start_conversation(&state, &caller, &body.agent, body.title, place, Vec::new()).await?
        }
        Some(_) if body.repository.is_some() || on.base.is_some() || on.branch.is_some() => {
            return Err(Error::Unprocessable(
                "a session taken over (adopt) goes on in its own cwd, not on a repository"
                    .to_owned(),
            ))
        }
        Some(adopt) => {
            starting::adopt(
                &state,
                &caller,
                &body.agent,
                body.title,
                body.cwd.as_deref(),
                adopt,
            )
            .await?
        }
    };
    Ok((StatusCode::CREATED, Json(conversation)))
}

/// Starts a conversation of `caller`'s with the profile `agent`: what
/// `POST /api/v1/conversations` does, and an ACP client's `session/new`.
pub(super) async fn start_conversation(
    state: &AppState,
    caller: &Caller,
    agent: &str,
    title: Option<String>,
    place: Place<'_>,
    client_mcp: Vec<agent_client_protocol_schema::v1::McpServer>,
) -> Result<Conversation> {
    let new = NewConversation::check(
        state,
        caller,
        agent,
        title,
        place.cwd,
        place.repository,
        place.on,
    )?;
    // Counted once the request would start an agent.
    state.auth().check_rate(caller, Limited::Conversation)?;
    let mut conversation = new.conversation(caller);
    new.make_worktree(state, &mut conversation).await?;
    let worktree = conversation.worktree.clone();
    let profile = new.profile.clone();
    let started = state
        .sessions()
        .start(new.profile, conversation, client_mcp)
        .await;
    if let (Err(_), Some(worktree)) = (&started, &worktree) {
        on_repository::unmake_worktree(state, &profile, worktree).await;
    }
    started
}

/// Where a new conversation works: a `cwd`, or a worktree of its own on a
/// repository (the profile's defaults where the request names neither).
#[derive(Default)]
pub(crate) struct Place<'a> {
    pub(crate) cwd: Option<&'a str>,
    pub(crate) repository: Option<&'a str>,
    pub(crate) on: OnRepository,
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct ListQuery {
    /// 1 to 200 (default 50).
    #[param(minimum = 1, maximum = 200)]
    limit: Option<i64>,
    /// The `next_cursor` of the previous page.
    cursor: Option<Uuid>,
}

/// The caller's conversations (an operator's: all), newest first.
#[utoipa::path(
    get, operation_id = "listConversations", path = "/api/v1/conversations", tag = "conversations",
    params(ListQuery),
    responses(
        (status = 200, description = "A page", body = ConversationList),
        (status = 422, description = "Invalid limit or cursor"),
    )
)]
async fn list(
    Authed { state, caller }: Authed,
    AppQuery(q): AppQuery<ListQuery>,
) -> Result<Json<Page<Conversation>>> {
    let limit = newest_first(q.limit, 50, 200)?;
    let before = q.cursor;
    let owner = caller.owner_filter();
    let items = state
        .store()
        .list_conversations(limit + 1, before, owner.as_deref(), None, true)
        .await?;
    Ok(Json(cut(items, limit, |c| c.id.to_string())))
}

/// A remembered rule of a conversation, as a path names it (documentation
/// only, as [`ConversationPath`]).
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
struct RulePath {
    /// The conversation
    id: Uuid,
    /// The rule
    rule_id: Uuid,
}

impl Find for Conversation {
    async fn find(state: &AppState, caller: &Caller, id: Uuid) -> Result<Conversation> {
        state.visible_conversation(caller, id).await
    }
}

/// One conversation.
#[utoipa::path(
    get, operation_id = "getConversation", path = "/api/v1/conversations/{id}", tag = "conversations",
    params(ConversationPath),
    responses(
        (status = 200, description = "The conversation", body = ConversationView),
        (status = 404, description = "No such conversation (or not the caller's)"),
    )
)]
async fn show(Visible { item, .. }: Visible<Conversation>) -> Json<Conversation> {
    Json(item)
}

/// Closes a conversation: its agent session stops (`session/close` first,
/// where the agent offers it); its history stays, its status is `closed`.
/// One made on a repository loses its worktree; its branch stays (what the
/// worktree held uncommitted is committed on it first) unless
/// `discard_branch=true`.
#[utoipa::path(
    delete, operation_id = "closeConversation", path = "/api/v1/conversations/{id}", tag = "conversations",
    params(ConversationPath, CloseQuery),
    responses(
        (status = 204, description = "Closed"),
        NoConversation,
        (status = 422, description = "Invalid query (`discard_branch` is `true` or `false`)"),
    )
)]
async fn close(
    Acting(visible): Acting<OWNER>,
    AppQuery(q): AppQuery<CloseQuery>,
) -> Result<StatusCode> {
    let Visible { state, item, .. } = visible;
    state.sessions().close(&item).await?;
    // Its agent is gone: its worktree goes (uncommitted work kept on the
    // branch), and the branch too where the person discards it.
    state
        .sessions()
        .remove_worktree(&item, q.discard_branch.unwrap_or(false))
        .await;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct CloseQuery {
    /// A conversation made on a repository: delete its branch too (default
    /// false: the branch stays, with whatever the worktree held uncommitted
    /// committed on it).
    discard_branch: Option<bool>,
}

/// Cancels the running turn (`session/cancel`; its pending permission
/// requests are answered `cancelled`). A no-op when idle.
#[utoipa::path(
    post, operation_id = "cancelTurn", path = "/api/v1/conversations/{id}/cancel", tag = "conversations",
    params(ConversationPath),
    responses(
        (status = 202, description = "Cancelled (or nothing to cancel)", body = Object),
        NoConversation,
        (status = 409, description = "`conversation_closed`"),
    )
)]
async fn cancel(Acting(visible): Acting<COLLABORATOR>) -> Result<impl IntoResponse> {
    let Visible { state, item, .. } = visible;
    state.sessions().cancel(&item).await?;
    Ok((StatusCode::ACCEPTED, Json(json!({}))))
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = ModeChange)]
struct ModeBody {
    /// One of the conversation's `modes.availableModes[].id` (another is
    /// 409 `not_offered`).
    #[schema(
        min_length = 1,
        max_length = 200,
        pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$"
    )]
    mode_id: String,
}

/// Changes the session mode (`session/set_mode`), between turns or during
/// one; recorded as a `mode_changed` event.
#[utoipa::path(
    post, operation_id = "setMode", path = "/api/v1/conversations/{id}/mode", tag = "settings",
    params(ConversationPath),
    request_body = ModeBody,
    responses(
        (status = 200, description = "The agent accepted", body = ConversationView),
        NoConversation,
        SettingChange,
        (status = 422, description = "Invalid input"),
        AtCapacity,
        AgentTimeout,
    )
)]
async fn set_mode(
    Acting(visible): Acting<COLLABORATOR>,
    AppJson(body): AppJson<ModeBody>,
) -> Result<Json<Conversation>> {
    limits::id("mode_id", &body.mode_id, limits::SETTING_ID_MAX_CHARS)?;
    change(visible, Setting::Mode(body.mode_id)).await
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = ConfigOptionChange)]
struct ConfigOptionBody {
    /// One of the conversation's `config_options[].id` (another is 409
    /// `not_offered`).
    #[schema(
        min_length = 1,
        max_length = 200,
        pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$"
    )]
    config_id: String,
    /// A value the option offers: a string for a `select`, a boolean for a
    /// `boolean` option (another is 409 `not_offered`).
    #[schema(value_type = SettingChoice)]
    value: Value,
}

/// A value to set an option to, as the document states it: a select's
/// value id (one line, at most 200 characters) or a boolean.
struct SettingChoice;

impl utoipa::PartialSchema for SettingChoice {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Type};
        OneOfBuilder::new()
            .description(Some(
                "A select's value id (one line, at most 200 characters), or a boolean.",
            ))
            .item(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .max_length(Some(limits::SETTING_ID_MAX_CHARS))
                    .pattern(Some(limits::LINE_PATTERN)),
            )
            .item(ObjectBuilder::new().schema_type(Type::Boolean))
            .into()
    }
}

impl ToSchema for SettingChoice {
    fn name() -> std::borrow::Cow<'static, str> {
        "SettingChoice".into()
    }
}

/// Sets a session configuration option (`session/set_config_option`), e.g.
/// the model; recorded as a `config_option_changed` event.
#[utoipa::path(
    post, operation_id = "setConfigOption", path = "/api/v1/conversations/{id}/config-options", tag = "settings",
    params(ConversationPath),
    request_body = ConfigOptionBody,
    responses(
        (status = 200, description = "The agent accepted; the conversation carries the options it answered with", body = ConversationView),
        NoConversation,
        SettingChange,
        (status = 422, description = "Invalid input"),
        AtCapacity,
        AgentTimeout,
    )
)]
async fn set_config_option(
    Acting(visible): Acting<COLLABORATOR>,
    AppJson(body): AppJson<ConfigOptionBody>,
) -> Result<Json<Conversation>> {
    limits::id("config_id", &body.config_id, limits::SETTING_ID_MAX_CHARS)?;
    match &body.value {
        Value::String(v) => limits::line("value", v, limits::SETTING_ID_MAX_CHARS)?,
        Value::Bool(_) => {}
        _ => {
            return Err(Error::Unprocessable(
                "value must be a string or a boolean".into(),
            ))
        }
    }
    let setting = Setting::ConfigOption {
        config_id: body.config_id,
        value: body.value,
    };
    change(visible, setting).await
}

/// Asks the agent for `setting`, and answers the conversation as it is then.
async fn change(visible: Visible<Conversation>, setting: Setting) -> Result<Json<Conversation>> {
    let Visible {
        state,
        caller,
        item: conversation,
    } = visible;
    state
        .sessions()
        .change(&conversation, setting, caller.decided_by())
        .await?;
    Conversation::find(&state, &caller, conversation.id)
        .await
        .map(Json)
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct MessagesQuery {
    /// Messages after this one (its id: the previous page's `next_cursor`);
    /// default: from the first.
    after: Option<Uuid>,
    /// 1 to 10000 (default 1000).
    #[param(minimum = 1, maximum = 10000)]
    limit: Option<i64>,
}

/// The conversation's messages, oldest first: consecutive chunks of one
/// role within a turn form one message. Paged like events: a page holds at
/// most `limit` messages and `max_page_bytes` of JSON (at least one
/// message); `next_cursor`, when set, is the `after` of the next page.
#[utoipa::path(
    get, operation_id = "listMessages", path = "/api/v1/conversations/{id}/messages", tag = "conversations",
    params(ConversationPath, MessagesQuery),
    responses(
        (status = 200, description = "A page; `next_cursor` (a message id, for `after`) when the page stopped at `limit` or at `max_page_bytes`", body = MessageList),
        NoConversation,
        InvalidPage,
    )
)]
async fn messages(
    Visible { state, item, .. }: Visible<Conversation>,
    AppQuery(q): AppQuery<MessagesQuery>,
) -> Result<Json<Page<Message>>> {
    let limit = checked_limit(q.limit)?;
    let page = state
        .store()
        .list_messages_page(item.id, q.after, limit, state.config().max_page_bytes)
        .await?;
    Ok(paged(page, |m| m.id.to_string()))
}

/// The conversation's tool calls, each as every update left it.
#[utoipa::path(
    get, operation_id = "listToolCalls", path = "/api/v1/conversations/{id}/tool-calls", tag = "conversations",
    params(ConversationPath),
    responses(
        (status = 200, description = "Every tool call", body = ToolCallList),
        NoConversation,
    )
)]
async fn tool_calls(
    Visible { state, item, .. }: Visible<Conversation>,
) -> Result<Json<Page<ToolCall>>> {
    let items = state.store().list_tool_calls(item.id).await?;
    Ok(whole(items))
}

/// The files the agent wrote through the gateway (`fs/write_text_file`),
/// one item per write with its diff: a change list without replaying events.
#[utoipa::path(
    get, operation_id = "listFileChanges", path = "/api/v1/conversations/{id}/files", tag = "conversations",
    params(ConversationPath, EventsQuery),
    responses(
        (status = 200, description = "A page of writes, oldest first; `next_cursor` (a seq, for `after`) when the page stopped at `limit` or at `max_page_bytes`", body = FileChangeList),
        NoConversation,
        InvalidPage,
    )
)]
async fn files(
    Visible { state, item, .. }: Visible<Conversation>,
    AppQuery(q): AppQuery<EventsQuery>,
) -> Result<Json<Page<FileChange>>> {
    let (after, limit) = q.checked()?;
    let page = state
        .store()
        .list_events_of_type(
            item.id,
            event_type::FILE_WRITTEN,
            after,
            limit,
            state.config().max_page_bytes,
        )
        .await?;
    Ok(paged_as(
        page,
        |e| e.seq.to_string(),
        |event| {
            // A stand-in too, where it still has the members of one.
            let EventBody::FileWritten(written) = event.body.lenient() else {
                return None;
            };
            Some(FileChange {
                seq: event.seq,
                at: event.at,
                written,
            })
        },
    ))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct EventsQuery {
    /// Events with a greater seq (default 0: from the first).
    #[param(minimum = 0)]
    after: Option<i64>,
    /// 1 to 10000 (default 1000).
    #[param(minimum = 1, maximum = 10000)]
    limit: Option<i64>,
}

impl EventsQuery {
    /// `after` and `limit`, defaulted and checked.
    pub(super) fn checked(&self) -> Result<(i64, i64)> {
        let after = self.after.unwrap_or(0);
        if after < 0 {
            return Err(Error::Unprocessable("after must not be negative".into()));
        }
        Ok((after, checked_limit(self.limit)?))
    }
}

/// A page's `limit`: 1 to 10000, default 1000.
fn checked_limit(limit: Option<i64>) -> Result<i64> {
    let limit = limit.unwrap_or(1000);
    if !(1..=10_000).contains(&limit) {
        return Err(Error::Unprocessable(
            "limit must be between 1 and 10000".into(),
        ));
    }
    Ok(limit)
}

/// The conversation's events with `seq > after`, ascending. A page holds
/// at most `limit` events and `max_page_bytes` of JSON (at least one
/// event).
#[utoipa::path(
    get, operation_id = "listEvents", path = "/api/v1/conversations/{id}/events", tag = "events",
    params(ConversationPath, EventsQuery),
    responses(
        (status = 200, description = "A page; `next_cursor` is its last seq when the page stopped at `limit` or at `max_page_bytes`", body = EventList),
        NoConversation,
        InvalidPage,
    )
)]
async fn events(
    Visible { state, item, .. }: Visible<Conversation>,
    AppQuery(q): AppQuery<EventsQuery>,
) -> Result<Json<Page<Event>>> {
    let (after, limit) = q.checked()?;
    let page = state
        .store()
        .list_events_page(item.id, after, limit, state.config().max_page_bytes)
        .await?;
    Ok(paged(page, |e| e.seq.to_string()))
}

/// The answers remembered for the conversation ("always" answers).
#[utoipa::path(
    get, operation_id = "listRules", path = "/api/v1/conversations/{id}/rules", tag = "permissions",
    params(ConversationPath),
    responses(
        (status = 200, description = "Every remembered answer", body = RuleList),
        NoConversation,
    )
)]
async fn list_rules(
    Visible { state, item, .. }: Visible<Conversation>,
) -> Result<Json<Page<Rule>>> {
    let items = state.store().list_rules(item.id).await?;
    Ok(whole(items))
}

/// One remembered answer.
#[utoipa::path(
    get, operation_id = "getRule", path = "/api/v1/conversations/{id}/rules/{rule_id}", tag = "permissions",
    params(RulePath),
    responses(
        (status = 200, description = "The rule", body = Rule),
        NoRule,
    )
)]
async fn show_rule(
    Visible { state, .. }: Visible<Conversation>,
    AppPath((id, rule_id)): AppPath<(Uuid, Uuid)>,
) -> Result<Json<Rule>> {
    state
        .store()
        .list_rules(id)
        .await?
        .into_iter()
        .find(|r| r.id == rule_id)
        .map(Json)
        .ok_or_else(|| no_rule(id, rule_id))
}

fn no_rule(id: Uuid, rule_id: Uuid) -> Error {
    Error::NotFound(format!("no rule {rule_id} in conversation {id}"))
}

/// Forgets every remembered rule of the conversation.
#[utoipa::path(
    delete, operation_id = "forgetRules", path = "/api/v1/conversations/{id}/rules", tag = "permissions",
    params(ConversationPath),
    responses(
        (status = 204, description = "Forgotten"),
        NoConversation,
    )
)]
async fn forget_rules(Acting(visible): Acting<OWNER>) -> Result<StatusCode> {
    let Visible { state, item, .. } = visible;
    let id = item.id;
    for rule in state.store().list_rules(id).await? {
        state.store().delete_rule(id, rule.id).await?;
    }
    Ok(StatusCode::NO_CONTENT)
}

/// Forgets one remembered rule.
#[utoipa::path(
    delete, operation_id = "forgetRule", path = "/api/v1/conversations/{id}/rules/{rule_id}", tag = "permissions",
    params(RulePath),
    responses(
        (status = 204, description = "Forgotten"),
        NoRule,
    )
)]
async fn forget_rule(
    Acting(visible): Acting<OWNER>,
    AppPath((id, rule_id)): AppPath<(Uuid, Uuid)>,
) -> Result<StatusCode> {
    let Visible { state, .. } = visible;
    let deleted = state.store().delete_rule(id, rule_id).await?;
    no_content_if(deleted, || no_rule(id, rule_id))
}
