//! What every HTTP channel shares: a bounded time, and what a response
//! comes to.

use std::time::Duration;

use super::DeliveryOutcome;

/// How long one attempt may take, connection included.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// The header receivers deduplicate on.
pub const DELIVERY_HEADER: &str = "X-Acp-Gateway-Delivery";

/// Sends `request` and says what came of it: 2xx delivered; 404 and 410
/// gone (the subscription, topic or endpoint is no more: also for
/// webhooks, whose owner answers so to stop them); anything else, or no
/// answer, failed (retried).
pub async fn send(request: reqwest::RequestBuilder) -> DeliveryOutcome {
    match request.send().await {
        Ok(response) => outcome_of(response.status().as_u16()),
        Err(e) => DeliveryOutcome::Failed {
            status: None,
            // Without the URL: a webhook's URL may hold a secret (Slack's
            // do), and this text is logged and listed.
            error: error_chain(&e.without_url()),
        },
    }
}

/// A request that got no answer (no connection, a timeout), said without
/// its URL: a push endpoint is a capability, and this text is logged and
/// listed.
pub fn unanswered(error: reqwest::Error) -> DeliveryOutcome {
    DeliveryOutcome::Failed {
        status: None,
        error: error.without_url().to_string(),
    }
}

/// What an HTTP status comes to.
pub fn outcome_of(status: u16) -> DeliveryOutcome {
    match status {
        200..=299 => DeliveryOutcome::Delivered { status },
        404 | 410 => DeliveryOutcome::Gone { status },
        _ => DeliveryOutcome::Failed {
            status: Some(status),
            error: format!("HTTP {status}"),
        },
    }
}

/// An error with its causes (reqwest's own message says little: "error
/// sending request").
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
