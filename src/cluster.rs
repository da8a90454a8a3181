//! Several gateway nodes on one Postgres. A node is one gateway process
//! with an id of its own (a UUID made at start). It owns the conversations
//! whose agents it runs (`conversations.node_id`) while its lease (the
//! `nodes` row, renewed three times a `node_lease`) lasts. Postgres carries
//! the rest:
//!
//! - **Events:** the owner commits them as ever, then announces
//!   `(conversation, first seq, last seq)` on `NOTIFY acp_gateway_events`. A
//!   node with subscribers of that conversation (or of the inbox) reads them
//!   from the event table and publishes them on its own bus, so its
//!   WebSockets see what the owner's see, in the same order.
//! - **Commands:** one that reaches a node that does not own the
//!   conversation is written to `commands` for the owner (`NOTIFY
//!   acp_gateway_commands`), which runs it as if it had arrived there and
//!   writes the answer back (`NOTIFY acp_gateway_answers`). Whoever marks a
//!   command taken runs it: the owner, or the sender once the owner is dead.
//! - **Failover:** a node is dead once its lease ran out, or at once when it
//!   ran on this machine and its process is gone. The next command for one
//!   of its conversations claims it (and settles what it left: pending
//!   requests expire, a running turn ends); every node also sweeps for such
//!   conversations each renewal.
//!
//! SQLite serves one node: the file is locked while a gateway serves it.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use serde_json::Value;
use sqlx::postgres::{PgListener, PgPool, PgPoolOptions};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::bus::{Announced, EventBus};
use crate::error::{Error, Problem, Result};
use crate::process::procs::{self, Host};
use crate::store::Store;

const EVENTS: &str = "acp_gateway_events";
const COMMANDS: &str = "acp_gateway_commands";
const ANSWERS: &str = "acp_gateway_answers";
/// Events read per page while relaying.
const RELAY_PAGE: i64 = 1000;
/// Answered commands are deleted by their sender; ones left behind (a
/// sender that stopped while waiting) after this long.
const COMMAND_RETENTION_SECS: f64 = 600.0;

/// This node: cheap to clone.
#[derive(Clone)]
pub struct Node {
    inner: Arc<Inner>,
}

struct Inner {
    id: Uuid,
    lease: Duration,
    /// Postgres: shared with other nodes. `None` on SQLite.
    pool: Option<PgPool>,
    /// SQLite: the lock that keeps a second gateway off the file.
    lock: Mutex<Option<std::fs::File>>,
    /// Commands this node sent and waits for, by id.
    waiting: Mutex<HashMap<Uuid, oneshot::Sender<()>>>,
    announce: mpsc::UnboundedSender<Announced>,
    announced: Mutex<Option<mpsc::UnboundedReceiver<Announced>>>,
}

/// Who runs a conversation's agent, as [`Node::claim`] found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// This node, from now on; `took_from` the dead node that had it.
    Mine { took_from: Option<Uuid> },
    /// Another node, alive.
    Elsewhere(Uuid),
}

/// What became of a command sent to another node.
#[derive(Debug)]
pub enum Forwarded {
    /// The owner's answer.
    Answered(std::result::Result<Value, Box<Problem>>),
    /// The owner died before taking it: nothing was done.
    OwnerGone,
}

/// What a node does for the others: run the commands sent to it, and settle
/// the conversations of dead nodes.
#[async_trait::async_trait]
pub trait Duties: Send + Sync + 'static {
    async fn execute(
        &self,
        conversation: Uuid,
        command: Value,
    ) -> std::result::Result<Value, Box<Problem>>;
    async fn settle_orphans(&self);
}

