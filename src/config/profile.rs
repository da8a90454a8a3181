//! An agent profile (`[[agents]]`): how to start one kind of agent, what its
//! conversations may do and where, and the words its settings take
//! ([`Mode`], [`OnTimeout`], [`SandboxMode`]). Data and its checks only:
//! what a profile means is for the parts that use it (its processes'
//! environment and whether they can start in `process`, its box and the
//! profile as one user's conversations get it in `sandbox`, a
//! conversation's directory in `workspace`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

use crate::sys::capabilities::CapSet;

/// How to start one kind of agent.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentProfile {
    /// Unique name, `[a-z0-9_-]+`.
    pub name: String,
    /// Human readable name.
    pub title: Option<String>,
    /// Program to run (looked up in `PATH` unless it contains a `/`); empty
    /// for a remote agent (`url`).
    #[serde(default)]
    pub command: String,
    /// A remote agent's ACP endpoint instead of a `command`:
    /// `wss://host:port/acp` (WebSocket) or `https://host:port/acp`
    /// (Streamable HTTP); `ws://` and `http://` only with `allow_private`.
    pub url: Option<String>,
    /// How a remote agent is spoken to: `websocket` or `http` (Streamable
    /// HTTP); by default what the `url`'s scheme says (`ws(s)://`:
    /// WebSocket, `http(s)://`: Streamable HTTP). `websocket` with an
    /// `https://` url upgrades that url to a WebSocket over TLS.
    pub transport: Option<Transport>,
    /// A PEM file of certificates this profile's remote agent's TLS is
    /// also checked against (beside the web's root certificates), read at
    /// every connection.
    pub ca_file: Option<PathBuf>,
    /// A file holding the remote agent's bearer token (read at every
    /// connection).
    pub token_file: Option<PathBuf>,
    /// The environment variable holding the remote agent's bearer token.
    pub token_env: Option<String>,
    /// More HTTP headers sent when connecting to the remote agent.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Lets the remote agent's `url` be plain `ws://` and reach private,
    /// loopback and link-local addresses (this profile alone).
    #[serde(default)]
    pub allow_private: bool,
    /// How often a remote agent's WebSocket is pinged; one that has said
    /// nothing (not even a pong) for three of these is lost (`0s`: never).
    /// Over Streamable HTTP: the connections' TCP keepalive time.
    #[serde(default = "default_ping_interval", with = "humantime_serde")]
    pub ping_interval: Duration,
    /// How many times the gateway tries, by itself, to connect again to a
    /// remote agent whose connection was lost (1 s after the loss, then
    /// twice as long after each failure, at most 30 s; default 10; `0`:
    /// not at all, the next prompt connects again).
    pub reconnect_tries: Option<u32>,
    #[serde(default)]
    pub args: Vec<String>,
    /// Variables set for the agent (and its terminal commands), on top of
    /// the few it gets from the gateway's environment (`PATH`, `HOME`,
    /// `LANG`, … see `crate::process::spawn::ALLOWED`).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Names of variables of the gateway's environment passed on to the
    /// agent and its terminal commands as they are (e.g. an API key); none
    /// other is.
    #[serde(default)]
    pub pass_env: Vec<String>,
    /// Default working directory of its sessions (absolute).
    pub cwd: Option<PathBuf>,
    /// A git repository its conversations are made on by default: each
    /// gets a worktree of its own on a new branch from `base` (a request's
    /// `repository` wins; `{user}` is the user's name).
    pub repository: Option<PathBuf>,
    /// The branch a conversation's worktree starts from and lands on
    /// (default: the repository's checked-out branch).
    pub base: Option<String>,
    /// Bases only an operator may land on (glob patterns of branch names,
    /// e.g. `["main", "release/*"]`): a user's land there is 403.
    #[serde(default)]
    pub protected_bases: Vec<String>,
    /// MCP servers passed in `session/new`, in ACP's `McpServer` shape
    /// (checked when the config is loaded).
    #[serde(default)]
    pub mcp_servers: Vec<agent_client_protocol_schema::v1::McpServer>,
    /// How long a permission request may wait for an answer (default: as
    /// long as the agent waits).
    #[serde(default, with = "humantime_serde")]
    pub permission_timeout: Option<Duration>,
    /// What a timed-out request is answered with: `reject` or `cancel`.
    #[serde(default)]
    pub on_timeout: OnTimeout,
    /// `ask` (policies decide, the rest asks), `read_only` or `trusted`.
    #[serde(default)]
    pub mode: Mode,
    /// The (unprivileged) system user the agent runs as.
    pub user: Option<String>,
    /// Directories a conversation's cwd must be inside (empty: anywhere).
    #[serde(default)]
    pub allowed_roots: Vec<PathBuf>,
    /// How long `initialize` and `session/new` may take each.
    #[serde(default = "default_startup_timeout", with = "humantime_serde")]
    pub startup_timeout: Duration,
    /// How long an agent may sit with no turn running and no permission
    /// pending before it is stopped (`0s`: never); the next prompt starts it
    /// again.
    #[serde(default = "default_idle_timeout", with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// The ACP session mode a new session is put in (`session/set_mode`
    /// after `session/new`), e.g. `plan`; not the permission `mode` above.
    pub session_mode: Option<String>,
    /// Session configuration options set after `session/new`
    /// (`session/set_config_option`): option id → value (string or boolean).
    #[serde(default)]
    pub session_config: BTreeMap<String, serde_json::Value>,
    /// The `authenticate` method used when the agent says it needs one.
    pub auth_method: Option<String>,
    /// Offer the agent `fs/read_text_file` and `fs/write_text_file`: files
    /// inside the conversation's cwd, read and written by the gateway with
    /// the agent's user's rights, each write published as `file_written`.
    #[serde(default)]
    pub client_fs: bool,
    /// Offer the agent `terminal/*`: commands the gateway runs in the
    /// conversation's cwd as the agent's user, under the operator's deny
    /// policies, their output published as `terminal_output`.
    #[serde(default)]
    pub client_terminal: bool,
    /// Let an ACP client's (an IDE's) `mcpServers` of `session/new`, `load`
    /// and `resume` through to the agent, beside `mcp_servers`. Off by
    /// default: a stdio MCP server is a command the agent runs on the
    /// gateway's machine without asking anyone.
    #[serde(default)]
    pub client_mcp_servers: bool,
    /// Each conversation's box (see `crate::sandbox`): `auto` (Landlock
    /// where the kernel offers it), `required` (an agent never starts
    /// unconfined) or `off`.
    #[serde(default)]
    pub sandbox: SandboxMode,
    /// More paths its boxes may read and execute (absolute; `{user}` is the
    /// conversation's owner).
    #[serde(default)]
    pub read_only_paths: Vec<PathBuf>,
    /// More paths its boxes may read and write (absolute; `{user}` too).
    #[serde(default)]
    pub read_write_paths: Vec<PathBuf>,
    /// The only TCP ports its agents may connect to (e.g. `[443]`), where
    /// the kernel's Landlock can limit them (ABI 4); absent: any.
    pub allowed_tcp_ports: Option<Vec<u16>>,
    /// A directory each user's home for this profile is first made from
    /// (credentials, settings), unless `sandbox = "off"`.
    pub home_template: Option<PathBuf>,
    /// The Linux capabilities its agents and their terminal commands keep
    /// (e.g. `["CAP_NET_BIND_SERVICE"]`); every other is dropped, and by
    /// default all are (see `crate::sandbox::capabilities`).
    #[serde(default)]
    pub capabilities: Vec<String>,
}

