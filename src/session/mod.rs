//! Conversations at work: the supervisor ([`Sessions`]) starts a session task
//! per live conversation and keeps the registry of those running on this
//! node. This file is that registry and admission: the agent limits
//! (`max_agents`, `max_agents_per_user`) and starting an agent under them.
//! A conversation outlives its agent process: the next prompt for one whose
//! agent is gone (crash, restart) starts the agent again and resumes its
//! session.
//!
//! Inside: `route` runs the API's commands here or forwards them to the
//! node that owns the conversation (and serves those forwarded here);
//! [`answer`] is the one road of a person's answer to a permission request
//! (checking the answerer's access: see [`crate::access`]); `sharing` and
//! [`members`] change who a conversation is shared with, by its one writer;
//! [`recover`] recovers what a previous run or a dead node left behind;
//! `reattach` takes up the agents a previous run left under their shims;
//! [`task`] is one conversation's `select!` loop, taking [`command`]s;
//! `spawn` starts its agent; `listing` lists an agent's own sessions for a
//! user (to take one over); `mcp` keeps the MCP servers an ACP client
//! gave a conversation, for each start of its agent; [`transcript`] (pure) turns chunks into
//! messages and tool-call states; [`queue`] (pure) the prompts waiting for
//! the running turn; [`pending`] holds permission requests
//! until answered; [`journal`] is the single writer that commits, then
//! publishes.

mod mcp;
mod reattach;
mod route;
mod worktree;
mod budget;
mod sharing;
pub mod answer;
pub mod recover;
pub mod task;
pub mod members;
pub mod journal;
pub mod command;
pub mod transcript;
pub mod queue;
pub mod pending;
pub mod served;
mod listing;
mod spawn;
pub mod work;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use crate::acp::agent::ShimSetup;
use crate::cluster::Node;
use crate::config::{AgentLimits, AgentProfile, Config, ShutdownPlan};
use crate::error::{Error, Result};
use crate::model::Conversation;
use crate::permissions::PolicyHandle;
use crate::store::Store;
use command::Handle;
pub use command::Setting;
use journal::Outlets;
pub use task::Origin;
use task::StartParams;
pub use work::{ChangeDone, ChangeOp};

/// The supervisor of every live conversation on this node: cheap to clone.
#[derive(Clone)]
pub struct Sessions {
    inner: Arc<Registry>,
}

/// The live conversations on this node and what every handle to the
/// supervisor shares.
struct Registry {
    /// What each session task starts with: the outlets, the policies, the
    /// one index of the requests waiting for a person on this node (see
    /// [`pending`]), the shutdown token, where shims and homes go.
    setup: task::Setup,
    /// This gateway node, and the others on the same database.
    node: Node,
    /// The agent profiles, by name, as conversations are started with them.
    profiles: HashMap<String, AgentProfile>,
    live: Mutex<HashMap<Uuid, Handle>>,
    /// Held while a conversation's agent starts again, so that concurrent
    /// prompts never start two.
    starting: Mutex<HashMap<Uuid, Arc<tokio::sync::Mutex<()>>>>,
    /// Most agents at once (`max_agents`, `max_agents_per_user`), and how
    /// many are starting.
    limits: AgentLimits,
    admitting: Mutex<Admitting>,
    tasks: TaskTracker,
    /// The MCP servers ACP clients gave conversations (see [`mcp`]).
    client_mcp: mcp::ClientMcp,
}

impl Sessions {
    pub fn new(
        outlets: Outlets,
        node: Node,
        policies: PolicyHandle,
        config: &Config,
        shutdown: CancellationToken,
        tasks: TaskTracker,
    ) -> Sessions {
        let profiles = config
            .agents
            .iter()
            .filter_map(|a| Some((a.name.clone(), config.agent(&a.name)?)))
            .collect();
        Sessions {
            inner: Arc::new(Registry {
                setup: task::Setup {
                    outlets,
                    max_line_bytes: config.max_line_bytes,
                    shutdown,
                    shutdown_timeout: config.shutdown_timeout,
                    on_shutdown: ShutdownPlan::new(config.on_shutdown),
                    write_buffer_events: config.write_buffer_events,
                    policies,
                    exits: Default::default(),
                    waiting: Default::default(),
                    shim: shim_setup(config),
                    homes: config.homes_dir(),
                    git: config.git_program(),
                },
                node,
                profiles,
                live: Mutex::new(HashMap::new()),
                starting: Mutex::new(HashMap::new()),
                limits: config.agent_limits(),
                admitting: Mutex::new(Admitting::default()),
                tasks,
                client_mcp: Default::default(),
            }),
        }
    }

