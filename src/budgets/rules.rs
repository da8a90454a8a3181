//! The rules of budgets, pure: which budgets hold a conversation and whose
//! spend each adds up, the window it is added up over, and where a spend
//! stands against a limit. Time is passed in; no I/O.

use chrono::{DateTime, Datelike, TimeZone, Utc};
use uuid::Uuid;

use crate::config::Budget;
use crate::model::{BudgetLimit, BudgetScope, BudgetWindow};

/// A budget warns once this share of it is spent.
pub const WARN_AT: f64 = 0.8;

/// What a budget needs to know of a conversation.
#[derive(Debug, Clone, Copy)]
pub struct Subject<'a> {
    pub conversation: Uuid,
    pub owner: Option<&'a str>,
    /// Its agent profile.
    pub agent: &'a str,
}

/// Whose spend `budget` adds up for `subject` (the user's name, the
/// conversation's id, the profile's name), if it holds the conversation at
/// all: a budget of one profile holds only that profile's conversations,
/// and a user's budget only conversations with an owner.
pub fn scope_key(budget: &Budget, subject: &Subject) -> Option<String> {
    if budget
        .profile
        .as_deref()
        .is_some_and(|p| p != subject.agent)
    {
        return None;
    }
    match budget.scope {
        BudgetScope::User => subject.owner.map(str::to_owned),
        BudgetScope::Conversation => Some(subject.conversation.to_string()),
        BudgetScope::Profile => Some(subject.agent.to_owned()),
    }
}

/// The span spend is added up over: from `start` to `end` (`None`: no
/// end, a `total` window).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub start: DateTime<Utc>,
    pub end: Option<DateTime<Utc>>,
}

impl Window {
    /// The window of kind `window` that `now` is in (UTC days and calendar
    /// months; a `total` window starts at the epoch).
    pub fn at(window: BudgetWindow, now: DateTime<Utc>) -> Window {
        let midnight = |y: i32, m: u32, d: u32| {
            Utc.with_ymd_and_hms(y, m, d, 0, 0, 0)
                .single()
                .expect("midnight UTC exists")
        };
        match window {
            BudgetWindow::Day => {
                let start = midnight(now.year(), now.month(), now.day());
                Window {
                    start,
                    end: Some(start + chrono::Duration::days(1)),
                }
            }
            BudgetWindow::Month => {
                let start = midnight(now.year(), now.month(), 1);
                let (y, m) = if now.month() == 12 {
                    (now.year() + 1, 1)
                } else {
                    (now.year(), now.month() + 1)
                };
                Window {
                    start,
                    end: Some(midnight(y, m, 1)),
                }
            }
            BudgetWindow::Total => Window {
                start: DateTime::<Utc>::UNIX_EPOCH,
                end: None,
            },
        }
    }
}

/// Where a spend stands against a limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Under,
    /// At least [`WARN_AT`] of it.
    Warning,
    /// All of it (or more).
    Exceeded,
}

/// Where `spent` stands against `limit`.
pub fn level(limit: &BudgetLimit, spent: f64) -> Level {
    let limit = limit.figure();
    if spent >= limit {
        Level::Exceeded
    } else if spent >= limit * WARN_AT {
        Level::Warning
    } else {
        Level::Under
    }
}

/// A context limit's window: the agent's latest figure counts, whatever
/// the budget's `window` says, and never resets.
pub fn window_of(budget: &Budget, now: DateTime<Utc>) -> Window {
    match budget.limit {
        BudgetLimit::Context { .. } => Window::at(BudgetWindow::Total, now),
        _ => Window::at(budget.window, now),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::OnExceed;

    fn budget(scope: BudgetScope, profile: Option<&str>) -> Budget {
        Budget {
            id: "b".into(),
            scope,
            limit: BudgetLimit::Cost {
                amount: 10.0,
                currency: "USD".into(),
            },
            window: BudgetWindow::Day,
            on_exceed: OnExceed::Cancel,
            profile: profile.map(str::to_owned),
        }
    }

    fn at(text: &str) -> DateTime<Utc> {
        text.parse().unwrap()
    }

    #[test]
    fn each_scope_adds_up_its_own_spend() {
        let id = Uuid::nil();
        let subject = Subject {
            conversation: id,
            owner: Some("alice"),
            agent: "claude",
        };
        assert_eq!(
            scope_key(&budget(BudgetScope::User, None), &subject).as_deref(),
            Some("alice")
        );
        assert_eq!(
            scope_key(&budget(BudgetScope::Conversation, None), &subject),
            Some(id.to_string())
        );
        assert_eq!(
            scope_key(&budget(BudgetScope::Profile, None), &subject).as_deref(),
            Some("claude")
        );
        // Another profile's budget does not hold it; a user's budget holds
        // no conversation without an owner.
        assert_eq!(
            scope_key(&budget(BudgetScope::User, Some("codex")), &subject),
            None
        );
        assert_eq!(
            scope_key(&budget(BudgetScope::User, Some("claude")), &subject).as_deref(),
            Some("alice")
        );
        let ownerless = Subject {
            owner: None,
            ..subject
        };
        assert_eq!(
            scope_key(&budget(BudgetScope::User, None), &ownerless),
            None
        );
    }

    #[test]
    fn windows_are_utc_days_and_calendar_months() {
        let now = at("2026-12-31T23:59:59Z");
        assert_eq!(
            Window::at(BudgetWindow::Day, now),
            Window {
                start: at("2026-12-31T00:00:00Z"),
                end: Some(at("2027-01-01T00:00:00Z"))
            }
        );
        assert_eq!(
            Window::at(BudgetWindow::Month, now),
            Window {
                start: at("2026-12-01T00:00:00Z"),
                end: Some(at("2027-01-01T00:00:00Z"))
            }
        );
        assert_eq!(
            Window::at(BudgetWindow::Month, at("2028-02-29T12:00:00Z")),
            Window {
                start: at("2028-02-01T00:00:00Z"),
                end: Some(at("2028-03-01T00:00:00Z"))
            }
        );
        let total = Window::at(BudgetWindow::Total, now);
        assert_eq!(total.end, None);
        assert!(total.start < at("1971-01-01T00:00:00Z"));
        // A context limit never resets.
        let mut context = budget(BudgetScope::Conversation, None);
        context.limit = BudgetLimit::Context { context: 5 };
        assert_eq!(window_of(&context, now).end, None);
    }

    #[test]
    fn a_budget_warns_at_eighty_percent_and_is_exceeded_at_all_of_it() {
        let limit = BudgetLimit::Cost {
            amount: 10.0,
            currency: "USD".into(),
        };
        assert_eq!(level(&limit, 0.0), Level::Under);
        assert_eq!(level(&limit, 7.99), Level::Under);
        assert_eq!(level(&limit, 8.0), Level::Warning);
        assert_eq!(level(&limit, 9.99), Level::Warning);
        assert_eq!(level(&limit, 10.0), Level::Exceeded);
        assert_eq!(level(&limit, 12.5), Level::Exceeded);
        assert_eq!(level(&BudgetLimit::Turns { turns: 5 }, 4.0), Level::Warning);
        assert_eq!(
            level(&BudgetLimit::Turns { turns: 5 }, 5.0),
            Level::Exceeded
        );
    }
}
