//! Spawning a conversation's agent: the process, its record (so a later
//! gateway can kill what a crash of this one leaves behind), and its ACP
//! session opened (or loaded again).

use std::path::PathBuf;
use std::time::Duration;

use uuid::Uuid;

use crate::acp::agent::{AgentProcess, ShimSetup};
use crate::acp::client::{AgentSession, Open, Opened, Opening};
use crate::acp::incoming::Incoming;
use crate::acp::link::ShimControl;
use crate::acp::rpc::{Inbox, RpcConfig, RpcPeer};
use crate::config::AgentProfile;
use crate::error::{Error, Result};
use crate::model::{self, AgentReport, Conversation};
use crate::process::procs::Host;
use crate::sandbox::AgentBox;
use crate::store::{AgentLink, AgentProcessRecord, Store};

/// How long an agent gets to exit after SIGTERM.
pub(super) const TERMINATE_GRACE: Duration = Duration::from_secs(2);

/// A spawned agent with its ACP session open.
pub(super) struct Connected {
    pub(super) process: AgentProcess,
    /// What lets a later gateway kill what a crash of this one would leave
    /// of the agent; `None` where processes cannot be identified (no `/proc`).
    pub(super) record: Option<AgentProcessRecord>,
    pub(super) agent: AgentSession,
    pub(super) opened: Opened,
    pub(super) incoming: Inbox<Incoming>,
    /// What the agent sent while opening that is still to be applied.
    pub(super) early: Vec<Incoming>,
    /// The agent's shim, if it runs under one.
    pub(super) shim: Option<ShimControl>,
}

/// What an agent is started inside: its shim (where `shim` says how; else
/// it is our own child) and its box.
pub(super) struct Enclosure<'a> {
    pub(super) shim: Option<&'a ShimSetup>,
    pub(super) agent_box: &'a AgentBox,
}

/// Spawns the process and records it (or connects to the profile's remote
/// agent: nothing to record), and opens the ACP session as `how` says
/// (see [`Open`]: new, restored, adopted or forked).
pub(super) async fn connect(
    profile: &AgentProfile,
    conversation: &Conversation,
    how: Open<'_>,
    state: &mut AgentReport,
    max_line_bytes: usize,
    store: &dyn Store,
    Enclosure { shim, agent_box }: Enclosure<'_>,
) -> Result<Connected> {
    let cwd = PathBuf::from(&conversation.cwd);
    let started = match profile.url {
        // A remote agent: no process, no shim, no record.
        Some(_) => AgentProcess::connect(profile, max_line_bytes).await,
        None => AgentProcess::spawn(profile, &cwd, conversation.id, shim, agent_box).await,
    };
    let (mut process, pipes) = started.map_err(|e| Error::AgentFailed(format!("{e:#}")))?;
    // Before the handshake: a crash during it leaves an agent as well.
    let socket = shim
        .filter(|_| pipes.shim.is_some())
        .map(|s| s.socket(conversation.id));
    let record = match profile.url {
        Some(_) => Ok(None),
        None => record_process(store, &process, conversation.id, socket).await,
    };
    let record = match record {
        Ok(record) => record,
        Err(err) => {
            process.terminate(TERMINATE_GRACE).await;
            return Err(err);
        }
    };
    let (peer, mut incoming) = RpcPeer::spawn(
        pipes.stdout,
        pipes.stdin,
        RpcConfig {
            max_line_bytes,
            label: conversation.id.to_string(),
            start_position: pipes.output_from,
            first_request_id: pipes.first_request_id,
            ..RpcConfig::default()
        },
    );
    let opening = AgentSession::open(
        peer,
        &mut process,
        profile,
        &conversation.cwd,
        how,
        state,
        &mut incoming,
    );
    match opening.await {
        Ok(Opening {
            session,
            opened,
            early,
        }) => Ok(Connected {
            process,
            record,
            agent: session,
            opened,
            incoming,
            early,
            shim: pipes.shim,
        }),
        Err(err) => {
            process.terminate(TERMINATE_GRACE).await;
            forget_process(store, record.as_ref()).await;
            Err(err.into())
        }
    }
}

