//! `acp-demo-agent`: a scripted [Agent Client Protocol] agent for testing and demonstrating
//! acp-gateway without a real coding agent, an API key or a network connection.
//!
//! It speaks ACP v1 (JSON-RPC 2.0, one JSON message per line) on stdin/stdout and writes
//! free-form logs to stderr. It does no real work: every prompt plays a canned *scenario*,
//! chosen by the first word of the prompt's text (text blocks joined, compared in lowercase);
//! the remaining words are the scenario's arguments. Several sessions can run turns at the
//! same time, and the agent keeps reading stdin while a turn streams or waits, so
//! `session/cancel` and answers to its own requests are handled at any moment.
//!
//! # Methods
//!
//! * `initialize`: protocol version 1, no `loadSession`, no image/audio/embedded context,
//!   no auth methods, `agentInfo` `acp-demo-agent` 0.1.0.
//! * `session/new` (`cwd` and `mcpServers` required): answers `{"sessionId":"demo-<n>"}`.
//! * `session/prompt`: plays a scenario, then answers `{"stopReason": ...}`. A session runs one
//!   turn at a time; a second prompt while one runs is answered with an error.
//! * `session/cancel` (notification): the running turn stops streaming at the next chunk, and
//!   the prompt is answered with stop reason `cancelled`.
//! * Any other request gets JSON-RPC error -32601; other notifications are ignored, and so are
//!   lines that are not JSON.
//!
//! The agent's own requests (`session/request_permission`) are numbered from 0. Permission
//! requests offer `allow-once`, `allow-always`, `reject-once` and `reject-always`. An answer
//! with outcome `cancelled`, a JSON-RPC error, or stdin closing all count as cancelled. After
//! `session/cancel` the agent waits up to one second for the client to answer its outstanding
//! permission requests (the client must answer them `cancelled`), then stops waiting.
//!
//! # Scenarios
//!
//! | first word | what happens | stop reason |
//! |---|---|---|
//! | anything else, e.g. `hello` | thought chunk `Thinking about: <text>`, then `You said: <text>` in 4 message chunks | `end_turn` |
//! | `tool` or `write` | `tool_call` "Write hello.txt" (kind `edit`, location `<cwd>/hello.txt`), then a permission request for it: allowed → `in_progress`, `completed` and message "Done."; rejected → `failed` and "Permission denied."; cancelled → `failed` | `end_turn`, or `cancelled` |
//! | `read <path>`, `edit <path>` | like `tool`, with that kind, on `<cwd>/<path>` (joined as given, so `..` stays in it; default `README.md`) | as `tool` |
//! | `execute <command…>` | like `tool`, with kind `execute`, title `Run <command>` and raw input `{"command": …}` (the command defaults to `echo hello`) | as `tool` |
//! | `codex <command…>` | like `execute`, with the command as Codex sends it: raw input `{"command": ["/bin/sh", "-lc", <command>]}` | as `tool` |
//! | `gemini <command…>` | like `execute` as Gemini CLI asks: no `tool_call` before the request and no raw input, the command only in the title | as `tool` |
//! | `parallel [N]` | N tool calls (default 2), then N permission requests all outstanding at once; each tool call completes or fails as its own answer arrives, in any order; then a summary chunk | `end_turn`, or `cancelled` if any answer was cancelled |
//! | `plan` | a `plan` update with three entries, then a message chunk | `end_turn` |
//! | `long [N]` | N message chunks `w0 `, `w1 `, … (default 1000) as fast as possible | `end_turn` |
//! | `big [N]` | one message chunk of N bytes of text (default 1 MiB) | `end_turn` |
//! | `slow [N]` | N message chunks `s0 `, `s1 `, … (default 20), 50 ms apart: handy for cancelling mid-stream | `end_turn` |
//! | `crash` | one message chunk, `demo agent: crashing on purpose` on stderr, then exit code 3 without answering | none |
//! | `garbage` | non-JSON lines on stdout (`this is not json`, `{"broken": `, `garbage`) between message chunks | `end_turn` |
//! | `unknown` | a `session/update` of the made-up kind `future_variant_xyz` (with `_meta`), then a message chunk | `end_turn` |
//! | `child` | starts `sleep 600` as its own child, says `child <pid>`, then hangs like `hang` | `cancelled` |
//! | `hang` | nothing, until `session/cancel` arrives (or stdin closes) | `cancelled` |
//! | `refuse` | nothing | `refusal` |
//! | `error` | the prompt is answered with JSON-RPC error -32603 `demo agent failed on purpose` | none |
//! | `withdraw` | like `tool`, but right after the permission request the agent sends `$/cancel_request` for it; the client answers `cancelled`, the tool call fails and a message chunk follows | `end_turn` |
//! | `stderr` | five lines on stderr, then a message chunk | `end_turn` |
//!
//! Tool call ids are `call_1`, `call_2`, … unique within the process. Numeric arguments that
//! do not parse fall back to the default (with a note on stderr).
//!
//! # Flags
//!
//! * `--chunk-delay-ms N`: sleep N ms between the streamed steps of every turn: message and
//!   thought chunks, plan, the announcement of tool calls (default 0). In `slow`, the gap is
//!   the larger of N and 50 ms.
//! * `--fail-on METHOD`: answer requests for METHOD (e.g. `initialize`, `session/new`) with
//!   JSON-RPC error -32603 `demo agent refuses METHOD`.
//! * `--hang-on METHOD`: never answer requests for METHOD.
//! * `--exit-on METHOD`: when METHOD arrives, print `demo agent: exiting on METHOD` on stderr
//!   and exit with code 2.
//! * `--stdout-banner`: print the non-JSON line `acp-demo-agent starting up` on stdout before
//!   anything else, like agents that log to stdout by mistake.
//! * `--scenario WORD`: play scenario WORD (`echo` names the default one) for every prompt;
//!   the whole prompt text becomes its arguments.
//! * `--help`: print the usage.
//!
//! Each of `--fail-on`, `--hang-on` and `--exit-on` may be given several times, and also
//! applies to notifications: `--hang-on session/cancel` or `--fail-on session/cancel` make the
//! agent ignore cancellation. Values may also be written `--flag=value`. An unknown or
//! malformed argument prints an error on stderr and exits with code 64.
//!
//! When stdin closes, turns still streaming run to completion, anything waiting for the
//! client counts as cancelled, and the agent exits with code 0 once stdout is flushed.
//!
//! # Example
//!
//! ```text
//! $ acp-demo-agent --chunk-delay-ms 20
//! {"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}
//! {"jsonrpc":"2.0","id":2,"method":"session/new","params":{"cwd":"/tmp","mcpServers":[]}}
//! {"jsonrpc":"2.0","id":3,"method":"session/prompt","params":{"sessionId":"demo-1","prompt":[{"type":"text","text":"tool"}]}}
//! ```
//!
//! [Agent Client Protocol]: https://agentclientprotocol.com

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinSet;
use tokio::time::{sleep, sleep_until, Instant};

