//! The embedded backend of [`Store`](super::Store): SQLite in one file, so a
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

use super::backend::{Batch, ConversationPatch, Lanes, Resolution};
use super::rows::{text_col, JsonText};
use super::search::{search_text, SEARCH_TEXT_MAX};
use super::sql::{impl_store, search_text_append, tool_call_update};
use crate::error::Result;
use crate::model::{Event, MessagePart, PermissionRequest, ToolCall, UsageRecord};

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

/// SQLite's commit: the batch in one transaction, a statement a row
/// (SQLite runs in the process: a statement costs no round trip). It writes
/// what Postgres' commit (`write_batch` in `postgres.rs`) writes, with the
/// same checks: the fence first (a conversation another node claimed gets
/// nothing, and [`crate::error::Error::Fenced`]); without the
/// conversation's state (a piece of a refused batch), its `last_seq` still
/// moves up to the batch's events.
async fn write_batch(writer: &SqlitePool, conversation_id: Uuid, batch: &Batch) -> Result<()> {
    let mut tx = writer.begin().await?;
    fence(&mut tx, conversation_id, batch.fence).await?;
    for request in &batch.new_permissions {
        insert_permission(&mut tx, request).await?;
    }
    for event in &batch.events {
        insert_event(&mut tx, conversation_id, event).await?;
    }
    for part in &batch.messages {
        insert_message_part(&mut tx, conversation_id, part).await?;
    }
    for call in &batch.tool_calls {
        upsert_tool_call(&mut tx, conversation_id, call).await?;
    }
    for record in &batch.usage {
        insert_usage(&mut tx, conversation_id, record).await?;
    }
    match (&batch.conversation, batch.events.last()) {
        (Some(patch), _) => update_conversation(&mut tx, conversation_id, patch).await?,
        // A piece of a refused batch: `last_seq` keeps up with
        // its events (see `Store::commit`).
        (None, Some(newest)) => {
            sqlx::query("update conversations set last_seq = $2 where id = $1 and last_seq < $2")
                .bind(conversation_id)
                .bind(newest.seq)
                .execute(&mut *tx)
                .await?;
        }
        (None, None) => {}
    }
    if let Some(link) = &batch.link {
        sqlx::query("update agent_processes set link = $2 where conversation_id = $1")
            .bind(conversation_id)
            .bind(JsonText::of(link))
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(())
}

async fn insert_permission(tx: &mut SqliteConnection, p: &PermissionRequest) -> Result<()> {
    sqlx::query(
        "insert into permission_requests (id, conversation_id, turn_id,
           tool_call, options, status, decision, created_at, kind)
         values ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
    )
    .bind(p.id)
    .bind(p.conversation_id)
    .bind(p.turn_id)
    .bind(JsonText::of(&p.tool_call))
    .bind(JsonText::of(&p.options))
    .bind(p.status.as_str())
    .bind(p.decision.as_ref().map(JsonText::of))
    .bind(p.created_at)
    .bind(p.kind.as_str())
    .execute(tx)
    .await?;
    Ok(())
}

/// A message's first part makes its row, a later one a row of its own;
/// either way its text is added to the message's search text (up to a cap,
/// so a huge message costs no more). Idempotent: a commit retried after its
/// answer was lost must not fail on what it wrote (it may add its part's
/// text twice: found twice, nothing worse).
async fn insert_message_part(
    tx: &mut SqliteConnection,
    conversation_id: Uuid,
    MessagePart {
        part,
        message: m,
        content_in_event,
    }: &MessagePart,
) -> Result<()> {
    let query = if *part == 0 {
        // A prompt's content is its event's: not stored again.
        let content = match content_in_event {
            Some(_) => JsonText("[]".into()),
            None => JsonText::of(&m.content),
        };
        sqlx::query(
            "insert into messages (id, conversation_id, turn_id, role, content,
               created_at, prompt_seq)
             values ($1, $2, $3, $4, $5, $6, $7)
             on conflict (id) do nothing",
        )
        .bind(m.id)
        .bind(conversation_id)
        .bind(m.turn_id)
        .bind(m.role.as_str())
        .bind(content)
        .bind(m.created_at)
        .bind(*content_in_event)
    } else {
        sqlx::query(
            "insert into message_parts (conversation_id, message_id, part, content)
             values ($1, $2, $3, $4)
             on conflict do nothing",
        )
        .bind(conversation_id)
        .bind(m.id)
        .bind(*part)
        .bind(JsonText::of(&m.content))
    };
    query.execute(&mut *tx).await?;
    let text = search_text(&m.content);
    if !text.is_empty() {
        sqlx::query(concat!(
            "insert into search_texts (message_id, conversation_id, body)
             values ($1, $2, $3) ",
            search_text_append!(),
            "$4"
        ))
        .bind(m.id)
        .bind(conversation_id)
        .bind(text_col(&text))
        .bind(SEARCH_TEXT_MAX as i64)
        .execute(&mut *tx)
        .await?;
    }
    Ok(())
}

async fn upsert_tool_call(
    tx: &mut SqliteConnection,
    conversation_id: Uuid,
    t: &ToolCall,
) -> Result<()> {
    sqlx::query(concat!(
        "insert into tool_calls (conversation_id, tool_call_id, turn_id, title, kind,
           status, content, locations, raw_input, raw_output, created_at, updated_at)
         values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) ",
        tool_call_update!()
    ))
    .bind(conversation_id)
    .bind(text_col(&t.tool_call_id))
    .bind(t.turn_id)
    .bind(t.title.as_deref().map(text_col))
    .bind(t.kind.as_deref().map(text_col))
    .bind(t.status.as_deref().map(text_col))
    .bind(t.content.as_ref().map(JsonText::of))
    .bind(t.locations.as_ref().map(JsonText::of))
    .bind(t.raw_input.as_ref().map(JsonText::of))
    .bind(t.raw_output.as_ref().map(JsonText::of))
    .bind(t.created_at)
    .bind(t.updated_at)
    .execute(tx)
    .await?;
    Ok(())
}

/// A usage report kept (see [`super::usage`]); idempotent, as a commit
/// retried after its answer was lost writes it again.
async fn insert_usage(
    tx: &mut SqliteConnection,
    conversation_id: Uuid,
    r: &UsageRecord,
) -> Result<()> {
    super::usage::bind_usage!(sqlx::query(super::usage::INSERT_USAGE), r, conversation_id)
        .execute(tx)
        .await?;
    Ok(())
}

/// A usage record's day (UTC, `YYYY-MM-DD`): its time is stored as RFC 3339
/// text in UTC.
const USAGE_DAY: &str = "substr(at, 1, 10)";

/// The selected usage records' cost increases summed, as a float (`total`
/// is one, 0.0 for none; `sum` of whole numbers is an integer).
const USAGE_SUM: &str = "total(delta)";

/// What conversation `c` spent, per currency: a JSON array of `{currency,
/// amount}` ordered by currency (`[]`: nothing).
const CONVERSATION_SPEND: &str = "(select json_group_array(json_object('currency', s.currency,
       'amount', s.amount))
     from (select cost_currency as currency, total(delta) as amount from usage_records u
           where u.conversation_id = c.id and u.cost_currency is not null
           group by cost_currency order by cost_currency) s)";

impl_store!(SqliteStore, SqliteConnection);
// One node at a time: a claim of another node is one of a previous run.
super::notify::impl_notify_store!(SqliteStore, "claimed_by <> $4", "");
