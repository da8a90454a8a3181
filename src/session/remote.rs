//! Commands for a conversation whose agent runs on another gateway node
//! (see [`crate::cluster`]): what travels between nodes. The owner carries
//! one out exactly as if it had arrived there (`Duties for Sessions`).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use super::command::Setting;
use crate::error::{Error, Result};
use crate::permissions::Answer;

/// A command as one node sends it to another.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Remote {
    Prompt {
        content: Vec<Value>,
    },
    Cancel,
    Close,
    Respond {
        request: Uuid,
        answer: Answer,
        decided_by: String,
        /// How the answer came (`notification`), if not over the API.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        via: Option<String>,
    },
    Change {
        setting: Setting,
        changed_by: String,
    },
}

impl Remote {
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).expect("commands serialize")
    }
}

/// The value an answer carries back.
pub fn decode<T: serde::de::DeserializeOwned>(value: Value) -> Result<T> {
    serde_json::from_value(value).map_err(|e| {
        Error::Internal(anyhow::anyhow!(
            "another node's answer is not what this node expects: {e}"
        ))
    })
}
