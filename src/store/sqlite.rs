//! The embedded backend of [`Store`]: SQLite in one file, so a
//! gateway on a laptop needs nothing installed. WAL mode and a busy timeout
//! let concurrent writers wait for each other instead of failing.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteSynchronous,
};
use uuid::Uuid;

use super::backend::{
    json_size, Batch, Bounded, ConversationPatch, Lanes, PermissionFilter, PolicySet, Resolution,
    Store,
};
use super::rows::{
    text_col, ConversationRow, EventRow, JsonText, MessagePartRow, MessageRow, PermissionRow,
    PolicySetRow, RuleRow, ToolCallRow,
};
use super::sql::impl_store;
use crate::error::Result;
use crate::model::Rule;
use crate::model::{Conversation, Event, Message, MessagePart, PermissionRequest, ToolCall};

/// Migrations embedded in the binary.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");

/// How long a writer waits for another one before giving up.
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// SQLite storage over a connection pool.
#[derive(Clone)]
pub struct SqliteStore {
    /// For reads: in WAL mode they never wait for a writer.
    pool: SqlitePool,
    /// For writes: one connection. SQLite takes one writer at a time; left
    /// to compete, writers on several connections wait in its busy handler,
    /// which sleeps (up to 100 ms a try) instead of queueing. Here they
    /// queue for the connection, in order, and none sleeps.
    writer: SqlitePool,
    /// Agents' commits take one place: a person's write waits for at most
    /// one of theirs.
    lanes: Lanes,
}

impl SqliteStore {
    /// Opens (creating the file and its directory if needed) and migrates.
    pub async fn open(url: &str) -> anyhow::Result<SqliteStore> {
        use anyhow::Context;
        let options = SqliteConnectOptions::from_str(url)
            .with_context(|| format!("Invalid SQLite URL {url:?}"))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(BUSY_TIMEOUT)
            .foreign_keys(true);
        if let Some(dir) = Path::new(options.get_filename()).parent() {
            if !dir.as_os_str().is_empty() {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("Failed to create {}", dir.display()))?;
            }
        }
        // A SQLite connection is a file open in this process: nothing
        // breaks it while it waits in the pool, and sqlx's test before each
        // use (on by default) is one more hand-off to the driver's thread
        // per statement. (sqlx still tests it when it is given back.)
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .test_before_acquire(false)
            .acquire_timeout(BUSY_TIMEOUT)
            .connect_with(options.clone())
            .await
            .with_context(|| format!("Failed to open SQLite database {url}"))?;
        MIGRATOR
            .run(&writer)
            .await
            .context("Failed to apply database migrations")?;
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .test_before_acquire(false)
            .acquire_timeout(BUSY_TIMEOUT)
            .connect_with(options)
            .await
            .with_context(|| format!("Failed to open SQLite database {url}"))?;
        Ok(SqliteStore {
            pool,
            writer,
            lanes: Lanes::new(1),
        })
    }

    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    fn writer(&self) -> &SqlitePool {
        &self.writer
    }
}

/// Events one statement each: SQLite runs in-process, a statement is cheap,
/// and the transaction around the batch makes it one write.
/// The title the agent gave conversation `c` (its `session_info_update`).
const AGENT_TITLE: &str = "json_extract(c.agent_state, '$.title')";

/// A `search_texts s` row whose words include all of `$1`'s (FTS5).
const SEARCH_MATCH: &str = "s.rowid in (select rowid from search_fts where search_fts match $1)";

/// The words as an FTS5 query: each a quoted string (so nothing in it is
/// query syntax), all required.
fn search_query(words: &[String]) -> String {
    words
        .iter()
        .map(|w| format!("\"{}\"", w.replace('"', "\"\"")))
        .collect::<Vec<_>>()
        .join(" ")
}

async fn insert_events(
    tx: &mut SqliteConnection,
    conversation_id: Uuid,
    events: &[Event],
) -> Result<()> {
    for e in events {
        sqlx::query(
            "insert into events (conversation_id, seq, type, at, data) values ($1, $2, $3, $4, $5)",
        )
        .bind(conversation_id)
        .bind(e.seq)
        .bind(e.body.kind())
        .bind(e.at)
        .bind(JsonText::of(&e.body.data()))
        .execute(&mut *tx)
        .await?;
    }
    Ok(())
}

/// SQLite runs in-process: the transaction costs no round trips to save.
async fn resolve_at_once(
    _: &SqlitePool,
    _: &Resolution,
    _: &Event,
    _: &ConversationPatch,
    _: Option<i64>,
) -> Result<Option<Event>> {
    Ok(None)
}

/// SQLite runs in the process: a statement costs no round trip, so the
/// general transaction writes every batch.
async fn commit_at_once(_: &SqlitePool, _: Uuid, _: &Batch) -> Result<bool> {
    Ok(false)
}

impl_store!(SqliteStore, SqliteConnection);
super::tokens::impl_token_store!(SqliteStore);
// One node at a time: a claim of another node is one of a previous run.
super::notify::impl_notify_store!(SqliteStore, "claimed_by <> $4", "");
