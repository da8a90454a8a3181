//! The demo agent's canned behaviours: which scenario a prompt picks, and
//! the turn that plays it.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::{sleep, sleep_until, Instant};

use super::wire::{notification, Reply, RpcError, Wire, INTERNAL_ERROR};

/// How long to keep waiting for permission answers after `session/cancel`: the client must
/// answer them `cancelled`, but a turn must not hang on a client that forgets to.
const PERMISSION_GRACE: Duration = Duration::from_secs(1);

/// The gap between chunks of the `slow` scenario.
const SLOW_INTERVAL: Duration = Duration::from_millis(50);

/// Stop reasons this agent answers prompts with.
pub(super) const END_TURN: &str = "end_turn";
const CANCELLED: &str = "cancelled";
const REFUSAL: &str = "refusal";

/// The choices offered in every permission request, as (optionId, name, kind).
const PERMISSION_OPTIONS: [(&str, &str, &str); 4] = [
    ("allow-once", "Allow once", "allow_once"),
    ("allow-always", "Always allow", "allow_always"),
    ("reject-once", "Reject", "reject_once"),
    ("reject-always", "Always reject", "reject_always"),
];

/// The command a scenario runs: the one given, else `echo hello`.
fn or_hello(command: &str) -> &str {
    if command.is_empty() {
        "echo hello"
    } else {
        command
    }
}

/// Numbers the `call_<n>` tool call ids, from 1, across all sessions of the process.
static NEXT_TOOL_CALL: AtomicU64 = AtomicU64::new(1);

/// The canned behaviours a prompt can ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Scenario {
    Echo,
    Tool,
    Execute,
    Codex,
    Gemini,
    Vibe,
    Qwen,
    Read,
    Edit,
    Parallel,
    Ask,
    Plan,
    Long,
    Big,
    Slow,
    Crash,
    Garbage,
    Unknown,
    Hang,
    Child,
    Refuse,
    Error,
    Withdraw,
    Late,
    Sneak,
    Hasty,
    Stderr,
    Probe,
    Mcp,
    Question,
    Save,
    FsSave,
    Cost,
    CostWait,
}

impl Scenario {
    /// The scenario named by a (lowercase) word, if any.
    pub(super) fn from_word(word: &str) -> Option<Self> {
        Some(match word {
            "echo" => Self::Echo,
            "tool" | "write" => Self::Tool,
            "execute" => Self::Execute,
            "codex" => Self::Codex,
            "gemini" => Self::Gemini,
            "vibe" => Self::Vibe,
            "qwen" => Self::Qwen,
            "read" => Self::Read,
            "edit" => Self::Edit,
            "parallel" => Self::Parallel,
            "ask" => Self::Ask,
            "plan" => Self::Plan,
            "long" => Self::Long,
            "big" => Self::Big,
            "slow" => Self::Slow,
            "crash" => Self::Crash,
            "garbage" => Self::Garbage,
            "unknown" => Self::Unknown,
            "hang" => Self::Hang,
            "child" => Self::Child,
            "refuse" => Self::Refuse,
            "error" => Self::Error,
            "withdraw" => Self::Withdraw,
            "late" => Self::Late,
            "sneak" => Self::Sneak,
            "hasty" => Self::Hasty,
            "stderr" => Self::Stderr,
            "probe" => Self::Probe,
            "mcp" => Self::Mcp,
            "question" => Self::Question,
            "save" => Self::Save,
            "fs-save" => Self::FsSave,
            "cost" => Self::Cost,
            "cost-wait" => Self::CostWait,
            _ => return None,
        })
    }

    /// Picks the scenario for a prompt and splits off its arguments: the forced scenario takes
    /// the whole text, otherwise the first word chooses and the rest are arguments.
    pub(super) fn choose(forced: Option<Self>, text: &str) -> (Self, &str) {
        if let Some(scenario) = forced {
            return (scenario, text.trim());
        }
        let text = text.trim_start();
        let (first, rest) = text.split_once(char::is_whitespace).unwrap_or((text, ""));
        match Self::from_word(&first.to_lowercase()) {
            Some(scenario) => (scenario, rest.trim()),
            None => (Self::Echo, text.trim_end()),
        }
    }
}

/// An `agent_message_chunk` or `agent_thought_chunk` update carrying text.
fn text_chunk(kind: &str, text: &str) -> Value {
    json!({"sessionUpdate": kind, "content": {"type": "text", "text": text}})
}

/// Splits `text` into at most `pieces` parts of about equal length, on character boundaries.
fn split_pieces(text: &str, pieces: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let size = chars.len().div_ceil(pieces).max(1);
    chars.chunks(size).map(|c| c.iter().collect()).collect()
}

