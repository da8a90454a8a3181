//! A remote agent over a WebSocket (the remote transport RFD's upgrade):
//! each text frame is one JSON-RPC message, here one line for the rpc
//! layer. `ws://`/`wss://` urls, and `https://` ones with `transport =
//! "websocket"` (upgraded over TLS). The connection is made to the
//! addresses the guard admitted ([`super::guard::target`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader, DuplexStream};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_tungstenite::WebSocketStream;

use super::guard::target;
use super::shared::{
    as_line, end, request_headers, Ended, Ends, RemoteLink, CLOSE_WITHIN, PIPE_BYTES, PROBE_BYTES,
};
use crate::config::AgentProfile;

/// A byte stream of either kind (plain TCP, or TLS over it).
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// Connects to the profile's `url` (within `within`) and starts carrying
/// frames both ways; messages longer than `max_message_bytes` end it.
pub(super) async fn connect(
    profile: &AgentProfile,
    max_message_bytes: usize,
    within: Duration,
) -> anyhow::Result<RemoteLink> {
    let ws = tokio::time::timeout(within, open(profile, max_message_bytes))
        .await
        .map_err(|_| anyhow!("the remote agent did not answer within {within:?}"))??;
    Ok(carry(ws, profile.ping_interval))
}

/// Whether the profile's agent can be reached: a WebSocket opened and
/// closed at once.
pub(super) async fn probe(profile: &AgentProfile, within: Duration) -> anyhow::Result<()> {
    match tokio::time::timeout(within, open(profile, PROBE_BYTES)).await {
        Err(_) => bail!("the remote agent did not answer within {within:?}"),
        Ok(Err(e)) => Err(e),
        Ok(Ok(mut ws)) => {
            let _ = tokio::time::timeout(CLOSE_WITHIN, ws.close(None)).await;
            Ok(())
        }
    }
}

/// The WebSocket to the profile's agent, its handshake done.
async fn open(
    profile: &AgentProfile,
    max_message_bytes: usize,
) -> anyhow::Result<WebSocketStream<Box<dyn Io>>> {
    let target = target(profile).await?;
    let tcp = connect_any(&target.addresses, &target.name).await?;
    let _ = tcp.set_nodelay(true);
    let stream: Box<dyn Io> = if target.tls {
        Box::new(tls_over(profile, tcp, &target.name).await?)
    } else {
        Box::new(tcp)
    };
    // An http(s):// url (`transport = "websocket"`) is upgraded as its
    // ws(s):// twin is.
    let mut url = target.url;
    let scheme = if target.tls { "wss" } else { "ws" };
    if url.scheme() != scheme {
        url.set_scheme(scheme)
            .map_err(|()| anyhow!("cannot make {url} a WebSocket URL"))?;
    }
    let mut request = url.as_str().into_client_request().context("bad url")?;
    request.headers_mut().extend(request_headers(profile)?);
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

/// TLS over `tcp` to `name`, checked as the profile's TLS checks
/// ([`super::guard::tls_config`]).
async fn tls_over(
    profile: &AgentProfile,
    tcp: TcpStream,
    name: &str,
) -> anyhow::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let config = super::guard::tls_config(profile)?;
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
    let (ends, control) = Ends::new();
    let (sink, stream) = ws.split();
    tokio::spawn(receive(stream, to_rpc, ends.clone(), ping));
    tokio::spawn(send(from_rpc, sink, ends, ping));
    RemoteLink {
        input,
        output,
        control,
    }
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
