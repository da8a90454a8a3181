//! The scenario that reports what the turn cost, as agents do with ACP
//! `usage_update`: `cost <step…>`, where a number is the session's cost so
//! far, `u<N>` the tokens in its context, `ask` a permission request waited
//! for, and `wait` a wait for `session/cancel` (a turn that goes on
//! spending). `cost-wait <step…>` is `cost <step…> wait`.

use serde_json::{json, Value};

use super::scenarios::{Answer, Cancelled, Turn, TurnEnd, END_TURN};

/// The context window the usage reports give.
const CONTEXT_SIZE: u64 = 200_000;

/// One step of the scenario.
#[derive(Debug, PartialEq)]
enum Step {
    /// A `usage_update` with the session's cost so far, in US dollars.
    Cost(f64),
    /// A `usage_update` with the tokens in the context, and no cost.
    Used(u64),
    Ask,
    Wait,
}

impl Turn {
    /// Scenario `cost <step…>` (see the module; `wait`: `cost-wait`). Each
    /// cost is cumulative, as given (a lower figure is a new count), with
    /// tokens used growing by 1000 a report, and followed by a message
    /// chunk `cost <figure> `. Words that are no step are skipped (with a
    /// note on stderr).
    pub(super) async fn cost(&self, args: &str, wait: bool) -> Result<TurnEnd, Cancelled> {
        let mut reports = 0;
        for (i, step) in steps(args).into_iter().enumerate() {
            match step {
                Step::Cost(amount) => {
                    reports += 1;
                    self.stream(usage_update(amount, 1000 * reports)).await?;
                    self.say(&format!("cost {amount} ")).await?;
                }
                Step::Used(used) => {
                    self.stream(json!({
                        "sessionUpdate": "usage_update", "used": used, "size": CONTEXT_SIZE,
                    }))
                    .await?;
                }
                Step::Ask => {
                    let call = self.write_call(&format!("cost-{i}.txt"), "spent");
                    let answers = self
                        .run_tool_calls(std::slice::from_ref(&call), false)
                        .await?;
                    if answers[0] == Answer::Cancelled {
                        return Err(Cancelled);
                    }
                }
                Step::Wait => return self.hang().await,
            }
        }
        if wait {
            return self.hang().await;
        }
        Ok(TurnEnd::Stop(END_TURN))
    }
}

/// The steps of the arguments, in order.
fn steps(args: &str) -> Vec<Step> {
    args.split_whitespace()
        .filter_map(|word| {
            let step = match word {
                "ask" => Some(Step::Ask),
                "wait" => Some(Step::Wait),
                _ => match word.strip_prefix('u') {
                    Some(n) => n.parse().ok().map(Step::Used),
                    None => word
                        .parse::<f64>()
                        .ok()
                        .filter(|f| f.is_finite())
                        .map(Step::Cost),
                },
            };
            if step.is_none() {
                log!("`{word}` is not a step, skipping it");
            }
            step
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
    fn the_steps_are_those_given() {
        assert_eq!(
            steps("0.1 x 0.25 u500 ask  2 wait"),
            [
                Step::Cost(0.1),
                Step::Cost(0.25),
                Step::Used(500),
                Step::Ask,
                Step::Cost(2.0),
                Step::Wait
            ]
        );
        assert!(steps("").is_empty());
        assert!(steps("inf NaN u-1 uu").is_empty());
    }
}
