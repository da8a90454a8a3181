//! An agent that runs as the gateway's own user, root here (a profile
//! naming no `user`, a gateway run as root: these tests are), starts with no
//! capabilities: it cannot read the gateway's environment (its database
//! URL) or memory, trace it, give a file to another owner or bind a low
//! port, nor can its terminal commands; a profile's `capabilities` keeps
//! the ones named, and no other. In a box (shims on), with no box at all
//! (shims off), and on a kernel without Landlock (simulated), where the
//! missing capabilities are all that stands between a root agent and the
//! gateway. `GET /api/v1/agents` says what each profile's agents keep.

use std::os::unix::fs::PermissionsExt;

use crate::common::*;
use crate::sandbox::{agents_by_name, calls, conversation_of, probe};
use acp_gateway::config::AgentProfile;
use acp_gateway::sandbox::capabilities::CapSet;
use acp_gateway::sandbox::SandboxMode;
use serde_json::{json, Value};

/// Written into the gateway's environment: no agent may ever see it.
const CANARY: &str = "postgres://gateway:canary-5f0c@db/acp";

/// Attaches to a process with ptrace (prints "attached" or why not).
const PTRACE: &str = "import ctypes, os, sys\n\
libc = ctypes.CDLL(None, use_errno=True)\n\
r = libc.ptrace(16, int(sys.argv[1]), 0, 0)\n\
print('attached' if r == 0 else os.strerror(ctypes.get_errno()))";

/// Binds the first free port from 600 on (prints "bound" or why not).
const BIND_LOW: &str = r#"
import errno, os, socket
for port in range(600, 700):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        print("bound")
        break
    except OSError as e:
        if e.errno != errno.EADDRINUSE:
            print(os.strerror(e.errno))
            break
    finally:
        s.close()
"#;

#[derive(Clone, Copy, Debug)]
enum Setting {
    /// Shims, and a `required` box.
    Boxed,
    /// No shims, `sandbox = "off"`: the agent is the gateway's own child.
    Unboxed,
    /// Shims, `sandbox = "auto"`, on a kernel without Landlock.
    NoLandlock,
}

fn profile_for(name: &str, setting: Setting, cwd: &std::path::Path) -> AgentProfile {
    AgentProfile {
        cwd: Some(cwd.to_path_buf()),
        user: None,
        client_terminal: true,
        sandbox: match setting {
            Setting::Boxed => SandboxMode::Required,
            Setting::Unboxed => SandboxMode::Off,
            Setting::NoLandlock => SandboxMode::Auto,
        },
        ..node_sdk_profile(name)
    }
}

/// The value of a `probe` step that must have worked.
fn value(line: &Value) -> &str {
    assert_eq!(line["ok"], true, "{line}");
    line["value"].as_str().unwrap()
}

/// A `/proc/<pid>/status`'s capability sets and no_new_privs, checked.
fn assert_keeps(status: &str, kept: CapSet) {
    for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        let found = CapSet::of_process(status, set);
        // Inheritable and ambient hold the kept ones too (for exec).
        assert_eq!(found, Some(kept), "{set} in {status}");
    }
    assert!(status.contains("NoNewPrivs:\t1"), "{status}");
}

fn refused(line: &Value) {
    assert_eq!(line["ok"], false, "allowed, but should not be: {line}");
    let code = line["code"].as_str().unwrap();
    assert!(code == "EACCES" || code == "EPERM", "{line}");
}

