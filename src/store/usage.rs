//! What agents spent: every usage report kept (`usage_records`), summed by
//! user, agent, conversation or day, per currency (amounts in different
//! currencies are never added up). A part of [`Store`](super::Store) (its
//! supertrait), written once for both backends by [`impl_usage_store!`].
//! Records are written with the `session_update` event that carried them,
//! by [`Store::commit`](super::Store::commit) (see
//! [`Batch::usage`](super::Batch::usage)); export copies them with
//! [`UsageStore::insert_usage_records`].

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::error::Result;
use crate::model::{GroupBy, UsageQuery, UsageRecord, UsageRow};

/// What usage records say (see the module).
#[async_trait]
pub trait UsageStore: Send + Sync {
    /// The records `query` selects, summed per group (`query.group_by`)
    /// and currency, ordered by group then currency. Reports that carried no
    /// cost make rows of their own (`currency` `null`, amount 0).
    async fn usage_totals(&self, query: &UsageQuery) -> Result<Vec<UsageRow>>;
    /// What was spent, per currency (reports with a cost only), by the
    /// records every given filter selects (`from` inclusive, `to`
    /// exclusive), ordered by currency.
    async fn spent(
        &self,
        owner: Option<&str>,
        conversation: Option<Uuid>,
        agent: Option<&str>,
        from: Option<DateTime<Utc>>,
        to: Option<DateTime<Utc>>,
    ) -> Result<Vec<(String, f64)>>;
    /// A conversation's usage records, oldest first.
    async fn usage_records(&self, conversation_id: Uuid) -> Result<Vec<UsageRecord>>;
    /// Every usage record (of conversations removed too), by id, after
    /// `after`, at most `limit`: a page of them all (export).
    async fn usage_records_after(
        &self,
        after: Option<Uuid>,
        limit: i64,
    ) -> Result<Vec<UsageRecord>>;
    /// Writes records as they are (export); one already stored (by id) is
    /// left as it is. How many were written.
    async fn insert_usage_records(&self, records: &[UsageRecord]) -> Result<u64>;
}

/// A `usage_records` row.
#[derive(sqlx::FromRow)]
pub(super) struct UsageRecordRow {
    id: Uuid,
    conversation_id: Uuid,
    turn_id: Option<Uuid>,
    owner: Option<String>,
    agent: String,
    at: DateTime<Utc>,
    seq: Option<i64>,
    used: Option<i64>,
    size: Option<i64>,
    cost_amount: Option<f64>,
    cost_currency: Option<String>,
    delta: f64,
}

impl From<UsageRecordRow> for UsageRecord {
    fn from(r: UsageRecordRow) -> UsageRecord {
        UsageRecord {
            id: r.id,
            conversation_id: r.conversation_id,
            turn_id: r.turn_id,
            owner: r.owner,
            agent: r.agent,
            at: r.at,
            seq: r.seq,
            used: r.used,
            size: r.size,
            cost_amount: r.cost_amount,
            cost_currency: r.cost_currency,
            delta: r.delta,
        }
    }
}

/// A group's sums as a query returns them: its key as text, or as a
/// conversation's id.
#[derive(sqlx::FromRow)]
pub(super) struct UsageSumRow {
    key: Option<String>,
    key_id: Option<Uuid>,
    currency: Option<String>,
    amount: f64,
    reports: i64,
    turns: i64,
}

impl From<UsageSumRow> for UsageRow {
    fn from(r: UsageSumRow) -> UsageRow {
        UsageRow {
            key: r.key.or(r.key_id.map(|id| id.to_string())),
            currency: r.currency,
            amount: r.amount,
            reports: r.reports,
            turns: r.turns,
        }
    }
}

/// The records `$1`..`$5` select: owner, conversation, agent, from
/// (inclusive), to (exclusive), each where given.
pub(super) const USAGE_WHERE: &str = "($1 is null or owner = $1)
       and ($2 is null or conversation_id = $2) and ($3 is null or agent = $3)
       and ($4 is null or at >= $4) and ($5 is null or at < $5)";

/// The SQL of a group's key, as text and as an id, for `group_by`; `day`
/// is the backend's SQL of a record's day (UTC, `YYYY-MM-DD`).
pub(super) fn group_key(group_by: Option<GroupBy>, day: &str) -> (String, &'static str) {
    let text = match group_by {
        None | Some(GroupBy::Conversation) => "cast(null as text)".to_owned(),
        Some(GroupBy::User) => "owner".to_owned(),
        Some(GroupBy::Agent) => "agent".to_owned(),
        Some(GroupBy::Day) => day.to_owned(),
    };
    let id = match group_by {
        Some(GroupBy::Conversation) => "conversation_id",
        _ => "cast(null as uuid)",
    };
    (text, id)
}