/// A remote agent's `transport`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Transport {
    /// One JSON-RPC message per text frame of a WebSocket.
    Websocket,
    /// ACP's Streamable HTTP: POSTed messages, one GET event stream.
    Http,
}

/// A profile's shortcut over the rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// The rules decide; what they do not cover asks a person.
    #[default]
    Ask,
    /// Every edit, delete, move and execute is denied.
    ReadOnly,
    /// Everything a rule does not deny is allowed.
    Trusted,
}

/// What a profile's `permission_timeout` answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OnTimeout {
    /// The request's `reject_once` option, or the cancelled outcome if it has none.
    #[default]
    Reject,
    /// The cancelled outcome.
    Cancel,
}

/// A profile's `sandbox`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SandboxMode {
    /// Confined where the kernel offers Landlock; where it does not, agents
    /// run unconfined (with a warning at start).
    #[default]
    Auto,
    /// Never unconfined: where the box cannot be made, the agent does not
    /// start (the request gets 502 saying why).
    Required,
    /// No box and no home of the user's: agents run as they did before
    /// sandboxes.
    Off,
}

fn default_startup_timeout() -> Duration {
    Duration::from_secs(60)
}

fn default_ping_interval() -> Duration {
    Duration::from_secs(15)
}

fn default_idle_timeout() -> Duration {
    Duration::from_secs(30 * 60)
}

