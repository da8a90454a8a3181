//! The gateway's end of a remote agent's WebSocket: an agent that serves
//! ACP over the network (the remote transport RFD's WebSocket upgrade)
//! instead of one the gateway spawns. Each text frame is one JSON-RPC
//! message; here it becomes one line, so [`super::rpc`] reads the same
//! stream from a WebSocket as from a pipe or a shim's socket.
//!
//! The connection goes through the same address guard as notification
//! targets ([`crate::config::addresses`]): the host is resolved here, the
//! forbidden addresses dropped from the answer (unless the profile's
//! `allow_private`), and the connection made only to what is left.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader, DuplexStream};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::{HeaderName, HeaderValue};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_tungstenite::WebSocketStream;
use tokio_util::sync::CancellationToken;

use crate::config::AgentProfile;

/// How many bytes each direction's pipe between the WebSocket and the rpc
/// layer holds.
const PIPE_BYTES: usize = 64 * 1024;
/// How long a connection told to close may take to say it closed.
const CLOSE_WITHIN: Duration = Duration::from_secs(2);

/// A byte stream of either kind (plain TCP, or TLS over it).
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

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

    /// Closes the connection (a WebSocket close frame) and waits for its
    /// end, bounded.
    pub async fn close(&mut self) -> Ended {
        self.stop.cancel();
        match tokio::time::timeout(CLOSE_WITHIN, self.ended()).await {
            Ok(ended) => ended,
            Err(_) => Ended::Closed("by the gateway (the agent did not answer the close)".into()),
        }
    }
}

/// Connects to the profile's `url` (within `within`) and starts carrying
/// frames both ways; messages longer than `max_message_bytes` end it.
pub async fn connect(
    profile: &AgentProfile,
    max_message_bytes: usize,
    within: Duration,
) -> anyhow::Result<RemoteLink> {
    let ws = tokio::time::timeout(within, open(profile, max_message_bytes))
        .await
        .map_err(|_| anyhow!("the remote agent did not answer within {within:?}"))??;
    Ok(carry(ws, profile.ping_interval))
}

/// Why the profile's remote agent cannot be reached now (a connection
/// made and closed at once), or `None` when it can: what `GET
/// /api/v1/agents` reports.
pub async fn unavailable_reason(profile: &AgentProfile, within: Duration) -> Option<String> {
    match tokio::time::timeout(within, open(profile, 64 * 1024)).await {
        Err(_) => Some(format!("the remote agent did not answer within {within:?}")),
        Ok(Err(e)) => Some(format!("{e:#}")),
        Ok(Ok(mut ws)) => {
            let _ = tokio::time::timeout(CLOSE_WITHIN, ws.close(None)).await;
            None
        }
    }
}

