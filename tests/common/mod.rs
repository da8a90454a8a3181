//! Shared test support: a database per test, a real gateway on a free port,
//! real agent subprocesses, HTTP and WebSocket clients. Nothing sleeps: every
//! wait is on an event, with a bound.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use acp_gateway::config::{AgentProfile, Config};
use acp_gateway::Gateway;
use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use tokio_util::sync::CancellationToken;

/// A gateway's config line for agents that are its own children, without
/// shims: what a crash then leaves is what these tests look at.
pub const NO_SHIMS: &str = "agent_shims = false";

/// How long any single wait in a test may take before it fails.
pub const WAIT: Duration = Duration::from_secs(20);

/// The Postgres server that test databases are created on.
pub fn admin_url() -> String {
    std::env::var("TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// Set (by `.ci/run`) to make a missing Postgres fail the Postgres tests
/// instead of skipping them.
pub const REQUIRE_POSTGRES: &str = "ACP_GATEWAY_REQUIRE_POSTGRES";

/// A database of one's own: an SQLite file in a temporary directory, or a
/// fresh Postgres database dropped (best effort) at the end of the test.
pub struct TestDb {
    pub url: String,
    pg_name: Option<String>,
    _dir: Option<tempfile::TempDir>,
    /// The gateway's state directory (its shims' sockets), the test's own.
    state: tempfile::TempDir,
}

impl TestDb {
    pub async fn sqlite() -> TestDb {
        let dir = tempfile::tempdir().unwrap();
        TestDb {
            url: format!("sqlite://{}", dir.path().join("gateway.db").display()),
            pg_name: None,
            _dir: Some(dir),
            state: tempfile::tempdir().unwrap(),
        }
    }

    /// `None` when no Postgres answers and it is not required: the test is
    /// skipped (and says so).
    pub async fn postgres() -> Option<TestDb> {
        use sqlx::Connection;
        let admin = admin_url();
        let mut conn = match sqlx::PgConnection::connect(&admin).await {
            Ok(conn) => conn,
            Err(e) if std::env::var_os(REQUIRE_POSTGRES).is_none() => {
                eprintln!("skipping the Postgres variant: no Postgres at TEST_DATABASE_URL ({e})");
                return None;
            }
            Err(e) => panic!("{REQUIRE_POSTGRES} is set but Postgres is not reachable: {e}"),
        };
        let name = format!("acpgw_test_{}", uuid::Uuid::now_v7().simple());
        sqlx::query(&format!("create database {name}"))
            .execute(&mut conn)
            .await
            .expect("create test database");
        let base = admin.rsplit_once('/').map(|(b, _)| b).unwrap_or(&admin);
        Some(TestDb {
            url: format!("{base}/{name}"),
            pg_name: Some(name),
            _dir: None,
            state: tempfile::tempdir().unwrap(),
        })
    }
}

impl TestDb {
    /// Runs SQL on the test's database directly (the statement for the
    /// backend this test runs on), e.g. to make the database refuse a row.
    pub async fn execute(&self, postgres_sql: &str, sqlite_sql: &str) {
        use sqlx::Connection;
        if self.pg_name.is_some() {
            let mut conn = sqlx::PgConnection::connect(&self.url).await.unwrap();
            sqlx::raw_sql(postgres_sql)
                .execute(&mut conn)
                .await
                .unwrap();
        } else {
            let mut conn = sqlx::SqliteConnection::connect(&self.url).await.unwrap();
            sqlx::raw_sql(sqlite_sql).execute(&mut conn).await.unwrap();
        }
    }
}

impl TestDb {
    /// One number the test's database answers `sql` with (a statement both
    /// backends take).
    pub async fn number(&self, sql: &str) -> i64 {
        let numbers = self.column::<i64>(sql).await;
        assert_eq!(numbers.len(), 1, "one row for {sql}");
        numbers[0]
    }

    /// The first column of every row the test's database answers `sql`
    /// with (a statement both backends take).
    pub async fn column<T>(&self, sql: &str) -> Vec<T>
    where
        T: Send
            + Unpin
            + sqlx::Type<sqlx::Postgres>
            + for<'r> sqlx::Decode<'r, sqlx::Postgres>
            + sqlx::Type<sqlx::Sqlite>
            + for<'r> sqlx::Decode<'r, sqlx::Sqlite>,
    {
        use sqlx::Connection;
        if self.pg_name.is_some() {
            let mut conn = sqlx::PgConnection::connect(&self.url).await.unwrap();
            sqlx::query_scalar(sql).fetch_all(&mut conn).await.unwrap()
        } else {
            let mut conn = sqlx::SqliteConnection::connect(&self.url).await.unwrap();
            sqlx::query_scalar(sql).fetch_all(&mut conn).await.unwrap()
        }
    }

    /// The state directory gateways on this database use (`state_dir`).
    pub fn state_dir(&self) -> &Path {
        self.state.path()
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        // Shims (and their agents) a gateway of this test left running are
        // the test's to end.
        kill_shims_under(self.state.path());
        let Some(name) = self.pg_name.clone() else {
            return;
        };
        // Drop may run where no runtime can block: use a thread of our own.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                use sqlx::Connection;
                if let Ok(mut conn) = sqlx::PgConnection::connect(&admin_url()).await {
                    let _ = sqlx::query(&format!("drop database if exists {name} with (force)"))
                        .execute(&mut conn)
                        .await;
                }
            });
        })
        .join();
    }
}

/// Runs each named `async fn name(db: TestDb)` once per backend: as
/// `sqlite::name` and `postgres::name`.
#[macro_export]
macro_rules! backend_tests {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name($crate::common::TestDb::sqlite().await).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test]
                async fn $name() {
                    if let Some(db) = $crate::common::TestDb::postgres().await {
                        super::$name(db).await
                    }
                }
            )*
        }
    };
}