    pub fn outlets(&self) -> &Outlets {
        &self.inner.setup.outlets
    }

    pub fn store(&self) -> &dyn Store {
        &*self.inner.setup.outlets.store
    }

    /// What the coming stop does to the agents (see [`ShutdownPlan`]).
    pub fn shutdown_plan(&self) -> &ShutdownPlan {
        &self.inner.setup.on_shutdown
    }

    /// This gateway node.
    pub fn node(&self) -> &Node {
        &self.inner.node
    }

    /// The operator policies in force.
    pub fn policies(&self) -> &PolicyHandle {
        &self.inner.setup.policies
    }

    /// How many agents run on this node.
    pub fn running(&self) -> usize {
        let live = self.inner.live.lock().unwrap();
        live.values().filter(|h| !h.is_closed()).count()
    }

    /// The live session of a conversation, if its agent runs on this node.
    fn live(&self, id: Uuid) -> Option<Handle> {
        let live = self.inner.live.lock().unwrap();
        live.get(&id).filter(|h| !h.is_closed()).cloned()
    }

    /// Gives the conversation `id`'s agent the client's MCP `servers` (its
    /// profile must let them through; the caller checks): kept for each
    /// start of its agent. A running agent that was started without them
    /// is stopped if it is idle, so that the next prompt starts it with
    /// them; whether the agent has them or gets them at its next start
    /// (false: it is busy with a turn, and keeps its own until it stops).
    pub async fn give_client_mcp_servers(
        &self,
        id: Uuid,
        servers: Vec<agent_client_protocol_schema::v1::McpServer>,
    ) -> bool {
        if self.inner.client_mcp.give(id, servers) {
            return true;
        }
        match self.live(id) {
            None => true,
            Some(session) => session.release().await,
        }
    }

    /// Starts a new `conversation`'s agent with `profile` and its session
    /// task (see [`task::start`]); the conversation as stored once it is
    /// ready. `client_mcp`: MCP servers an ACP client gives it (see
    /// [`mcp`]), beside the profile's.
    pub async fn start(
        &self,
        profile: AgentProfile,
        conversation: Conversation,
        client_mcp: Vec<agent_client_protocol_schema::v1::McpServer>,
    ) -> Result<Conversation> {
        self.begin(profile, conversation, client_mcp, Origin::Plain)
            .await
    }

    /// Starts a new `conversation` as [`Sessions::start`] does, begun as
    /// `origin` says: forked from another conversation's agent session
    /// (with its history), or taking over an agent session begun elsewhere
    /// (see [`Origin`]). One that fails so is removed, not kept `failed`.
    pub async fn begin(
        &self,
        profile: AgentProfile,
        mut conversation: Conversation,
        client_mcp: Vec<agent_client_protocol_schema::v1::McpServer>,
        origin: Origin,
    ) -> Result<Conversation> {
        let id = conversation.id;
        self.inner.client_mcp.give(id, client_mcp);
        let profile = self.inner.client_mcp.profile(id, &profile);
        // Owned from the start: no other node takes it for left behind.
        conversation.node_id = Some(self.inner.node.id());
        // Its first owner, at the epoch a new conversation has.
        let fence = self.inner.node.is_shared().then_some(0);
        match self
            .launch(profile, conversation, false, fence, origin)
            .await
        {
            Ok((_, conversation)) => Ok(conversation),
            Err(e) => {
                self.inner.client_mcp.forget(id);
                self.inner.node.release(id).await;
                Err(e)
            }
        }
    }

