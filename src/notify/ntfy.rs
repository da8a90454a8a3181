//! ntfy (<https://ntfy.sh>): a target's URL names its server and topic
//! (`https://ntfy.example/TOPIC`); the notification is published in ntfy's
//! JSON format to the server's root, with `actions` of type `http` so the
//! ntfy app shows one button per option that answers without opening
//! anything.

use serde_json::{json, Value};
use uuid::Uuid;

use super::http::{send, DELIVERY_HEADER};
use super::{DeliveryOutcome, Notification, NotificationEvent};

/// The server's root (where JSON is published) and the topic, from a
/// target's URL: the topic is the path's last segment.
pub fn split_url(url: &str) -> Result<(String, String), String> {
    let mut parsed = reqwest::Url::parse(url).map_err(|e| format!("not a URL ({e})"))?;
    let path = parsed.path().trim_end_matches('/').to_owned();
    let (root, topic) = path.rsplit_once('/').unwrap_or(("", &path));
    let valid = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    if topic.is_empty() || topic.len() > 64 || !topic.chars().all(valid) {
        return Err("must end in a topic of 1 to 64 characters of [A-Za-z0-9_-]".into());
    }
    let topic = topic.to_owned();
    parsed.set_path(&format!("{root}/"));
    parsed.set_query(None);
    parsed.set_fragment(None);
    Ok((parsed.to_string(), topic))
}

/// The most an ntfy message carries as text: a longer one is turned into
/// an attachment, or refused where the server takes none.
pub const MAX_MESSAGE: usize = 4096;

/// Whether the ntfy message for `n` stays within [`MAX_MESSAGE`], measured
/// as the whole JSON published (title, actions and all; more than ntfy
/// counts), with a topic of the longest kind.
pub fn fits(n: &Notification) -> bool {
    let topic = "t".repeat(64);
    serde_json::to_vec(&message(&topic, n)).is_ok_and(|json| json.len() <= MAX_MESSAGE)
}

/// The ntfy JSON message for `n`.
pub fn message(topic: &str, n: &Notification) -> Value {
    let place = n
        .conversation
        .as_ref()
        .map(|c| c.title.clone().unwrap_or_else(|| c.agent.clone()))
        .unwrap_or_default();
    let (title, mut message, tags, priority) = match n.event {
        NotificationEvent::PermissionWaiting | NotificationEvent::PermissionReminder => {
            let what = n
                .request
                .as_ref()
                .and_then(|r| r.title.clone().or_else(|| r.kind.clone()))
                .unwrap_or_else(|| "a tool call".into());
            let mut text = match &n.request.as_ref().and_then(|r| r.command.clone()) {
                Some(command) => format!("{what}\n{command}"),
                None => what,
            };
            if n.count > 1 {
                text.push_str(&format!("\n(+{} more)", n.count - 1));
            }
            let question = n.count <= 1
                && n.request.as_ref().and_then(|r| r.kind.as_deref()) == Some("question");
            let title = match n.event {
                NotificationEvent::PermissionReminder => format!("Still waiting: {place}"),
                _ if question => format!("Question: {place}"),
                _ => format!("Permission needed: {place}"),
            };
            (title, text, vec!["lock"], 4)
        }
        NotificationEvent::TurnEnded => (
            format!("Turn ended: {place}"),
            n.turn
                .as_ref()
                .and_then(|t| t.summary.clone().or_else(|| t.stop_reason.clone()))
                .unwrap_or_else(|| "The agent finished.".into()),
            vec!["white_check_mark"],
            3,
        ),
        NotificationEvent::AgentFailed => (
            format!("Agent failed: {place}"),
            "The agent stopped.".to_owned(),
            vec!["warning"],
            4,
        ),
        NotificationEvent::QueueHeld => (
            format!("Queue paused: {place}"),
            n.turn
                .as_ref()
                .and_then(|t| t.summary.clone())
                .unwrap_or_else(|| "Queued prompts wait.".into()),
            vec!["pause_button"],
            3,
        ),
        NotificationEvent::BudgetWarning => (
            format!("Budget nearly spent: {place}"),
            n.budget_line(),
            vec!["moneybag"],
            3,
        ),
        NotificationEvent::BudgetExceeded => (
            format!("Budget spent: {place}"),
            n.budget_line(),
            vec!["money_with_wings"],
            4,
        ),
        NotificationEvent::Test => (
            "acp-gateway".to_owned(),
            "A test notification: this target works.".to_owned(),
            vec!["bell"],
            3,
        ),
    };
    if message.is_empty() {
        message = title.clone();
    }
    let actions: Vec<Value> = n
        .actions
        .iter()
        .take(3) // ntfy shows at most three
        .map(|a| {
            json!({"action": "http", "label": a.label, "url": a.url, "method": "POST", "clear": true})
        })
        .collect();
    json!({
        "topic": topic,
        "title": title,
        "message": message,
        "tags": tags,
        "priority": priority,
        "actions": actions,
    })
}

/// Publishes `n` to the target's server and topic.
pub async fn deliver(
    client: &reqwest::Client,
    url: &str,
    token: Option<&str>,
    delivery_id: Uuid,
    n: &Notification,
) -> DeliveryOutcome {
    let (root, topic) = match split_url(url) {
        Ok(parts) => parts,
        Err(e) => {
            return DeliveryOutcome::Failed {
                status: None,
                error: e,
            }
        }
    };
    // A body stored by an older version may not fit yet.
    let fitted;
    let n = if fits(n) {
        n
    } else {
        let mut shorter = n.clone();
        super::fit::fit(&mut shorter, fits);
        fitted = shorter;
        &fitted
    };
    let mut request = client
        .post(root)
        .header(DELIVERY_HEADER, delivery_id.to_string())
        .json(&message(&topic, n));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    send(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_topic_is_the_last_segment_and_the_root_the_rest() {
        assert_eq!(
            split_url("https://ntfy.sh/my-topic").unwrap(),
            ("https://ntfy.sh/".into(), "my-topic".into())
        );
        assert_eq!(
            split_url("http://127.0.0.1:8080/ntfy/alerts/").unwrap(),
            ("http://127.0.0.1:8080/ntfy/".into(), "alerts".into())
        );
        assert!(split_url("https://ntfy.sh/").is_err());
        assert!(split_url("https://ntfy.sh/a%20b").is_err());
    }
}
