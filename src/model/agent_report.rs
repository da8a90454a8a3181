//! What an agent reported about its session (modes, configuration options,
//! commands, usage, title), kept as ACP objects, and the ACP objects as the
//! OpenAPI document shows them.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::usage::{Spend, UsageReading};

// The ACP objects a conversation carries, as the OpenAPI document shows
// them: the members clients use, as ACP defines them (the gateway passes
// on whatever else an agent sends).

/// ACP `SessionModeState`: the modes the agent offers and the current one.
#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
pub struct SessionModeState {
    #[serde(rename = "currentModeId")]
    current_mode_id: String,
    #[serde(rename = "availableModes")]
    available_modes: Vec<SessionMode>,
}

/// ACP `SessionMode`.
#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
pub struct SessionMode {
    id: String,
    name: String,
    description: Option<String>,
}

/// ACP `SessionConfigOption`: a `select` (with `options`, flat or in
/// groups) or a `boolean`.
#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
pub struct SessionConfigOption {
    id: String,
    name: String,
    description: Option<String>,
    /// E.g. `model`, `mode`, `thought_level`.
    category: Option<String>,
    /// `select` or `boolean`.
    r#type: String,
    /// A select's value id, or a boolean.
    #[serde(rename = "currentValue")]
    current_value: Value,
    /// A select's values: `{value, name, description?}`, or groups of them
    /// `{group, name, options}`.
    #[schema(value_type = Option<Vec<Object>>)]
    options: Option<Value>,
}

/// ACP `AvailableCommand`.
#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
pub struct AvailableCommand {
    name: String,
    description: String,
    /// `{hint}` when the command takes input.
    #[schema(value_type = Option<Object>)]
    input: Option<Value>,
}

/// ACP `UsageUpdate` without its tag: tokens in context, the context
/// window, and the session's cost so far.
#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
pub struct Usage {
    used: u64,
    size: u64,
    /// `{amount, currency}`.
    #[schema(value_type = Option<Object>)]
    cost: Option<Value>,
}

/// ACP `PromptCapabilities`: what a prompt may carry beyond text and
/// resource links.
#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
pub struct PromptCapabilities {
    /// `image` content blocks.
    image: bool,
    /// `audio` content blocks.
    audio: bool,
    /// `resource` content blocks (a file's contents embedded).
    #[serde(rename = "embeddedContext")]
    embedded_context: bool,
}

/// A configuration option's value: a select's value id, or a boolean.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub enum SettingValue {
    Text(String),
    Flag(bool),
}

/// What an agent last reported about its session, as ACP objects, verbatim:
/// from the answers to `session/new`, `session/load` and `session/resume`,
/// and from its `current_mode_update`, `config_option_update`,
/// `available_commands_update`, `usage_update` and `session_info_update`.
/// `None` where it reported nothing.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AgentReport {
    /// `SessionModeState`: `currentModeId` and `availableModes`.
    pub modes: Option<Value>,
    /// `[SessionConfigOption]`.
    pub config_options: Option<Value>,
    /// `[AvailableCommand]`.
    pub available_commands: Option<Value>,
    /// The latest `usage_update`, without its `sessionUpdate` tag.
    pub usage: Option<Value>,
    /// The session's title, as the agent named it.
    pub title: Option<String>,
    /// `PromptCapabilities` from the agent's answer to `initialize`.
    pub prompt_capabilities: Option<Value>,
    /// What the agent's `initialize` offered for sessions, as
    /// [`SessionOffers`] (a JSON object of booleans).
    pub session_capabilities: Option<Value>,
    /// The last cost the agent reported (cumulative for its session), kept
    /// across usage reports without one: what the next report's cost
    /// increase is counted from (see [`UsageReading::read`]). Not part of
    /// the API object (`usage` is).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_cost: Option<Spend>,
}

/// What an agent offers for its sessions beyond prompts, as its
/// `initialize` said (`agentCapabilities.loadSession` and
/// `sessionCapabilities`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct SessionOffers {
    /// `session/load`: an earlier session is loaded with its history replayed.
    pub load: bool,
    /// `session/resume`: an earlier session goes on, without its history.
    pub resume: bool,
    /// `session/list`: the agent lists its sessions.
    pub list: bool,
    /// `session/fork`: a session is forked into a new one.
    pub fork: bool,
    /// `session/close`.
    pub close: bool,
}