    async fn launch(
        &self,
        profile: AgentProfile,
        conversation: Conversation,
        resume: bool,
        fence: Option<i64>,
        origin: Origin,
    ) -> Result<(Handle, Conversation)> {
        let id = conversation.id;
        let _slot = self.admit(conversation.owner.as_deref()).await?;
        let (handle, conversation, task) = task::start(StartParams {
            setup: self.inner.setup.clone(),
            profile,
            conversation,
            resume,
            fence,
            origin,
        })
        .await?;
        self.register(id, handle.clone(), task);
        Ok((handle, conversation))
    }

    /// A session task runs: registered now, forgotten when it ends.
    fn register(&self, id: Uuid, handle: Handle, task: tokio::task::JoinHandle<()>) {
        self.inner.live.lock().unwrap().insert(id, handle);
        let sessions = self.clone();
        self.inner.tasks.spawn(async move {
            let _ = task.await;
            sessions.inner.live.lock().unwrap().remove(&id);
            // Its agent is gone from this node: any node may start it again
            // (unless it was started here again meanwhile).
            sessions
                .gated(id, async {
                    if sessions.live(id).is_none() {
                        sessions.inner.node.release(id).await;
                    }
                })
                .await;
            // A remote agent's lost connection is made again (see
            // `reconnect`).
            let lost = sessions.inner.setup.exits.lock().unwrap().get(&id) == Some(&"crashed");
            if lost {
                sessions.reconnect(id).await;
            }
        });
    }

    /// A slot for one more agent of `owner`'s conversation. Under
    /// `max_agents_per_user`, the owner's longest-idle agent is stopped to
    /// make room when all theirs are taken, and 429 answered when none of
    /// theirs is idle; under `max_agents` the same with everyone's agents,
    /// and 503 (also when both limits are reached and no agent at all is
    /// idle: the gateway is at capacity). Another user's agent is never
    /// stopped for the owner's own limit.
    async fn admit(&self, owner: Option<&str>) -> Result<Slot> {
        let AgentLimits { total, per_user } = self.inner.limits;
        let busy = |limit: &str, n: usize| {
            format!("all {n} agents ({limit}) are busy with a turn or a permission request")
        };
        loop {
            let (idlest, over) = {
                let live = self.inner.live.lock().unwrap();
                let mut admitting = self.inner.admitting.lock().unwrap();
                let running: Vec<&Handle> = live.values().filter(|h| !h.is_closed()).collect();
                let seen: Vec<Running<'_>> = running
                    .iter()
                    .map(|h| Running {
                        owner: h.owner(),
                        idle_since: h.idle_since(),
                    })
                    .collect();
                match admission(&self.inner.limits, owner, &seen, &admitting) {
                    Admission::Admit => {
                        admitting.add(owner);
                        return Ok(Slot {
                            sessions: self.clone(),
                            owner: owner.map(str::to_owned),
                        });
                    }
                    Admission::Stop { agent, limit } => (running[agent].clone(), limit),
                    Admission::OwnerBusy => {
                        return Err(Error::TooManyRequests {
                            detail: format!(
                                "all {per_user} agents this user may run \
                                 (max_agents_per_user) are busy with a turn or a \
                                 permission request"
                            ),
                            retry_after: 5,
                        })
                    }
                    Admission::AtCapacity => {
                        return Err(Error::AtCapacity {
                            detail: busy("max_agents", total),
                            retry_after: 5,
                        })
                    }
                }
            };
            // Busy again meanwhile? Then look again.
            if idlest.release().await {
                tracing::info!(limit = over, "stopped the longest-idle agent to make room");
            }
        }
    }

    /// Runs `work` holding the conversation's gate: what starts its agent,
    /// recovers it for a dead node or gives it up runs one at a time.
    async fn gated<T>(&self, id: Uuid, work: impl Future<Output = T>) -> T {
        let gate = self
            .inner
            .starting
            .lock()
            .unwrap()
            .entry(id)
            .or_default()
            .clone();
        let done = {
            let _held = gate.lock().await;
            work.await
        };
        // Done (an agent registered, or not) before the gate goes, and it
        // goes with its last holder: whoever comes next finds the live
        // session, or is the only one to try again.
        let mut starting = self.inner.starting.lock().unwrap();
        let last_holder = Arc::strong_count(&gate) <= 2;
        if last_holder && starting.get(&id).is_some_and(|g| Arc::ptr_eq(g, &gate)) {
            starting.remove(&id);
        }
        done
    }