impl Node {
    /// Joins the database at `url` as a new node: on Postgres, a `nodes` row
    /// with a lease; on SQLite, the file's lock (an error if another gateway
    /// holds it).
    pub async fn join(url: &str, lease: Duration) -> anyhow::Result<Node> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut node = Inner {
            id: Uuid::now_v7(),
            lease,
            pool: None,
            lock: Mutex::new(None),
            waiting: Mutex::new(HashMap::new()),
            announce: tx,
            announced: Mutex::new(Some(rx)),
        };
        if url.starts_with("sqlite:") {
            node.lock = Mutex::new(lock_sqlite(url)?);
        } else {
            let pool = PgPoolOptions::new()
                .max_connections(4)
                .acquire_timeout(Duration::from_secs(2))
                .connect(url)
                .await
                .context("Failed to connect to Postgres")?;
            register(&pool, node.id, lease, false)
                .await
                .context("Failed to register this gateway node")?;
            node.pool = Some(pool);
        }
        tracing::info!(node_id = %node.id, shared = node.pool.is_some(), "joined as a gateway node");
        Ok(Node {
            inner: Arc::new(node),
        })
    }

    pub fn id(&self) -> Uuid {
        self.inner.id
    }

    /// Whether other nodes may share the database (Postgres).
    pub fn is_shared(&self) -> bool {
        self.inner.pool.is_some()
    }

    /// Makes this node the owner of `conversation` unless a live node is.
    pub async fn claim(&self, conversation: Uuid) -> Result<Claim> {
        let Some(pool) = &self.inner.pool else {
            return Ok(Claim::Mine { took_from: None });
        };
        loop {
            let owner: Option<Option<Uuid>> =
                sqlx::query_scalar("select node_id from conversations where id = $1")
                    .bind(conversation)
                    .fetch_optional(pool)
                    .await?;
            let Some(owner) = owner else {
                return Err(Error::NotFound(format!("no conversation {conversation}")));
            };
            let took_from = match owner {
                Some(node) if node != self.id() => {
                    if self.alive(node).await? {
                        return Ok(Claim::Elsewhere(node));
                    }
                    Some(node)
                }
                _ => None,
            };
            let moved = sqlx::query(
                "update conversations set node_id = $2
                 where id = $1 and node_id is not distinct from $3",
            )
            .bind(conversation)
            .bind(self.id())
            .bind(owner)
            .execute(pool)
            .await?
            .rows_affected();
            if moved == 1 {
                if let Some(dead) = took_from {
                    tracing::info!(conversation_id = %conversation, dead_node = %dead,
                        "took over a conversation of a dead node");
                }
                return Ok(Claim::Mine { took_from });
            }
            // Claimed by someone else meanwhile: look again.
        }
    }

    /// The live node other than this one that owns `conversation`, if any.
    pub async fn runs_elsewhere(&self, conversation: Uuid) -> Result<Option<Uuid>> {
        let Some(pool) = &self.inner.pool else {
            return Ok(None);
        };
        let owner: Option<Option<Uuid>> =
            sqlx::query_scalar("select node_id from conversations where id = $1")
                .bind(conversation)
                .fetch_optional(pool)
                .await?;
        match owner.flatten() {
            Some(node) if node != self.id() && self.alive(node).await? => Ok(Some(node)),
            _ => Ok(None),
        }
    }

    /// Gives up ownership (its agent is gone from this node).
    pub async fn release(&self, conversation: Uuid) {
        let Some(pool) = &self.inner.pool else { return };
        let released =
            sqlx::query("update conversations set node_id = null where id = $1 and node_id = $2")
                .bind(conversation)
                .bind(self.id())
                .execute(pool)
                .await;
        if let Err(e) = released {
            tracing::warn!(conversation_id = %conversation, error = %e,
                "could not release the conversation (it passes to another node once this node's lease runs out)");
        }
    }

    /// The conversations that live nodes other than this one own.
    pub async fn owned_elsewhere(&self) -> Result<HashSet<Uuid>> {
        let Some(pool) = &self.inner.pool else {
            return Ok(HashSet::new());
        };
        let owned: Vec<(Uuid, Uuid)> = sqlx::query_as(
            "select id, node_id from conversations where node_id is not null and node_id <> $1",
        )
        .bind(self.id())
        .fetch_all(pool)
        .await?;
        let mut alive = HashMap::new();
        let mut elsewhere = HashSet::new();
        for (conversation, node) in owned {
            let live = match alive.get(&node) {
                Some(live) => *live,
                None => {
                    let live = self.alive(node).await?;
                    alive.insert(node, live);
                    live
                }
            };
            if live {
                elsewhere.insert(conversation);
            }
        }
        Ok(elsewhere)
    }

    /// Claims every conversation of a dead node: `(conversation, dead node)`.
    /// The caller settles them and gives them up.
    pub async fn take_orphans(&self) -> Result<Vec<(Uuid, Uuid)>> {
        let Some(pool) = &self.inner.pool else {
            return Ok(Vec::new());
        };
        let nodes: Vec<Uuid> = sqlx::query_scalar(
            "select distinct node_id from conversations where node_id is not null and node_id <> $1",
        )
        .bind(self.id())
        .fetch_all(pool)
        .await?;
        let mut taken = Vec::new();
        for node in nodes {
            if self.alive(node).await? {
                continue;
            }
            let ids: Vec<Uuid> = sqlx::query_scalar(
                "update conversations set node_id = $2 where node_id = $1 returning id",
            )
            .bind(node)
            .bind(self.id())
            .fetch_all(pool)
            .await?;
            taken.extend(ids.into_iter().map(|id| (id, node)));
        }
        // Dead nodes with nothing left go.
        sqlx::query(
            "delete from nodes n where lease_until < now()
             and not exists (select 1 from conversations c where c.node_id = n.id)",
        )
        .execute(pool)
        .await?;
        Ok(taken)
    }

    /// Whether `node` is alive: its lease holds and, when it ran on this
    /// machine, its process is still there.
    async fn alive(&self, node: Uuid) -> Result<bool> {
        if node == self.id() {
            return Ok(true);
        }
        let Some(pool) = &self.inner.pool else {
            return Ok(false);
        };
        let row: Option<(String, String, i32, i64, bool)> = sqlx::query_as(
            "select boot_id, pid_namespace, pid, start_time, lease_until > now()
             from nodes where id = $1",
        )
        .bind(node)
        .fetch_optional(pool)
        .await?;
        let Some((boot_id, pid_namespace, pid, start_time, leased)) = row else {
            return Ok(false);
        };
        let gone_here = Host::here().is_some_and(|h| h.sees(&boot_id, &pid_namespace))
            && !procs::stat(pid)
                .is_some_and(|s| s.is_running() && s.start_time as i64 == start_time);
        Ok(leased && !gone_here)
    }

    /// Sends `command` for `conversation` to its owner `owner` and waits for
    /// the answer.
    pub async fn forward(
        &self,
        conversation: Uuid,
        owner: Uuid,
        command: Value,
    ) -> Result<Forwarded> {
        let Some(pool) = &self.inner.pool else {
            return Ok(Forwarded::OwnerGone);
        };
        let id = Uuid::now_v7();
        let (tx, mut rx) = oneshot::channel();
        self.inner.waiting.lock().unwrap().insert(id, tx);
        let _forget = Forget(self, id);
        let kind = command
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        sqlx::query(
            "with sent as (
               insert into commands (id, node_id, conversation_id, kind, body, created_at)
               values ($1, $2, $3, $4, $5, now()) returning id
             )
             select pg_notify($6, $2::text || ' ' || id::text) from sent",
        )
        .bind(id)
        .bind(owner)
        .bind(conversation)
        .bind(&kind)
        .bind(sqlx::types::Json(&command))
        .bind(COMMANDS)
        .execute(pool)
        .await?;
        tracing::debug!(conversation_id = %conversation, %owner, kind, "sent a command to the owning node");
        let check = self.inner.lease / 3;
        let mut told = false;
        loop {
            tokio::select! {
                _ = &mut rx, if !told => told = true,
                _ = tokio::time::sleep(check) => {}
            }
            let answer: Option<Option<sqlx::types::Json<Value>>> =
                sqlx::query_scalar("select answer from commands where id = $1")
                    .bind(id)
                    .fetch_optional(pool)
                    .await?;
            if let Some(Some(sqlx::types::Json(answer))) = answer {
                sqlx::query("delete from commands where id = $1")
                    .bind(id)
                    .execute(pool)
                    .await?;
                return Ok(Forwarded::Answered(decode_answer(answer)));
            }
            if self.alive(owner).await? {
                continue;
            }
            // Dead: take the command back unless it was taken.
            let untaken = sqlx::query("delete from commands where id = $1 and taken_at is null")
                .bind(id)
                .execute(pool)
                .await?
                .rows_affected();
            if untaken == 1 {
                return Ok(Forwarded::OwnerGone);
            }
            let answer: Option<Option<sqlx::types::Json<Value>>> =
                sqlx::query_scalar("delete from commands where id = $1 returning answer")
                    .bind(id)
                    .fetch_optional(pool)
                    .await?;
            if let Some(Some(sqlx::types::Json(answer))) = answer {
                return Ok(Forwarded::Answered(decode_answer(answer)));
            }
            return Err(Error::Unavailable(
                "the gateway node running this conversation stopped while carrying out the request; \
                 try again"
                    .into(),
            ));
        }
    }

    /// Where the bus tells of committed events, for other nodes (sent,
    /// coalesced, by [`run`]); `None` on SQLite.
    pub fn announcer(&self) -> Option<mpsc::UnboundedSender<Announced>> {
        self.is_shared().then(|| self.inner.announce.clone())
    }

    /// Gives up every conversation this node owns (none of its agents runs).
    pub async fn release_all(&self) -> Result<()> {
        let Some(pool) = &self.inner.pool else {
            return Ok(());
        };
        sqlx::query("update conversations set node_id = null where node_id = $1")
            .bind(self.id())
            .execute(pool)
            .await?;
        Ok(())
    }

    /// Leaves on a clean stop: gives up every conversation, deletes the
    /// node's row, lets go of the SQLite file.
    pub async fn leave(&self) {
        self.inner.lock.lock().unwrap().take();
        let Some(pool) = &self.inner.pool else { return };
        let left = async {
            self.release_all().await?;
            sqlx::query("delete from nodes where id = $1")
                .bind(self.id())
                .execute(pool)
                .await?;
            Ok::<_, Error>(())
        };
        match left.await {
            Ok(()) => tracing::info!(node_id = %self.id(), "left the cluster"),
            Err(e) => {
                tracing::warn!(error = %e, "could not sign this node off; its lease runs out on its own")
            }
        }
    }

    async fn renew(&self, pool: &PgPool) {
        let renewed = sqlx::query(
            "update nodes set lease_until = now() + make_interval(secs => $2) where id = $1",
        )
        .bind(self.id())
        .bind(self.inner.lease.as_secs_f64())
        .execute(pool)
        .await;
        match renewed {
            Ok(r) if r.rows_affected() == 0 => {
                tracing::error!(node_id = %self.id(),
                    "this node's lease was given up by another node (it was taken for dead); \
                     registering again");
                if let Err(e) = register(pool, self.id(), self.inner.lease, true).await {
                    tracing::warn!(error = %e, "could not register this node again");
                }
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "could not renew this node's lease"),
        }
    }

    /// Runs the commands sent to this node that nobody took yet.
    async fn take_commands(&self, pool: &PgPool, duties: &Arc<dyn Duties>) {
        let waiting: Result<Vec<Uuid>, _> = sqlx::query_scalar(
            "select id from commands where node_id = $1 and taken_at is null order by id",
        )
        .bind(self.id())
        .fetch_all(pool)
        .await;
        match waiting {
            Ok(ids) => {
                for id in ids {
                    self.spawn_command(pool, duties, id);
                }
            }
            Err(e) => tracing::warn!(error = %e, "could not look for commands sent to this node"),
        }
    }

    fn spawn_command(&self, pool: &PgPool, duties: &Arc<dyn Duties>, id: Uuid) {
        let (node, pool, duties) = (self.clone(), pool.clone(), duties.clone());
        tokio::spawn(async move {
            if let Err(e) = node.run_command(&pool, &duties, id).await {
                tracing::warn!(command = %id, error = %e, "could not carry out a command from another node");
            }
        });
    }

    async fn run_command(&self, pool: &PgPool, duties: &Arc<dyn Duties>, id: Uuid) -> Result<()> {
        let taken: Option<(Uuid, sqlx::types::Json<Value>)> = sqlx::query_as(
            "update commands set taken_at = now()
             where id = $1 and node_id = $2 and taken_at is null
             returning conversation_id, body",
        )
        .bind(id)
        .bind(self.id())
        .fetch_optional(pool)
        .await?;
        let Some((conversation, sqlx::types::Json(command))) = taken else {
            return Ok(());
        };
        let answer = match duties.execute(conversation, command).await {
            Ok(value) => serde_json::json!({"ok": value}),
            Err(problem) => serde_json::json!({"problem": problem}),
        };
        sqlx::query(
            "with answered as (
               update commands set answer = $2, answered_at = now() where id = $1 returning id
             )
             select pg_notify($3, id::text) from answered",
        )
        .bind(id)
        .bind(sqlx::types::Json(&answer))
        .bind(ANSWERS)
        .execute(pool)
        .await?;
        Ok(())
    }
}