/// A new idle conversation of `owner` (nothing stored), for tests that
/// write to a store directly.
pub fn idle_conversation(owner: Option<&str>) -> acp_gateway::model::Conversation {
    use acp_gateway::model;
    model::Conversation {
        id: model::new_id(),
        agent: "demo".into(),
        title: None,
        cwd: "/tmp".into(),
        status: model::ConversationStatus::Idle,
        acp_session_id: None,
        last_seq: 0,
        created_at: model::now(),
        updated_at: model::now(),
        owner: owner.map(str::to_owned),
        state: Default::default(),
        node_id: None,
    }
}

/// The demo agent binary built with this package.
pub fn demo_agent_path() -> &'static str {
    env!("CARGO_BIN_EXE_acp-demo-agent")
}

/// A profile running the demo agent with extra arguments.
pub fn demo_profile(name: &str, args: &[&str]) -> AgentProfile {
    profile(name, demo_agent_path(), args)
}

pub fn profile(name: &str, command: &str, args: &[&str]) -> AgentProfile {
    AgentProfile {
        name: name.into(),
        title: None,
        command: command.into(),
        args: args.iter().map(|s| s.to_string()).collect(),
        env: BTreeMap::new(),
        pass_env: Vec::new(),
        cwd: Some(std::env::temp_dir()),
        mcp_servers: vec![],
        permission_timeout: None,
        on_timeout: Default::default(),
        mode: Default::default(),
        user: None,
        allowed_roots: Vec::new(),
        startup_timeout: Duration::from_secs(20),
        idle_timeout: Duration::ZERO,
        session_mode: None,
        session_config: BTreeMap::new(),
        auth_method: None,
        client_fs: false,
        client_terminal: false,
        sandbox: Default::default(),
        // The SDK agents' scripts and packages, and the demo agent (which
        // wrappers run): the boxes of the tests' agents are their cwd
        // (mostly the shared temporary directory), their home, the system
        // and these.
        read_only_paths: vec![
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk-agents"),
            Path::new(demo_agent_path()).parent().unwrap().to_path_buf(),
        ],
        read_write_paths: Vec::new(),
        allowed_tcp_ports: None,
        home_template: None,
        capabilities: Vec::new(),
    }
}

/// Installs the SDK-based agents once per test binary.
pub fn sdk_agents_dir() -> &'static Path {
    static INSTALLED: OnceLock<PathBuf> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk-agents");
        let status = std::process::Command::new("bash")
            .arg(dir.join("install.sh"))
            .status()
            .expect("run tests/sdk-agents/install.sh");
        assert!(status.success(), "installing the SDK agents failed");
        dir
    })
}

/// A profile for the agent built on the npm SDK.
pub fn node_sdk_profile(name: &str) -> AgentProfile {
    let script = sdk_agents_dir().join("node-agent.mjs");
    profile(name, "node", &[script.to_str().unwrap()])
}

/// A profile for the agent built on the PyPI SDK.
pub fn python_sdk_profile(name: &str) -> AgentProfile {
    let dir = sdk_agents_dir();
    let python = dir.join(".venv/bin/python");
    let script = dir.join("python_agent.py");
    profile(name, python.to_str().unwrap(), &[script.to_str().unwrap()])
}

/// A profile for `tests/agents/flood.py`, the agent that floods its
/// stdout with what the gateway drops (plain Python, no SDK).
pub fn flood_profile(name: &str) -> AgentProfile {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/agents");
    let script = dir.join("flood.py");
    let mut agent = profile(name, "/usr/bin/python3", &[script.to_str().unwrap()]);
    agent.read_only_paths.push(dir);
    agent
}

/// The conversation's agent and its shim (pids), as its process record
/// names them.
pub async fn agent_and_shim(db: &TestDb, id: &str) -> (i32, i32) {
    let records = agent_process_records(db).await;
    let record = records
        .iter()
        .find(|r| r.conversation_id.to_string() == id)
        .expect("the agent's process is on record");
    assert!(record.shim_socket.is_some(), "the agent runs under a shim");
    (
        record.agent_link().unwrap_or_default().agent_pid,
        record.pid,
    )
}

/// A seccomp filter under which the kernel answers every Landlock system
/// call `ENOSYS`: a kernel without Landlock, as its processes see it.
fn without_landlock() -> seccompiler::BpfProgram {
    use seccompiler::{SeccompAction, SeccompFilter};
    let rules = [
        libc::SYS_landlock_create_ruleset,
        libc::SYS_landlock_add_rule,
        libc::SYS_landlock_restrict_self,
    ]
    .into_iter()
    .map(|call| (call, Vec::new()))
    .collect();
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        std::env::consts::ARCH.try_into().unwrap(),
    )
    .unwrap();
    filter.try_into().unwrap()
}

/// How a gateway process is started, beyond its agents.
pub struct Launch<'a> {
    /// `RUST_LOG`.
    pub log_filter: &'a str,
    /// Top-level config lines (e.g. `max_line_bytes = …`).
    pub extra: &'a str,
    /// Command-line arguments after `serve --config FILE`.
    pub args: &'a [&'a str],
    /// Set in its environment (on top of the test's own).
    pub env: &'a [(&'a str, &'a str)],
    /// The system user it runs as (the test must be root).
    pub user: Option<&'a acp_gateway::sys::SystemUser>,
    /// Runs it as on a kernel without Landlock: the kernel answers its
    /// Landlock system calls (and its shims' and agents') `ENOSYS`, as one
    /// built without Landlock does.
    pub no_landlock: bool,
}

impl Default for Launch<'_> {
    fn default() -> Self {
        Launch {
            log_filter: "info",
            extra: "",
            args: &[],
            env: &[],
            user: None,
            no_landlock: false,
        }
    }
}

/// A gateway running as a separate `acp-gateway serve` process, for tests
/// that need to kill it the hard way.
pub struct GatewayProcess {
    pub child: std::process::Child,
    /// Its API, as every harness offers it.
    pub client: Client,
    /// Everything it logged so far (stdout and stderr).
    log: std::sync::Arc<std::sync::Mutex<String>>,
    /// The threads copying its stdout and stderr into `log`.
    readers: Vec<std::thread::JoinHandle<()>>,
    _config: Option<tempfile::NamedTempFile>,
}

