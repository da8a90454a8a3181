//! The README's quick start, as a newcomer runs it: `acp-gateway serve` with
//! no configuration, from an empty directory. Its state goes where the XDG
//! convention says (else `./data/`), never inside the demo agent's box, and
//! the first start warns only about the operator's own choices.

use std::path::Path;

use crate::common::*;

/// The warnings a first start may give: about running as root (the tests
/// do), and about serving with no tokens (open mode).
fn unexpected_warnings(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|line| line.contains(" WARN "))
        .filter(|line| {
            !line.contains("the gateway runs as root") && !line.contains("no tokens exist")
        })
        .collect()
}

/// Stops the gateway (Ctrl-C) and checks what it logged: no word of its
/// state inside a box, no warning but those [`unexpected_warnings`] allows.
fn stops_having_warned_only_of_the_operators_choices(gw: GatewayProcess) {
    let (_, log) = gw.interrupt();
    assert!(!log.contains("the gateway's state (database"), "{log}");
    let unexpected = unexpected_warnings(&log);
    assert!(unexpected.is_empty(), "{unexpected:#?}");
}

/// What the demo agent's `probe` says about `path`, from inside its box
/// (`ws` follows the conversation).
async fn probe(gw: &GatewayProcess, ws: &mut Ws, conversation: &str, path: &Path) -> String {
    gw.prompt(conversation, &format!("probe {}", path.display()))
        .await;
    let events = ws.until_type("turn_ended").await;
    assert_eq!(
        events.last().unwrap()["data"]["stop_reason"],
        "end_turn",
        "{events:?}"
    );
    streamed_text(&events, "agent_message_chunk")
}

/// Asserts the probe found `path` neither readable nor writable.
fn assert_denied(said: &str, path: &Path) {
    for access in ["read", "write"] {
        let line = format!("{access} {}: ", path.display());
        let outcome = said
            .lines()
            .find_map(|l| l.strip_prefix(&line))
            .unwrap_or_else(|| panic!("no {access} outcome in {said:?}"));
        assert!(outcome.contains("Permission denied"), "{said}");
    }
}

#[tokio::test]
async fn a_first_start_keeps_its_state_in_the_xdg_data_home_out_of_the_demo_agents_reach() {
    let here = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let data_home = tempfile::tempdir().unwrap();
    let gw = GatewayProcess::quick_start(
        here.path(),
        &[
            ("HOME", home.path().to_str()),
            ("XDG_DATA_HOME", data_home.path().to_str()),
        ],
    );
    let state = data_home.path().join("acp-gateway");
    let db = state.join("acp-gateway.db");
    assert!(db.is_file(), "{}: {}", db.display(), gw.log_text());
    // Nothing in the working directory, nothing in $HOME.
    assert_eq!(std::fs::read_dir(here.path()).unwrap().count(), 0);
    assert_eq!(std::fs::read_dir(home.path()).unwrap().count(), 0);

    let conv = gw.create_conversation("demo").await;
    let id = conv["id"].as_str().unwrap();
    let mut ws = gw.conversation_ws(id, 0).await;
    assert_eq!(
        conv["cwd"],
        here.path().canonicalize().unwrap().to_str().unwrap()
    );
    // The demo agent's box: its cwd it may touch, the database it may not.
    let mine = here.path().join("notes.txt");
    std::fs::write(&mine, "the agent's own").unwrap();
    let said = probe(&gw, &mut ws, id, &mine).await;
    assert!(
        said.contains(&format!("read {}: ok", mine.display()))
            && said.contains(&format!("write {}: ok", mine.display())),
        "{said}"
    );
    assert_denied(&probe(&gw, &mut ws, id, &db).await, &db);

    stops_having_warned_only_of_the_operators_choices(gw);
}

#[tokio::test]
async fn without_xdg_data_home_the_state_goes_to_home_local_share() {
    let here = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let gw = GatewayProcess::quick_start(
        here.path(),
        &[("HOME", home.path().to_str()), ("XDG_DATA_HOME", Some(""))],
    );
    let db = home.path().join(".local/share/acp-gateway/acp-gateway.db");
    assert!(db.is_file(), "{}: {}", db.display(), gw.log_text());
    assert_eq!(std::fs::read_dir(here.path()).unwrap().count(), 0);
    stops_having_warned_only_of_the_operators_choices(gw);
}

/// Neither variable usable (`HOME` a file, `XDG_DATA_HOME` relative): the
/// state goes to `./data/`, and the demo agent works in a directory of its
/// own there, not in the working directory that holds the state.
#[tokio::test]
async fn with_no_usable_data_home_the_state_goes_to_data_and_the_demo_agent_elsewhere() {
    let here = tempfile::tempdir().unwrap();
    let not_a_dir = tempfile::NamedTempFile::new().unwrap();
    let gw = GatewayProcess::quick_start(
        here.path(),
        &[
            ("HOME", not_a_dir.path().to_str()),
            ("XDG_DATA_HOME", Some("relative/data")),
        ],
    );
    let state = here.path().canonicalize().unwrap().join("data");
    let db = state.join("acp-gateway.db");
    assert!(db.is_file(), "{}: {}", db.display(), gw.log_text());
    assert!(!here.path().join("relative").exists());

    let conv = gw.create_conversation("demo").await;
    let id = conv["id"].as_str().unwrap();
    let mut ws = gw.conversation_ws(id, 0).await;
    let cwd = Path::new(conv["cwd"].as_str().unwrap()).to_owned();
    assert!(
        !state.starts_with(&cwd),
        "the demo agent's cwd {} holds the state {}",
        cwd.display(),
        state.display()
    );
    assert_denied(&probe(&gw, &mut ws, id, &db).await, &db);

    stops_having_warned_only_of_the_operators_choices(gw);
}

/// A `./data/acp-gateway.db` an earlier version made (its default) is kept,
/// not replaced by an empty database in the XDG data directory; the demo
/// agent then works beside it, not in the directory holding it.
#[tokio::test]
async fn a_database_an_earlier_version_made_in_data_is_kept_out_of_the_demo_agents_reach() {
    let here = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir(here.path().join("data")).unwrap();
    // An empty file is an empty SQLite database.
    std::fs::write(here.path().join("data/acp-gateway.db"), "").unwrap();
    let gw = GatewayProcess::quick_start(
        here.path(),
        &[("HOME", home.path().to_str()), ("XDG_DATA_HOME", None)],
    );
    assert!(
        gw.log_text()
            .contains("database=sqlite://data/acp-gateway.db"),
        "{}",
        gw.log_text()
    );
    assert!(!home.path().join(".local/share/acp-gateway").exists());
    let db = here
        .path()
        .canonicalize()
        .unwrap()
        .join("data/acp-gateway.db");
    let conv = gw.create_conversation("demo").await;
    let id = conv["id"].as_str().unwrap();
    let mut ws = gw.conversation_ws(id, 0).await;
    assert_denied(&probe(&gw, &mut ws, id, &db).await, &db);
    stops_having_warned_only_of_the_operators_choices(gw);
}
