//! One live conversation: the task that owns its agent process and ACP
//! session, applies what the agent sends (to the [`Transcript`], the
//! [`Pending`] requests and the [`Journal`]), and carries out the commands
//! its [`Handle`] sends (prompt, cancel, answer a permission request,
//! change a setting, close).
//!
//! Data flows agent stdout → rpc → this task → journal (commit, then
//! publish); commands flow supervisor → [`Handle`] → this task → rpc
//! → agent stdin. Everything about one conversation happens in this one
//! task, so its state needs no locks and its events have one order.
//!
//! This file holds the task itself, how it starts and its `select!` loop;
//! the rest of its work is spread over `impl Task` blocks, one file per job:
//! `incoming` (what the agent sends), `permissions` (its permission
//! requests and their answers), `settings` (modes and configuration
//! options), `turns` (prompts and their ends), `ending` (how the session
//! ends and the agent goes); `output` holds what an agent's output under a
//! shim needs kept (told to the journal before a commit, acknowledged to the
//! shim after). Each job's own state is one field of the task, its part
//! (`parts.rs`: `intake`, `turns`, `settings`, `requests`, `ending`); what
//! every job uses is the task's own.

mod ending;
mod incoming;
mod output;
mod permissions;
mod queue;
mod changes;
mod budget;
pub(super) mod reattached;
mod settings;
mod turns;
mod parts;
mod origin;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use uuid::Uuid;

use super::command::{AnswerNote, Command, Handle, Reply};
use super::journal::{Journal, Outlets};
use super::pending::{Pending, WaitingRequests};
use super::served::ClientServices;
use super::spawn::{
    agent_box_of, agent_user, connect, first_link, Connected, Enclosure, TERMINATE_GRACE,
};
use super::transcript::Transcript;
use crate::acp::agent::{AgentProcess, Cursor, ShimSetup};
use crate::acp::client::{AgentSession, Open, PromptCall, EXIT_AFTER_EOF};
use crate::acp::incoming::Incoming;
use crate::acp::rpc::{Inbox, RpcError};
use crate::config::{AgentProfile, ShutdownPlan};
use crate::error::Result;
use crate::model::{self, AgentReport, AgentState, AgentStatus, Conversation, ConversationStatus};
use crate::permissions::PolicyHandle;
use crate::sandbox::AgentBox;
use crate::store::{AgentLink, AgentProcessRecord, CommitQueue};
use crate::telemetry;
use crate::workspace::terminals::TerminalOutput;
use crate::workspace::Workspace;
pub use origin::Origin;
use origin::{copy_history, forget_conversation};
use output::{output_moved_on, ShimOutput};
pub use parts::ExitCauses;
use parts::{Change, Ending, Intake, Queue, Requests, Settings, Turns, Work};

/// Most events committed in one batch while an agent streams.
const MAX_BATCH_EVENTS: usize = 512;
/// Most text (joined message chunks) committed in one batch, in bytes.
const MAX_BATCH_TEXT: usize = 1 << 20;
/// How long a streamed update may wait to be committed with those after it
/// (a client sees it this much later at most).
const BATCH_WINDOW: Duration = Duration::from_millis(10);

/// What every session task on this node starts with, whichever
/// conversation it serves and however its agent came to be connected: the
/// supervisor keeps one and hands each task a copy.
#[derive(Clone)]
pub struct Setup {
    /// Where the conversation's commits go (the store, then the bus).
    pub outlets: Outlets,
    pub max_line_bytes: usize,
    /// Cancelled when the gateway stops: each session (through a child
    /// token of its own) closes its agent.
    pub shutdown: CancellationToken,
    /// How long a running turn's agent gets to answer its cancel then.
    pub shutdown_timeout: Duration,
    /// What the gateway's shutdown does to the agent.
    pub on_shutdown: ShutdownPlan,
    /// Most events buffered while the database is unreachable.
    pub write_buffer_events: usize,
    /// The operator policies that may answer permission requests.
    pub policies: PolicyHandle,
    pub exits: ExitCauses,
    /// This node's index of requests waiting for a person.
    pub waiting: WaitingRequests,
    /// Where the agent's shim goes (`None`: the agent is our own child).
    pub shim: Option<ShimSetup>,
    /// Where users' homes are made (`<state_dir>/homes`).
    pub homes: PathBuf,
    /// The git program worktrees are read with.
    pub git: PathBuf,
}

