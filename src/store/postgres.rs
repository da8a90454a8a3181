//! The Postgres backend of [`Store`](super::Store).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::postgres::{PgPool, PgPoolOptions, PgRow};
use sqlx::types::Json;
use sqlx::Row;
use uuid::Uuid;

use super::{Batch, ConversationPatch, PermissionFilter, Resolution, Store};
use crate::error::Result;
use crate::model::{
    Conversation, ConversationStatus, Decision, Event, Message, PermissionRequest,
    PermissionStatus, Role, ToolCall,
};
use crate::permissions::{Rule, ToolKey};

/// Migrations embedded in the binary.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// Postgres storage over a connection pool.
#[derive(Clone)]
pub struct PgStore {
    pool: PgPool,
}

impl PgStore {
    /// Connects, creating the database if it does not exist yet (so a fresh
    /// Postgres needs no setup), without touching the schema.
    pub async fn connect(url: &str) -> anyhow::Result<PgStore> {
        use anyhow::Context;
        use sqlx::migrate::MigrateDatabase;
        if !sqlx::Postgres::database_exists(url).await.unwrap_or(true) {
            tracing::info!("creating database");
            sqlx::Postgres::create_database(url)
                .await
                .context("Failed to create the database")?;
        }
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .acquire_timeout(std::time::Duration::from_secs(10))
            .connect(url)
            .await
            .context("Failed to connect to Postgres")?;
        Ok(PgStore { pool })
    }