impl GatewayProcess {
    pub fn start(db: &TestDb, agents: &[AgentProfile]) -> GatewayProcess {
        Self::start_logging(db, agents, "info")
    }

    /// Starts it with `RUST_LOG` set to `log_filter`.
    pub fn start_logging(db: &TestDb, agents: &[AgentProfile], log_filter: &str) -> GatewayProcess {
        Self::start_configured(db, agents, log_filter, "")
    }

    /// Starts it with `extra` top-level config lines (e.g. `max_line_bytes = …`).
    pub fn start_configured(
        db: &TestDb,
        agents: &[AgentProfile],
        log_filter: &str,
        extra: &str,
    ) -> GatewayProcess {
        Self::start_with_args(db, agents, log_filter, extra, &[])
    }

    /// Like [`GatewayProcess::start_configured`], with extra command-line
    /// arguments (e.g. `--log-format json`).
    pub fn start_with_args(
        db: &TestDb,
        agents: &[AgentProfile],
        log_filter: &str,
        extra: &str,
        args: &[&str],
    ) -> GatewayProcess {
        Self::launch(
            db,
            agents,
            Launch {
                log_filter,
                extra,
                args,
                ..Launch::default()
            },
        )
    }

    /// Starts it as `launch` says.
    pub fn launch(db: &TestDb, agents: &[AgentProfile], launch: Launch) -> GatewayProcess {
        use std::io::Write;
        let Launch {
            log_filter,
            extra,
            args,
            env,
            user,
            no_landlock,
        } = launch;
        let mut config = tempfile::NamedTempFile::new().unwrap();
        let mut text = format!(
            "listen = \"127.0.0.1:0\"\ndatabase_url = {:?}\n{extra}\n",
            db.url
        );
        if !extra.contains("state_dir") {
            text = format!("state_dir = {:?}\n{text}", db.state_dir());
        }
        for a in agents {
            text += &format!(
                "[[agents]]\nname = {:?}\ncommand = {:?}\nargs = {:?}\ncwd = {:?}\n",
                a.name,
                a.command,
                a.args,
                a.cwd.as_ref().unwrap()
            );
            if !a.env.is_empty() {
                let env: Vec<String> = a
                    .env
                    .iter()
                    .map(|(k, v)| format!("{k:?} = {v:?}"))
                    .collect();
                text += &format!("env = {{ {} }}\n", env.join(", "));
            }
            if !a.pass_env.is_empty() {
                text += &format!("pass_env = {:?}\n", a.pass_env);
            }
            if let Some(user) = &a.user {
                text += &format!("user = {user:?}\n");
            }
            if !a.allowed_roots.is_empty() {
                text += &format!("allowed_roots = {:?}\n", a.allowed_roots);
            }
            text += &format!(
                "client_fs = {}\nclient_terminal = {}\n",
                a.client_fs, a.client_terminal
            );
            text += &format!(
                "sandbox = {:?}\nread_only_paths = {:?}\nread_write_paths = {:?}\n",
                serde_json::to_value(a.sandbox).unwrap().as_str().unwrap(),
                a.read_only_paths,
                a.read_write_paths,
            );
            if let Some(ports) = &a.allowed_tcp_ports {
                text += &format!("allowed_tcp_ports = {ports:?}\n");
            }
            if let Some(template) = &a.home_template {
                text += &format!("home_template = {template:?}\n");
            }
            if !a.capabilities.is_empty() {
                text += &format!("capabilities = {:?}\n", a.capabilities);
            }
            if !a.idle_timeout.is_zero() {
                text += &format!("idle_timeout = \"{}ms\"\n", a.idle_timeout.as_millis());
            }
        }
        config.write_all(text.as_bytes()).unwrap();
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_acp-gateway"));
        command
            .args(["serve", "--config"])
            .arg(config.path())
            .args(args)
            .env("RUST_LOG", log_filter)
            .env("NO_COLOR", "1")
            .envs(env.iter().copied());
        if let Some(user) = user {
            use std::os::unix::fs::PermissionsExt;
            use std::os::unix::process::CommandExt;
            // What it must reach as that user: its config, an SQLite file's
            // directory.
            let readable = std::fs::Permissions::from_mode(0o644);
            std::fs::set_permissions(config.path(), readable).unwrap();
            if let Some(file) = db.url.strip_prefix("sqlite://") {
                let dir = Path::new(file).parent().unwrap();
                std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).unwrap();
            }
            // Where it makes its shims' sockets.
            let state = std::fs::Permissions::from_mode(0o777);
            std::fs::set_permissions(db.state_dir(), state).unwrap();
            command.uid(user.uid).gid(user.gid);
        }
        if no_landlock {
            use std::os::unix::process::CommandExt;
            let filter = without_landlock();
            // SAFETY: installing a seccomp filter is two system calls.
            unsafe {
                command.pre_exec(move || {
                    seccompiler::apply_filter(&filter).map_err(std::io::Error::other)
                });
            }
        }
        Self::spawn(command, Some(config))
    }

    /// Starts `acp-gateway serve` as the README's quick start has it: no
    /// config file, in `dir` (its working directory), with `env` set (`None`:
    /// removed) on top of the test's environment, on a free port.
    pub fn quick_start(dir: &Path, env: &[(&str, Option<&str>)]) -> GatewayProcess {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_acp-gateway"));
        command
            .arg("serve")
            .current_dir(dir)
            .env_remove("DATABASE_URL")
            .env_remove("DATABASE_URL_FILE")
            .env("ACP_GATEWAY_LISTEN", "127.0.0.1:0")
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1");
        for (name, value) in env {
            match value {
                Some(value) => command.env(name, value),
                None => command.env_remove(name),
            };
        }
        Self::spawn(command, None)
    }

    /// Runs `command` (an `acp-gateway serve`), keeping its log, until it
    /// says where it listens.
    fn spawn(
        mut command: std::process::Command,
        config: Option<tempfile::NamedTempFile>,
    ) -> GatewayProcess {
        use std::io::BufRead;
        command
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = command.spawn().expect("start acp-gateway");
        // It logs its address once it listens; the whole log is kept.
        let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let keep = |log: &std::sync::Arc<std::sync::Mutex<String>>, line: &str| {
            let mut log = log.lock().unwrap();
            log.push_str(line);
            log.push('\n');
        };
        let stderr = child.stderr.take().unwrap();
        let err_log = log.clone();
        let err_reader = std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                keep(&err_log, &line);
            }
        });
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let out_log = log.clone();
        let out_reader = std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                // `addr=127.0.0.1:1234` in text logs, `"addr":"127.0.0.1:1234"` in JSON.
                let addr = line
                    .split("addr=")
                    .nth(1)
                    .or_else(|| line.split("\"addr\":\"").nth(1));
                if let Some(addr) = addr {
                    if let Some(tx) = tx.take() {
                        let end = addr.find(|c: char| c.is_whitespace() || c == '"');
                        let _ = tx.send(addr[..end.unwrap_or(addr.len())].to_owned());
                    }
                }
                keep(&out_log, &line);
            }
        });
        let Ok(addr) = rx.recv_timeout(WAIT) else {
            // Not left running after the test.
            let _ = child.kill();
            let _ = child.wait();
            panic!("acp-gateway reports its address: {}", log.lock().unwrap());
        };
        GatewayProcess {
            child,
            client: Client::new(format!("http://{addr}")),
            log,
            readers: vec![err_reader, out_reader],
            _config: config,
        }
    }

    /// What it logged so far.
    pub fn log_text(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// SIGKILL: no shutdown code runs, as in a crash.
    pub fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// SIGTERM, and waits until it has stopped (its log complete).
    pub fn stop(self) -> String {
        self.terminate().1
    }

    /// SIGTERM; how it exited, and its whole log.
    pub fn terminate(self) -> (std::process::ExitStatus, String) {
        self.signal_and_wait(libc::SIGTERM)
    }

    /// SIGINT (Ctrl-C); how it exited, and its whole log.
    pub fn interrupt(self) -> (std::process::ExitStatus, String) {
        self.signal_and_wait(libc::SIGINT)
    }

    fn signal_and_wait(mut self, signal: i32) -> (std::process::ExitStatus, String) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc_kill(self.child.id() as i32, signal);
        }
        let status = self.child.wait().unwrap();
        // The readers finish when the pipes close: the log is complete.
        for reader in self.readers.drain(..) {
            reader.join().unwrap();
        }
        (status, self.log_text())
    }
}