impl AgentProfile {
    /// The scripted demo agent built into this executable
    /// (`acp-gateway demo-agent`), so a gateway is useful with no setup.
    pub fn builtin_demo() -> anyhow::Result<AgentProfile> {
        let exe = std::env::current_exe().context("Failed to find the gateway's own executable")?;
        Ok(AgentProfile {
            name: "demo".into(),
            title: Some("Demo agent".into()),
            command: exe.to_string_lossy().into_owned(),
            url: None,
            transport: None,
            ca_file: None,
            token_file: None,
            token_env: None,
            headers: BTreeMap::new(),
            allow_private: false,
            ping_interval: default_ping_interval(),
            reconnect_tries: None,
            args: vec!["demo-agent".into(), "--chunk-delay-ms".into(), "40".into()],
            env: BTreeMap::new(),
            pass_env: Vec::new(),
            cwd: None,
            repository: None,
            base: None,
            protected_bases: Vec::new(),
            mcp_servers: Vec::new(),
            permission_timeout: None,
            on_timeout: Default::default(),
            mode: Default::default(),
            user: None,
            allowed_roots: Vec::new(),
            startup_timeout: default_startup_timeout(),
            idle_timeout: default_idle_timeout(),
            session_mode: None,
            session_config: BTreeMap::new(),
            auth_method: None,
            client_fs: false,
            client_terminal: false,
            client_mcp_servers: false,
            sandbox: Default::default(),
            read_only_paths: Vec::new(),
            read_write_paths: Vec::new(),
            allowed_tcp_ports: None,
            home_template: None,
            capabilities: Vec::new(),
        })
    }

    /// The capabilities its agents keep (validated with the config: an
    /// unknown name keeps nothing).
    pub fn kept_capabilities(&self) -> CapSet {
        CapSet::parse(&self.capabilities).unwrap_or_default()
    }

    /// Whether this profile runs the demo agent built into this executable
    /// (`acp-gateway demo-agent`): the gateway's own code, not an agent an
    /// operator brought.
    pub fn is_builtin_demo(&self) -> bool {
        self.args.first().is_some_and(|arg| arg == "demo-agent")
            && std::env::current_exe().is_ok_and(|exe| Path::new(&self.command) == exe)
    }

    /// Checks its `name` (`key` names the profile in the message).
    pub(super) fn validate_name(&self, key: &str) -> anyhow::Result<()> {
        if self.name.is_empty()
            || !self
                .name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
        {
            bail!("{key}.name: {:?} must match [a-z0-9_-]+", self.name);
        }
        Ok(())
    }

