//! When a notification is due, and to whom: pure rules over facts, time
//! passed in, no I/O (the notifier feeds them and acts on what they find).
//!
//! - `permission_waiting`: a request still pending `grace` after it was
//!   asked while no client of its owner is present; when the owner's last
//!   present client goes away, every request of theirs already past the
//!   grace is due then. Requests of one user that become due within
//!   [`BATCH`] of each other make one notification.
//! - `permission_reminder`: `reminder_before` before the profile's
//!   `permission_timeout` answers a request still pending, owner away
//!   (skipped when that moment comes before the grace ends: the waiting
//!   notification covers it).
//! - `turn_ended`: a turn that ran at least `min_turn` ended, owner away.
//! - `agent_failed`: the agent could not start, or died during a turn,
//!   owner away.
//! - `queue_held`: a turn ended other than with `end_turn` while prompts
//!   were queued (they wait for a person), owner away.
//!
//! - `budget_warning`, `budget_exceeded`: a budget 80 % or all spent, told
//!   to the conversation's owner and every operator, each while away.
//!
//! Nothing while the owner is present, nothing twice for the same key.
//!
//! A request is due to each user who may answer it, keyed by (request,
//! user): the owner, and each member of a shared conversation who answers
//! there (approver, collaborator), each with their own presence and grace.
//! A member who leaves ([`Fact::Left`]) gets nothing more of it.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

/// Requests of one user whose grace ends within this much of each other
/// make one notification (the notifier wakes once for all of them).
pub const BATCH: Duration = Duration::from_millis(100);

/// The durations the rules apply (from `[notifications]`).
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    pub grace: Duration,
    pub reminder_before: Duration,
    pub min_turn: Duration,
}

/// What the notifier tells the rules.
#[derive(Debug, Clone, PartialEq)]
pub enum Fact {
    /// A request was asked at `at`; `timeout_at` is when the profile's
    /// `permission_timeout` would answer it.
    Asked {
        request: Uuid,
        conversation: Uuid,
        user: String,
        at: DateTime<Utc>,
        timeout_at: Option<DateTime<Utc>>,
    },
    /// A request was answered (or withdrawn, timed out, expired).
    Answered { request: Uuid },
    /// `user` no longer answers in `conversation` (their membership was
    /// removed, or is a viewer's now): nothing more of it is due to them.
    Left { conversation: Uuid, user: String },
    /// Whether any client of `user` is present now.
    Presence { user: String, present: bool },
    TurnStarted {
        conversation: Uuid,
        turn: Uuid,
        at: DateTime<Utc>,
    },
    TurnEnded {
        conversation: Uuid,
        user: String,
        turn: Uuid,
        at: DateTime<Utc>,
        stop_reason: String,
    },
    /// The turn `turn` ended (`stop_reason`) with `queued` prompts waiting.
    QueueHeld {
        conversation: Uuid,
        user: String,
        turn: Uuid,
        stop_reason: String,
        queued: u32,
    },
    /// The agent could not start, or died during a turn; `seq` is the
    /// event's (a failure outside a turn is told by it).
    AgentFailed {
        conversation: Uuid,
        seq: i64,
        user: String,
        turn: Option<Uuid>,
        detail: Option<String>,
    },
    /// A budget is 80 % spent (`exceeded`: all of it), as the event `seq`
    /// of the conversation says; told to `users` (the owner and the
    /// operators).
    Budget {
        conversation: Uuid,
        seq: i64,
        users: Vec<String>,
        exceeded: bool,
        notice: crate::model::BudgetNotice,
    },
}

/// A notification the rules find due.
#[derive(Debug, Clone, PartialEq)]
pub enum Due {
    /// One notification for `requests` (oldest first; `count` = its length).
    Waiting {
        user: String,
        requests: Vec<Uuid>,
    },
    Reminder {
        user: String,
        request: Uuid,
    },
    TurnEnded {
        user: String,
        conversation: Uuid,
        turn: Uuid,
        stop_reason: String,
    },
    AgentFailed {
        user: String,
        conversation: Uuid,
        seq: i64,
        turn: Option<Uuid>,
        detail: Option<String>,
    },
    QueueHeld {
        user: String,
        conversation: Uuid,
        turn: Uuid,
        stop_reason: String,
        queued: u32,
    },
    Budget {
        user: String,
        conversation: Uuid,
        seq: i64,
        exceeded: bool,
        notice: crate::model::BudgetNotice,
    },
}

