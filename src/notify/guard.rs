//! The SSRF guard: a notification target may not point the gateway at its
//! own machine, its network or a cloud's metadata service, unless the
//! operator allows it (`notifications.allow_private_targets`, which also
//! admits plain `http://`).
//!
//! Checked twice: when a target is created (its URL, and what its host
//! resolves to then), and at every delivery, where [`GuardedResolver`] is
//! the resolver of the outbox's HTTP client: it drops forbidden addresses
//! from every DNS answer, and the connection goes only to the addresses it
//! returned. A name that resolved to a public address at creation and to
//! 127.0.0.1 at delivery reaches nothing. Hosts written as IP addresses do
//! not go through a resolver: [`check_literal`] covers them at delivery, and
//! redirects are never followed. No proxy is used, not even one the
//! environment names: a proxy resolves the target itself, past the guard.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use reqwest::Url;

/// How long resolving a target's host at creation may take.
const RESOLVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

pub use crate::config::addresses::is_forbidden;

/// Why a target's URL is refused at creation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Not an `http(s)://` URL with a host, or one with credentials.
    Invalid(String),
    /// Plain `http://`, or a host that is or resolves to a forbidden
    /// address: what the operator's `allow_private_targets` decides.
    NotAllowed(String),
    /// The host does not resolve (in time), now.
    Unresolvable(String),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Invalid(why) | Refusal::NotAllowed(why) | Refusal::Unresolvable(why) => {
                f.write_str(why)
            }
        }
    }
}

/// Checks a target's URL at creation: `https://` (or `http://` when
/// allowed), a host, and (unless allowed) no forbidden address among what
/// the host resolves to now. The refusal says what is wrong.
pub async fn check_url(url: &str, allow_private: bool) -> Result<Url, Refusal> {
    let parsed = Url::parse(url).map_err(|e| Refusal::Invalid(format!("is not a URL ({e})")))?;
    match parsed.scheme() {
        "https" => {}
        "http" if allow_private => {}
        "http" => return Err(Refusal::NotAllowed("must be https:// (plain http:// only where the operator sets notifications.allow_private_targets)".into())),
        other => return Err(Refusal::Invalid(format!("scheme {other:?} is not https://"))),
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(Refusal::Invalid("must not carry credentials".into()));
    }
    let Some(host) = parsed.host_str() else {
        return Err(Refusal::Invalid("has no host".into()));
    };
    if allow_private {
        return Ok(parsed);
    }
    check_literal(&parsed).map_err(Refusal::NotAllowed)?;
    if let Some(url::Host::Domain(domain)) = parsed.host() {
        let port = parsed.port_or_known_default().unwrap_or(443);
        let lookup = tokio::net::lookup_host((domain, port));
        let addrs: Vec<SocketAddr> = tokio::time::timeout(RESOLVE_TIMEOUT, lookup)
            .await
            .map_err(|_| Refusal::Unresolvable(format!("host {host:?} did not resolve in time")))?
            .map_err(|e| Refusal::Unresolvable(format!("host {host:?} does not resolve ({e})")))?
            .collect();
        if let Some(bad) = addrs.iter().find(|a| is_forbidden(a.ip())) {
            return Err(Refusal::NotAllowed(format!(
                "host {host:?} resolves to {}, a private or local address",
                bad.ip()
            )));
        }
    }
    Ok(parsed)
}

/// At delivery: a host written as an IP address must not be forbidden
/// (names are checked by [`GuardedResolver`]).
pub fn check_literal(url: &Url) -> Result<(), String> {
    let ip = match url.host() {
        Some(url::Host::Ipv4(v4)) => IpAddr::V4(v4),
        Some(url::Host::Ipv6(v6)) => IpAddr::V6(v6),
        _ => return Ok(()),
    };
    if is_forbidden(ip) {
        return Err(format!("{ip} is a private or local address"));
    }
    Ok(())
}

type Lookup = Arc<
    dyn Fn(String) -> futures::future::BoxFuture<'static, std::io::Result<Vec<SocketAddr>>>
        + Send
        + Sync,
>;

/// A DNS resolver that answers only addresses the gateway may send to (all
/// of them when private targets are allowed).
#[derive(Clone)]
pub struct GuardedResolver {
    allow_private: bool,
    lookup: Lookup,
}

