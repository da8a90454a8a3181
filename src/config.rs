//! Gateway configuration: a TOML file (see `docs/configuration.md`)
//! plus the `DATABASE_URL` (or `DATABASE_URL_FILE`) and `ACP_GATEWAY_LISTEN`
//! environment overrides.
//!
//! Everything is validated when the gateway starts; every error names the key
//! that is wrong (`agents[1].cwd: must be an absolute path`).
//!
//! Data and its checks only, below every part it configures (of the crate
//! it uses only `model` and `sys`): what a setting does is the part's that
//! reads it. [`profile`] is an agent profile (`[[agents]]`),
//! [`url`] what a database URL names, [`addresses`] the addresses no
//! outgoing connection may reach unless allowed, `paths.rs` the data
//! directory used when nothing says where.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

pub mod profile;
pub mod url;
pub mod addresses;
pub mod budgets;
mod paths;

pub use budgets::Budget;
pub use paths::data_dir;
pub use profile::{AgentProfile, Transport};

/// The default config file looked up in the working directory.
pub const DEFAULT_CONFIG_FILE: &str = "acp-gateway.toml";

/// The whole configuration of one gateway process.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Address the HTTP server binds.
    #[serde(default = "default_listen")]
    pub listen: String,
    /// `postgres://…` or `sqlite://PATH`; default: SQLite in the data directory.
    pub database_url: Option<String>,
    /// A file holding the database URL (e.g. a Docker secret), read at
    /// start, instead of `database_url`: the URL then appears in no
    /// environment and no config file.
    pub database_url_file: Option<PathBuf>,
    /// Longest line accepted from an agent's stdout; longer lines are discarded.
    #[serde(default = "default_max_line_bytes")]
    pub max_line_bytes: usize,
    /// Largest accepted REST request body.
    #[serde(default = "default_max_body_bytes")]
    pub max_body_bytes: usize,
    /// Most ACP client connections (`/api/v1/acp`) one user may hold open
    /// at once; one more is refused (429).
    #[serde(default = "default_acp_connections_per_user")]
    pub acp_connections_per_user: usize,
    /// Seconds an ACP Streamable HTTP connection may go with no event
    /// stream open and no POST before it is ended.
    #[serde(default = "default_acp_http_idle_secs")]
    pub acp_http_idle_secs: u64,
    /// How many live events a WebSocket subscriber may fall behind before it
    /// catches up from the database instead.
    #[serde(default = "default_event_buffer")]
    pub event_buffer: usize,
    /// The agent profiles conversations can be started with.
    #[serde(default)]
    pub agents: Vec<AgentProfile>,
    /// Operator auto-approve rules, in order (the API can replace them).
    #[serde(default)]
    pub policies: Vec<crate::model::PolicyRule>,
    /// Origins allowed to call the API from a browser (CORS is off without).
    #[serde(default)]
    pub cors_origins: Vec<String>,
    /// Per-token request limits.
    #[serde(default)]
    pub rate_limits: RateLimits,
    /// The system user agents run as when their profile names none.
    pub agent_user: Option<String>,
    /// Most agent processes running at once on this node (default: derived
    /// from the machine, see [`default_max_agents`]). When a conversation
    /// needs one more, the longest-idle agent is stopped first; when none is
    /// idle, the request gets 503.
    pub max_agents: Option<usize>,
    /// Most agent processes of one user's conversations running at once on
    /// this node (default: half of `max_agents`, at least 1). When one more
    /// is needed, that user's longest-idle agent is stopped first; when none
    /// of theirs is idle, the request gets 429.
    pub max_agents_per_user: Option<usize>,
    /// Most bytes of JSON one page of events or messages holds (REST pages
    /// and a WebSocket's catch-up reads alike); a page stops before the item
    /// that would pass it (it always holds at least one).
    #[serde(default = "default_max_page_bytes")]
    pub max_page_bytes: usize,
    /// Most bytes every WebSocket together holds for clients that have not
    /// taken them yet. When they are full, the sockets that stopped reading
    /// (holding the most first) are closed with 1013 to make room, and their
    /// clients resume with `after`.
    #[serde(default = "default_ws_buffer_bytes")]
    pub ws_buffer_bytes: usize,
    /// Most bytes the WebSockets of one user together hold (default: a
    /// quarter of `ws_buffer_bytes`, at least `max_page_bytes`); over it,
    /// that user's sockets that stopped reading are closed, never another
    /// user's.
    pub ws_buffer_bytes_per_user: Option<usize>,
    /// On SIGTERM/SIGINT, how long running turns' agents get to answer their
    /// cancel (so those turns end `cancelled`) before agents are stopped.
    #[serde(default = "default_shutdown_timeout", with = "humantime_serde")]
    pub shutdown_timeout: Duration,
    /// Most events a conversation holds in memory while the database is
    /// unreachable; beyond that its agent's output waits in its pipe.
    #[serde(default = "default_write_buffer_events")]
    pub write_buffer_events: usize,
    /// How long a node's hold on its conversations lasts without renewal
    /// (several nodes on one Postgres: see `docs/operating.md`). A node renews it
    /// three times a lease; once it runs out, other nodes take over.
    #[serde(default = "default_node_lease", with = "humantime_serde")]
    pub node_lease: Duration,
    /// Notifications that reach a person (see `crate::notify`).
    #[serde(default)]
    pub notifications: Notifications,
    /// Read-only share links of conversations (`POST …/share-links`): off
    /// unless set. Off, no link can be made and those made before answer
    /// 404 (until it is set again, if they have not expired).
    #[serde(default)]
    pub share_links: bool,
    /// Where the gateway keeps its shims' sockets (default: the directory
    /// of the SQLite file, else the data directory).
    pub state_dir: Option<PathBuf>,
    /// The git program worktrees are made and changes read with (default:
    /// `git` on the gateway's `PATH`).
    pub git: Option<PathBuf>,
    /// Where conversations' worktrees are made (default
    /// `<state_dir>/worktrees`); on several nodes, storage they all reach.
    pub worktrees_dir: Option<PathBuf>,
    /// Run each agent under a shim (`acp-gateway shim`) that outlives the
    /// gateway, so a restart or a crash of the gateway ends no turn.
    #[serde(default = "default_true")]
    pub agent_shims: bool,
    /// Most bytes of an agent's output its shim holds until the gateway has
    /// committed them; when full, the agent waits.
    #[serde(default = "default_shim_buffer")]
    pub shim_buffer: usize,
    /// The executable that runs `shim` (default: this one; tests, whose
    /// gateway runs inside the test binary, name the real one).
    pub shim_program: Option<PathBuf>,
    /// What SIGTERM/SIGINT does to running agents: `detach` leaves them
    /// running under their shims for the next start; `cancel` cancels their
    /// turns and stops them.
    #[serde(default)]
    pub on_shutdown: OnShutdown,
    /// Serve HTTPS (and `wss://`) with this certificate instead of plain
    /// HTTP; its files are read again when they change.
    pub tls: Option<TlsFiles>,
    /// What agents may spend (see [`budgets`]).
    #[serde(default)]
    pub budgets: Vec<Budget>,
}