    /// Applies pending migrations.
    pub async fn migrate(&self) -> anyhow::Result<()> {
        use anyhow::Context;
        MIGRATOR
            .run(&self.pool)
            .await
            .context("Failed to apply database migrations")
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
}

fn conversation_from_row(row: &PgRow) -> Result<Conversation> {
    let status: String = row.try_get("status")?;
    Ok(Conversation {
        id: row.try_get("id")?,
        agent: row.try_get("agent")?,
        title: row.try_get("title")?,
        cwd: row.try_get("cwd")?,
        status: ConversationStatus::parse(&status)
            .ok_or_else(|| anyhow::anyhow!("bad conversation status {status:?} in database"))?,
        acp_session_id: row.try_get("acp_session_id")?,
        last_seq: row.try_get("last_seq")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
    })
}

fn event_from_row(row: &PgRow) -> Result<Event> {
    Ok(Event {
        seq: row.try_get("seq")?,
        conversation_id: row.try_get("conversation_id")?,
        kind: row.try_get("type")?,
        at: row.try_get("at")?,
        data: row.try_get::<Json<Value>, _>("data")?.0,
    })
}

fn message_from_row(row: &PgRow) -> Result<Message> {
    let role: String = row.try_get("role")?;
    Ok(Message {
        id: row.try_get("id")?,
        turn_id: row.try_get("turn_id")?,
        role: Role::parse(&role).ok_or_else(|| anyhow::anyhow!("bad role {role:?} in database"))?,
        content: row.try_get::<Json<Vec<Value>>, _>("content")?.0,
        created_at: row.try_get("created_at")?,
    })
}

fn tool_call_from_row(row: &PgRow) -> Result<ToolCall> {
    let json = |k: &str| -> Result<Option<Value>> {
        Ok(row.try_get::<Option<Json<Value>>, _>(k)?.map(|j| j.0))
    };
    Ok(ToolCall {
        tool_call_id: row.try_get("tool_call_id")?,
        turn_id: row.try_get("turn_id")?,
        title: row.try_get("title")?,
        kind: row.try_get("kind")?,
        status: row.try_get("status")?,
        content: json("content")?,
        locations: json("locations")?,
        raw_input: json("raw_input")?,
        raw_output: json("raw_output")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
    })
}

fn permission_from_row(row: &PgRow) -> Result<PermissionRequest> {
    let status: String = row.try_get("status")?;
    Ok(PermissionRequest {
        id: row.try_get("id")?,
        conversation_id: row.try_get("conversation_id")?,
        turn_id: row.try_get("turn_id")?,
        tool_call: row.try_get::<Json<Value>, _>("tool_call")?.0,
        options: row.try_get::<Json<Vec<Value>>, _>("options")?.0,
        status: PermissionStatus::parse(&status)
            .ok_or_else(|| anyhow::anyhow!("bad permission status {status:?} in database"))?,
        decision: row
            .try_get::<Option<Json<Decision>>, _>("decision")?
            .map(|j| j.0),
        created_at: row.try_get("created_at")?,
    })
}

fn rule_from_row(row: &PgRow) -> Result<Rule> {
    Ok(Rule {
        id: row.try_get("id")?,
        conversation_id: row.try_get("conversation_id")?,
        tool_kind: row.try_get("tool_kind")?,
        subject: row.try_get("subject")?,
        option_kind: row.try_get("option_kind")?,
        permission_id: row.try_get("permission_id")?,
        created_at: row.try_get("created_at")?,
    })
}

async fn insert_events(
    tx: &mut sqlx::PgConnection,
    conversation_id: Uuid,
    events: &[Event],
) -> Result<()> {
    if events.is_empty() {
        return Ok(());
    }
    let seqs: Vec<i64> = events.iter().map(|e| e.seq).collect();
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
    let ats: Vec<DateTime<Utc>> = events.iter().map(|e| e.at).collect();
    let data: Vec<Json<&Value>> = events.iter().map(|e| Json(&e.data)).collect();
    sqlx::query(
        "insert into events (conversation_id, seq, type, at, data)
         select $1, * from unnest($2::bigint[], $3::text[], $4::timestamptz[], $5::jsonb[])",
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

async fn update_conversation(
    tx: &mut sqlx::PgConnection,
    conversation_id: Uuid,
    patch: &ConversationPatch,
) -> Result<()> {
    sqlx::query(
        "update conversations
         set status = $2, acp_session_id = $3, last_seq = $4, current_turn_id = $5, updated_at = $6
         where id = $1",
    )
    .bind(conversation_id)
    .bind(patch.status.as_str())
    .bind(&patch.acp_session_id)
    .bind(patch.last_seq)
    .bind(patch.current_turn_id)
    .bind(patch.updated_at)
    .execute(tx)
    .await?;
    Ok(())
}

#[async_trait]
impl Store for PgStore {
    async fn ping(&self) -> Result<()> {
        sqlx::query("select 1").execute(&self.pool).await?;
        Ok(())
    }

    async fn insert_conversation(&self, c: &Conversation) -> Result<()> {
        sqlx::query(
            "insert into conversations
               (id, agent, title, cwd, status, acp_session_id, last_seq, created_at, updated_at)
             values ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        )
        .bind(c.id)
        .bind(&c.agent)
        .bind(&c.title)
        .bind(&c.cwd)
        .bind(c.status.as_str())
        .bind(&c.acp_session_id)
        .bind(c.last_seq)
        .bind(c.created_at)
        .bind(c.updated_at)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn get_conversation(&self, id: Uuid) -> Result<Option<Conversation>> {
        sqlx::query("select * from conversations where id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?
            .as_ref()
            .map(conversation_from_row)
            .transpose()
    }

    async fn list_conversations(
        &self,
        limit: i64,
        before: Option<Uuid>,
    ) -> Result<Vec<Conversation>> {
        sqlx::query(
            "select * from conversations where ($1::uuid is null or id < $1)
             order by id desc limit $2",
        )
        .bind(before)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(conversation_from_row)
        .collect()
    }

    async fn live_conversations(&self) -> Result<Vec<(Conversation, Option<Uuid>)>> {
        sqlx::query(
            "select * from conversations where status not in ('closed', 'failed') order by id",
        )
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(|row| Ok((conversation_from_row(row)?, row.try_get("current_turn_id")?)))
        .collect()
    }

    async fn commit(&self, conversation_id: Uuid, batch: &Batch) -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let mut tx = self.pool.begin().await?;
        // Permission requests first: an event announcing one must never be
        // visible without the request itself.
        for p in &batch.new_permissions {
            sqlx::query(
                "insert into permission_requests
                   (id, conversation_id, turn_id, tool_call, options, status, decision, created_at)
                 values ($1, $2, $3, $4, $5, $6, $7, $8)",
            )
            .bind(p.id)
            .bind(p.conversation_id)
            .bind(p.turn_id)
            .bind(Json(&p.tool_call))
            .bind(Json(&p.options))
            .bind(p.status.as_str())
            .bind(p.decision.as_ref().map(Json))
            .bind(p.created_at)
            .execute(&mut *tx)
            .await?;
        }
        insert_events(&mut tx, conversation_id, &batch.events).await?;
        for m in &batch.messages {
            sqlx::query(
                "insert into messages (id, conversation_id, turn_id, role, content, created_at)
                 values ($1, $2, $3, $4, $5, $6)
                 on conflict (id) do update set content = excluded.content",
            )
            .bind(m.id)
            .bind(conversation_id)
            .bind(m.turn_id)
            .bind(m.role.as_str())
            .bind(Json(&m.content))
            .bind(m.created_at)
            .execute(&mut *tx)
            .await?;
        }
        for t in &batch.tool_calls {
            sqlx::query(
                "insert into tool_calls (conversation_id, tool_call_id, turn_id, title, kind, status,
                   content, locations, raw_input, raw_output, created_at, updated_at)
                 values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
                 on conflict (conversation_id, tool_call_id) do update set
                   title = excluded.title, kind = excluded.kind, status = excluded.status,
                   content = excluded.content, locations = excluded.locations,
                   raw_input = excluded.raw_input, raw_output = excluded.raw_output,
                   updated_at = excluded.updated_at",
            )
            .bind(conversation_id)
            .bind(&t.tool_call_id)
            .bind(t.turn_id)
            .bind(&t.title)
            .bind(&t.kind)
            .bind(&t.status)
            .bind(t.content.as_ref().map(Json))
            .bind(t.locations.as_ref().map(Json))
            .bind(t.raw_input.as_ref().map(Json))
            .bind(t.raw_output.as_ref().map(Json))
            .bind(t.created_at)
            .bind(t.updated_at)
            .execute(&mut *tx)
            .await?;
        }
        if let Some(patch) = &batch.conversation {
            update_conversation(&mut tx, conversation_id, patch).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn resolve_permission(
        &self,
        resolution: &Resolution,
        mut event: Event,
        patch: &ConversationPatch,
    ) -> Result<Option<(PermissionRequest, Event)>> {
        let mut tx = self.pool.begin().await?;
        let row = sqlx::query(
            "update permission_requests set status = $2, decision = $3
             where id = $1 and status = 'pending' returning *",
        )
        .bind(resolution.permission_id)
        .bind(resolution.status.as_str())
        .bind(Json(&resolution.decision))
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let request = permission_from_row(&row)?;
        event.data = serde_json::to_value(&request).map_err(anyhow::Error::from)?;
        insert_events(&mut tx, event.conversation_id, std::slice::from_ref(&event)).await?;
        update_conversation(&mut tx, event.conversation_id, patch).await?;
        tx.commit().await?;
        Ok(Some((request, event)))
    }

    async fn list_events(
        &self,
        conversation_id: Uuid,
        after: i64,
        limit: i64,
    ) -> Result<Vec<Event>> {
        sqlx::query(
            "select * from events where conversation_id = $1 and seq > $2 order by seq limit $3",
        )
        .bind(conversation_id)
        .bind(after)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(event_from_row)
        .collect()
    }

    async fn list_messages(&self, conversation_id: Uuid) -> Result<Vec<Message>> {
        sqlx::query("select * from messages where conversation_id = $1 order by id")
            .bind(conversation_id)
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(message_from_row)
            .collect()
    }

    async fn list_tool_calls(&self, conversation_id: Uuid) -> Result<Vec<ToolCall>> {
        sqlx::query(
            "select * from tool_calls where conversation_id = $1 order by created_at, tool_call_id",
        )
        .bind(conversation_id)
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(tool_call_from_row)
        .collect()
    }

    async fn get_permission(&self, id: Uuid) -> Result<Option<PermissionRequest>> {
        sqlx::query("select * from permission_requests where id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?
            .as_ref()
            .map(permission_from_row)
            .transpose()
    }

    async fn list_permissions(&self, filter: &PermissionFilter) -> Result<Vec<PermissionRequest>> {
        sqlx::query(
            "select * from permission_requests
             where (not $1 or status = 'pending') and ($2::uuid is null or conversation_id = $2)
             order by created_at, id",
        )
        .bind(filter.pending_only)
        .bind(filter.conversation_id)
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(permission_from_row)
        .collect()
    }

    async fn upsert_rule(&self, rule: &Rule) -> Result<Rule> {
        let row = sqlx::query(
            "insert into permission_rules
               (id, conversation_id, tool_kind, subject, option_kind, permission_id, created_at)
             values ($1, $2, $3, $4, $5, $6, $7)
             on conflict (conversation_id, tool_kind, subject) do update set
               option_kind = excluded.option_kind, permission_id = excluded.permission_id,
               created_at = excluded.created_at
             returning *",
        )
        .bind(rule.id)
        .bind(rule.conversation_id)
        .bind(&rule.tool_kind)
        .bind(&rule.subject)
        .bind(&rule.option_kind)
        .bind(rule.permission_id)
        .bind(rule.created_at)
        .fetch_one(&self.pool)
        .await?;
        rule_from_row(&row)
    }

    async fn find_rule(&self, conversation_id: Uuid, key: &ToolKey) -> Result<Option<Rule>> {
        sqlx::query(
            "select * from permission_rules
             where conversation_id = $1 and tool_kind = $2 and subject = $3",
        )
        .bind(conversation_id)
        .bind(&key.kind)
        .bind(&key.subject)
        .fetch_optional(&self.pool)
        .await?
        .as_ref()
        .map(rule_from_row)
        .transpose()
    }

    async fn list_rules(&self, conversation_id: Uuid) -> Result<Vec<Rule>> {
        sqlx::query(
            "select * from permission_rules where conversation_id = $1 order by created_at, id",
        )
        .bind(conversation_id)
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(rule_from_row)
        .collect()
    }

    async fn delete_rule(&self, conversation_id: Uuid, rule_id: Uuid) -> Result<bool> {
        let done =
            sqlx::query("delete from permission_rules where conversation_id = $1 and id = $2")
                .bind(conversation_id)
                .bind(rule_id)
                .execute(&self.pool)
                .await?;
        Ok(done.rows_affected() > 0)
    }
}