/// The first argument as a count, or `default` when it is missing or malformed.
fn count_arg(args: &str, default: u64) -> u64 {
    match args.split_whitespace().next() {
        None => default,
        Some(word) => word.parse().unwrap_or_else(|_| {
            log!("`{word}` is not a count, using {default}");
            default
        }),
    }
}

/// The turn was cancelled by the client: unwinds a scenario through `?`.
#[derive(Debug)]
pub(super) struct Cancelled;

/// How a turn ends.
pub(super) enum TurnEnd {
    /// Answer the prompt with this stop reason.
    Stop(&'static str),
    /// Answer the prompt with this stop reason, then at once send
    /// `session/request_permission` with these params (its answer ignored).
    StopThenAsk(&'static str, Value),
    /// Answer the prompt with a JSON-RPC error.
    Fail(RpcError),
}

/// What the client answered to a permission request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Answer {
    Allowed,
    Rejected,
    Cancelled,
}

/// A tool call a scenario pretends to make.
pub(super) struct ToolCall {
    id: String,
    title: String,
    kind: &'static str,
    locations: Option<Value>,
    /// `Value::Null`: the tool call has no raw input at all.
    raw_input: Value,
    /// Announced with a `tool_call` update before the permission request.
    announced: bool,
    /// The permission request's `toolCall`, when it is not the call as
    /// announced (some agents send only part of it, or more).
    asked: Option<Value>,
    /// Text of the content reported when the call completes.
    done_text: String,
}

impl ToolCall {
    /// The tool call as announced, pending; also what the permission request shows.
    fn pending(&self) -> Value {
        let mut call = json!({
            "toolCallId": self.id,
            "title": self.title,
            "kind": self.kind,
            "status": "pending",
        });
        if !self.raw_input.is_null() {
            call["rawInput"] = self.raw_input.clone();
        }
        if let Some(locations) = &self.locations {
            call["locations"] = locations.clone();
        }
        call
    }

    /// A `tool_call_update` with the given status and extra fields.
    fn update(&self, status: &str, extra: Value) -> Value {
        let mut update = json!({
            "sessionUpdate": "tool_call_update",
            "toolCallId": self.id,
            "status": status,
        });
        if let (Some(update), Value::Object(extra)) = (update.as_object_mut(), extra) {
            update.extend(extra);
        }
        update
    }
}

/// One prompt being played in one session.
pub(super) struct Turn {
    pub(super) wire: Arc<Wire>,
    /// Pause before each streamed update but the first (`--chunk-delay-ms`).
    pub(super) chunk_delay: Duration,
    pub(super) session_id: String,
    pub(super) cwd: PathBuf,
    /// The names of the MCP servers `session/new` gave the session.
    pub(super) mcp_servers: Vec<String>,
    /// The prompt's text blocks, joined by newlines.
    pub(super) text: String,
    /// Becomes `true` on `session/cancel`.
    pub(super) cancelled: watch::Receiver<bool>,
    pub(super) stdin_closed: watch::Receiver<bool>,
    /// Whether an update was streamed yet: the chunk delay goes between updates only.
    pub(super) streamed: AtomicBool,
}

impl Turn {
    /// Plays the scenario: what the prompt request is answered with, and
    /// the params of a permission request to send right after the answer.
    pub(super) async fn run(
        self,
        scenario: Scenario,
        args: String,
    ) -> (Result<Value, RpcError>, Option<Value>) {
        let end = match self.play(scenario, &args).await {
            // A cancel that raced with the end of the scenario still wins, as ACP asks.
            Ok(TurnEnd::Stop(_) | TurnEnd::StopThenAsk(..)) | Err(Cancelled)
                if self.is_cancelled() =>
            {
                TurnEnd::Stop(CANCELLED)
            }
            Ok(end) => end,
            Err(Cancelled) => TurnEnd::Stop(CANCELLED),
        };
        let (reason, then_ask) = match end {
            TurnEnd::Stop(reason) => (reason, None),
            TurnEnd::StopThenAsk(reason, params) => (reason, Some(params)),
            TurnEnd::Fail(err) => {
                log!("session {}: turn failed: {}", self.session_id, err.message);
                return (Err(err), None);
            }
        };
        log!("session {}: turn over: {reason}", self.session_id);
        (Ok(json!({ "stopReason": reason })), then_ask)
    }

