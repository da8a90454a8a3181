//! Permission requests as rows (read, listed, counted), the rules an
//! "always" answer leaves for its conversation, and the operator policies
//! set at run time. A part of [`Store`](super::Store) (its supertrait),
//! written once for both backends by [`impl_permission_store!`]. Requests
//! are inserted with the event that announces them, by
//! [`Store::commit`](super::Store::commit), and answered with the event that
//! resolves them, by [`Store::resolve_permission`](super::Store::resolve_permission).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::error::Result;
use crate::model::{PermissionRequest, Rule, WaitingKind};

/// Which permission requests to list.
#[derive(Debug, Clone, Default)]
pub struct PermissionFilter {
    pub pending_only: bool,
    pub conversation_id: Option<Uuid>,
    /// Only requests of this user's conversations (and those shared with
    /// them).
    pub owner: Option<String>,
    /// Only permission requests, or only questions (`None`: both).
    pub kind: Option<WaitingKind>,
}

/// A list of operator policies and who set it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PolicySet {
    pub id: Uuid,
    pub rules: Vec<crate::model::PolicyRule>,
    pub updated_by: String,
    pub updated_at: DateTime<Utc>,
}

/// A row of `policy_sets`.
#[derive(sqlx::FromRow)]
pub(super) struct PolicySetRow {
    id: Uuid,
    rules: sqlx::types::Json<Vec<crate::model::PolicyRule>>,
    updated_by: String,
    updated_at: DateTime<Utc>,
}

impl From<PolicySetRow> for PolicySet {
    fn from(r: PolicySetRow) -> PolicySet {
        PolicySet {
            id: r.id,
            rules: r.rules.0,
            updated_by: r.updated_by,
            updated_at: r.updated_at,
        }
    }
}

/// Persistence of permission requests, rules and policies (see the module).
#[async_trait]
pub trait PermissionStore: Send + Sync {
    async fn get_permission(&self, id: Uuid) -> Result<Option<PermissionRequest>>;
    /// Oldest first.
    async fn list_permissions(&self, filter: &PermissionFilter) -> Result<Vec<PermissionRequest>>;
    /// How many permission requests are pending.
    async fn count_pending_permissions(&self) -> Result<i64>;

    /// Remembers a rule, replacing one with the same conversation and key.
    async fn upsert_rule(&self, rule: &Rule) -> Result<Rule>;
    /// Oldest first.
    async fn list_rules(&self, conversation_id: Uuid) -> Result<Vec<Rule>>;
    /// Forgets a rule; `false` if there was none with this id in the conversation.
    async fn delete_rule(&self, conversation_id: Uuid, rule_id: Uuid) -> Result<bool>;

    /// The operator policies in force, if they were ever set at run time.
    async fn current_policies(&self) -> Result<Option<PolicySet>>;
    /// Records a new list of operator policies (the history is kept).
    async fn save_policies(&self, set: &PolicySet) -> Result<()>;
}