impl Due {
    /// What makes it "the same" notification (see `Outgoing::keys`).
    pub fn keys(&self) -> Vec<String> {
        match self {
            Due::Waiting { requests, .. } => requests
                .iter()
                .map(|r| format!("permission_waiting:{r}"))
                .collect(),
            Due::Reminder { request, .. } => vec![format!("permission_reminder:{request}")],
            Due::TurnEnded { turn, .. } => vec![format!("turn_ended:{turn}")],
            Due::QueueHeld { turn, .. } => vec![format!("queue_held:{turn}")],
            // One per user: several are told of the same event.
            Due::Budget {
                user,
                conversation,
                seq,
                ..
            } => vec![format!("budget:{conversation}:{seq}:{user}")],
            Due::AgentFailed {
                conversation,
                seq,
                turn,
                ..
            } => vec![match turn {
                Some(turn) => format!("agent_failed:{turn}"),
                None => format!("agent_failed:{conversation}:{seq}"),
            }],
        }
    }

    pub fn user(&self) -> &str {
        match self {
            Due::Waiting { user, .. }
            | Due::Reminder { user, .. }
            | Due::TurnEnded { user, .. }
            | Due::AgentFailed { user, .. }
            | Due::QueueHeld { user, .. }
            | Due::Budget { user, .. } => user,
        }
    }
}

#[derive(Debug, Clone)]
struct Waiting {
    user: String,
    conversation: Uuid,
    at: DateTime<Utc>,
    waiting_at: DateTime<Utc>,
    /// When a reminder is due, until `timeout_at`.
    reminder: Option<(DateTime<Utc>, DateTime<Utc>)>,
}

/// The rules' state: pending requests, running turns, who is present, what
/// was notified.
#[derive(Debug)]
pub struct Rules {
    settings: Settings,
    /// By (request, user): one request is due to each who may answer it.
    pending: HashMap<(Uuid, String), Waiting>,
    turns: HashMap<Uuid, (Uuid, DateTime<Utc>)>,
    present: HashSet<String>,
    sent: HashSet<String>,
}

/// What `sent` holds of `key` for `user` (a request's keys are theirs).
fn sent_key(user: &str, key: &str) -> String {
    format!("{user}\n{key}")
}

fn add(at: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    at + chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
}

impl Rules {
    pub fn new(settings: Settings) -> Rules {
        Rules {
            settings,
            pending: HashMap::new(),
            turns: HashMap::new(),
            present: HashSet::new(),
            sent: HashSet::new(),
        }
    }

    pub fn is_present(&self, user: &str) -> bool {
        self.present.contains(user)
    }