    async fn stored(&self, id: Uuid) -> Result<Conversation> {
        self.store()
            .get_conversation(id)
            .await?
            .ok_or_else(|| Error::NotFound(format!("no conversation {id}")))
    }
}

/// Where agents' shims go, as configured (`agent_shims`): their sockets in
/// `<state_dir>/shims/`, made here (only the gateway may list it; where
/// agents run as other users, they may make their shims' sockets in it but
/// not touch another's). `None` (agents are the gateway's own children)
/// when shims are off or the directory cannot be made.
fn shim_setup(config: &Config) -> Option<ShimSetup> {
    use std::os::unix::fs::PermissionsExt;
    if !config.agent_shims {
        return None;
    }
    let program = match &config.shim_program {
        Some(program) => program.clone(),
        None => match std::env::current_exe() {
            Ok(exe) => exe,
            Err(e) => {
                tracing::warn!(error = %e, "cannot find the gateway's executable: agents run without shims");
                return None;
            }
        },
    };
    let dir = config.state_dir().join("shims");
    let other_users = config.agent_user.is_some() || config.agents.iter().any(|a| a.user.is_some());
    let mode = if other_users { 0o1733 } else { 0o700 };
    let made = std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)));
    if let Err(e) = made {
        tracing::warn!(dir = %dir.display(), error = %e, "cannot make the shims' directory: agents run without shims");
        return None;
    }
    let dir = dir.canonicalize().unwrap_or(dir);
    Some(ShimSetup {
        program,
        dir,
        buffer: config.shim_buffer,
    })
}

/// An agent running on this node, as admission sees it.
struct Running<'a> {
    owner: Option<&'a str>,
    /// Since when it has been idle (`None`: busy).
    idle_since: Option<Instant>,
}

