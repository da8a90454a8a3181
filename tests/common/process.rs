//! The gateway as a separate `acp-gateway serve` process (for tests that
//! kill it the hard way, read its log or run it as another user), and the
//! real CLI on a test's database.

use std::path::Path;

use acp_gateway::config::AgentProfile;

use super::{Client, TestDb, WAIT};

/// A gateway's config line for agents that are its own children, without
/// shims: what a crash then leaves is what these tests look at.
pub const NO_SHIMS: &str = "agent_shims = false";

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

impl std::ops::Deref for GatewayProcess {
    type Target = Client;
    fn deref(&self) -> &Client {
        &self.client
    }
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
