//! What a notification says in a phone's notification shade: a title and a
//! body, for the channels that show text of their own (FCM, ntfy). Pure.

use super::{Notification, NotificationEvent};

/// Titles longer than this are cut (phones show one or two lines).
const MAX_TITLE: usize = 100;
/// Bodies longer than this are cut.
const MAX_BODY: usize = 240;

/// The title and body of `notification`, e.g. `("Claude Code asks: Run rm
/// -rf build", "in Fix the build")`, `("2 requests waiting in Fix the
/// build", "Claude Code asks: Run rm -rf build, and 1 more")`, `("Turn
/// ended: Fix the build", <the start of the agent's last message>)`,
/// `("Agent failed: Fix the build", …)`. Uses only what the body carries,
/// so a `minimal` body makes a minimal text.
pub fn headline(notification: &Notification) -> (String, String) {
    let conversation = notification.conversation.as_ref();
    let agent = conversation
        .map(|c| c.agent.as_str())
        .filter(|a| !a.is_empty())
        .unwrap_or("The agent");
    let place = conversation
        .and_then(|c| c.title.as_deref())
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .unwrap_or("an untitled conversation");
    let asks = || {
        let what = notification
            .request
            .as_ref()
            .and_then(|r| {
                [r.title.as_deref(), r.command.as_deref(), r.kind.as_deref()]
                    .into_iter()
                    .flatten()
                    .map(str::trim)
                    .find(|s| !s.is_empty())
            })
            .unwrap_or("permission");
        format!("{agent} asks: {what}")
    };
    let (title, body) = match notification.event {
        NotificationEvent::PermissionWaiting | NotificationEvent::PermissionReminder => {
            let reminder = notification.event == NotificationEvent::PermissionReminder;
            let (title, body) = if notification.count > 1 {
                let more = notification.count - 1;
                (
                    format!("{} requests waiting in {place}", notification.count),
                    format!("{}, and {more} more", asks()),
                )
            } else {
                (asks(), format!("in {place}"))
            };
            if reminder {
                (
                    format!("Still waiting: {title}"),
                    format!("{body}. It will be answered automatically soon."),
                )
            } else {
                (title, body)
            }
        }
        NotificationEvent::TurnEnded => {
            let turn = notification.turn.as_ref();
            let body = turn
                .and_then(|t| t.summary.as_deref())
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .or_else(|| {
                    turn.and_then(|t| t.stop_reason.as_deref())
                        .map(|r| format!("{agent} stopped: {}", r.replace('_', " ")))
                })
                .unwrap_or_else(|| format!("{agent} is done"));
            (format!("Turn ended: {place}"), body)
        }
        NotificationEvent::AgentFailed => {
            let why = notification
                .turn
                .as_ref()
                .and_then(|t| t.summary.as_deref().or(t.stop_reason.as_deref()))
                .map(str::trim)
                .filter(|s| !s.is_empty());
            let body = match why {
                Some(why) => format!("{agent}: {why}"),
                None => format!("{agent} could not start or stopped during a turn"),
            };
            (format!("Agent failed: {place}"), body)
        }
        NotificationEvent::QueueHeld => {
            let turn = notification.turn.as_ref();
            let why = turn
                .and_then(|t| t.stop_reason.as_deref())
                .map_or("stopped".to_owned(), |r| r.replace('_', " "));
            let waiting = turn
                .and_then(|t| t.summary.as_deref())
                .unwrap_or("queued prompts wait");
            (
                format!("Queue paused: {place}"),
                format!("{agent}'s turn ended ({why}); {waiting}. Resume or send a new prompt."),
            )
        }
        NotificationEvent::BudgetWarning => (
            format!("Budget nearly spent: {place}"),
            notification.budget_line(),
        ),
        NotificationEvent::BudgetExceeded => (
            format!("Budget spent: {place}"),
            format!(
                "{}. New prompts wait until it resets or an operator lifts it.",
                notification.budget_line()
            ),
        ),
        NotificationEvent::Test => (
            "Test notification".to_string(),
            "acp-gateway can reach this device".to_string(),
        ),
    };
    (cut(&title, MAX_TITLE), cut(&body, MAX_BODY))
}

/// At most `max` characters (not bytes), ending in `…` when cut; on one line.
fn cut(text: &str, max: usize) -> String {
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if text.chars().count() <= max {
        return text;
    }
    let mut out: String = text.chars().take(max - 1).collect();
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::notify::{sample, TurnRef};
    use uuid::Uuid;

    #[test]
    fn a_request_names_the_agent_and_what_it_asks() {
        let (title, body) = headline(&sample(NotificationEvent::PermissionWaiting, 1));
        assert_eq!(title, "Claude Code asks: Run rm -rf build");
        assert_eq!(body, "in Fix the build");
    }

    #[test]
    fn a_burst_counts_its_requests() {
        let (title, body) = headline(&sample(NotificationEvent::PermissionWaiting, 2));
        assert_eq!(title, "2 requests waiting in Fix the build");
        assert_eq!(body, "Claude Code asks: Run rm -rf build, and 1 more");
        let (title, _) = headline(&sample(NotificationEvent::PermissionReminder, 1));
        assert_eq!(title, "Still waiting: Claude Code asks: Run rm -rf build");
    }

    #[test]
    fn a_minimal_request_falls_back_to_its_kind() {
        let mut n = sample(NotificationEvent::PermissionWaiting, 1);
        n.request.as_mut().unwrap().title = None;
        n.conversation.as_mut().unwrap().title = None;
        assert_eq!(
            headline(&n),
            (
                "Claude Code asks: execute".to_string(),
                "in an untitled conversation".to_string()
            )
        );
    }

    #[test]
    fn turns_and_failures_say_what_happened_and_long_text_is_cut() {
        let mut n = sample(NotificationEvent::TurnEnded, 0);
        n.request = None;
        n.turn = Some(TurnRef {
            id: Uuid::nil(),
            stop_reason: Some("end_turn".into()),
            summary: Some(format!("Done.\n{}", "é".repeat(400))),
        });
        let (title, body) = headline(&n);
        assert_eq!(title, "Turn ended: Fix the build");
        assert!(body.starts_with("Done. éé"));
        assert_eq!(body.chars().count(), MAX_BODY);
        assert!(body.ends_with('…'));
        n.turn.as_mut().unwrap().summary = None;
        assert_eq!(headline(&n).1, "Claude Code stopped: end turn");
        n.event = NotificationEvent::AgentFailed;
        n.turn = None;
        assert_eq!(headline(&n).0, "Agent failed: Fix the build");
    }
}
