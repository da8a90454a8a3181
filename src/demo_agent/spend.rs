//! Scenario `spend <step…>`: an agent that reports what it spends as it
//! goes, for budgets: a number is the session's cost so far (USD), `u<N>`
//! the tokens in its context, `ask` a permission request waited for, and
//! `wait` a wait for `session/cancel`.

use serde_json::json;

use super::scenarios::{Answer, Cancelled, Turn, TurnEnd, END_TURN};

impl Turn {
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
                "wait" => {
                    self.until_cancelled().await;
                    return Err(Cancelled);
                }
                _ => {
                    let update = match step.strip_prefix('u').map(str::parse::<u64>) {
                        Some(Ok(used)) => {
                            json!({"sessionUpdate": "usage_update", "used": used, "size": 200000})
                        }
                        _ => match step.parse::<f64>() {
                            Ok(amount) => json!({
                                "sessionUpdate": "usage_update", "used": 1000, "size": 200000,
                                "cost": {"amount": amount, "currency": "USD"},
                            }),
                            Err(_) => {
                                self.say(&format!("not a step: {step}")).await?;
                                continue;
                            }
                        },
                    };
                    self.stream(update).await?;
                }
            }
        }
        self.say("spent").await?;
        Ok(TurnEnd::Stop(END_TURN))
    }
}
