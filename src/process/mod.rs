//! The processes the gateway starts for conversations: how they start
//! (a clean environment, each the root of a tree that dies with it:
//! [`spawn`]) and what `/proc` says of them, there and after a crash
//! ([`procs`]). Below the agent link (`acp`), the configuration and the
//! workspace, which all start or look at processes; above only `sys`.

pub mod child;
pub mod procs;
pub mod spawn;
