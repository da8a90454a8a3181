//! The Postgres backend of [`Store`](super::Store): for teams, and for several
//! gateway nodes sharing one database.

use sqlx::postgres::{PgConnection, PgPool, PgPoolOptions};
use uuid::Uuid;

use super::backend::{Batch, ConversationPatch, Lanes, Resolution};
use super::rows::{text_col, JsonText};
use super::search::{search_text, SEARCH_TEXT_MAX};
use super::sql::{impl_store, search_text_append, tool_call_update};
use crate::error::Result;
use crate::model::{Event, EventBody, ToolCall};

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
/// With each commit one statement ([`write_batch`], 2026-11-29): 1 place,
/// 2.5–3.1 ms at 450–540/s; 2 places, 5.4 ms at 540/s and no request shown
/// sooner.
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

/// The connections of the store's pool.
pub const POOL_SIZE: u32 = 16;

/// How long a query waits for a connection, or for one to be made. Short:
/// while Postgres is unreachable a session's writer holds its writes and
/// tries again later, and meanwhile keeps serving.
pub const ACQUIRE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// A pooled connection idle at least this long is tested (a round trip to
/// the server) before it is handed out, and replaced if it is broken: one
/// left idle through a restart of Postgres or an outage is not given to a
/// query that would fail. One in use, under load, is handed out at once:
/// sqlx's default tests every connection before every use, a round trip
/// that the agents' commits, one after the other, paid each time (the
/// notifications burst's requests were shown about a quarter later). A
/// connection is also tested when it is given back (sqlx always does).
/// So a query can meet a broken connection only when the connection broke
/// within the last second of its use; it then fails as any query does in
/// an outage (transient: retried, or a 503), and the connection is dropped.
pub const TESTED_AFTER_IDLE: std::time::Duration = std::time::Duration::from_secs(1);

/// Whether a connection idle `idle_for` is tested before use.
pub fn tested_before_use(idle_for: std::time::Duration) -> bool {
    idle_for >= TESTED_AFTER_IDLE
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
            .max_connections(POOL_SIZE)
            // A connection is tested (a round trip) before use only when it
            // has been idle a while: see [`TESTED_AFTER_IDLE`].
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if tested_before_use(meta.idle_for) {
                        sqlx::Connection::ping(conn).await?;
                    }
                    Ok(true)
                })
            })
            .acquire_timeout(ACQUIRE_TIMEOUT)
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

/// The title the agent gave conversation `c` (its `session_info_update`).
const AGENT_TITLE: &str = "(c.agent_state ->> 'title')";

/// A `search_texts s` row whose words include all of `$1`'s.
const SEARCH_MATCH: &str = "s.tsv @@ plainto_tsquery('simple', $1)";

/// The words, for `plainto_tsquery` (which joins them with AND).
fn search_query(words: &[String]) -> String {
    words.join(" ")
}

