//! The OpenAPI document: what the routers declare with `#[utoipa::path]`
//! (so a route cannot go undocumented), plus what no handler returns
//! directly: problem details on every error, the events (documented by
//! [`crate::model::Event`] itself) and the WebSocket frames. `acp-gateway openapi` prints it; `openapi/openapi.yaml` is that
//! output, committed, and `GET /api/v1/openapi.json` serves it.

use serde::Serialize;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{Content, RefOr};
use utoipa::{Modify, OpenApi, ToSchema};

use crate::model::{
    ConversationView, Event, FileChange, Member, Message, PermissionRequest, Question,
    QueuedPrompt, Rule, ToolCall,
};
use crate::store::TokenInfo;

/// The document's fixed parts; the paths come from the routers.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "acp-gateway",
        description = "AI coding agents (Agent Client Protocol) behind REST and WebSocket. \
            Errors are RFC 9457 problem details (`application/problem+json`) with a stable \
            `code`. Ids are UUIDs (v7), times RFC 3339 UTC. ACP objects that pass through \
            (updates, tool calls, content blocks, permission options, modes, configuration \
            options) keep ACP's camelCase, verbatim.",
        license(name = "Apache-2.0", identifier = "Apache-2.0")
    ),
    components(schemas(
        Problem,
        Event,
        InboxSnapshot,
        Message,
        ToolCall,
        PermissionRequest,
    )),
    tags(
        (name = "health", description = "Liveness, readiness and metrics (no token needed)"),
        (name = "agents", description = "The agent profiles this gateway runs"),
        (name = "conversations", description = "ACP sessions with their persisted history"),
        (name = "members", description = "Conversations shared with other users, each with a role"),
        (name = "settings", description = "What an agent reports about its session, and changing it"),
        (name = "events", description = "The event log, over REST and WebSocket"),
        (name = "permissions", description = "The agents' permission requests and their answers"),
        (name = "changes", description = "A conversation made on a repository: what its worktree changed, and committing, landing and discarding it"),
        (name = "questions", description = "The agents' questions to a person (ACP elicitation) and their answers"),
        (name = "usage", description = "What the agents spent, from every usage report they sent"),
        (name = "policies", description = "Operator rules that answer permission requests"),
        (name = "tokens", description = "Bearer tokens and users (operators only)"),
        (name = "budgets", description = "What agents may spend (`[[budgets]]`), where the caller stands, and operators' exceptions"),
        (name = "acp", description = "The gateway as an ACP agent: ACP clients (IDEs, SDK clients) over WebSocket"),
        (name = "share-links", description = "Read-only share links of a conversation: made, listed and revoked by its owner, and what their holders see (no bearer token); off unless the operator enables `share_links`"),
        (name = "notifications", description = "Where a user is notified, what was delivered, and answering a permission request from a notification (single-use action URLs, no bearer token)"),
    )
)]
pub struct ApiDoc;

/// Completes the document once the routers added their paths: the bearer
/// scheme, required everywhere but where an operation says otherwise, and
/// problem details on every error response that names no other content.
pub fn finish(doc: &mut utoipa::openapi::OpenApi) {
    Finishing.modify(doc)
}

struct Finishing;

impl Modify for Finishing {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "A token from `acp-gateway token create` or POST /api/v1/tokens. \
                         Not needed while no token exists (open mode, loopback only).",
                    ))
                    .build(),
            ),
        );
        doc.security = Some(vec![utoipa::openapi::security::SecurityRequirement::new(
            "bearer",
            Vec::<String>::new(),
        )]);
        let problem = Content::new(Some(RefOr::Ref(utoipa::openapi::Ref::from_schema_name(
            "Problem",
        ))));
        for item in doc.paths.paths.values_mut() {
            for operation in item.operations_mut() {
                // What any operation may answer, besides its own.
                let public = operation.security.is_some();
                let with_body = operation.request_body.is_some();
                let common = [
                    (
                        !public,
                        "401",
                        "No valid bearer token (once any token exists)",
                    ),
                    (with_body, "400", "Malformed JSON (`malformed_json`)"),
                    (with_body, "413", "The body is larger than `max_body_bytes`"),
                    (
                        with_body,
                        "415",
                        "The body is not JSON (`unsupported_media_type`)",
                    ),
                    (
                        !public,
                        "500",
                        "Internal error (the gateway's log says more)",
                    ),
                    (
                        !public,
                        "503",
                        "The database is unreachable (`database_unavailable`); try again",
                    ),
                ];
                let responses = &mut operation.responses.responses;
                for (applies, status, description) in common {
                    if applies && !responses.contains_key(status) {
                        responses.insert(
                            status.to_owned(),
                            RefOr::T(utoipa::openapi::Response::new(description)),
                        );
                    }
                }
                for (status, response) in operation.responses.responses.iter_mut() {
                    let is_error = status.starts_with('4') || status.starts_with('5');
                    if let (true, RefOr::T(response)) = (is_error, response) {
                        if response.content.is_empty() {
                            response.content.insert(
                                "application/problem+json".into(),
                                RefOr::T(problem.clone()),
                            );
                        }
                    }
                }
            }
        }
    }
}

