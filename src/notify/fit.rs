//! What an agent wrote, kept short enough to arrive. A notification carries
//! text the agent chose (a request's title, kind and command, the
//! conversation's title, a turn's summary or failure, the labels of the
//! options it offers), of any length; push services refuse what passes
//! their limit (Web Push about 4 KB, FCM 4,000 bytes, ntfy 4,096), and a
//! refused push is refused again on every retry. So every such field has a
//! bound ([`bound`], for every channel), and a body that still does not fit
//! a channel gives up what it can spare, step by step, until it does
//! ([`fit`]). A cut falls on a character boundary and ends in `…`. Pure.

use super::Notification;

/// Most characters of a title (the request's, the conversation's).
pub const TITLE_CHARS: usize = 200;
/// Most characters of a request's command.
pub const COMMAND_CHARS: usize = 1000;
/// Most characters of a turn's summary (the start of the agent's last
/// message, or why it failed).
pub const SUMMARY_CHARS: usize = 200;
/// Most characters of an option's label.
pub const LABEL_CHARS: usize = 60;
/// Most characters of a one-word field (a request's kind, a stop reason).
pub const WORD_CHARS: usize = 40;

/// `text` cut to at most `max` characters (not bytes), the last of them `…`
/// when it was cut.
pub fn shorten(text: &mut String, max: usize) {
    if max == 0 {
        text.clear();
        return;
    }
    if let Some((end, _)) = text.char_indices().nth(max - 1) {
        if text[end..].chars().nth(1).is_some() {
            text.truncate(end);
            text.push('…');
        }
    }
}

fn shorten_opt(text: &mut Option<String>, max: usize) {
    if let Some(text) = text {
        shorten(text, max);
    }
}

/// Cuts every field the agent wrote to its bound.
pub fn bound(body: &mut Notification) {
    cut_to(body, 1);
}

/// Every agent-written field cut to its bound divided by `by`.
fn cut_to(body: &mut Notification, by: usize) {
    if let Some(c) = &mut body.conversation {
        shorten_opt(&mut c.title, TITLE_CHARS / by);
    }
    if let Some(r) = &mut body.request {
        shorten_opt(&mut r.title, TITLE_CHARS / by);
        shorten_opt(&mut r.kind, WORD_CHARS);
        shorten_opt(&mut r.command, COMMAND_CHARS / by);
    }
    if let Some(t) = &mut body.turn {
        shorten_opt(&mut t.stop_reason, WORD_CHARS);
        shorten_opt(&mut t.summary, SUMMARY_CHARS / by);
    }
    for action in &mut body.actions {
        shorten(&mut action.label, LABEL_CHARS / by);
    }
}

/// Shortens `body` until `fits` says it fits, giving up first what matters
/// least: the command and the summary; then ever shorter titles and labels;
/// then actions, the last first; then the titles, the kind and the stop
/// reason. Whether it fits in the end (it does unless what no agent wrote,
/// the user's name or the profile's, is itself too long).
pub fn fit(body: &mut Notification, fits: impl Fn(&Notification) -> bool) -> bool {
    bound(body);
    if fits(body) {
        return true;
    }
    if let Some(r) = &mut body.request {
        r.command = None;
    }
    if let Some(t) = &mut body.turn {
        t.summary = None;
    }
    for by in [2, 4, 10] {
        if fits(body) {
            return true;
        }
        cut_to(body, by);
    }
    while !fits(body) && body.actions.pop().is_some() {}
    if fits(body) {
        return true;
    }
    if let Some(c) = &mut body.conversation {
        c.title = None;
    }
    if let Some(r) = &mut body.request {
        r.title = None;
        r.kind = None;
    }
    if let Some(t) = &mut body.turn {
        t.stop_reason = None;
    }
    fits(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::notify::{sample, Action, NotificationEvent};

    #[test]
    fn text_is_cut_on_a_character_with_an_ellipsis_and_only_when_too_long() {
        let mut text = "é".repeat(10);
        shorten(&mut text, 10);
        assert_eq!(text, "é".repeat(10));
        shorten(&mut text, 4);
        assert_eq!(text, "ééé…");
        let mut text = "a🦀b".to_string();
        shorten(&mut text, 2);
        assert_eq!(text, "a…");
        let mut text = "abc".to_string();
        shorten(&mut text, 0);
        assert_eq!(text, "");
    }

    fn long(event: NotificationEvent) -> Notification {
        let mut n = sample(event, 1);
        n.conversation.as_mut().unwrap().title = Some("ü".repeat(5000));
        let request = n.request.as_mut().unwrap();
        request.title = Some(format!("Run {}", "\u{1}".repeat(5000)));
        request.command = Some("\u{1}".repeat(5000));
        request.kind = Some("k".repeat(5000));
        n.actions = (0..40)
            .map(|i| Action {
                label: "Allow ".repeat(100),
                option_id: format!("option-{i}"),
                url: format!("https://gateway.example/api/v1/actions/{}", "t".repeat(43)),
            })
            .collect();
        n
    }

    #[test]
    fn every_agent_written_field_has_a_bound() {
        let mut n = long(NotificationEvent::PermissionWaiting);
        bound(&mut n);
        let request = n.request.as_ref().unwrap();
        assert_eq!(request.title.as_ref().unwrap().chars().count(), TITLE_CHARS);
        assert!(request.title.as_ref().unwrap().ends_with('…'));
        assert_eq!(
            request.command.as_ref().unwrap().chars().count(),
            COMMAND_CHARS
        );
        assert_eq!(request.kind.as_ref().unwrap().chars().count(), WORD_CHARS);
        let title = n.conversation.as_ref().unwrap().title.as_ref().unwrap();
        assert_eq!(title.chars().count(), TITLE_CHARS);
        assert!(n
            .actions
            .iter()
            .all(|a| a.label.chars().count() == LABEL_CHARS));
        assert_eq!(n.actions.len(), 40, "bounds drop nothing");
    }

    #[test]
    fn a_body_gives_up_what_matters_least_until_it_fits() {
        let size = |n: &Notification| serde_json::to_vec(n).unwrap().len();
        // Room for the titles, cut: the command goes, the actions stay.
        let mut n = long(NotificationEvent::PermissionWaiting);
        n.actions.truncate(4);
        assert!(fit(&mut n, |n| size(n) <= 3993));
        assert!(size(&n) <= 3993, "{}", size(&n));
        let request = n.request.as_ref().unwrap();
        assert_eq!(request.command, None);
        assert!(request.title.as_ref().unwrap().starts_with("Run \u{1}"));
        assert_eq!(n.actions.len(), 4);
        // Forty options: some of them go.
        let mut n = long(NotificationEvent::PermissionWaiting);
        assert!(fit(&mut n, |n| size(n) <= 3993));
        assert!(size(&n) <= 3993, "{}", size(&n));
        assert!(!n.actions.is_empty() && n.actions.len() < 40);
        assert!(n.request.as_ref().unwrap().title.is_some());
        // Hardly any room: only what no agent wrote is left.
        let mut n = long(NotificationEvent::PermissionWaiting);
        assert!(fit(&mut n, |n| size(n) <= 400));
        assert!(n.actions.is_empty());
        assert_eq!(n.request.as_ref().unwrap().title, None);
        // A body that fits is left as it is.
        let short = sample(NotificationEvent::PermissionWaiting, 1);
        let mut n = short.clone();
        assert!(fit(&mut n, |n| size(n) <= 3993));
        assert_eq!(n, short);
    }
}
