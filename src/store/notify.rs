//! What the notifications keep: each user's targets, the keys of what was
//! already notified, the durable outbox and every attempt, the gateway's
//! VAPID key pair, and the tokens of the action URLs (one-tap answers). In
//! four parts of [`Store`](super::Store) (its supertraits), each written
//! once for both backends by its macro ([`impl_notify_store!`] expands
//! them all).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::error::Result;

/// A notification target as stored.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct TargetRecord {
    pub id: Uuid,
    pub owner: String,
    /// `web_push`, `ntfy`, `webhook` or `fcm`.
    pub kind: String,
    pub label: Option<String>,
    /// A JSON array of event names.
    pub events: String,
    /// JSON: the kind's settings, secrets included (never listed back).
    pub config: String,
    pub created_at: DateTime<Utc>,
    pub gone: bool,
    pub last_at: Option<DateTime<Utc>>,
    pub last_outcome: Option<String>,
    pub last_detail: Option<String>,
}

impl TargetRecord {
    /// Whether it wants notifications of `event` (an event name).
    pub fn wants(&self, event: &str) -> bool {
        serde_json::from_str::<Vec<String>>(&self.events)
            .map(|events| events.iter().any(|e| e == event))
            .unwrap_or(false)
    }
}

/// One delivery to put in the outbox.
#[derive(Debug, Clone)]
pub struct NewDelivery {
    pub id: Uuid,
    pub target_id: Uuid,
    pub event: String,
    /// The JSON body to send.
    pub body: String,
    pub collapse_key: Option<String>,
}

/// What makes a target's delivery of a notification (`None`: it is not
/// for that target).
pub type MakeDelivery<'a> = dyn Fn(&TargetRecord) -> Option<NewDelivery> + Send + Sync + 'a;

/// A delivery claimed from the outbox.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct DeliveryRecord {
    pub id: Uuid,
    pub target_id: Uuid,
    pub event: String,
    pub body: String,
    pub collapse_key: Option<String>,
    /// Attempts made before this one.
    pub attempts: i32,
}

/// One attempt as recorded.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct AttemptRecord {
    pub delivery_id: Uuid,
    pub target_id: Uuid,
    pub event: String,
    pub attempt: i32,
    /// `delivered`, `failed` or `gone`.
    pub outcome: String,
    pub http_status: Option<i32>,
    pub error: Option<String>,
    pub at: DateTime<Utc>,
}

/// What follows an attempt for its delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptNext {
    /// Done: delivered, gone, or out of attempts.
    Done,
    /// Try again at this time.
    RetryAt(DateTime<Utc>),
}

/// An action URL's token as stored (its value is never stored, only its
/// SHA-256 hash): one option of one request, for one user, used once.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct ActionToken {
    pub hash: String,
    pub request_id: Uuid,
    pub option_id: String,
    pub user_name: String,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub used_at: Option<DateTime<Utc>>,
}

/// Each user's notification targets.
#[async_trait]
pub trait TargetStore: Send + Sync {
    /// Stores a target, as it is (its last delivery and `gone` too);
    /// `false` when one with its id exists (left as it is).
    async fn insert_target(&self, target: &TargetRecord) -> Result<bool>;
    /// Every user's targets, oldest first (for `export`).
    async fn all_targets(&self) -> Result<Vec<TargetRecord>>;
    /// `owner`'s targets, oldest first.
    async fn list_targets(&self, owner: &str) -> Result<Vec<TargetRecord>>;
    async fn get_target(&self, id: Uuid) -> Result<Option<TargetRecord>>;
    /// Removes `owner`'s target `id` (its deliveries and attempts with it);
    /// whether it existed.
    async fn delete_target(&self, id: Uuid, owner: &str) -> Result<bool>;
}