/// A gateway process never outlives its test (however the test ends).
impl Drop for GatewayProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, signal: i32) -> i32;
}

/// One REST call with an optional bearer token and JSON body.
pub async fn call(
    gw: &Client,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    gw.call_as(method, path, token, body).await
}

/// Sends a request with an optional bearer token and JSON body; the status
/// and the JSON answer (or its text).
async fn send(
    mut req: reqwest::RequestBuilder,
    token: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    if let Some(body) = body {
        req = req.json(&body);
    }
    decode(req.send().await.unwrap()).await
}

/// Creates a token over the API as `operator`; returns (token, id).
pub async fn make_token(gw: &Client, operator: &str, user: &str, role: &str) -> (String, String) {
    let (status, body) = call(
        gw,
        "POST",
        "/api/v1/tokens",
        Some(operator),
        Some(json!({"user": user, "role": role})),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    (
        body["token"].as_str().unwrap().to_owned(),
        body["id"].as_str().unwrap().to_owned(),
    )
}

/// Runs the real `acp-gateway` CLI on the test's database, as an operator
/// would; returns its stdout (failing the test if it fails).
pub fn cli(db: &TestDb, args: &[&str]) -> String {
    let out = cli_output(db, args);
    assert!(
        out.status.success(),
        "acp-gateway {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Runs the real `acp-gateway` CLI on the test's database, whatever the
/// outcome.
pub fn cli_output(db: &TestDb, args: &[&str]) -> std::process::Output {
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(config.path(), format!("database_url = {:?}\n", db.url)).unwrap();
    std::process::Command::new(env!("CARGO_BIN_EXE_acp-gateway"))
        .args(args)
        .arg("--config")
        .arg(config.path())
        .output()
        .unwrap()
}

/// Creates a token with the real CLI, as an operator would; returns it.
pub fn cli_token(db: &TestDb, user: &str, role: &str) -> String {
    cli(db, &["token", "create", "--user", user, "--role", role])
        .trim()
        .to_owned()
}

/// A gateway with the demo agent, one conversation, and a WebSocket on it
/// from the start: the setup most tests begin with.
pub async fn demo_conversation(db: &TestDb) -> (TestGateway, String, Ws) {
    let gw = TestGateway::start(db, vec![demo_profile("demo", &[])]).await;
    let (id, ws) = gw.open_conversation("demo").await;
    (gw, id, ws)
}

/// A gateway serving on a free port.
pub struct TestGateway {
    /// Its API, as every harness offers it.
    pub client: Client,
    pub config: Config,
    /// What its WebSockets hold for their clients.
    pub ws_budget: acp_gateway::api::SendBudget,
    stop: CancellationToken,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    /// The notifications' outbox (tests enqueue what the rules would).
    pub outbox: std::sync::Arc<acp_gateway::notify::outbox::Outbox>,
}

impl TestGateway {
    pub async fn start(db: &TestDb, agents: Vec<AgentProfile>) -> TestGateway {
        Self::start_with(Self::config(db, agents)).await
    }

    /// The config tests start from: a free port, small limits.
    pub fn config(db: &TestDb, agents: Vec<AgentProfile>) -> Config {
        Config {
            listen: "127.0.0.1:0".into(),
            database_url: Some(db.url.clone()),
            database_url_file: None,
            max_line_bytes: 1024 * 1024,
            max_body_bytes: 64 * 1024,
            event_buffer: 1024,
            agents,
            policies: Vec::new(),
            cors_origins: Vec::new(),
            rate_limits: Default::default(),
            agent_user: None,
            max_agents: None,
            max_agents_per_user: None,
            max_page_bytes: 1024 * 1024,
            ws_buffer_bytes: 64 * 1024 * 1024,
            ws_buffer_bytes_per_user: None,
            shutdown_timeout: Duration::from_secs(10),
            write_buffer_events: 10_000,
            node_lease: Duration::from_secs(15),
            notifications: Default::default(),
            state_dir: Some(db.state_dir().to_path_buf()),
            agent_shims: true,
            shim_buffer: 64 * 1024 * 1024,
            shim_program: Some(env!("CARGO_BIN_EXE_acp-gateway").into()),
            // In-process gateways stop as `cancel` has them: their tests
            // restart a gateway to see what a stop leaves. What `detach`
            // (the default) leaves is seen with real processes
            // (`tests/suite/restart.rs`).
            on_shutdown: acp_gateway::config::OnShutdown::Cancel,
            tls: None,
        }
    }

    pub async fn start_with(config: Config) -> TestGateway {
        Self::start_notifying(config, None).await
    }

    /// A gateway whose notifier hands what is due to `enqueue` (none
    /// without one).
    pub async fn start_notifying(
        config: Config,
        enqueue: Option<std::sync::Arc<dyn acp_gateway::notify::Enqueue>>,
    ) -> TestGateway {
        config.validate().expect("valid test config");
        let gateway = Gateway::build_with(config.clone(), enqueue)
            .await
            .expect("gateway builds");
        let base = format!("http://{}", gateway.local_addr());
        let ws_budget = gateway.websocket_budget();
        let outbox = gateway.outbox();
        let stop = CancellationToken::new();
        let token = stop.clone();
        let task = tokio::spawn(gateway.run(async move { token.cancelled().await }));
        TestGateway {
            client: Client::new(base),
            config,
            ws_budget,
            stop,
            task: Some(task),
            outbox,
        }
    }

    /// Stops the gateway (closing its agents) and waits until it has.
    pub async fn stop(mut self) -> Config {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            tokio::time::timeout(WAIT, task)
                .await
                .expect("gateway stops in time")
                .unwrap()
                .unwrap();
        }
        self.config.clone()
    }

    /// Stops this gateway and starts a new one on the same database.
    pub async fn restart(self) -> TestGateway {
        let config = self.stop().await;
        TestGateway::start_with(config).await
    }
}

/// A client of one gateway's API: what every harness (an in-process
/// [`TestGateway`], a [`GatewayProcess`]) offers through `Deref`, so a
/// method means the same whichever a test started.
#[derive(Clone)]
pub struct Client {
    /// `http://127.0.0.1:<port>`.
    pub base: String,
    pub http: reqwest::Client,
    /// The bearer token every request (WebSockets too) carries, if any.
    pub token: Option<String>,
}

impl Client {
    pub fn new(base: String) -> Client {
        Client {
            base,
            http: reqwest::Client::new(),
            token: None,
        }
    }

    /// The same gateway as the holder of `token`: every call carries it.
    pub fn with_token(&self, token: &str) -> Client {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(
            reqwest::header::AUTHORIZATION,
            format!("Bearer {token}").parse().unwrap(),
        );
        Client {
            base: self.base.clone(),
            http: reqwest::Client::builder()
                .default_headers(headers)
                .build()
                .unwrap(),
            token: Some(token.to_owned()),
        }
    }

    /// One REST call; the status and the JSON answer (or its text).
    pub async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        self.call_as(method, path, None, body).await
    }

    /// One REST call with an optional bearer token and JSON body.
    pub async fn call_as(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (u16, Value) {
        send(
            self.http.request(method.parse().unwrap(), self.url(path)),
            token,
            body,
        )
        .await
    }

    /// POSTs JSON with a bearer token (if given).
    pub async fn post_as(&self, path: &str, token: Option<&str>, body: Value) -> (u16, Value) {
        self.call_as("POST", path, token, Some(body)).await
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        let resp = self.http.get(self.url(path)).send().await.unwrap();
        decode(resp).await
    }

    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let resp = self
            .http
            .post(self.url(path))
            .json(&body)
            .send()
            .await
            .unwrap();
        decode(resp).await
    }

    pub async fn post_raw(
        &self,
        path: &str,
        content_type: &str,
        body: impl Into<reqwest::Body>,
    ) -> (u16, Value) {
        let resp = self
            .http
            .post(self.url(path))
            .header("content-type", content_type)
            .body(body)
            .send()
            .await
            .unwrap();
        decode(resp).await
    }

    pub async fn delete(&self, path: &str) -> (u16, Value) {
        let resp = self.http.delete(self.url(path)).send().await.unwrap();
        decode(resp).await
    }

    /// Creates a conversation with `agent` (asserting 201); its id.
    pub async fn create(&self, agent: &str) -> String {
        self.create_conversation(agent).await["id"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// Creates a conversation and returns its JSON (asserting 201).
    pub async fn create_conversation(&self, agent: &str) -> Value {
        let (status, body) = self
            .post("/api/v1/conversations", json!({"agent": agent}))
            .await;
        assert_eq!(status, 201, "create conversation: {body}");
        body
    }

    /// A new conversation with `agent` and a WebSocket on it from the start.
    pub async fn open_conversation(&self, agent: &str) -> (String, Ws) {
        let id = self.create_conversation(agent).await["id"]
            .as_str()
            .unwrap()
            .to_owned();
        let ws = self.conversation_ws(&id, 0).await;
        (id, ws)
    }

    /// Cancels the conversation's running turn and waits on `ws` for it to
    /// end `cancelled`: the events up to then.
    pub async fn cancel_turn(&self, ws: &mut Ws, conversation: &str) -> Vec<Value> {
        let (status, body) = self
            .post(
                &format!("/api/v1/conversations/{conversation}/cancel"),
                json!({}),
            )
            .await;
        assert_eq!(status, 202, "{body}");
        let frames = ws.until_type("turn_ended").await;
        assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "cancelled");
        frames
    }

    /// Sends a text prompt and returns the turn id (asserting 202).
    pub async fn prompt(&self, conversation: &str, text: &str) -> String {
        let (status, body) = self.try_prompt(conversation, text).await;
        assert_eq!(status, 202, "prompt: {body}");
        body["turn_id"].as_str().unwrap().to_owned()
    }

    /// Sends a text prompt; the status and the answer, whatever they are.
    pub async fn try_prompt(&self, conversation: &str, text: &str) -> (u16, Value) {
        self.post(
            &format!("/api/v1/conversations/{conversation}/prompts"),
            json!({"text": text}),
        )
        .await
    }

    pub async fn ws(&self, path: &str) -> Ws {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let url = self.url(path).replacen("http://", "ws://", 1);
        let mut request = url.into_client_request().unwrap();
        if let Some(token) = &self.token {
            request
                .headers_mut()
                .insert("authorization", format!("Bearer {token}").parse().unwrap());
        }
        let (stream, _) = tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(request))
            .await
            .expect("websocket connects in time")
            .expect("websocket connects");
        Ws { stream }
    }

    /// A WebSocket client that never reads (until a test reads it at last):
    /// small socket buffers (a small receive buffer, a small segment size
    /// for the gateway to send), so the kernel holds little for it and the
    /// gateway soon has to. It carries this client's token.
    pub async fn non_reading_ws(&self, path: &str) -> Ws {
        use std::os::fd::AsRawFd;
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let addr: std::net::SocketAddr = self.base.trim_start_matches("http://").parse().unwrap();
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let segment: libc::c_int = 1024;
        // SAFETY: setsockopt on a socket we own, with a pointer to an int and its size.
        let set = unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_MAXSEG,
                (&segment as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(set, 0, "{}", std::io::Error::last_os_error());
        let stream = socket.connect(addr).await.unwrap();
        let mut request = format!("ws://{addr}{path}").into_client_request().unwrap();
        if let Some(token) = &self.token {
            request
                .headers_mut()
                .insert("authorization", format!("Bearer {token}").parse().unwrap());
        }
        let stream = MaybeTlsStream::Plain(stream);
        let (stream, _) =
            tokio::time::timeout(WAIT, tokio_tungstenite::client_async(request, stream))
                .await
                .expect("connects in time")
                .expect("connects");
        Ws { stream }
    }

    pub async fn conversation_ws(&self, conversation: &str, after: i64) -> Ws {
        self.ws(&format!(
            "/api/v1/conversations/{conversation}/ws?after={after}"
        ))
        .await
    }

    /// A conversation as `GET` shows it (asserting 200).
    pub async fn conversation(&self, id: &str) -> Value {
        let (status, body) = self.get(&format!("/api/v1/conversations/{id}")).await;
        assert_eq!(status, 200, "{body}");
        body
    }

    /// `POST …/mode`.
    pub async fn set_mode(&self, conversation: &str, mode_id: &str) -> (u16, Value) {
        self.post(
            &format!("/api/v1/conversations/{conversation}/mode"),
            json!({"mode_id": mode_id}),
        )
        .await
    }

    /// `POST …/config-options`.
    pub async fn set_option(
        &self,
        conversation: &str,
        config_id: &str,
        value: Value,
    ) -> (u16, Value) {
        self.post(
            &format!("/api/v1/conversations/{conversation}/config-options"),
            json!({"config_id": config_id, "value": value}),
        )
        .await
    }

    /// All events of a conversation from REST, page after page.
    pub async fn events(&self, conversation: &str) -> Vec<Value> {
        let mut events = Vec::new();
        let mut after = 0;
        loop {
            let (status, body) = self
                .get(&format!(
                    "/api/v1/conversations/{conversation}/events?after={after}&limit=10000"
                ))
                .await;
            assert_eq!(status, 200, "{body}");
            events.extend(body["items"].as_array().unwrap().iter().cloned());
            match body["next_cursor"].as_str() {
                Some(cursor) => after = cursor.parse().unwrap(),
                None => return events,
            }
        }
    }
}

impl std::ops::Deref for TestGateway {
    type Target = Client;
    fn deref(&self) -> &Client {
        &self.client
    }
}

impl std::ops::Deref for GatewayProcess {
    type Target = Client;
    fn deref(&self) -> &Client {
        &self.client
    }
}

impl Drop for TestGateway {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn decode(resp: reqwest::Response) -> (u16, Value) {
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    let body = if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or(Value::String(text))
    };
    (status, body)
}

/// A WebSocket client reading JSON frames.
pub struct Ws {
    pub stream: WebSocketStream<MaybeTlsStream<TcpStream>>,
}

impl Ws {
    /// The next JSON frame, failing the test after [`WAIT`].
    pub async fn next(&mut self) -> Value {
        loop {
            let msg = tokio::time::timeout(WAIT, self.stream.next())
                .await
                .expect("a websocket frame arrives in time")
                .expect("websocket still open")
                .expect("websocket frame");
            match msg {
                WsMessage::Text(text) => return serde_json::from_str(&text).unwrap(),
                WsMessage::Ping(_) | WsMessage::Pong(_) => continue,
                other => panic!("unexpected websocket frame {other:?}"),
            }
        }
    }

    /// Reads until the server closes the socket: the JSON frames before it,
    /// and the close code (1005 when it gave none).
    pub async fn until_closed(&mut self) -> (Vec<Value>, u16) {
        let mut frames = Vec::new();
        loop {
            let frame = tokio::time::timeout(WAIT, self.stream.next())
                .await
                .expect("the socket is closed in time");
            match frame {
                Some(Ok(WsMessage::Text(text))) => {
                    frames.push(serde_json::from_str(&text).unwrap())
                }
                Some(Ok(WsMessage::Close(Some(frame)))) => return (frames, frame.code.into()),
                Some(Ok(WsMessage::Close(None))) | None => return (frames, 1005),
                Some(Ok(_)) => continue,
                Some(Err(e)) => panic!("socket failed instead of closing: {e}"),
            }
        }
    }

    /// Reads frames until one matches, returning all frames read (the match last).
    pub async fn until(&mut self, pred: impl Fn(&Value) -> bool) -> Vec<Value> {
        let mut seen = Vec::new();
        loop {
            let frame = self.next().await;
            let done = pred(&frame);
            seen.push(frame);
            if done {
                return seen;
            }
        }
    }

    /// Reads until an event of this type, each frame within `bound`
    /// instead of [`WAIT`] (for a turn that makes no event for a while):
    /// all frames read, the match last.
    pub async fn until_type_within(&mut self, kind: &str, bound: Duration) -> Vec<Value> {
        let mut frames = Vec::new();
        loop {
            let frame = tokio::time::timeout(bound, self.stream.next())
                .await
                .expect("a websocket frame arrives in time")
                .expect("websocket still open")
                .expect("websocket frame");
            let WsMessage::Text(text) = frame else {
                continue;
            };
            let event: Value = serde_json::from_str(&text).unwrap();
            let done = event["type"] == kind;
            frames.push(event);
            if done {
                return frames;
            }
        }
    }

    /// Reads until an event of this type (and optionally matching more).
    pub async fn until_type(&mut self, kind: &str) -> Vec<Value> {
        self.until(|e| e["type"] == kind).await
    }

    /// Reads until the agent is reported gone (`agent_status` exited or failed).
    pub async fn until_agent_gone(&mut self) -> Vec<Value> {
        self.until(|e| {
            e["type"] == "agent_status"
                && matches!(e["data"]["status"].as_str(), Some("exited" | "failed"))
        })
        .await
    }

    pub async fn close(mut self) {
        let _ = self.stream.send(WsMessage::Close(None)).await;
    }
}

/// Reads until the demo agent's `child` scenario says its child's pid.
pub async fn child_pid(ws: &mut Ws) -> i32 {
    let frames = ws
        .until(|e| {
            e["data"]["update"]["content"]["text"]
                .as_str()
                .is_some_and(|t| t.starts_with("child "))
        })
        .await;
    let text = frames.last().unwrap()["data"]["update"]["content"]["text"]
        .as_str()
        .unwrap();
    text.trim_start_matches("child ").parse().unwrap()
}

/// A process to wait for: a pidfd, opened while the process runs, becomes
/// readable when it ends (an event to wait on; no polling). Whoever its
/// parent is, and even when its pid is reused afterwards.
pub struct ProcessWatch {
    pub pid: i32,
    fd: std::os::fd::OwnedFd,
    /// Killed when the watch is dropped (see [`ProcessWatch::killing`]).
    kill_on_drop: bool,
}

impl ProcessWatch {
    /// Must be called while the process runs.
    pub fn new(pid: i32) -> ProcessWatch {
        use std::os::fd::FromRawFd;
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
        assert!(fd >= 0, "process {pid} runs");
        // SAFETY: the fd was just opened and is owned by nothing else.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        ProcessWatch {
            pid,
            fd,
            kill_on_drop: false,
        }
    }

    /// A watch that kills the process when it is dropped if it still runs:
    /// for processes a test expects the gateway to kill, which must not
    /// outlive the test when it fails.
    pub fn killing(pid: i32) -> ProcessWatch {
        let mut watch = ProcessWatch::new(pid);
        watch.kill_on_drop = true;
        watch
    }

    /// Whether it has ended by now (does not wait).
    pub fn has_ended(&self) -> bool {
        use std::os::fd::AsRawFd;
        poll_readable(self.fd.as_raw_fd(), 0)
    }

    /// Waits (at most [`WAIT`]) until it has ended; whether it did.
    pub async fn ended(&self) -> bool {
        use std::os::fd::AsRawFd;
        // The fd stays open meanwhile: `self` is borrowed until this returns.
        let fd = self.fd.as_raw_fd();
        tokio::task::spawn_blocking(move || poll_readable(fd, WAIT.as_millis() as i32))
            .await
            .unwrap()
    }
}

impl Drop for ProcessWatch {
    fn drop(&mut self) {
        use std::os::fd::AsRawFd;
        if self.kill_on_drop && !self.has_ended() {
            // SAFETY: a pidfd we own: the signal reaches this process only.
            unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    self.fd.as_raw_fd(),
                    libc::SIGKILL,
                    std::ptr::null::<libc::siginfo_t>(),
                    0,
                );
            }
        }
    }
}

