//! The agent processes running for conversations, recorded while they run
//! so that a gateway starting after a crash finds and kills (or, under a
//! shim, reattaches to) what a previous run left. A part of
//! [`Store`](super::Store) (its supertrait), written once for both backends
//! by [`impl_process_store!`]. A shim's link state is also written with
//! each commit ([`Batch::link`](super::Batch::link)).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::error::Result;

/// An agent process while it runs (see [`crate::process::procs`]): what a
/// gateway starting after a crash needs to find and kill what it left.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct AgentProcessRecord {
    pub conversation_id: Uuid,
    /// Also its process group id.
    pub pid: i32,
    /// Clock ticks after boot (field 22 of `/proc/<pid>/stat`).
    pub start_time: i64,
    pub boot_id: String,
    pub pid_namespace: String,
    pub hostname: String,
    pub started_at: DateTime<Utc>,
    /// The socket of the shim the agent runs under (then `pid` and
    /// `start_time` are the shim's); `None`: the gateway's own child.
    pub shim_socket: Option<String>,
    /// What a gateway reattaching to the shim needs ([`AgentLink`], as
    /// JSON), kept up to date with each commit.
    pub link: Option<String>,
}

impl AgentProcessRecord {
    /// The link state last committed, if there is one and it reads.
    pub fn agent_link(&self) -> Option<AgentLink> {
        serde_json::from_str(self.link.as_deref()?).ok()
    }
}

/// Where a conversation stands with an agent under a shim, committed with
/// the events it accounts for: a gateway reattaching carries on from here.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AgentLink {
    /// Every byte of the agent's output before this is committed.
    pub output_to: u64,
    /// `output_to` lies inside a line too long to use, whose rest a
    /// gateway reattaching there discards first.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub output_inside_long_line: bool,
    /// The JSON-RPC id of the running turn's `session/prompt`.
    pub prompt_request: Option<u64>,
    /// The agent's JSON-RPC ids of its permission requests that wait for a
    /// person, by request id.
    pub waiting: std::collections::BTreeMap<Uuid, serde_json::Value>,
    /// Whether the agent takes `session/close`.
    pub can_close: bool,
    /// The agent's own pid and start time (the record's are the shim's).
    pub agent_pid: i32,
    pub agent_start_time: Option<u64>,
}

/// Persistence of agent processes (see the module).
#[async_trait]
pub trait ProcessStore: Send + Sync {
    /// Records a running agent process (replacing its conversation's earlier one).
    async fn record_agent_process(&self, record: &AgentProcessRecord) -> Result<()>;
    /// Deletes this record, if it is still the conversation's.
    async fn forget_agent_process(&self, record: &AgentProcessRecord) -> Result<()>;
    /// Every recorded agent process, of any machine.
    async fn list_agent_processes(&self) -> Result<Vec<AgentProcessRecord>>;
}

/// Implements [`ProcessStore`] for a backend type with a `pool` field (for
/// reads) and a `writer()` method (the pool every write goes through).
macro_rules! impl_process_store {
    ($store:ty) => {
        const _: () = {
            use $crate::error::Result;
            use $crate::store::processes::AgentProcessRecord;

            #[async_trait::async_trait]
            impl $crate::store::processes::ProcessStore for $store {
                async fn record_agent_process(&self, record: &AgentProcessRecord) -> Result<()> {
                    sqlx::query(
                        "insert into agent_processes (conversation_id, pid, start_time, boot_id,
                           pid_namespace, hostname, started_at, shim_socket, link)
                         values ($1, $2, $3, $4, $5, $6, $7, $8, $9)
                         on conflict (conversation_id) do update set
                           pid = excluded.pid, start_time = excluded.start_time,
                           boot_id = excluded.boot_id, pid_namespace = excluded.pid_namespace,
                           hostname = excluded.hostname, started_at = excluded.started_at,
                           shim_socket = excluded.shim_socket, link = excluded.link",
                    )
                    .bind(record.conversation_id)
                    .bind(record.pid)
                    .bind(record.start_time)
                    .bind(&record.boot_id)
                    .bind(&record.pid_namespace)
                    .bind(&record.hostname)
                    .bind(record.started_at)
                    .bind(&record.shim_socket)
                    .bind(&record.link)
                    .execute(self.writer())
                    .await?;
                    Ok(())
                }

                async fn forget_agent_process(&self, record: &AgentProcessRecord) -> Result<()> {
                    sqlx::query(
                        "delete from agent_processes where conversation_id = $1 and pid = $2
                           and start_time = $3 and boot_id = $4 and pid_namespace = $5",
                    )
                    .bind(record.conversation_id)
                    .bind(record.pid)
                    .bind(record.start_time)
                    .bind(&record.boot_id)
                    .bind(&record.pid_namespace)
                    .execute(self.writer())
                    .await?;
                    Ok(())
                }

                async fn list_agent_processes(&self) -> Result<Vec<AgentProcessRecord>> {
                    Ok(sqlx::query_as::<_, AgentProcessRecord>(
                        "select * from agent_processes order by conversation_id",
                    )
                    .fetch_all(&self.pool)
                    .await?)
                }
            }
        };
    };
}

pub(crate) use impl_process_store;