    /// Plays `scenario`; `Err(Cancelled)` when the turn was cancelled midway.
    async fn play(&self, scenario: Scenario, args: &str) -> Result<TurnEnd, Cancelled> {
        match scenario {
            Scenario::Echo => self.echo().await,
            Scenario::Tool => self.write_file().await,
            Scenario::Execute => self.execute(args, false).await,
            Scenario::Codex => self.execute(args, true).await,
            Scenario::Gemini => self.gemini(args).await,
            Scenario::Vibe => self.vibe(args).await,
            Scenario::Qwen => self.qwen(args).await,
            Scenario::Read => self.path_tool("read", "Read", args).await,
            Scenario::Edit => self.path_tool("edit", "Edit", args).await,
            Scenario::Parallel => self.parallel(count_arg(args, 2)).await,
            Scenario::Ask => self.ask(count_arg(args, 3)).await,
            Scenario::Plan => self.plan().await,
            Scenario::Long => self.long(count_arg(args, 1000)).await,
            Scenario::Big => self.big(count_arg(args, 1 << 20)).await,
            Scenario::Slow => self.slow(count_arg(args, 20)).await,
            Scenario::Crash => self.crash().await,
            Scenario::Garbage => self.garbage().await,
            Scenario::Unknown => self.unknown().await,
            Scenario::Hang => self.hang().await,
            Scenario::Child => self.child().await,
            Scenario::Refuse => Ok(TurnEnd::Stop(REFUSAL)),
            Scenario::Error => Ok(TurnEnd::Fail(RpcError::new(
                INTERNAL_ERROR,
                "demo agent failed on purpose",
            ))),
            Scenario::Withdraw => self.withdraw().await,
            Scenario::Late => self.late().await,
            Scenario::Sneak => self.sneak().await,
            Scenario::Question => self.question().await,
            Scenario::Hasty => self.hasty().await,
            Scenario::Stderr => self.stderr().await,
            Scenario::Probe => self.probe(args).await,
            Scenario::Mcp => self.mcp().await,
            Scenario::Save => self.save(args).await,
            Scenario::FsSave => self.fs_save(args).await,
            Scenario::Cost => self.cost(args, false).await,
            Scenario::CostWait => self.cost(args, true).await,
        }
    }

    /// Scenario `probe <path>`: really opens the path (joined to the cwd as
    /// given) for reading, then for writing (appending, nothing written), and
    /// says how each went: `read <path>: ok` or `read <path>: <error>`, then
    /// the same for `write`. What a box lets an agent touch, seen from inside.
    async fn probe(&self, path: &str) -> Result<TurnEnd, Cancelled> {
        let path = self.cwd.join(if path.is_empty() { "." } else { path });
        let outcome = |opened: std::io::Result<std::fs::File>| match opened {
            Ok(_) => "ok".to_owned(),
            Err(e) => e.to_string(),
        };
        let read = outcome(std::fs::File::open(&path));
        let write = outcome(std::fs::OpenOptions::new().append(true).open(&path));
        let shown = path.display();
        self.say(&format!("read {shown}: {read}\nwrite {shown}: {write}"))
            .await?;
        Ok(TurnEnd::Stop(END_TURN))
    }

    /// Scenario `mcp`: the names of the session's MCP servers.
    async fn mcp(&self) -> Result<TurnEnd, Cancelled> {
        let names = if self.mcp_servers.is_empty() {
            "none".to_owned()
        } else {
            self.mcp_servers.join(", ")
        };
        self.say(&format!("mcp servers: {names}")).await?;
        Ok(TurnEnd::Stop(END_TURN))
    }

    /// Default scenario: a thought, then the prompt echoed in four chunks.
    async fn echo(&self) -> Result<TurnEnd, Cancelled> {
        let thought = format!("Thinking about: {}", self.text.trim());
        self.stream(text_chunk("agent_thought_chunk", &thought))
            .await?;
        for piece in split_pieces(&format!("You said: {}", self.text.trim()), 4) {
            self.say(&piece).await?;
        }
        Ok(TurnEnd::Stop(END_TURN))
    }

    /// Scenario `tool`/`write`: one edit tool call that needs permission.
    async fn write_file(&self) -> Result<TurnEnd, Cancelled> {
        let call = self.write_hello_call();
        self.single_tool_call(call, false).await
    }

    /// Scenarios `execute` and `codex`: one execute tool call for `command`,
    /// as a command line, or (`codex`) as the argv array Codex sends, which
    /// runs the line with `/bin/sh -lc`.
    async fn execute(&self, command: &str, codex_argv: bool) -> Result<TurnEnd, Cancelled> {
        let command = or_hello(command);
        let raw_command = if codex_argv {
            json!(["/bin/sh", "-lc", command])
        } else {
            json!(command)
        };
        let call = self.execute_call(command, raw_command);
        self.single_tool_call(call, false).await
    }

