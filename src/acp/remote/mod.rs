//! The gateway's end of a remote agent's connection: an agent that serves
//! ACP over the network (the remote transport RFD) instead of one the
//! gateway spawns. Either transport becomes a [`RemoteLink`]: two byte
//! streams of one JSON-RPC message a line, so [`super::rpc`] reads the same
//! stream from the network as from a pipe or a shim's socket.
//!
//! - [`ws`]: a WebSocket, each text frame one message (`ws://`, `wss://`,
//!   or `https://` with `transport = "websocket"`).
//! - [`http`]: Streamable HTTP, each message POSTed and what the agent
//!   sends read from the connection's one GET event stream (`http://`,
//!   `https://`).
//!
//! What both share is here: how a connection ended ([`Ended`]), its
//! control, the address guard and TLS. Every connection goes through the
//! same guard as notification targets ([`crate::config::addresses`]): the
//! host is resolved here, the forbidden addresses dropped from the answer
//! (unless the profile's `allow_private`), and the connection made only to
//! what is left. TLS checks the agent's certificate against the web's root
//! certificates and the profile's `ca_file`.

mod http;
mod ws;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use tokio::io::DuplexStream;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::config::{AgentProfile, Transport};

/// How many bytes each direction's pipe between the connection and the
/// rpc layer holds.
const PIPE_BYTES: usize = 64 * 1024;
/// How long a connection told to close may take to say it closed.
const CLOSE_WITHIN: Duration = Duration::from_secs(2);
/// How large a message [`unavailable_reason`]'s look may read.
const PROBE_BYTES: usize = 64 * 1024;

/// How a remote agent's connection ended.
#[derive(Debug, Clone)]
pub enum Ended {
    /// Closed in order (by the agent, or by us): the text says by whom.
    Closed(String),
    /// Lost: the network, or the agent went away without closing.
    Lost(String),
}

impl std::fmt::Display for Ended {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Ended::Closed(why) => write!(f, "closed {why}"),
            Ended::Lost(why) => write!(f, "lost: {why}"),
        }
    }
}

/// An open connection to a remote agent: its two streams as lines, and
/// its control.
pub struct RemoteLink {
    /// What the rpc layer writes (one message a line).
    pub input: DuplexStream,
    /// What the rpc layer reads (one message a line).
    pub output: DuplexStream,
    pub control: RemoteControl,
}

/// Ends a remote agent's connection, and tells how it ended.
#[derive(Clone)]
pub struct RemoteControl {
    ended: watch::Receiver<Option<Ended>>,
    stop: CancellationToken,
}

impl RemoteControl {
    /// Resolves when the connection has ended (at once afterwards).
    pub async fn ended(&mut self) -> Ended {
        match self.ended.wait_for(Option::is_some).await {
            Ok(ended) => ended.clone().expect("waited for"),
            Err(_) => Ended::Lost("the connection's tasks are gone".into()),
        }
    }

    /// Closes the connection (a WebSocket close frame, or a Streamable
    /// HTTP `DELETE`) and waits for its end, bounded.
    pub async fn close(&mut self) -> Ended {
        self.stop.cancel();
        match tokio::time::timeout(CLOSE_WITHIN, self.ended()).await {
            Ok(ended) => ended,
            Err(_) => Ended::Closed("by the gateway (the agent did not answer the close)".into()),
        }
    }
}

/// Connects to the profile's `url` (within `within`) over its transport
/// and starts carrying messages both ways; messages longer than
/// `max_message_bytes` end it.
pub async fn connect(
    profile: &AgentProfile,
    max_message_bytes: usize,
    within: Duration,
) -> anyhow::Result<RemoteLink> {
    match profile.remote_transport() {
        Some(Transport::Http) => http::connect(profile, max_message_bytes, within).await,
        Some(Transport::Websocket) => ws::connect(profile, max_message_bytes, within).await,
        None => bail!("not a remote agent"),
    }
}

/// Why the profile's remote agent cannot be reached now, or `None` when it
/// can: what `GET /api/v1/agents` reports. A WebSocket is opened and
/// closed at once; over Streamable HTTP a `GET` without a connection id
/// is sent, which starts nothing on the agent (see [`http`]).
pub async fn unavailable_reason(profile: &AgentProfile, within: Duration) -> Option<String> {
    let found = match profile.remote_transport() {
        Some(Transport::Http) => http::probe(profile, within).await,
        Some(Transport::Websocket) => ws::probe(profile, within).await,
        None => Err(anyhow::anyhow!("not a remote agent")),
    };
    found.err().map(|e| format!("{e:#}"))
}

/// Where a remote agent is: its url, the name TLS checks (the host), the
/// addresses the guard admits, and whether the url asks for TLS.
struct Target {
    url: ::url::Url,
    name: String,
    addresses: Vec<SocketAddr>,
    tls: bool,
}

