//! Budgets as the API and the event log show them: what a budget limits
//! (the config's `[[budgets]]` is read into these), how far its spend is
//! ([`BudgetStanding`]), the notice a conversation's log records when a
//! turn nears or crosses one ([`BudgetNotice`]), and an operator's
//! exception ([`BudgetException`]).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

/// Whose spend a budget adds up: each user's (their conversations'), each
/// conversation's, or each agent profile's (every user's conversations of
/// it together).
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Hash, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum BudgetScope {
    User,
    Conversation,
    Profile,
}

impl BudgetScope {
    pub fn as_str(self) -> &'static str {
        match self {
            BudgetScope::User => "user",
            BudgetScope::Conversation => "conversation",
            BudgetScope::Profile => "profile",
        }
    }
}

/// What a budget limits: the cost the agents report (`{amount,
/// currency}`: spend in another currency is not counted), the turns
/// started (`{turns}`, which the gateway counts itself), or the tokens in
/// a conversation's context (`{context}`: the agent's latest `used`,
/// whatever the window).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, ToSchema)]
#[serde(untagged, deny_unknown_fields)]
pub enum BudgetLimit {
    Cost { amount: f64, currency: String },
    Turns { turns: u64 },
    Context { context: u64 },
}

impl BudgetLimit {
    /// The limit as a number of its own unit.
    pub fn figure(&self) -> f64 {
        match self {
            BudgetLimit::Cost { amount, .. } => *amount,
            BudgetLimit::Turns { turns } => *turns as f64,
            BudgetLimit::Context { context } => *context as f64,
        }
    }
}

/// The span a budget's spend is added up over, in UTC: the current day,
/// the current calendar month, or all time.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Hash, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum BudgetWindow {
    Day,
    Month,
    Total,
}

/// `on_exceed`: cancel the turn that crossed the budget, or let it finish.
/// Either way no new prompt in its scope starts (402) until the window
/// ends, and prompts queued meanwhile wait for a person.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnExceed {
    #[default]
    Cancel,
    FinishTurn,
}

/// Where one budget stands for one scope (a user, a conversation or a
/// profile): what was spent in the current window against the limit.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct BudgetStanding {
    /// The budget's `id`.
    #[schema(example = "daily")]
    pub budget: String,
    pub scope: BudgetScope,
    /// Whose spend it is: the user's name, the conversation's id or the
    /// profile's name.
    #[schema(example = "alice")]
    pub key: String,
    pub limit: BudgetLimit,
    /// Spent in the window, in the limit's unit (its currency, turns, or
    /// tokens in context).
    pub spent: f64,
    /// When the window ends and the spend starts again from nothing
    /// (`null`: a `total` window, or a context limit, never resets).
    pub resets_at: Option<DateTime<Utc>>,
    pub on_exceed: OnExceed,
}

/// `budget_warning` (80 % of a budget spent) and `budget_exceeded` (all of
/// it): recorded once per budget, scope and window, in the log of the
/// conversation whose turn got it there.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct BudgetNotice {
    #[serde(flatten)]
    pub standing: BudgetStanding,
    /// The turn that got it there, if one.
    pub turn_id: Option<Uuid>,
}

/// An operator's exception: the budget does not hold `user` (their
/// conversations) until `until`, the end of the window it was made in.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct BudgetException {
    #[schema(example = "daily")]
    pub budget: String,
    #[schema(example = "alice")]
    pub user: String,
    /// The end of the window it was made in (`null` for a `total` window:
    /// until removed).
    pub until: Option<DateTime<Utc>>,
    /// Who made it: `user:<name>`.
    #[schema(example = "user:root")]
    pub created_by: String,
    pub created_at: DateTime<Utc>,
}