    /// Scenario `gemini`: a permission request for a command that appears
    /// only in the title: no `tool_call` before it and no raw input, as
    /// Gemini CLI asks.
    async fn gemini(&self, command: &str) -> Result<TurnEnd, Cancelled> {
        let command = or_hello(command);
        let call = ToolCall {
            title: command.to_owned(),
            raw_input: Value::Null,
            announced: false,
            ..self.execute_call(command, Value::Null)
        };
        self.single_tool_call(call, false).await
    }

    /// Scenario `vibe`: the command announced in a `tool_call`, the
    /// permission request carrying only `{toolCallId}`, as Mistral Vibe asks.
    async fn vibe(&self, command: &str) -> Result<TurnEnd, Cancelled> {
        let mut call = self.execute_call(or_hello(command), json!(or_hello(command)));
        call.asked = Some(json!({ "toolCallId": call.id }));
        self.single_tool_call(call, false).await
    }

    /// Scenario `qwen`: a call announced as a bare `Shell` with empty raw
    /// input, the permission request carrying its title and command, as
    /// Qwen Code asks.
    async fn qwen(&self, command: &str) -> Result<TurnEnd, Cancelled> {
        let whole = self.execute_call(or_hello(command), json!(or_hello(command)));
        let call = ToolCall {
            asked: Some(whole.pending()),
            title: "Shell".to_owned(),
            raw_input: json!({}),
            ..whole
        };
        self.single_tool_call(call, false).await
    }

    /// An `execute` tool call running `command` (as `raw_command` in its
    /// raw input), announced, and asked for as announced.
    fn execute_call(&self, command: &str, raw_command: Value) -> ToolCall {
        ToolCall {
            id: self.next_tool_call_id(),
            title: format!("Run {command}"),
            kind: "execute",
            locations: None,
            raw_input: json!({ "command": raw_command }),
            done_text: format!("ran {command}"),
            announced: true,
            asked: None,
        }
    }

    /// Scenarios `read <path>` and `edit <path>`: one tool call of that kind
    /// on the path (joined to the session's cwd as given, `..` and all).
    async fn path_tool(
        &self,
        kind: &'static str,
        verb: &str,
        path: &str,
    ) -> Result<TurnEnd, Cancelled> {
        let path = self
            .cwd
            .join(if path.is_empty() { "README.md" } else { path })
            .display()
            .to_string();
        let call = ToolCall {
            id: self.next_tool_call_id(),
            title: format!("{verb} {path}"),
            kind,
            locations: Some(json!([{ "path": path }])),
            raw_input: json!({ "path": path }),
            done_text: format!("{verb} {path}: done"),
            announced: true,
            asked: None,
        };
        self.single_tool_call(call, false).await
    }

    /// Scenario `withdraw`: a tool call whose permission request the agent withdraws.
    async fn withdraw(&self) -> Result<TurnEnd, Cancelled> {
        let call = self.write_hello_call();
        self.single_tool_call(call, true).await
    }

    /// The tool call of the `tool` and `withdraw` scenarios.
    fn write_hello_call(&self) -> ToolCall {
        let path = self.cwd.join("hello.txt").display().to_string();
        ToolCall {
            id: self.next_tool_call_id(),
            title: "Write hello.txt".to_owned(),
            kind: "edit",
            locations: Some(json!([{ "path": path }])),
            raw_input: json!({"path": path, "content": "hello"}),
            done_text: "wrote hello.txt".to_owned(),
            announced: true,
            asked: None,
        }
    }

    /// Announces one tool call, asks permission for it and reports what came of it.
    async fn single_tool_call(&self, call: ToolCall, withdraw: bool) -> Result<TurnEnd, Cancelled> {
        let answers = self
            .run_tool_calls(std::slice::from_ref(&call), withdraw)
            .await?;
        match answers[0] {
            Answer::Allowed => self.say("Done.").await?,
            Answer::Rejected => self.say("Permission denied.").await?,
            // The agent withdrew the request itself: the turn goes on.
            Answer::Cancelled if withdraw => self.say("Permission request withdrawn.").await?,
            Answer::Cancelled => return Ok(TurnEnd::Stop(CANCELLED)),
        }
        Ok(TurnEnd::Stop(END_TURN))
    }

    /// A tool call that writes `content` to `name` in the working directory.
    pub(super) fn write_call(&self, name: &str, content: &str) -> ToolCall {
        let path = self.cwd.join(name).display().to_string();
        ToolCall {
            id: self.next_tool_call_id(),
            title: format!("Write {name}"),
            kind: "edit",
            locations: Some(json!([{ "path": path }])),
            raw_input: json!({"path": path, "content": content}),
            done_text: format!("wrote {name}"),
            announced: true,
            asked: None,
        }
    }

