//! A real agent's own sessions through the gateway: Qwen Code over stdio
//! (`qwen --acp`, installed by `tests/sdk-agents/install.sh`), which offers
//! `session/list`, `session/load` and `session/resume` but not
//! `session/fork`. Its model is the scripted fake of `qwen_serve.rs`, so
//! everything runs offline; its settings come from the profile's
//! `home_template` into each user's home. Skipped, saying so, where qwen is
//! not installed, unless `ACP_GATEWAY_REQUIRE_QWEN` is set.

use std::path::{Path, PathBuf};

use crate::common::*;
use crate::qwen_serve::{qwen_bin, FakeModel};
use acp_gateway::config::AgentProfile;
use serde_json::{json, Value};

/// `qwen --acp` as a profile: its settings (OpenAI-compatible auth, no
/// update checks or telemetry) in `template`, its model `model`, its
/// conversations in `work`.
fn qwen_profile(bin: &Path, model: &FakeModel, template: &Path, work: &Path) -> AgentProfile {
    let settings = template.join(".qwen");
    std::fs::create_dir_all(&settings).unwrap();
    let settings_json = json!({
        "$version": 4,
        "security": {"auth": {"selectedType": "openai"}},
        "tools": {"approvalMode": "default"},
        "general": {"enableAutoUpdate": false},
        "privacy": {"usageStatisticsEnabled": false},
        "telemetry": {"enabled": false},
    });
    std::fs::write(settings.join("settings.json"), settings_json.to_string()).unwrap();
    let mut agent = profile("qwen", bin.to_str().unwrap(), &["--acp"]);
    agent.startup_timeout = std::time::Duration::from_secs(60);
    agent.home_template = Some(template.to_path_buf());
    agent.cwd = Some(work.to_path_buf());
    agent.allowed_roots = vec![work.to_path_buf()];
    agent
        .read_only_paths
        .push(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/real-agents/node_modules"));
    for (k, v) in [
        ("OPENAI_API_KEY", "sk-fake".to_owned()),
        ("OPENAI_BASE_URL", model.base_url()),
        ("OPENAI_MODEL", "fake-model".to_owned()),
        ("NO_COLOR", "1".to_owned()),
    ] {
        agent.env.insert(k.into(), v);
    }
    agent
}

fn said(messages: &Value) -> Vec<(String, String)> {
    messages["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let text = m["content"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|b| b["text"].as_str())
                .collect::<String>();
            (m["role"].as_str().unwrap().to_owned(), text)
        })
        .collect()
}

#[tokio::test]
async fn qwens_sessions_are_listed_and_one_is_taken_over_with_its_history() {
    let Some(bin) = qwen_bin() else {
        return;
    };
    let db = match TestDb::postgres().await {
        Some(db) => db,
        None => TestDb::sqlite().await,
    };
    let model = FakeModel::start().await;
    let template = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let work: PathBuf = dir.path().canonicalize().unwrap();
    let gw = TestGateway::start(
        &db,
        vec![qwen_profile(&bin, &model, template.path(), &work)],
    )
    .await;

    let created = gw.create_conversation("qwen").await;
    let id = created["id"].as_str().unwrap().to_owned();
    let session = created["acp_session_id"].as_str().unwrap().to_owned();
    assert_eq!(
        created["session_capabilities"],
        json!({"load": true, "resume": true, "list": true, "fork": false, "close": false})
    );
    let mut ws = gw.conversation_ws(&id, 0).await;
    gw.prompt(&id, "hello qwen").await;
    let frames = ws.until_type("turn_ended").await;
    assert_eq!(
        streamed_text(&frames, "agent_message_chunk"),
        "Hello from the fake model."
    );
    // It cannot fork.
    let problem = assert_problem(
        gw.post(&format!("/api/v1/conversations/{id}/fork"), json!({}))
            .await,
        409,
        "session/fork",
    );
    assert_eq!(problem["code"], "not_supported");

    // Listed, held by the conversation.
    let path = format!("/api/v1/agents/qwen/sessions?cwd={}", work.display());
    let (status, page) = gw.get(&path).await;
    assert_eq!(status, 200, "{page}");
    let listed = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["session_id"] == session.as_str())
        .cloned()
        .unwrap_or_else(|| panic!("{session} in {page}"));
    assert_eq!(listed["cwd"], json!(work));
    assert_eq!(listed["held_by"], id.as_str());
    assert!(listed["updated_at"].is_string(), "{listed}");
    let adopt = json!({"agent": "qwen", "cwd": work, "adopt": session});
    let problem = assert_problem(
        gw.post("/api/v1/conversations", adopt.clone()).await,
        409,
        "",
    );
    assert_eq!(problem["code"], "already_held");

    // Closed, it is free: taken over, with its history loaded.
    let (status, _) = gw.delete(&format!("/api/v1/conversations/{id}")).await;
    assert_eq!(status, 204);
    ws.until_agent_gone().await;
    let (status, adopted) = gw.post("/api/v1/conversations", adopt).await;
    assert_eq!(status, 201, "{adopted}");
    let taken = adopted["id"].as_str().unwrap().to_owned();
    assert_eq!(adopted["adopted_session"], session.as_str());
    let mut ws = gw.conversation_ws(&taken, 0).await;
    ws.until(|e| e["data"]["update"]["sessionUpdate"] == "agent_message_chunk")
        .await;
    let (_, messages) = gw
        .get(&format!("/api/v1/conversations/{taken}/messages"))
        .await;
    let history = said(&messages);
    assert!(
        history.contains(&("user".to_owned(), "hello qwen".to_owned())),
        "{history:?}"
    );
    // And it goes on there.
    let last = gw.conversation(&taken).await["last_seq"].as_i64().unwrap();
    let mut ws = gw.conversation_ws(&taken, last).await;
    gw.prompt(&taken, "again").await;
    let frames = ws.until_type("turn_ended").await;
    assert_eq!(
        streamed_text(&frames, "agent_message_chunk"),
        "Hello from the fake model."
    );
    gw.stop().await;
    model.stop().await;
}
