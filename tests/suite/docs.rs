//! The README and the manual under `docs/` stay true and whole: the
//! configuration reference in `docs/configuration.md` is one the gateway
//! accepts and sets every key its config types have; the code
//! `docs/clients.md` shows is the code `scripts/docs-examples` runs; the
//! README stays a short front door that links every page of the manual;
//! every link leads to a file (and heading) inside the repository; and
//! `docs/architecture.md` names every module of the crate.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use acp_gateway::config::{AgentProfile, Config, RateLimits};
use acp_gateway::model::{PolicyRule, RateLimit};
use serde_aux::serde_introspection::serde_introspect;

fn doc(name: &str) -> String {
    std::fs::read_to_string(root().join("docs").join(name)).unwrap()
}

/// The first fenced block of `lang` after the heading `heading`.
fn block(text: &str, heading: &str, lang: &str) -> String {
    let from = text
        .find(heading)
        .unwrap_or_else(|| panic!("no {heading:?}"));
    let fence = format!("```{lang}\n");
    let start = text[from..].find(&fence).expect("a fenced block") + from + fence.len();
    let end = text[start..].find("\n```").unwrap() + start;
    text[start..=end].to_owned()
}

fn keys(table: &toml::Value) -> Vec<String> {
    table.as_table().unwrap().keys().cloned().collect()
}

fn assert_all_set(what: &str, set: &[String], fields: &[&str]) {
    let missing: Vec<&&str> = fields
        .iter()
        .filter(|f| !set.iter().any(|k| k == **f))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/configuration.md: {what} leaves out {missing:?}"
    );
}

#[test]
fn the_configuration_reference_is_accepted_and_complete() {
    let text = block(
        &doc("configuration.md"),
        "## Configuration reference",
        "toml",
    );
    let config = Config::parse(&text).expect("the reference parses");
    config.validate().expect("the reference validates");
    let raw: toml::Value = toml::from_str(&text).unwrap();
    assert_all_set("the top level", &keys(&raw), serde_introspect::<Config>());
    assert_all_set(
        "rate_limits",
        &keys(&raw["rate_limits"]),
        serde_introspect::<RateLimits>(),
    );
    // A spawned agent's keys and a remote one's are never in one profile:
    // every key is in one of the reference's profiles.
    let agent_keys: Vec<String> = raw["agents"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(keys)
        .collect();
    assert_all_set(
        "[[agents]]",
        &agent_keys,
        serde_introspect::<AgentProfile>(),
    );
    assert_all_set(
        "[[policies]]",
        &keys(&raw["policies"][0]),
        serde_introspect::<PolicyRule>(),
    );
    assert_all_set(
        "[[budgets]]",
        &keys(&raw["budgets"][0]),
        serde_introspect::<acp_gateway::config::Budget>(),
    );
    assert_all_set(
        "max_auto_per",
        &keys(&raw["policies"][0]["max_auto_per"]),
        serde_introspect::<RateLimit>(),
    );
}

#[test]
fn the_client_examples_are_the_files_ci_runs() {
    let guide = doc("clients.md");
    for (heading, lang, file) in [
        ("## A minimal client in JavaScript", "js", "events.mjs"),
        ("## A minimal client in Dart", "dart", "events.dart"),
    ] {
        let shown = block(&guide, heading, lang);
        let file = doc(&format!("examples/{file}"));
        assert_eq!(
            shown.trim_end(),
            file.trim_end(),
            "docs/clients.md {heading} is not docs/examples/…"
        );
    }
}

/// The repository's root.
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The Markdown files whose links must hold, relative to the root: the
/// README, every page under `docs/`, and the other READMEs.
fn guides() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path.strip_prefix(root()).unwrap().to_owned());
            }
        }
    }
    let mut files = vec![
        PathBuf::from("README.md"),
        PathBuf::from("deploy/README.md"),
        PathBuf::from("web/vendor/README.md"),
    ];
    walk(&root().join("docs"), &mut files);
    files
}

/// The manual's pages: every Markdown file under `docs/` but the examples.
fn manual_pages() -> Vec<PathBuf> {
    guides()
        .into_iter()
        .filter(|p| p.starts_with("docs") && !p.starts_with("docs/examples"))
        .collect()
}

