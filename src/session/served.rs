//! The agent's requests of files and terminals (`fs/*`, `terminal/*`),
//! served where its profile offers them (see [`crate::workspace`]).
//!
//! Every one of them is first put to the operator's policies as the tool
//! call it amounts to (a read, an edit, an execute): one a `deny` rule (or
//! the `read_only` mode) covers is refused, whether or not the agent asked
//! permission first. A file's path is judged as given and as the file
//! really is, on the very file about to be read or written (the policies
//! are asked from the file thread, between finding it and touching it).
//! Nothing else here asks a person: asking is the agent's business, through
//! `session/request_permission`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use agent_client_protocol_schema::v1 as acp;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::acp::rpc::{IncomingRequest, Responder};
use crate::error::Result;
use crate::model::{Action, FileWritten};
use crate::permissions::policy::{Facts, Mode, Policies};
use crate::permissions::PolicyHandle;
use crate::store::Store;
use crate::workspace::terminals::{self, TerminalOutput, Terminals};
use crate::workspace::{files, Refusal, Workspace, INVALID_PARAMS};

/// A file written, for the session to record before the agent hears so.
pub struct Write {
    pub written: FileWritten,
    pub responder: Responder,
}

/// The client side of ACP a conversation serves its agent (files and
/// terminals), and under which rules.
pub struct ClientServices {
    workspace: Arc<Workspace>,
    terminals: Terminals,
    session_id: String,
    agent: String,
    mode: Mode,
    policies: PolicyHandle,
}

impl ClientServices {
    /// Terminal output goes to `output`; terminal commands start with
    /// `environment` (their agent's).
    pub fn new(
        workspace: Workspace,
        session_id: String,
        agent: String,
        mode: Mode,
        policies: PolicyHandle,
        output: mpsc::Sender<TerminalOutput>,
        environment: crate::process::spawn::Environment,
    ) -> ClientServices {
        ClientServices {
            workspace: Arc::new(workspace),
            terminals: Terminals::new(output, environment),
            session_id,
            agent,
            mode,
            policies,
        }
    }

    /// Whether this conversation serves `method` (else: "method not found").
    pub fn serves(&self, method: &str) -> bool {
        match method {
            "fs/read_text_file" | "fs/write_text_file" => self.workspace.files,
            "terminal/create"
            | "terminal/output"
            | "terminal/wait_for_exit"
            | "terminal/kill"
            | "terminal/release" => self.workspace.terminals,
            _ => false,
        }
    }

    /// Kills every terminal's processes (the conversation's agent stops);
    /// what is returned ends when they have ended and all their output has
    /// been handed out.
    pub fn stop(&self) -> impl std::future::Future<Output = ()> + use<> {
        self.terminals.kill_all();
        self.terminals.ended()
    }

    /// Serves one request the session found [`ClientServices::serves`]. A write is
    /// handed back, done, for the session to record and then answer; every
    /// other request is answered here (a wait for a terminal's exit, later,
    /// from a task of its own).
    pub async fn handle(
        &self,
        request: IncomingRequest,
        store: &dyn Store,
    ) -> Result<Option<Write>> {
        let IncomingRequest {
            method,
            params,
            responder,
            ..
        } = request;
        if let Err(refusal) = self.check_session(&params) {
            answer(responder, Err(refusal));
            return Ok(None);
        }
        if let Some(refusal) = self.denied(&method, &params, store).await? {
            answer(responder, Err(refusal));
            return Ok(None);
        }
        let outcome = match method.as_str() {
            "fs/read_text_file" => {
                let workspace = self.workspace.clone();
                let gate = self.gate(&method, &params, store).await?;
                tokio::spawn(async move {
                    answer(responder, files::read(&workspace, params, gate).await);
                });
                return Ok(None);
            }
            "fs/write_text_file" => {
                let gate = self.gate(&method, &params, store).await?;
                match files::write(&self.workspace, params, gate).await {
                    Ok(written) => return Ok(Some(Write { written, responder })),
                    Err(refusal) => Err(refusal),
                }
            }
            "terminal/create" => parse::<acp::CreateTerminalRequest>(params)
                .and_then(|request| self.terminals.create(&self.workspace, &request)),
            "terminal/output" => self.terminals.output(&params),
            "terminal/wait_for_exit" => match self.terminals.waiter(&params) {
                Ok(exit) => {
                    tokio::spawn(async move { answer(responder, exit.await) });
                    return Ok(None);
                }
                Err(refusal) => Err(refusal),
            },
            "terminal/kill" => self.terminals.kill(&params),
            "terminal/release" => self.terminals.release(&params),
            other => Err(Refusal::invalid(format!("{other} is not served here"))),
        };
        answer(responder, outcome);
        Ok(None)
    }