    /// Takes in a fact; returns what it makes due at once (a turn's end, a
    /// failure, the owner going away).
    pub fn observe(&mut self, fact: Fact, now: DateTime<Utc>) -> Vec<Due> {
        match fact {
            Fact::Asked {
                request,
                conversation,
                user,
                at,
                timeout_at,
            } => {
                let waiting_at = add(at, self.settings.grace);
                let reminder = timeout_at.and_then(|timeout_at| {
                    let before = chrono::Duration::from_std(self.settings.reminder_before).ok()?;
                    let remind_at = timeout_at - before;
                    (remind_at > waiting_at).then_some((remind_at, timeout_at))
                });
                self.pending
                    .entry((request, user.clone()))
                    .or_insert(Waiting {
                        user,
                        conversation,
                        at,
                        waiting_at,
                        reminder,
                    });
                Vec::new()
            }
            Fact::Answered { request } => {
                // It cannot be due again: what was sent of it is forgotten.
                let users: Vec<String> = self
                    .pending
                    .keys()
                    .filter(|(r, _)| *r == request)
                    .map(|(_, u)| u.clone())
                    .collect();
                for user in users {
                    self.pending.remove(&(request, user.clone()));
                    self.sent
                        .remove(&sent_key(&user, &format!("permission_waiting:{request}")));
                    self.sent
                        .remove(&sent_key(&user, &format!("permission_reminder:{request}")));
                }
                Vec::new()
            }
            Fact::Left { conversation, user } => {
                self.pending
                    .retain(|_, w| w.conversation != conversation || w.user != user);
                Vec::new()
            }
            Fact::Presence { user, present } => {
                if present {
                    self.present.insert(user);
                    Vec::new()
                } else if self.present.remove(&user) {
                    // Whatever was held back while they were here.
                    self.due_for(now, Some(&user))
                } else {
                    Vec::new()
                }
            }
            Fact::TurnStarted {
                conversation,
                turn,
                at,
            } => {
                self.turns.insert(conversation, (turn, at));
                Vec::new()
            }
            Fact::TurnEnded {
                conversation,
                user,
                turn,
                at,
                stop_reason,
            } => {
                let Some((started, started_at)) = self.turns.remove(&conversation) else {
                    return Vec::new();
                };
                let long = at - started_at
                    >= chrono::Duration::from_std(self.settings.min_turn)
                        .unwrap_or(chrono::Duration::MAX);
                // A turn the agent's death ended is told as that.
                if started != turn || !long || stop_reason == "error" || self.is_present(&user) {
                    return Vec::new();
                }
                self.once(Due::TurnEnded {
                    user,
                    conversation,
                    turn,
                    stop_reason,
                })
            }
            Fact::Budget {
                conversation,
                seq,
                users,
                exceeded,
                notice,
            } => {
                let mut due = Vec::new();
                for user in users {
                    if self.is_present(&user) {
                        continue;
                    }
                    due.extend(self.once(Due::Budget {
                        user,
                        conversation,
                        seq,
                        exceeded,
                        notice: notice.clone(),
                    }));
                }
                due
            }
            Fact::QueueHeld {
                conversation,
                user,
                turn,
                stop_reason,
                queued,
            } => {
                if self.is_present(&user) {
                    return Vec::new();
                }
                self.once(Due::QueueHeld {
                    user,
                    conversation,
                    turn,
                    stop_reason,
                    queued,
                })
            }
            Fact::AgentFailed {
                conversation,
                seq,
                user,
                turn,
                detail,
            } => {
                self.turns.remove(&conversation);
                if self.is_present(&user) {
                    return Vec::new();
                }
                self.once(Due::AgentFailed {
                    user,
                    conversation,
                    seq,
                    turn,
                    detail,
                })
            }
        }
    }

    fn once(&mut self, due: Due) -> Vec<Due> {
        let keys: Vec<String> = due.keys().iter().map(|k| sent_key(due.user(), k)).collect();
        if keys.iter().all(|k| self.sent.contains(k)) {
            return Vec::new();
        }
        self.sent.extend(keys);
        vec![due]
    }

    /// What is due by `now` (requests whose grace ends within [`BATCH`]
    /// of `now` count as due with it): one `Waiting` per user, then
    /// reminders. Each is returned once.
    pub fn due(&mut self, now: DateTime<Utc>) -> Vec<Due> {
        self.due_for(now, None)
    }

