//! The gateway's own objects as the API reference (`docs/api.md`) names
//! them, one file per job: [`conversation`] (a conversation, its messages
//! and tool calls), [`permission`] (requests, answers, rules, roles,
//! policies), [`queue`] (prompts waiting for the running turn), [`members`] (a
//! conversation shared with other users), [`policy_input`] (what a policy rule may say, as the API and
//! the config file take it), [`agent_report`] (what the agent reported
//! about its session), [`event`] (the event log) and [`stamp`] (new ids,
//! the time now). ACP objects inside them (updates, tool calls, content
//! blocks, permission options) are kept as raw JSON, verbatim. Everything but
//! [`policy_input`] is re-exported here, as `crate::model::X`; the files
//! import each other, never this one.

use serde::Serialize;

pub mod event;
pub mod policy_input;
pub mod conversation;
pub mod question;
pub mod permission;
pub mod queue;
pub mod members;
pub mod changes;
pub mod budget;
pub mod agent_report;
pub mod usage;
pub mod stamp;

pub use agent_report::*;
pub use budget::*;
pub use changes::*;
pub use conversation::*;
pub use event::*;
pub use members::*;
pub use permission::*;
pub use question::*;
pub use queue::*;
pub use stamp::*;
pub use usage::*;

/// A list in the contract's shape: one page of items, and the cursor of
/// the next page (`None`: this is the last).
#[derive(Debug, Serialize)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub next_cursor: Option<String>,
}