/// `tls = { cert_file, key_file }`: PEM files, the certificate chain (leaf
/// first) and its private key.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TlsFiles {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

/// What the coming stop of the gateway does to its agents: `on_shutdown`,
/// unless the way it is stopped says otherwise (Ctrl-C at a terminal
/// cancels). Shared by every session; read when the stop comes.
#[derive(Debug, Clone)]
pub struct ShutdownPlan(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl ShutdownPlan {
    pub fn new(on_shutdown: OnShutdown) -> ShutdownPlan {
        let detach = on_shutdown == OnShutdown::Detach;
        ShutdownPlan(std::sync::Arc::new(std::sync::atomic::AtomicBool::new(
            detach,
        )))
    }

    /// This stop cancels turns and stops agents, whatever `on_shutdown` says.
    pub fn cancel(&self) {
        self.0.store(false, std::sync::atomic::Ordering::Release);
    }

    /// Whether agents under shims are left running.
    pub fn detaches(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Acquire)
    }
}

/// What stopping the gateway does to its agents.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnShutdown {
    /// Commit everything and leave agents (under shims) running.
    #[default]
    Detach,
    /// Cancel running turns, stop the agents.
    Cancel,
}

/// `[notifications]`: when a person is notified, how much a notification
/// says, and where its answers point.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Notifications {
    /// The gateway's address as a phone reaches it, for action URLs
    /// (`<base_url>/api/v1/actions/<token>`); without it, notifications
    /// carry no actions.
    pub base_url: Option<String>,
    /// How long a permission request waits, its owner away, before it is
    /// notified.
    #[serde(default = "default_notify_grace", with = "humantime_serde")]
    pub grace: Duration,
    /// How long before a profile's `permission_timeout` answers a request
    /// its owner is reminded.
    #[serde(default = "default_reminder_before", with = "humantime_serde")]
    pub reminder_before: Duration,
    /// The shortest turn whose end, its owner away, is notified.
    #[serde(default = "default_min_turn", with = "humantime_serde")]
    pub min_turn: Duration,
    /// How long an action URL works at most (it also ends with its request).
    #[serde(default = "default_action_ttl", with = "humantime_serde")]
    pub action_ttl: Duration,
    /// How much channels the operator does not control (ntfy, webhook,
    /// FCM) are told; Web Push payloads are end-to-end encrypted and get
    /// everything.
    #[serde(default)]
    pub detail: NotificationDetail,
    /// Admit targets on loopback, private, link-local or metadata addresses,
    /// and plain `http://` URLs (receivers on this machine, tests).
    #[serde(default)]
    pub allow_private_targets: bool,
    /// Firebase Cloud Messaging, for targets of kind `fcm`.
    pub fcm: Option<FcmConfig>,
    /// How long the outbox waits before its first retry of a delivery; each
    /// next wait doubles (5 attempts at most: over 10 minutes at the
    /// default 40s). Not in the operators' reference: for tests.
    #[serde(default = "default_retry_base", with = "humantime_serde")]
    pub retry_base: Duration,
}

