//! Building and running the gateway: connect the store, apply migrations,
//! recover what a previous run left behind, bind, serve, stop cleanly.

use std::future::{Future, IntoFuture};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::api::{self, AppState};
use crate::auth::Auth;
use crate::bus::EventBus;
use crate::cluster::Node;
use crate::config::Config;
use crate::notify::notifier::Notifier;
use crate::notify::Enqueue;
use crate::permissions::PolicyHandle;
use crate::session::journal::Outlets;
use crate::session::{self, Sessions};
use crate::store::Backend;

/// How long stopping may take beyond `shutdown_timeout` (agents stopping,
/// writes, WebSockets closing) before the rest is left to `kill_on_drop`.
const STOP_MARGIN: Duration = Duration::from_secs(5);
/// How often open WebSockets' tokens are checked for revocation (a token can
/// be revoked by the CLI or another node, so the database is asked).
const REVOCATION_CHECK: Duration = Duration::from_secs(1);

/// A gateway bound to its port, ready to serve.
pub struct Gateway {
    state: AppState,
    listener: TcpListener,
    tasks: TaskTracker,
    shutdown: CancellationToken,
    /// Follows the bus and hands what is due to the outbox; only when
    /// something to hand it to was given ([`Gateway::build_with`]).
    notifier: Option<crate::notify::notifier::Notifier>,
    /// The certificate HTTPS is served with (`tls`), else plain HTTP.
    tls: Option<Arc<crate::tls::Certificate>>,
}

impl Gateway {
    /// Opens the database (Postgres, or SQLite when nothing is set up),
    /// migrates, recovers, and binds `config.listen`
    /// (port 0 picks a free port: see [`Gateway::local_addr`]).
    pub async fn build(config: Config) -> anyhow::Result<Gateway> {
        Self::build_with(config, None).await
    }

    /// As [`Gateway::build`], notifying through `enqueue` (the outbox, or
    /// a test's recorder) when one is given.
    pub async fn build_with(
        config: Config,
        enqueue: Option<Arc<dyn Enqueue>>,
    ) -> anyhow::Result<Gateway> {
        crate::telemetry::install();
        let url = config.database_url();
        tracing::info!(database = %crate::store::redact_url(&url), "opening the database");
        // On SQLite, a second gateway is refused before it touches the file;
        // on Postgres, a node registers once the migrations made its table.
        let lock = match Backend::of(&url)? {
            Backend::Sqlite => crate::cluster::lock::lock_sqlite(&url)?,
            Backend::Postgres => None,
        };
        let outlets = Outlets {
            store: crate::store::open(&url).await?,
            bus: EventBus::new(config.event_buffer),
        };
        let node = Node::join(&*outlets.store, lock, config.node_lease).await?;
        if let Some(announcer) = node.announcer() {
            outlets.bus.announce_to(announcer);
        }
        let shims = session::recover::recover(&outlets, &node)
            .await
            .context("Failed to recover conversations left by a previous run")?;
        // Read before binding: a certificate that cannot be used stops the
        // start, with the file named.
        let tls = match &config.tls {
            Some(files) => Some(Arc::new(
                crate::tls::Certificate::open(&files.cert_file, &files.key_file)
                    .context("tls: the certificate cannot be used")?,
            )),
            None => None,
        };
        let listener = TcpListener::bind(&config.listen)
            .await
            .with_context(|| format!("Failed to bind {}", config.listen))?;
        let shutdown = CancellationToken::new();
        let tasks = TaskTracker::new();
        let policies =
            PolicyHandle::new(config.policies.clone()).map_err(|e| anyhow::anyhow!(e))?;
        policies
            .refresh(&*outlets.store)
            .await
            .context("Failed to load the operator policies")?;
        let auth_required = outlets.store.any_active_token().await?;
        let addr = listener
            .local_addr()
            .context("Failed to read the bound address")?;
        check_exposure(&config, addr, auth_required)?;
        let auth = Auth::new(auth_required, config.rate_limits.clone());
        let limits = config.agent_limits();
        tracing::info!(
            max_agents = limits.total,
            max_agents_per_user = limits.per_user,
            derived = config.max_agents.is_none(),
            "agent limits"
        );
        let outbox = std::sync::Arc::new(
            crate::notify::outbox::Outbox::new(
                outlets.store.clone(),
                &config.notifications,
                node.id(),
            )
            .await?,
        );
        let sessions = Sessions::new(
            outlets,
            node,
            policies,
            &config,
            shutdown.clone(),
            tasks.clone(),
        );
        // Agents left running under their shims go on where they were.
        sessions
            .reattach(shims)
            .await
            .context("Failed to reattach to the agents a previous run left running")?;
        // Remote agents whose requests wait are connected again.
        sessions
            .reconnect_remote_agents()
            .await
            .context("Failed to look for remote agents' pending requests")?;
        let state = AppState::new(config, auth, sessions, outbox.clone());
        // What the rules find due goes to the outbox (a test may record it
        // instead).
        let enqueue = enqueue.unwrap_or(outbox as Arc<dyn crate::notify::Enqueue>);
        let notifier = Some(Notifier {
            config: state.config().clone(),
            store: state.sessions().outlets().store.clone(),
            bus: state.bus().clone(),
            node: state.sessions().node().clone(),
            presence: state.presence().clone(),
            enqueue,
            actions: state
                .config()
                .notifications
                .base_url
                .clone()
                .map(|base_url| {
                    Arc::new(crate::notify::actions::Minter {
                        store: state.sessions().outlets().store.clone(),
                        base_url,
                        ttl: state.config().notifications.action_ttl,
                    }) as Arc<dyn crate::notify::notifier::MintActions>
                }),
        });
        Ok(Gateway {
            state,
            listener,
            tasks,
            shutdown,
            notifier,
            tls,
        })
    }