/// Implements [`PermissionStore`] for a backend type with a `pool` field
/// (for reads) and a `writer()` method (the pool every write goes through).
macro_rules! impl_permission_store {
    ($store:ty) => {
        const _: () = {
            use uuid::Uuid;

            use $crate::error::Result;
            use $crate::model::{PermissionRequest, Rule, WaitingKind};
            use $crate::store::permissions::{PermissionFilter, PolicySet, PolicySetRow};
            use $crate::store::rows::{text_col, JsonText, PermissionRow, RuleRow};

            #[async_trait::async_trait]
            impl $crate::store::permissions::PermissionStore for $store {
                async fn get_permission(&self, id: Uuid) -> Result<Option<PermissionRequest>> {
                    sqlx::query_as::<_, PermissionRow>(
                        "select * from permission_requests where id = $1",
                    )
                    .bind(id)
                    .fetch_optional(&self.pool)
                    .await?
                    .map(PermissionRequest::try_from)
                    .transpose()
                }

                async fn list_permissions(
                    &self,
                    filter: &PermissionFilter,
                ) -> Result<Vec<PermissionRequest>> {
                    // Ids are UUIDv7: their order is the order of creation.
                    let sql = format!(
                        "select p.* from permission_requests p
                         join conversations c on c.id = p.conversation_id
                         where ($1 = false or p.status = 'pending')
                           and ($2 is null or p.conversation_id = $2)
                           and ($3 is null or c.owner = $3 or {})
                           and ($4 is null or p.kind = $4)
                         order by p.id",
                        $crate::store::members::shared_with("$3"),
                    );
                    sqlx::query_as::<_, PermissionRow>(&sql)
                        .bind(filter.pending_only)
                        .bind(filter.conversation_id)
                        .bind(&filter.owner)
                        .bind(filter.kind.map(WaitingKind::as_str))
                        .fetch_all(&self.pool)
                        .await?
                        .into_iter()
                        .map(PermissionRequest::try_from)
                        .collect()
                }

                async fn count_pending_permissions(&self) -> Result<i64> {
                    let (count,): (i64,) = sqlx::query_as(
                        "select count(*) from permission_requests where status = 'pending'",
                    )
                    .fetch_one(&self.pool)
                    .await?;
                    Ok(count)
                }

                async fn upsert_rule(&self, rule: &Rule) -> Result<Rule> {
                    let row = sqlx::query_as::<_, RuleRow>(
                        "insert into permission_rules (id, conversation_id, tool_kind, subject,
                           option_kind, permission_id, created_at)
                         values ($1, $2, $3, $4, $5, $6, $7)
                         on conflict (conversation_id, tool_kind, subject) do update set
                           option_kind = excluded.option_kind,
                           permission_id = excluded.permission_id,
                           created_at = excluded.created_at
                         returning *",
                    )
                    .bind(rule.id)
                    .bind(rule.conversation_id)
                    .bind(text_col(&rule.tool_kind))
                    .bind(text_col(&rule.subject))
                    .bind(&rule.option_kind)
                    .bind(rule.permission_id)
                    .bind(rule.created_at)
                    .fetch_one(self.writer())
                    .await?;
                    Ok(row.into())
                }

                async fn list_rules(&self, conversation_id: Uuid) -> Result<Vec<Rule>> {
                    let rows = sqlx::query_as::<_, RuleRow>(
                        "select * from permission_rules where conversation_id = $1 order by id",
                    )
                    .bind(conversation_id)
                    .fetch_all(&self.pool)
                    .await?;
                    Ok(rows.into_iter().map(Rule::from).collect())
                }

                async fn delete_rule(&self, conversation_id: Uuid, rule_id: Uuid) -> Result<bool> {
                    let done = sqlx::query(
                        "delete from permission_rules where conversation_id = $1 and id = $2",
                    )
                    .bind(conversation_id)
                    .bind(rule_id)
                    .execute(self.writer())
                    .await?;
                    Ok(done.rows_affected() > 0)
                }

                async fn current_policies(&self) -> Result<Option<PolicySet>> {
                    let row = sqlx::query_as::<_, PolicySetRow>(
                        "select * from policy_sets order by id desc limit 1",
                    )
                    .fetch_optional(&self.pool)
                    .await?;
                    Ok(row.map(PolicySet::from))
                }

                async fn save_policies(&self, set: &PolicySet) -> Result<()> {
                    sqlx::query(
                        "insert into policy_sets (id, rules, updated_by, updated_at)
                         values ($1, $2, $3, $4)",
                    )
                    .bind(set.id)
                    .bind(JsonText::of(&set.rules))
                    .bind(&set.updated_by)
                    .bind(set.updated_at)
                    .execute(self.writer())
                    .await?;
                    Ok(())
                }
            }
        };
    };
}

pub(crate) use impl_permission_store;