/// `[notifications.fcm]`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FcmConfig {
    /// A Firebase service account's JSON key file (its `project_id`,
    /// `client_email`, `private_key` and `token_uri` are used).
    pub service_account_file: PathBuf,
    /// Where FCM's HTTP v1 API is (default `https://fcm.googleapis.com`);
    /// tests point it at a stand-in on loopback.
    pub api_base: Option<String>,
}

/// `notifications.detail`.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum NotificationDetail {
    /// A tool call's title and kind; no command text, no message text.
    #[default]
    Minimal,
    Full,
}

impl Default for Notifications {
    fn default() -> Self {
        Notifications {
            base_url: None,
            grace: default_notify_grace(),
            reminder_before: default_reminder_before(),
            min_turn: default_min_turn(),
            action_ttl: default_action_ttl(),
            detail: NotificationDetail::default(),
            allow_private_targets: false,
            fcm: None,
            retry_base: default_retry_base(),
        }
    }
}

fn default_retry_base() -> Duration {
    Duration::from_secs(40)
}
fn default_notify_grace() -> Duration {
    Duration::from_secs(15)
}
fn default_reminder_before() -> Duration {
    Duration::from_secs(120)
}
fn default_min_turn() -> Duration {
    Duration::from_secs(30)
}
fn default_action_ttl() -> Duration {
    Duration::from_secs(3600)
}

/// Requests per minute allowed: prompts and WebSocket connections per
/// token, new conversations per user (each starts an agent process, and a
/// user may hold many tokens).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RateLimits {
    #[serde(default = "default_prompts_per_minute")]
    pub prompts_per_minute: u32,
    #[serde(default = "default_connections_per_minute")]
    pub connections_per_minute: u32,
    #[serde(default = "default_conversations_per_minute")]
    pub conversations_per_minute: u32,
}

fn default_prompts_per_minute() -> u32 {
    30
}
fn default_connections_per_minute() -> u32 {
    120
}
fn default_conversations_per_minute() -> u32 {
    10
}

impl Default for RateLimits {
    fn default() -> Self {
        RateLimits {
            prompts_per_minute: default_prompts_per_minute(),
            connections_per_minute: default_connections_per_minute(),
            conversations_per_minute: default_conversations_per_minute(),
        }
    }
}

/// Memory assumed for one agent process and what it runs (a Node.js agent
/// such as Claude Code's adapter takes 150–300 MB, its tools more).
const MEMORY_PER_AGENT: u64 = 512 * 1024 * 1024;
/// Agents per CPU: agents mostly wait for their model, but their tools
/// (builds, tests) compete for the CPUs.
const AGENTS_PER_CPU: usize = 8;

/// The `max_agents` of a machine with `memory` bytes (`None`: unknown) and
/// `cpus` CPUs: one agent per 512 MiB, at most 8 per CPU, at least 2.
pub fn default_max_agents(memory: Option<u64>, cpus: usize) -> usize {
    let by_cpus = cpus.max(1) * AGENTS_PER_CPU;
    let by_memory = memory.map_or(by_cpus, |m| {
        usize::try_from(m / MEMORY_PER_AGENT).unwrap_or(usize::MAX)
    });
    by_cpus.min(by_memory).max(2)
}

/// How many agents may run at once on this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentLimits {
    /// Every conversation's together (`max_agents`).
    pub total: usize,
    /// One user's conversations' (`max_agents_per_user`).
    pub per_user: usize,
}

fn default_listen() -> String {
    "127.0.0.1:8080".into()
}
/// An ACP message is text and, at most, an image or a file embedded in
/// base64 (model APIs take images up to 5 MB, 6.7 MB as base64): 8 MiB holds
/// that, and bounds what one line can cost the gateway.
fn default_max_line_bytes() -> usize {
    8 * 1024 * 1024
}
fn default_max_body_bytes() -> usize {
    8 * 1024 * 1024
}
fn default_acp_connections_per_user() -> usize {
    8
}
fn default_acp_http_idle_secs() -> u64 {
    300
}
fn default_event_buffer() -> usize {
    1024
}
/// 20 clients reading pages at once then hold tens of MB, not hundreds.
fn default_max_page_bytes() -> usize {
    1024 * 1024
}
/// Room for 64 clients each a full page behind.
fn default_ws_buffer_bytes() -> usize {
    64 * 1024 * 1024
}
fn default_write_buffer_events() -> usize {
    10_000
}
fn default_shutdown_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_true() -> bool {
    true
}

fn default_shim_buffer() -> usize {
    64 * 1024 * 1024
}

fn default_node_lease() -> Duration {
    Duration::from_secs(15)
}

