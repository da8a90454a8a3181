//! What agents spend: every ACP `usage_update` an agent sends is kept as a
//! [`UsageRecord`], with the cost increase it stands for. Agents report
//! their session's cost so far (cumulative); the increase of one report is
//! what it adds to the previous report's figure, in its currency
//! ([`UsageReading::read`], pure).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use uuid::Uuid;

/// Longest currency kept from an agent (in characters): ISO 4217 codes
/// have three, an agent's own unit (`credits`) a few more.
const CURRENCY_MAX_CHARS: usize = 32;

/// An amount of money in one currency: what an agent reports as ACP `cost`
/// (`{amount, currency}`), and what is spent in one currency.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Spend {
    #[schema(example = 0.42)]
    pub amount: f64,
    /// As the agent names it (ISO 4217, e.g. `USD`, for the agents known).
    #[schema(example = "USD")]
    pub currency: String,
}

impl Spend {
    /// An ACP `cost` object, when it is one: a finite amount not below
    /// zero and a currency that is a non-empty string (cut to a bound).
    pub fn of_cost(cost: &Value) -> Option<Spend> {
        let amount = cost
            .get("amount")?
            .as_f64()
            .filter(|a| a.is_finite() && *a >= 0.0)?;
        let currency = cost
            .get("currency")?
            .as_str()
            .filter(|c| !c.trim().is_empty())?;
        Some(Spend {
            amount,
            currency: currency.chars().take(CURRENCY_MAX_CHARS).collect(),
        })
    }
}

/// What one `usage_update` says, and the cost increase it stands for.
#[derive(Debug, Clone, PartialEq)]
pub struct UsageReading {
    /// Tokens in the context.
    pub used: Option<i64>,
    /// The context window.
    pub size: Option<i64>,
    /// The session's cost so far, as reported (`None`: no cost reported,
    /// or one that is not a cost).
    pub cost: Option<Spend>,
    /// What this report adds to the previous one's cost, in `cost`'s
    /// currency (0 without a cost).
    pub delta: f64,
}

impl UsageReading {
    /// Reads a `session/update` `update` if it is a `usage_update`, against
    /// the cost the agent reported last (`previous`, cumulative). Its
    /// increase is the difference where the currency is the same and the
    /// figure did not go down; otherwise (the first report, another
    /// currency, or a figure lower than before, when the agent started a
    /// new count) the whole figure.
    pub fn read(update: &Value, previous: Option<&Spend>) -> Option<UsageReading> {
        if update.get("sessionUpdate").and_then(Value::as_str) != Some("usage_update") {
            return None;
        }
        let cost = update.get("cost").and_then(Spend::of_cost);
        let delta = match (&cost, previous) {
            (None, _) => 0.0,
            (Some(now), Some(before))
                if now.currency == before.currency && now.amount >= before.amount =>
            {
                now.amount - before.amount
            }
            (Some(now), _) => now.amount,
        };
        let count = |key: &str| update.get(key).and_then(Value::as_i64);
        Some(UsageReading {
            used: count("used"),
            size: count("size"),
            cost,
            delta,
        })
    }
}

/// One usage report an agent sent, as kept (`usage_records`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct UsageRecord {
    pub id: Uuid,
    pub conversation_id: Uuid,
    /// The turn it came in (`null`: between turns).
    pub turn_id: Option<Uuid>,
    /// The conversation's owner: spend is the owner's (`null` on a gateway
    /// without users).
    pub owner: Option<String>,
    /// The agent profile's name.
    pub agent: String,
    pub at: DateTime<Utc>,
    /// The seq of the `session_update` event that carried it.
    pub seq: Option<i64>,
    /// Tokens in the context.
    pub used: Option<i64>,
    /// The context window.
    pub size: Option<i64>,
    /// The session's cost so far, as reported.
    pub cost_amount: Option<f64>,
    pub cost_currency: Option<String>,
    /// This report's cost increase, in `cost_currency` (0 when none).
    pub delta: f64,
}

/// What usage is grouped by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum GroupBy {
    /// The conversation's owner.
    User,
    /// The agent profile.
    Agent,
    Conversation,
    /// The day (UTC) of the report, `YYYY-MM-DD`.
    Day,
}

