//! What a database URL names: which backend serves it and, for SQLite, which
//! file; and how it reads in logs. The one place the gateway reads a
//! database URL: the config, the store, the cluster and the app ask here.

use std::path::PathBuf;
use std::str::FromStr;

use anyhow::Context;

/// The schemes a database URL may start with.
const POSTGRES: [&str; 2] = ["postgres://", "postgresql://"];
const SQLITE: &str = "sqlite:";

/// The database behind a URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// `postgres://…` or `postgresql://…`: shared by every gateway node on it.
    Postgres,
    /// `sqlite://PATH` (or `sqlite::memory:`): one gateway node.
    Sqlite,
}

impl Backend {
    /// The backend `url` names, or an error saying which URLs are known.
    pub fn of(url: &str) -> anyhow::Result<Backend> {
        if url.starts_with(SQLITE) {
            Ok(Backend::Sqlite)
        } else if POSTGRES.iter().any(|scheme| url.starts_with(scheme)) {
            Ok(Backend::Postgres)
        } else {
            anyhow::bail!("unsupported database URL {url:?}: use postgres://… or sqlite://PATH")
        }
    }
}

/// The file a SQLite URL names; `None` for an in-memory database (or one
/// without a file name).
pub fn sqlite_file(url: &str) -> anyhow::Result<Option<PathBuf>> {
    if url.contains(":memory:") || url.contains("mode=memory") {
        return Ok(None);
    }
    let options = sqlx::sqlite::SqliteConnectOptions::from_str(url)
        .with_context(|| format!("Invalid SQLite URL {url:?}"))?;
    let file = options.get_filename();
    if file.as_os_str().is_empty() {
        return Ok(None);
    }
    Ok(Some(PathBuf::from(file.as_os_str())))
}

/// A database URL without its password, for logs.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let userinfo = &url[scheme_end + 3..at];
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{}{}:***{}", &url[..scheme_end + 3], user, &url[at..])
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_their_backend() {
        for url in ["postgres://db/x", "postgresql://u:p@db/x"] {
            assert_eq!(Backend::of(url).unwrap(), Backend::Postgres, "{url}");
        }
        for url in ["sqlite://x.db", "sqlite:///abs/x.db", "sqlite::memory:"] {
            assert_eq!(Backend::of(url).unwrap(), Backend::Sqlite, "{url}");
        }
        let err = Backend::of("mysql://db/x").unwrap_err().to_string();
        assert!(err.contains("unsupported database URL"), "{err}");
        assert!(Backend::of("postgres:/db").is_err());
    }

    #[test]
    fn sqlite_urls_name_their_file() {
        assert_eq!(
            sqlite_file("sqlite://data/g.db").unwrap(),
            Some(PathBuf::from("data/g.db"))
        );
        assert_eq!(sqlite_file("sqlite::memory:").unwrap(), None);
        assert_eq!(sqlite_file("sqlite://x.db?mode=memory").unwrap(), None);
    }

    #[test]
    fn redacted_urls_keep_no_password() {
        assert_eq!(
            redact_url("postgres://gw:pw@db/gw"),
            "postgres://gw:***@db/gw"
        );
        assert_eq!(redact_url("sqlite://x.db"), "sqlite://x.db");
    }
}