impl SessionOffers {
    /// As recorded in a report (`None`: never recorded).
    pub fn of(report: &AgentReport) -> Option<SessionOffers> {
        serde_json::from_value(report.session_capabilities.clone()?).ok()
    }
}

/// Longest title kept from an agent (in characters).
const AGENT_TITLE_MAX_CHARS: usize = 500;

impl AgentReport {
    /// What `update` says if it is a `usage_update`, with the cost increase
    /// it stands for after what the agent reported before; read before the
    /// update is applied.
    pub fn usage_reading(&self, update: &Value) -> Option<UsageReading> {
        // A conversation recorded before `last_cost` was kept has its
        // latest report's.
        let reported = || self.usage.as_ref()?.get("cost").and_then(Spend::of_cost);
        let previous = self.last_cost.clone().or_else(reported);
        UsageReading::read(update, previous.as_ref())
    }

    /// Applies an update from `session/update`; whether anything changed.
    /// Other kinds of update, and malformed ones, change nothing.
    pub fn apply_update(&mut self, update: &Value) -> bool {
        let field = |key: &str| update.get(key).filter(|v| v.is_array()).cloned();
        match update.get("sessionUpdate").and_then(Value::as_str) {
            Some("current_mode_update") => match update.get("currentModeId") {
                Some(Value::String(id)) => self.set_current_mode(id),
                _ => false,
            },
            Some("config_option_update") => {
                replace(&mut self.config_options, field("configOptions"))
            }
            Some("available_commands_update") => {
                replace(&mut self.available_commands, field("availableCommands"))
            }
            Some("usage_update") => {
                let mut usage = update.clone();
                if let Some(map) = usage.as_object_mut() {
                    map.remove("sessionUpdate");
                }
                let cost = usage.get("cost").and_then(Spend::of_cost);
                let cost_changed = cost.is_some() && cost != self.last_cost;
                if cost_changed {
                    self.last_cost = cost;
                }
                replace(&mut self.usage, Some(usage)) || cost_changed
            }
            Some("session_info_update") => match update.get("title") {
                Some(Value::String(title)) => {
                    let title = title.chars().take(AGENT_TITLE_MAX_CHARS).collect();
                    let changed = self.title.as_ref() != Some(&title);
                    self.title = Some(title);
                    changed
                }
                Some(Value::Null) => self.title.take().is_some(),
                _ => false,
            },
            _ => false,
        }
    }

    /// Takes what the answer to `session/new`, `session/load` or
    /// `session/resume` reports (`modes`, `configOptions`). A `fresh`
    /// session (`session/new`) is a new one for the agent: what the answer
    /// leaves out, and the earlier session's commands and usage, are gone. A
    /// restored session keeps what the answer leaves out.
    pub fn apply_opened(&mut self, result: &Value, fresh: bool) {
        let modes = result.get("modes").filter(|v| v.is_object()).cloned();
        let options = result
            .get("configOptions")
            .filter(|v| v.is_array())
            .cloned();
        if fresh {
            self.modes = modes;
            self.config_options = options;
            self.available_commands = None;
            self.usage = None;
            self.last_cost = None;
        } else {
            if modes.is_some() {
                self.modes = modes;
            }
            if options.is_some() {
                self.config_options = options;
            }
        }
    }

    /// Records the current mode; whether it changed.
    pub fn set_current_mode(&mut self, id: &str) -> bool {
        match self.modes.as_mut().and_then(Value::as_object_mut) {
            Some(modes) => {
                if modes.get("currentModeId").and_then(Value::as_str) == Some(id) {
                    return false;
                }
                modes.insert("currentModeId".into(), Value::String(id.to_owned()));
                true
            }
            None => {
                self.modes = Some(serde_json::json!({"currentModeId": id, "availableModes": []}));
                true
            }
        }
    }

    /// Records the agent's full set of configuration options.
    pub fn set_config_options(&mut self, options: Value) -> bool {
        replace(
            &mut self.config_options,
            Some(options).filter(Value::is_array),
        )
    }

