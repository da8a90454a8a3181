//! The Postgres backend of [`Store`]: for teams, and for several
//! gateway nodes sharing one database.

use sqlx::postgres::{PgConnection, PgPool, PgPoolOptions};
use uuid::Uuid;

use super::backend::{
    Batch, ConversationPatch, PermissionFilter, PolicySet, Resolution, Store, TokenInfo,
};
use super::rows::{
    text_col, ConversationRow, EventRow, JsonText, MessagePartRow, MessageRow, PermissionRow,
    PolicySetRow, RuleRow, TokenRow, ToolCallRow,
};
use super::sql::impl_store;
use crate::error::Result;
use crate::model::Rule;
use crate::model::{Conversation, Event, Message, MessagePart, PermissionRequest, ToolCall};

/// Migrations embedded in the binary.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

/// Postgres storage over a connection pool.
#[derive(Clone)]
pub struct PgStore {
    pool: PgPool,
}

impl PgStore {
    /// Connects, creating the database if it does not exist yet (so a fresh
    /// Postgres needs no setup), and applies pending migrations.
    pub async fn open(url: &str) -> anyhow::Result<PgStore> {
        use anyhow::Context;
        use sqlx::migrate::MigrateDatabase;
        if !sqlx::Postgres::database_exists(url).await.unwrap_or(true) {
            tracing::info!("creating the database");
            sqlx::Postgres::create_database(url)
                .await
                .context("Failed to create the database")?;
        }
        let pool = PgPoolOptions::new()
            .max_connections(16)
            // Short: while Postgres is unreachable a session's writer holds
            // its writes and tries again later, and meanwhile keeps serving.
            .acquire_timeout(std::time::Duration::from_secs(2))
            .connect(url)
            .await
            .context("Failed to connect to Postgres")?;
        MIGRATOR
            .run(&pool)
            .await
            .context("Failed to apply database migrations")?;
        Ok(PgStore { pool })
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Writes share the pool: Postgres locks rows, not the database.
    fn writer(&self) -> &PgPool {
        &self.pool
    }
}

/// A whole batch of events in one statement.
async fn insert_events(
    tx: &mut PgConnection,
    conversation_id: Uuid,
    events: &[Event],
) -> Result<()> {
    if events.is_empty() {
        return Ok(());
    }
    let seqs: Vec<i64> = events.iter().map(|e| e.seq).collect();
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
    let ats: Vec<_> = events.iter().map(|e| e.at).collect();
    let data: Vec<JsonText> = events.iter().map(|e| JsonText::of(&e.data)).collect();
    sqlx::query(
        "insert into events (conversation_id, seq, type, at, data)
         select $1, * from unnest($2::bigint[], $3::text[], $4::timestamptz[], $5::json[])",
    )
    .bind(conversation_id)
    .bind(&seqs)
    .bind(&kinds)
    .bind(&ats)
    .bind(&data)
    .execute(tx)
    .await?;
    Ok(())
}

impl_store!(PgStore, PgConnection);
