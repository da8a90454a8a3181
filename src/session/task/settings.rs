//! Session settings a user changes (the agent's mode, its configuration
//! options): checked against what the agent offers, sent to it, and once it
//! accepted, recorded in the conversation's state and an event.
//!
//! Its part of the task is [`Settings`](super::parts::Settings).

use futures::stream::StreamExt;
use serde_json::Value;

use super::parts::Change;
use super::Task;
use crate::acp::client::EXIT_AFTER_EOF;
use crate::acp::rpc::RpcError;
use crate::error::{Error, Result};
use crate::model::{ConfigOptionChanged, ModeChanged};
use crate::session::command::Setting;

impl Task {
    /// Sends a user's change of a setting to the agent, once checked
    /// against what it offers (else refused at once); answered in
    /// [`Task::changed`].
    pub(super) fn change(&mut self, change: Change) {
        let request = match &change.setting {
            Setting::Mode(mode_id) => self
                .settings
                .state
                .check_mode(mode_id)
                .map(|()| ("session/set_mode", self.agent.set_mode(mode_id))),
            Setting::ConfigOption { config_id, value } => self
                .settings
                .state
                .config_request(config_id, value)
                .map(|params| {
                    (
                        "session/set_config_option",
                        self.agent.set_config_option(params),
                    )
                }),
        };
        let (method, answer) = match request {
            Ok(request) => request,
            Err(why) => {
                change.reply.send(Err(Error::conflict("not_offered", why)));
                return;
            }
        };
        tracing::info!(setting = ?change.setting, changed_by = %change.changed_by, "changing a session setting");
        let timeout = self.settings.call_timeout;
        self.settings.changes.push(Box::pin(async move {
            let answer = match tokio::time::timeout(timeout, answer).await {
                Ok(Ok(answer)) => Ok(answer),
                Ok(Err(RpcError::Remote { code, message, .. })) => Err(Error::AgentFailed(
                    format!("the agent refused {method} (error {code}): {message}"),
                )),
                Ok(Err(RpcError::Closed(reason))) => Err(Error::AgentFailed(format!(
                    "the agent went away before it answered {method}: {reason}"
                ))),
                Err(_) => Err(Error::AgentTimeout(format!(
                    "the agent did not answer {method} within {}",
                    humantime_serde::re::humantime::format_duration(timeout)
                ))),
            };
            (change, answer)
        }));
    }

    /// The agent answered a change: once accepted, it is recorded (the
    /// conversation's state and an event every client sees), then the user
    /// is told.
    pub(super) async fn changed(&mut self, change: Change, answer: Result<Value>) -> Result<()> {
        let Change {
            setting,
            changed_by,
            reply,
        } = change;
        let answer = match answer {
            Ok(answer) => answer,
            Err(e) => {
                tracing::warn!(error = %e, "a session setting was not changed");
                reply.send(Err(e));
                return Ok(());
            }
        };
        match &setting {
            Setting::Mode(mode_id) => {
                self.settings.state.set_current_mode(mode_id);
                self.journal.append(ModeChanged {
                    mode_id: mode_id.clone(),
                    changed_by: changed_by.clone(),
                    modes: self.settings.state.modes.clone(),
                });
            }
            Setting::ConfigOption { config_id, value } => {
                match answer.get("configOptions").filter(|o| o.is_array()) {
                    Some(options) => {
                        self.settings.state.set_config_options(options.clone());
                    }
                    None => tracing::warn!(
                        "the agent answered session/set_config_option without configOptions"
                    ),
                }
                self.journal.append(ConfigOptionChanged {
                    config_id: config_id.clone(),
                    value: value.clone(),
                    changed_by: changed_by.clone(),
                    config_options: self.settings.state.config_options.clone(),
                });
            }
        }
        self.journal.set_state(&self.settings.state);
        let flushed = self.flush().await;
        reply.send(match &flushed {
            Ok(()) => Ok(()),
            Err(e) => Err(Error::Unavailable(format!(
                "the agent changed the setting but it could not be recorded: {e}"
            ))),
        });
        flushed
    }

    /// A `session/update` that reports the agent's modes, options or
    /// commands changes the conversation's state.
    pub(super) fn report_changed(&mut self, update: &Value) {
        if self.settings.state.apply_update(update) {
            self.journal.set_state(&self.settings.state);
        }
    }

    /// The agent is gone: the setting changes it was asked for are
    /// answered now, with its answer if it gave one, else the end of its
    /// connection.
    pub(super) async fn answer_changes_left(&mut self) -> Result<()> {
        while let Ok(Some((change, answer))) =
            tokio::time::timeout(EXIT_AFTER_EOF, self.settings.changes.next()).await
        {
            self.changed(change, answer).await?;
        }
        Ok(())
    }
}
