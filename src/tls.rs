//! HTTPS served by the gateway itself (`tls = { cert_file, key_file }`):
//! what a phone needs to install the web client, get push and use a
//! service worker when the gateway is reached over the network.
//!
//! - **The certificate follows its files.** Each handshake looks at the two
//!   files (their size, modification time and inode: a renewal that writes
//!   them in place or renames new ones over them alike) and reads them again
//!   when they changed, so a renewed certificate is served without a restart.
//!   A pair that cannot be read or does not match keeps the last good one
//!   (logged); at start, it is an error.
//! - **Handshakes never hold up the listener.** Each accepted connection's
//!   handshake runs on a task of its own (bounded by `HANDSHAKE_WITHIN`);
//!   the server gets connections as their handshakes complete
//!   ([`TlsListener`], an `axum::serve` listener).

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// How long a client may take over its handshake.
const HANDSHAKE_WITHIN: Duration = Duration::from_secs(10);
/// Handshakes done and not yet taken by the server.
const READY: usize = 64;

/// The certificate and key files, and what they held when last read.
#[derive(Debug)]
pub struct Certificate {
    cert_file: PathBuf,
    key_file: PathBuf,
    current: Mutex<(Stamp, Arc<CertifiedKey>)>,
}

/// What tells a file changed: size, modification time, inode.
type Stamp = [(u64, Option<SystemTime>, u64); 2];

fn stamp(cert_file: &Path, key_file: &Path) -> io::Result<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let one = |path: &Path| {
        std::fs::metadata(path)
            .map(|m| (m.len(), m.modified().ok(), m.ino()))
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))
    };
    Ok([one(cert_file)?, one(key_file)?])
}

/// Reads a certificate chain and its private key (PEM).
fn load(cert_file: &Path, key_file: &Path) -> io::Result<Arc<CertifiedKey>> {
    let invalid = |what: &str, path: &Path, e: &dyn std::fmt::Display| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{what} {}: {e}", path.display()),
        )
    };
    let certs = CertificateDer::pem_file_iter(cert_file)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| invalid("cannot read the certificate", cert_file, &e))?;
    if certs.is_empty() {
        return Err(invalid(
            "no certificate in",
            cert_file,
            &"no PEM CERTIFICATE block",
        ));
    }
    let key = PrivateKeyDer::from_pem_file(key_file)
        .map_err(|e| invalid("cannot read the private key", key_file, &e))?;
    let provider = rustls::crypto::ring::default_provider();
    let certified = CertifiedKey::from_der(certs, key, &provider)
        .map_err(|e| invalid("the key does not suit the certificate", key_file, &e))?;
    Ok(Arc::new(certified))
}

impl Certificate {
    /// Reads the pair now (an error if it cannot be used).
    pub fn open(cert_file: &Path, key_file: &Path) -> io::Result<Certificate> {
        let stamp = stamp(cert_file, key_file)?;
        let key = load(cert_file, key_file)?;
        Ok(Certificate {
            cert_file: cert_file.to_path_buf(),
            key_file: key_file.to_path_buf(),
            current: Mutex::new((stamp, key)),
        })
    }

    /// The pair to serve: read again if its files changed since.
    fn now(&self) -> Arc<CertifiedKey> {
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        let Ok(stamp) = stamp(&self.cert_file, &self.key_file) else {
            return current.1.clone();
        };
        if stamp != current.0 {
            match load(&self.cert_file, &self.key_file) {
                Ok(key) => {
                    tracing::info!(cert_file = %self.cert_file.display(), "serving the renewed certificate");
                    *current = (stamp, key);
                }
                Err(e) => {
                    // Written half-way, say: tried again at the next handshake.
                    tracing::warn!(error = %e, "keeping the last good certificate");
                }
            }
        }
        current.1.clone()
    }
}

impl ResolvesServerCert for Certificate {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.now())
    }
}

/// A TLS acceptor serving `certificate` (HTTP/1.1; WebSockets upgrade on it).
pub fn acceptor(certificate: Arc<Certificate>) -> TlsAcceptor {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("the ring provider supports the default versions")
        .with_no_client_auth()
        .with_cert_resolver(certificate);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    TlsAcceptor::from(Arc::new(config))
}

/// Connections of `listener` once their handshakes are done: what
/// `axum::serve` takes in place of a `TcpListener`.
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
    accepting: tokio::task::JoinHandle<()>,
}

impl TlsListener {
    pub fn new(listener: TcpListener, acceptor: TlsAcceptor) -> io::Result<TlsListener> {
        let local = listener.local_addr()?;
        let (tx, ready) = mpsc::channel(READY);
        let accepting = tokio::spawn(async move {
            loop {
                let (tcp, peer) = match listener.accept().await {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of descriptors, say: a moment's pause, as
                        // axum's own listener does.
                        tracing::warn!(error = %e, "accepting a connection failed");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        continue;
                    }
                };
                let (acceptor, ready) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_WITHIN, acceptor.accept(tcp)).await {
                        Ok(Ok(tls)) => {
                            let _ = ready.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                });
                if tx.is_closed() {
                    return;
                }
            }
        });
        Ok(TlsListener {
            ready,
            local,
            accepting,
        })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(ready) => ready,
            // The accepting task never ends while we hold its receiver.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local)
    }
}
