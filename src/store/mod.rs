//! Persistence: one [`Store`] trait, through which the rest of the gateway
//! reaches the database, and two backends of it, Postgres ([`PgStore`]) and
//! an embedded SQLite file ([`SqliteStore`]), chosen by the database URL
//! (`url.rs`, [`Backend::of`]).
//!
//! Writes are shaped for streaming: a conversation's single writer (its
//! session task) collects events, merged messages, tool-call states and new
//! permission requests into a [`Batch`] and commits it at once (on Postgres
//! one statement, on SQLite one transaction), instead of one round-trip per
//! streamed chunk.
//!
//! [`Store`] (`backend.rs`: the commit and the resolution of a permission
//! request, which append to the event log) is in parts by job, its
//! supertraits: [`conversations`], [`search`], [`events`], [`messages`]
//! (and tool calls), [`permissions`] (requests, rules and policies),
//! [`processes`] (agent processes), [`usage`] (what agents spent),
//! [`notify`] (notifications), [`tokens`] (users and tokens), [`budgets`]
//! (budgets' exceptions and notices), [`share_links`] (read-only links to a
//! conversation), [`members`] (conversations shared with other users) and
//! [`cluster`]. Each part but the cluster's is
//! written once for both backends (`sql.rs` says how); what differs is in
//! [`postgres`] and [`sqlite`], each with its own commit.
//!
//! The store is the only place that runs SQL: what gateway nodes sharing a
//! database keep there is [`cluster`] ([`ClusterStore`], reached through
//! [`Store`]'s [`Clustered::cluster`], on the store's own pool; Postgres
//! only, in `cluster_pg.rs`); what a database URL names is read by the
//! config ([`Backend::of`]). What was written before search existed is
//! indexed in the background by [`search_backlog`]; [`export`] copies a
//! whole history from one store to another.

mod cluster_pg;
pub mod sqlite;
pub mod postgres;
mod sql;
pub mod export;
pub mod search_backlog;
mod backend;
pub mod conversations;
pub mod search;
pub mod events;
pub mod messages;
pub mod permissions;
pub mod processes;
pub mod usage;
mod rows;
mod page;
pub mod tokens;
pub mod budgets;
pub mod share_links;
pub mod members;
pub mod notify;
pub mod cluster;

pub use crate::config::url::{redact_url, sqlite_file, Backend};
pub use backend::{Batch, CommitQueue, ConversationPatch, Resolution, Store};
pub use budgets::{BudgetStore, SpendScope};
pub use cluster::{ClusterStore, Clustered};
pub use members::MemberStore;
pub use notify::ActionToken;
pub use page::{json_size, Bounded};
pub use permissions::{PermissionFilter, PolicySet};
pub use postgres::PgStore;
pub use processes::{AgentLink, AgentProcessRecord};
pub use search::{search_words, SEARCH_TEXT_MAX};
pub use share_links::{ShareLink, ShareLinkStore};
pub use sqlite::SqliteStore;
pub use tokens::{TokenInfo, TokenStore};
pub use usage::UsageStore;

/// Opens the store a database URL names (`postgres://…` or `sqlite://PATH`),
/// creating the database if needed and applying its migrations.
pub async fn open(url: &str) -> anyhow::Result<std::sync::Arc<dyn Store>> {
    match Backend::of(url)? {
        Backend::Sqlite => Ok(std::sync::Arc::new(SqliteStore::open(url).await?)),
        Backend::Postgres => Ok(std::sync::Arc::new(PgStore::open(url).await?)),
    }
}