/// Postgres' commit: a whole batch in one statement, so one round trip
/// where a transaction of a statement per table would take one per table
/// written and two more (`begin`, `commit`). Agents' commits take one place
/// at a time (see [`AGENT_PLACES`]): under a burst, every round trip of one
/// is time the next conversation's commit waits, and with it the request
/// it carries, the notifier and the person. It writes what SQLite's commit
/// (`write_batch` in `sqlite.rs`) writes, with the same checks:
/// - the fence: where `batch.fence` is no longer the conversation's epoch,
///   nothing is written and it fails with [`crate::error::Error::Fenced`]
///   (the conversation's row stays locked until the end);
/// - without the conversation's state (a piece of a refused batch), its
///   `last_seq` still moves up to the batch's events;
/// - every table's rows in one `unnest` each (usage records included:
///   written in the same commit as the events that carried them). Rows one statement may not
///   touch twice are merged first, as a statement a row would leave them: a
///   tool call updated twice in the batch is its last state with its first
///   `turn_id` and `created_at`; a message's search text is its parts
///   joined in order, each added while the text is under the cap (and the
///   whole added to a stored text under the cap: the cap is a bound, not
///   an exact length, either way). Postgres checks foreign keys at the end
///   of the statement, so a part may follow its message in one batch.
async fn write_batch(pool: &PgPool, conversation_id: Uuid, batch: &Batch) -> Result<()> {
    let asks = &batch.new_permissions;
    let events = &batch.events;
    let usage = &batch.usage;
    let (mut firsts, mut parts, mut texts) = (Vec::new(), Vec::new(), SearchTexts::default());
    for part in &batch.messages {
        if part.part == 0 {
            firsts.push(part);
        } else {
            parts.push(part);
        }
        texts.add(part.message.id, &search_text(&part.message.content));
    }
    let calls = last_states(&batch.tool_calls);
    let patch = batch.conversation.as_ref();
    let query = sqlx::query(concat!(
        "with fenced as (
            select id from conversations where id = $1 and owner_epoch = $2 for update
         ), go as (
            select $2::bigint is null or exists (select 1 from fenced) as go
         ), asked as (
            insert into permission_requests (id, conversation_id, turn_id, tool_call, options,
              status, decision, created_at, kind)
            select * from unnest($3::uuid[], $4::uuid[], $5::uuid[], $6::json[], $7::json[],
              $8::text[], $9::json[], $10::timestamptz[], $47::text[])
            where (select go from go)
         ), announced as (
            insert into events (conversation_id, seq, type, at, data)
            select $1, * from unnest($11::bigint[], $12::text[], $13::timestamptz[], $14::json[])
            where (select go from go)
         ), begun as (
            insert into messages (id, conversation_id, turn_id, role, content, created_at,
              prompt_seq)
            select m.id, $1, m.turn_id, m.role, m.content, m.created_at, m.prompt_seq
            from unnest($15::uuid[], $16::uuid[], $17::text[], $18::json[], $19::timestamptz[],
              $20::bigint[]) as m (id, turn_id, role, content, created_at, prompt_seq)
            where (select go from go)
            on conflict (id) do nothing
         ), continued as (
            insert into message_parts (conversation_id, message_id, part, content)
            select $1, * from unnest($21::uuid[], $22::int[], $23::json[])
            where (select go from go)
            on conflict do nothing
         ), indexed as (
            insert into search_texts (message_id, conversation_id, body)
            select t.message_id, $1, t.body from unnest($24::uuid[], $25::text[])
              as t (message_id, body)
            where (select go from go) ",
        search_text_append!(),
        "$26
         ), called as (
            insert into tool_calls (conversation_id, tool_call_id, turn_id, title, kind,
              status, content, locations, raw_input, raw_output, created_at, updated_at)
            select $1, * from unnest($27::text[], $28::uuid[], $29::text[], $30::text[],
              $31::text[], $32::json[], $33::json[], $34::json[], $35::json[],
              $36::timestamptz[], $37::timestamptz[])
            where (select go from go) ",
        tool_call_update!(),
        "
         ), moved as (
            update conversations set status = $39, acp_session_id = $40, last_seq = $41,
              current_turn_id = $42, updated_at = $43, agent_state = coalesce($44, agent_state),
              prompt_queue = coalesce($46, prompt_queue)
            where id = $1 and $38 and (select go from go)
         ), kept_up as (
            update conversations set last_seq = (select max(seq) from unnest($11::bigint[]) seq)
            where id = $1 and not $38 and last_seq < (select max(seq) from unnest($11::bigint[]) seq)
              and (select go from go)
         ), linked as (
            update agent_processes set link = $45
            where conversation_id = $1 and $45 is not null and (select go from go)
         ), spent as (
            insert into usage_records (id, conversation_id, turn_id, owner, agent, at, seq,
              used, size, cost_amount, cost_currency, delta)
            select u.id, $1, u.turn_id, u.owner, u.agent, u.at, u.seq, u.used, u.size,
              u.cost_amount, u.cost_currency, u.delta
            from unnest($48::uuid[], $49::uuid[], $50::text[], $51::text[], $52::timestamptz[],
              $53::bigint[], $54::bigint[], $55::bigint[], $56::float8[], $57::text[],
              $58::float8[])
              as u (id, turn_id, owner, agent, at, seq, used, size, cost_amount, cost_currency,
                delta)
            where (select go from go)
            on conflict (id) do nothing
         )
         select go from go"
    ))
    .bind(conversation_id)
    .bind(batch.fence)
    .bind(col(asks, |p| p.id))
    .bind(col(asks, |p| p.conversation_id))
    .bind(col(asks, |p| p.turn_id))
    .bind(col(asks, |p| JsonText::of(&p.tool_call)))
    .bind(col(asks, |p| JsonText::of(&p.options)))
    .bind(col(asks, |p| p.status.as_str()))
    .bind(col(asks, |p| p.decision.as_ref().map(JsonText::of)))
    .bind(col(asks, |p| p.created_at))
    .bind(col(events, |e| e.seq))
    .bind(col(events, |e| e.body.kind()))
    .bind(col(events, |e| e.at))
    .bind(col(events, |e| JsonText::of(&e.body.data())))
    .bind(col(&firsts, |p| p.message.id))
    .bind(col(&firsts, |p| p.message.turn_id))
    .bind(col(&firsts, |p| p.message.role.as_str()))
    // A prompt's content is its event's: not stored again.
    .bind(col(&firsts, |p| match p.content_in_event {
        Some(_) => JsonText("[]".into()),
        None => JsonText::of(&p.message.content),
    }))
    .bind(col(&firsts, |p| p.message.created_at))
    .bind(col(&firsts, |p| p.content_in_event))
    .bind(col(&parts, |p| p.message.id))
    .bind(col(&parts, |p| p.part))
    .bind(col(&parts, |p| JsonText::of(&p.message.content)))
    .bind(texts.ids)
    .bind(texts.bodies)
    .bind(SEARCH_TEXT_MAX as i64)
    .bind(col(&calls, |(t, _)| text_col(&t.tool_call_id)))
    .bind(col(&calls, |(_, first)| first.turn_id))
    .bind(col(&calls, |(t, _)| t.title.as_deref().map(text_col)))
    .bind(col(&calls, |(t, _)| t.kind.as_deref().map(text_col)))
    .bind(col(&calls, |(t, _)| t.status.as_deref().map(text_col)))
    .bind(col(&calls, |(t, _)| t.content.as_ref().map(JsonText::of)))
    .bind(col(&calls, |(t, _)| t.locations.as_ref().map(JsonText::of)))
    .bind(col(&calls, |(t, _)| t.raw_input.as_ref().map(JsonText::of)))
    .bind(col(&calls, |(t, _)| {
        t.raw_output.as_ref().map(JsonText::of)
    }))
    .bind(col(&calls, |(_, first)| first.created_at))
    .bind(col(&calls, |(t, _)| t.updated_at))
    .bind(patch.is_some())
    .bind(patch.map(|p| p.status.as_str()))
    .bind(patch.and_then(|p| p.acp_session_id.as_deref().map(text_col)))
    .bind(patch.map(|p| p.last_seq))
    .bind(patch.and_then(|p| p.current_turn_id))
    .bind(patch.map(|p| p.updated_at))
    .bind(patch.and_then(|p| p.state.as_ref().map(JsonText::of)))
    .bind(batch.link.as_ref().map(JsonText::of))
    .bind(patch.and_then(|p| p.queue.as_ref().map(JsonText::of)))
    .bind(col(asks, |p| p.kind.as_str()))
    .bind(col(usage, |u| u.id))
    .bind(col(usage, |u| u.turn_id))
    .bind(col(usage, |u| u.owner.as_deref()))
    .bind(col(usage, |u| text_col(&u.agent)))
    .bind(col(usage, |u| u.at))
    .bind(col(usage, |u| u.seq))
    .bind(col(usage, |u| u.used))
    .bind(col(usage, |u| u.size))
    .bind(col(usage, |u| u.cost_amount))
    .bind(col(usage, |u| u.cost_currency.as_deref().map(text_col)))
    .bind(col(usage, |u| u.delta));
    let written: bool = query
        .try_map(|row: sqlx::postgres::PgRow| sqlx::Row::try_get(&row, 0))
        .fetch_one(pool)
        .await?;
    if !written {
        return Err(crate::error::Error::Fenced(conversation_id));
    }
    Ok(())
}