/// Records a freshly spawned agent (see [`crate::process::procs`]).
async fn record_process(
    store: &dyn Store,
    process: &AgentProcess,
    conversation_id: Uuid,
    shim_socket: Option<PathBuf>,
) -> Result<Option<AgentProcessRecord>> {
    let (Some(host), Some((pid, start_time))) = (Host::here(), process.identity()) else {
        tracing::debug!("the agent process cannot be identified (no /proc): not recorded");
        return Ok(None);
    };
    let record = AgentProcessRecord {
        conversation_id,
        pid,
        start_time: start_time as i64,
        boot_id: host.boot_id.clone(),
        pid_namespace: host.pid_namespace.clone(),
        hostname: host.hostname.clone(),
        started_at: model::now(),
        link: shim_socket
            .is_some()
            .then(|| serde_json::to_string(&first_link(process)).expect("a link serializes")),
        shim_socket: shim_socket.map(|s| s.to_string_lossy().into_owned()),
    };
    store.record_agent_process(&record).await?;
    Ok(Some(record))
}

/// An agent's link state before anything of it is committed (its own
/// pid: under a shim, the record's is the shim's).
pub(super) fn first_link(process: &AgentProcess) -> AgentLink {
    let (agent_pid, agent_start_time) = process.agent_identity();
    AgentLink {
        agent_pid,
        agent_start_time,
        ..AgentLink::default()
    }
}

/// Forgets an agent's record once it has been reaped and its group killed.
pub(super) async fn forget_process(store: &dyn Store, record: Option<&AgentProcessRecord>) {
    let Some(record) = record else { return };
    if let Err(e) = store.forget_agent_process(record).await {
        // The next start judges it like any record (by pid and start time:
        // nothing of it runs any more) and forgets it then.
        tracing::warn!(error = %e, pid = record.pid, "could not forget the agent process record");
    }
}

/// The box of a conversation's agent (see [`crate::sandbox`]), its home
/// (beneath `homes`) made where it is not yet; the profile is the one its
/// owner gets ([`crate::sandbox::profile::for_user`]). `sandbox = "off"`:
/// no box, no home of the user's. Where the box cannot be made (`required` on a kernel
/// without Landlock), the agent must not start: [`Error::AgentFailed`].
pub(super) fn agent_box_of(
    profile: &AgentProfile,
    conversation: &Conversation,
    homes: &std::path::Path,
) -> Result<AgentBox> {
    use crate::sandbox::{self, Home, SandboxMode};
    if profile.sandbox == SandboxMode::Off {
        return Ok(AgentBox::default());
    }
    let cannot =
        |why: String| Error::AgentFailed(format!("cannot box agent {:?}: {why}", profile.name));
    let effective = sandbox::effective(
        profile.sandbox,
        profile.allowed_tcp_ports.is_some(),
        sandbox::landlock::kernel_abi(),
    )
    .map_err(cannot)?;
    let user = agent_user(profile);
    let home = Home::of(homes, conversation.owner.as_deref(), &profile.name);
    home.make(profile.home_template.as_deref(), user.as_ref())
        .map_err(|e| cannot(format!("its home {}: {e}", home.dir.display())))?;
    // `homes` is beneath the state directory, which no box may hold.
    let state_dir = homes.parent().unwrap_or(homes);
    // A worktree's box also grants what git needs to commit from it (its
    // git directory, the objects, its branch's ref folder) and no other
    // worktree of the repository.
    let mut profile = profile.clone();
    if let Some(worktree) = &conversation.worktree {
        crate::git::prepare_box(worktree)
            .map_err(|e| cannot(format!("its worktree's git folders: {e}")))?;
        let paths = crate::git::box_paths(worktree);
        profile.read_write_paths.extend(paths.read_write);
        profile.read_only_paths.extend(paths.read_only);
    }
    let profile = &profile;
    let rules = effective.enforced.then(|| {
        sandbox::profile::rules(
            profile,
            std::path::Path::new(&conversation.cwd),
            &home,
            state_dir,
            effective.tcp_ports_enforced == Some(true),
        )
    });
    Ok(AgentBox {
        home: Some(home),
        rules,
    })
}

/// The system user the profile's agent runs as (files it reaches through
/// the gateway are reached with that user's rights).
pub(super) fn agent_user(profile: &AgentProfile) -> Option<crate::sys::SystemUser> {
    let name = profile.user.as_deref()?;
    match crate::sys::lookup_user(name) {
        Ok(user) => Some(user),
        Err(e) => {
            tracing::warn!(error = %e, "the agent's user is gone");
            None
        }
    }
}