    fn due_for(&mut self, now: DateTime<Utc>, only: Option<&str>) -> Vec<Due> {
        let horizon = add(now, BATCH);
        let mut waiting: HashMap<&str, Vec<(DateTime<Utc>, Uuid)>> = HashMap::new();
        let mut reminders = Vec::new();
        let mut missed = Vec::new();
        for ((id, _), w) in &self.pending {
            if self.present.contains(&w.user) || only.is_some_and(|u| u != w.user) {
                continue;
            }
            let waiting_key = sent_key(&w.user, &format!("permission_waiting:{id}"));
            if w.waiting_at <= horizon && !self.sent.contains(&waiting_key) {
                waiting.entry(&w.user).or_default().push((w.at, *id));
            }
            if let Some((remind_at, timeout_at)) = w.reminder {
                let key = sent_key(&w.user, &format!("permission_reminder:{id}"));
                if remind_at <= horizon && !self.sent.contains(&key) {
                    if now < timeout_at {
                        reminders.push((w.at, w.user.clone(), *id));
                    } else {
                        // Too late to remind (the owner was here, or the
                        // timeout's answer is late): never again.
                        missed.push(key);
                    }
                }
            }
        }
        self.sent.extend(missed);
        let mut due: Vec<Due> = waiting
            .into_iter()
            .map(|(user, mut requests)| {
                requests.sort();
                Due::Waiting {
                    user: user.to_owned(),
                    requests: requests.into_iter().map(|(_, id)| id).collect(),
                }
            })
            .collect();
        due.sort_by(|a, b| a.user().cmp(b.user()));
        reminders.sort();
        due.extend(
            reminders
                .into_iter()
                .map(|(_, user, request)| Due::Reminder { user, request }),
        );
        for d in &due {
            let user = d.user();
            self.sent.extend(d.keys().iter().map(|k| sent_key(user, k)));
        }
        due
    }

    /// When [`Rules::due`] may next find something (`None`: nothing
    /// pending); a present owner's requests wait for their going away.
    pub fn next_deadline(&self) -> Option<DateTime<Utc>> {
        self.pending
            .iter()
            .filter(|(_, w)| !self.present.contains(&w.user))
            .flat_map(|((id, _), w)| {
                let key = |kind: &str| sent_key(&w.user, &format!("{kind}:{id}"));
                let waiting =
                    (!self.sent.contains(&key("permission_waiting"))).then_some(w.waiting_at);
                let reminder = w
                    .reminder
                    .filter(|_| !self.sent.contains(&key("permission_reminder")))
                    .map(|(at, _)| at);
                waiting.into_iter().chain(reminder)
            })
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ms: i64) -> DateTime<Utc> {
        DateTime::<Utc>::from_timestamp_millis(1_800_000_000_000 + ms).unwrap()
    }

    fn rules() -> Rules {
        Rules::new(Settings {
            grace: Duration::from_secs(15),
            reminder_before: Duration::from_secs(120),
            min_turn: Duration::from_secs(30),
        })
    }

    fn waiting(user: &str, requests: &[Uuid]) -> Due {
        Due::Waiting {
            user: user.into(),
            requests: requests.to_vec(),
        }
    }

    fn asked(rules: &mut Rules, user: &str, at: i64, timeout_at: Option<i64>) -> Uuid {
        let request = Uuid::now_v7();
        let due = rules.observe(
            Fact::Asked {
                request,
                conversation: Uuid::nil(),
                user: user.into(),
                at: t(at),
                timeout_at: timeout_at.map(t),
            },
            t(at),
        );
        assert!(due.is_empty());
        request
    }

    fn presence(rules: &mut Rules, user: &str, present: bool, now: i64) -> Vec<Due> {
        rules.observe(
            Fact::Presence {
                user: user.into(),
                present,
            },
            t(now),
        )
    }

    #[test]
    fn a_request_pending_past_the_grace_is_due_once() {
        let mut rules = rules();
        let r = asked(&mut rules, "alice", 0, None);
        assert_eq!(rules.next_deadline(), Some(t(15_000)));
        assert!(rules.due(t(14_000)).is_empty());
        let due = rules.due(t(15_000));
        assert_eq!(due, vec![waiting("alice", &[r])]);
        assert_eq!(due[0].keys(), vec![format!("permission_waiting:{r}")]);
        assert!(rules.due(t(20_000)).is_empty());
        assert_eq!(rules.next_deadline(), None);
    }