/// The ACP protocol version this agent speaks.
const PROTOCOL_VERSION: u64 = 1;

/// How long to keep waiting for permission answers after `session/cancel`: the client must
/// answer them `cancelled`, but a turn must not hang on a client that forgets to.
const PERMISSION_GRACE: Duration = Duration::from_secs(1);

/// The gap between chunks of the `slow` scenario.
const SLOW_INTERVAL: Duration = Duration::from_millis(50);

/// Lines queued for stdout. Bounded so that a client that stops reading stalls the agent, as
/// a full pipe would, instead of growing memory without limit.
const OUTBOX_CAPACITY: usize = 256;

/// Exit code for a bad command line (`EX_USAGE` from sysexits.h).
const EXIT_USAGE: i32 = 64;

/// JSON-RPC error code: the method does not exist.
const METHOD_NOT_FOUND: i64 = -32601;
/// JSON-RPC error code: the params are malformed or refer to something unknown.
const INVALID_PARAMS: i64 = -32602;
/// JSON-RPC error code: the agent failed to handle the request.
const INTERNAL_ERROR: i64 = -32603;

/// Stop reasons this agent answers prompts with.
const END_TURN: &str = "end_turn";
const CANCELLED: &str = "cancelled";
const REFUSAL: &str = "refusal";

/// The choices offered in every permission request, as (optionId, name, kind).
const PERMISSION_OPTIONS: [(&str, &str, &str); 4] = [
    ("allow-once", "Allow once", "allow_once"),
    ("allow-always", "Always allow", "allow_always"),
    ("reject-once", "Reject", "reject_once"),
    ("reject-always", "Always reject", "reject_always"),
];