    /// What its WebSockets hold for their clients (`ws_buffer_bytes`).
    pub fn websocket_budget(&self) -> api::SendBudget {
        self.state.send_budget().clone()
    }

    /// The notifications' durable outbox (where the rules enqueue).
    pub fn outbox(&self) -> std::sync::Arc<crate::notify::outbox::Outbox> {
        self.state.outbox().clone()
    }

    /// What its stop will do to running agents; [`ShutdownPlan::cancel`]
    /// before the stop comes makes it cancel whatever `on_shutdown` says.
    pub fn shutdown_plan(&self) -> crate::config::ShutdownPlan {
        self.state.sessions().shutdown_plan().clone()
    }

    /// This gateway as a node of its database (see [`crate::cluster`]).
    pub fn node(&self) -> Node {
        self.state.sessions().node().clone()
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("bound listener has an address")
    }

    /// Serves until `stop` resolves, then shuts down gracefully: no new
    /// requests; every write is flushed; agents under shims are left
    /// running (`on_shutdown = "detach"`), or every running turn is
    /// cancelled and its agent given `shutdown_timeout` to end it and
    /// stopped; WebSockets get what was left and close with 1001.
    pub async fn run(
        mut self,
        stop: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let app = api::router(self.state.clone());
        self.tasks.spawn(close_revoked_websockets(
            self.state.clone(),
            self.shutdown.clone(),
        ));
        self.tasks
            .spawn(crate::telemetry::keep_up(self.shutdown.clone()));
        self.tasks
            .spawn(self.state.outbox().clone().run(self.shutdown.clone()));
        if let Some(notifier) = self.notifier.take() {
            self.tasks.spawn(notifier.run(self.shutdown.clone()));
        }
        let budgets = crate::budgets::watch::Watch {
            budgets: self.state.budgets().clone(),
            sessions: self.state.sessions().clone(),
            bus: self.state.bus().clone(),
        };
        self.tasks.spawn(budgets.run(self.shutdown.clone()));
        self.tasks.spawn(crate::store::search_backlog::run(
            self.state.sessions().outlets().store.clone(),
            self.shutdown.clone(),
        ));
        // Not tracked: it ends with the shutdown token; a last sweep follows
        // once every session has stopped.
        tokio::spawn(crate::process::spawn::reap_orphans(self.shutdown.clone()));
        let sessions = self.state.sessions().clone();
        let node = sessions.node().clone();
        // In the node's tasks: they end with the shutdown token, and are
        // waited for before the node leaves.
        node.start(
            sessions.outlets().store.clone(),
            sessions.outlets().bus.clone(),
            std::sync::Arc::new(sessions),
            self.shutdown.clone(),
        );
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        tracing::info!(addr = %self.local_addr(), scheme, node_id = %node.id(), "acp-gateway listening");
        let stopped = CancellationToken::new();
        // The peer's address: action URLs limit failed lookups per client.
        let service = app.into_make_service_with_connect_info::<SocketAddr>();
        let server = match self.tls.take() {
            None => tokio::spawn(
                axum::serve(self.listener, service)
                    .with_graceful_shutdown(stopped.clone().cancelled_owned())
                    .into_future(),
            ),
            Some(certificate) => {
                use axum::serve::ListenerExt;
                // Tapped (and left alone) so that its peers' addresses are
                // connection info like a TcpListener's.
                let listener =
                    crate::tls::TlsListener::new(self.listener, crate::tls::acceptor(certificate))?
                        .tap_io(|_| {});
                tokio::spawn(
                    axum::serve(listener, service)
                        .with_graceful_shutdown(stopped.clone().cancelled_owned())
                        .into_future(),
                )
            }
        };
        tokio::pin!(server);
        let served = tokio::select! {
            _ = stop => None,
            result = &mut server => Some(result),
        };
        tracing::info!("shutting down");
        stopped.cancel();
        self.shutdown.cancel();
        self.tasks.close();
        let grace = self.state.config().shutdown_timeout + STOP_MARGIN;
        if tokio::time::timeout(grace, self.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!("some sessions did not stop in time");
        }
        if crate::process::spawn::adopting() {
            let _ = tokio::task::spawn_blocking(crate::process::spawn::sweep_orphans).await;
        }
        if !node.stop(STOP_MARGIN).await {
            tracing::warn!("some of the node's work for other nodes did not stop in time");
        }
        // Every agent has stopped: other nodes may start them from now on.
        node.leave().await;
        self.state.close_websockets(STOP_MARGIN).await;
        let served = match served {
            Some(result) => result,
            None => match tokio::time::timeout(STOP_MARGIN, server).await {
                Ok(result) => result,
                Err(_) => {
                    tracing::warn!("some requests did not finish in time");
                    return Ok(());
                }
            },
        };
        served
            .context("the HTTP server task failed")?
            .context("HTTP server failed")
    }
}