    #[test]
    fn a_shared_request_is_due_to_each_who_answers_it_by_their_own_presence() {
        let mut rules = rules();
        let (request, conversation) = (Uuid::now_v7(), Uuid::now_v7());
        for user in ["alice", "abe", "cole"] {
            let fact = Fact::Asked {
                request,
                conversation,
                user: user.into(),
                at: t(0),
                timeout_at: None,
            };
            assert!(rules.observe(fact, t(0)).is_empty());
        }
        presence(&mut rules, "abe", true, 0);
        // Cole no longer answers there: nothing more of it is his.
        let left = Fact::Left {
            conversation,
            user: "cole".into(),
        };
        assert!(rules.observe(left, t(1_000)).is_empty());
        assert_eq!(rules.due(t(15_000)), vec![waiting("alice", &[request])]);
        // Abe's grace passed while he was here: due as he goes away, once.
        let due = presence(&mut rules, "abe", false, 20_000);
        assert_eq!(due, vec![waiting("abe", &[request])]);
        assert!(rules.due(t(30_000)).is_empty());
        // Answered: forgotten for everyone.
        rules.observe(Fact::Answered { request }, t(31_000));
        assert_eq!(rules.next_deadline(), None);
    }

    #[test]
    fn a_request_answered_within_the_grace_is_never_due() {
        let mut rules = rules();
        let r = asked(&mut rules, "alice", 0, None);
        rules.observe(Fact::Answered { request: r }, t(5_000));
        assert!(rules.due(t(60_000)).is_empty());
        assert_eq!(rules.next_deadline(), None);
    }

    #[test]
    fn a_burst_of_requests_makes_one_notification_per_user() {
        let mut rules = rules();
        let a = asked(&mut rules, "alice", 0, None);
        let b = asked(&mut rules, "alice", 30, None);
        let c = asked(&mut rules, "alice", 60, None);
        let d = asked(&mut rules, "bob", 10, None);
        // One asked later than the batch window: its own notification.
        let late = asked(&mut rules, "alice", 1_000, None);
        let due = rules.due(t(15_000));
        assert_eq!(
            due,
            vec![waiting("alice", &[a, b, c]), waiting("bob", &[d])]
        );
        assert_eq!(rules.due(t(16_000)), vec![waiting("alice", &[late])]);
    }

    #[test]
    fn nothing_while_present_and_everything_past_the_grace_when_the_owner_goes_away() {
        let mut rules = rules();
        presence(&mut rules, "alice", true, 0);
        let a = asked(&mut rules, "alice", 0, None);
        let b = asked(&mut rules, "alice", 10_000, None);
        let young = asked(&mut rules, "alice", 50_000, None);
        assert_eq!(rules.next_deadline(), None);
        assert!(rules.due(t(60_000)).is_empty());
        let due = presence(&mut rules, "alice", false, 60_000);
        assert_eq!(due, vec![waiting("alice", &[a, b])]);
        // The young one waits out its own grace.
        assert_eq!(rules.next_deadline(), Some(t(65_000)));
        assert_eq!(rules.due(t(65_000)), vec![waiting("alice", &[young])]);
        // Coming back and going again notifies nothing twice.
        presence(&mut rules, "alice", true, 70_000);
        assert!(presence(&mut rules, "alice", false, 71_000).is_empty());
    }

    #[test]
    fn another_users_presence_suppresses_nothing() {
        let mut rules = rules();
        presence(&mut rules, "bob", true, 0);
        let a = asked(&mut rules, "alice", 0, None);
        assert_eq!(rules.due(t(15_000)), vec![waiting("alice", &[a])]);
    }