    /// Checks what serde cannot (`key` names the profile in the message):
    /// all but its name.
    pub(super) fn validate(&self, key: &str) -> anyhow::Result<()> {
        match &self.url {
            Some(url) => self.validate_remote(key, url)?,
            None if self.command.trim().is_empty() => {
                bail!("{key}.command: must not be empty (or give a remote agent's url)")
            }
            None => {
                for field in [
                    "transport",
                    "ca_file",
                    "token_file",
                    "token_env",
                    "headers",
                    "allow_private",
                    "reconnect_tries",
                ] {
                    if self.remote_key_set(field) {
                        bail!("{key}.{field}: only for a remote agent (url)");
                    }
                }
            }
        }
        if let Some(cwd) = &self.cwd {
            if !cwd.is_absolute() {
                bail!("{key}.cwd: {:?} must be an absolute path", cwd);
            }
        }
        if let Some(repository) = &self.repository {
            if !repository.is_absolute() {
                bail!(
                    "{key}.repository: {:?} must be an absolute path",
                    repository
                );
            }
        }
        for (j, pattern) in self.protected_bases.iter().enumerate() {
            if let Err(e) = globset::Glob::new(pattern) {
                bail!("{key}.protected_bases[{j}]: {pattern:?} is not a glob: {e}");
            }
        }
        for (j, name) in self.pass_env.iter().enumerate() {
            if !is_variable_name(name) {
                bail!("{key}.pass_env[{j}]: {name:?} is not an environment variable name");
            }
        }
        for (name, value) in &self.env {
            if !is_variable_name(name) {
                bail!("{key}.env: {name:?} is not an environment variable name");
            }
            if value.contains('\0') {
                bail!("{key}.env.{name}: must not contain a NUL character");
            }
        }
        for (field, paths) in [
            ("allowed_roots", &self.allowed_roots),
            ("read_only_paths", &self.read_only_paths),
            ("read_write_paths", &self.read_write_paths),
        ] {
            for (j, path) in paths.iter().enumerate() {
                if !path.is_absolute() {
                    bail!("{key}.{field}[{j}]: {path:?} must be an absolute path");
                }
            }
        }
        if let Some(template) = &self.home_template {
            if !template.is_absolute() {
                bail!("{key}.home_template: {template:?} must be an absolute path");
            }
        }
        if let Err((j, why)) = CapSet::parse(&self.capabilities) {
            bail!("{key}.capabilities[{j}]: {why}");
        }
        if let Some(ports) = &self.allowed_tcp_ports {
            if ports.contains(&0) {
                bail!("{key}.allowed_tcp_ports: 0 is not a port");
            }
        }
        if let Some(user) = &self.user {
            crate::sys::lookup_user(user).map_err(|e| anyhow::anyhow!("{key}.user: {e}"))?;
        }
        if self.permission_timeout.is_some_and(|t| t.is_zero()) {
            bail!("{key}.permission_timeout: must be greater than zero");
        }
        if self.startup_timeout.is_zero() {
            bail!("{key}.startup_timeout: must be greater than zero");
        }
        for (id, value) in &self.session_config {
            if !(value.is_string() || value.is_boolean()) {
                bail!("{key}.session_config.{id}: must be a string or a boolean");
            }
        }
        if self.session_mode.as_deref().is_some_and(str::is_empty) {
            bail!("{key}.session_mode: must not be empty (leave it out for the agent's default)");
        }
        Ok(())
    }
}

impl AgentProfile {
    /// Checks a remote agent's keys: its `url` (WebSocket or Streamable
    /// HTTP; plain `ws://`/`http://` and private addresses written as IPs
    /// only with `allow_private`), its `transport`, `ca_file`, token and
    /// headers, and that no key of a spawned agent is set with it.
    fn validate_remote(&self, key: &str, url: &str) -> anyhow::Result<()> {
        let spawned_only = [
            ("command", !self.command.is_empty()),
            ("args", !self.args.is_empty()),
            ("env", !self.env.is_empty()),
            ("pass_env", !self.pass_env.is_empty()),
            ("user", self.user.is_some()),
            ("sandbox", self.sandbox != SandboxMode::Auto),
            ("read_only_paths", !self.read_only_paths.is_empty()),
            ("read_write_paths", !self.read_write_paths.is_empty()),
            ("allowed_tcp_ports", self.allowed_tcp_ports.is_some()),
            ("home_template", self.home_template.is_some()),
            ("capabilities", !self.capabilities.is_empty()),
            ("client_terminal", self.client_terminal),
        ];
        if let Some((field, _)) = spawned_only.iter().find(|(_, set)| *set) {
            bail!(
                "{key}.{field}: does not apply to a remote agent (url): it runs on its own \
                 machine, outside the gateway's box, users and shims"
            );
        }
        let parsed =
            ::url::Url::parse(url).map_err(|e| anyhow::anyhow!("{key}.url: {url:?}: {e}"))?;
        let scheme = parsed.scheme();
        if !["ws", "wss", "http", "https"].contains(&scheme) {
            bail!(
                "{key}.url: {scheme}:// is not a remote agent's URL (wss://… for a WebSocket, \
                 https://… for Streamable HTTP)"
            );
        }
        if self.transport == Some(Transport::Http) && scheme.starts_with("ws") {
            bail!(
                "{key}.transport: \"http\" (Streamable HTTP) needs an http(s):// url, not \
                 {scheme}://"
            );
        }
        if (scheme == "ws" || scheme == "http") && !self.allow_private {
            bail!(
                "{key}.url: plain {scheme}:// is refused (use {scheme}s://, or set \
                 allow_private = true for an agent on a private network)"
            );
        }
        let host = match parsed.host() {
            Some(host) => host,
            None => bail!("{key}.url: {url:?} has no host"),
        };
        if !parsed.username().is_empty() || parsed.password().is_some() {
            bail!("{key}.url: must not carry credentials (use token_file or token_env)");
        }
        let literal = match host {
            ::url::Host::Ipv4(ip) => Some(std::net::IpAddr::V4(ip)),
            ::url::Host::Ipv6(ip) => Some(std::net::IpAddr::V6(ip)),
            ::url::Host::Domain(_) => None,
        };
        if let Some(ip) = literal.filter(|ip| super::addresses::is_forbidden(*ip)) {
            if !self.allow_private {
                bail!(
                    "{key}.url: {ip} is a private, loopback or link-local address (set \
                     allow_private = true to let this profile reach it)"
                );
            }
        }
        match (&self.token_file, &self.token_env) {
            (Some(_), Some(_)) => bail!("{key}.token_file: give token_file or token_env, not both"),
            // Read at every connection (a missing one makes the agent
            // unavailable, saying why), not now.
            (Some(file), None) if !file.is_absolute() => {
                bail!("{key}.token_file: {file:?} must be an absolute path")
            }
            (None, Some(name)) if !is_variable_name(name) => {
                bail!("{key}.token_env: {name:?} is not an environment variable name")
            }
            (Some(_), None) | (None, Some(_)) => {}
            (None, None) => {}
        }
        // Read at every connection (one that cannot be read makes the agent
        // unavailable, saying why), as the token is.
        if let Some(file) = self.ca_file.as_ref().filter(|f| !f.is_absolute()) {
            bail!("{key}.ca_file: {file:?} must be an absolute path");
        }
        for (name, value) in &self.headers {
            let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
            if name.is_empty() || !name.chars().all(token) {
                bail!("{key}.headers: {name:?} is not a header name");
            }
            if value.chars().any(|c| c.is_control() && c != '\t') {
                bail!("{key}.headers.{name}: must not contain control characters");
            }
            if name.eq_ignore_ascii_case("authorization") {
                bail!("{key}.headers.{name}: give the token with token_file or token_env");
            }
        }
        Ok(())
    }