/// What admitting one more agent calls for (see [`Sessions::admit`]).
#[derive(Debug, PartialEq)]
enum Admission {
    /// Start it.
    Admit,
    /// First stop the agent at this index of those running (the
    /// longest-idle one that counts against `limit`), then look again.
    Stop { agent: usize, limit: &'static str },
    /// All the agents the owner may run are busy (429).
    OwnerBusy,
    /// All agents are busy: the gateway is at capacity (503).
    AtCapacity,
}

/// Admission, decided (pure): one more agent of `owner`'s, with `running`
/// on this node and `starting` admitted but not running yet. Under
/// `per_user` the owner's longest-idle agent makes room, under `total`
/// anyone's; another user's agent is never stopped for the owner's own
/// limit.
fn admission(
    limits: &AgentLimits,
    owner: Option<&str>,
    running: &[Running<'_>],
    starting: &Admitting,
) -> Admission {
    let idlest = |of: &mut dyn Iterator<Item = usize>| {
        of.filter_map(|i| Some((running[i].idle_since?, i)))
            .min_by_key(|(since, _)| *since)
            .map(|(_, i)| i)
    };
    let everyone = || 0..running.len();
    let theirs = || everyone().filter(|&i| running[i].owner == owner);
    let everyone_full = running.len() + starting.total >= limits.total;
    if theirs().count() + starting.of(owner) >= limits.per_user {
        match idlest(&mut theirs()) {
            Some(agent) => Admission::Stop {
                agent,
                limit: "max_agents_per_user",
            },
            None if everyone_full && idlest(&mut everyone()).is_none() => Admission::AtCapacity,
            None => Admission::OwnerBusy,
        }
    } else if everyone_full {
        match idlest(&mut everyone()) {
            Some(agent) => Admission::Stop {
                agent,
                limit: "max_agents",
            },
            None => Admission::AtCapacity,
        }
    } else {
        Admission::Admit
    }
}

/// Agents admitted and still starting: in all, and per owner.
#[derive(Default)]
struct Admitting {
    total: usize,
    by_owner: HashMap<Option<String>, usize>,
}

impl Admitting {
    fn of(&self, owner: Option<&str>) -> usize {
        self.by_owner
            .get(&owner.map(str::to_owned))
            .copied()
            .unwrap_or(0)
    }

    fn add(&mut self, owner: Option<&str>) {
        self.total += 1;
        *self.by_owner.entry(owner.map(str::to_owned)).or_default() += 1;
    }

    fn remove(&mut self, owner: Option<String>) {
        self.total -= 1;
        if let std::collections::hash_map::Entry::Occupied(mut n) = self.by_owner.entry(owner) {
            *n.get_mut() -= 1;
            if *n.get() == 0 {
                n.remove();
            }
        }
    }
}

/// One agent admitted under the limits while it starts; its place is taken
/// over by the live registry once it runs.
struct Slot {
    sessions: Sessions,
    owner: Option<String>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let owner = self.owner.take();
        self.sessions.inner.admitting.lock().unwrap().remove(owner);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const LIMITS: AgentLimits = AgentLimits {
        total: 3,
        per_user: 2,
    };

    fn agent(owner: &str, idle_for: Option<u64>, now: Instant) -> Running<'_> {
        Running {
            owner: Some(owner),
            // Longer idle: an earlier start of it.
            idle_since: idle_for.map(|s| now + Duration::from_secs(1000 - s)),
        }
    }

    #[test]
    fn an_agent_under_both_limits_is_admitted() {
        let now = Instant::now();
        let running = [agent("bob", None, now)];
        let decided = admission(&LIMITS, Some("alice"), &running, &Admitting::default());
        assert_eq!(decided, Admission::Admit);
    }

    #[test]
    fn at_the_per_user_limit_the_owners_longest_idle_agent_makes_room() {
        let now = Instant::now();
        let running = [
            agent("alice", Some(5), now),
            agent("bob", Some(60), now),
            agent("alice", Some(30), now),
        ];
        let decided = admission(&LIMITS, Some("alice"), &running, &Admitting::default());
        let limit = "max_agents_per_user";
        assert_eq!(decided, Admission::Stop { agent: 2, limit });
    }

    #[test]
    fn at_the_per_user_limit_with_none_of_the_owners_idle_another_users_idle_agent_is_spared() {
        let now = Instant::now();
        let running = [
            agent("alice", None, now),
            agent("bob", Some(60), now),
            agent("alice", None, now),
        ];
        let decided = admission(&LIMITS, Some("alice"), &running, &Admitting::default());
        assert_eq!(decided, Admission::OwnerBusy);
    }

    #[test]
    fn at_both_limits_with_no_agent_idle_the_gateway_is_at_capacity() {
        let now = Instant::now();
        let running = [
            agent("alice", None, now),
            agent("bob", None, now),
            agent("alice", None, now),
        ];
        let decided = admission(&LIMITS, Some("alice"), &running, &Admitting::default());
        assert_eq!(decided, Admission::AtCapacity);
    }

    #[test]
    fn at_the_total_limit_anyones_longest_idle_agent_makes_room() {
        let now = Instant::now();
        let running = [
            agent("bob", Some(10), now),
            agent("carol", Some(90), now),
            agent("alice", None, now),
        ];
        let decided = admission(&LIMITS, Some("alice"), &running, &Admitting::default());
        let limit = "max_agents";
        assert_eq!(decided, Admission::Stop { agent: 1, limit });
        let busy = [
            agent("bob", None, now),
            agent("carol", None, now),
            agent("alice", None, now),
        ];
        let decided = admission(&LIMITS, Some("alice"), &busy, &Admitting::default());
        assert_eq!(decided, Admission::AtCapacity);
    }

    #[test]
    fn agents_still_starting_count_against_both_limits() {
        let now = Instant::now();
        let running = [agent("alice", None, now)];
        let mut starting = Admitting::default();
        starting.add(Some("alice"));
        let decided = admission(&LIMITS, Some("alice"), &running, &starting);
        assert_eq!(decided, Admission::OwnerBusy);
        let decided = admission(&LIMITS, Some("bob"), &running, &starting);
        assert_eq!(decided, Admission::Admit);
        starting.add(Some("carol"));
        let decided = admission(&LIMITS, Some("bob"), &running, &starting);
        assert_eq!(decided, Admission::AtCapacity);
    }
}