/// The WebSocket to the profile's agent, its handshake done.
async fn open(
    profile: &AgentProfile,
    max_message_bytes: usize,
) -> anyhow::Result<WebSocketStream<Box<dyn Io>>> {
    let text = profile.url.as_deref().context("not a remote agent")?;
    let url = ::url::Url::parse(text).with_context(|| format!("bad url {text:?}"))?;
    let tls = match url.scheme() {
        "wss" => true,
        "ws" if profile.allow_private => false,
        "ws" => bail!("plain ws:// is refused (allow_private = true admits it)"),
        other => bail!("{other}:// is not a WebSocket URL"),
    };
    let port = url.port_or_known_default().context("the url has no port")?;
    let (name, addresses) = resolve(&url, port).await?;
    let addresses = admitted(addresses, profile.allow_private, &name)?;
    let tcp = connect_any(&addresses, &name).await?;
    let _ = tcp.set_nodelay(true);
    let stream: Box<dyn Io> = if tls {
        Box::new(tls_over(tcp, &name).await?)
    } else {
        Box::new(tcp)
    };
    let mut request = text.into_client_request().context("bad url")?;
    let headers = request.headers_mut();
    for (key, value) in &profile.headers {
        let key = HeaderName::from_bytes(key.as_bytes()).context("bad header name")?;
        headers.insert(
            key,
            HeaderValue::from_str(value).context("bad header value")?,
        );
    }
    if let Some(token) = profile.remote_token()? {
        let value = HeaderValue::from_str(&format!("Bearer {token}"))
            .context("the token is not a valid header value")?;
        headers.insert("authorization", value);
    }
    let config = WebSocketConfig::default()
        .max_message_size(Some(max_message_bytes))
        .max_frame_size(Some(max_message_bytes));
    match tokio_tungstenite::client_async_with_config(request, stream, Some(config)).await {
        Ok((ws, _)) => Ok(ws),
        Err(tungstenite::Error::Http(response)) => {
            let status = response.status();
            if status == 401 || status == 403 {
                bail!("the remote agent refused the token (HTTP {status})")
            }
            bail!("the remote agent refused the connection (HTTP {status})")
        }
        Err(e) => bail!("no WebSocket with the remote agent: {e}"),
    }
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

/// A TCP connection to the first of `addresses` that answers.
async fn connect_any(addresses: &[SocketAddr], name: &str) -> anyhow::Result<TcpStream> {
    let mut last = None;
    for address in addresses {
        match TcpStream::connect(address).await {
            Ok(tcp) => return Ok(tcp),
            Err(e) => last = Some(e),
        }
    }
    match last {
        Some(e) => bail!("cannot connect to {name}: {e}"),
        None => bail!("{name} has no address"),
    }
}

/// TLS over `tcp` to `name`, checked against the web's root certificates.
async fn tls_over(
    tcp: TcpStream,
    name: &str,
) -> anyhow::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("the ring provider supports the default versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let server = rustls::pki_types::ServerName::try_from(name.to_owned())
        .with_context(|| format!("{name} is not a TLS server name"))?;
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(server, tcp)
        .await
        .with_context(|| format!("TLS with {name} failed"))
}

/// Starts the two tasks that carry the WebSocket's frames to and from the
/// rpc layer's lines, pinging every `ping` (unless zero).
fn carry(ws: WebSocketStream<Box<dyn Io>>, ping: Duration) -> RemoteLink {
    let (to_rpc, output) = tokio::io::duplex(PIPE_BYTES);
    let (input, from_rpc) = tokio::io::duplex(PIPE_BYTES);
    let (ended_tx, ended) = watch::channel(None);
    let ended_tx = Arc::new(ended_tx);
    let stop = CancellationToken::new();
    let abandon = CancellationToken::new();
    let (sink, stream) = ws.split();
    let ends = Ends {
        ended: ended_tx,
        stop: stop.clone(),
        abandon,
    };
    tokio::spawn(receive(stream, to_rpc, ends.clone(), ping));
    tokio::spawn(send(from_rpc, sink, ends, ping));
    RemoteLink {
        input,
        output,
        control: RemoteControl { ended, stop },
    }
}

/// What both of a connection's tasks share: how it ended, the word to
/// stop, and the word to stop waiting for the agent's answer to a close.
#[derive(Clone)]
struct Ends {
    ended: Arc<watch::Sender<Option<Ended>>>,
    stop: CancellationToken,
    abandon: CancellationToken,
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

/// The agent's frames, each a line for the rpc layer; the pipe closes
/// (the agent's output ends) once the connection does.
async fn receive(
    mut stream: futures::stream::SplitStream<WebSocketStream<Box<dyn Io>>>,
    mut to_rpc: DuplexStream,
    Ends {
        ended,
        stop,
        abandon,
    }: Ends,
    ping: Duration,
) {
    // Silent for three pings (not even a pong): the network is gone.
    let silence = ping * 3;
    let how = loop {
        let next = tokio::select! {
            next = stream.next() => next,
            // The agent did not answer our close in time.
            _ = abandon.cancelled() => break Ended::Closed("by the gateway".into()),
            _ = tokio::time::sleep(silence), if !ping.is_zero() => {
                break Ended::Lost(format!("the agent said nothing for {silence:?}, not even a pong"));
            }
        };
        let text = match next {
            None => break Ended::Lost("the connection closed without a close frame".into()),
            Some(Err(e)) => break Ended::Lost(e.to_string()),
            Some(Ok(Message::Close(frame))) => {
                let by = if stop.is_cancelled() {
                    "by the gateway".to_owned()
                } else {
                    match frame.filter(|f| !f.reason.is_empty()) {
                        Some(f) => format!("by the agent: {}", f.reason),
                        None => "by the agent".to_owned(),
                    }
                };
                break Ended::Closed(by);
            }
            Some(Ok(Message::Text(text))) => text.as_str().to_owned(),
            Some(Ok(Message::Binary(bytes))) => String::from_utf8_lossy(&bytes).into_owned(),
            Some(Ok(_)) => continue,
        };
        if to_rpc.write_all(as_line(text).as_bytes()).await.is_err() {
            break Ended::Closed("by the gateway (it stopped reading)".into());
        }
    };
    end(&ended, how);
    stop.cancel();
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

/// The rpc layer's lines, each a text frame to the agent; a close frame
/// when told to stop or when the rpc layer closes its end.
async fn send(
    from_rpc: DuplexStream,
    mut sink: futures::stream::SplitSink<WebSocketStream<Box<dyn Io>>, Message>,
    Ends {
        ended,
        stop,
        abandon,
    }: Ends,
    ping: Duration,
) {
    let mut lines = BufReader::new(from_rpc);
    let mut line = Vec::new();
    let mut pings = tokio::time::interval(ping.max(Duration::from_millis(1)));
    pings.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // `read_until` keeps what it read in `line` when cancelled.
        let read = tokio::select! {
            _ = stop.cancelled() => break,
            read = lines.read_until(b'\n', &mut line) => read,
            _ = pings.tick(), if !ping.is_zero() => {
                if let Err(e) = sink.send(Message::Ping(Default::default())).await {
                    end(&ended, Ended::Lost(e.to_string()));
                    stop.cancel();
                    return;
                }
                continue;
            }
        };
        match read {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                while line.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                    line.pop();
                }
                let text = String::from_utf8_lossy(&line).into_owned();
                line.clear();
                if let Err(e) = sink.send(Message::text(text)).await {
                    end(&ended, Ended::Lost(e.to_string()));
                    stop.cancel();
                    return;
                }
            }
        }
    }
    // Ours to close (the receiver reads the agent's answer to it), unless
    // the connection is gone already.
    if ended.borrow().is_none() {
        stop.cancel();
        let _ = tokio::time::timeout(CLOSE_WITHIN, sink.close()).await;
        let mut watching = ended.subscribe();
        let _ = tokio::time::timeout(CLOSE_WITHIN, watching.wait_for(Option::is_some)).await;
        end(&ended, Ended::Closed("by the gateway".into()));
        abandon.cancel();
    }
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