    /// The remote agent's bearer token, read now from its `token_file` or
    /// `token_env` (`None` where it has neither).
    pub fn remote_token(&self) -> anyhow::Result<Option<String>> {
        if let Some(file) = &self.token_file {
            return super::read_secret(file, "token_file").map(Some);
        }
        let Some(name) = &self.token_env else {
            return Ok(None);
        };
        match std::env::var(name) {
            Ok(value) if !value.trim().is_empty() => Ok(Some(value.trim().to_owned())),
            _ => bail!("token_env: the variable {name} is not set"),
        }
    }

    /// The transport a remote agent is spoken to over: its `transport`, else
    /// what its `url`'s scheme says (`None` for a spawned agent).
    pub fn remote_transport(&self) -> Option<Transport> {
        let url = self.url.as_deref()?;
        Some(self.transport.unwrap_or(
            if url.starts_with("http://") || url.starts_with("https://") {
                Transport::Http
            } else {
                Transport::Websocket
            },
        ))
    }

    /// The certificates of its `ca_file`, read now (none without one).
    pub fn extra_roots(&self) -> anyhow::Result<Vec<CertificateDer<'static>>> {
        match &self.ca_file {
            Some(file) => read_ca_file(file).map_err(|e| anyhow::anyhow!("ca_file: {e:#}")),
            None => Ok(Vec::new()),
        }
    }

    /// Whether one of the remote agent's keys is set.
    fn remote_key_set(&self, field: &str) -> bool {
        match field {
            "token_file" => self.token_file.is_some(),
            "token_env" => self.token_env.is_some(),
            "headers" => !self.headers.is_empty(),
            "transport" => self.transport.is_some(),
            "ca_file" => self.ca_file.is_some(),
            "reconnect_tries" => self.reconnect_tries.is_some(),
            _ => self.allow_private,
        }
    }
}

/// The PEM certificates in `file`: an error naming it when it cannot be
/// read or holds none.
fn read_ca_file(file: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let text = std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
    let certificates = CertificateDer::pem_slice_iter(&text)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("{} is not PEM: {e}", file.display()))?;
    if certificates.is_empty() {
        bail!("{} holds no PEM certificate", file.display());
    }
    Ok(certificates)
}

/// `[A-Za-z_][A-Za-z0-9_]*`: what a shell accepts as a variable name.
fn is_variable_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}