    /// Scenario `parallel`: `n` tool calls whose permission requests are all pending at once.
    async fn parallel(&self, n: u64) -> Result<TurnEnd, Cancelled> {
        let calls: Vec<ToolCall> = (0..n)
            .map(|i| self.write_call(&format!("hello-{i}.txt"), &format!("hello {i}")))
            .collect();
        let answers = self.run_tool_calls(&calls, false).await?;
        if answers.contains(&Answer::Cancelled) {
            return Ok(TurnEnd::Stop(CANCELLED));
        }
        let ran = answers.iter().filter(|a| **a == Answer::Allowed).count();
        self.say(&format!("{ran} of {n} tool calls ran.")).await?;
        Ok(TurnEnd::Stop(END_TURN))
    }

    /// Scenario `ask`: `n` tool calls one after the other, each asking permission and waiting
    /// for its answer before the next is announced: a steady series of requests, for load.
    async fn ask(&self, n: u64) -> Result<TurnEnd, Cancelled> {
        let mut ran = 0;
        for i in 0..n {
            let call = self.write_call(&format!("ask-{i}.txt"), &format!("ask {i}"));
            let answers = self
                .run_tool_calls(std::slice::from_ref(&call), false)
                .await?;
            match answers[0] {
                Answer::Allowed => ran += 1,
                Answer::Rejected => {}
                Answer::Cancelled => return Ok(TurnEnd::Stop(CANCELLED)),
            }
        }
        self.say(&format!("{ran} of {n} tool calls ran.")).await?;
        Ok(TurnEnd::Stop(END_TURN))
    }

    /// Scenario `plan`: a plan update and a chunk.
    async fn plan(&self) -> Result<TurnEnd, Cancelled> {
        self.stream(json!({
            "sessionUpdate": "plan",
            "entries": [
                {"content": "Read the code", "priority": "high", "status": "completed"},
                {"content": "Write the fix", "priority": "medium", "status": "in_progress"},
                {"content": "Run the tests", "priority": "low", "status": "pending"},
            ],
        }))
        .await?;
        self.say("Here is my plan.").await?;
        Ok(TurnEnd::Stop(END_TURN))
    }

