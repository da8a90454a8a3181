//! The built-in web client (`web/` in the repository), served at `/`: the
//! permission inbox, conversations and a conversation's live view, as plain
//! HTML, CSS and JavaScript modules embedded in the binary. No build step,
//! no CDN: the files in `web/` are what browsers get.

use std::sync::OnceLock;

use axum::extract::Path;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use sha2::{Digest, Sha256};

/// One embedded file.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

/// `asset!("app.js", "text/javascript")`: web/app.js, served as that type
/// (text in UTF-8); `asset!(binary "icon.png", "image/png")` as it is.
macro_rules! asset {
    ($name:literal, $type:literal) => {
        Asset {
            name: $name,
            content_type: concat!($type, "; charset=utf-8"),
            body: include_str!(concat!("../web/", $name)).as_bytes(),
        }
    };
    (binary $name:literal, $type:literal) => {
        Asset {
            name: $name,
            content_type: $type,
            body: include_bytes!(concat!("../web/", $name)),
        }
    };
}

const ASSETS: &[Asset] = &[
    asset!("index.html", "text/html"),
    asset!("app.css", "text/css"),
    asset!("app.js", "text/javascript"),
    asset!("api.js", "text/javascript"),
    asset!("dom.js", "text/javascript"),
    asset!("live.js", "text/javascript"),
    asset!("render.js", "text/javascript"),
    asset!("question.js", "text/javascript"),
    asset!("changes.js", "text/javascript"),
    asset!("usage.js", "text/javascript"),
    asset!("members.js", "text/javascript"),
    asset!("markdown.js", "text/javascript"),
    asset!("notify.js", "text/javascript"),
    // Share links: the owner's control, and the read-only page.
    asset!("sharing.js", "text/javascript"),
    asset!("shared.html", "text/html"),
    asset!("shared.js", "text/javascript"),
    asset!("sw.js", "text/javascript"),
    // Installing it to a home screen.
    asset!("manifest.webmanifest", "application/manifest+json"),
    asset!(binary "icon-192.png", "image/png"),
    asset!(binary "icon-512.png", "image/png"),
    asset!(binary "icon-maskable-512.png", "image/png"),
    // Markdown, safely (see web/vendor/README.md).
    asset!("vendor/marked.esm.js", "text/javascript"),
    asset!("vendor/purify.es.mjs", "text/javascript"),
];

/// The names of the embedded files (for the test that every file in `web/`
/// is served).
pub fn asset_names() -> impl Iterator<Item = &'static str> {
    ASSETS.iter().map(|asset| asset.name)
}

/// Only this origin's scripts (the service worker among them), styles,
/// connections and manifest; no framing.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; manifest-src 'self'; base-uri 'none'; form-action 'self'; \
                   frame-ancestors 'none'";

/// `GET /` (the page), `GET /s/{token}` (a share link's read-only page) and
/// `GET /ui/{file}` (what they load).
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(|headers: HeaderMap| async move { serve("index.html", &headers) }))
        // A share link's read-only page: the same for every token (the
        // page asks the API, which answers 404 for one that does not work).
        .route(
            "/s/{token}",
            get(|headers: HeaderMap| async move { serve("shared.html", &headers) }),
        )
        // At the root, so that its scope is the whole app.
        .route("/sw.js", get(|headers: HeaderMap| async move { serve("sw.js", &headers) }))
        .route(
            "/ui/{file}",
            get(|Path(file): Path<String>, headers: HeaderMap| async move {
                serve(&file, &headers)
            }),
        )
        .route(
            "/ui/vendor/{file}",
            get(|Path(file): Path<String>, headers: HeaderMap| async move {
                serve(&format!("vendor/{file}"), &headers)
            }),
        )
}

fn etags() -> &'static [String] {
    static TAGS: OnceLock<Vec<String>> = OnceLock::new();
    TAGS.get_or_init(|| {
        ASSETS
            .iter()
            .map(|asset| {
                let digest = Sha256::digest(asset.body);
                let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
                format!("\"{hex}\"")
            })
            .collect()
    })
}

fn serve(name: &str, headers: &HeaderMap) -> Response {
    let Some(index) = ASSETS.iter().position(|asset| asset.name == name) else {
        return (StatusCode::NOT_FOUND, "no such file\n").into_response();
    };
    let asset = &ASSETS[index];
    let etag = &etags()[index];
    let common = [
        // Asked again each time, answered 304 while unchanged: a new
        // gateway's client is picked up at once.
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        (header::ETAG, HeaderValue::from_str(etag).expect("hex")),
        (
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ),
        (
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CSP),
        ),
        (
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        ),
    ];
    let unchanged = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|tag| tag.trim() == etag));
    if unchanged {
        return (StatusCode::NOT_MODIFIED, common).into_response();
    }
    (
        common,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static(asset.content_type),
        )],
        asset.body,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    /// The service worker keeps the whole app shell: every file the page
    /// loads is in its list (so the app opens with the gateway unreachable).
    #[test]
    fn the_service_worker_caches_every_file_of_the_shell() {
        let worker = std::str::from_utf8(
            super::ASSETS
                .iter()
                .find(|a| a.name == "sw.js")
                .unwrap()
                .body,
        )
        .unwrap();
        let shell = &worker[worker.find("const SHELL = [").unwrap()..];
        let shell = &shell[..shell.find("];").unwrap()];
        assert!(shell.contains("\"/\""));
        for asset in super::ASSETS {
            if asset.name == "sw.js" || asset.name == "index.html" {
                continue;
            }
            let url = format!("\"/ui/{}\"", asset.name);
            assert!(shell.contains(&url), "sw.js does not cache {url}");
        }
    }

    /// What `web/` holds is what is served: no file left out, none stale
    /// (the vendored files' README and licences are for people, not
    /// browsers).
    #[test]
    fn every_file_in_web_is_embedded() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("web");
        let mut on_disk = Vec::new();
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let files: Vec<_> = match std::fs::read_dir(&path) {
                Ok(inner) => inner.map(|e| e.unwrap().path()).collect(),
                Err(_) => vec![path],
            };
            for file in files {
                let name = file.file_name().unwrap().to_string_lossy().into_owned();
                if name == "README.md" || name.ends_with(".LICENSE") {
                    continue;
                }
                let rel = file.strip_prefix(&dir).unwrap();
                on_disk.push(rel.to_string_lossy().into_owned());
            }
        }
        on_disk.sort();
        let mut served: Vec<String> = super::asset_names().map(str::to_owned).collect();
        served.sort();
        assert_eq!(on_disk, served);
    }
}