    /// Whether the agent offers mode `id`; else why not, for the user.
    pub fn check_mode(&self, id: &str) -> Result<(), String> {
        let offered: Vec<&str> = self
            .modes
            .as_ref()
            .and_then(|m| m.get("availableModes"))
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|m| m.get("id")?.as_str())
            .collect();
        if offered.is_empty() {
            return Err("the agent offers no session modes".into());
        }
        if offered.contains(&id) {
            Ok(())
        } else {
            Err(format!(
                "the agent offers no mode {id:?}; it offers: {}",
                offered.join(", ")
            ))
        }
    }

    /// The `session/set_config_option` params (but `sessionId`) that set
    /// option `config_id` to `value` (a string or a boolean), once checked
    /// against what the agent offers; else why not, for the user.
    pub fn config_request(&self, config_id: &str, value: &Value) -> Result<Value, String> {
        use serde_json::json;
        let options = self
            .config_options
            .as_ref()
            .and_then(Value::as_array)
            .filter(|o| !o.is_empty())
            .ok_or("the agent offers no configuration options")?;
        let id_of = |o: &Value| o.get("id").and_then(Value::as_str).map(str::to_owned);
        let Some(option) = options
            .iter()
            .find(|o| id_of(o).as_deref() == Some(config_id))
        else {
            let ids: Vec<String> = options.iter().filter_map(id_of).collect();
            return Err(format!(
                "the agent offers no configuration option {config_id:?}; it offers: {}",
                ids.join(", ")
            ));
        };
        match (option.get("type").and_then(Value::as_str), value) {
            (Some("select"), Value::String(v)) => {
                let values = select_values(option);
                if !values.contains(&v.as_str()) {
                    return Err(format!(
                        "{v:?} is not a value of option {config_id:?}; its values: {}",
                        values.join(", ")
                    ));
                }
                Ok(json!({"configId": config_id, "value": v}))
            }
            (Some("boolean"), Value::Bool(b)) => {
                Ok(json!({"configId": config_id, "type": "boolean", "value": b}))
            }
            (Some(kind @ ("select" | "boolean")), _) => Err(format!(
                "option {config_id:?} is a {kind} option: its value must be {}",
                if kind == "select" {
                    "a string"
                } else {
                    "true or false"
                }
            )),
            // A kind of option this gateway does not know: passed on as is.
            (_, Value::String(v)) => Ok(json!({"configId": config_id, "value": v})),
            (_, Value::Bool(b)) => {
                Ok(json!({"configId": config_id, "type": "boolean", "value": b}))
            }
            _ => Err("value must be a string or a boolean".into()),
        }
    }
}

/// Sets `slot` to `value` when that is something; whether it changed.
fn replace(slot: &mut Option<Value>, value: Option<Value>) -> bool {
    match value {
        Some(v) if slot.as_ref() != Some(&v) => {
            *slot = Some(v);
            true
        }
        _ => false,
    }
}

