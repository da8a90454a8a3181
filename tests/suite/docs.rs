//! The guides under `docs/` stay true: the configuration reference in
//! `docs/configuration.md` is one the gateway accepts and sets every key its
//! config types have, and the code `docs/clients.md` shows is the code
//! `scripts/docs-examples` runs.

use std::path::Path;

use acp_gateway::config::{AgentProfile, Config, RateLimits};
use acp_gateway::model::{PolicyRule, RateLimit};
use serde_aux::serde_introspection::serde_introspect;

fn doc(name: &str) -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("docs")
            .join(name),
    )
    .unwrap()
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
    let text = block(&doc("configuration.md"), "## Configuration reference", "toml");
    let config = Config::parse(&text).expect("the reference parses");
    config.validate().expect("the reference validates");
    let raw: toml::Value = toml::from_str(&text).unwrap();
    assert_all_set("the top level", &keys(&raw), serde_introspect::<Config>());
    assert_all_set(
        "rate_limits",
        &keys(&raw["rate_limits"]),
        serde_introspect::<RateLimits>(),
    );
    assert_all_set(
        "[[agents]]",
        &keys(&raw["agents"][0]),
        serde_introspect::<AgentProfile>(),
    );
    assert_all_set(
        "[[policies]]",
        &keys(&raw["policies"][0]),
        serde_introspect::<PolicyRule>(),
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