impl Config {
    /// Loads the config: the given file, else `acp-gateway.toml` if present,
    /// else defaults; then applies the environment overrides and validates.
    pub fn load(path: Option<&Path>) -> anyhow::Result<Config> {
        let mut config = match path {
            Some(path) => Self::from_file(path)?,
            None if Path::new(DEFAULT_CONFIG_FILE).exists() => {
                Self::from_file(Path::new(DEFAULT_CONFIG_FILE))?
            }
            None => {
                tracing::info!("no config file: serving the built-in demo agent");
                let mut config = Self::parse("")?;
                config.agents.push(AgentProfile::builtin_demo()?);
                config
            }
        };
        config.database_url_from(
            std::env::var("DATABASE_URL").ok(),
            std::env::var_os("DATABASE_URL_FILE").map(PathBuf::from),
        )?;
        if path.is_none() && !Path::new(DEFAULT_CONFIG_FILE).exists() {
            config.keep_the_demo_away_from_the_state()?;
        }
        if let Ok(listen) = std::env::var("ACP_GATEWAY_LISTEN") {
            config.listen = listen;
        }
        config.validate()?;
        Ok(config)
    }

    /// Where the database URL comes from: the environment's `DATABASE_URL`
    /// or `DATABASE_URL_FILE` (never both), else the config's
    /// `database_url_file` or `database_url` (never both); a file is read now.
    fn database_url_from(
        &mut self,
        env_url: Option<String>,
        env_file: Option<PathBuf>,
    ) -> anyhow::Result<()> {
        match (env_url, env_file) {
            (Some(_), Some(_)) => {
                bail!("DATABASE_URL_FILE: set either DATABASE_URL or DATABASE_URL_FILE, not both")
            }
            (Some(url), None) => {
                self.database_url = Some(url);
                self.database_url_file = None;
            }
            (None, Some(file)) => {
                self.database_url = Some(read_secret(&file, "DATABASE_URL_FILE")?);
                self.database_url_file = Some(file);
            }
            (None, None) => {
                if let Some(file) = &self.database_url_file {
                    if self.database_url.is_some() {
                        bail!("database_url_file: set either database_url or database_url_file, not both");
                    }
                    self.database_url = Some(read_secret(file, "database_url_file")?);
                }
            }
        }
        Ok(())
    }

    fn from_file(path: &Path) -> anyhow::Result<Config> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("Failed to read config file {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("Invalid config file {}", path.display()))
    }

    /// Parses TOML text (no environment overrides, no validation).
    pub fn parse(text: &str) -> anyhow::Result<Config> {
        // toml's error message names the key and shows the offending line.
        Ok(toml::from_str(text)?)
    }