const USAGE: &str = "\
usage: acp-demo-agent [--chunk-delay-ms N] [--fail-on METHOD] [--hang-on METHOD]
                      [--exit-on METHOD] [--stdout-banner] [--scenario WORD]
A scripted ACP agent speaking JSON-RPC on stdin/stdout. The first word of each prompt picks
a scenario: tool, write, execute, codex, gemini, read, edit, parallel, plan, long, slow, crash, garbage,
unknown, hang, child, refuse, error, withdraw, stderr; any other text is echoed.";

/// Writes a line to stderr with the agent's prefix; stdout is reserved for protocol messages.
macro_rules! log {
    ($($arg:tt)*) => {
        eprintln!("demo agent: {}", format_args!($($arg)*))
    };
}

/// Runs the agent on this process's stdin/stdout with the given command-line
/// arguments (without the program name); returns when stdin closes. Used by
/// the `acp-demo-agent` binary and by `acp-gateway demo-agent`.
pub async fn run(args: impl IntoIterator<Item = String>) {
    let options = match Options::parse(args) {
        Ok(options) => options,
        Err(ArgsError::Help) => {
            println!("{USAGE}");
            return;
        }
        Err(ArgsError::Invalid(message)) => {
            eprintln!("acp-demo-agent: {message}\n{USAGE}");
            std::process::exit(EXIT_USAGE);
        }
    };

    let (outbox, lines) = mpsc::channel(OUTBOX_CAPACITY);
    let writer = tokio::task::spawn_blocking(move || write_stdout(lines));
    let banner = options.stdout_banner;
    let agent = Arc::new(Agent::new(options, outbox));
    if banner {
        agent
            .send_raw("acp-demo-agent starting up".to_owned())
            .await;
    }
    agent.serve().await;
    // The writer stops once every sender is gone, after writing what is queued.
    drop(agent);
    writer.await.expect("stdout writer panicked");
}

/// Why the command line was not accepted.
enum ArgsError {
    /// `--help` was given.
    Help,
    /// An unknown flag, a missing value or a malformed value.
    Invalid(String),
}

/// The command-line flags.
#[derive(Debug, Default)]
struct Options {
    /// Pause before each streamed update of a turn but the first.
    chunk_delay: Duration,
    /// Requests answered with an error.
    fail_on: HashSet<String>,
    /// Requests never answered.
    hang_on: HashSet<String>,
    /// Methods that make the process exit.
    exit_on: HashSet<String>,
    /// Print a non-JSON line on stdout at startup.
    stdout_banner: bool,
    /// Play this scenario for every prompt instead of looking at the first word.
    scenario: Option<Scenario>,
}

impl Options {
    /// Parses the arguments after the program name.
    fn parse(args: impl IntoIterator<Item = String>) -> Result<Self, ArgsError> {
        let mut options = Options::default();
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            // Accept both `--flag value` and `--flag=value`.
            let (flag, inline_value) = match arg.split_once('=') {
                Some((flag, value)) if flag.starts_with("--") => {
                    (flag.to_owned(), Some(value.to_owned()))
                }
                _ => (arg, None),
            };
            let mut value = || {
                inline_value
                    .clone()
                    .or_else(|| args.next())
                    .ok_or_else(|| ArgsError::Invalid(format!("{flag} needs a value")))
            };
            match flag.as_str() {
                "--chunk-delay-ms" => {
                    let value = value()?;
                    let ms = value.parse().map_err(|_| {
                        ArgsError::Invalid(format!("--chunk-delay-ms: `{value}` is not a number"))
                    })?;
                    options.chunk_delay = Duration::from_millis(ms);
                }
                "--fail-on" => {
                    options.fail_on.insert(value()?);
                }
                "--hang-on" => {
                    options.hang_on.insert(value()?);
                }
                "--exit-on" => {
                    options.exit_on.insert(value()?);
                }
                "--scenario" => {
                    let word = value()?;
                    let scenario = Scenario::from_word(&word.to_lowercase()).ok_or_else(|| {
                        ArgsError::Invalid(format!("--scenario: unknown scenario `{word}`"))
                    })?;
                    options.scenario = Some(scenario);
                }
                "--stdout-banner" if inline_value.is_none() => options.stdout_banner = true,
                "-h" | "--help" => return Err(ArgsError::Help),
                _ => {
                    return Err(ArgsError::Invalid(format!(
                        "unknown argument `{}`",
                        inline_value.map_or(flag.clone(), |v| format!("{flag}={v}"))
                    )))
                }
            }
        }
        Ok(options)
    }
}