    /// Scenario `long`: `n` chunks (`w0 `, `w1 `, …) as fast as the client reads them.
    async fn long(&self, n: u64) -> Result<TurnEnd, Cancelled> {
        if !self.chunk_delay.is_zero() {
            for i in 0..n {
                self.say(&format!("w{i} ")).await?;
            }
            return Ok(TurnEnd::Stop(END_TURN));
        }
        // Unpaced, the lines are written in blocks, formatted directly rather than built as
        // JSON values: a benchmark's agent must be much faster than the client it measures.
        use std::fmt::Write;
        const BLOCK_BYTES: usize = 32 * 1024;
        let prefix = format!(
            r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":{},"update":{{"sessionUpdate":"agent_message_chunk","content":{{"type":"text","text":"#,
            Value::from(self.session_id.as_str())
        );
        let mut block = String::with_capacity(BLOCK_BYTES + 256);
        for i in 0..n {
            if !block.is_empty() {
                block.push('\n');
            }
            // The text needs no escaping: a letter, digits and a space.
            let _ = write!(block, r#"{prefix}"w{i} "}}}}}}}}"#);
            if block.len() >= BLOCK_BYTES || i + 1 == n {
                self.pace().await?;
                self.wire.send_raw(std::mem::take(&mut block)).await;
            }
        }
        Ok(TurnEnd::Stop(END_TURN))
    }

    /// Scenario `big`: one message chunk of `n` bytes of text.
    async fn big(&self, n: u64) -> Result<TurnEnd, Cancelled> {
        let text: String = "0123456789abcdef"
            .chars()
            .cycle()
            .take(n as usize)
            .collect();
        self.say(&text).await?;
        Ok(TurnEnd::Stop(END_TURN))
    }

    /// Scenario `slow`: `n` chunks, 50 ms apart.
    async fn slow(&self, n: u64) -> Result<TurnEnd, Cancelled> {
        for i in 0..n {
            if i > 0 {
                // `say` already waits the chunk delay; top it up to the slow interval.
                let delay = self.chunk_delay;
                self.pause(SLOW_INTERVAL.saturating_sub(delay)).await?;
            }
            self.say(&format!("s{i} ")).await?;
        }
        Ok(TurnEnd::Stop(END_TURN))
    }

    /// Scenario `crash`: exits mid-turn without answering the prompt.
    async fn crash(&self) -> Result<TurnEnd, Cancelled> {
        self.say("About to crash.").await?;
        log!("crashing on purpose");
        match self.wire.exit(3).await {}
    }

    /// Scenario `garbage`: non-JSON lines on stdout between chunks.
    async fn garbage(&self) -> Result<TurnEnd, Cancelled> {
        self.say("Here comes some garbage. ").await?;
        self.wire.send_raw("this is not json".to_owned()).await;
        self.say("More garbage. ").await?;
        self.wire.send_raw("{\"broken\": ".to_owned()).await;
        self.say("And a bare word. ").await?;
        self.wire.send_raw("garbage".to_owned()).await;
        self.say("Done with garbage.").await?;
        Ok(TurnEnd::Stop(END_TURN))
    }

    /// Scenario `unknown`: an update of a kind no client knows yet.
    async fn unknown(&self) -> Result<TurnEnd, Cancelled> {
        self.stream(json!({
            "sessionUpdate": "future_variant_xyz",
            "payload": {"a": 1},
            "_meta": {"x": true},
        }))
        .await?;
        self.say("That was an update of a kind from the future.")
            .await?;
        Ok(TurnEnd::Stop(END_TURN))
    }

    /// Scenario `hang`: waits for `session/cancel`.
    pub(super) async fn hang(&self) -> Result<TurnEnd, Cancelled> {
        log!("session {}: hanging until session/cancel", self.session_id);
        let mut stdin_closed = self.stdin_closed.clone();
        tokio::select! {
            () = self.until_cancelled() => {}
            // Nobody can cancel any more: stop rather than keep the process alive forever.
            _ = stdin_closed.wait_for(|closed| *closed) => {}
        }
        Err(Cancelled)
    }

    /// Scenario `child`: starts a long `sleep` of its own, says its pid
    /// (`child <pid>`), then hangs like `hang`: for checking that a
    /// conversation's agent is stopped together with its children.
    async fn child(&self) -> Result<TurnEnd, Cancelled> {
        let child = std::process::Command::new("sleep")
            .arg("600")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn();
        match child {
            Ok(child) => self.say(&format!("child {}", child.id())).await?,
            Err(e) => self.say(&format!("could not start a child: {e}")).await?,
        }
        self.hang().await
    }

    /// Scenario `late`: waits for `session/cancel`, then asks permission to
    /// run `echo late`, as a request that crossed the cancel on the wire
    /// would, and says what it was answered (`late answer: <outcome>`, or
    /// `late answer: none` when no answer came within the grace a client
    /// has after a cancel).
    async fn late(&self) -> Result<TurnEnd, Cancelled> {
        let _ = self.hang().await;
        let call = json!({
            "toolCallId": "late_call",
            "title": "Run `echo late`",
            "kind": "execute",
            "status": "pending",
            "rawInput": {"command": "echo late"},
        });
        let answer = self.ask_once(call).await;
        let said = answer.map_or_else(|| "none".to_owned(), |a| a["outcome"].to_string());
        self.notify(text_chunk(
            "agent_message_chunk",
            &format!("late answer: {said}"),
        ))
        .await;
        Err(Cancelled)
    }

    /// Scenario `sneak`: asks permission for a call that shows only a title
    /// ("Tidy up": no command), and while the request waits, updates the
    /// call with a command (`rm -rf build`); says what it was answered
    /// (`answer: <outcome>`).
    async fn sneak(&self) -> Result<TurnEnd, Cancelled> {
        let call = json!({
            "toolCallId": "sneak_call",
            "title": "Tidy up",
            "kind": "execute",
            "status": "pending",
        });
        let update = json!({
            "sessionUpdate": "tool_call_update",
            "toolCallId": "sneak_call",
            "rawInput": {"command": "rm -rf build"},
        });
        let answer = self.ask_once_then(call, Some(update)).await;
        let said = answer.map_or_else(|| "none".to_owned(), |a| a["outcome"].to_string());
        self.say(&format!("answer: {said}")).await?;
        Ok(TurnEnd::Stop(END_TURN))
    }

    /// Scenario `question`: asks the person `Go on?` (`elicitation/create`,
    /// a form of one required boolean, `go`) and says what it was answered
    /// (`question answer: <result as JSON>`, `none` without one).
    async fn question(&self) -> Result<TurnEnd, Cancelled> {
        let params = json!({
            "sessionId": self.session_id,
            "mode": "form",
            "message": "Go on?",
            "requestedSchema": {
                "type": "object",
                "properties": {"go": {"type": "boolean"}},
                "required": ["go"],
            },
        });
        let (_, answer) = self.wire.request("elicitation/create", params).await;
        let said = match answer.await {
            Ok(Ok(result)) => result.to_string(),
            _ => "none".to_owned(),
        };
        self.say(&format!("question answer: {said}")).await?;
        Ok(TurnEnd::Stop(END_TURN))
    }

    /// Scenario `hasty`: answers the prompt and at once asks permission to
    /// read `notes.txt` (ignoring the answer): the answer and a request
    /// after it reach the client together.
    async fn hasty(&self) -> Result<TurnEnd, Cancelled> {
        let path = self.cwd.join("notes.txt").display().to_string();
        let call = json!({
            "toolCallId": self.next_tool_call_id(),
            "title": "Read notes.txt",
            "kind": "read",
            "status": "pending",
            "locations": [{"path": path}],
        });
        Ok(TurnEnd::StopThenAsk(END_TURN, self.permission_params(call)))
    }

    /// Asks permission for `call` (the usual options) and waits for the
    /// answer, at most the grace a client has after a cancel once the turn
    /// is cancelled: the answer's `result`, `None` without one.
    async fn ask_once(&self, call: Value) -> Option<Value> {
        self.ask_once_then(call, None).await
    }

    /// [`Self::ask_once`], sending `update` while the request waits.
    async fn ask_once_then(&self, call: Value, update: Option<Value>) -> Option<Value> {
        let (id, answer) = self
            .wire
            .request("session/request_permission", self.permission_params(call))
            .await;
        if let Some(update) = update {
            self.notify(update).await;
        }
        let waited = if self.is_cancelled() {
            tokio::time::timeout(PERMISSION_GRACE, answer).await.ok()
        } else {
            Some(answer.await)
        };
        match waited {
            Some(Ok(Ok(result))) => Some(result),
            _ => {
                self.wire.forget(id);
                None
            }
        }
    }

    /// Scenario `stderr`: logs five lines, then answers.
    async fn stderr(&self) -> Result<TurnEnd, Cancelled> {
        for i in 1..=5 {
            log!("stderr line {i} of 5");
        }
        self.say("I wrote five lines to stderr.").await?;
        Ok(TurnEnd::Stop(END_TURN))
    }

    /// Announces `calls`, asks permission for all of them at once and completes or fails each
    /// as its answer arrives. With `withdraw`, each request is withdrawn right after it is
    /// sent. Returns the answers in the order of `calls`, or `Cancelled` if the turn was
    /// cancelled (the tool calls are resolved either way).
    pub(super) async fn run_tool_calls(
        &self,
        calls: &[ToolCall],
        withdraw: bool,
    ) -> Result<Vec<Answer>, Cancelled> {
        self.pace().await?;
        for call in calls.iter().filter(|c| c.announced) {
            let mut update = call.pending();
            update["sessionUpdate"] = json!("tool_call");
            self.notify(update).await;
        }

        let mut ids = Vec::with_capacity(calls.len());
        let mut waiters = JoinSet::new();
        for (index, call) in calls.iter().enumerate() {
            let params =
                self.permission_params(call.asked.clone().unwrap_or_else(|| call.pending()));
            let (id, answer) = self
                .wire
                .request("session/request_permission", params)
                .await;
            if withdraw {
                self.wire
                    .send(notification("$/cancel_request", json!({ "requestId": id })))
                    .await;
            }
            ids.push(id);
            waiters.spawn(async move { (index, answer.await) });
        }

        let mut answers = vec![None; calls.len()];
        let mut give_up_at = None;
        while !waiters.is_empty() {
            tokio::select! {
                Some(joined) = waiters.join_next() => {
                    let (index, reply) = joined.expect("permission waiter panicked");
                    // A dropped waiter means stdin closed: no answer will ever come.
                    let answer = match reply {
                        Ok(reply) => self.classify(reply),
                        Err(_) => Answer::Cancelled,
                    };
                    self.resolve(&calls[index], answer).await;
                    answers[index] = Some(answer);
                }
                () = self.until_cancelled(), if give_up_at.is_none() => {
                    give_up_at = Some(Instant::now() + PERMISSION_GRACE);
                }
                () = sleep_until(give_up_at.unwrap_or_else(Instant::now)), if give_up_at.is_some() => {
                    log!(
                        "session {}: no answer to {} permission request(s) after cancel, giving up",
                        self.session_id,
                        waiters.len(),
                    );
                    break;
                }
            }
        }
        waiters.abort_all();

        let mut result = Vec::with_capacity(calls.len());
        for ((call, id), answer) in calls.iter().zip(ids).zip(answers) {
            let answer = match answer {
                Some(answer) => answer,
                None => {
                    self.wire.forget(id);
                    self.resolve(call, Answer::Cancelled).await;
                    Answer::Cancelled
                }
            };
            result.push(answer);
        }
        if self.is_cancelled() {
            return Err(Cancelled);
        }
        Ok(result)
    }

    /// A `session/request_permission`'s params: `call` and the usual options.
    fn permission_params(&self, call: Value) -> Value {
        json!({
            "sessionId": self.session_id,
            "toolCall": call,
            "options": PERMISSION_OPTIONS
                .iter()
                .map(|(id, name, kind)| json!({"optionId": id, "name": name, "kind": kind}))
                .collect::<Vec<_>>(),
        })
    }

    /// Reads a `session/request_permission` answer.
    fn classify(&self, reply: Reply) -> Answer {
        // After session/cancel the tool must not run, whatever the client says.
        if self.is_cancelled() {
            return Answer::Cancelled;
        }
        let result = match reply {
            Ok(result) => result,
            Err(error) => {
                log!("permission request failed ({error}), taking it as cancelled");
                return Answer::Cancelled;
            }
        };
        let outcome = &result["outcome"];
        match outcome["outcome"].as_str() {
            Some("selected") => {
                let option_id = outcome["optionId"].as_str().unwrap_or_default();
                match PERMISSION_OPTIONS.iter().find(|(id, ..)| *id == option_id) {
                    Some((_, _, kind)) if kind.starts_with("allow") => Answer::Allowed,
                    Some(_) => Answer::Rejected,
                    None => {
                        log!("unknown permission option {option_id:?}, taking it as a rejection");
                        Answer::Rejected
                    }
                }
            }
            Some("cancelled") => Answer::Cancelled,
            _ => {
                log!("malformed permission answer {result}, taking it as cancelled");
                Answer::Cancelled
            }
        }
    }

    /// Reports the fate of a tool call. Sent even after a cancel: a client must not be left
    /// with tool calls that stay pending forever.
    async fn resolve(&self, call: &ToolCall, answer: Answer) {
        if answer == Answer::Allowed {
            self.notify(call.update("in_progress", json!({}))).await;
            let content = json!([{
                "type": "content",
                "content": {"type": "text", "text": call.done_text},
            }]);
            self.notify(call.update("completed", json!({ "content": content })))
                .await;
        } else {
            self.notify(call.update("failed", json!({}))).await;
        }
    }

    /// A tool call id unique within the process.
    fn next_tool_call_id(&self) -> String {
        let n = NEXT_TOOL_CALL.fetch_add(1, Ordering::Relaxed);
        format!("call_{n}")
    }

    /// Whether `session/cancel` arrived for this turn.
    fn is_cancelled(&self) -> bool {
        *self.cancelled.borrow()
    }

    /// Completes when the turn is cancelled.
    async fn until_cancelled(&self) {
        let mut cancelled = self.cancelled.clone();
        if cancelled.wait_for(|cancelled| *cancelled).await.is_err() {
            // The session dropped its signal: no cancel can come any more.
            std::future::pending::<()>().await;
        }
    }

    /// Sleeps, unless the turn is cancelled first.
    async fn pause(&self, duration: Duration) -> Result<(), Cancelled> {
        if !duration.is_zero() {
            tokio::select! {
                () = sleep(duration) => {}
                () = self.until_cancelled() => {}
            }
        }
        if self.is_cancelled() {
            Err(Cancelled)
        } else {
            Ok(())
        }
    }

    /// Waits the chunk delay unless this is the turn's first streamed update, then checks for
    /// cancellation: the point where a streaming scenario stops.
    async fn pace(&self) -> Result<(), Cancelled> {
        if self.streamed.swap(true, Ordering::Relaxed) {
            self.pause(self.chunk_delay).await
        } else {
            self.pause(Duration::ZERO).await
        }
    }

    /// Streams an update, paced and interruptible by cancellation.
    pub(super) async fn stream(&self, update: Value) -> Result<(), Cancelled> {
        self.pace().await?;
        self.notify(update).await;
        Ok(())
    }

    /// Streams a piece of the agent's reply.
    pub(super) async fn say(&self, text: &str) -> Result<(), Cancelled> {
        self.stream(text_chunk("agent_message_chunk", text)).await
    }

    /// Sends an update at once, cancelled or not.
    async fn notify(&self, update: Value) {
        self.wire
            .send(notification(
                "session/update",
                json!({"sessionId": self.session_id, "update": update}),
            ))
            .await;
    }
}
