//! `[[budgets]]`: how much agents may spend, and what happens when they
//! have. Data only: the rules that apply them are [`crate::budgets`]'s.
//!
//! ```toml
//! [[budgets]]
//! id = "daily"                          # named in the API and in events
//! scope = "user"                        # user | conversation | profile
//! limit = { amount = 5.0, currency = "USD" }   # or { turns = 50 } or { context = 150000 }
//! window = "day"                        # day | month | total (UTC)
//! on_exceed = "cancel"                  # or "finish_turn"
//! profile = "claude"                    # optional: only this profile's conversations
//! ```

use anyhow::bail;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

pub use crate::model::{BudgetLimit, BudgetScope, BudgetWindow, OnExceed};

/// One budget.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    /// Unique among the budgets: `[A-Za-z0-9._-]`, 1 to 64 characters.
    #[schema(example = "daily")]
    pub id: String,
    pub scope: BudgetScope,
    pub limit: BudgetLimit,
    pub window: BudgetWindow,
    /// What a turn that crosses the budget does (default `cancel`).
    #[serde(default)]
    pub on_exceed: OnExceed,
    /// Only conversations of this agent profile count and are held to it
    /// (default: every profile; a `profile`-scoped budget without it holds
    /// each profile to it apart).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
}

/// Whether `id` can name a budget.
pub fn valid_budget_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
}

/// Checks every budget; errors name the key.
pub fn validate(budgets: &[Budget], profiles: &[&str]) -> anyhow::Result<()> {
    let mut ids = std::collections::HashSet::new();
    for (i, budget) in budgets.iter().enumerate() {
        let key = format!("budgets[{i}]");
        if !valid_budget_id(&budget.id) {
            bail!("{key}.id: must be 1-64 characters of [A-Za-z0-9._-]");
        }
        if !ids.insert(budget.id.as_str()) {
            bail!("{key}.id: {:?} is used by an earlier budget", budget.id);
        }
        match &budget.limit {
            BudgetLimit::Cost { amount, currency } => {
                if !amount.is_finite() || *amount <= 0.0 {
                    bail!("{key}.limit.amount: must be a number greater than zero");
                }
                if currency.is_empty()
                    || currency.len() > 16
                    || !currency.chars().all(|c| c.is_ascii_alphanumeric())
                {
                    bail!("{key}.limit.currency: must be 1-16 letters or digits (e.g. \"USD\")");
                }
            }
            BudgetLimit::Turns { turns } if *turns == 0 => {
                bail!("{key}.limit.turns: must be at least 1")
            }
            BudgetLimit::Context { context } if *context == 0 => {
                bail!("{key}.limit.context: must be at least 1")
            }
            BudgetLimit::Turns { .. } | BudgetLimit::Context { .. } => {}
        }
        if let Some(profile) = &budget.profile {
            if !profiles.contains(&profile.as_str()) {
                bail!("{key}.profile: no agent profile is named {profile:?}");
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct File {
        budgets: Vec<Budget>,
    }

    fn read(toml_text: &str) -> Result<Vec<Budget>, String> {
        toml::from_str::<File>(toml_text)
            .map(|f| f.budgets)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn each_kind_of_limit_is_read() {
        let budgets = read(
            r#"
            [[budgets]]
            id = "daily"
            scope = "user"
            limit = { amount = 5.0, currency = "USD" }
            window = "day"

            [[budgets]]
            id = "turns"
            scope = "profile"
            profile = "demo"
            limit = { turns = 10 }
            window = "month"
            on_exceed = "finish_turn"

            [[budgets]]
            id = "context"
            scope = "conversation"
            limit = { context = 1000 }
            window = "total"
            "#,
        )
        .unwrap();
        assert_eq!(
            budgets[0].limit,
            BudgetLimit::Cost {
                amount: 5.0,
                currency: "USD".into()
            }
        );
        assert_eq!(budgets[0].on_exceed, OnExceed::Cancel);
        assert_eq!(budgets[1].limit, BudgetLimit::Turns { turns: 10 });
        assert_eq!(budgets[1].on_exceed, OnExceed::FinishTurn);
        assert_eq!(budgets[2].limit, BudgetLimit::Context { context: 1000 });
        validate(&budgets, &["demo"]).unwrap();
    }

    #[test]
    fn bad_budgets_are_refused_naming_the_key() {
        let base = |extra: &str| {
            format!("[[budgets]]\nid = \"b\"\nscope = \"user\"\nwindow = \"day\"\n{extra}\n",)
        };
        // Shapes serde refuses.
        for extra in [
            "limit = { amount = 1.0 }",
            "limit = { tokens = 5 }",
            "limit = { amount = 1.0, currency = \"USD\", turns = 3 }",
            "limit = { turns = 1 }\non_exceed = \"explode\"",
        ] {
            assert!(read(&base(extra)).is_err(), "{extra}");
        }
        assert!(read(
            "[[budgets]]\nid = \"b\"\nscope = \"team\"\nwindow = \"day\"\nlimit = { turns = 1 }"
        )
        .is_err());
        assert!(read(
            "[[budgets]]\nid = \"b\"\nscope = \"user\"\nwindow = \"week\"\nlimit = { turns = 1 }"
        )
        .is_err());
        // Values the validation refuses.
        for (extra, message) in [
            (
                "limit = { amount = 0.0, currency = \"USD\" }",
                "budgets[0].limit.amount",
            ),
            (
                "limit = { amount = -1.0, currency = \"USD\" }",
                "budgets[0].limit.amount",
            ),
            (
                "limit = { amount = 1.0, currency = \"\" }",
                "budgets[0].limit.currency",
            ),
            ("limit = { turns = 0 }", "budgets[0].limit.turns"),
            ("limit = { context = 0 }", "budgets[0].limit.context"),
            (
                "limit = { turns = 1 }\nprofile = \"nobody\"",
                "budgets[0].profile",
            ),
        ] {
            let budgets = read(&base(extra)).unwrap();
            let error = validate(&budgets, &["demo"]).unwrap_err().to_string();
            assert!(error.starts_with(message), "{extra}: {error}");
        }
        let twice = read(&format!(
            "{}{}",
            base("limit = { turns = 1 }"),
            base("limit = { turns = 2 }")
        ))
        .unwrap();
        let error = validate(&twice, &[]).unwrap_err().to_string();
        assert!(error.starts_with("budgets[1].id"), "{error}");
        let bad_id = read(&base("limit = { turns = 1 }").replace("\"b\"", "\"a b\"")).unwrap();
        assert!(validate(&bad_id, &[])
            .unwrap_err()
            .to_string()
            .starts_with("budgets[0].id"));
    }
}
