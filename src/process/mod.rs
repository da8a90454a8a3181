//! The processes the gateway starts for conversations: how they start
//! (a clean environment, each the root of a tree that dies with it:
//! [`spawn`]), what a profile's processes start with and whether they can
//! ([`profile`]), how one started tree is waited for and stopped
//! ([`child`]), and what `/proc` says of them, there and after a crash
//! ([`procs`]). Below the agent link (`acp`), the sandbox and the
//! workspace, which all start or look at processes; above the
//! configuration and `sys`.

pub mod profile;
pub mod child;
pub mod spawn;
pub mod procs;
