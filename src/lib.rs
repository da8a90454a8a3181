//! # acp-gateway
//!
//! Puts ACP (Agent Client Protocol) coding agents behind REST + WebSocket,
//! with everything persisted in Postgres or an embedded SQLite file.
//!
//! The parts, floor by floor from the top down, in the order they are
//! declared below: a part imports only parts declared after it, never one
//! before it, and no part imports itself through others; inside every
//! folder the same holds for the order its `mod` lines declare
//! (`tests/suite/architecture.rs` checks both).
//! - [`app`]: building and running the whole gateway; [`cli`]: the other
//!   commands (`migrate`, `export`, `token`).
//! - [`api`]: the HTTP + WebSocket API of `docs/api.md`: one
//!   router per resource; handlers call the session supervisor and the store
//!   only. [`web`]: the built-in web client (`web/`), served at `/`.
//! - [`notify`]: notifications that reach a person (what they carry, and the
//!   hand-over from the rules that find them due to the durable outbox).
//! - [`budgets`]: how much agents may spend (`[[budgets]]`): held where a
//!   prompt enters, and watched as agents report their spend (a turn that
//!   crosses one is cancelled or let finish); the rules pure
//!   ([`budgets::rules`]).
//! - [`session`]: conversations at work. [`session::Sessions`] (`mod.rs`)
//!   is the registry of live conversations and their admission (limits);
//!   `route.rs` runs a command here or forwards it to the node that owns the
//!   conversation (and carries out what other nodes forward); `answer.rs`
//!   is the one road of a person's answer to a permission request;
//!   [`session::recover`] recovers what a previous run or a dead node left;
//!   [`session::command`] is the one serialisable `Command` (local and
//!   forwarded) and the handle that sends it; `spawn.rs` starts an agent and
//!   records its process; [`session::task`] is one conversation's loop that
//!   owns its agent, its parts in `task/` (what the agent sends, permission
//!   requests, settings, turns, ending, the agent's output under a shim
//!   acknowledged once committed); [`session::transcript`] (pure) turns
//!   chunks into messages and tool-call states; [`session::queue`] (pure)
//!   the prompt queue's rules; [`session::pending`] holds
//!   the permission requests waiting for an answer; [`session::journal`] is
//!   the single writer that assigns `seq`, commits, then publishes to the
//!   [`bus`] (`journal/outage.rs` rides out a database outage, publishing
//!   before the commit; `journal/storable.rs` writes what the database
//!   refuses as stand-ins).
//! - [`acp`]: the protocol side. [`acp::client`] is the typed ACP session
//!   (handshake, prompt, cancel), failing with [`acp::Error`];
//!   [`acp::incoming`] is what an agent sends, with [`acp::chunk`]'s fast
//!   path for `session/update` chunks; [`acp::agent`] spawns and kills agent
//!   processes; [`acp::link`] is the gateway's end of a shim's socket;
//!   [`acp::rpc`] frames and multiplexes JSON-RPC over any
//!   `AsyncRead`/`AsyncWrite` and knows no ACP method or type (`rpc/`:
//!   framing, routing, the inbound hook that [`acp::incoming`] implements,
//!   the inbox; its own `RpcError`), and says how far the agent's stream is
//!   processed ([`acp::rpc::RpcPeer::processed_to`]).
//! - [`shim`]: `acp-gateway shim`, the small supervisor an agent can run
//!   under to outlive the gateway (its own `main`, no database, no HTTP):
//!   the agent's output held until acknowledged, served on a Unix socket
//!   with the framed protocol of [`shim::protocol`].
//! - [`workspace`]: what an agent reaches through the gateway when its
//!   profile offers it: files (`fs/*`, resolved beneath the conversation's
//!   directory by the kernel, so no race leads out of it) and terminals
//!   (`terminal/*`), with the agent's user's rights and in its box; and
//!   that directory, resolved from the request and the profile
//!   ([`workspace::cwd`]).
//! - [`cluster`]: several gateway nodes on one Postgres (`mod.rs` the node
//!   and its lease, `claims.rs` who runs which conversation at which owner
//!   epoch (the fence every write of the owner is conditional on), `commands.rs`
//!   and `relay.rs` commands and events between nodes, `run.rs` its tracked
//!   tasks); on SQLite, one node holding the file's lock (`lock.rs`). Its SQL
//!   is the store's ([`store::cluster`]).
//! - [`access`]: what a caller may do in a conversation (its owner, an
//!   operator, or a member with a role: the one place that decides).
//! - [`auth`]: bearer tokens, roles, who a token names, per-token rate limits.
//! - [`permissions`]: answers to permission requests, timeouts, and the
//!   policies in force; [`permissions::policy`] is the operator auto-approve
//!   engine (pure: rules in, verdict out; its tests in `policy/`) on
//!   [`permissions::shell`], which reads what a shell line runs (pure, on
//!   `brush-parser`; `shell/`: words, the walk of the parsed line, programs
//!   and the wrappers that run other programs); [`permissions::question`]
//!   (pure) checks an agent's question's schema and a person's reply to it.
//! - [`bus`]: the live fan-out of events, per conversation and global.
//! - [`store`]: persistence behind one trait ([`store::Store`]): Postgres and
//!   SQLite, each with its own commit, and parts by job written once for
//!   both ([`store::conversations`], [`store::search`], [`store::events`],
//!   [`store::messages`], [`store::permissions`], [`store::processes`],
//!   [`store::usage`], [`store::notify`], [`store::tokens`], [`store::share_links`]), the
//!   cluster's Postgres-only part
//!   (`cluster_pg.rs`), export between them, and the search backlog that an
//!   upgraded database's older messages are indexed from
//!   ([`store::search_backlog`]).
//! - [`git`]: git and nothing of sessions: a conversation's worktree on a
//!   repository, what differs in it from its base, committing, landing and
//!   discarding, and what its box must grant; by running git itself.
//! - [`sandbox`]: each conversation's box: Landlock rules built from the
//!   profile and the conversation (pure) and enforced between fork and exec
//!   ([`sandbox::landlock`]), a profile's boxes ([`sandbox::profile`]: the
//!   profile as one user's conversations get it, its agent's rules), a
//!   script agent's own installation granted ([`sandbox::scripts`]), every
//!   capability but those a profile keeps shed between fork and exec
//!   ([`sandbox::capabilities`]), and a home per user and profile
//!   ([`sandbox::homes`]).
//! - [`process`]: the processes started for conversations. [`process::spawn`]
//!   starts agents and terminal commands with a clean environment, each the
//!   root of a process tree that is killed whole, and adopts and kills what
//!   they leave behind; [`process::profile`] is what a profile's processes
//!   start with and whether they can; [`process::child`] waits for and stops
//!   one such tree; [`process::procs`] reads `/proc` and finds what a crashed
//!   run's agents left running.
//! - [`config`]: the TOML config and its validation, data only, below every
//!   part it configures: the gateway's settings, an agent profile
//!   ([`config::profile`]), what a database URL names, read in one place
//!   ([`config::url`]).
//! - [`model`] (the API's objects: conversations, permissions, what the
//!   agent reported, what a policy rule may say, and one typed event,
//!   [`model::EventBody`], that serialises and documents itself),
//!   [`limits`] (on what users send), [`ratelimit`] (one sliding window),
//!   [`telemetry`] (what `GET /metrics` shows), [`tls`] (HTTPS served by
//!   the gateway itself, its certificate re-read when renewed).
//! - [`demo_agent`]: the scripted ACP agent for tests and demos.
//! - [`error`] (the one error type) and [`sys`] (what we ask of the
//!   operating system, Linux capabilities among it) at the bottom.
//!
//! Data flows agent stdout → rpc → session task → journal (store, then bus)
//! → WebSocket; commands flow REST → supervisor → session task → rpc → agent
//! stdin.

pub mod app;
pub mod cli;
pub mod api;
pub mod web;
pub mod notify;
pub mod budgets;
pub mod session;
pub mod acp;
pub mod shim;
pub mod workspace;
pub mod cluster;
pub mod access;
pub mod auth;
pub mod permissions;
pub mod bus;
pub mod store;
pub mod git;
pub mod sandbox;
pub mod process;
pub mod config;
pub mod model;
pub mod limits;
pub mod ratelimit;
pub mod telemetry;
pub mod tls;
pub mod demo_agent;
pub mod error;
pub mod sys;

pub use app::Gateway;
pub use config::Config;