/// One column of rows, for an `unnest` parameter.
fn col<'a, T, U>(rows: &'a [T], value: impl Fn(&'a T) -> U) -> Vec<U> {
    rows.iter().map(value).collect()
}

/// Each tool call of a batch once, as the batch's updates leave it: its
/// last state, with the `turn_id` and `created_at` it was first written
/// with (an update keeps those two): `(last, first)`.
fn last_states(calls: &[ToolCall]) -> Vec<(&ToolCall, &ToolCall)> {
    let mut states: Vec<(&ToolCall, &ToolCall)> = Vec::new();
    for call in calls {
        match states
            .iter_mut()
            .find(|(t, _)| t.tool_call_id == call.tool_call_id)
        {
            Some(state) => state.0 = call,
            None => states.push((call, call)),
        }
    }
    states
}

/// Each message's search text in a batch once: its parts' texts joined in
/// order, each added only while the text is under the cap (as one
/// statement a part, SQLite's, would leave it).
#[derive(Default)]
struct SearchTexts {
    ids: Vec<Uuid>,
    bodies: Vec<String>,
}

impl SearchTexts {
    fn add(&mut self, message: Uuid, text: &str) {
        if text.is_empty() {
            return;
        }
        match self.ids.iter().position(|id| *id == message) {
            Some(i) if self.bodies[i].len() < SEARCH_TEXT_MAX => {
                self.bodies[i].push_str(&text_col(text))
            }
            Some(_) => {}
            None => {
                self.ids.push(message);
                self.bodies.push(text_col(text).into_owned());
            }
        }
    }
}