/// What starting one conversation's session takes besides the [`Setup`].
pub struct StartParams {
    pub setup: Setup,
    pub profile: AgentProfile,
    /// A new conversation, or (`resume`) one as stored whose agent is gone.
    pub conversation: Conversation,
    pub resume: bool,
    /// The owner epoch this node claimed the conversation at (see
    /// [`crate::store::Batch::fence`]).
    pub fence: Option<i64>,
    /// How a new conversation begins (not `resume`).
    pub origin: Origin,
}

/// Starts the agent, opens its ACP session, and spawns the session task.
/// A new conversation is persisted whatever happens, with its
/// `agent_status` events; on failure its status is `failed` (a fork or an
/// adoption that fails is removed instead). A resumed one
/// (`resume`) keeps its status when the agent fails to start again, so a
/// later prompt can try again; its `agent_status` says why.
pub async fn start(
    params: StartParams,
) -> Result<(Handle, Conversation, tokio::task::JoinHandle<()>)> {
    let StartParams {
        setup,
        profile,
        mut conversation,
        resume,
        fence,
        origin,
    } = params;
    let profile = crate::sandbox::profile::for_user(&profile, conversation.owner.as_deref());
    let id = conversation.id;
    let span = tracing::info_span!(parent: None, "conversation", conversation_id = %id, agent = %profile.name);
    if !resume {
        setup
            .outlets
            .store
            .insert_conversation(&conversation)
            .await?;
    }
    let mut journal = Journal::new(setup.outlets.clone(), &conversation, None).fenced_at(fence);
    if let Origin::Fork {
        messages,
        tool_calls,
        ..
    } = &origin
    {
        copy_history(&mut journal, messages, tool_calls);
    }
    journal.append(AgentStatus::new(AgentState::Starting, None));
    if let Err(e) = journal.flush().await {
        if origin.leaves_nothing() {
            forget_conversation(journal.store(), id).await;
        }
        return Err(e);
    }

    let earlier = conversation.acp_session_id.clone().filter(|_| resume);
    let how = match (&earlier, &origin) {
        (Some(earlier), _) => Open::Restore(earlier),
        (None, _) if resume => Open::New,
        (None, Origin::Plain) => Open::New,
        (None, Origin::Fork { source_session, .. }) => Open::Fork(source_session),
        (None, Origin::Adopt) => match &conversation.adopted_session {
            Some(adopted) => Open::Adopt(adopted),
            None => Open::New,
        },
    };
    let mut state = conversation.state.clone();
    let started = match agent_box_of(&profile, &conversation, &setup.homes) {
        Ok(agent_box) => connect(
            &profile,
            &conversation,
            how,
            &mut state,
            setup.max_line_bytes,
            journal.store(),
            Enclosure {
                shim: setup.shim.as_ref(),
                agent_box: &agent_box,
            },
        )
        .instrument(span.clone())
        .await
        .map(|connected| (connected, agent_box)),
        Err(e) => Err(e),
    };
    let (
        Connected {
            process,
            record,
            agent,
            opened,
            incoming,
            early,
            shim,
        },
        agent_box,
    ) = match started {
        Ok(connected) => connected,
        Err(err) if origin.leaves_nothing() => {
            tracing::info!(parent: &span, error = %err, "the fork or adoption failed: the conversation is removed");
            forget_conversation(journal.store(), id).await;
            return Err(err);
        }
        Err(err) => {
            tracing::warn!(parent: &span, error = %err, "agent failed to start");
            journal.append(AgentStatus::new(AgentState::Failed, Some(err.to_string())));
            if !resume {
                journal.set_status(ConversationStatus::Failed);
            }
            journal.flush().await?;
            return Err(err);
        }
    };
    if resume {
        tracing::info!(parent: &span, context = ?opened.context(), "agent started again");
        if let Some(context) = opened.context() {
            let cause = setup.exits.lock().unwrap().remove(&id).unwrap_or("restart");
            telemetry::agent_restarted(context, cause);
        }
    }
    // From the first commit on, the agent's output is acknowledged to its
    // shim as it is committed.
    let shim_output = shim.map(|control| {
        let link = AgentLink {
            can_close: agent.can_close(),
            ..first_link(&process)
        };
        let output = ShimOutput::new(Cursor::new(agent.peer().clone(), control), &link);
        journal.link_to(link);
        output
    });
    journal.set_acp_session_id(agent.session_id().to_owned());
    if state != conversation.state {
        journal.set_state(&state);
    }
    journal.append(AgentStatus {
        context: opened.context().map(Into::into),
        ..AgentStatus::new(AgentState::Ready, None)
    });
    journal.set_status(ConversationStatus::Idle);
    journal.flush().await?;
    journal.ride_out_outages(setup.write_buffer_events);
    // From now on its commits are the agent's, except while serving a
    // command (see `Task::carry_out`).
    journal.serve(CommitQueue::Agent);
    conversation.status = journal.status();
    conversation.acp_session_id = Some(agent.session_id().to_owned());
    conversation.last_seq = journal.last_seq();
    conversation.updated_at = model::now();
    conversation.state = state.clone();

    let shutdown = setup.shutdown.child_token();
    let remote = profile.url.is_some();
    let (handle, mut task) = assemble(Assembly {
        setup,
        journal,
        shim_output,
        process,
        record,
        agent,
        incoming,
        early,
        profile,
        conversation: &conversation,
        state,
        agent_box,
    });
    // Before what the agent sent while opening is applied: it may ask
    // again there.
    if resume && remote {
        let held = task.take_up_held(opened).instrument(span.clone()).await;
        if let Err(e) = held {
            tracing::warn!(parent: &span, error = %e, "could not take up the requests the remote agent asked before");
        }
    }
    let task = tokio::spawn(task.run(shutdown).instrument(span));
    Ok((handle, conversation, task))
}

