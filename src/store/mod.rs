//! Persistence behind one trait, so that a second backend (an embedded one)
//! can be added without touching the API or the ACP code.
//!
//! Writes are shaped for streaming: a conversation's single writer (its
//! session task) collects events, merged messages, tool-call states and new
//! permission requests into a [`Batch`] and commits it in one transaction,
//! instead of one round-trip per streamed chunk.

mod backend;
pub mod export;
pub mod notify;
pub mod postgres;
mod rows;
mod sql;
pub mod sqlite;

pub use backend::{
    json_size, ActionToken, AgentProcessRecord, Batch, Bounded, ConversationPatch, Lane,
    PermissionFilter, PolicySet, Resolution, Store, TokenInfo,
};
pub use postgres::PgStore;
pub use sqlite::SqliteStore;

/// Opens the store a database URL names (`postgres://…` or `sqlite://PATH`),
/// creating the database if needed and applying its migrations.
pub async fn open(url: &str) -> anyhow::Result<std::sync::Arc<dyn Store>> {
    if url.starts_with("sqlite:") {
        Ok(std::sync::Arc::new(SqliteStore::open(url).await?))
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(std::sync::Arc::new(PgStore::open(url).await?))
    } else {
        anyhow::bail!("unsupported database URL {url:?}: use postgres://… or sqlite://PATH")
    }
}