fn poll_readable(fd: i32, timeout_ms: i32) -> bool {
    let mut poll = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut poll, 1, timeout_ms) == 1 }
}

/// A `/proc/<pid>/status` figure in KiB (e.g. `VmRSS:`), for benchmarks;
/// 0 when the process is gone. `pid` may be `self`.
pub fn proc_status_kib(pid: impl std::fmt::Display, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// An environment variable parsed, else `default` (benchmark sizes).
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The agent processes the gateway has recorded as running.
pub async fn agent_process_records(db: &TestDb) -> Vec<acp_gateway::store::AgentProcessRecord> {
    let store = acp_gateway::store::open(&db.url).await.unwrap();
    store.list_agent_processes().await.unwrap()
}

/// The concatenated text of every `session_update` of one kind.
pub fn streamed_text(events: &[Value], update_kind: &str) -> String {
    events
        .iter()
        .filter(|e| {
            e["type"] == "session_update" && e["data"]["update"]["sessionUpdate"] == update_kind
        })
        .filter_map(|e| e["data"]["update"]["content"]["text"].as_str())
        .collect()
}

/// Asserts an answer is a problem with this status whose `detail` says
/// `says`; returns the problem.
pub fn assert_problem((status, problem): (u16, Value), expected: u16, says: &str) -> Value {
    assert_eq!(status, expected, "{problem}");
    let detail = problem["detail"].as_str().unwrap_or_default();
    assert!(detail.contains(says), "{says:?} not in {problem}");
    problem
}

/// Asserts seqs are consecutive, starting right after `after`.
pub fn assert_consecutive(events: &[Value], after: i64) {
    for (i, e) in events.iter().enumerate() {
        assert_eq!(
            e["seq"].as_i64().unwrap(),
            after + 1 + i as i64,
            "event {i}: {e}"
        );
    }
}

/// A workspace whose ways out flip while files are reached through it: the
/// probe of issue 27. Inside `work`: `dir` and `last`, symlinks retargeted
/// between `sub/` (or `sub/secret.txt`) and the same outside; `swapped`, a
/// real directory exchanged in place with a symlink to `outside`; and
/// `file.txt`, a real file exchanged with a symlink to `outside/secret.txt`
/// (`renameat2(RENAME_EXCHANGE)`: the name always exists). Everything
/// inside reads `inside\n`; `outside/secret.txt` reads `outside\n`.
pub struct Flipping {
    pub work: PathBuf,
    pub outside: PathBuf,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<usize>>,
}

impl Flipping {
    pub fn start(work: &Path, outside: &Path) -> Flipping {
        let (w, o) = (work.to_path_buf(), outside.to_path_buf());
        std::fs::create_dir_all(w.join("sub")).unwrap();
        std::fs::create_dir_all(w.join("swapped")).unwrap();
        std::fs::create_dir_all(&o).unwrap();
        std::fs::write(w.join("sub/secret.txt"), "inside\n").unwrap();
        std::fs::write(w.join("swapped/secret.txt"), "inside\n").unwrap();
        std::fs::write(w.join("file.txt"), "inside\n").unwrap();
        std::fs::write(o.join("secret.txt"), "outside\n").unwrap();
        let symlink =
            |target: &Path, link: &Path| std::os::unix::fs::symlink(target, link).unwrap();
        symlink(Path::new("sub"), &w.join("dir"));
        symlink(&w.join("sub/secret.txt"), &w.join("last"));
        symlink(&o, &w.join("swapped.other"));
        symlink(&o.join("secret.txt"), &w.join("file.txt.other"));
        let retargets = [
            (w.join("dir"), PathBuf::from("sub"), o.clone()),
            (
                w.join("last"),
                w.join("sub/secret.txt"),
                o.join("secret.txt"),
            ),
        ];
        let exchanges = [
            (w.join("swapped"), w.join("swapped.other")),
            (w.join("file.txt"), w.join("file.txt.other")),
        ];
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut flips = 0;
            while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
                for (link, inside, outside) in &retargets {
                    let target = if flips % 2 == 0 { outside } else { inside };
                    let temp = link.with_extension("flipping");
                    let _ = std::fs::remove_file(&temp);
                    // Gone (the test ended early): nothing left to flip.
                    if std::os::unix::fs::symlink(target, &temp).is_err()
                        || std::fs::rename(&temp, link).is_err()
                    {
                        return flips;
                    }
                }
                for (a, b) in &exchanges {
                    let a = std::ffi::CString::new(a.as_os_str().as_encoded_bytes()).unwrap();
                    let b = std::ffi::CString::new(b.as_os_str().as_encoded_bytes()).unwrap();
                    // SAFETY: NUL-terminated paths.
                    let exchanged = unsafe {
                        libc::renameat2(
                            libc::AT_FDCWD,
                            a.as_ptr(),
                            libc::AT_FDCWD,
                            b.as_ptr(),
                            libc::RENAME_EXCHANGE,
                        )
                    };
                    if exchanged != 0 {
                        return flips;
                    }
                }
                flips += 1;
            }
            flips
        });
        Flipping {
            work: w,
            outside: o,
            stop,
            thread: Some(thread),
        }
    }

    /// What to read: each must read `inside\n`, or be refused.
    pub fn reads(&self) -> [PathBuf; 4] {
        let w = &self.work;
        [
            w.join("dir/secret.txt"),
            w.join("last"),
            w.join("swapped/secret.txt"),
            w.join("file.txt"),
        ]
    }

    /// What to write in round `round`: each must land inside, or be refused.
    pub fn writes(&self, round: usize) -> [(PathBuf, &'static str); 3] {
        let w = &self.work;
        [
            (w.join(format!("dir/new-{}.txt", round % 4)), "new\n"),
            (w.join("last"), "inside\n"),
            (w.join(format!("swapped/new-{}.txt", round % 4)), "new\n"),
        ]
    }

    /// Stops flipping; how many rounds of flips there were.
    pub fn stop(mut self) -> usize {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap()
    }

    /// Nothing outside was written, and nothing was left there.
    pub fn assert_outside_untouched(&self) {
        let left: Vec<_> = std::fs::read_dir(&self.outside)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, ["secret.txt"], "left outside");
        assert_eq!(
            std::fs::read_to_string(self.outside.join("secret.txt")).unwrap(),
            "outside\n"
        );
    }
}