/// A Markdown text's lines, those inside fenced code blocks (and their
/// fences) as `None`.
fn outside_fences(text: &str) -> Vec<Option<&str>> {
    let mut fence: Option<String> = None;
    let mut out = Vec::new();
    for line in text.lines() {
        let trimmed = line.trim_start();
        let marker: String = trimmed
            .chars()
            .take_while(|c| *c == '`' || *c == '~')
            .collect();
        match &fence {
            Some(open) => {
                if trimmed.starts_with(open.as_str()) && trimmed.trim_end() == marker {
                    fence = None;
                }
                out.push(None);
            }
            None if marker.len() >= 3 => {
                fence = Some(marker);
                out.push(None);
            }
            None => out.push(Some(line)),
        }
    }
    out
}

/// A Markdown text without its fenced code blocks and inline code spans
/// (what is shown as code links nothing), line by line.
fn prose(text: &str) -> Vec<String> {
    outside_fences(text)
        .into_iter()
        .map(|line| line.map(without_code_spans).unwrap_or_default())
        .collect()
}

/// A line without its code spans: a run of backticks up to the next run of
/// as many.
fn without_code_spans(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        out.push_str(&rest[..start]);
        let ticks = rest[start..].chars().take_while(|c| *c == '`').count();
        let after = &rest[start + ticks..];
        let mut closing = None;
        let mut at = 0;
        while let Some(i) = after[at..].find('`') {
            let run = after[at + i..].chars().take_while(|c| *c == '`').count();
            if run == ticks {
                closing = Some(at + i);
                break;
            }
            at += i + run;
        }
        match closing {
            Some(end) => rest = &after[end + ticks..],
            None => {
                out.push_str(&rest[start..start + ticks]);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// Every link target in a Markdown text (`[text](target)`, images alike,
/// `[name]: target` definitions and `<scheme:…>` autolinks), with its line
/// number.
fn links(text: &str) -> Vec<(usize, String)> {
    let forms = [
        r#"\]\(\s*<?([^)\s>]*)>?(?:\s+"[^"]*")?\s*\)"#,
        r"^\s{0,3}\[[^\]]+\]:\s*<?([^\s>]+)",
        r"<([A-Za-z][A-Za-z0-9+.-]*:[^>\s]*)>",
    ]
    .map(|form| regex::Regex::new(form).unwrap());
    let mut found = Vec::new();
    for (n, line) in prose(text).iter().enumerate() {
        for form in &forms {
            for target in form.captures_iter(line) {
                found.push((n + 1, target[1].to_owned()));
            }
        }
    }
    found
}

/// The anchors of a Markdown text's headings, as GitHub makes them: the
/// heading's text in lower case, without punctuation, spaces as hyphens,
/// and `-1`, `-2`, … after a repeated one.
fn anchors(text: &str) -> Vec<String> {
    let link = regex::Regex::new(r"\[([^\]]*)\]\([^)]*\)").unwrap();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut found = Vec::new();
    for line in outside_fences(text).into_iter().flatten() {
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let title = link.replace_all(line[hashes..].trim().trim_end_matches('#').trim(), "$1");
        let slug: String = title
            .to_lowercase()
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                _ => None,
            })
            .collect();
        let count = seen.entry(slug.clone()).or_insert(0);
        found.push(if *count == 0 {
            slug
        } else {
            format!("{slug}-{count}")
        });
        *count += 1;
    }
    found
}

/// Where a link in `file` leads, relative to the root; `Err` says why it
/// leads nowhere inside the repository.
fn resolve(file: &Path, target: &str) -> Result<(PathBuf, Option<String>), String> {
    if target.contains("://") || target.starts_with("mailto:") || target.starts_with("//") {
        return Err("points outside the repository".into());
    }
    if target.starts_with('/') {
        return Err("is absolute: write it relative to the file".into());
    }
    let (path, anchor) = match target.split_once('#') {
        Some((path, anchor)) => (path, Some(anchor.to_owned())),
        None => (target, None),
    };
    let mut resolved = PathBuf::new();
    let joined = if path.is_empty() {
        file.to_owned()
    } else {
        file.parent().unwrap().join(path)
    };
    for part in joined.components() {
        match part {
            Component::ParentDir => {
                if !resolved.pop() {
                    return Err("leads out of the repository".into());
                }
            }
            Component::CurDir => {}
            other => resolved.push(other),
        }
    }
    if !root().join(&resolved).exists() {
        return Err(format!(
            "names {}, which does not exist",
            resolved.display()
        ));
    }
    Ok((resolved, anchor))
}

#[test]
fn the_readme_is_a_short_front_door_to_every_page_of_the_manual() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(
        lines <= 250,
        "README.md has {lines} lines: the manual is docs/"
    );
    let linked: Vec<PathBuf> = links(&readme)
        .into_iter()
        .filter_map(|(_, target)| resolve(Path::new("README.md"), &target).ok())
        .map(|(path, _)| path)
        .collect();
    let pages = manual_pages();
    assert!(pages.len() > 5, "the manual's pages: {pages:?}");
    for page in pages {
        assert!(
            linked.contains(&page),
            "README.md does not link {}",
            page.display()
        );
    }
}

