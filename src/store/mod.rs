//! Persistence behind one trait, so that a second backend (an embedded one)
//! can be added without touching the API or the ACP code.
//!
//! Writes are shaped for streaming: a conversation's single writer (its
//! session task) collects events, merged messages, tool-call states and new
//! permission requests into a [`Batch`] and commits it in one transaction,
//! instead of one round-trip per streamed chunk.
//!
//! [`Store`] is in parts: conversations, events and permissions in
//! `backend.rs` (their SQL in `sql.rs`), users and tokens in [`tokens`],
//! notifications in [`notify`].
//!
//! The store is the only place that runs SQL: what gateway nodes sharing a
//! database keep there is [`cluster`] ([`ClusterStore`], reached through
//! [`Store`]'s [`Clustered::cluster`], on the store's own pool); what a
//! database URL names is read by the config ([`Backend::of`]). What was
//! written before search existed is indexed in the background by
//! [`search_backlog`].

mod cluster_pg;
pub mod sqlite;
pub mod postgres;
mod sql;
pub mod export;
pub mod search_backlog;
mod rows;
mod backend;
pub mod tokens;
pub mod notify;
pub mod cluster;

pub use crate::config::url::{redact_url, sqlite_file, Backend};
pub use backend::{
    json_size, AgentLink, AgentProcessRecord, Batch, Bounded, ConversationPatch, Lane,
    PermissionFilter, PolicySet, Resolution, Store,
};
pub use backend::{search_words, SEARCH_TEXT_MAX};
pub use cluster::{ClusterStore, Clustered};
pub use notify::ActionToken;
pub use postgres::PgStore;
pub use sqlite::SqliteStore;
pub use tokens::{TokenInfo, TokenStore};

/// Opens the store a database URL names (`postgres://…` or `sqlite://PATH`),
/// creating the database if needed and applying its migrations.
pub async fn open(url: &str) -> anyhow::Result<std::sync::Arc<dyn Store>> {
    match Backend::of(url)? {
        Backend::Sqlite => Ok(std::sync::Arc::new(SqliteStore::open(url).await?)),
        Backend::Postgres => Ok(std::sync::Arc::new(PgStore::open(url).await?)),
    }
}
