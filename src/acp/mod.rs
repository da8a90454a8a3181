//! The protocol side: JSON-RPC framing and multiplexing ([`rpc`]), agent
//! processes ([`agent`]), and the
//! typed ACP client session on top ([`client`]).

pub mod agent;
pub mod chunk;
pub mod client;
pub mod rpc;
