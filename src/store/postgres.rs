//! The Postgres backend of [`Store`]: for teams, and for several
//! gateway nodes sharing one database.

use sqlx::postgres::{PgConnection, PgPool, PgPoolOptions};
use uuid::Uuid;

use super::backend::{
    json_size, Batch, Bounded, ConversationPatch, Lanes, PermissionFilter, PolicySet, Resolution,
    Store, TokenInfo,
};
use super::rows::{
    text_col, ConversationRow, EventRow, JsonText, MessagePartRow, MessageRow, PermissionRow,
    PolicySetRow, RuleRow, TokenRow, ToolCallRow,
};
use super::sql::impl_store;
use crate::error::Result;
use crate::model::Rule;
use crate::model::{
    Conversation, Event, EventBody, Message, MessagePart, PermissionRequest, ToolCall,
};

/// Migrations embedded in the binary.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

/// How many agents' commits run at once. A person's write, which goes
/// first, waits for at most this many, and for the CPU they take: on a small
/// machine agents compete with the person for Postgres' CPU. In the approvals
/// benchmark on 2 cores (200 agents asking as fast as they are answered):
/// 1 place, a respond call p50 of 2.0–2.8 ms at 260–400 approvals a second;
/// 2 places, 2.8–3.9 ms at 380–560/s; 4 places, 5.3 ms at 610/s. Approvals
/// come at a person's pace, so the person's wait is what counts. A streaming
/// agent that waits for the place commits a larger batch when it gets it.
const AGENT_PLACES: usize = 1;

/// Postgres storage over a connection pool.
#[derive(Clone)]
pub struct PgStore {
    pool: PgPool,
    /// Agents' commits take at most [`AGENT_PLACES`] connections.
    lanes: Lanes,
}

/// How long Postgres lets a transaction of ours sit idle before it ends it.
pub const IDLE_IN_TRANSACTION: &str = "10s";

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
        // A transaction of ours never waits on anything but the database:
        // one left open (its node frozen, or cut off while Postgres still
        // holds the connection) is ended by the server, so the row locks it
        // holds (a conversation's, see fencing) do not stall the node that
        // takes its conversations over.
        let options = url
            .parse::<sqlx::postgres::PgConnectOptions>()
            .context("Failed to read the Postgres URL")?
            .options([("idle_in_transaction_session_timeout", IDLE_IN_TRANSACTION)]);
        let pool = PgPoolOptions::new()
            .max_connections(16)
            // Short: while Postgres is unreachable a session's writer holds
            // its writes and tries again later, and meanwhile keeps serving.
            .acquire_timeout(std::time::Duration::from_secs(2))
            .connect_with(options)
            .await
            .context("Failed to connect to Postgres")?;
        MIGRATOR
            .run(&pool)
            .await
            .context("Failed to apply database migrations")?;
        Ok(PgStore {
            pool,
            lanes: Lanes::new(AGENT_PLACES),
        })
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
/// The title the agent gave conversation `c` (its `session_info_update`).
const AGENT_TITLE: &str = "(c.agent_state ->> 'title')";

/// A `search_texts s` row whose words include all of `$1`'s.
const SEARCH_MATCH: &str = "s.tsv @@ plainto_tsquery('simple', $1)";

/// The words, for `plainto_tsquery` (which joins them with AND).
fn search_query(words: &[String]) -> String {
    words.join(" ")
}

async fn insert_events(
    tx: &mut PgConnection,
    conversation_id: Uuid,
    events: &[Event],
) -> Result<()> {
    if events.is_empty() {
        return Ok(());
    }
    let seqs: Vec<i64> = events.iter().map(|e| e.seq).collect();
    let kinds: Vec<&str> = events.iter().map(|e| e.body.kind()).collect();
    let ats: Vec<_> = events.iter().map(|e| e.at).collect();
    let data: Vec<JsonText> = events
        .iter()
        .map(|e| JsonText::of(&e.body.data()))
        .collect();
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

/// The common resolution in one statement, so one round trip: the request
/// is resolved only while pending *and* stored exactly as the resolution
/// holds it (so the event, made from that copy, says what the table says),
/// and only then are the event and the conversation written. When it does
/// not apply (answered elsewhere, or stored differently), nothing is
/// written and `None` lets the general transaction decide.
async fn resolve_at_once(
    pool: &PgPool,
    resolution: &Resolution,
    event: &Event,
    patch: &ConversationPatch,
    fence: Option<i64>,
) -> Result<Option<Event>> {
    let request = &resolution.request;
    let event = Event {
        body: EventBody::PermissionResolved(resolution.resolved()),
        ..event.clone()
    };
    let query = sqlx::query(
        "with fenced as (
            select id from conversations
            where id = $4 and owner_epoch = coalesce($19, owner_epoch)
            for update
         ), resolved as (
            update permission_requests set status = $2, decision = $3
            where id = $1 and status = 'pending' and conversation_id = $4
              and turn_id is not distinct from $5 and created_at = $6
              and tool_call::text = $7 and options::text = $8
              and exists (select 1 from fenced)
            returning id
         ), announced as (
            insert into events (conversation_id, seq, type, at, data)
            select $4, $9, $10, $11, $12 from resolved
         ), moved as (
            update conversations set status = $13, acp_session_id = $14, last_seq = $15,
              current_turn_id = $16, updated_at = $17, agent_state = coalesce($18, agent_state)
            where id = $4 and exists (select 1 from resolved)
         )
         select exists (select 1 from resolved)",
    )
    .bind(request.id)
    .bind(resolution.status.as_str())
    .bind(JsonText::of(&resolution.decision))
    .bind(request.conversation_id)
    .bind(request.turn_id)
    .bind(request.created_at)
    .bind(JsonText::of(&request.tool_call).0)
    .bind(JsonText::of(&request.options).0)
    .bind(event.seq)
    .bind(event.body.kind())
    .bind(event.at)
    .bind(JsonText::of(&event.body.data()));
    let resolved: bool = bind_patch(query, patch)
        .bind(fence)
        .try_map(|row: sqlx::postgres::PgRow| sqlx::Row::try_get(&row, 0))
        .fetch_one(pool)
        .await?;
    Ok(resolved.then_some(event))
}

impl_store!(PgStore, PgConnection);
// A claim is void once its node's lease ran out (or its row is gone).
super::notify::impl_notify_store!(
    PgStore,
    "not exists (select 1 from nodes n
       where n.id = notification_deliveries.claimed_by and n.lease_until > $2)",
    "for update skip locked"
);