/// What a session task is made of besides its [`Setup`], however its agent
/// came to be connected (started here, or reattached under its shim).
pub(super) struct Assembly<'a> {
    pub(super) setup: Setup,
    pub(super) journal: Journal,
    /// Under a shim: its output, acknowledged once committed.
    shim_output: Option<ShimOutput>,
    pub(super) process: AgentProcess,
    pub(super) record: Option<AgentProcessRecord>,
    pub(super) agent: AgentSession,
    pub(super) incoming: Inbox<Incoming>,
    pub(super) early: Vec<Incoming>,
    pub(super) profile: AgentProfile,
    pub(super) conversation: &'a Conversation,
    pub(super) state: AgentReport,
    /// The conversation's box.
    pub(super) agent_box: AgentBox,
}

/// The task, and the handle that sends it commands.
fn assemble(parts: Assembly<'_>) -> (Handle, Task) {
    let (profile, conversation, setup) = (&parts.profile, parts.conversation, parts.setup);
    let (tx, rx) = mpsc::channel(32);
    let idle = Arc::new(Mutex::new(Some(Instant::now())));
    let (output_tx, terminal_output) = mpsc::channel(64);
    // Files are never reached with the gateway's rights instead of the
    // agent's user's: without that user, neither files nor terminals.
    let user = agent_user(profile);
    let reachable = user.is_some() || profile.user.is_none();
    // Terminal commands get what the agent got (as its user, in its box).
    let mut environment = crate::process::profile::environment(profile, user.as_ref());
    environment.extend(parts.agent_box.variables());
    let served = ClientServices::new(
        Workspace {
            cwd: PathBuf::from(&conversation.cwd),
            // A worktree (made by the gateway, beneath its own directory)
            // is its own root: files stay inside it.
            allowed_roots: match conversation.worktree {
                Some(_) => Vec::new(),
                None => profile.allowed_roots.clone(),
            },
            user,
            files: profile.client_fs && reachable,
            terminals: profile.client_terminal && reachable,
            sandbox: parts.agent_box.rules.clone().map(Arc::new),
            capabilities: profile.kept_capabilities(),
        },
        parts.agent.session_id().to_owned(),
        profile.name.clone(),
        profile.mode,
        setup.policies.clone(),
        output_tx,
        environment,
    );
    let owner = conversation.owner.as_deref().map(Arc::from);
    let task = Task {
        journal: parts.journal,
        shim_output: parts.shim_output,
        process: parts.process,
        agent: parts.agent,
        commands: rx,
        transcript: Transcript::default(),
        served,
        terminal_output,
        intake: Intake {
            incoming: Some(parts.incoming),
            early: parts.early,
        },
        turns: Turns::default(),
        queue: Queue {
            prompts: conversation.queue.clone(),
            held_by_budget: None,
        },
        work: conversation.worktree.clone().map(|worktree| Work {
            git: super::work::git_of(&setup.git, Some(profile)),
            worktree,
        }),
        settings: Settings {
            state: parts.state,
            changes: FuturesUnordered::new(),
            call_timeout: profile.startup_timeout,
        },
        requests: Requests {
            pending: Pending::new(
                profile.permission_timeout,
                profile.on_timeout,
                setup.waiting,
                conversation.owner.clone(),
            ),
            policies: setup.policies,
            profile_name: profile.name.clone(),
            mode: profile.mode,
            cwd: PathBuf::from(&conversation.cwd),
        },
        ending: Ending {
            idle: idle.clone(),
            idle_timeout: Some(profile.idle_timeout).filter(|t| !t.is_zero()),
            shutdown_timeout: setup.shutdown_timeout,
            on_shutdown: setup.on_shutdown,
            exits: setup.exits,
            record: parts.record,
        },
    };
    (Handle { tx, owner, idle }, task)
}

