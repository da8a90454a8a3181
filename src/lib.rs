//! # acp-gateway
//!
//! Puts ACP (Agent Client Protocol) coding agents behind REST + WebSocket,
//! with everything persisted in Postgres or an embedded SQLite file.
//!
//! How the parts fit:
//! - [`config`]: the TOML config and its validation.
//! - [`acp`]: the protocol side. [`acp::rpc`] frames and multiplexes JSON-RPC
//!   over any `AsyncRead`/`AsyncWrite`; [`acp::agent`] spawns and kills agent
//!   processes; [`acp::procs`] finds and kills what a crashed run's agents
//!   left running.
//! - [`session`]: one task per live conversation, owning its agent; turns ACP
//!   traffic into events and state, carries out API commands.
//! - [`journal`]: a conversation's single writer: assigns `seq`, batches writes,
//!   commits, then publishes to the [`bus`].
//! - [`permissions`]: answer checks, timeouts and remembered "always" rules
//!   (pure functions the session applies).
//! - [`policy`]: the operator auto-approve engine (pure: rules in, verdict out).
//! - [`shell`]: what a shell command line runs, wrappers unwrapped (pure,
//!   on `brush-parser`), for the policy engine.
//! - [`store`]: persistence behind one trait ([`store::Store`]): Postgres and
//!   SQLite from one SQL text, and export between them.
//! - [`auth`]: bearer tokens, roles, per-token rate limits.
//! - [`api`]: the HTTP + WebSocket API of `../shared/docs/api.md`.
//! - [`app`]: building and running the whole gateway.
//! - [`demo_agent`]: the scripted ACP agent for tests and demos.
//! - [`model`], [`error`]: the API's objects and its one error type.
//!
//! Data flows agent stdout → rpc → session → journal (store, then bus) →
//! WebSocket; commands flow REST → session handle → rpc → agent stdin.

pub mod acp;
pub mod api;
pub mod app;
pub mod auth;
pub mod bus;
pub mod config;
pub mod demo_agent;
pub mod error;
pub mod journal;
pub mod model;
pub mod permissions;
pub mod policy;
pub mod session;
pub mod shell;
pub mod store;

pub use app::Gateway;
pub use config::Config;