    /// Checks what serde cannot: formats, uniqueness, absolute paths.
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.listen.parse::<SocketAddr>().is_err() {
            // A host name (`localhost:8080`) is resolved when binding.
            let valid = self.listen.rsplit_once(':').is_some_and(|(host, port)| {
                !host.is_empty()
                    && host
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || ".-_".contains(c))
                    && port.parse::<u16>().is_ok()
            });
            if !valid {
                bail!(
                    "listen: expected host:port (e.g. 127.0.0.1:8080 or localhost:8080), got {:?}",
                    self.listen
                );
            }
        }
        if let Some(url) = &self.database_url {
            if url::Backend::of(url).is_err() {
                match &self.database_url_file {
                    Some(file) => bail!(
                        "database_url_file: the URL in {} must start with postgres://, postgresql:// or sqlite://",
                        file.display()
                    ),
                    None => bail!(
                        "database_url: must start with postgres://, postgresql:// or sqlite://"
                    ),
                }
            }
        }
        if self.database_url_file.is_some() && self.database_url.is_none() {
            bail!("database_url_file: not read yet (the config must be loaded with Config::load)");
        }
        if self.max_line_bytes < 1024 {
            bail!("max_line_bytes: must be at least 1024");
        }
        // A line the gateway may still use is acknowledged to the shim
        // only once it is whole: a shim that could not hold one would stop
        // reading its agent in the middle of it for good.
        if self.agent_shims && self.shim_buffer <= self.max_line_bytes {
            bail!(
                "shim_buffer: must be more than max_line_bytes ({}), so that a shim holds a whole line",
                self.max_line_bytes
            );
        }
        if self.max_body_bytes < 1024 {
            bail!("max_body_bytes: must be at least 1024");
        }
        if self.event_buffer == 0 {
            bail!("event_buffer: must be at least 1");
        }
        crate::model::policy_input::check_rules(&self.policies).map_err(|e| anyhow::anyhow!(e))?;
        for (i, origin) in self.cors_origins.iter().enumerate() {
            if origin.parse::<axum::http::HeaderValue>().is_err() || !origin.contains("://") {
                bail!(
                    "cors_origins[{i}]: {origin:?} is not an origin like https://app.example.com"
                );
            }
        }
        if let Some(user) = &self.agent_user {
            crate::sys::lookup_user(user).map_err(|e| anyhow::anyhow!("agent_user: {e}"))?;
        }
        if self.write_buffer_events == 0 {
            bail!("write_buffer_events: must be at least 1");
        }
        if self.node_lease < Duration::from_millis(300) {
            bail!("node_lease: must be at least 300ms");
        }
        if let Some(url) = &self.notifications.base_url {
            if !(url.starts_with("https://") || url.starts_with("http://")) || url.ends_with('/') {
                bail!(
                    "notifications.base_url: {url:?} must be an http(s) URL without a trailing / \
                     (e.g. https://gateway.example.com)"
                );
            }
        }
        if self.shutdown_timeout.is_zero() {
            bail!("shutdown_timeout: must be greater than zero");
        }
        if self.max_agents == Some(0) {
            bail!("max_agents: must be at least 1 (leave it out for a default derived from the machine)");
        }
        if self.max_agents_per_user == Some(0) {
            bail!("max_agents_per_user: must be at least 1 (leave it out for half of max_agents)");
        }
        if self.max_page_bytes < 1024 {
            bail!("max_page_bytes: must be at least 1024");
        }
        if self.ws_buffer_bytes < self.max_page_bytes {
            bail!(
                "ws_buffer_bytes: must be at least max_page_bytes ({}), so that a page fits",
                self.max_page_bytes
            );
        }
        if let Some(per_user) = self.ws_buffer_bytes_per_user {
            if per_user < self.max_page_bytes || per_user > self.ws_buffer_bytes {
                bail!(
                    "ws_buffer_bytes_per_user: must be at least max_page_bytes ({}), so that a \
                     page fits, and at most ws_buffer_bytes ({})",
                    self.max_page_bytes,
                    self.ws_buffer_bytes
                );
            }
        }
        for (key, per_minute) in [
            ("prompts_per_minute", self.rate_limits.prompts_per_minute),
            (
                "connections_per_minute",
                self.rate_limits.connections_per_minute,
            ),
            (
                "conversations_per_minute",
                self.rate_limits.conversations_per_minute,
            ),
        ] {
            if per_minute == 0 {
                bail!("rate_limits.{key}: must be at least 1 per minute");
            }
        }
        let mut names = HashSet::new();
        for (i, agent) in self.agents.iter().enumerate() {
            let key = format!("agents[{i}]");
            agent.validate_name(&key)?;
            if !names.insert(agent.name.as_str()) {
                bail!("{key}.name: {:?} is used by an earlier agent", agent.name);
            }
            agent.validate(&key)?;
        }
        let profiles: Vec<&str> = self.agents.iter().map(|a| a.name.as_str()).collect();
        budgets::validate(&self.budgets, &profiles)?;
        Ok(())
    }

    /// The database to use: the configured URL, else an SQLite file in the
    /// data directory ([`data_dir`]).
    pub fn database_url(&self) -> String {
        self.database_url_in(&data_dir())
    }

    fn database_url_in(&self, data_dir: &Path) -> String {
        if let Some(url) = &self.database_url {
            return url.clone();
        }
        format!("sqlite://{}", data_dir.join("acp-gateway.db").display())
    }

    /// With no config file, the demo profile's conversations run in the
    /// gateway's working directory, unless that holds the gateway's state
    /// (`./data/`, or a data directory beneath it): then in `<state_dir>/demo/`,
    /// made now, so that no box of theirs holds the database, the shims or
    /// the homes.
    fn keep_the_demo_away_from_the_state(&mut self) -> anyhow::Result<()> {
        let state = std::path::absolute(self.state_dir()).context("Failed to resolve state_dir")?;
        let here = std::env::current_dir().context("Failed to read the working directory")?;
        if !state.starts_with(&here) {
            return Ok(());
        }
        let demo_cwd = state.join("demo");
        std::fs::create_dir_all(&demo_cwd)
            .with_context(|| format!("Failed to create {}", demo_cwd.display()))?;
        tracing::info!(cwd = %demo_cwd.display(), "the working directory holds the gateway's state: the demo agent works in a directory of its own");
        for agent in &mut self.agents {
            agent.cwd = Some(demo_cwd.clone());
        }
        Ok(())
    }

    /// Where shims' sockets go (`<state_dir>/shims/`): the configured
    /// `state_dir`, else the SQLite file's directory, else the data
    /// directory.
    pub fn state_dir(&self) -> PathBuf {
        if let Some(dir) = &self.state_dir {
            return dir.clone();
        }
        let url = self.database_url();
        if url.starts_with("sqlite:") {
            if let Ok(Some(file)) = url::sqlite_file(&url) {
                if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
                    return dir.to_path_buf();
                }
            }
        }
        data_dir()
    }

    /// Where each user's homes are made (`<state_dir>/homes`, absolute: it
    /// is where agents' `HOME`s point).
    pub fn homes_dir(&self) -> PathBuf {
        let dir = self.state_dir().join("homes");
        std::path::absolute(&dir).unwrap_or(dir)
    }

    /// Where conversations' worktrees are made (`worktrees_dir`, default
    /// `<state_dir>/worktrees`; absolute).
    pub fn worktrees_dir(&self) -> PathBuf {
        let dir = self
            .worktrees_dir
            .clone()
            .unwrap_or_else(|| self.state_dir().join("worktrees"));
        std::path::absolute(&dir).unwrap_or(dir)
    }

    /// The git program (`git`, default `git` on `PATH`).
    pub fn git_program(&self) -> PathBuf {
        self.git.clone().unwrap_or_else(|| PathBuf::from("git"))
    }

    /// `ws_buffer_bytes_per_user`, its default applied: a quarter of
    /// `ws_buffer_bytes`, at least one page (never more than the whole).
    pub fn ws_buffer_per_user(&self) -> usize {
        self.ws_buffer_bytes_per_user.unwrap_or(
            (self.ws_buffer_bytes / 4)
                .max(self.max_page_bytes)
                .min(self.ws_buffer_bytes),
        )
    }

    /// `max_agents` and `max_agents_per_user`, defaults applied: the
    /// machine's for the total (see [`default_max_agents`]), half of the
    /// total for one user.
    pub fn agent_limits(&self) -> AgentLimits {
        let total = self.max_agents.unwrap_or_else(|| {
            default_max_agents(crate::sys::usable_memory_bytes(), crate::sys::usable_cpus())
        });
        let per_user = self.max_agents_per_user.unwrap_or((total / 2).max(1));
        AgentLimits { total, per_user }
    }

    /// The profile with this name, with the gateway-wide `agent_user`
    /// filled in where the profile names no user.
    pub fn agent(&self, name: &str) -> Option<AgentProfile> {
        let mut profile = self.agents.iter().find(|a| a.name == name)?.clone();
        if profile.url.is_some() {
            // A remote agent has no process here: no user, no box.
            profile.sandbox = profile::SandboxMode::Off;
        } else if profile.user.is_none() {
            profile.user = self.agent_user.clone();
        }
        Some(profile)
    }
}