/// The durable outbox: what is due to whom (each notification once, by its
/// keys), claimed by one node at a time.
#[async_trait]
pub trait OutboxStore: Send + Sync {
    /// In one transaction: records `keys` for `owner`; when none was new,
    /// nothing more and `false`; else inserts what `deliveries` makes of
    /// each of `owner`'s targets that are not gone (`None`: not for it), due
    /// at `now`.
    async fn enqueue_notification(
        &self,
        owner: &str,
        keys: &[String],
        now: DateTime<Utc>,
        deliveries: &MakeDelivery<'_>,
    ) -> Result<bool>;
    /// Claims for `node`, until `until`, up to `limit` pending deliveries
    /// due at `now` that no live node holds (unclaimed, their claim ran out,
    /// or their node died). A delivery is claimed by one node at a time.
    async fn claim_deliveries(
        &self,
        node: Uuid,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
        limit: i64,
    ) -> Result<Vec<DeliveryRecord>>;
    /// When the next pending delivery is due (claimed or not).
    async fn next_delivery_due(&self) -> Result<Option<DateTime<Utc>>>;
}

/// Every attempt to deliver, what it leaves its target and its delivery, and
/// the sweep of what is old.
#[async_trait]
pub trait AttemptStore: Send + Sync {
    /// Records an attempt: the attempt row, the target's last delivery (and
    /// `gone` on that outcome) and, for outbox deliveries (`from_outbox`),
    /// the delivery's state (`next`).
    async fn record_attempt(
        &self,
        attempt: &AttemptRecord,
        detail: &str,
        next: AttemptNext,
        from_outbox: bool,
    ) -> Result<()>;
    /// Every attempt for target `id`, newest first, at most `limit`.
    async fn list_attempts(&self, target_id: Uuid, limit: i64) -> Result<Vec<AttemptRecord>>;
    /// Forgets what is older than `before`: keys (nothing older can be
    /// notified again by then), finished deliveries and attempts. How many
    /// rows went.
    async fn sweep_notifications(&self, before: DateTime<Utc>) -> Result<u64>;
}

/// The keys notifications are sent and answered with: the gateway's VAPID key
/// pair and the action URLs' tokens.
#[async_trait]
pub trait NotifyKeyStore: Send + Sync {
    /// The VAPID key pair (private, public): the one stored, or else
    /// `candidate`, stored now (the first node to start wins).
    async fn vapid_keys(&self, candidate: (String, String)) -> Result<(String, String)>;
    /// The stored VAPID key pair, if one was made.
    async fn stored_vapid_keys(&self) -> Result<Option<(String, String)>>;
    /// Stores action tokens (by their hashes).
    async fn insert_action_tokens(&self, tokens: &[ActionToken]) -> Result<()>;
    /// The token with this hash, as stored.
    async fn find_action_token(&self, hash: &str) -> Result<Option<ActionToken>>;
    /// Deletes the tokens that expired before `before`; how many.
    async fn delete_expired_action_tokens(&self, before: DateTime<Utc>) -> Result<u64>;
    /// Marks the token used at `now` if nobody did before: the token as it
    /// was, and whether this call was the one that used it.
    async fn use_action_token(
        &self,
        hash: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<(ActionToken, bool)>>;
}

/// Implements [`TargetStore`] for a backend type with a `pool` field (for
/// reads) and a `writer()` method (the pool every write goes through).
macro_rules! impl_target_store {
    ($store:ty) => {
        const _: () = {
            use uuid::Uuid;

            use $crate::error::Result;
            use $crate::store::notify::{TargetRecord, TargetStore};

            #[async_trait::async_trait]
            impl TargetStore for $store {
                async fn insert_target(&self, t: &TargetRecord) -> Result<bool> {
                    let done = sqlx::query(
                        "insert into notification_targets (id, owner, kind, label, events, config,
                           created_at, gone, last_at, last_outcome, last_detail)
                         values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
                         on conflict (id) do nothing",
                    )
                    .bind(t.id)
                    .bind(&t.owner)
                    .bind(&t.kind)
                    .bind(&t.label)
                    .bind(&t.events)
                    .bind(&t.config)
                    .bind(t.created_at)
                    .bind(t.gone)
                    .bind(t.last_at)
                    .bind(&t.last_outcome)
                    .bind(&t.last_detail)
                    .execute(self.writer())
                    .await?;
                    Ok(done.rows_affected() > 0)
                }

                async fn all_targets(&self) -> Result<Vec<TargetRecord>> {
                    Ok(
                        sqlx::query_as("select * from notification_targets order by id")
                            .fetch_all(&self.pool)
                            .await?,
                    )
                }

                async fn list_targets(&self, owner: &str) -> Result<Vec<TargetRecord>> {
                    Ok(sqlx::query_as(
                        "select * from notification_targets where owner = $1 order by id",
                    )
                    .bind(owner)
                    .fetch_all(&self.pool)
                    .await?)
                }

                async fn get_target(&self, id: Uuid) -> Result<Option<TargetRecord>> {
                    Ok(
                        sqlx::query_as("select * from notification_targets where id = $1")
                            .bind(id)
                            .fetch_optional(&self.pool)
                            .await?,
                    )
                }

                async fn delete_target(&self, id: Uuid, owner: &str) -> Result<bool> {
                    let mut tx = self.writer().begin().await?;
                    // Attempts and deliveries explicitly, not by the cascade:
                    // the same on both backends whatever their foreign-key
                    // settings.
                    for sql in [
                        "delete from notification_attempts where target_id = $1
                           and exists (select 1 from notification_targets where id = $1 and owner = $2)",
                        "delete from notification_deliveries where target_id = $1
                           and exists (select 1 from notification_targets where id = $1 and owner = $2)",
                    ] {
                        sqlx::query(sql)
                            .bind(id)
                            .bind(owner)
                            .execute(&mut *tx)
                            .await?;
                    }
                    let done = sqlx::query(
                        "delete from notification_targets where id = $1 and owner = $2",
                    )
                    .bind(id)
                    .bind(owner)
                    .execute(&mut *tx)
                    .await?;
                    tx.commit().await?;
                    Ok(done.rows_affected() > 0)
                }
            }
        };
    };
}

