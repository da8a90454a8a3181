//! Scenarios that report what the turn cost, as agents do with ACP
//! `usage_update`: `cost <a> <b> …` and `cost-wait <a> <b> …` (the same,
//! then waiting for `session/cancel`, for a turn that goes on spending).

use serde_json::{json, Value};

use super::scenarios::{Cancelled, Turn, TurnEnd, END_TURN};

/// The context window the usage reports give.
const CONTEXT_SIZE: u64 = 200_000;

impl Turn {
    /// Scenarios `cost <a> <b> …` and (`wait`) `cost-wait <a> <b> …`: for
    /// each figure a `usage_update` with the session's cost so far `{amount:
    /// <figure>, currency: "USD"}` (cumulative, as given: a lower figure is
    /// a new count) and tokens used growing by 1000 a report, each
    /// followed by a message chunk `cost <figure>`; then `end_turn`, or
    /// (`wait`) nothing more until `session/cancel`. Words that are not
    /// numbers are skipped (with a note on stderr).
    pub(super) async fn cost(&self, args: &str, wait: bool) -> Result<TurnEnd, Cancelled> {
        for (i, figure) in figures(args).into_iter().enumerate() {
            self.stream(usage_update(figure, 1000 * (i as u64 + 1)))
                .await?;
            self.say(&format!("cost {figure} ")).await?;
        }
        if wait {
            return self.hang().await;
        }
        Ok(TurnEnd::Stop(END_TURN))
    }
}

/// The figures of the arguments, in order.
fn figures(args: &str) -> Vec<f64> {
    args.split_whitespace()
        .filter_map(|word| match word.parse::<f64>() {
            Ok(figure) if figure.is_finite() => Some(figure),
            _ => {
                log!("`{word}` is not an amount, skipping it");
                None
            }
        })
        .collect()
}

/// A `usage_update` with the session's cost so far, in US dollars.
fn usage_update(amount: f64, used: u64) -> Value {
    json!({
        "sessionUpdate": "usage_update",
        "used": used,
        "size": CONTEXT_SIZE,
        "cost": {"amount": amount, "currency": "USD"},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_are_the_numbers_given() {
        assert_eq!(figures("0.1 x 0.25  2"), [0.1, 0.25, 2.0]);
        assert!(figures("").is_empty());
        assert!(figures("inf NaN").is_empty());
    }
}