/// The common resolution in one statement, so one round trip: the request
/// is resolved only while pending *and* stored exactly as the resolution
/// holds it (so the event, made from that copy, says what the table says),
/// and only then are the event and the conversation written. When it does
/// not apply (answered elsewhere, or stored differently), nothing is
/// written and `None` lets the transaction of `impl_store!` decide.
async fn resolve_at_once(
    pool: &PgPool,
    resolution: &Resolution,
    event: &Event,
    patch: &ConversationPatch,
    fence: Option<i64>,
) -> Result<Option<Event>> {
    let request = &resolution.request;
    let event = Event {
        body: EventBody::resolved(resolution.resolved()),
        ..event.clone()
    };
    let query = sqlx::query(
        "with fenced as (
            select id from conversations
            where id = $4 and owner_epoch = coalesce($20, owner_epoch)
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
              current_turn_id = $16, updated_at = $17, agent_state = coalesce($18, agent_state),
              prompt_queue = coalesce($19, prompt_queue)
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

/// A usage record's day (UTC, `YYYY-MM-DD`).
const USAGE_DAY: &str = "to_char(at at time zone 'UTC', 'YYYY-MM-DD')";

/// The selected usage records' cost increases summed (0 for none).
const USAGE_SUM: &str = "coalesce(sum(delta), 0)";

/// What conversation `c` spent, per currency: a JSON array of `{currency,
/// amount}` ordered by currency (`null`: nothing).
const CONVERSATION_SPEND: &str = "(select json_agg(json_build_object('currency', s.currency,
       'amount', s.amount) order by s.currency)
     from (select cost_currency as currency, sum(delta) as amount from usage_records u
           where u.conversation_id = c.id and u.cost_currency is not null
           group by cost_currency) s)";

impl_store!(PgStore, PgConnection);
// A claim is void once its node's lease ran out (or its row is gone).
super::notify::impl_notify_store!(
    PgStore,
    "not exists (select 1 from nodes n
       where n.id = notification_deliveries.claimed_by and n.lease_until > $2)",
    "for update skip locked"
);

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn only_a_connection_idle_a_while_is_tested_before_use() {
        assert!(!tested_before_use(Duration::ZERO));
        assert!(!tested_before_use(Duration::from_millis(999)));
        assert!(tested_before_use(Duration::from_secs(1)));
        assert!(tested_before_use(Duration::from_secs(600)));
    }
}