/// A secret kept in a file (its surrounding whitespace, the final newline
/// above all, is not part of it).
fn read_secret(file: &Path, key: &str) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("{key}: cannot read {}", file.display()))?;
    let secret = text.trim();
    if secret.is_empty() {
        bail!("{key}: {} is empty", file.display());
    }
    Ok(secret.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
listen = "127.0.0.1:0"
database_url = "postgres://localhost/x"
[[agents]]
name = "demo"
command = "sh"
cwd = "/tmp"
startup_timeout = "5s"
"#;

    #[test]
    fn session_defaults_and_auth_method_parse_and_are_checked() {
        let with = |extra: &str| Config::parse(&format!("{GOOD}{extra}")).unwrap();
        let config = with(
            "session_mode = \"plan\"\nauth_method = \"api-key\"\nsession_config = { model = \"deep\", brave = true }\n",
        );
        config.validate().unwrap();
        let agent = &config.agents[0];
        assert_eq!(agent.session_mode.as_deref(), Some("plan"));
        assert_eq!(agent.auth_method.as_deref(), Some("api-key"));
        assert_eq!(agent.session_config["model"], serde_json::json!("deep"));
        assert_eq!(agent.session_config["brave"], serde_json::json!(true));
        let err = with("session_config = { model = 3 }\n")
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("session_config.model"), "{err}");
        let err = with("session_mode = \"\"\n").validate().unwrap_err();
        assert!(err.to_string().contains("session_mode"), "{err}");
    }

    #[test]
    fn a_valid_config_parses_and_validates() {
        let config = Config::parse(GOOD).unwrap();
        config.validate().unwrap();
        assert_eq!(config.agents[0].startup_timeout, Duration::from_secs(5));
        assert_eq!(config.agents[0].permission_timeout, None);
        let timed = GOOD.replace(
            "startup_timeout = \"5s\"",
            "permission_timeout = \"5m\"\non_timeout = \"cancel\"",
        );
        let config = Config::parse(&timed).unwrap();
        assert_eq!(
            config.agents[0].permission_timeout,
            Some(Duration::from_secs(300))
        );
        assert_eq!(config.agents[0].on_timeout, profile::OnTimeout::Cancel);
        let mut with_default = config.clone();
        with_default.agent_user = Some("nobody".into());
        assert_eq!(
            with_default.agent("demo").unwrap().user.as_deref(),
            Some("nobody")
        );
    }

    #[test]
    fn errors_name_the_bad_key() {
        let err = Config::parse(&GOOD.replace("name = \"demo\"", "name = \"Demo!\""))
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(err.to_string().starts_with("agents[0].name"), "{err}");
        let err = Config::parse(&GOOD.replace("cwd = \"/tmp\"", "cwd = \"tmp\""))
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(err.to_string().starts_with("agents[0].cwd"), "{err}");
        let err = Config::parse(&GOOD.replace("command = \"sh\"", "comand = \"sh\"")).unwrap_err();
        assert!(format!("{err:#}").contains("comand"), "{err:#}");
        let err = Config::parse(&GOOD.replace("\"5s\"", "\"five\"")).unwrap_err();
        assert!(format!("{err:#}").contains("startup_timeout"), "{err:#}");
        let err = Config::parse(&format!("max_agents = 0\n{GOOD}"))
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(err.to_string().starts_with("max_agents"), "{err}");
    }

    #[test]
    fn spending_limits_default_to_bounds_and_are_checked_by_name() {
        // One agent per 512 MiB, at most 8 per CPU, at least 2.
        let gib = 1024 * 1024 * 1024;
        assert_eq!(default_max_agents(Some(16 * gib), 2), 16);
        assert_eq!(default_max_agents(Some(4 * gib), 2), 8);
        assert_eq!(default_max_agents(Some(64 * gib), 16), 128);
        assert_eq!(default_max_agents(Some(gib / 2), 4), 2);
        assert_eq!(default_max_agents(None, 3), 24);
        let config = Config::parse(GOOD).unwrap();
        let limits = config.agent_limits();
        assert!(limits.total >= 2, "{limits:?}");
        assert_eq!(limits.per_user, limits.total / 2);
        assert_eq!(config.rate_limits.conversations_per_minute, 10);
        assert_eq!(config.max_page_bytes, 1024 * 1024);
        assert_eq!(config.ws_buffer_bytes, 64 * 1024 * 1024);
        assert_eq!(config.ws_buffer_per_user(), 16 * 1024 * 1024);
        let set =
            Config::parse(&format!("max_agents = 6\nmax_agents_per_user = 4\n{GOOD}")).unwrap();
        assert_eq!(
            set.agent_limits(),
            AgentLimits {
                total: 6,
                per_user: 4
            }
        );
        for (line, key) in [
            ("max_agents_per_user = 0", "max_agents_per_user"),
            ("max_page_bytes = 10", "max_page_bytes"),
            ("ws_buffer_bytes = 2048", "ws_buffer_bytes"),
            (
                "ws_buffer_bytes_per_user = 4096",
                "ws_buffer_bytes_per_user",
            ),
            (
                "ws_buffer_bytes_per_user = 68719476736",
                "ws_buffer_bytes_per_user",
            ),
            (
                "rate_limits = { conversations_per_minute = 0 }",
                "rate_limits.conversations_per_minute",
            ),
        ] {
            let err = Config::parse(&format!("{line}\n{GOOD}"))
                .unwrap()
                .validate()
                .unwrap_err();
            assert!(err.to_string().starts_with(key), "{line}: {err}");
        }
    }

    #[test]
    fn agents_stop_after_thirty_idle_minutes_unless_told_otherwise() {
        let config = Config::parse(GOOD).unwrap();
        assert_eq!(config.agents[0].idle_timeout, Duration::from_secs(1800));
        assert_eq!(config.max_agents, None);
        let never = GOOD.replace("startup_timeout = \"5s\"", "idle_timeout = \"0s\"");
        let config = Config::parse(&never).unwrap();
        config.validate().unwrap();
        assert!(config.agents[0].idle_timeout.is_zero());
    }

    #[test]
    fn mcp_servers_are_checked_against_the_acp_schema() {
        let good = GOOD.replace(
            "startup_timeout = \"5s\"",
            "mcp_servers = [{ name = \"fs\", command = \"/bin/mcp-fs\", args = [], env = [] }]",
        );
        let config = Config::parse(&good).unwrap();
        assert_eq!(config.agents[0].mcp_servers.len(), 1);
        let bad = GOOD.replace("startup_timeout = \"5s\"", "mcp_servers = [{ nam = 1 }]");
        let err = Config::parse(&bad).unwrap_err();
        assert!(format!("{err:#}").contains("mcp_servers"), "{err:#}");
    }

    #[test]
    fn the_data_directory_is_xdg_data_home_else_home_else_data_where_usable() {
        let all = |_: &Path| true;
        let dir = |xdg: Option<&str>, home: Option<&str>, usable: &dyn Fn(&Path) -> bool| {
            paths::data_dir_from(xdg.map(Into::into), home.map(Into::into), usable)
        };
        assert_eq!(
            dir(Some("/x/data"), Some("/home/u"), &all),
            Path::new("/x/data/acp-gateway")
        );
        assert_eq!(
            dir(None, Some("/home/u"), &all),
            Path::new("/home/u/.local/share/acp-gateway")
        );
        // Empty or relative: not set, as the XDG spec says.
        assert_eq!(
            dir(Some(""), Some("/home/u"), &all),
            Path::new("/home/u/.local/share/acp-gateway")
        );
        assert_eq!(dir(Some("rel"), Some("home"), &all), Path::new("data"));
        assert_eq!(dir(None, None, &all), Path::new("data"));
        // A directory that cannot be made is passed over.
        let not_xdg = |d: &Path| !d.starts_with("/x");
        assert_eq!(
            dir(Some("/x/data"), Some("/home/u"), &not_xdg),
            Path::new("/home/u/.local/share/acp-gateway")
        );
        assert_eq!(
            dir(Some("/x/data"), Some("/home/u"), &|_| false),
            Path::new("data")
        );
    }

    #[test]
    fn without_a_database_url_the_embedded_database_lives_in_the_data_directory() {
        let config = Config::parse("").unwrap();
        config.validate().unwrap();
        assert_eq!(
            config.database_url_in(Path::new("data")),
            "sqlite://data/acp-gateway.db"
        );
        assert_eq!(
            config.database_url_in(Path::new("/home/u/.local/share/acp-gateway")),
            "sqlite:///home/u/.local/share/acp-gateway/acp-gateway.db"
        );
        let pg = Config::parse("database_url = \"postgres://db/x\"").unwrap();
        assert_eq!(pg.database_url_in(Path::new("data")), "postgres://db/x");
        let bad = Config::parse("database_url = \"mysql://db/x\"").unwrap();
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .starts_with("database_url"));
    }

    #[test]
    fn the_database_url_can_come_from_a_file_read_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("database_url");
        std::fs::write(&secret, "postgres://gw:pw@db/gw\n").unwrap();
        let text = format!("database_url_file = {:?}", secret.display().to_string());
        let mut config = Config::parse(&text).unwrap();
        let err = config.validate().unwrap_err();
        assert!(err.to_string().starts_with("database_url_file"), "{err}");
        config.database_url_from(None, None).unwrap();
        config.validate().unwrap();
        assert_eq!(config.database_url(), "postgres://gw:pw@db/gw");
        // The environment's URL wins; its file too.
        let mut config = Config::parse(&text).unwrap();
        config
            .database_url_from(Some("sqlite://x.db".into()), None)
            .unwrap();
        assert_eq!(config.database_url(), "sqlite://x.db");
        let mut config = Config::parse("database_url = \"sqlite://x.db\"").unwrap();
        config
            .database_url_from(None, Some(secret.clone()))
            .unwrap();
        assert_eq!(config.database_url(), "postgres://gw:pw@db/gw");
        // Never two sources of one kind, nor an empty or unreadable file.
        let both = Config::parse(&format!("{text}\ndatabase_url = \"sqlite://x.db\"")).unwrap();
        let err = both.clone().database_url_from(None, None).unwrap_err();
        assert!(err.to_string().starts_with("database_url_file"), "{err}");
        let err = Config::parse("")
            .unwrap()
            .database_url_from(Some("sqlite://x.db".into()), Some(secret.clone()))
            .unwrap_err();
        assert!(err.to_string().starts_with("DATABASE_URL_FILE"), "{err}");
        std::fs::write(&secret, "\n").unwrap();
        let err = Config::parse(&text)
            .unwrap()
            .database_url_from(None, None)
            .unwrap_err();
        assert!(err.to_string().contains("is empty"), "{err}");
        let missing = format!(
            "database_url_file = {:?}",
            dir.path().join("nope").display().to_string()
        );
        let err = Config::parse(&missing)
            .unwrap()
            .database_url_from(None, None)
            .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("database_url_file: cannot read"),
            "{err}"
        );
        // What it holds is checked like database_url, without showing it.
        std::fs::write(&secret, "mysql://gw:secret@db/gw").unwrap();
        let mut config = Config::parse(&text).unwrap();
        config.database_url_from(None, None).unwrap();
        let err = config.validate().unwrap_err().to_string();
        assert!(err.starts_with("database_url_file"), "{err}");
        assert!(!err.contains("secret"), "{err}");
    }

    #[test]
    fn pass_env_and_env_must_name_variables() {
        let with = |extra: &str| Config::parse(&format!("{GOOD}{extra}")).unwrap();
        let config = with("pass_env = [\"OPENAI_API_KEY\", \"_X1\"]\nenv = { MODEL = \"big\" }\n");
        config.validate().unwrap();
        assert_eq!(config.agents[0].pass_env, ["OPENAI_API_KEY", "_X1"]);
        for bad in ["\"A=B\"", "\"\"", "\"1X\"", "\"A B\""] {
            let err = with(&format!("pass_env = [\"OK\", {bad}]\n"))
                .validate()
                .unwrap_err();
            assert!(
                err.to_string().starts_with("agents[0].pass_env[1]"),
                "{err}"
            );
        }
        let err = with("env = { \"A=B\" = \"x\" }\n").validate().unwrap_err();
        assert!(err.to_string().starts_with("agents[0].env"), "{err}");
    }

    #[test]
    fn duplicate_agent_names_are_rejected() {
        let text = format!("{GOOD}\n[[agents]]\nname = \"demo\"\ncommand = \"sh\"\n");
        let err = Config::parse(&text).unwrap().validate().unwrap_err();
        assert!(err.to_string().starts_with("agents[1].name"), "{err}");
    }
}
