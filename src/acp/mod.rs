//! The protocol side: JSON-RPC framing and multiplexing, and agent processes.

pub mod agent;
pub mod procs;
pub mod rpc;
