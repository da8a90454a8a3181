//! Script agents in their box: an SDK agent run as `node <its script>` and
//! one run as `python3 <its script>`, each installed where no default grant
//! reaches (under `/var/tmp`: the tests' agents work in `/tmp`), start in a
//! `required` box with no `read_only_paths`, because the box grants their
//! script's installation (the npm package, the script's directory with its
//! virtualenv) as it grants their interpreter's; they still cannot read the
//! directory beside their package; and `GET /api/v1/agents` says what each
//! box grants.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::*;
use crate::sandbox::{agents_by_name, agents_user, allowed, conversation_of, denied};
use acp_gateway::config::AgentProfile;
use acp_gateway::sandbox::SandboxMode;
use serde_json::{json, Value};

/// Copies of the SDK agents' installations, side by side with a directory
/// of secrets, in a directory of their own under `/var/tmp`, readable by
/// the agents' user.
struct Installed {
    _dir: tempfile::TempDir,
    base: PathBuf,
}

impl Installed {
    fn new() -> Installed {
        let sdk = sdk_agents_dir();
        let dir = tempfile::Builder::new()
            .prefix("acp-gateway-script-agents")
            .tempdir_in("/var/tmp")
            .unwrap();
        let base = dir.path().canonicalize().unwrap();
        let run = |command: &mut Command| {
            let status = command.status().unwrap();
            assert!(status.success(), "{command:?}");
        };
        // The npm package, its script in dist/ as published packages have it.
        let node = base.join("node-agent");
        std::fs::create_dir_all(node.join("dist")).unwrap();
        std::fs::copy(sdk.join("package.json"), node.join("package.json")).unwrap();
        std::fs::copy(sdk.join("node-agent.mjs"), node.join("dist/index.mjs")).unwrap();
        run(Command::new("cp")
            .arg("-r")
            .arg(sdk.join("node_modules"))
            .arg(&node));
        // The Python agent beside a virtualenv of the system's python3 with
        // the SDK (and what it needs) in its site-packages.
        let python = base.join("py-agent");
        std::fs::create_dir_all(&python).unwrap();
        std::fs::copy(sdk.join("python_agent.py"), python.join("python_agent.py")).unwrap();
        run(Command::new("/usr/bin/python3")
            .args(["-m", "venv", "--without-pip"])
            .arg(python.join(".venv")));
        let version = String::from_utf8(
            Command::new("/usr/bin/python3")
                .args([
                    "-c",
                    "import sys; print(f'python{sys.version_info[0]}.{sys.version_info[1]}')",
                ])
                .output()
                .unwrap()
                .stdout,
        )
        .unwrap();
        let lib = |venv: &Path, version: &str| {
            venv.join("lib").join(version.trim()).join("site-packages")
        };
        let from = std::fs::read_dir(sdk.join(".venv/lib"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .find(|name| name.starts_with("python"))
            .unwrap();
        let (from, to) = (
            lib(&sdk.join(".venv"), &from),
            lib(&python.join(".venv"), &version),
        );
        for entry in std::fs::read_dir(&from).unwrap() {
            let name = entry.unwrap().file_name().into_string().unwrap();
            let wanted = [
                "acp",
                "agent_client_protocol",
                "pydantic",
                "annotated_types",
                "typing_",
            ];
            if wanted.iter().any(|w| name.starts_with(w)) {
                run(Command::new("cp").arg("-r").arg(from.join(&name)).arg(&to));
            }
        }
        // Next to both packages: what no agent may read.
        std::fs::create_dir(base.join("secrets")).unwrap();
        std::fs::write(base.join("secrets/key"), "not for agents\n").unwrap();
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).unwrap();
        run(Command::new("chmod").arg("-R").arg("a+rX").arg(&base));
        Installed { _dir: dir, base }
    }
}

/// A profile of `command` and `args`, in a `required` box, working in
/// `cwd`, with no `read_only_paths` at all.
fn script_profile(name: &str, command: &str, args: &[&str], cwd: &Path) -> AgentProfile {
    AgentProfile {
        cwd: Some(cwd.to_path_buf()),
        user: agents_user(),
        sandbox: SandboxMode::Required,
        read_only_paths: Vec::new(),
        ..profile(name, command, args)
    }
}

async fn script_agents_run_in_their_box_with_their_own_installation(db: TestDb) {
    if acp_gateway::sandbox::landlock::kernel_abi().is_none() {
        eprintln!("skipping: this kernel has no Landlock (a required box cannot be made)");
        return;
    }
    let installed = Installed::new();
    let base = &installed.base;
    let work = tempfile::tempdir().unwrap();
    let cwd = work.path().canonicalize().unwrap();
    for dir in [&cwd, db.state_dir()] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let script = base.join("node-agent/dist/index.mjs");
    let node = script_profile("node-script", "node", &[script.to_str().unwrap()], &cwd);
    let py_script = base.join("py-agent/python_agent.py");
    let mut python = script_profile(
        "python-script",
        "python3",
        &[py_script.to_str().unwrap()],
        &cwd,
    );
    // `python3` is the virtualenv's, as an operator's PATH would have it.
    python.env.insert(
        "PATH".into(),
        format!(
            "{}:/usr/bin:/bin",
            base.join("py-agent/.venv/bin").display()
        ),
    );
    let gw = TestGateway::start(&db, vec![node, python]).await;

    // What each box grants, as clients see it: the package, not beside it.
    let shown = agents_by_name(&gw).await;
    let granted = |agent: &str, set: &str| -> Vec<String> {
        let sandbox = &shown[agent]["sandbox"];
        assert_eq!(sandbox["enforced"], true, "{sandbox}");
        sandbox[set]
            .as_array()
            .unwrap_or_else(|| panic!("{set} in {sandbox}"))
            .iter()
            .map(|p| p.as_str().unwrap().to_owned())
            .collect()
    };
    let (node_read, python_read) = (
        granted("node-script", "read_only"),
        granted("python-script", "read_only"),
    );
    let package = base.join("node-agent").display().to_string();
    assert!(node_read.contains(&package), "{node_read:?}");
    assert!(node_read.contains(&"/usr".to_owned()), "{node_read:?}");
    let script_dir = base.join("py-agent").display().to_string();
    assert!(python_read.contains(&script_dir), "{python_read:?}");
    for read in [&node_read, &python_read] {
        let base = base.display().to_string();
        assert!(
            !read.iter().any(|p| p == &base || p.contains("secrets")),
            "{read:?}"
        );
    }
    let node_write = granted("node-script", "read_write");
    assert_eq!(node_write[..2], ["{cwd}", "{home}"], "{node_write:?}");
    assert!(
        node_write.contains(&"/dev/null".to_owned()),
        "{node_write:?}"
    );
    assert_eq!(shown["node-script"]["available"], true);

    let secret = base.join("secrets/key");
    for (agent, own) in [
        ("node-script", base.join("node-agent/package.json")),
        ("python-script", py_script.clone()),
    ] {
        // It starts, and answers.
        let (id, _) = conversation_of(&gw, agent).await;
        let mut ws = gw.conversation_ws(&id, 0).await;
        let turn = gw.prompt(&id, "hello from outside").await;
        let frames = ws
            .until(|e| e["type"] == "turn_ended" && e["data"]["turn_id"] == turn.as_str())
            .await;
        assert_eq!(frames.last().unwrap()["data"]["stop_reason"], "end_turn");
        assert!(
            streamed_text(&frames, "agent_message_chunk").contains("hello from outside"),
            "{agent}: {frames:?}"
        );
        // Its own installation it reads; the directory beside it, not.
        let found = crate::sandbox::probe(
            &gw,
            &id,
            json!([
                ["read", own],
                ["read", secret],
                ["list", base.join("secrets")],
                ["list", base]
            ]),
        )
        .await;
        allowed(&found[0]);
        for line in &found[1..] {
            denied(line);
        }
        assert!(!found
            .iter()
            .any(|l: &Value| l.to_string().contains("not for agents")));
    }
    gw.stop().await;
}

crate::backend_tests!(script_agents_run_in_their_box_with_their_own_installation);
