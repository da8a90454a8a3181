//! The agents tests run, as profiles: the built-in demo agent, the agents
//! built on the official ACP SDKs, and the plain-Python flooding agent.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use acp_gateway::config::AgentProfile;

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
