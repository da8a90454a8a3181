//! The demo agent's ACP side: reads stdin, answers `initialize`,
//! `session/new`, `session/set_mode`, `session/set_config_option` and
//! `session/prompt` (by starting a scenario's turn), and passes
//! `session/cancel` and the client's answers on.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::Deserialize;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::options::Options;
use super::scenarios::{Scenario, Turn};
use super::wire::{
    notification, response, RpcError, Wire, INTERNAL_ERROR, INVALID_PARAMS, METHOD_NOT_FOUND,
};

/// The ACP protocol version this agent speaks.
const PROTOCOL_VERSION: u64 = 1;

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

/// Params of `session/set_mode`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SetModeParams {
    session_id: String,
    mode_id: String,
}

/// Params of `session/set_config_option` (a select's value: a string).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SetConfigOptionParams {
    session_id: String,
    config_id: String,
    value: Value,
}

/// The session modes every session offers; the first is current at first.
const MODES: [(&str, &str, &str); 2] = [
    ("default", "Default", "Asks before it edits"),
    ("plan", "Plan", "Plans without editing"),
];

/// The values of the `model` option; the first is current at first.
const MODELS: [(&str, &str); 2] = [("small", "Small"), ("large", "Large")];

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
    /// The names of the MCP servers it was given.
    mcp_servers: Vec<String>,
    /// Set while a turn runs; sending `true` asks the turn to stop.
    cancel: Option<watch::Sender<bool>>,
    mode: &'static str,
    model: &'static str,
}

impl Session {
    fn modes(&self) -> Value {
        let available: Vec<Value> = MODES
            .iter()
            .map(|(id, name, description)| json!({"id": id, "name": name, "description": description}))
            .collect();
        json!({"currentModeId": self.mode, "availableModes": available})
    }

    fn config_options(&self) -> Value {
        let values: Vec<Value> = MODELS
            .iter()
            .map(|(value, name)| json!({"value": value, "name": name}))
            .collect();
        json!([{
            "id": "model", "name": "Model", "category": "model", "type": "select",
            "currentValue": self.model, "options": values,
        }])
    }
}

/// State shared by the stdin reader and the running turns.
pub(super) struct Agent {
    options: Options,
    wire: Arc<Wire>,
    /// Numbers the `demo-<n>` session ids, from 1.
    next_session: AtomicU64,
    sessions: Mutex<HashMap<String, Session>>,
    /// Becomes `true` when stdin closes, releasing turns that wait for the client.
    stdin_closed: watch::Sender<bool>,
}

impl Agent {
    pub(super) fn new(options: Options, wire: Arc<Wire>) -> Self {
        Self {
            options,
            wire,
            next_session: AtomicU64::new(1),
            sessions: Mutex::new(HashMap::new()),
            stdin_closed: watch::Sender::new(false),
        }
    }

