//! HTTPS served by the gateway itself (`tls`): the page and the API over
//! `https://`, a conversation's WebSocket over `wss://`, and a certificate
//! renewed on disk served from the next connection on, without a restart
//! (a half-written one never replaces the last good one). Certificates are
//! made here with `rcgen`; clients check them with rustls (reqwest, and
//! tokio-rustls under the WebSocket), trusting one certificate each.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::common::*;
use acp_gateway::config::TlsFiles;
use futures::StreamExt;
use rustls::pki_types::pem::PemObject;
use serde_json::Value;

/// A self-signed certificate for `localhost` and 127.0.0.1: its PEM, and
/// its key's.
fn certificate() -> (String, String) {
    let made =
        rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    (made.cert.pem(), made.signing_key.serialize_pem())
}

/// Writes a pair as a renewal does: new files renamed over the old.
fn install(dir: &Path, (cert, key): &(String, String)) -> (PathBuf, PathBuf) {
    let (cert_file, key_file) = (dir.join("cert.pem"), dir.join("key.pem"));
    for (file, pem) in [(&cert_file, cert), (&key_file, key)] {
        let next = file.with_extension("new");
        std::fs::write(&next, pem).unwrap();
        std::fs::rename(&next, file).unwrap();
    }
    (cert_file, key_file)
}

/// A client that trusts `cert` alone (and keeps no connection for later).
fn client_trusting(cert: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(cert.as_bytes()).unwrap())
        .pool_max_idle_per_host(0)
        .build()
        .unwrap()
}

/// `GET path` over HTTPS as a client trusting `cert`: the status, or why
/// the connection failed.
async fn get(cert: &str, base: &str, path: &str) -> Result<u16, String> {
    client_trusting(cert)
        .get(format!("{base}{path}"))
        .send()
        .await
        .map(|r| r.status().as_u16())
        .map_err(|e| format!("{e:?}"))
}

async fn https_is_served_and_a_renewed_certificate_without_a_restart(db: TestDb) {
    let dir = tempfile::tempdir().unwrap();
    let first = certificate();
    let (cert_file, key_file) = install(dir.path(), &first);
    let mut config = Config::for_tests(&db, vec![demo_profile("demo", &[])]);
    config.tls = Some(TlsFiles {
        cert_file,
        key_file,
    });
    let gw = TestGateway::start_with(config).await;
    let base = gw.base.replacen("http://", "https://", 1);

    // The page and the API, over HTTPS; plain HTTP is not spoken.
    assert_eq!(get(&first.0, &base, "/").await, Ok(200));
    assert_eq!(get(&first.0, &base, "/api/v1/agents").await, Ok(200));
    assert!(gw.http.get(gw.url("/")).send().await.is_err());

    // A conversation's WebSocket over wss://.
    let https = Client {
        base: base.clone(),
        http: client_trusting(&first.0),
        token: None,
    };
    let id = https.create("demo").await;
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls::pki_types::CertificateDer::from_pem_slice(first.0.as_bytes()).unwrap())
        .unwrap();
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let port = base.rsplit(':').next().unwrap();
    let tcp = tokio::net::TcpStream::connect(format!("127.0.0.1:{port}"))
        .await
        .unwrap();
    let stream = tokio_rustls::TlsConnector::from(Arc::new(tls))
        .connect("localhost".try_into().unwrap(), tcp)
        .await
        .unwrap();
    let url = format!("wss://localhost:{port}/api/v1/conversations/{id}/ws?after=0");
    let (mut ws, _) = tokio::time::timeout(WAIT, tokio_tungstenite::client_async(url, stream))
        .await
        .expect("the WebSocket opens in time")
        .unwrap();
    let frame = tokio::time::timeout(WAIT, ws.next())
        .await
        .expect("an event in time")
        .unwrap()
        .unwrap();
    let event: Value = serde_json::from_str(frame.to_text().unwrap()).unwrap();
    assert_eq!(event["seq"], 1, "{event}");

    // Renewed on disk: the next connection gets the new certificate.
    let second = certificate();
    install(dir.path(), &second);
    assert_eq!(get(&second.0, &base, "/").await, Ok(200));
    let refused = get(&first.0, &base, "/").await.unwrap_err();
    assert!(refused.contains("ertificate"), "{refused}");

    // A renewal written half-way keeps the last good one.
    std::fs::write(
        dir.path().join("cert.pem"),
        "-----BEGIN CERTIFICATE-----\ntrunc",
    )
    .unwrap();
    assert_eq!(get(&second.0, &base, "/").await, Ok(200));
    gw.stop().await;
}

/// A certificate that cannot be used stops the start, naming the file.
async fn a_certificate_that_cannot_be_used_stops_the_start(db: TestDb) {
    let dir = tempfile::tempdir().unwrap();
    let (cert, _) = certificate();
    let (_, other_key) = certificate();
    let (cert_file, key_file) = install(dir.path(), &(cert, other_key));
    let mut config = Config::for_tests(&db, vec![demo_profile("demo", &[])]);
    config.tls = Some(TlsFiles {
        cert_file,
        key_file: key_file.clone(),
    });
    let error = match acp_gateway::app::Gateway::build(config.clone()).await {
        Ok(_) => panic!("a key of another certificate was taken"),
        Err(e) => format!("{e:#}"),
    };
    assert!(
        error.contains("tls") && error.contains("key.pem"),
        "{error}"
    );
    config.tls = Some(TlsFiles {
        cert_file: dir.path().join("missing.pem"),
        key_file,
    });
    let error = match acp_gateway::app::Gateway::build(config).await {
        Ok(_) => panic!("a missing certificate was taken"),
        Err(e) => format!("{e:#}"),
    };
    assert!(error.contains("missing.pem"), "{error}");
}

mod sqlite {
    use super::*;

    #[tokio::test]
    async fn https_and_a_renewed_certificate() {
        https_is_served_and_a_renewed_certificate_without_a_restart(TestDb::sqlite().await).await
    }

    #[tokio::test]
    async fn an_unusable_certificate_stops_the_start() {
        a_certificate_that_cannot_be_used_stops_the_start(TestDb::sqlite().await).await
    }
}
