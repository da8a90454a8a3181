//! [`ClusterStore`] on Postgres: the statements behind several gateway
//! nodes sharing one database, on the store's own pool (the LISTEN
//! connection aside: it is a connection of its own).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use sqlx::postgres::{PgListener, PgPoolOptions};
use sqlx::types::Json;
use uuid::Uuid;

use super::cluster::{
    Channel, ClusterStore, Clustered, Listener, NodeLease, NodeRecord, Notice, SentCommand,
    ANSWERS, COMMANDS, EVENTS,
};
use super::postgres::PgStore;
use super::sqlite::SqliteStore;
use crate::error::Result;

impl Clustered for PgStore {
    fn cluster(&self) -> Option<Arc<dyn ClusterStore>> {
        Some(Arc::new(self.clone()))
    }
}

impl Clustered for SqliteStore {
    fn cluster(&self) -> Option<Arc<dyn ClusterStore>> {
        None
    }
}

#[async_trait]
impl ClusterStore for PgStore {
    async fn register_node(&self, node: &NodeRecord, lease: Duration, again: bool) -> Result<()> {
        let sql = format!(
            "insert into nodes (id, hostname, boot_id, pid_namespace, pid, start_time,
               started_at, lease_until)
             values ($1, $2, $3, $4, $5, $6, now(), now() + make_interval(secs => $7)){}",
            if again {
                " on conflict (id) do nothing"
            } else {
                ""
            }
        );
        sqlx::query(&sql)
            .bind(node.id)
            .bind(&node.hostname)
            .bind(&node.boot_id)
            .bind(&node.pid_namespace)
            .bind(node.pid)
            .bind(node.start_time)
            .bind(lease.as_secs_f64())
            .execute(self.pool())
            .await?;
        Ok(())
    }

    async fn renew_lease(&self, node: Uuid, lease: Duration) -> Result<bool> {
        let renewed = sqlx::query(
            "update nodes set lease_until = now() + make_interval(secs => $2) where id = $1",
        )
        .bind(node)
        .bind(lease.as_secs_f64())
        .execute(self.pool())
        .await?;
        Ok(renewed.rows_affected() > 0)
    }

    async fn delete_node(&self, node: Uuid) -> Result<()> {
        sqlx::query("delete from nodes where id = $1")
            .bind(node)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    async fn node_lease(&self, node: Uuid) -> Result<Option<NodeLease>> {
        let row: Option<(String, String, i32, i64, bool)> = sqlx::query_as(
            "select boot_id, pid_namespace, pid, start_time, lease_until > now()
             from nodes where id = $1",
        )
        .bind(node)
        .fetch_optional(self.pool())
        .await?;
        Ok(row.map(
            |(boot_id, pid_namespace, pid, start_time, leased)| NodeLease {
                boot_id,
                pid_namespace,
                pid,
                start_time,
                leased,
            },
        ))
    }

    async fn delete_dead_nodes(&self) -> Result<()> {
        sqlx::query(
            "delete from nodes n where lease_until < now()
             and not exists (select 1 from conversations c where c.node_id = n.id)",
        )
        .execute(self.pool())
        .await?;
        Ok(())
    }

    async fn conversation_node(&self, conversation: Uuid) -> Result<Option<Option<Uuid>>> {
        Ok(
            sqlx::query_scalar("select node_id from conversations where id = $1")
                .bind(conversation)
                .fetch_optional(self.pool())
                .await?,
        )
    }

    async fn move_conversation(
        &self,
        conversation: Uuid,
        from: Option<Uuid>,
        to: Uuid,
    ) -> Result<Option<i64>> {
        Ok(sqlx::query_scalar(
            "update conversations set node_id = $2, owner_epoch = owner_epoch + 1
             where id = $1 and node_id is not distinct from $3
             returning owner_epoch",
        )
        .bind(conversation)
        .bind(to)
        .bind(from)
        .fetch_optional(self.pool())
        .await?)
    }

    async fn release_conversation(&self, conversation: Uuid, node: Uuid) -> Result<()> {
        sqlx::query("update conversations set node_id = null where id = $1 and node_id = $2")
            .bind(conversation)
            .bind(node)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    async fn release_all(&self, node: Uuid) -> Result<()> {
        sqlx::query("update conversations set node_id = null where node_id = $1")
            .bind(node)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    async fn owned_by_others(&self, node: Uuid) -> Result<Vec<(Uuid, Uuid)>> {
        Ok(sqlx::query_as(
            "select id, node_id from conversations where node_id is not null and node_id <> $1",
        )
        .bind(node)
        .fetch_all(self.pool())
        .await?)
    }

    async fn other_owners(&self, node: Uuid) -> Result<Vec<Uuid>> {
        Ok(sqlx::query_scalar(
            "select distinct node_id from conversations where node_id is not null and node_id <> $1",
        )
        .bind(node)
        .fetch_all(self.pool())
        .await?)
    }

    async fn owned_by(&self, node: Uuid) -> Result<Vec<Uuid>> {
        Ok(
            sqlx::query_scalar("select id from conversations where node_id = $1")
                .bind(node)
                .fetch_all(self.pool())
                .await?,
        )
    }

    async fn send_command(&self, command: SentCommand<'_>, notice: &str) -> Result<()> {
        sqlx::query(
            "with sent as (
               insert into commands (id, node_id, conversation_id, kind, body, created_at)
               values ($1, $2, $3, $4, $5, now()) returning id
             )
             select pg_notify($6, $7) from sent",
        )
        .bind(command.id)
        .bind(command.node)
        .bind(command.conversation)
        .bind(command.kind)
        .bind(Json(command.body))
        .bind(COMMANDS)
        .bind(notice)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    async fn command_answer(&self, id: Uuid) -> Result<Option<Value>> {
        let answer: Option<Option<Json<Value>>> =
            sqlx::query_scalar("select answer from commands where id = $1")
                .bind(id)
                .fetch_optional(self.pool())
                .await?;
        Ok(answer.flatten().map(|Json(answer)| answer))
    }

    async fn delete_command(&self, id: Uuid) -> Result<()> {
        sqlx::query("delete from commands where id = $1")
            .bind(id)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    async fn withdraw_command(&self, id: Uuid) -> Result<bool> {
        let untaken = sqlx::query("delete from commands where id = $1 and taken_at is null")
            .bind(id)
            .execute(self.pool())
            .await?
            .rows_affected();
        Ok(untaken == 1)
    }

    async fn delete_answered_command(&self, id: Uuid) -> Result<Option<Value>> {
        let answer: Option<Option<Json<Value>>> =
            sqlx::query_scalar("delete from commands where id = $1 returning answer")
                .bind(id)
                .fetch_optional(self.pool())
                .await?;
        Ok(answer.flatten().map(|Json(answer)| answer))
    }

    async fn waiting_commands(&self, node: Uuid) -> Result<Vec<Uuid>> {
        Ok(sqlx::query_scalar(
            "select id from commands where node_id = $1 and taken_at is null order by id",
        )
        .bind(node)
        .fetch_all(self.pool())
        .await?)
    }

    async fn mark_command_taken(&self, id: Uuid, node: Uuid) -> Result<Option<(Uuid, Value)>> {
        let taken: Option<(Uuid, Json<Value>)> = sqlx::query_as(
            "update commands set taken_at = now()
             where id = $1 and node_id = $2 and taken_at is null
             returning conversation_id, body",
        )
        .bind(id)
        .bind(node)
        .fetch_optional(self.pool())
        .await?;
        Ok(taken.map(|(conversation, Json(body))| (conversation, body)))
    }

    async fn answer_command(&self, id: Uuid, answer: &Value, notice: &str) -> Result<()> {
        sqlx::query(
            "with answered as (
               update commands set answer = $2, answered_at = now() where id = $1 returning id
             )
             select pg_notify($3, $4) from answered",
        )
        .bind(id)
        .bind(Json(answer))
        .bind(ANSWERS)
        .bind(notice)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    async fn delete_commands_older_than(&self, age: Duration) -> Result<()> {
        sqlx::query("delete from commands where created_at < now() - make_interval(secs => $1)")
            .bind(age.as_secs_f64())
            .execute(self.pool())
            .await?;
        Ok(())
    }

    async fn notify_events(&self, payloads: &[String]) -> Result<()> {
        sqlx::query("select pg_notify($1, p) from unnest($2::text[]) p")
            .bind(EVENTS)
            .bind(payloads)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    async fn listen(&self) -> Result<Box<dyn Listener>> {
        // A connection of its own (a pool of one), never one of the store's
        // pool: a connection that listens is sent notifications at any
        // moment, which a query made on it does not expect ("expected
        // ParseComplete, got NotificationResponse"); and the listener's
        // connection goes back to the pool it came from, still listening,
        // when a wait for a notice is cancelled while it reconnects (the
        // node waits in a `select!`). Connecting waits no longer than a
        // query does (sqlx's default is 30 s): the node tries again later,
        // and can stop meanwhile.
        let own = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(super::postgres::ACQUIRE_TIMEOUT)
            .connect_lazy_with((*self.pool().connect_options()).clone());
        let mut listener = PgListener::connect_with(&own).await?;
        listener.listen_all([EVENTS, COMMANDS, ANSWERS]).await?;
        Ok(Box::new(PgNotices(listener)))
    }
}

/// Postgres notifications on a connection of their own.
struct PgNotices(PgListener);

#[async_trait]
impl Listener for PgNotices {
    async fn recv(&mut self) -> Result<Option<Notice>> {
        loop {
            let Some(n) = self.0.try_recv().await? else {
                return Ok(None);
            };
            let channel = match n.channel() {
                EVENTS => Channel::Events,
                COMMANDS => Channel::Commands,
                ANSWERS => Channel::Answers,
                // Not listened to.
                _ => continue,
            };
            return Ok(Some(Notice {
                channel,
                payload: n.payload().to_owned(),
            }));
        }
    }
}