/// Writes this process's `nodes` row, its lease starting now (`again`: it
/// may be there already).
async fn register(
    pool: &PgPool,
    id: Uuid,
    lease: Duration,
    again: bool,
) -> Result<(), sqlx::Error> {
    let host = Host::here();
    let pid = std::process::id() as i32;
    let start_time = procs::stat(pid).map_or(0, |s| s.start_time as i64);
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
        .bind(id)
        .bind(host.map_or("", |h| h.hostname.as_str()))
        .bind(host.map_or("", |h| h.boot_id.as_str()))
        .bind(host.map_or("", |h| h.pid_namespace.as_str()))
        .bind(pid)
        .bind(start_time)
        .bind(lease.as_secs_f64())
        .execute(pool)
        .await?;
    Ok(())
}

/// Forgets a waiting command when its sender stops waiting.
struct Forget<'a>(&'a Node, Uuid);

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.0.inner.waiting.lock().unwrap().remove(&self.1);
    }
}

fn decode_answer(answer: Value) -> std::result::Result<Value, Box<Problem>> {
    if let Some(problem) = answer.get("problem") {
        return Err(Box::new(
            serde_json::from_value(problem.clone()).unwrap_or_else(|_| Problem {
                status: 500,
                code: "internal_error".into(),
                detail: "the owning node gave an answer this node cannot read".into(),
                extra: None,
                retry_after: None,
            }),
        ));
    }
    Ok(answer.get("ok").cloned().unwrap_or(Value::Null))
}