/// One conversation's session: what every job uses, then each job's part
/// (see `parts.rs`).
struct Task {
    journal: Journal,
    /// The agent's output under a shim (`None`: the agent is our own child).
    shim_output: Option<ShimOutput>,
    process: AgentProcess,
    /// The agent's ACP session.
    agent: AgentSession,
    commands: mpsc::Receiver<Command>,
    transcript: Transcript,
    /// Files and terminals, where the profile offers them.
    served: ClientServices,
    /// Output of the terminals `served` runs.
    terminal_output: mpsc::Receiver<TerminalOutput>,
    intake: Intake,
    turns: Turns,
    queue: Queue,
    settings: Settings,
    requests: Requests,
    ending: Ending,
    /// The conversation's worktree and the git that reads it (`None`: not
    /// made on a repository).
    work: Option<Work>,
}

/// What woke the session loop.
enum Step {
    Incoming(Option<Incoming>),
    Answered(Result<Value, RpcError>),
    Exited,
    Due(Vec<Uuid>),
    Command(Option<Command>),
    Changed(Change, Result<Value>),
    Terminal(TerminalOutput),
    IdleTooLong,
    /// Time to commit what is buffered: the batch window closed, or the
    /// unreachable database is to be tried again.
    Retry,
    /// The agent's output was dealt with by the reader alone (lines
    /// dropped): its shim is to hear so (see [`Task::output_moved`]).
    OutputMoved,
}

/// Why the session loop ended.
enum End {
    /// The agent exited (or closed its stdout) by itself.
    AgentGone,
    /// A user closed the conversation: its turn and requests are cancelled.
    ClosedByUser { reply: Option<Reply<()>> },
    /// The gateway stops the agent under a running conversation: its requests
    /// expire, its turn ends with an error. `cause` is for the metrics.
    Stopped { detail: String, cause: &'static str },
    /// The gateway shuts down: the running turn is cancelled as a user would
    /// cancel it, the agent gets `shutdown_timeout` to answer, then it stops.
    ShuttingDown,
}

async fn next_incoming(rx: &mut Option<Inbox<Incoming>>) -> Option<Incoming> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// Resolves `timeout` after `since` (never without either).
async fn idle_for(since: Option<Instant>, timeout: Option<Duration>) {
    match (since, timeout) {
        (Some(since), Some(timeout)) => tokio::time::sleep_until(since + timeout).await,
        _ => std::future::pending().await,
    }
}

async fn next_prompt_result(prompt: &mut Option<PromptCall>) -> Result<Value, RpcError> {
    match prompt {
        Some(call) => (&mut call.answer).await,
        None => std::future::pending().await,
    }
}
impl Task {
    async fn run(mut self, shutdown: CancellationToken) {
        let end = match self.apply_early().await {
            Ok(()) => self.serve(&shutdown).await,
            Err(e) => Err(e),
        };
        let end = match end {
            Ok(End::ShuttingDown)
                if self.ending.on_shutdown.detaches() && self.process.is_shimmed() =>
            {
                self.detach().await;
                return;
            }
            Ok(end) => end,
            Err(e) if e.is_fenced() => {
                self.step_aside().await;
                return;
            }
            Err(e) => {
                tracing::error!(error = %e, "session failed; stopping its agent");
                End::Stopped {
                    detail: "the gateway could not persist the conversation".into(),
                    cause: "error",
                }
            }
        };
        if let Err(e) = self.finish(end).await {
            tracing::error!(error = %e, "failed to record the end of the session");
        }
    }