    fn check_session(&self, params: &Value) -> std::result::Result<(), Refusal> {
        match params.get("sessionId").and_then(Value::as_str) {
            Some(id) if id == self.session_id => Ok(()),
            Some(id) => Err(Refusal::invalid(format!(
                "invalid params: session {id:?} is not this connection's session"
            ))),
            None => Err(Refusal::invalid(
                "invalid params: sessionId (string) is required",
            )),
        }
    }

    /// The real places of a tool call's paths, looked up with the agent's
    /// user's rights (for the policies, which judge both forms).
    pub async fn real_paths(&self, given: Vec<PathBuf>) -> Vec<PathBuf> {
        crate::workspace::real_paths(self.workspace.user.clone(), given).await
    }

    /// The policies in force (with the database away: as last seen).
    async fn policies(&self, store: &dyn Store) -> Result<Arc<Policies>> {
        match self.policies.refresh(store).await {
            Err(e) if e.is_outage() => Ok(self.policies.current()),
            other => other,
        }
    }

    /// The refusal of a terminal the operator's policies deny (files are
    /// judged by their [`ClientServices::gate`]).
    async fn denied(
        &self,
        method: &str,
        params: &Value,
        store: &dyn Store,
    ) -> Result<Option<Refusal>> {
        let tool_call = match method {
            "terminal/create" => match parse::<acp::CreateTerminalRequest>(params.clone()) {
                Ok(request) => terminals::as_tool_call(&request, &self.workspace.cwd),
                Err(refusal) => return Ok(Some(refusal)),
            },
            _ => return Ok(None),
        };
        let policies = self.policies(store).await?;
        Ok(judge(
            &policies,
            &Judged {
                agent: self.agent.clone(),
                cwd: self.workspace.cwd.clone(),
                mode: self.mode,
                method: method.to_owned(),
                tool_call,
            },
            &[],
        ))
    }

    /// What a file request is judged by, on its file thread: the request
    /// as the tool call it amounts to, its path as given and as the file it
    /// reaches really is.
    async fn gate(&self, method: &str, params: &Value, store: &dyn Store) -> Result<files::Gate> {
        let path = params.get("path").cloned().unwrap_or(Value::Null);
        let (kind, verb) = match method {
            "fs/write_text_file" => ("edit", "Write"),
            _ => ("read", "Read"),
        };
        let judged = Judged {
            agent: self.agent.clone(),
            cwd: self.workspace.cwd.clone(),
            mode: self.mode,
            method: method.to_owned(),
            tool_call: json!({
                "toolCallId": "fs", "kind": kind, "title": format!("{verb} {path}"),
                "locations": [{"path": path}], "rawInput": {"path": path},
            }),
        };
        let policies = self.policies(store).await?;
        // Its log lines belong to the conversation, on whichever thread.
        let span = tracing::Span::current();
        Ok(Box::new(move |real: &Path| {
            let _entered = span.enter();
            match judge(&policies, &judged, &[real.to_path_buf()]) {
                Some(refusal) => Err(refusal),
                None => Ok(()),
            }
        }))
    }
}

/// A request of the agent's as the policies see it.
struct Judged {
    agent: String,
    cwd: PathBuf,
    mode: Mode,
    method: String,
    tool_call: Value,
}

/// The refusal of a request the operator's policies deny.
fn judge(policies: &Policies, judged: &Judged, real_paths: &[PathBuf]) -> Option<Refusal> {
    let facts = Facts {
        agent: &judged.agent,
        tool_call: &judged.tool_call,
        cwd: &judged.cwd,
        mode: judged.mode,
        real_paths,
    };
    let verdict = policies.evaluate(&facts, &[], None, tokio::time::Instant::now());
    if verdict.decision != Action::Deny {
        return None;
    }
    tracing::info!(method = judged.method, rule = ?verdict.rule, "operator policy refuses the agent's request");
    Some(Refusal {
        code: INVALID_PARAMS,
        message: format!("refused by the operator's policy: {}", verdict.reason),
        data: Some(json!({ "rule": verdict.rule })),
    })
}

fn parse<T: serde::de::DeserializeOwned>(params: Value) -> std::result::Result<T, Refusal> {
    serde_json::from_value(params).map_err(|e| Refusal::invalid(format!("invalid params: {e}")))
}

/// Sends the request its answer.
pub fn answer(responder: Responder, outcome: std::result::Result<Value, Refusal>) {
    match outcome {
        Ok(result) => responder.respond(result),
        Err(refusal) => responder.respond_error(refusal.code, refusal.message, refusal.data),
    }
}