/// The canned behaviours a prompt can ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scenario {
    Echo,
    Tool,
    Execute,
    Codex,
    Gemini,
    Read,
    Edit,
    Parallel,
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
    Stderr,
}

impl Scenario {
    /// The scenario named by a (lowercase) word, if any.
    fn from_word(word: &str) -> Option<Self> {
        Some(match word {
            "echo" => Self::Echo,
            "tool" | "write" => Self::Tool,
            "execute" => Self::Execute,
            "codex" => Self::Codex,
            "gemini" => Self::Gemini,
            "read" => Self::Read,
            "edit" => Self::Edit,
            "parallel" => Self::Parallel,
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
            "stderr" => Self::Stderr,
            _ => return None,
        })
    }

    /// Picks the scenario for a prompt and splits off its arguments: the forced scenario takes
    /// the whole text, otherwise the first word chooses and the rest are arguments.
    fn choose(forced: Option<Self>, text: &str) -> (Self, &str) {
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

/// One line for the stdout writer.
enum Out {
    /// A line to write (without its newline).
    Line(String),
    /// Flush and exit the process with this code; queued before it means written before it.
    Exit(i32),
}

/// Owns stdout: the single place that writes to it, so lines never interleave. Runs on a
/// blocking thread because it flushes after every line.
fn write_stdout(mut lines: mpsc::Receiver<Out>) {
    let mut stdout = std::io::stdout().lock();
    while let Some(out) = lines.blocking_recv() {
        match out {
            Out::Line(line) => {
                if let Err(err) = writeln!(stdout, "{line}").and_then(|()| stdout.flush()) {
                    log!("cannot write to stdout ({err}), exiting");
                    std::process::exit(1);
                }
            }
            Out::Exit(code) => {
                // Nothing useful to do if this flush fails: we are exiting anyway.
                let _ = stdout.flush();
                std::process::exit(code);
            }
        }
    }
}

/// The answer to a request the agent sent: its `result`, or its `error` object.
type Reply = Result<Value, Value>;

/// A JSON-RPC error to answer a request with.
#[derive(Debug)]
struct RpcError {
    code: i64,
    message: String,
}

impl RpcError {
    fn new(code: i64, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

/// Any JSON-RPC message, loosely typed: which fields are present tells what it is.
#[derive(Deserialize)]
struct Incoming {
    id: Option<Value>,
    method: Option<String>,
    #[serde(default)]
    params: Value,
    result: Option<Value>,
    error: Option<Value>,
}

/// Params of `session/new`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct NewSessionParams {
    cwd: PathBuf,
    /// Required by the protocol (may be empty): demanding it catches clients that omit it.
    mcp_servers: Vec<Value>,
}

/// Params of `session/prompt`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PromptParams {
    session_id: String,
    prompt: Vec<ContentBlock>,
}

/// Params of `session/cancel`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CancelParams {
    session_id: String,
}

/// A prompt content block; only the text matters to the scenarios.
#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ContentBlock {
    Text {
        text: String,
    },
    #[serde(other)]
    Other,
}

/// A session created by `session/new`.
struct Session {
    cwd: PathBuf,
    /// Set while a turn runs; sending `true` asks the turn to stop.
    cancel: Option<watch::Sender<bool>>,
}

/// State shared by the stdin reader and the running turns.
struct Agent {
    options: Options,
    /// Queue to the stdout writer.
    outbox: mpsc::Sender<Out>,
    /// Ids of the agent's own requests; the first is 0 on purpose, clients must accept it.
    next_request_id: AtomicU64,
    /// Numbers the `demo-<n>` session ids, from 1.
    next_session: AtomicU64,
    /// Numbers the `call_<n>` tool call ids, from 1, across all sessions.
    next_tool_call: AtomicU64,
    /// Requests the agent sent and awaits answers for. `None` once stdin has closed, since no
    /// answer can come any more: dropping the senders wakes every waiter.
    pending: Mutex<Option<HashMap<u64, oneshot::Sender<Reply>>>>,
    sessions: Mutex<HashMap<String, Session>>,
    /// Becomes `true` when stdin closes, releasing turns that wait for the client.
    stdin_closed: watch::Sender<bool>,
}

