//! The protocol side: JSON-RPC framing and multiplexing ([`rpc`]), agent
//! processes ([`agent`]), the gateway's end of a shim's socket
//! ([`link`]) and of a remote agent's connection ([`remote`]: WebSocket or
//! Streamable HTTP), the ACP reading of what an agent sends
//! ([`incoming`], with the text-chunk fast path in [`chunk`]), and the
//! typed ACP client session on top ([`client`]), which fails with the
//! protocol layer's own [`Error`]. [`lazy_buf`] is the read buffer both
//! ends of an agent's byte streams hold only while something is read.

pub mod client;
pub mod incoming;
pub mod agent;
pub mod rpc;
pub mod link;
pub mod remote;
pub mod chunk;
pub mod lazy_buf;
pub mod error;

pub use error::{Error, Result};