/// Methods on a path item, whichever are set.
trait Operations {
    fn operations_mut(&mut self) -> Vec<&mut utoipa::openapi::path::Operation>;
}

impl Operations for utoipa::openapi::PathItem {
    fn operations_mut(&mut self) -> Vec<&mut utoipa::openapi::path::Operation> {
        [
            &mut self.get,
            &mut self.put,
            &mut self.post,
            &mut self.delete,
            &mut self.patch,
        ]
        .into_iter()
        .filter_map(Option::as_mut)
        .collect()
    }
}

/// An RFC 9457 problem: every error the API answers.
#[derive(Serialize, ToSchema)]
pub struct Problem {
    /// `urn:acp-gateway:problem:<code>`.
    #[schema(example = "urn:acp-gateway:problem:not_found")]
    r#type: String,
    /// The HTTP status' reason phrase.
    title: String,
    status: u16,
    /// What went wrong, for a person (for an agent failure: its cause and the
    /// agent's last stderr lines).
    detail: String,
    /// Stable, snake_case: `malformed_json`, `unsupported_media_type`,
    /// `payload_too_large`, `invalid_request`, `not_found`, `unauthorized`,
    /// `forbidden`, `rate_limited`, `turn_in_progress`, `conversation_closed`,
    /// `agent_unavailable`, `already_resolved`, `agent_gone`, `agent_away`, `duplicate_name`,
    /// `agent_failed`, `agent_timeout`, `at_capacity`, `database_unavailable`,
    /// `unavailable`, `gone`, `internal_error`, `not_offered`,
    /// `not_a_websocket_handshake`, `not_configured`, `unresolvable_host`,
    /// `too_many_targets`, `not_acceptable`, `not_implemented`,
    /// `acp_stream_open`, `not_supported`, `already_held`,
    /// `share_links_disabled`.
    #[schema(example = "not_found")]
    code: String,
    /// With `already_resolved`: the request as it stands.
    #[schema(nullable = false)]
    request: Option<PermissionRequest>,
}

/// Defines the schema of a list of `$item`s (a [`crate::model::Page`]).
macro_rules! list {
    ($(#[$doc:meta])* $name:ident, $item:ty) => {
        $(#[$doc])*
        #[derive(Serialize, ToSchema)]
        #[allow(dead_code)]
        pub struct $name {
            items: Vec<$item>,
            /// The cursor of the next page; `null` on the last.
            next_cursor: Option<String>,
        }
    };
}

list!(
    /// Conversations, newest first.
    ConversationList, ConversationView
);

list!(
    /// Messages, oldest first.
    MessageList, Message
);
list!(
    /// Tool calls, oldest first.
    ToolCallList, ToolCall
);
list!(
    /// Events, ascending by seq.
    EventList, Event
);
list!(
    /// Files the agent wrote through the gateway, oldest first.
    FileChangeList, FileChange
);
list!(
    /// Remembered answers, oldest first.
    RuleList, Rule
);
list!(
    /// A conversation's queued prompts, the next first.
    QueuedPromptList, QueuedPrompt
);
list!(
    /// A conversation's members, in the order they were added.
    MemberList, Member
);
list!(
    /// Permission requests, oldest first.
    PermissionRequestList, PermissionRequest
);
list!(
    /// The agents' questions, oldest first.
    QuestionList, Question
);
list!(
    /// Tokens, oldest first.
    TokenList, TokenInfo
);

/// An ACP content block (`text`, `image`, `audio`, `resource_link`,
/// `resource`), verbatim: its `type` says which.
#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
pub struct ContentBlock {
    r#type: String,
}

/// The first frame of `GET /api/v1/ws`: what waits for an answer now.
/// Events of every conversation the caller can see follow, one per frame.
#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
pub struct InboxSnapshot {
    r#type: SnapshotType,
    pending_permissions: Vec<PermissionRequest>,
}

#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
pub enum SnapshotType {
    #[serde(rename = "snapshot")]
    Snapshot,
}