impl Agent {
    fn new(options: Options, outbox: mpsc::Sender<Out>) -> Self {
        Self {
            options,
            outbox,
            next_request_id: AtomicU64::new(0),
            next_session: AtomicU64::new(1),
            next_tool_call: AtomicU64::new(1),
            pending: Mutex::new(Some(HashMap::new())),
            sessions: Mutex::new(HashMap::new()),
            stdin_closed: watch::Sender::new(false),
        }
    }

    /// Reads stdin until it closes, dispatching each line, then lets running turns finish.
    async fn serve(self: &Arc<Self>) {
        let mut stdin = BufReader::new(tokio::io::stdin());
        let mut turns = JoinSet::new();
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match stdin.read_until(b'\n', &mut buf).await {
                Ok(0) => break,
                // Lossy so that a line of invalid UTF-8 is skipped like any other non-JSON line.
                Ok(_) => {
                    self.handle_line(&String::from_utf8_lossy(&buf), &mut turns)
                        .await
                }
                Err(err) => {
                    log!("cannot read stdin ({err}), stopping");
                    break;
                }
            }
            // Reap finished turns so the set does not grow in a long-lived process.
            while turns.try_join_next().is_some() {}
        }
        self.pending.lock().unwrap().take();
        self.stdin_closed.send_replace(true);
        while turns.join_next().await.is_some() {}
    }

    /// Dispatches one line of stdin by the shape of the message in it.
    async fn handle_line(self: &Arc<Self>, line: &str, turns: &mut JoinSet<()>) {
        let line = line.trim();
        if line.is_empty() {
            return;
        }
        // Via `Value` because serde would also accept a JSON array as the struct's fields.
        let message = match serde_json::from_str::<Value>(line) {
            Ok(value) if value.is_object() => Incoming::deserialize(value),
            Ok(_) => {
                log!("skipping a line that is not a JSON object: {line}");
                return;
            }
            Err(err) => Err(err),
        };
        let message = match message {
            Ok(message) => message,
            Err(err) => {
                log!("skipping a line that is not a JSON-RPC message ({err}): {line}");
                return;
            }
        };
        match (message.id, message.method) {
            (Some(id), Some(method)) => {
                self.handle_request(id, method, message.params, turns).await
            }
            (None, Some(method)) => self.handle_notification(&method, message.params).await,
            (Some(id), None) => {
                let reply = match message.error {
                    Some(error) => Err(error),
                    None => Ok(message.result.unwrap_or(Value::Null)),
                };
                self.route_reply(&id, reply);
            }
            (None, None) => log!("skipping a message with neither id nor method: {line}"),
        }
    }

    /// Answers a request from the client, after applying the command-line overrides. A
    /// prompt is answered later by its turn task.
    async fn handle_request(
        self: &Arc<Self>,
        id: Value,
        method: String,
        params: Value,
        turns: &mut JoinSet<()>,
    ) {
        if self.options.exit_on.contains(&method) {
            log!("exiting on {method}");
            match self.exit(2).await {}
        }
        if self.options.hang_on.contains(&method) {
            log!("never answering {method} (request {id}), as asked by --hang-on");
            return;
        }
        let reply = if self.options.fail_on.contains(&method) {
            Err(RpcError::new(
                INTERNAL_ERROR,
                format!("demo agent refuses {method}"),
            ))
        } else {
            match method.as_str() {
                "initialize" => Ok(initialize_result()),
                "session/new" => self.new_session(params),
                "session/prompt" => match self.start_turn(params) {
                    Ok((turn, scenario, text)) => {
                        turns.spawn(turn.run(id, scenario, text));
                        return;
                    }
                    Err(err) => Err(err),
                },
                _ => Err(RpcError::new(
                    METHOD_NOT_FOUND,
                    format!("Method not found: {method}"),
                )),
            }
        };
        self.send(response(id, reply)).await;
    }

    /// Acts on a notification from the client; unknown ones are ignored, as ACP requires.
    async fn handle_notification(&self, method: &str, params: Value) {
        if self.options.exit_on.contains(method) {
            log!("exiting on {method}");
            match self.exit(2).await {}
        }
        if self.options.hang_on.contains(method) || self.options.fail_on.contains(method) {
            log!("ignoring {method}, as asked on the command line");
            return;
        }
        match method {
            "session/cancel" => match serde_json::from_value::<CancelParams>(params) {
                Ok(params) => self.cancel_turn(&params.session_id),
                Err(err) => log!("ignoring session/cancel with bad params ({err})"),
            },
            _ => log!("ignoring notification {method}"),
        }
    }

    /// Hands an answer to the task waiting for it.
    fn route_reply(&self, id: &Value, reply: Reply) {
        let waiter = id.as_u64().and_then(|id| {
            self.pending
                .lock()
                .unwrap()
                .as_mut()
                .and_then(|pending| pending.remove(&id))
        });
        match waiter {
            // The waiter may have given up in the meantime; the answer is then moot.
            Some(waiter) => drop(waiter.send(reply)),
            None => log!("ignoring an answer to unknown or abandoned request {id}"),
        }
    }

    /// Handles `session/new`.
    fn new_session(&self, params: Value) -> Result<Value, RpcError> {
        let params: NewSessionParams = serde_json::from_value(params)
            .map_err(|err| RpcError::new(INVALID_PARAMS, format!("session/new: {err}")))?;
        let session_id = format!("demo-{}", self.next_session.fetch_add(1, Ordering::Relaxed));
        log!(
            "new session {session_id} in {} with {} MCP server(s)",
            params.cwd.display(),
            params.mcp_servers.len()
        );
        self.sessions.lock().unwrap().insert(
            session_id.clone(),
            Session {
                cwd: params.cwd,
                cancel: None,
            },
        );
        Ok(json!({ "sessionId": session_id }))
    }

    /// Validates a prompt and marks its session busy; the caller runs the returned turn.
    fn start_turn(self: &Arc<Self>, params: Value) -> Result<(Turn, Scenario, String), RpcError> {
        let params: PromptParams = serde_json::from_value(params)
            .map_err(|err| RpcError::new(INVALID_PARAMS, format!("session/prompt: {err}")))?;
        let text = params
            .prompt
            .into_iter()
            .filter_map(|block| match block {
                ContentBlock::Text { text } => Some(text),
                ContentBlock::Other => None,
            })
            .collect::<Vec<_>>()
            .join("\n");

        let mut sessions = self.sessions.lock().unwrap();
        let session = sessions.get_mut(&params.session_id).ok_or_else(|| {
            RpcError::new(
                INVALID_PARAMS,
                format!("unknown session {}", params.session_id),
            )
        })?;
        if session.cancel.is_some() {
            return Err(RpcError::new(
                INVALID_PARAMS,
                format!("session {} is already running a prompt", params.session_id),
            ));
        }
        // A fresh signal per turn, so a cancel that arrives between turns affects none.
        let (cancel, cancelled) = watch::channel(false);
        session.cancel = Some(cancel);

        let (scenario, args) = Scenario::choose(self.options.scenario, &text);
        log!(
            "session {}: playing {scenario:?} for prompt {text:?}",
            params.session_id
        );
        let turn = Turn {
            agent: Arc::clone(self),
            session_id: params.session_id,
            cwd: session.cwd.clone(),
            text: text.clone(),
            cancelled,
            stdin_closed: self.stdin_closed.subscribe(),
            streamed: AtomicBool::new(false),
        };
        Ok((turn, scenario, args.to_owned()))
    }

    /// Handles `session/cancel`: signals the session's running turn, if any.
    fn cancel_turn(&self, session_id: &str) {
        match self.sessions.lock().unwrap().get(session_id) {
            Some(Session {
                cancel: Some(cancel),
                ..
            }) => {
                log!("session {session_id}: cancelling the running turn");
                cancel.send_replace(true);
            }
            Some(_) => log!("session {session_id}: nothing to cancel"),
            None => log!("session/cancel for unknown session {session_id}"),
        }
    }

    /// Marks the session idle again; done before answering the prompt so the client may send
    /// the next one as soon as it sees the answer.
    fn finish_turn(&self, session_id: &str) {
        if let Some(session) = self.sessions.lock().unwrap().get_mut(session_id) {
            session.cancel = None;
        }
    }

    /// Sends a request to the client; the receiver yields its answer.
    async fn request(&self, method: &str, params: Value) -> (u64, oneshot::Receiver<Reply>) {
        let id = self.next_request_id.fetch_add(1, Ordering::Relaxed);
        let (waiter, answer) = oneshot::channel();
        // Registered before sending, so even an instant answer finds its waiter. Once stdin is
        // closed the sender is dropped here and the receiver reports that at once.
        if let Some(pending) = self.pending.lock().unwrap().as_mut() {
            pending.insert(id, waiter);
        }
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        (id, answer)
    }

    /// Stops waiting for the answer to a request.
    fn forget(&self, id: u64) {
        if let Some(pending) = self.pending.lock().unwrap().as_mut() {
            pending.remove(&id);
        }
    }

    /// Queues a protocol message for stdout.
    async fn send(&self, message: Value) {
        self.send_raw(message.to_string()).await;
    }

    /// Queues a line for stdout as is; also used to emit deliberate garbage.
    async fn send_raw(&self, line: String) {
        // Fails only if the writer is gone, i.e. the process is exiting anyway.
        let _ = self.outbox.send(Out::Line(line)).await;
    }

    /// Exits with `code` once everything queued for stdout is written.
    async fn exit(&self, code: i32) -> Infallible {
        let _ = self.outbox.send(Out::Exit(code)).await;
        std::future::pending().await
    }
}