impl GuardedResolver {
    /// Resolves with the system's resolver.
    pub fn new(allow_private: bool) -> GuardedResolver {
        GuardedResolver::with_lookup(allow_private, |name| {
            Box::pin(async move { Ok(tokio::net::lookup_host((name, 0)).await?.collect()) })
        })
    }

    /// Resolves with `lookup` (tests: a DNS that answers what they want).
    pub fn with_lookup(
        allow_private: bool,
        lookup: impl Fn(String) -> futures::future::BoxFuture<'static, std::io::Result<Vec<SocketAddr>>>
            + Send
            + Sync
            + 'static,
    ) -> GuardedResolver {
        GuardedResolver {
            allow_private,
            lookup: Arc::new(lookup),
        }
    }

    /// What `name` resolves to, forbidden addresses left out; an error when
    /// none is left.
    pub async fn resolve_checked(&self, name: &str) -> std::io::Result<Vec<SocketAddr>> {
        let addrs = (self.lookup)(name.to_owned()).await?;
        if self.allow_private {
            return Ok(addrs);
        }
        let allowed: Vec<SocketAddr> = addrs
            .into_iter()
            .filter(|a| !is_forbidden(a.ip()))
            .collect();
        if allowed.is_empty() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!("{name} resolves only to private or local addresses"),
            ));
        }
        Ok(allowed)
    }
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let this = self.clone();
        let name = name.as_str().to_owned();
        Box::pin(async move {
            let addrs = this.resolve_checked(&name).await?;
            let addrs: reqwest::dns::Addrs = Box::new(addrs.into_iter());
            Ok(addrs)
        })
    }
}