/// Implements [`OutboxStore`] for a backend type with a `pool` field (for
/// reads) and a `writer()` method (the pool every write goes through).
/// `$dead` is the condition (on `claimed_by`, the node `$4` claiming, now
/// `$2`) under which a claim is void because its node died; `$lock` what
/// claiming adds to its row selection (`for update skip locked` on
/// Postgres; nothing on SQLite, which serves one node and one writer).
macro_rules! impl_outbox_store {
    ($store:ty, $dead:literal, $lock:literal) => {
        const _: () = {
            use chrono::{DateTime, Utc};
            use uuid::Uuid;

            use $crate::error::Result;
            use $crate::store::notify::{DeliveryRecord, MakeDelivery, OutboxStore, TargetRecord};

            #[async_trait::async_trait]
            impl OutboxStore for $store {
                async fn enqueue_notification(
                    &self,
                    owner: &str,
                    keys: &[String],
                    now: DateTime<Utc>,
                    deliveries: &MakeDelivery<'_>,
                ) -> Result<bool> {
                    let mut tx = self.writer().begin().await?;
                    let mut new_keys = 0;
                    for key in keys {
                        new_keys += sqlx::query(
                            "insert into notification_keys (owner, key, created_at) values ($1, $2, $3)
                             on conflict do nothing",
                        )
                        .bind(owner)
                        .bind(key)
                        .bind(now)
                        .execute(&mut *tx)
                        .await?
                        .rows_affected();
                    }
                    if new_keys == 0 && !keys.is_empty() {
                        tx.rollback().await?;
                        return Ok(false);
                    }
                    let targets: Vec<TargetRecord> = sqlx::query_as(
                        "select * from notification_targets where owner = $1 and not gone order by id",
                    )
                    .bind(owner)
                    .fetch_all(&mut *tx)
                    .await?;
                    let mut made = Vec::new();
                    for target in &targets {
                        made.extend(deliveries(target));
                    }
                    for d in made {
                        sqlx::query(
                            "insert into notification_deliveries (id, target_id, event, body,
                               collapse_key, attempts, status, due_at, created_at)
                             values ($1, $2, $3, $4, $5, 0, 'pending', $6, $6)",
                        )
                        .bind(d.id)
                        .bind(d.target_id)
                        .bind(&d.event)
                        .bind(&d.body)
                        .bind(&d.collapse_key)
                        .bind(now)
                        .execute(&mut *tx)
                        .await?;
                    }
                    tx.commit().await?;
                    Ok(true)
                }

                async fn claim_deliveries(
                    &self,
                    node: Uuid,
                    now: DateTime<Utc>,
                    until: DateTime<Utc>,
                    limit: i64,
                ) -> Result<Vec<DeliveryRecord>> {
                    Ok(sqlx::query_as(concat!(
                        "update notification_deliveries set claimed_until = $1, claimed_by = $4
                         where id in (
                           select id from notification_deliveries
                           where status = 'pending' and due_at <= $2
                             and (claimed_until is null or claimed_until <= $2 or ",
                        $dead,
                        ")
                           order by due_at limit $3 ",
                        $lock,
                        ")
                         returning id, target_id, event, body, collapse_key, attempts"
                    ))
                    .bind(until)
                    .bind(now)
                    .bind(limit)
                    .bind(node)
                    .fetch_all(self.writer())
                    .await?)
                }

                async fn next_delivery_due(&self) -> Result<Option<DateTime<Utc>>> {
                    let due: Option<(DateTime<Utc>, Option<DateTime<Utc>>)> = sqlx::query_as(
                        "select due_at, claimed_until from notification_deliveries
                             where status = 'pending' order by due_at limit 1",
                    )
                    .fetch_optional(&self.pool)
                    .await?;
                    Ok(due.map(|(due, claimed)| claimed.map_or(due, |c| c.max(due))))
                }
            }
        };
    };
}

/// Implements [`AttemptStore`] for a backend type with a `pool` field (for
/// reads) and a `writer()` method (the pool every write goes through).
macro_rules! impl_attempt_store {
    ($store:ty) => {
        const _: () = {
            use chrono::{DateTime, Utc};
            use uuid::Uuid;

            use $crate::error::Result;
            use $crate::store::notify::{AttemptNext, AttemptRecord, AttemptStore};

            #[async_trait::async_trait]
            impl AttemptStore for $store {
                async fn record_attempt(
                    &self,
                    a: &AttemptRecord,
                    detail: &str,
                    next: AttemptNext,
                    from_outbox: bool,
                ) -> Result<()> {
                    let mut tx = self.writer().begin().await?;
                    // Nothing when the target was deleted during the attempt.
                    sqlx::query(
                        "insert into notification_attempts (delivery_id, target_id, event, attempt,
                           outcome, http_status, error, at)
                         select $1, $2, $3, $4, $5, $6, $7, $8
                         where exists (select 1 from notification_targets where id = $2)",
                    )
                    .bind(a.delivery_id)
                    .bind(a.target_id)
                    .bind(&a.event)
                    .bind(a.attempt)
                    .bind(&a.outcome)
                    .bind(a.http_status)
                    .bind(&a.error)
                    .bind(a.at)
                    .execute(&mut *tx)
                    .await?;
                    sqlx::query(
                        "update notification_targets set last_at = $2, last_outcome = $3,
                           last_detail = $4, gone = (gone or $5)
                         where id = $1",
                    )
                    .bind(a.target_id)
                    .bind(a.at)
                    .bind(&a.outcome)
                    .bind(detail)
                    .bind(a.outcome == "gone")
                    .execute(&mut *tx)
                    .await?;
                    if from_outbox {
                        let (status, due) = match next {
                            AttemptNext::Done => (a.outcome.as_str(), a.at),
                            AttemptNext::RetryAt(at) => ("pending", at),
                        };
                        sqlx::query(
                            "update notification_deliveries set attempts = $2, status = $3,
                               due_at = $4, claimed_until = null, claimed_by = null
                             where id = $1",
                        )
                        .bind(a.delivery_id)
                        .bind(a.attempt)
                        .bind(status)
                        .bind(due)
                        .execute(&mut *tx)
                        .await?;
                    }
                    tx.commit().await?;
                    Ok(())
                }

                async fn list_attempts(
                    &self,
                    target_id: Uuid,
                    limit: i64,
                ) -> Result<Vec<AttemptRecord>> {
                    Ok(sqlx::query_as(
                        "select * from notification_attempts where target_id = $1
                         order by at desc, attempt desc limit $2",
                    )
                    .bind(target_id)
                    .bind(limit)
                    .fetch_all(&self.pool)
                    .await?)
                }

                async fn sweep_notifications(&self, before: DateTime<Utc>) -> Result<u64> {
                    let mut gone = 0;
                    for statement in [
                        "delete from notification_keys where created_at < $1",
                        "delete from notification_deliveries where status <> 'pending' and due_at < $1",
                        "delete from notification_attempts where at < $1",
                    ] {
                        gone += sqlx::query(statement)
                            .bind(before)
                            .execute(self.writer())
                            .await?
                            .rows_affected();
                    }
                    Ok(gone)
                }
            }
        };
    };
}