async fn a_root_agent_has_no_capabilities(db: TestDb, setting: Setting) {
    if !acp_gateway::sys::running_as_root() {
        eprintln!("skipping: the gateway must run as root");
        return;
    }
    if matches!(setting, Setting::Boxed) && acp_gateway::sandbox::landlock::kernel_abi().is_none() {
        eprintln!("skipping: this kernel has no Landlock (simulated below)");
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let cwd = work.path().canonicalize().unwrap();
    std::fs::set_permissions(&cwd, std::fs::Permissions::from_mode(0o755)).unwrap();
    let binder = AgentProfile {
        capabilities: vec!["CAP_NET_BIND_SERVICE".into()],
        ..profile_for("binder", setting, &cwd)
    };
    let agents = [profile_for("rooted", setting, &cwd), binder];
    let extra = match setting {
        Setting::Unboxed => NO_SHIMS,
        _ => "",
    };
    let gw = GatewayProcess::launch(
        &db,
        &agents,
        Launch {
            extra,
            env: &[("DATABASE_URL_OF_THE_TEST", CANARY)],
            no_landlock: matches!(setting, Setting::NoLandlock),
            ..Launch::default()
        },
    );
    let gateway = gw.child.id();

    // What each profile's agents keep, as clients see it.
    let shown = agents_by_name(&gw).await;
    assert_eq!(shown["rooted"]["capabilities"], json!([]), "{shown:?}");
    assert_eq!(
        shown["binder"]["capabilities"],
        json!(["CAP_NET_BIND_SERVICE"])
    );
    assert_eq!(shown["binder"]["available"], true, "{shown:?}");

    // Another conversation's agent, running as root as well.
    let (other, _) = conversation_of(&gw, "rooted").await;
    let found = probe(&gw, &other, json!([["read", "/proc/self/status"]])).await;
    let status = value(&found[0]);
    assert!(status.contains("Uid:\t0\t0\t0\t0"), "{status}");
    assert_keeps(status, CapSet::EMPTY);
    let other_pid = status
        .lines()
        .find_map(|l| l.strip_prefix("Pid:"))
        .unwrap()
        .trim()
        .to_owned();

    let (id, _) = conversation_of(&gw, "rooted").await;
    let mine = cwd.join(format!("mine-{id}"));
    let found = probe(
        &gw,
        &id,
        json!([
            ["read", format!("/proc/{gateway}/environ")],
            ["read", format!("/proc/{gateway}/mem")],
            ["run", "/usr/bin/python3", "-c", PTRACE, gateway.to_string()],
            ["write", &mine, "x"],
            ["run", "/bin/chown", "65534:65534", &mine],
            ["run", "/usr/bin/python3", "-c", BIND_LOW],
            ["read", format!("/proc/{other_pid}/environ")],
            ["read", "/proc/self/status"],
        ]),
    )
    .await;
    refused(&found[0]);
    refused(&found[1]);
    assert_eq!(value(&found[2]).trim(), "Operation not permitted");
    assert_eq!(found[3]["ok"], true, "{}", found[3]);
    assert_eq!(found[4]["ok"], false, "{}", found[4]);
    assert!(
        found[4]["stderr"]
            .as_str()
            .unwrap()
            .contains("Operation not permitted"),
        "{}",
        found[4]
    );
    assert_eq!(value(&found[5]).trim(), "Permission denied");
    match setting {
        // Agents of one user are kept apart by their boxes.
        Setting::Boxed => refused(&found[6]),
        // Without one, two agents of one user (root or not) are the same
        // to the kernel: no capability of either decides that.
        Setting::Unboxed | Setting::NoLandlock => {}
    }
    assert_keeps(value(&found[7]), CapSet::EMPTY);
    assert!(!found.iter().any(|l| l.to_string().contains("canary-5f0c")));
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(&mine).unwrap().uid(), 0);

    // Its terminal commands: the same.
    let answers = calls(
        &gw,
        &id,
        json!([
            ["terminal/create", {"command": "cat", "args": ["/proc/self/status"]}],
            ["terminal/wait_for_exit", {"terminalId": "$terminal"}],
            ["terminal/output", {"terminalId": "$terminal"}],
            ["terminal/create", {"command": "cat", "args": [format!("/proc/{gateway}/environ")]}],
            ["terminal/wait_for_exit", {"terminalId": "$terminal"}],
            ["terminal/output", {"terminalId": "$terminal"}],
        ]),
    )
    .await;
    assert_keeps(
        answers[2]["result"]["output"].as_str().unwrap(),
        CapSet::EMPTY,
    );
    assert_ne!(answers[4]["result"]["exitCode"], 0, "{answers:?}");
    assert!(!answers[5].to_string().contains("canary-5f0c"));

    // A profile that keeps CAP_NET_BIND_SERVICE: that one, no other.
    let bind = CapSet::parse(&["CAP_NET_BIND_SERVICE".into()]).unwrap();
    let (binders, _) = conversation_of(&gw, "binder").await;
    let found = probe(
        &gw,
        &binders,
        json!([
            ["read", "/proc/self/status"],
            ["run", "/usr/bin/python3", "-c", BIND_LOW],
            ["read", format!("/proc/{gateway}/environ")],
        ]),
    )
    .await;
    assert_keeps(value(&found[0]), bind);
    assert_eq!(value(&found[1]).trim(), "bound");
    refused(&found[2]);
    let answers = calls(
        &gw,
        &binders,
        json!([
            ["terminal/create", {"command": "cat", "args": ["/proc/self/status"]}],
            ["terminal/wait_for_exit", {"terminalId": "$terminal"}],
            ["terminal/output", {"terminalId": "$terminal"}],
        ]),
    )
    .await;
    assert_keeps(answers[2]["result"]["output"].as_str().unwrap(), bind);

    let (status, log) = gw.interrupt();
    assert!(status.success(), "{log}");
    assert!(
        log.lines().any(|l| l.contains("binder")
            && l.contains("CAP_NET_BIND_SERVICE")
            && l.contains("keep these capabilities")),
        "{log}"
    );
}

async fn in_a_box(db: TestDb) {
    a_root_agent_has_no_capabilities(db, Setting::Boxed).await
}

async fn without_a_box_or_a_shim(db: TestDb) {
    a_root_agent_has_no_capabilities(db, Setting::Unboxed).await
}

async fn on_a_kernel_without_landlock(db: TestDb) {
    a_root_agent_has_no_capabilities(db, Setting::NoLandlock).await
}

crate::backend_tests!(
    in_a_box,
    without_a_box_or_a_shim,
    on_a_kernel_without_landlock
);

/// A capability that is no capability is refused with the config, the key
/// named.
#[test]
fn an_unknown_capability_is_refused_naming_the_key() {
    let config = acp_gateway::config::Config::parse(
        "database_url = \"sqlite:///tmp/x.db\"\n[[agents]]\nname = \"a\"\ncommand = \"sh\"\n\
         capabilities = [\"CAP_NET_BIND_SERVICE\", \"CAP_EVERYTHING\"]\n",
    )
    .unwrap();
    let error = config.validate().unwrap_err().to_string();
    assert!(
        error.contains("agents[0].capabilities[1]") && error.contains("CAP_EVERYTHING"),
        "{error}"
    );
}