/// Takes the lock of a SQLite database file (`<file>.lock`), or says which
/// gateway holds it. In-memory databases need none.
fn lock_sqlite(url: &str) -> anyhow::Result<Option<std::fs::File>> {
    use std::io::{Read, Seek, Write};
    use std::str::FromStr;
    if url.contains(":memory:") || url.contains("mode=memory") {
        return Ok(None);
    }
    let options = sqlx::sqlite::SqliteConnectOptions::from_str(url)
        .with_context(|| format!("Invalid SQLite URL {url:?}"))?;
    let file = options.get_filename();
    if file.as_os_str().is_empty() {
        return Ok(None);
    }
    // A first start: the database's directory is made here, before the
    // store would make it.
    if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("Failed to create {}", dir.display()))?;
    }
    let mut path = PathBuf::from(file.as_os_str());
    path.as_mut_os_string().push(".lock");
    let mut lock = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .with_context(|| format!("Failed to open {}", path.display()))?;
    // flock(2): held by this open file until it is closed (or the process
    // ends, however it ends).
    use std::os::fd::AsRawFd;
    // SAFETY: flock on a descriptor this function owns.
    let locked = unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    let error = std::io::Error::last_os_error();
    match locked {
        0 => {}
        _ if error.raw_os_error() == Some(libc::EWOULDBLOCK) => {
            let mut holder = String::new();
            let _ = lock.read_to_string(&mut holder);
            anyhow::bail!(
                "another gateway ({}) is serving the SQLite database {}: SQLite serves one \
                 gateway node. Stop it, or use Postgres to run several nodes on one database",
                holder.trim(),
                file.display()
            );
        }
        _ => return Err(error).with_context(|| format!("Failed to lock {}", path.display())),
    }
    lock.set_len(0)?;
    lock.rewind()?;
    let host = Host::here().map_or("", |h| h.hostname.as_str());
    write!(lock, "pid {} on {host}", std::process::id())?;
    Ok(Some(lock))
}