impl GroupBy {
    pub fn parse(s: &str) -> Option<GroupBy> {
        Some(match s {
            "user" => GroupBy::User,
            "agent" => GroupBy::Agent,
            "conversation" => GroupBy::Conversation,
            "day" => GroupBy::Day,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            GroupBy::User => "user",
            GroupBy::Agent => "agent",
            GroupBy::Conversation => "conversation",
            GroupBy::Day => "day",
        }
    }
}

/// Which usage records to sum: each filter that is set must hold.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UsageQuery {
    pub owner: Option<String>,
    pub conversation: Option<Uuid>,
    pub agent: Option<String>,
    /// From this time on (inclusive).
    pub from: Option<DateTime<Utc>>,
    /// Up to this time (exclusive).
    pub to: Option<DateTime<Utc>>,
    /// `None`: one row per currency.
    pub group_by: Option<GroupBy>,
}

/// Usage summed over a group, in one currency.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct UsageRow {
    /// The group: a user, an agent profile's name, a conversation's id, or
    /// a day (`YYYY-MM-DD`, UTC); `null` without grouping (or a
    /// conversation without owner, grouped by user).
    pub key: Option<String>,
    /// `null`: reports that carried no cost (their count only).
    pub currency: Option<String>,
    /// The sum of the reports' cost increases.
    pub amount: f64,
    /// How many usage reports.
    pub reports: i64,
    /// How many turns they came in.
    pub turns: i64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn usd(amount: f64) -> Spend {
        Spend {
            amount,
            currency: "USD".into(),
        }
    }

    fn update(cost: Value) -> Value {
        json!({"sessionUpdate": "usage_update", "used": 10, "size": 100, "cost": cost})
    }

    #[test]
    fn a_reports_increase_is_what_it_adds_in_its_currency() {
        let delta = |cost: Value, prev: Option<&Spend>| {
            UsageReading::read(&update(cost), prev).unwrap().delta
        };
        // The first report: all of it.
        assert_eq!(
            delta(json!({"amount": 0.25, "currency": "USD"}), None),
            0.25
        );
        // More of the same currency: the difference.
        let d = delta(json!({"amount": 0.75, "currency": "USD"}), Some(&usd(0.25)));
        assert!((d - 0.5).abs() < 1e-12, "{d}");
        // The same figure again: nothing.
        assert_eq!(
            delta(json!({"amount": 0.25, "currency": "USD"}), Some(&usd(0.25))),
            0.0
        );
        // Another currency, or a figure gone down (a new count): all of it.
        assert_eq!(
            delta(json!({"amount": 0.1, "currency": "EUR"}), Some(&usd(0.25))),
            0.1
        );
        assert_eq!(
            delta(json!({"amount": 0.1, "currency": "USD"}), Some(&usd(0.25))),
            0.1
        );
        // No cost, or none that reads as one: nothing, and no cost.
        for cost in [
            Value::Null,
            json!({"amount": -1, "currency": "USD"}),
            json!({"amount": "1", "currency": "USD"}),
            json!({"amount": 1}),
            json!({"amount": 1, "currency": " "}),
        ] {
            let reading = UsageReading::read(&update(cost.clone()), Some(&usd(0.25))).unwrap();
            assert_eq!((reading.cost, reading.delta), (None, 0.0), "{cost}");
        }
        let reading = UsageReading::read(&update(Value::Null), None).unwrap();
        assert_eq!((reading.used, reading.size), (Some(10), Some(100)));
        // Other updates are no usage reports.
        let chunk = json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "x"}});
        assert_eq!(UsageReading::read(&chunk, None), None);
        // A long currency is cut.
        let long = "X".repeat(100);
        let reading =
            UsageReading::read(&update(json!({"amount": 1, "currency": long})), None).unwrap();
        assert_eq!(reading.cost.unwrap().currency.len(), CURRENCY_MAX_CHARS);
    }

    #[test]
    fn group_by_reads_what_it_writes() {
        for g in [
            GroupBy::User,
            GroupBy::Agent,
            GroupBy::Conversation,
            GroupBy::Day,
        ] {
            assert_eq!(GroupBy::parse(g.as_str()), Some(g));
        }
        assert_eq!(GroupBy::parse("month"), None);
    }
}