#[test]
fn every_link_of_the_guides_leads_to_a_file_and_heading_in_the_repository() {
    let mut broken = Vec::new();
    for file in guides() {
        let text = std::fs::read_to_string(root().join(&file)).unwrap();
        for (line, target) in links(&text) {
            let why = match resolve(&file, &target) {
                Err(why) => why,
                Ok((_, None)) => continue,
                Ok((path, Some(anchor))) => {
                    let is_markdown = path.extension().is_some_and(|e| e == "md");
                    let target_text = std::fs::read_to_string(root().join(&path));
                    match target_text {
                        Ok(t) if is_markdown && anchors(&t).contains(&anchor) => continue,
                        _ => format!("has no heading #{anchor} in {}", path.display()),
                    }
                }
            };
            broken.push(format!("{}:{line}: ({target}) {why}", file.display()));
        }
        // A bare address outside code is a link too (GitHub makes it one).
        for (n, line) in prose(&text).iter().enumerate() {
            if line.contains("http://") || line.contains("https://") {
                broken.push(format!(
                    "{}:{}: an address outside code",
                    file.display(),
                    n + 1
                ));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "links that lead nowhere:\n{}",
        broken.join("\n")
    );
}

#[test]
fn the_link_reader_finds_links_and_anchors_as_github_does() {
    let text = "# The `acp-gateway` API: an overview\n## Notes\n## Notes\n\
        ```md\n# not a heading [x](nowhere.md)\n```\n\
        See [a](docs/a.md#b), ![i](web/i.png), `[code](not-a-link)`, <https://x.example>.\n";
    assert_eq!(
        anchors(text),
        ["the-acp-gateway-api-an-overview", "notes", "notes-1"]
    );
    let targets: Vec<String> = links(text).into_iter().map(|(_, t)| t).collect();
    assert_eq!(targets, ["docs/a.md#b", "web/i.png", "https://x.example"]);
    assert!(resolve(Path::new("docs/x.md"), "../../etc/passwd").is_err());
    assert!(resolve(Path::new("docs/x.md"), "https://example.com").is_err());
    assert!(resolve(Path::new("docs/x.md"), "api.md").is_ok());
    assert!(resolve(Path::new("docs/x.md"), "../README.md#quick-start").is_ok());
}

/// `docs/architecture.md`'s module map names every top-level module of
/// `src/` (as `src/name.rs` or `src/name/`), as `src/lib.rs`'s map does, and
/// the page follows both ways data flows.
#[test]
fn the_architecture_page_names_every_module() {
    let page = doc("architecture.md");
    for flow in [
        "## From the agent to a WebSocket",
        "## From a REST request to the agent",
    ] {
        assert!(page.contains(flow), "docs/architecture.md has no {flow:?}");
    }
    for name in crate::architecture::top_level_modules() {
        assert!(
            page.contains(&format!("src/{name}.rs")) || page.contains(&format!("src/{name}/")),
            "docs/architecture.md does not name src/{name}"
        );
    }
}