/// The result of `initialize`.
fn initialize_result() -> Value {
    json!({
        "protocolVersion": PROTOCOL_VERSION,
        "agentCapabilities": {
            "loadSession": false,
            "promptCapabilities": {"image": false, "audio": false, "embeddedContext": false},
        },
        "authMethods": [],
        "agentInfo": {"name": "acp-demo-agent", "version": "0.1.0"},
    })
}

/// A JSON-RPC response to request `id`.
fn response(id: Value, reply: Result<Value, RpcError>) -> Value {
    match reply {
        Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
        Err(err) => json!({
            "jsonrpc": "2.0",
            "id": id,
            "error": {"code": err.code, "message": err.message},
        }),
    }
}

/// A JSON-RPC notification.
fn notification(method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "method": method, "params": params})
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
struct Cancelled;

/// How a turn ends.
enum TurnEnd {
    /// Answer the prompt with this stop reason.
    Stop(&'static str),
    /// Answer the prompt with a JSON-RPC error.
    Fail(RpcError),
}

/// What the client answered to a permission request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    Allowed,
    Rejected,
    Cancelled,
}

/// A tool call a scenario pretends to make.
struct ToolCall {
    id: String,
    title: String,
    kind: &'static str,
    locations: Option<Value>,
    /// `Value::Null`: the tool call has no raw input at all.
    raw_input: Value,
    /// Announced with a `tool_call` update before the permission request.
    announced: bool,
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
struct Turn {
    agent: Arc<Agent>,
    session_id: String,
    cwd: PathBuf,
    /// The prompt's text blocks, joined by newlines.
    text: String,
    /// Becomes `true` on `session/cancel`.
    cancelled: watch::Receiver<bool>,
    stdin_closed: watch::Receiver<bool>,
    /// Whether an update was streamed yet: the chunk delay goes between updates only.
    streamed: AtomicBool,
}

impl Turn {
    /// Plays the scenario and answers the prompt request `id`.
    async fn run(self, id: Value, scenario: Scenario, args: String) {
        let end = match self.play(scenario, &args).await {
            // A cancel that raced with the end of the scenario still wins, as ACP asks.
            Ok(TurnEnd::Stop(_)) | Err(Cancelled) if self.is_cancelled() => {
                TurnEnd::Stop(CANCELLED)
            }
            Ok(end) => end,
            Err(Cancelled) => TurnEnd::Stop(CANCELLED),
        };
        self.agent.finish_turn(&self.session_id);
        let reply = match end {
            TurnEnd::Stop(reason) => {
                log!("session {}: turn over: {reason}", self.session_id);
                Ok(json!({ "stopReason": reason }))
            }
            TurnEnd::Fail(err) => {
                log!("session {}: turn failed: {}", self.session_id, err.message);
                Err(err)
            }
        };
        self.agent.send(response(id, reply)).await;
    }