    #[test]
    fn a_reminder_comes_reminder_before_the_timeout_if_still_pending() {
        let mut rules = rules();
        let r = asked(&mut rules, "alice", 0, Some(600_000));
        assert_eq!(rules.due(t(15_000)).len(), 1);
        assert_eq!(rules.next_deadline(), Some(t(480_000)));
        assert!(rules.due(t(479_000)).is_empty());
        assert_eq!(
            rules.due(t(480_000)),
            vec![Due::Reminder {
                user: "alice".into(),
                request: r
            }]
        );
        assert!(rules.due(t(500_000)).is_empty());
        // Answered before its reminder: none.
        let s = asked(&mut rules, "alice", 0, Some(600_000));
        rules.due(t(15_000));
        rules.observe(Fact::Answered { request: s }, t(100_000));
        assert!(rules.due(t(480_000)).is_empty());
        // Still pending after its timeout (its answer late) with the
        // reminder missed while the owner was here: no reminder, and no
        // deadline left to wake for.
        let late = asked(&mut rules, "bob", 0, Some(600_000));
        presence(&mut rules, "bob", true, 0);
        let _ = rules.due(t(15_000));
        assert_eq!(
            presence(&mut rules, "bob", false, 700_000),
            vec![waiting("bob", &[late])]
        );
        assert_eq!(rules.next_deadline(), None);
        // A timeout sooner than the grace plus reminder_before: the waiting
        // notification stands for it.
        asked(&mut rules, "alice", 0, Some(60_000));
        assert_eq!(rules.due(t(15_000)).len(), 1);
        assert_eq!(rules.next_deadline(), None);
    }

    #[test]
    fn a_long_turn_that_ends_while_away_is_due_a_short_one_or_a_present_owner_not() {
        let mut rules = rules();
        let c = Uuid::now_v7();
        let turn = Uuid::now_v7();
        let end = |rules: &mut Rules, turn, at| {
            rules.observe(
                Fact::TurnEnded {
                    conversation: c,
                    user: "alice".into(),
                    turn,
                    at: t(at),
                    stop_reason: "end_turn".into(),
                },
                t(at),
            )
        };
        let start = |rules: &mut Rules, turn, at| {
            rules.observe(
                Fact::TurnStarted {
                    conversation: c,
                    turn,
                    at: t(at),
                },
                t(at),
            )
        };
        start(&mut rules, turn, 0);
        assert_eq!(
            end(&mut rules, turn, 30_000),
            vec![Due::TurnEnded {
                user: "alice".into(),
                conversation: c,
                turn,
                stop_reason: "end_turn".into()
            }]
        );
        let short = Uuid::now_v7();
        start(&mut rules, short, 40_000);
        assert!(end(&mut rules, short, 69_999).is_empty());
        let watched = Uuid::now_v7();
        presence(&mut rules, "alice", true, 70_000);
        start(&mut rules, watched, 70_000);
        assert!(end(&mut rules, watched, 200_000).is_empty());
        // A turn whose start was never seen (before a restart) is not judged.
        presence(&mut rules, "alice", false, 200_000);
        assert!(end(&mut rules, Uuid::now_v7(), 300_000).is_empty());
    }

    #[test]
    fn an_agent_failure_is_due_once_while_away() {
        let mut rules = rules();
        let c = Uuid::now_v7();
        let failed = |rules: &mut Rules| {
            rules.observe(
                Fact::AgentFailed {
                    conversation: c,
                    seq: 7,
                    user: "alice".into(),
                    turn: None,
                    detail: Some("exit 3".into()),
                },
                t(0),
            )
        };
        assert_eq!(failed(&mut rules).len(), 1);
        assert!(failed(&mut rules).is_empty());
        presence(&mut rules, "bob", true, 0);
        let mut other = super::Rules::new(rules.settings);
        presence(&mut other, "alice", true, 0);
        assert!(failed(&mut other).is_empty());
    }

    #[test]
    fn a_held_queue_is_due_once_while_away_and_not_while_present() {
        let mut rules = rules();
        let (c, turn) = (Uuid::now_v7(), Uuid::now_v7());
        let held = |rules: &mut Rules, turn| {
            rules.observe(
                Fact::QueueHeld {
                    conversation: c,
                    user: "alice".into(),
                    turn,
                    stop_reason: "cancelled".into(),
                    queued: 2,
                },
                t(0),
            )
        };
        let due = held(&mut rules, turn);
        assert_eq!(due[0].keys(), vec![format!("queue_held:{turn}")]);
        assert!(held(&mut rules, turn).is_empty());
        presence(&mut rules, "alice", true, 0);
        assert!(held(&mut rules, Uuid::now_v7()).is_empty());
    }
}