/// The values a `select` option offers, flat or in groups.
fn select_values(option: &Value) -> Vec<&str> {
    let entries = option.get("options").and_then(Value::as_array);
    entries
        .into_iter()
        .flatten()
        .flat_map(
            |entry| match entry.get("options").and_then(Value::as_array) {
                Some(group) => group.iter().collect::<Vec<_>>(),
                None => vec![entry],
            },
        )
        .filter_map(|o| o.get("value")?.as_str())
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    /// What a typical agent offers: two modes, three options.
    pub(crate) fn offered() -> AgentReport {
        let mut state = AgentReport::default();
        state.apply_opened(
            &json!({
                "sessionId": "s",
                "modes": {"currentModeId": "ask", "availableModes": [
                    {"id": "ask", "name": "Ask"}, {"id": "plan", "name": "Plan"}]},
                "configOptions": [
                    {"id": "model", "name": "Model", "type": "select", "currentValue": "fast",
                     "options": [{"value": "fast", "name": "Fast"}, {"value": "deep", "name": "Deep"}]},
                    {"id": "effort", "name": "Effort", "type": "select", "currentValue": "low",
                     "options": [{"group": "g", "name": "G", "options": [{"value": "low", "name": "Low"}]}]},
                    {"id": "brave", "name": "Brave", "type": "boolean", "currentValue": false}
                ]
            }),
            true,
        );
        state
    }

    #[test]
    fn session_state_follows_the_agents_updates() {
        let mut state = offered();
        assert!(state.apply_update(
            &json!({"sessionUpdate": "current_mode_update", "currentModeId": "plan"})
        ));
        assert_eq!(state.modes.as_ref().unwrap()["currentModeId"], "plan");
        assert_eq!(
            state.modes.as_ref().unwrap()["availableModes"][1]["id"],
            "plan"
        );
        assert!(!state.apply_update(
            &json!({"sessionUpdate": "current_mode_update", "currentModeId": "plan"})
        ));
        assert!(
            state.apply_update(&json!({"sessionUpdate": "available_commands_update",
            "availableCommands": [{"name": "init", "description": "Start"}]}))
        );
        assert_eq!(
            state.available_commands,
            Some(json!([{"name": "init", "description": "Start"}]))
        );
        assert!(state.apply_update(
            &json!({"sessionUpdate": "usage_update", "used": 5, "size": 10,
            "cost": {"amount": 0.5, "currency": "USD"}})
        ));
        assert_eq!(
            state.usage,
            Some(json!({"used": 5, "size": 10, "cost": {"amount": 0.5, "currency": "USD"}}))
        );
        assert!(
            state.apply_update(&json!({"sessionUpdate": "session_info_update", "title": "Fix it"}))
        );
        assert_eq!(state.title.as_deref(), Some("Fix it"));
        // Only a title present changes it; null clears it.
        assert!(
            !state.apply_update(&json!({"sessionUpdate": "session_info_update", "updatedAt": "x"}))
        );
        assert!(state.apply_update(&json!({"sessionUpdate": "session_info_update", "title": null})));
        assert_eq!(state.title, None);
        assert!(state
            .apply_update(&json!({"sessionUpdate": "config_option_update", "configOptions": []})));
        assert_eq!(state.config_options, Some(json!([])));
        // Malformed or unrelated updates change nothing.
        for update in [
            json!({"sessionUpdate": "config_option_update", "configOptions": "x"}),
            json!({"sessionUpdate": "current_mode_update"}),
            json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "hi"}}),
            json!({"sessionUpdate": "brand_new_kind", "title": "x"}),
            json!("not an object"),
        ] {
            assert!(!state.apply_update(&update), "{update}");
        }
    }

    #[test]
    fn a_fresh_session_forgets_what_a_restored_one_keeps() {
        let mut state = offered();
        state.apply_update(&json!({"sessionUpdate": "usage_update", "used": 1, "size": 2}));
        state.apply_update(&json!({"sessionUpdate": "session_info_update", "title": "T"}));
        let mut restored = state.clone();
        restored.apply_opened(&json!({}), false);
        assert_eq!(restored, state);
        restored.apply_opened(
            &json!({"modes": {"currentModeId": "x", "availableModes": []}}),
            false,
        );
        assert_eq!(restored.modes.as_ref().unwrap()["currentModeId"], "x");
        assert_eq!(restored.config_options, state.config_options);
        state.apply_opened(&json!({"sessionId": "new"}), true);
        assert_eq!(state.modes, None);
        assert_eq!(state.config_options, None);
        assert_eq!(state.usage, None);
        assert_eq!(
            state.title.as_deref(),
            Some("T"),
            "the conversation keeps its title"
        );
    }

    #[test]
    fn only_what_the_agent_offers_may_be_asked_for() {
        let state = offered();
        assert_eq!(state.check_mode("plan"), Ok(()));
        let err = state.check_mode("yolo").unwrap_err();
        assert!(err.contains("ask, plan"), "{err}");
        assert!(AgentReport::default().check_mode("plan").is_err());

        assert_eq!(
            state.config_request("model", &json!("deep")),
            Ok(json!({"configId": "model", "value": "deep"}))
        );
        assert_eq!(
            state.config_request("effort", &json!("low")),
            Ok(json!({"configId": "effort", "value": "low"}))
        );
        assert_eq!(
            state.config_request("brave", &json!(true)),
            Ok(json!({"configId": "brave", "type": "boolean", "value": true}))
        );
        let err = state.config_request("model", &json!("huge")).unwrap_err();
        assert!(err.contains("fast, deep"), "{err}");
        assert!(state.config_request("model", &json!(true)).is_err());
        assert!(state.config_request("brave", &json!("yes")).is_err());
        let err = state.config_request("colour", &json!("red")).unwrap_err();
        assert!(err.contains("model, effort, brave"), "{err}");
        assert!(AgentReport::default()
            .config_request("model", &json!("fast"))
            .is_err());
    }
}