    /// Reads stdin until it closes, dispatching each line, then lets running turns finish.
    pub(super) async fn serve(self: &Arc<Self>) {
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
        self.wire.close();
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
                self.wire.route_reply(&id, reply);
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
            match self.wire.exit(2).await {}
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
                "initialize" => Ok(initialize_result(self.options.resumable)),
                "session/new" => self.new_session(params),
                "session/set_mode" => self.set_mode(params).await,
                "session/set_config_option" => self.set_config_option(params),
                "session/prompt" => match self.start_turn(params) {
                    Ok((turn, scenario, text)) => {
                        let agent = Arc::clone(self);
                        let session_id = turn.session_id.clone();
                        turns.spawn(async move {
                            let (reply, then_ask) = turn.run(scenario, text).await;
                            agent.finish_turn(&session_id);
                            let answer = response(id, reply);
                            match then_ask {
                                // In one write with the answer: the client
                                // reads both at once. Nobody waits for its
                                // answer.
                                Some(params) => {
                                    let request = json!({
                                        "jsonrpc": "2.0",
                                        "id": agent.wire.next_id(),
                                        "method": "session/request_permission",
                                        "params": params,
                                    });
                                    agent.wire.send_raw(format!("{answer}\n{request}")).await;
                                }
                                None => agent.wire.send(answer).await,
                            }
                        });
                        return;
                    }
                    Err(err) => Err(err),
                },
                "session/resume" if self.options.resumable => {
                    let reply = self.resume_session(params);
                    let session_id = reply.as_ref().ok().map(|(id, _)| id.clone());
                    self.wire
                        .send(response(id, reply.map(|(_, result)| result)))
                        .await;
                    // What still waits for the client's answer is asked
                    // again on this connection (the last one went).
                    if let Some(session_id) = session_id {
                        self.wire.ask_again(&session_id).await;
                    }
                    return;
                }
                _ => Err(RpcError::new(
                    METHOD_NOT_FOUND,
                    format!("Method not found: {method}"),
                )),
            }
        };
        self.wire.send(response(id, reply)).await;
    }

    /// Handles `session/resume` (with `--resumable`): a session this
    /// process knows answers its modes and options; an unknown one,
    /// -32602.
    fn resume_session(&self, params: Value) -> Result<(String, Value), RpcError> {
        let session_id = params
            .get("sessionId")
            .and_then(Value::as_str)
            .ok_or_else(|| RpcError::new(INVALID_PARAMS, "session/resume: sessionId is missing"))?
            .to_owned();
        let sessions = self.sessions.lock().unwrap();
        let session = sessions.get(&session_id).ok_or_else(|| {
            RpcError::new(
                INVALID_PARAMS,
                format!("session/resume: unknown session {session_id}"),
            )
        })?;
        log!("resuming session {session_id}");
        let result = json!({
            "modes": session.modes(),
            "configOptions": session.config_options(),
        });
        Ok((session_id, result))
    }

    /// Acts on a notification from the client; unknown ones are ignored, as ACP requires.
    async fn handle_notification(&self, method: &str, params: Value) {
        if self.options.exit_on.contains(method) {
            log!("exiting on {method}");
            match self.wire.exit(2).await {}
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
        let names = params.mcp_servers.iter();
        let names = names.filter_map(|s| Some(s.get("name")?.as_str()?.to_owned()));
        let session = Session {
            mcp_servers: names.collect(),
            cwd: params.cwd,
            cancel: None,
            mode: MODES[0].0,
            model: MODELS[0].0,
        };
        let result = json!({
            "sessionId": session_id,
            "modes": session.modes(),
            "configOptions": session.config_options(),
        });
        self.sessions
            .lock()
            .unwrap()
            .insert(session_id.clone(), session);
        Ok(result)
    }

    /// Handles `session/set_mode`: reports the new mode with a
    /// `current_mode_update`, then answers.
    async fn set_mode(&self, params: Value) -> Result<Value, RpcError> {
        let params: SetModeParams = serde_json::from_value(params)
            .map_err(|err| RpcError::new(INVALID_PARAMS, format!("session/set_mode: {err}")))?;
        let mode = MODES
            .iter()
            .map(|(id, _, _)| *id)
            .find(|id| *id == params.mode_id)
            .ok_or_else(|| {
                RpcError::new(INVALID_PARAMS, format!("no mode {:?}", params.mode_id))
            })?;
        self.with_session(&params.session_id, |session| session.mode = mode)?;
        log!("session {}: mode {mode}", params.session_id);
        let update = json!({"sessionUpdate": "current_mode_update", "currentModeId": mode});
        let params = json!({"sessionId": params.session_id, "update": update});
        self.wire.send(notification("session/update", params)).await;
        Ok(json!({}))
    }

    /// Handles `session/set_config_option`: answers the full set of options.
    fn set_config_option(&self, params: Value) -> Result<Value, RpcError> {
        let params: SetConfigOptionParams = serde_json::from_value(params).map_err(|err| {
            RpcError::new(INVALID_PARAMS, format!("session/set_config_option: {err}"))
        })?;
        let model = MODELS
            .iter()
            .map(|(value, _)| *value)
            .find(|value| params.config_id == "model" && params.value == *value)
            .ok_or_else(|| {
                RpcError::new(
                    INVALID_PARAMS,
                    format!(
                        "no value {} for option {:?}",
                        params.value, params.config_id
                    ),
                )
            })?;
        let options = self.with_session(&params.session_id, |session| {
            session.model = model;
            session.config_options()
        })?;
        log!("session {}: model {model}", params.session_id);
        Ok(json!({ "configOptions": options }))
    }

    /// Runs `f` on a session, or fails for an unknown one.
    fn with_session<T>(
        &self,
        session_id: &str,
        f: impl FnOnce(&mut Session) -> T,
    ) -> Result<T, RpcError> {
        let mut sessions = self.sessions.lock().unwrap();
        let session = sessions.get_mut(session_id).ok_or_else(|| {
            RpcError::new(INVALID_PARAMS, format!("unknown session {session_id}"))
        })?;
        Ok(f(session))
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
            wire: Arc::clone(&self.wire),
            chunk_delay: self.options.chunk_delay,
            session_id: params.session_id,
            cwd: session.cwd.clone(),
            mcp_servers: session.mcp_servers.clone(),
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
}

/// The result of `initialize`.
fn initialize_result(resumable: bool) -> Value {
    let mut capabilities = json!({
        "loadSession": false,
        "promptCapabilities": {"image": false, "audio": false, "embeddedContext": false},
    });
    if resumable {
        capabilities["sessionCapabilities"] = json!({"resume": {}});
    }
    json!({
        "protocolVersion": PROTOCOL_VERSION,
        "agentCapabilities": capabilities,
        "authMethods": [],
        "agentInfo": {"name": "acp-demo-agent", "version": "0.1.0"},
    })
}