/// The node's work for the others while the gateway runs (Postgres only):
/// renews the lease, sweeps for dead nodes' conversations, runs commands sent
/// to it, relays events committed elsewhere to its bus, and announces its own.
pub async fn run(
    node: Node,
    store: Arc<dyn Store>,
    bus: EventBus,
    duties: Arc<dyn Duties>,
    shutdown: CancellationToken,
) {
    let Some(pool) = node.inner.pool.clone() else {
        return;
    };
    let announced = node.inner.announced.lock().unwrap().take();
    let Some(announced) = announced else { return };
    let (relay_tx, relay_rx) = mpsc::unbounded_channel();
    tokio::spawn(announce(
        pool.clone(),
        node.id(),
        announced,
        shutdown.clone(),
    ));
    tokio::spawn(relay(store, bus, relay_rx, shutdown.clone()));
    let mut listener = loop {
        match listen(&pool).await {
            Ok(listener) => break listener,
            Err(e) => {
                tracing::warn!(error = %e, "could not listen for other nodes; trying again");
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(node.inner.lease / 3) => {}
                }
            }
        }
    };
    let mut tick = tokio::time::interval(node.inner.lease / 3);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let me = node.id().to_string();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {
                node.renew(&pool).await;
                node.take_commands(&pool, &duties).await;
                let duties = duties.clone();
                tokio::spawn(async move { duties.settle_orphans().await });
                let _ = sqlx::query(
                    "delete from commands where created_at < now() - make_interval(secs => $1)",
                )
                .bind(COMMAND_RETENTION_SECS)
                .execute(&pool)
                .await;
            }
            received = listener.try_recv() => match received {
                Ok(Some(n)) => {
                    let payload = n.payload();
                    match n.channel() {
                        EVENTS => {
                            if let Some(announced) = parse_announced(payload, &me) {
                                let _ = relay_tx.send(Relayed::Events(announced));
                            }
                        }
                        COMMANDS => {
                            let mut parts = payload.split(' ');
                            if parts.next() == Some(me.as_str()) {
                                if let Some(Ok(id)) = parts.next().map(Uuid::parse_str) {
                                    node.spawn_command(&pool, &duties, id);
                                }
                            }
                        }
                        ANSWERS => {
                            if let Ok(id) = Uuid::parse_str(payload) {
                                if let Some(tx) = node.inner.waiting.lock().unwrap().remove(&id) {
                                    let _ = tx.send(());
                                }
                            }
                        }
                        _ => {}
                    }
                }
                // The connection was lost and is made again: what was said
                // meanwhile is looked up.
                Ok(None) => {
                    tracing::warn!("lost the connection that listens to other nodes; reconnecting");
                    node.take_commands(&pool, &duties).await;
                    let _ = relay_tx.send(Relayed::CatchUp);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "listening to other nodes failed; trying again");
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(node.inner.lease / 3) => {}
                    }
                }
            }
        }
    }
}

