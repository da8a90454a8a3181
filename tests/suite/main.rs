//! The integration tests, in one binary (one link instead of thirty; the
//! shared harness compiled once): each module is one area, driven through
//! a real gateway (in-process or an `acp-gateway serve` process), real
//! databases, real agent subprocesses and real clients. `tests/files.rs`
//! stays a binary of its own: it measures its own process's threads and
//! memory.

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

mod acp_http;
mod acp_server;
mod acp_sessions;
mod agents;
mod api_errors;
mod architecture;
mod auth;
mod auth_hardening;
mod budgets;
mod capabilities;
mod cluster;
mod commits;
mod contract;
mod contract_notifications;
mod contract_policies;
mod db_outage;
mod docs;
mod export;
mod floods;
mod fork_adopt;
mod hostile_input;
mod ide_story;
mod isolation;
mod journal;
mod keep_alive;
mod members;
mod notifications;
mod notify_actions;
mod notify_channels;
mod notify_when;
mod openapi;
mod operability;
mod permission_lifecycle;
mod permissions;
mod policies;
mod questions;
mod quick_start;
mod qwen_serve;
mod qwen_sessions;
mod remote_agents;
mod remote_http;
mod remote_reconnect;
mod restart;
mod resume;
mod sandbox;
mod script_agents;
mod sdk_agents;
mod search;
mod session_settings;
mod shim;
mod share_links;
mod shutdown;
mod spending;
mod steering;
mod tls;
mod turns;
mod usage;
mod web_changes;
mod web_client;
mod web_members;
mod web_questions;
mod web_share;
mod web_steering;
mod web_usage;
mod websocket;
mod workspace;
mod worktree_box;
mod worktrees;