    async fn serve(&mut self, shutdown: &CancellationToken) -> Result<End> {
        loop {
            let idle_since = self.ending.idle_since();
            // Unbiased: a fast-streaming agent must not starve the user's
            // commands (a cancel above all).
            // While the database is away and the buffer full, the agent's
            // output waits in its pipe (backpressure), nothing is dropped.
            let full = self.journal.is_full();
            let step = tokio::select! {
                msg = next_incoming(&mut self.intake.incoming), if !full => Step::Incoming(msg),
                _ = self.journal.retry_due() => Step::Retry,
                _ = self.journal.window_closes(BATCH_WINDOW) => Step::Retry,
                _ = output_moved_on(&self.shim_output) => Step::OutputMoved,
                result = next_prompt_result(&mut self.turns.prompt) => Step::Answered(result),
                _ = self.process.wait() => Step::Exited,
                due = self.requests.pending.due() => Step::Due(due),
                cmd = self.commands.recv() => Step::Command(cmd),
                Some((change, answer)) = self.settings.changes.next(), if !self.settings.changes.is_empty() => {
                    Step::Changed(change, answer)
                }
                Some(output) = self.terminal_output.recv() => Step::Terminal(output),
                _ = shutdown.cancelled() => return Ok(End::ShuttingDown),
                _ = idle_for(idle_since, self.ending.idle_timeout) => Step::IdleTooLong,
            };
            // Inside a turn, every log line says which.
            let span = self
                .turns
                .turn
                .as_ref()
                .map_or_else(tracing::Span::none, |t| t.span.clone());
            match self.carry_out(step).instrument(span).await {
                Ok(Some(end)) => return Ok(end),
                Ok(None) => {}
                // The database is away: the session goes on, writes wait.
                Err(e) if e.is_outage() => {
                    tracing::warn!(error = %e, "database unreachable; carrying on");
                }
                Err(e) => return Err(e),
            }
            self.note_idle();
        }
    }

    /// Carries out one step of the loop; `Some` when the session ends.
    async fn carry_out(&mut self, step: Step) -> Result<Option<End>> {
        match step {
            Step::Incoming(Some(msg)) => {
                self.take_in(msg).await?;
                self.drain_incoming(MAX_BATCH_EVENTS).await?;
                // Messages that changed nothing are acknowledged too.
                self.output_moved();
                if self.commit_due() {
                    self.flush().await?;
                }
            }
            Step::Incoming(None) => {
                self.stdout_closed();
                self.take_prompt_answer().await?;
                if tokio::time::timeout(EXIT_AFTER_EOF, self.process.wait())
                    .await
                    .is_err()
                {
                    tracing::warn!("agent closed stdout but kept running; killing it");
                    self.process.terminate(TERMINATE_GRACE).await;
                }
                return Ok(Some(End::AgentGone));
            }
            Step::Answered(result) => {
                let ends = !matches!(result, Err(RpcError::Closed(_)));
                let ended = self.answered(result).await?;
                if ends {
                    // The next queued prompt starts in the commit that
                    // ends this turn.
                    // What the turn changed, before what comes after it.
                    if ended.is_some() {
                        self.note_changes().await;
                    }
                    self.after_turn(ended).await?;
                    self.flush().await?;
                }
            }
            Step::Exited => {
                // What it wrote before dying may still be in the pipe.
                self.drain_until_closed().await?;
                self.take_prompt_answer().await?;
                return Ok(Some(End::AgentGone));
            }
            Step::Due(due) => self.time_out(due).await?,
            Step::Retry => self.flush().await?,
            Step::OutputMoved => self.output_moved(),
            Step::Command(Some(Command::Close { reply })) => {
                return Ok(Some(End::ClosedByUser { reply: Some(reply) }));
            }
            Step::Command(Some(Command::Release { reply })) => {
                let idle = self.is_idle();
                reply.send(idle);
                if idle {
                    return Ok(Some(End::Stopped {
                        detail: "stopped to make room for another conversation's agent".into(),
                        cause: "capacity",
                    }));
                }
            }
            Step::Command(Some(command)) => {
                // A person waits for its answer: its writes go first.
                self.journal.serve(CommitQueue::Person);
                let handled = self.handle_command(command).await;
                self.journal.serve(CommitQueue::Agent);
                handled?;
            }
            Step::Changed(change, answer) => {
                // What the agent sent before its answer (its own report of
                // the change, say) comes first, as it did on the wire.
                self.drain_incoming(usize::MAX).await?;
                self.changed(change, answer).await?;
            }
            Step::Terminal(output) => {
                self.journal.append(output);
                if self.commit_due() {
                    self.flush().await?;
                }
            }
            Step::Command(None) => return Ok(Some(End::ClosedByUser { reply: None })),
            Step::IdleTooLong => {
                let after = humantime_serde::re::humantime::format_duration(
                    self.ending.idle_timeout.unwrap_or_default(),
                );
                tracing::info!(%after, "stopping the idle agent");
                return Ok(Some(End::Stopped {
                    detail: format!("stopped after {after} idle"),
                    cause: "idle",
                }));
            }
        }
        Ok(None)
    }

