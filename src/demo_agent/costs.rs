//! Scenarios that report what the turn cost, as agents do with ACP
//! `usage_update`: `cost <a> <b> …` and `cost-wait <a> <b> …` (the same,
//! then waiting for `session/cancel`, for a turn that goes on spending),
//! and `spend <step…>`, for budgets: a number is the session's cost so far,
//! `u<N>` the tokens in its context, `ask` a permission request waited
//! for, `wait` a wait for `session/cancel`.

use serde_json::{json, Value};

use super::scenarios::{Answer, Cancelled, Turn, TurnEnd, END_TURN};

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

    /// Scenario `spend <step…>` (see the module).
    pub(super) async fn spend(&self, args: &str) -> Result<TurnEnd, Cancelled> {
        for (i, step) in args.split_whitespace().enumerate() {
            match step {
                "ask" => {
                    let call = self.write_call(&format!("spend-{i}.txt"), "spent");
                    let answers = self
                        .run_tool_calls(std::slice::from_ref(&call), false)
                        .await?;
                    if answers[0] == Answer::Cancelled {
                        return Err(Cancelled);
                    }
                }
                "wait" => return self.hang().await,
                _ => {
                    let used = step.strip_prefix('u').and_then(|n| n.parse::<u64>().ok());
                    let update = match (used, step.parse::<f64>()) {
                        (Some(used), _) => json!({
                            "sessionUpdate": "usage_update", "used": used, "size": CONTEXT_SIZE,
                        }),
                        (None, Ok(amount)) => usage_update(amount, 1000),
                        (None, Err(_)) => {
                            self.say(&format!("not a step: {step}")).await?;
                            continue;
                        }
                    };
                    self.stream(update).await?;
                }
            }
        }
        self.say("spent").await?;
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