    /// Plays `scenario`; `Err(Cancelled)` when the turn was cancelled midway.
    async fn play(&self, scenario: Scenario, args: &str) -> Result<TurnEnd, Cancelled> {
        match scenario {
            Scenario::Echo => self.echo().await,
            Scenario::Tool => self.write_file().await,
            Scenario::Execute => self.execute(args, false).await,
            Scenario::Codex => self.execute(args, true).await,
            Scenario::Gemini => self.gemini(args).await,
            Scenario::Read => self.path_tool("read", "Read", args).await,
            Scenario::Edit => self.path_tool("edit", "Edit", args).await,
            Scenario::Parallel => self.parallel(count_arg(args, 2)).await,
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
            Scenario::Stderr => self.stderr().await,
        }
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
        let command = if command.is_empty() {
            "echo hello"
        } else {
            command
        };
        let raw_command = if codex_argv {
            json!(["/bin/sh", "-lc", command])
        } else {
            json!(command)
        };
        let call = ToolCall {
            id: self.next_tool_call_id(),
            title: format!("Run {command}"),
            kind: "execute",
            locations: None,
            raw_input: json!({ "command": raw_command }),
            done_text: format!("ran {command}"),
            announced: true,
        };
        self.single_tool_call(call, false).await
    }

    /// Scenario `gemini`: a permission request for a command that appears
    /// only in the title: no `tool_call` before it and no raw input, as
    /// Gemini CLI asks.
    async fn gemini(&self, command: &str) -> Result<TurnEnd, Cancelled> {
        let command = if command.is_empty() {
            "echo hello"
        } else {
            command
        };
        let call = ToolCall {
            id: self.next_tool_call_id(),
            title: command.to_owned(),
            kind: "execute",
            locations: None,
            raw_input: Value::Null,
            done_text: format!("ran {command}"),
            announced: false,
        };
        self.single_tool_call(call, false).await
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

    /// Scenario `parallel`: `n` tool calls whose permission requests are all pending at once.
    async fn parallel(&self, n: u64) -> Result<TurnEnd, Cancelled> {
        let calls: Vec<ToolCall> = (0..n)
            .map(|i| {
                let path = self
                    .cwd
                    .join(format!("hello-{i}.txt"))
                    .display()
                    .to_string();
                ToolCall {
                    id: self.next_tool_call_id(),
                    title: format!("Write hello-{i}.txt"),
                    kind: "edit",
                    locations: Some(json!([{ "path": path }])),
                    raw_input: json!({"path": path, "content": format!("hello {i}")}),
                    done_text: format!("wrote hello-{i}.txt"),
                    announced: true,
                }
            })
            .collect();
        let answers = self.run_tool_calls(&calls, false).await?;
        if answers.contains(&Answer::Cancelled) {
            return Ok(TurnEnd::Stop(CANCELLED));
        }
        let ran = answers.iter().filter(|a| **a == Answer::Allowed).count();
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

    /// Scenario `long`: `n` chunks as fast as the client reads them.
    async fn long(&self, n: u64) -> Result<TurnEnd, Cancelled> {
        for i in 0..n {
            self.say(&format!("w{i} ")).await?;
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
                let delay = self.agent.options.chunk_delay;
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
        match self.agent.exit(3).await {}
    }

    /// Scenario `garbage`: non-JSON lines on stdout between chunks.
    async fn garbage(&self) -> Result<TurnEnd, Cancelled> {
        self.say("Here comes some garbage. ").await?;
        self.agent.send_raw("this is not json".to_owned()).await;
        self.say("More garbage. ").await?;
        self.agent.send_raw("{\"broken\": ".to_owned()).await;
        self.say("And a bare word. ").await?;
        self.agent.send_raw("garbage".to_owned()).await;
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
    async fn hang(&self) -> Result<TurnEnd, Cancelled> {
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
    async fn run_tool_calls(
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
            let params = json!({
                "sessionId": self.session_id,
                "toolCall": call.pending(),
                "options": PERMISSION_OPTIONS
                    .iter()
                    .map(|(id, name, kind)| json!({"optionId": id, "name": name, "kind": kind}))
                    .collect::<Vec<_>>(),
            });
            let (id, answer) = self
                .agent
                .request("session/request_permission", params)
                .await;
            if withdraw {
                self.agent
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
                    self.agent.forget(id);
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
        let n = self.agent.next_tool_call.fetch_add(1, Ordering::Relaxed);
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
            self.pause(self.agent.options.chunk_delay).await
        } else {
            self.pause(Duration::ZERO).await
        }
    }

    /// Streams an update, paced and interruptible by cancellation.
    async fn stream(&self, update: Value) -> Result<(), Cancelled> {
        self.pace().await?;
        self.notify(update).await;
        Ok(())
    }

    /// Streams a piece of the agent's reply.
    async fn say(&self, text: &str) -> Result<(), Cancelled> {
        self.stream(text_chunk("agent_message_chunk", text)).await
    }

    /// Sends an update at once, cancelled or not.
    async fn notify(&self, update: Value) {
        self.agent
            .send(notification(
                "session/update",
                json!({"sessionId": self.session_id, "update": update}),
            ))
            .await;
    }
}
