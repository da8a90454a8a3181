//! How a path names a conversation, for the OpenAPI document.

use utoipa::IntoParams;
use uuid::Uuid;

/// The conversation a path names (`AppPath<Uuid>` reads it; this type only
/// documents it: a field's doc comment is its parameter's description).
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub(crate) struct ConversationPath {
    /// The conversation
    id: Uuid,
}
