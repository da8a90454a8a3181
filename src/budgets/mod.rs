//! Budgets: how much agents may spend (the config's `[[budgets]]`), held
//! where a prompt enters (the API and the ACP front door ask
//! [`Budgets::admit`], 402 `budget_exceeded` once one is spent) and watched
//! as the agents report their spend ([`watch`]: a turn that crosses one is
//! cancelled or let finish, and the owner and operators told). The spend
//! is the database's usage records, so every node sees the same; the
//! rules ([`rules`]) are pure.

pub mod watch;
pub mod rules;

use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde_json::json;

use crate::config::Budget;
use crate::error::{Error, Result};
use crate::model::{BudgetLimit, BudgetStanding, Conversation};
use crate::store::{SpendScope, Store};
use rules::{level, scope_key, window_of, Level, Subject, Window};

/// The configured budgets and the store their spend is read from; cheap to
/// clone.
#[derive(Clone)]
pub struct Budgets {
    budgets: Arc<[Budget]>,
    store: Arc<dyn Store>,
}

/// Where one budget stands for a conversation.
#[derive(Debug, Clone)]
pub struct Standing {
    pub budget: Budget,
    pub window: Window,
    pub level: Level,
    pub standing: BudgetStanding,
}

impl Budgets {
    pub fn new(budgets: &[Budget], store: Arc<dyn Store>) -> Budgets {
        Budgets {
            budgets: budgets.into(),
            store,
        }
    }

    /// Every budget, as configured.
    pub fn all(&self) -> &[Budget] {
        &self.budgets
    }

    pub fn get(&self, id: &str) -> Option<&Budget> {
        self.budgets.iter().find(|b| b.id == id)
    }

    /// 402 `budget_exceeded` if a budget that holds the conversation is
    /// spent (and no exception lifts it for its owner): no new prompt
    /// starts in its scope until its window ends.
    pub async fn admit(&self, conversation: &Conversation) -> Result<()> {
        if self.budgets.is_empty() {
            return Ok(());
        }
        let now = Utc::now();
        for standing in self.standings(conversation, None, now).await? {
            if standing.level == Level::Exceeded
                && !self
                    .excepted(&standing.budget, conversation.owner.as_deref(), now)
                    .await?
            {
                return Err(exceeded(&standing.standing));
            }
        }
        Ok(())
    }

    /// Where each budget that holds the conversation stands now
    /// (`context_used`: the agent's latest tokens in context, if known
    /// better than the conversation's stored report).
    pub async fn standings(
        &self,
        conversation: &Conversation,
        context_used: Option<u64>,
        now: DateTime<Utc>,
    ) -> Result<Vec<Standing>> {
        let subject = Subject {
            conversation: conversation.id,
            owner: conversation.owner.as_deref(),
            agent: &conversation.agent,
        };
        let context_used = context_used.or_else(|| {
            conversation
                .state
                .usage
                .as_ref()
                .and_then(|u| u.get("used"))
                .and_then(serde_json::Value::as_u64)
        });
        let mut standings = Vec::new();
        for budget in self.budgets.iter() {
            let Some(key) = scope_key(budget, &subject) else {
                continue;
            };
            let window = window_of(budget, now);
            let spent = match &budget.limit {
                BudgetLimit::Context { .. } => context_used.unwrap_or(0) as f64,
                _ => self.spent(budget, &key, &subject, window).await?,
            };
            standings.push(Standing {
                level: level(&budget.limit, spent),
                window,
                standing: BudgetStanding {
                    budget: budget.id.clone(),
                    scope: budget.scope,
                    key,
                    limit: budget.limit.clone(),
                    spent,
                    resets_at: window.end,
                    on_exceed: budget.on_exceed,
                },
                budget: budget.clone(),
            });
        }
        Ok(standings)
    }

    /// What `budget` counts as spent for the scope `key` in `window`.
    async fn spent(
        &self,
        budget: &Budget,
        key: &str,
        subject: &Subject<'_>,
        window: Window,
    ) -> Result<f64> {
        let mut scope = SpendScope {
            from: Some(window.start),
            to: window.end,
            agent: budget.profile.clone(),
            ..SpendScope::default()
        };
        match budget.scope {
            crate::model::BudgetScope::User => scope.owner = Some(key.to_owned()),
            crate::model::BudgetScope::Conversation => {
                scope.conversation = Some(subject.conversation)
            }
            crate::model::BudgetScope::Profile => scope.agent = Some(key.to_owned()),
        }
        match &budget.limit {
            BudgetLimit::Turns { .. } => Ok(self.store.turns_started(&scope).await? as f64),
            BudgetLimit::Cost { currency, .. } => {
                let spent = self
                    .store
                    .spent(
                        scope.owner.as_deref(),
                        scope.conversation,
                        scope.agent.as_deref(),
                        scope.from,
                        scope.to,
                    )
                    .await?;
                Ok(spent
                    .into_iter()
                    .find(|(c, _)| c == currency)
                    .map_or(0.0, |(_, amount)| amount))
            }
            BudgetLimit::Context { .. } => Ok(0.0),
        }
    }

    /// Where a `user` budget stands for `user` now.
    pub async fn standing_of_user(
        &self,
        budget: &Budget,
        user: &str,
        now: DateTime<Utc>,
    ) -> Result<BudgetStanding> {
        let agent = budget.profile.clone().unwrap_or_default();
        let subject = Subject {
            conversation: uuid::Uuid::nil(),
            owner: Some(user),
            agent: &agent,
        };
        let window = window_of(budget, now);
        let spent = match &budget.limit {
            // Context is each conversation's own.
            BudgetLimit::Context { .. } => 0.0,
            _ => self.spent(budget, user, &subject, window).await?,
        };
        Ok(BudgetStanding {
            budget: budget.id.clone(),
            scope: budget.scope,
            key: user.to_owned(),
            limit: budget.limit.clone(),
            spent,
            resets_at: window.end,
            on_exceed: budget.on_exceed,
        })
    }

    /// Whether an operator's exception lifts `budget` for `owner` now.
    pub async fn excepted(
        &self,
        budget: &Budget,
        owner: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<bool> {
        let Some(owner) = owner else {
            return Ok(false);
        };
        Ok(self
            .store
            .budget_exceptions(Some(&budget.id), now)
            .await?
            .iter()
            .any(|e| e.user == owner))
    }
}

/// 402 `budget_exceeded`, saying which budget, its limit, what was spent
/// and when it resets.
pub fn exceeded(standing: &BudgetStanding) -> Error {
    let resets = match standing.resets_at {
        Some(at) => format!("; it resets at {}", at.to_rfc3339()),
        None => String::new(),
    };
    Error::BudgetExceeded {
        detail: format!(
            "budget {} is spent ({} of {}){resets}",
            standing.budget,
            standing.spent,
            standing.limit.figure()
        ),
        extra: json!({
            "budget": standing.budget,
            "scope": standing.scope,
            "key": standing.key,
            "limit": standing.limit,
            "spent": standing.spent,
            "resets_at": standing.resets_at,
        }),
    }
}