/// Closes the WebSockets of revoked tokens, removed users and users whose
/// role changed, and those of share links revoked on another node, within
/// [`REVOCATION_CHECK`] of the change.
async fn close_revoked_websockets(state: AppState, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(REVOCATION_CHECK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        close_revoked_shares(&state).await;
        if !state.auth().watching() {
            continue;
        }
        match state.store().active_tokens().await {
            Ok(active) => state.auth().close_revoked(&active),
            Err(e) => tracing::warn!(error = %e, "could not check tokens for revocation"),
        }
    }
}

/// Closes the WebSockets of share links revoked on another node (those
/// revoked on this one closed at once; expired ones close on their own).
async fn close_revoked_shares(state: &AppState) {
    let asked = state.auth().watched_shares();
    if asked.is_empty() {
        return;
    }
    match state.store().unrevoked_share_links(&asked).await {
        Ok(unrevoked) => state.auth().close_revoked_shares(&asked, &unrevoked),
        Err(e) => tracing::warn!(error = %e, "could not check share links for revocation"),
    }
}

/// Secure defaults: without any token the API is open, so it may only be
/// reachable from this machine. Also warns about agents that would run as
/// root, or as the gateway's own user, and about boxes that are not what
/// their profile asks (see [`check_sandboxes`]).
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
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    for agent in config.agents.iter().filter_map(|a| config.agent(&a.name)) {
        let uid = match agent.user.as_deref().map(crate::sys::lookup_user) {
            None => me,
            Some(Ok(user)) => user.uid,
            // Validated at start: only a user removed since.
            Some(Err(_)) => continue,
        };
        if uid != me {
            continue;
        }
        if me == 0 {
            tracing::warn!(agent = %agent.name, "the gateway runs as root and so will this agent profile's agents: name an unprivileged user (user or agent_user)");
        } else if !agent.is_builtin_demo() {
            // The built-in demo agent is the gateway's own code: nothing to keep out.
            tracing::warn!(agent = %agent.name, "this agent profile's agents run as the gateway's own user: outside a box they can read what the gateway can (its config, its data, database_url_file) and signal it, and in one they can still reach its shims' sockets; name another user (user or agent_user) to keep them out");
        }
    }
    check_sandboxes(config);
    Ok(())
}