/// The profile's url resolved through the address guard: plain
/// `ws://`/`http://` and forbidden addresses only with `allow_private`.
async fn target(profile: &AgentProfile) -> anyhow::Result<Target> {
    let text = profile.url.as_deref().context("not a remote agent")?;
    let url = ::url::Url::parse(text).with_context(|| format!("bad url {text:?}"))?;
    let tls = match url.scheme() {
        "wss" | "https" => true,
        "ws" | "http" if profile.allow_private => false,
        plain @ ("ws" | "http") => {
            bail!("plain {plain}:// is refused (allow_private = true admits it)")
        }
        other => bail!("{other}:// is not a remote agent's URL"),
    };
    let port = url.port_or_known_default().context("the url has no port")?;
    let (name, addresses) = resolve(&url, port).await?;
    let addresses = admitted(addresses, profile.allow_private, &name)?;
    Ok(Target {
        url,
        name,
        addresses,
        tls,
    })
}

/// The host's addresses (a name resolved now) and its name for TLS.
async fn resolve(url: &::url::Url, port: u16) -> anyhow::Result<(String, Vec<SocketAddr>)> {
    match url.host() {
        Some(::url::Host::Domain(name)) => {
            let found = tokio::net::lookup_host((name, port))
                .await
                .with_context(|| format!("cannot resolve {name}"))?;
            Ok((name.to_owned(), found.collect()))
        }
        Some(::url::Host::Ipv4(ip)) => Ok((ip.to_string(), vec![(IpAddr::V4(ip), port).into()])),
        Some(::url::Host::Ipv6(ip)) => Ok((ip.to_string(), vec![(IpAddr::V6(ip), port).into()])),
        None => bail!("the url has no host"),
    }
}

/// The addresses the guard admits: all where the profile allows private
/// ones, else the public ones; an error where none is left.
fn admitted(
    addresses: Vec<SocketAddr>,
    allow_private: bool,
    name: &str,
) -> anyhow::Result<Vec<SocketAddr>> {
    let found = !addresses.is_empty();
    let left: Vec<SocketAddr> = addresses
        .into_iter()
        .filter(|a| allow_private || !crate::config::addresses::is_forbidden(a.ip()))
        .collect();
    match (found, left.is_empty()) {
        (false, _) => bail!("{name} has no address"),
        (true, true) => bail!(
            "{name} is a private, loopback or link-local address (allow_private = true \
             admits it for this profile)"
        ),
        _ => Ok(left),
    }
}

/// The TLS the profile's connections use: the agent's certificate checked
/// against the web's root certificates and those of its `ca_file`.
fn tls_config(profile: &AgentProfile) -> anyhow::Result<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    for certificate in profile.extra_roots()? {
        roots
            .add(certificate)
            .context("ca_file: a certificate cannot be used as a root")?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("the ring provider supports the default versions")
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// What both of a connection's tasks share: how it ended, the word to
/// stop, and the word to stop waiting for the agent's answer to a close.
#[derive(Clone)]
struct Ends {
    ended: Arc<watch::Sender<Option<Ended>>>,
    stop: CancellationToken,
    abandon: CancellationToken,
}

impl Ends {
    /// A connection's ends, and the control over them.
    fn new() -> (Ends, RemoteControl) {
        let (ended_tx, ended) = watch::channel(None);
        let stop = CancellationToken::new();
        let ends = Ends {
            ended: Arc::new(ended_tx),
            stop: stop.clone(),
            abandon: CancellationToken::new(),
        };
        (ends, RemoteControl { ended, stop })
    }

    /// Says how the connection ended, once (the first word stays).
    fn end(&self, how: Ended) {
        end(&self.ended, how);
    }

    fn is_ended(&self) -> bool {
        self.ended.borrow().is_some()
    }
}

/// Says how the connection ended, once (the first word stays).
fn end(ended: &watch::Sender<Option<Ended>>, how: Ended) {
    ended.send_if_modified(|now| {
        if now.is_some() {
            return false;
        }
        *now = Some(how);
        true
    });
}

/// One message as one line: a message written over several lines (pretty
/// JSON) is made compact; the line ends with `\n`.
fn as_line(mut text: String) -> String {
    if text.contains('\n') {
        if let Ok(value) = serde_json::from_str::<serde_json::Value>(&text) {
            text = value.to_string();
        } else {
            text = text.replace(['\r', '\n'], " ");
        }
    }
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_over_several_lines_becomes_one() {
        assert_eq!(
            as_line("{\n  \"id\": 1\n}".into()),
            "{\"id\":1}\n".to_owned()
        );
        assert_eq!(as_line("{\"id\":1}".into()), "{\"id\":1}\n");
    }

    #[test]
    fn private_addresses_need_allow_private() {
        let local: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let err = admitted(vec![local], false, "localhost").unwrap_err();
        assert!(err.to_string().contains("allow_private"), "{err}");
        assert_eq!(
            admitted(vec![local], true, "localhost").unwrap(),
            vec![local]
        );
    }
}
