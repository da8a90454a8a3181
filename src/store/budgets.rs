//! What budgets keep in the database (the budgets themselves are the
//! config's): an operator's exceptions, the notices recorded once per
//! budget, scope and window, and the turns counted for `{turns}` budgets.
//! The spend they add up is the usage records'. A part of
//! [`Store`](super::Store) (its supertrait), written once for both backends
//! by [`impl_budget_store!`].

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::error::Result;
use crate::model::BudgetException;

/// Which conversations a count takes in: those of `owner`, the one
/// `conversation`, those of profile `agent` (each `None`: any), started
/// from `from` (`None`: ever) to `to`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SpendScope {
    pub owner: Option<String>,
    pub conversation: Option<Uuid>,
    pub agent: Option<String>,
    pub from: Option<DateTime<Utc>>,
    pub to: Option<DateTime<Utc>>,
}

/// Persistence of budgets' state (see the module).
#[async_trait]
pub trait BudgetStore: Send + Sync {
    /// Records an exception, replacing the user's earlier one for the
    /// budget.
    async fn put_budget_exception(&self, exception: &BudgetException) -> Result<()>;
    /// The exceptions of one budget (`None`: of every budget), still in
    /// force at `now`.
    async fn budget_exceptions(
        &self,
        budget: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<Vec<BudgetException>>;
    /// Ends an exception at once; whether there was one.
    async fn remove_budget_exception(&self, budget: &str, user: &str) -> Result<bool>;
    /// Every exception, as stored (for the export).
    async fn all_budget_exceptions(&self) -> Result<Vec<BudgetException>>;
    /// Records a notice of `kind` for a budget's scope and window, unless one
    /// is recorded already; whether this call recorded it.
    async fn note_budget(
        &self,
        budget: &str,
        scope_key: &str,
        window_start: DateTime<Utc>,
        kind: &str,
        at: DateTime<Utc>,
    ) -> Result<bool>;
    /// Every notice recorded (`budget, scope_key, window_start, kind, at`),
    /// for the export.
    async fn budget_notices(&self) -> Result<Vec<BudgetNoticeRow>>;
    /// How many turns started in `scope`.
    async fn turns_started(&self, scope: &SpendScope) -> Result<i64>;
    /// The users with the operator role (budgets notify them).
    async fn operators(&self) -> Result<Vec<String>>;
}

/// A notice as stored.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct BudgetNoticeRow {
    pub budget_id: String,
    pub scope_key: String,
    pub window_start: DateTime<Utc>,
    pub kind: String,
    pub at: DateTime<Utc>,
}

/// An exception as stored.
#[derive(sqlx::FromRow)]
pub(super) struct ExceptionRow {
    budget_id: String,
    user_name: String,
    until: Option<DateTime<Utc>>,
    created_by: String,
    created_at: DateTime<Utc>,
}

impl From<ExceptionRow> for BudgetException {
    fn from(row: ExceptionRow) -> BudgetException {
        BudgetException {
            budget: row.budget_id,
            user: row.user_name,
            until: row.until,
            created_by: row.created_by,
            created_at: row.created_at,
        }
    }
}