/// Warns, at start, where a profile's boxes are not what it asks: no
/// Landlock on this kernel (`auto` runs agents unconfined; `required`
/// refuses to start them), TCP ports that cannot be limited, and a box that
/// would hold the gateway's own state (its database, shims and homes); and
/// says which profiles' agents keep capabilities (and whether they can).
fn check_sandboxes(config: &Config) {
    let abi = crate::sandbox::landlock::kernel_abi();
    let state = std::path::absolute(config.state_dir()).unwrap_or_else(|_| config.state_dir());
    // Agents of other users reach their homes (and shims their sockets)
    // through it.
    let others = config.agent_user.is_some() || config.agents.iter().any(|a| a.user.is_some());
    let passable = {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(&state).map_or(true, |m| m.permissions().mode() & 0o001 != 0)
    };
    if others && !passable {
        tracing::warn!(state_dir = %state.display(), "agents run as other users but cannot pass through state_dir to their homes and shims' sockets: make it mode 0711");
    }
    for agent in &config.agents {
        let mode = agent.sandbox;
        let (effective, refused) =
            crate::sandbox::Effective::of(mode, agent.allowed_tcp_ports.is_some(), abi);
        if let Some(why) = refused {
            tracing::warn!(agent = %agent.name, "its conversations will not start: {why}");
        } else if let Some(detail) = effective
            .detail
            .filter(|_| mode != crate::sandbox::SandboxMode::Off)
        {
            tracing::warn!(agent = %agent.name, enforced = effective.enforced, "its agents' boxes are not all it asks: {detail}");
        }
        let kept = agent.kept_capabilities();
        if !kept.is_empty() {
            let names = kept.names().join(", ");
            match crate::sandbox::capabilities::CapSet::held().map(|held| kept.without(held)) {
                Ok(missing) if missing.is_empty() => {
                    tracing::warn!(agent = %agent.name, capabilities = %names, "its agents and their terminal commands keep these capabilities (every other agent keeps none)");
                }
                Ok(missing) => {
                    tracing::warn!(agent = %agent.name, capabilities = %names, "its conversations will not start: the gateway does not hold {}", missing.names().join(", "));
                }
                Err(e) => {
                    tracing::warn!(agent = %agent.name, error = %e, "its conversations will not start: cannot read the gateway's own capabilities");
                }
            }
        }
        let cwd = match &agent.cwd {
            Some(cwd) if cwd.to_string_lossy().contains("{user}") => continue,
            Some(cwd) => cwd.clone(),
            None => std::env::current_dir().unwrap_or_default(),
        };
        if mode == crate::sandbox::SandboxMode::Off {
            continue;
        }
        if state.starts_with(&cwd) {
            tracing::warn!(agent = %agent.name, state_dir = %state.display(), cwd = %cwd.display(), "the gateway's state (database, shims, every user's home) is inside this profile's default cwd, so inside its agents' boxes: set state_dir (or the database) elsewhere, or give the profile a cwd of its own");
            continue;
        }
        // The rest of a box in that cwd: the system, the program's
        // installation, the profile's own paths (its home is beneath the
        // state, never above it).
        let home = crate::sandbox::Home::at(&state.join("homes"));
        let rules = crate::sandbox::profile::rules(agent, &cwd, &home, &state, false);
        let mut granted = rules.read_only.iter().chain(&rules.read_write);
        if let Some(grant) = granted.find(|grant| state.starts_with(grant)) {
            tracing::warn!(agent = %agent.name, state_dir = %state.display(), granted = %grant.display(), "the gateway's state (database, shims, every user's home) is inside a path this profile's boxes grant, so its agents can reach it: set state_dir (or the database) elsewhere");
        }
    }
}