/// The HTTP client every channel sends with (FCM's OAuth token requests
/// too): the guarded resolver, no proxy, no redirects, bounded time. A proxy
/// from the environment (`HTTPS_PROXY`, `ALL_PROXY`, …) would resolve the
/// target itself, and the resolver would see only the proxy: the client
/// never uses one.
pub fn client(allow_private: bool) -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .no_proxy()
        .dns_resolver(Arc::new(GuardedResolver::new(allow_private)))
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(std::time::Duration::from_secs(5))
        .timeout(super::http::TIMEOUT)
        .user_agent(concat!("acp-gateway/", env!("CARGO_PKG_VERSION")))
        .build()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn private_local_and_metadata_addresses_are_forbidden() {
        for bad in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "fd00:ec2::254",
            "fc00::1",
            "fe80::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "64:ff9b::a00:1",
        ] {
            assert!(is_forbidden(ip(bad)), "{bad}");
        }
        for good in ["93.184.216.34", "1.1.1.1", "2606:4700::1111", "100.128.0.1"] {
            assert!(!is_forbidden(ip(good)), "{good}");
        }
    }

    /// What the operator's setting decides is `NotAllowed`; what is no
    /// target URL at all is `Invalid`; a name with no address now is
    /// `Unresolvable`.
    #[tokio::test]
    async fn urls_are_refused_for_their_scheme_or_their_address() {
        let refusal = |url: &'static str, allow: bool| async move {
            match check_url(url, allow).await {
                Ok(_) => "ok",
                Err(Refusal::Invalid(_)) => "invalid",
                Err(Refusal::NotAllowed(_)) => "not allowed",
                Err(Refusal::Unresolvable(_)) => "unresolvable",
            }
        };
        for (url, allow, expected) in [
            ("http://example.com/x", false, "not allowed"),
            ("ftp://example.com/x", false, "invalid"),
            ("https://u:p@93.184.216.34/", false, "invalid"),
            ("https://u:p@93.184.216.34/", true, "invalid"),
            ("https://127.0.0.1/x", false, "not allowed"),
            ("https://[::1]/x", false, "not allowed"),
            ("https://169.254.169.254/", false, "not allowed"),
            ("https://localhost/x", false, "not allowed"),
            ("https://nothing.invalid/x", false, "unresolvable"),
            ("https://93.184.216.34/x", false, "ok"),
            ("http://127.0.0.1:9/x", true, "ok"),
            ("http://nothing.invalid/x", true, "ok"),
        ] {
            assert_eq!(
                refusal(url, allow).await,
                expected,
                "{url} (allowed: {allow})"
            );
        }
    }

    /// A DNS answer that changes between the check and the connection: the
    /// resolver the connection uses drops what it must not reach.
    #[tokio::test]
    async fn the_resolver_drops_forbidden_answers_whenever_they_come() {
        let answers = Arc::new(std::sync::Mutex::new(vec![ip("93.184.216.34")]));
        let dns = answers.clone();
        let resolver = GuardedResolver::with_lookup(false, move |_| {
            let ips = dns.lock().unwrap().clone();
            Box::pin(async move { Ok(ips.into_iter().map(|ip| SocketAddr::new(ip, 0)).collect()) })
        });
        assert_eq!(
            resolver.resolve_checked("rebind.test").await.unwrap(),
            vec![SocketAddr::new(ip("93.184.216.34"), 0)]
        );
        *answers.lock().unwrap() = vec![ip("127.0.0.1")];
        assert!(resolver.resolve_checked("rebind.test").await.is_err());
        *answers.lock().unwrap() = vec![ip("127.0.0.1"), ip("1.1.1.1")];
        assert_eq!(
            resolver.resolve_checked("rebind.test").await.unwrap(),
            vec![SocketAddr::new(ip("1.1.1.1"), 0)]
        );
    }

    /// A proxy in the gateway's environment is never used: it would resolve
    /// the target itself, past the guarded resolver (which would see only
    /// the proxy). The environment is the process's, shared by every test
    /// running beside this one: so the test runs itself again in a process
    /// of its own, with every proxy variable pointing at a listener here,
    /// and sends to a name that resolves to loopback. The listener is never
    /// connected to, and the send fails as without a proxy.
    #[test]
    fn a_proxy_in_the_environment_is_never_used() {
        const CHILD: &str = "ACP_GATEWAY_TEST_PROXY_CHILD";
        if std::env::var_os(CHILD).is_some() {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let sent = runtime.block_on(async {
                client(false)
                    .unwrap()
                    .get("http://localhost:9/")
                    .send()
                    .await
            });
            assert!(sent.is_err(), "refused by the guard: {sent:?}");
            return;
        }
        let proxy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", proxy.local_addr().unwrap());
        let connected = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = connected.clone();
        // Answers whatever connects (so that a client that does use it is
        // not left waiting), counting it first.
        std::thread::spawn(move || {
            use std::io::{Read, Write};
            for stream in proxy.incoming() {
                let Ok(mut stream) = stream else { return };
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let _ = stream.read(&mut [0u8; 4096]);
                let _ = stream.write_all(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\n\r\n");
            }
        });
        let name = concat!(module_path!(), "::a_proxy_in_the_environment_is_never_used");
        let name = name.split_once("::").unwrap().1;
        let mut child = std::process::Command::new(std::env::current_exe().unwrap());
        child
            .args([name, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD, "1")
            .env_remove("NO_PROXY")
            .env_remove("no_proxy")
            .env_remove("REQUEST_METHOD");
        for var in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"] {
            child.env(var, &url).env(var.to_lowercase(), &url);
        }
        let out = child.output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stdout}{stderr}");
        assert!(stdout.contains("1 passed"), "it ran: {stdout}");
        assert_eq!(
            connected.load(std::sync::atomic::Ordering::SeqCst),
            0,
            "the proxy was used"
        );
    }

    /// A real connection: a name resolving to 127.0.0.1 reaches a listener
    /// there only when private targets are allowed.
    #[tokio::test]
    async fn a_name_resolving_to_loopback_is_not_reached_unless_allowed() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            while let Ok((mut s, _)) = listener.accept().await {
                let mut request = [0u8; 4096];
                let _ = s.read(&mut request).await;
                let _ = s
                    .write_all(b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n")
                    .await;
            }
        });
        let url = format!("http://localhost:{port}/");
        let refused = client(false).unwrap().get(&url).send().await;
        assert!(refused.is_err(), "{refused:?}");
        let allowed = client(true).unwrap().get(&url).send().await.unwrap();
        assert_eq!(allowed.status(), 204);
    }
}
