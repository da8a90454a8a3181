//! The agents tests run, as profiles: the built-in demo agent, the agents
//! built on the official ACP SDKs, and the plain-Python flooding agent.

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

/// A profile running `command` with `args`: what a config naming only
/// those gives, but in the shared temporary directory, with a shorter
/// start-up bound and no idle stop; a key the tests do not name keeps its
/// default.
pub fn profile(name: &str, command: &str, args: &[&str]) -> AgentProfile {
    let mut agent: AgentProfile =
        serde_json::from_value(serde_json::json!({"name": name, "command": command}))
            .expect("a profile of a name and a command");
    agent.args = args.iter().map(|s| s.to_string()).collect();
    agent.cwd = Some(std::env::temp_dir());
    agent.startup_timeout = Duration::from_secs(20);
    agent.idle_timeout = Duration::ZERO;
    // The SDK agents' scripts and packages, and the demo agent (which
    // wrappers run): the boxes of the tests' agents are their cwd (mostly
    // the shared temporary directory), their home, the system and these.
    agent.read_only_paths = vec![
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk-agents"),
        Path::new(demo_agent_path()).parent().unwrap().to_path_buf(),
    ];
    agent
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
