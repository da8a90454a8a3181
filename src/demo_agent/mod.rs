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
//! * `session/new` (`cwd` and `mcpServers` required): answers `{"sessionId":"demo-<n>"}` with
//!   the session modes `default` (current) and `plan`, and one configuration option, `model`
//!   (category `model`, a select of `small` (current) and `large`).
//! * `session/set_mode`: sends `current_mode_update`, then answers `{}`; an unknown mode or
//!   session gets error -32602.
//! * `session/set_config_option`: `model` to `small` or `large`; answers the full
//!   `configOptions`; anything else gets error -32602.
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
//! | `vibe <command…>` | like `execute` as Mistral Vibe asks: the command in the `tool_call`, the request carrying only `{toolCallId}` | as `tool` |
//! | `qwen <command…>` | like `execute` as Qwen Code asks: announced as a bare `Shell` with empty raw input, the request carrying the title and command | as `tool` |
//! | `parallel [N]` | N tool calls (default 2), then N permission requests all outstanding at once; each tool call completes or fails as its own answer arrives, in any order; then a summary chunk | `end_turn`, or `cancelled` if any answer was cancelled |
//! | `ask [N]` | N tool calls (default 3) one after the other, each like `tool` (title `Write ask-<i>.txt`): the next is announced only once the previous request is answered; then a summary chunk `<allowed> of <N> tool calls ran.` | `end_turn`, or `cancelled` at the first cancelled answer |
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
//! | `late` | hangs until `session/cancel`, then asks permission to run `echo late` (a request that crossed the cancel) and says `late answer: <outcome>` (`none` without an answer within a second) | `cancelled` |
//! | `sneak` | asks permission for an `execute` call titled `Tidy up` with no command, and while it waits updates the call with `rm -rf build`; says `answer: <outcome>` | `end_turn` |
//! | `hasty` | answers the prompt and at once asks permission to read `notes.txt` (the answer to that is ignored) | `end_turn` |
//! | `stderr` | five lines on stderr, then a message chunk | `end_turn` |
//! | `question` | asks `Go on?` through `elicitation/create` (a form of one required boolean, `go`), and says `question answer: <result as JSON>` (`none` without one) | `end_turn` |
//! | `mcp` | says `mcp servers: <name>, <name>` (or `mcp servers: none`): the names of the MCP servers `session/new` gave the session | `end_turn` |
//! | `save <name> <text>` | writes `<text>` and a newline to `<cwd>/<name>` with its own IO (its folders made) and says `saved <name>` (or the error) | `end_turn` |
//! | `fs-save <name> <text>` | asks the client to write `<text>` and a newline to `<cwd>/<name>` (`fs/write_text_file`) and says `fs-saved <name>` (or the client's error) | `end_turn` |
//! | `cost <step…>` | plays the steps in order: a number sends a `usage_update` with the session's cost so far `{"amount": <figure>, "currency": "USD"}` (cumulative: a lower figure starts a new count), `used` growing by 1000 a report and `size` 200000, then a message chunk `cost <figure> `; `u<N>` one with `used` N and no cost; `ask` asks permission for a tool call (like `tool`) and waits for the answer; `wait` waits until `session/cancel` | `end_turn`, or `cancelled` |
//! | `cost-wait <step…>` | `cost <step…> wait`: a turn that goes on spending | `cancelled` |
//! | `probe <path>` | really opens `<cwd>/<path>` (default the cwd) for reading, then for appending (nothing is written), and says `read <path>: ok` (or the error) and `write <path>: ok` (or the error) in one message chunk: what its box lets it touch | `end_turn` |
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
//! * `--resumable`: offer `session/resume` (`sessionCapabilities.resume`): a session this
//!   process knows is answered with its modes and options, then every request of the
//!   session still waiting for its answer (a permission request) is sent again, on its own
//!   id, for a client that lost the connection it first went out on (an answer to either
//!   counts); an unknown session gets -32602. Without the flag, `session/resume` is -32601.
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

/// Writes a line to stderr with the agent's prefix; stdout is reserved for protocol messages.
macro_rules! log {
    ($($arg:tt)*) => {
        eprintln!("demo agent: {}", format_args!($($arg)*))
    };
}

mod protocol;
mod options;
mod files;
mod costs;
mod scenarios;
mod wire;

use std::sync::Arc;

use tokio::sync::mpsc;

use options::{ArgsError, Options, USAGE};
use protocol::Agent;
use wire::{write_stdout, Wire};

/// Lines queued for stdout. Bounded so that a client that stops reading stalls the agent, as
/// a full pipe would, instead of growing memory without limit.
const OUTBOX_CAPACITY: usize = 256;

/// Exit code for a bad command line (`EX_USAGE` from sysexits.h).
const EXIT_USAGE: i32 = 64;

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
    let wire = Arc::new(Wire::new(outbox));
    if banner {
        wire.send_raw("acp-demo-agent starting up".to_owned()).await;
    }
    let agent = Arc::new(Agent::new(options, wire));
    agent.serve().await;
    // The writer stops once every sender is gone, after writing what is queued.
    drop(agent);
    writer.await.expect("stdout writer panicked");
}
