//! `GET /api/v1/usage`: what the agents spent, from every usage report they
//! sent (ACP `usage_update`), summed per user, agent, conversation or day
//! and per currency. A user sees their own conversations' spend, an
//! operator everyone's (or one user's, `user=`).

use axum::Json;
use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::{router::OpenApiRouter, routes};

use super::extract::{AppQuery, Authed};
use super::state::AppState;
use crate::error::{Error, Result};
use crate::model::{GroupBy, Spend, UsageQuery, UsageRow};

/// The longest span one query sums (days).
pub const MAX_RANGE_DAYS: i64 = 366;
/// The span summed when `from` is not given (days before `to`).
pub const DEFAULT_RANGE_DAYS: i64 = 30;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(usage))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct UsageParams {
    /// From this time on (RFC 3339, inclusive); default 30 days before `to`.
    #[param(value_type = Option<String>, format = DateTime, example = "2026-12-01T00:00:00Z")]
    from: Option<String>,
    /// Up to this time (RFC 3339, exclusive); default now. At most 366 days
    /// after `from`.
    #[param(value_type = Option<String>, format = DateTime, example = "2026-12-08T00:00:00Z")]
    to: Option<String>,
    /// `user`, `agent`, `conversation` or `day` (UTC); without it, one row
    /// per currency.
    #[param(value_type = Option<GroupBy>)]
    group_by: Option<String>,
    /// Only this user's conversations (an operator's filter; a user may
    /// name only themselves).
    user: Option<String>,
    /// Only this agent profile's conversations.
    agent: Option<String>,
    /// Only this conversation.
    conversation: Option<uuid::Uuid>,
}

/// What was spent in a span of time, summed per group and currency.
#[derive(Serialize, ToSchema)]
pub struct UsageReport {
    /// The span's start (inclusive).
    from: DateTime<Utc>,
    /// The span's end (exclusive).
    to: DateTime<Utc>,
    /// What the rows are grouped by; `null`: not grouped.
    group_by: Option<GroupBy>,
    /// One row per group and currency, ordered by group, then currency.
    rows: Vec<UsageRow>,
    /// The whole span's spend, per currency (amounts in different
    /// currencies are never added up).
    totals: Vec<Spend>,
}

/// What the agents spent: every usage report summed.
#[utoipa::path(
    get, operation_id = "usage", path = "/api/v1/usage", tag = "usage",
    params(UsageParams),
    responses(
        (status = 200, description = "The spend in the span, per group and currency", body = UsageReport),
        (status = 403, description = "A user asked for another user's spend"),
        (status = 422, description = "A time that is not RFC 3339, `from` after `to`, a span over 366 days, or an unknown `group_by`"),
    )
)]
async fn usage(
    Authed { state, caller }: Authed,
    AppQuery(params): AppQuery<UsageParams>,
) -> Result<Json<UsageReport>> {
    let to = match params.to.as_deref() {
        Some(to) => time("to", to)?,
        None => crate::model::now(),
    };
    let from = match params.from.as_deref() {
        Some(from) => time("from", from)?,
        None => to - Duration::days(DEFAULT_RANGE_DAYS),
    };
    if from > to {
        return Err(Error::Unprocessable("from must not be after to".into()));
    }
    if to - from > Duration::days(MAX_RANGE_DAYS) {
        return Err(Error::Unprocessable(format!(
            "from and to must be at most {MAX_RANGE_DAYS} days apart"
        )));
    }
    let group_by = match params.group_by.as_deref() {
        None => None,
        Some(g) => Some(GroupBy::parse(g).ok_or_else(|| {
            Error::Unprocessable(format!(
                "group_by must be user, agent, conversation or day, not {g:?}"
            ))
        })?),
    };
    let owner = match (caller.owner_filter(), params.user) {
        (None, user) => user,
        (Some(own), Some(user)) if user != own => {
            return Err(Error::Forbidden(
                "only operators may see other users' usage".into(),
            ))
        }
        (Some(own), _) => Some(own),
    };
    let query = UsageQuery {
        owner,
        conversation: params.conversation,
        agent: params.agent,
        from: Some(from),
        to: Some(to),
        group_by,
    };
    let rows = state.store().usage_totals(&query).await?;
    let totals = totals(&rows);
    Ok(Json(UsageReport {
        from,
        to,
        group_by,
        rows,
        totals,
    }))
}

/// A time parameter, RFC 3339.
fn time(name: &str, value: &str) -> Result<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(value)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| {
            Error::Unprocessable(format!(
                "{name} must be an RFC 3339 time such as 2026-12-01T00:00:00Z ({e})"
            ))
        })
}

/// The rows' amounts summed per currency, ordered by currency (rows without
/// a currency carried no cost).
fn totals(rows: &[UsageRow]) -> Vec<Spend> {
    let mut totals: std::collections::BTreeMap<&str, f64> = Default::default();
    for row in rows {
        if let Some(currency) = &row.currency {
            *totals.entry(currency).or_default() += row.amount;
        }
    }
    totals
        .into_iter()
        .map(|(currency, amount)| Spend {
            amount,
            currency: currency.to_owned(),
        })
        .collect()
}