    /// Whether the agent has no turn, no pending request and no setting
    /// change to answer.
    fn is_idle(&self) -> bool {
        self.turns.turn.is_none()
            && self.requests.pending.is_empty()
            && self.settings.changes.is_empty()
    }

    /// Starts or ends the idle period after whatever just happened.
    fn note_idle(&self) {
        self.ending.note_idle(self.is_idle());
    }

    /// Carries out a user's command, answering on the reply it carries.
    async fn handle_command(&mut self, command: Command) -> Result<()> {
        match command {
            Command::Prompt {
                content,
                while_running,
                by,
                reply,
            } => reply.send(self.take_prompt(content, while_running, by).await),
            Command::Queue { edit, by, reply } => reply.send(self.edit_queue(edit, &by).await),
            Command::Resume { reply } => reply.send(self.resume_queue().await),
            Command::Cancel { reply } => {
                reply.send(self.cancel_turn("turn cancelled", None).await);
            }
            Command::Respond {
                request,
                answer,
                decided_by,
                via,
                reason,
                steer,
                reply,
            } => {
                // What was buffered before the answer is committed before it.
                let note = AnswerNote { via, reason, steer };
                let answered = match self.flush().await {
                    Ok(()) => self.answer(request, answer, &decided_by, note).await,
                    Err(e) => Err(e),
                };
                reply.send(answered)
            }
            Command::Change {
                setting,
                changed_by,
                reply,
            } => self.change(Change {
                setting,
                changed_by,
                reply,
            }),
            Command::Changes { op, by, reply } => reply.send(self.change_work(op, &by).await),
            Command::Budget { word, reply } => reply.send(self.budget(word).await),
            Command::Members { op, by, reply } => {
                // What was buffered before the change is committed before it.
                let done = match self.flush().await {
                    Ok(()) => crate::session::members::apply(&mut self.journal, op, &by).await,
                    Err(e) => Err(e),
                };
                reply.send(done)
            }
            Command::Close { reply } => reply.send(()),
            Command::Release { reply } => reply.send(false),
        }
        Ok(())
    }

    /// Whether to commit now (see [`Journal::commit_due`]).
    fn commit_due(&self) -> bool {
        self.journal
            .commit_due(BATCH_WINDOW, MAX_BATCH_EVENTS, MAX_BATCH_TEXT)
    }

    /// Commits what happened: the journal's batch with the transcript's
    /// changes and how far the agent's output is dealt with; then its shim
    /// hears what is committed.
    async fn flush(&mut self) -> Result<()> {
        self.save_transcript();
        self.note_output();
        let flushed = self.journal.flush().await;
        self.acknowledge();
        flushed
    }

    /// [`Task::flush`] for an ending: while the database is away, tried
    /// again until `deadline` (see [`Journal::flush_until`]).
    async fn flush_until(&mut self, deadline: Instant) {
        self.save_transcript();
        self.note_output();
        self.journal.flush_until(deadline).await;
        self.acknowledge();
    }

    /// Moves the transcript's changes into the journal's batch.
    fn save_transcript(&mut self) {
        let changes = self.transcript.take_changes();
        for message in changes.messages {
            self.journal.save_message(message);
        }
        for call in changes.tool_calls {
            self.journal.save_tool_call(call);
        }
    }

    fn status_now(&self) -> ConversationStatus {
        if !self.requests.pending.is_empty() {
            ConversationStatus::AwaitingPermission
        } else if self.turns.turn.is_some() {
            ConversationStatus::Running
        } else {
            ConversationStatus::Idle
        }
    }
}