/// Implements [`UsageStore`] for a backend type with a `pool` field (for
/// reads) and a `writer()` method (the pool every write goes through). The
/// invoking module defines `USAGE_DAY` (the SQL of a record's day, UTC,
/// `YYYY-MM-DD`, from its `at`) and `USAGE_SUM` (the SQL of the sum of the
/// selected records' `delta` as a float, 0 for none).
macro_rules! impl_usage_store {
    ($store:ty) => {
        const _: () = {
            use chrono::{DateTime, Utc};
            use uuid::Uuid;

            use $crate::error::Result;
            use $crate::model::{UsageQuery, UsageRecord, UsageRow};
            use $crate::store::rows::text_col;
            use $crate::store::usage::{group_key, UsageRecordRow, UsageSumRow, USAGE_WHERE};

            #[async_trait::async_trait]
            impl $crate::store::usage::UsageStore for $store {
                async fn usage_totals(&self, query: &UsageQuery) -> Result<Vec<UsageRow>> {
                    let (key, key_id) = group_key(query.group_by, USAGE_DAY);
                    let sum = USAGE_SUM;
                    let sql = format!(
                        "select {key} as key, {key_id} as key_id, cost_currency as currency,
                           {sum} as amount, count(*) as reports,
                           count(distinct turn_id) as turns
                         from usage_records where {USAGE_WHERE}
                         group by {key}, {key_id}, cost_currency"
                    );
                    let rows = sqlx::query_as::<_, UsageSumRow>(&sql)
                        .bind(query.owner.as_deref())
                        .bind(query.conversation)
                        .bind(query.agent.as_deref())
                        .bind(query.from)
                        .bind(query.to)
                        .fetch_all(&self.pool)
                        .await?;
                    let mut rows: Vec<UsageRow> = rows.into_iter().map(UsageRow::from).collect();
                    // Ordered here: the backends sort `null` apart.
                    rows.sort_by(|a, b| (&a.key, &a.currency).cmp(&(&b.key, &b.currency)));
                    Ok(rows)
                }

                async fn spent(
                    &self,
                    owner: Option<&str>,
                    conversation: Option<Uuid>,
                    agent: Option<&str>,
                    from: Option<DateTime<Utc>>,
                    to: Option<DateTime<Utc>>,
                ) -> Result<Vec<(String, f64)>> {
                    let sum = USAGE_SUM;
                    let sql = format!(
                        "select cost_currency, {sum} from usage_records
                         where {USAGE_WHERE} and cost_currency is not null
                         group by cost_currency order by cost_currency"
                    );
                    Ok(sqlx::query_as::<_, (String, f64)>(&sql)
                        .bind(owner)
                        .bind(conversation)
                        .bind(agent)
                        .bind(from)
                        .bind(to)
                        .fetch_all(&self.pool)
                        .await?)
                }

                async fn usage_records(&self, conversation_id: Uuid) -> Result<Vec<UsageRecord>> {
                    let rows = sqlx::query_as::<_, UsageRecordRow>(
                        "select * from usage_records where conversation_id = $1
                         order by at, id",
                    )
                    .bind(conversation_id)
                    .fetch_all(&self.pool)
                    .await?;
                    Ok(rows.into_iter().map(UsageRecord::from).collect())
                }

                async fn usage_records_after(
                    &self,
                    after: Option<Uuid>,
                    limit: i64,
                ) -> Result<Vec<UsageRecord>> {
                    let rows = sqlx::query_as::<_, UsageRecordRow>(
                        "select * from usage_records where ($1 is null or id > $1)
                         order by id limit $2",
                    )
                    .bind(after)
                    .bind(limit)
                    .fetch_all(&self.pool)
                    .await?;
                    Ok(rows.into_iter().map(UsageRecord::from).collect())
                }

                async fn insert_usage_records(&self, records: &[UsageRecord]) -> Result<u64> {
                    let mut tx = self.writer().begin().await?;
                    let mut written = 0;
                    for r in records {
                        written += $crate::store::usage::bind_usage!(
                            sqlx::query($crate::store::usage::INSERT_USAGE),
                            r,
                            r.conversation_id
                        )
                        .execute(&mut *tx)
                        .await?
                        .rows_affected();
                    }
                    tx.commit().await?;
                    Ok(written)
                }
            }
        };
    };
}

/// One usage record written as it is, unless one of its id is stored
/// (a commit tried again after its answer was lost writes nothing twice).
pub(super) const INSERT_USAGE: &str = "insert into usage_records (id, conversation_id, turn_id,
       owner, agent, at, seq, used, size, cost_amount, cost_currency, delta)
     values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
     on conflict (id) do nothing";

/// [`INSERT_USAGE`]'s parameters bound from the record `$r`, written for
/// the conversation `$conversation` (`text_col` in scope).
macro_rules! bind_usage {
    ($query:expr, $r:expr, $conversation:expr) => {
        $query
            .bind($r.id)
            .bind($conversation)
            .bind($r.turn_id)
            .bind($r.owner.as_deref())
            .bind(text_col(&$r.agent))
            .bind($r.at)
            .bind($r.seq)
            .bind($r.used)
            .bind($r.size)
            .bind($r.cost_amount)
            .bind($r.cost_currency.as_deref().map(text_col))
            .bind($r.delta)
    };
}

pub(crate) use {bind_usage, impl_usage_store};
