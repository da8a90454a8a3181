//! Building and running the gateway: connect the store, apply migrations,
//! settle what a previous run left behind, bind, serve, stop cleanly.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use serde_json::json;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::acp::procs::{self, Host, Sweep};
use crate::api::{self, AppState};
use crate::bus::EventBus;
use crate::config::Config;
use crate::journal::{Journal, Sink};
use crate::model::{event_type, ConversationStatus, Decision, PermissionStatus};
use crate::policy::PolicyHandle;
use crate::store::{PermissionFilter, Resolution, Store};

/// How long stopping may take before agents are left to `kill_on_drop`.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// How often open WebSockets' tokens are checked for revocation (a token can
/// be revoked by the CLI or another node, so the database is asked).
const REVOCATION_CHECK: Duration = Duration::from_secs(1);

/// A gateway bound to its port, ready to serve.
pub struct Gateway {
    state: AppState,
    listener: TcpListener,
    tasks: TaskTracker,
    shutdown: CancellationToken,
}

impl Gateway {
    /// Connects to Postgres, migrates, recovers, and binds `config.listen`
    /// (port 0 picks a free port: see [`Gateway::local_addr`]).
    pub async fn build(config: Config) -> anyhow::Result<Gateway> {
        let url = config.database_url();
        tracing::info!(database = %redact_url(&url), "opening the database");
        let sink = Sink {
            store: crate::store::open(&url).await?,
            bus: EventBus::new(config.event_buffer),
        };
        recover(&sink)
            .await
            .context("Failed to settle conversations left by a previous run")?;
        let listener = TcpListener::bind(&config.listen)
            .await
            .with_context(|| format!("Failed to bind {}", config.listen))?;
        let shutdown = CancellationToken::new();
        let tasks = TaskTracker::new();
        let policies =
            PolicyHandle::new(config.policies.clone()).map_err(|e| anyhow::anyhow!(e))?;
        policies
            .refresh(&*sink.store)
            .await
            .context("Failed to load the operator policies")?;
        let auth_required = sink.store.any_active_token().await?;
        let addr = listener
            .local_addr()
            .context("Failed to read the bound address")?;
        check_exposure(&config, addr, auth_required)?;
        let auth = crate::auth::Auth::new(auth_required, config.rate_limits.clone());
        let state = AppState::new(
            config,
            sink,
            policies,
            auth,
            shutdown.clone(),
            tasks.clone(),
        );
        Ok(Gateway {
            state,
            listener,
            tasks,
            shutdown,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("bound listener has an address")
    }

    /// Serves until `stop` resolves, then closes every conversation's agent.
    pub async fn run(self, stop: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
        let app = api::router(self.state.clone());
        self.tasks.spawn(close_revoked_websockets(
            self.state.clone(),
            self.shutdown.clone(),
        ));
        let shutdown = self.shutdown.clone();
        tracing::info!(addr = %self.local_addr(), "acp-gateway listening");
        let stopping = async move {
            stop.await;
            shutdown.cancel();
        };
        axum::serve(self.listener, app)
            .with_graceful_shutdown(stopping)
            .await
            .context("HTTP server failed")?;
        self.shutdown.cancel();
        self.tasks.close();
        if tokio::time::timeout(STOP_GRACE, self.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!("some sessions did not stop in time");
        }
        Ok(())
    }
}

/// Closes the WebSockets of revoked tokens and removed users, within
/// [`REVOCATION_CHECK`] of the change.
async fn close_revoked_websockets(state: AppState, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(REVOCATION_CHECK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        if !state.auth().watching() {
            continue;
        }
        match state.store().active_token_ids().await {
            Ok(active) => state.auth().close_revoked(&active),
            Err(e) => tracing::warn!(error = %e, "could not check tokens for revocation"),
        }
    }
}

/// Conversations that still claim an agent belong to a previous run whose
/// agents are gone (what is left of them is killed first): end their turns,
/// expire their pending requests, close them, each with events so clients
/// learn what happened.
async fn recover(sink: &Sink) -> anyhow::Result<()> {
    kill_leftover_agents(&*sink.store)
        .await
        .context("Failed to go through the agent processes a previous run recorded")?;
    let detail = "the gateway restarted; the agent process is gone";
    for (conversation, turn_id) in sink.store.live_conversations().await? {
        tracing::info!(conversation_id = %conversation.id, "closing conversation left by a previous run");
        let mut journal = Journal::new(sink.clone(), &conversation, turn_id);
        let pending = sink
            .store
            .list_permissions(&PermissionFilter {
                pending_only: true,
                conversation_id: Some(conversation.id),
                owner: None,
            })
            .await?;
        for request in pending {
            let resolution = Resolution {
                permission_id: request.id,
                status: PermissionStatus::Expired,
                decision: Decision::new(None, "system".into(), Some(detail.into())),
            };
            journal.resolve(&resolution).await?;
        }
        if let Some(turn_id) = turn_id {
            journal.event(
                event_type::TURN_ENDED,
                json!({"turn_id": turn_id, "stop_reason": "error", "error": detail}),
            );
        }
        journal.event(
            event_type::AGENT_STATUS,
            json!({"status": "exited", "detail": detail}),
        );
        journal.set_turn(None);
        journal.set_status(ConversationStatus::Closed);
        journal.flush().await?;
    }
    Ok(())
}

/// Kills what the agents of a previous run on this machine left running
/// (a crashed gateway cannot take its agents' children with it) and forgets
/// every record: records of another boot, container or machine name no
/// process here.
async fn kill_leftover_agents(store: &dyn Store) -> anyhow::Result<()> {
    let records = store.list_agent_processes().await?;
    if records.is_empty() {
        return Ok(());
    }
    let Some(here) = Host::here() else {
        tracing::warn!(
            records = records.len(),
            "no /proc: cannot look for processes a previous run's agents left running"
        );
        return Ok(());
    };
    for record in records {
        let conversation_id = record.conversation_id;
        let pid = record.pid;
        if !here.sees(&record.boot_id, &record.pid_namespace) {
            tracing::info!(%conversation_id, pid, host = %record.hostname, boot_id = %record.boot_id,
                pid_namespace = %record.pid_namespace,
                "forgetting an agent process recorded under another boot, container or machine");
        } else {
            let start_time = u64::try_from(record.start_time).unwrap_or_default();
            let sweep = tokio::task::spawn_blocking(move || procs::kill_leftovers(pid, start_time))
                .await
                .context("the /proc scan panicked")?;
            match sweep {
                Ok(Sweep::Nothing) => {
                    tracing::info!(%conversation_id, pid, "nothing left of a previous run's agent");
                }
                Ok(Sweep::PidReused(now)) => {
                    tracing::info!(%conversation_id, pid, now = %now.comm,
                        "a previous run's agent is gone and its pid reused: nothing killed");
                }
                Ok(Sweep::Killed { killed, failed }) => {
                    let killed: Vec<String> = killed
                        .iter()
                        .map(|p| format!("{} ({})", p.pid, p.comm))
                        .collect();
                    tracing::warn!(%conversation_id, pid, killed = ?killed,
                        "killed what a previous run's agent left running");
                    for (p, e) in failed {
                        tracing::error!(%conversation_id, pid, error = %e,
                            "could not kill {} ({}), left by a previous run's agent", p.pid, p.comm);
                    }
                }
                Err(e) => {
                    tracing::warn!(%conversation_id, pid, error = %e,
                        "cannot look for what a previous run's agent left running");
                }
            }
        }
        store.forget_agent_process(&record).await?;
    }
    Ok(())
}

/// A database URL without its password, for logs.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let userinfo = &url[scheme_end + 3..at];
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{}{}:***{}", &url[..scheme_end + 3], user, &url[at..])
        }
        _ => url.to_owned(),
    }
}

/// Secure defaults: without any token the API is open, so it may only be
/// reachable from this machine. Also warns about agents that would run as root.
fn check_exposure(config: &Config, addr: SocketAddr, auth_required: bool) -> anyhow::Result<()> {
    if !auth_required {
        if !addr.ip().is_loopback() {
            anyhow::bail!(
                "refusing to listen on {addr} without authentication: no token exists yet. \
                 Create one first (acp-gateway token create --user NAME --role operator) \
                 or listen on 127.0.0.1"
            );
        }
        tracing::warn!(
            "no tokens exist: serving without authentication, on loopback only; \
             every caller is the operator \"anonymous\""
        );
    }
    if crate::acp::agent::running_as_root() && config.agent_user.is_none() {
        for agent in config.agents.iter().filter(|a| a.user.is_none()) {
            tracing::warn!(agent = %agent.name, "the gateway runs as root and this agent profile names no user: its agents will run as root");
        }
    }
    Ok(())
}