impl Drop for Flipping {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The pids of the shims serving sockets under `dir`.
pub fn shims_under(dir: &Path) -> Vec<i32> {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let needle = format!("--socket\0{}/", dir.display());
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline);
            cmdline.contains("\0shim\0") && cmdline.contains(&needle)
        })
        .collect()
}

/// Kills every shim serving a socket under `dir`, with everything below it
/// (its agent and what that started), and says how many shims it found.
pub fn kill_shims_under(dir: &Path) -> usize {
    let shims = shims_under(dir);
    if shims.is_empty() {
        return 0;
    }
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut parents: Vec<(i32, i32)> = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            let after = stat.rsplit_once(')').map(|(_, a)| a).unwrap_or("");
            let ppid = after.split_whitespace().nth(1).and_then(|p| p.parse().ok());
            if let Some(ppid) = ppid {
                parents.push((pid, ppid));
            }
        }
    }
    // The shims and everything below them.
    let mut doomed = shims.clone();
    let mut i = 0;
    while i < doomed.len() {
        let parent = doomed[i];
        for (pid, ppid) in &parents {
            if *ppid == parent && !doomed.contains(pid) {
                doomed.push(*pid);
            }
        }
        i += 1;
    }
    for pid in &doomed {
        // SAFETY: kill takes no pointers.
        unsafe {
            libc::kill(*pid, libc::SIGKILL);
        }
    }
    shims.len()
}
