//! Where a remote agent is, through the address guard, and the TLS its
//! connections use. The guard is the one notification targets go through
//! ([`crate::config::addresses`]): the host is resolved here, the
//! forbidden addresses dropped from the answer (unless the profile's
//! `allow_private`), and the connection made only to what is left. TLS
//! checks the agent's certificate against the web's root certificates and
//! the profile's `ca_file`.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use anyhow::{bail, Context};

use crate::config::AgentProfile;

/// Where a remote agent is: its url, the name TLS checks (the host), the
/// addresses the guard admits, and whether the url asks for TLS.
pub(super) struct Target {
    pub(super) url: ::url::Url,
    pub(super) name: String,
    pub(super) addresses: Vec<SocketAddr>,
    pub(super) tls: bool,
}

/// The profile's url resolved through the address guard: plain
/// `ws://`/`http://` and forbidden addresses only with `allow_private`.
pub(super) async fn target(profile: &AgentProfile) -> anyhow::Result<Target> {
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
pub(super) fn tls_config(profile: &AgentProfile) -> anyhow::Result<rustls::ClientConfig> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