/// Implements [`BudgetStore`] for a backend type with a `pool` field (for
/// reads) and a `writer()` method (the pool every write goes through).
macro_rules! impl_budget_store {
    ($store:ty) => {
        const _: () = {
            use chrono::{DateTime, Utc};
            use $crate::error::Result;
            use $crate::model::BudgetException;
            use $crate::store::budgets::{BudgetNoticeRow, ExceptionRow, SpendScope};

            #[async_trait::async_trait]
            impl $crate::store::budgets::BudgetStore for $store {
                async fn put_budget_exception(&self, e: &BudgetException) -> Result<()> {
                    sqlx::query(
                        "insert into budget_exceptions (budget_id, user_name, until, created_by, created_at)
                         values ($1, $2, $3, $4, $5)
                         on conflict (budget_id, user_name) do update set
                           until = excluded.until, created_by = excluded.created_by,
                           created_at = excluded.created_at",
                    )
                    .bind(&e.budget)
                    .bind(&e.user)
                    .bind(e.until)
                    .bind(&e.created_by)
                    .bind(e.created_at)
                    .execute(self.writer())
                    .await?;
                    Ok(())
                }

                async fn budget_exceptions(
                    &self,
                    budget: Option<&str>,
                    now: DateTime<Utc>,
                ) -> Result<Vec<BudgetException>> {
                    let rows = sqlx::query_as::<_, ExceptionRow>(
                        "select * from budget_exceptions
                         where ($1 is null or budget_id = $1) and (until is null or until > $2)
                         order by budget_id, user_name",
                    )
                    .bind(budget)
                    .bind(now)
                    .fetch_all(&self.pool)
                    .await?;
                    Ok(rows.into_iter().map(BudgetException::from).collect())
                }

                async fn remove_budget_exception(&self, budget: &str, user: &str) -> Result<bool> {
                    let removed = sqlx::query(
                        "delete from budget_exceptions where budget_id = $1 and user_name = $2",
                    )
                    .bind(budget)
                    .bind(user)
                    .execute(self.writer())
                    .await?
                    .rows_affected();
                    Ok(removed > 0)
                }

                async fn all_budget_exceptions(&self) -> Result<Vec<BudgetException>> {
                    let rows = sqlx::query_as::<_, ExceptionRow>(
                        "select * from budget_exceptions order by budget_id, user_name",
                    )
                    .fetch_all(&self.pool)
                    .await?;
                    Ok(rows.into_iter().map(BudgetException::from).collect())
                }

                async fn note_budget(
                    &self,
                    budget: &str,
                    scope_key: &str,
                    window_start: DateTime<Utc>,
                    kind: &str,
                    at: DateTime<Utc>,
                ) -> Result<bool> {
                    let noted = sqlx::query(
                        "insert into budget_notices (budget_id, scope_key, window_start, kind, at)
                         values ($1, $2, $3, $4, $5) on conflict do nothing",
                    )
                    .bind(budget)
                    .bind(scope_key)
                    .bind(window_start)
                    .bind(kind)
                    .bind(at)
                    .execute(self.writer())
                    .await?
                    .rows_affected();
                    Ok(noted > 0)
                }

                async fn budget_notices(&self) -> Result<Vec<BudgetNoticeRow>> {
                    Ok(sqlx::query_as::<_, BudgetNoticeRow>(
                        "select * from budget_notices
                         order by budget_id, scope_key, window_start, kind",
                    )
                    .fetch_all(&self.pool)
                    .await?)
                }

                async fn turns_started(&self, scope: &SpendScope) -> Result<i64> {
                    let (count,): (i64,) = sqlx::query_as(
                        "select count(*) from events e join conversations c on c.id = e.conversation_id
                         where e.type = 'turn_started'
                           and ($1 is null or c.owner = $1)
                           and ($2 is null or c.id = $2)
                           and ($3 is null or c.agent = $3)
                           and ($4 is null or e.at >= $4)
                           and ($5 is null or e.at < $5)",
                    )
                    .bind(&scope.owner)
                    .bind(scope.conversation)
                    .bind(&scope.agent)
                    .bind(scope.from)
                    .bind(scope.to)
                    .fetch_one(&self.pool)
                    .await?;
                    Ok(count)
                }

                async fn operators(&self) -> Result<Vec<String>> {
                    let rows: Vec<(String,)> = sqlx::query_as(
                        "select name from users where role = 'operator' and removed_at is null
                         order by name",
                    )
                    .fetch_all(&self.pool)
                    .await?;
                    Ok(rows.into_iter().map(|(name,)| name).collect())
                }
            }
        };
    };
}

pub(crate) use impl_budget_store;