async fn listen(pool: &PgPool) -> std::result::Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen_all([EVENTS, COMMANDS, ANSWERS]).await?;
    Ok(listener)
}

/// `node conversation first last`, unless this node sent it.
fn parse_announced(payload: &str, me: &str) -> Option<Announced> {
    let mut parts = payload.split(' ');
    if parts.next()? == me {
        return None;
    }
    Some(Announced {
        conversation: Uuid::parse_str(parts.next()?).ok()?,
        first: parts.next()?.parse().ok()?,
        last: parts.next()?.parse().ok()?,
    })
}

/// Sends this node's announcements, as many as are queued in one statement
/// (one per conversation).
async fn announce(
    pool: PgPool,
    me: Uuid,
    mut rx: mpsc::UnboundedReceiver<Announced>,
    shutdown: CancellationToken,
) {
    loop {
        let first = tokio::select! {
            _ = shutdown.cancelled() => return,
            first = rx.recv() => match first { Some(a) => a, None => return },
        };
        let mut merged: HashMap<Uuid, Announced> = HashMap::new();
        merge(&mut merged, first);
        while let Ok(a) = rx.try_recv() {
            merge(&mut merged, a);
        }
        let payloads: Vec<String> = merged
            .values()
            .map(|a| format!("{me} {} {} {}", a.conversation, a.first, a.last))
            .collect();
        if let Err(e) = sqlx::query("select pg_notify($1, p) from unnest($2::text[]) p")
            .bind(EVENTS)
            .bind(&payloads)
            .execute(&pool)
            .await
        {
            // Other nodes catch up with the next announcement.
            tracing::warn!(error = %e, "could not tell other nodes of new events");
        }
    }
}

/// Adds `a` to what is known of its conversation: one span from the lowest
/// seq to the highest.
fn merge(spans: &mut HashMap<Uuid, Announced>, a: Announced) {
    spans
        .entry(a.conversation)
        .and_modify(|m| {
            m.first = m.first.min(a.first);
            m.last = m.last.max(a.last);
        })
        .or_insert(a);
}

enum Relayed {
    Events(Announced),
    /// Notifications may have been missed: read what is new everywhere.
    CatchUp,
}