/// Implements [`NotifyKeyStore`] for a backend type with a `pool` field (for
/// reads) and a `writer()` method (the pool every write goes through).
macro_rules! impl_notify_key_store {
    ($store:ty) => {
        const _: () = {
            use chrono::{DateTime, Utc};

            use $crate::error::Result;
            use $crate::store::notify::{ActionToken, NotifyKeyStore};

            #[async_trait::async_trait]
            impl NotifyKeyStore for $store {
                async fn vapid_keys(
                    &self,
                    candidate: (String, String),
                ) -> Result<(String, String)> {
                    sqlx::query(
                        "insert into vapid_keys (id, private_key, public_key, created_at)
                         values (1, $1, $2, $3) on conflict do nothing",
                    )
                    .bind(&candidate.0)
                    .bind(&candidate.1)
                    .bind(Utc::now())
                    .execute(self.writer())
                    .await?;
                    Ok(sqlx::query_as(
                        "select private_key, public_key from vapid_keys where id = 1",
                    )
                    .fetch_one(&self.pool)
                    .await?)
                }

                async fn stored_vapid_keys(&self) -> Result<Option<(String, String)>> {
                    Ok(sqlx::query_as(
                        "select private_key, public_key from vapid_keys where id = 1",
                    )
                    .fetch_optional(&self.pool)
                    .await?)
                }

                async fn insert_action_tokens(&self, tokens: &[ActionToken]) -> Result<()> {
                    let mut tx = self.writer().begin().await?;
                    for t in tokens {
                        sqlx::query(
                            "insert into action_tokens
                               (hash, request_id, option_id, user_name, created_at, expires_at, used_at)
                             values ($1, $2, $3, $4, $5, $6, $7)",
                        )
                        .bind(&t.hash)
                        .bind(t.request_id)
                        .bind(&t.option_id)
                        .bind(&t.user_name)
                        .bind(t.created_at)
                        .bind(t.expires_at)
                        .bind(t.used_at)
                        .execute(&mut *tx)
                        .await?;
                    }
                    tx.commit().await?;
                    Ok(())
                }

                async fn find_action_token(&self, hash: &str) -> Result<Option<ActionToken>> {
                    Ok(sqlx::query_as::<_, ActionToken>(
                        "select * from action_tokens where hash = $1",
                    )
                    .bind(hash)
                    .fetch_optional(&self.pool)
                    .await?)
                }

                async fn delete_expired_action_tokens(&self, before: DateTime<Utc>) -> Result<u64> {
                    let done = sqlx::query("delete from action_tokens where expires_at < $1")
                        .bind(before)
                        .execute(self.writer())
                        .await?;
                    Ok(done.rows_affected())
                }

                async fn use_action_token(
                    &self,
                    hash: &str,
                    now: DateTime<Utc>,
                ) -> Result<Option<(ActionToken, bool)>> {
                    let Some(token) = self.find_action_token(hash).await? else {
                        return Ok(None);
                    };
                    let done = sqlx::query(
                        "update action_tokens set used_at = $2 where hash = $1 and used_at is null",
                    )
                    .bind(hash)
                    .bind(now)
                    .execute(self.writer())
                    .await?;
                    Ok(Some((token, done.rows_affected() == 1)))
                }
            }
        };
    };
}

/// Implements every part of the notifications' persistence for a backend
/// type (see [`impl_outbox_store!`] for `$dead` and `$lock`).
macro_rules! impl_notify_store {
    ($store:ty, $dead:literal, $lock:literal) => {
        $crate::store::notify::impl_target_store!($store);
        $crate::store::notify::impl_outbox_store!($store, $dead, $lock);
        $crate::store::notify::impl_attempt_store!($store);
        $crate::store::notify::impl_notify_key_store!($store);
    };
}

pub(crate) use {
    impl_attempt_store, impl_notify_key_store, impl_notify_store, impl_outbox_store,
    impl_target_store,
};