/// Publishes other nodes' events on this node's bus, in order, while this
/// node has subscribers for them.
async fn relay(
    store: Arc<dyn Store>,
    bus: EventBus,
    mut rx: mpsc::UnboundedReceiver<Relayed>,
    shutdown: CancellationToken,
) {
    // Per conversation: the last seq relayed, and its owner (user).
    let mut cursors: HashMap<Uuid, i64> = HashMap::new();
    let mut owners: HashMap<Uuid, Option<String>> = HashMap::new();
    loop {
        let first = tokio::select! {
            _ = shutdown.cancelled() => return,
            first = rx.recv() => match first { Some(r) => r, None => return },
        };
        let mut wanted: HashMap<Uuid, Announced> = HashMap::new();
        let mut take = |r: Relayed, cursors: &HashMap<Uuid, i64>| match r {
            Relayed::Events(a) => merge(&mut wanted, a),
            Relayed::CatchUp => {
                for (&conversation, &cursor) in cursors {
                    wanted.entry(conversation).or_insert(Announced {
                        conversation,
                        first: cursor + 1,
                        last: i64::MAX,
                    });
                }
            }
        };
        take(first, &cursors);
        while let Ok(r) = rx.try_recv() {
            take(r, &cursors);
        }
        for (conversation, a) in wanted {
            if !bus.has_subscribers(conversation) {
                cursors.remove(&conversation);
                continue;
            }
            let owner = match owners.get(&conversation) {
                Some(owner) => owner.clone(),
                None => match store.get_conversation(conversation).await {
                    Ok(Some(c)) => {
                        owners.insert(conversation, c.owner.clone());
                        c.owner
                    }
                    Ok(None) => continue,
                    Err(e) => {
                        tracing::warn!(conversation_id = %conversation, error = %e, "could not read a conversation to relay its events");
                        continue;
                    }
                },
            };
            let mut after = cursors.get(&conversation).copied().unwrap_or(a.first - 1);
            loop {
                let page = match store.list_events(conversation, after, RELAY_PAGE).await {
                    Ok(page) => page,
                    Err(e) => {
                        tracing::warn!(conversation_id = %conversation, error = %e, "could not read events to relay");
                        break;
                    }
                };
                let full = page.len() as i64 == RELAY_PAGE;
                if let Some(last) = page.last() {
                    after = last.seq;
                }
                bus.publish_relayed(owner.as_deref(), page);
                if !full || after >= a.last {
                    break;
                }
            }
            cursors.insert(conversation, after);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn announcements_of_this_node_are_skipped() {
        let me = Uuid::now_v7().to_string();
        let c = Uuid::now_v7();
        assert!(parse_announced(&format!("{me} {c} 1 5"), &me).is_none());
        let other = Uuid::now_v7();
        let a = parse_announced(&format!("{other} {c} 3 9"), &me).unwrap();
        assert_eq!((a.conversation, a.first, a.last), (c, 3, 9));
        assert!(parse_announced("garbage", &me).is_none());
    }

    #[test]
    fn answers_decode_to_values_and_problems() {
        assert_eq!(
            decode_answer(serde_json::json!({"ok": 5})),
            Ok(serde_json::json!(5))
        );
        let problem = decode_answer(
            serde_json::json!({"problem": {"status": 409, "code": "x", "detail": "d"}}),
        )
        .unwrap_err();
        assert_eq!((problem.status, problem.code.as_str()), (409, "x"));
        assert_eq!(
            decode_answer(serde_json::json!({"problem": 1}))
                .unwrap_err()
                .status,
            500
        );
    }

    #[test]
    fn a_second_gateway_cannot_take_a_sqlite_file() {
        let dir = tempfile::tempdir().unwrap();
        // In a directory that does not exist yet, as on a first start.
        let url = format!("sqlite://{}", dir.path().join("new/g.db").display());
        let held = lock_sqlite(&url).unwrap();
        assert!(held.is_some());
        let err = lock_sqlite(&url).unwrap_err().to_string();
        assert!(err.contains("SQLite serves one gateway node"), "{err}");
        assert!(
            err.contains(&format!("pid {}", std::process::id())),
            "{err}"
        );
        drop(held);
        assert!(lock_sqlite(&url).unwrap().is_some());
        assert!(lock_sqlite("sqlite::memory:").unwrap().is_none());
    }
}
