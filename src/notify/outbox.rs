//! The durable outbox: what is due goes into the database first (one row
//! per delivery to one target, in the transaction that records its keys),
//! and a worker sends it from there. A crash between the two leaves the row,
//! sent after the restart; a row is claimed by one node at a time (`for
//! update skip locked` on Postgres) so several nodes never send it twice;
//! every attempt is recorded; failures are retried with exponential backoff
//! ([`MAX_ATTEMPTS`] in all); a 404 or 410 marks the target `gone`.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use super::fcm::{self, Fcm};
use super::vapid::VapidKeys;
use super::{fit, guard, ntfy, web_push, webhook};
use super::{DeliveryOutcome, Enqueue, Notification, NotificationEvent, Outgoing};
use crate::config::{NotificationDetail, Notifications};
use crate::error::Result;
use crate::store::notify::{AttemptNext, AttemptRecord, DeliveryRecord, NewDelivery, TargetRecord};
use crate::store::Store;

/// Attempts per delivery, the first included.
pub const MAX_ATTEMPTS: i32 = 5;
/// How long one attempt may take as a whole: an FCM attempt's token
/// (waited for behind another send's fetch, fetched, fetched again after a
/// 401) included. Past it the attempt failed, and is retried.
pub const ATTEMPT: Duration = super::http::TIMEOUT;
/// How long a claim holds (three times an attempt's bound). A node that
/// died mid-send leaves its rows to others, or to itself restarted, once
/// its claim ran out or its death is known (SQLite: at once; Postgres: when
/// its `node_lease` ran out); those rows are then sent again with their
/// `delivery_id` (at least once wins). A node never runs two attempts of
/// one delivery at once: a row it claims again while its attempt is still
/// under way (its claim ran out: the database was slow, say) is left to
/// that attempt.
const CLAIM: Duration = Duration::from_secs(30);
/// How often the worker looks without being woken: rows of other nodes,
/// claims that ran out.
const POLL: Duration = Duration::from_secs(2);
/// How long keys, finished deliveries and attempts are kept.
pub const RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);
/// How often each node forgets what is past [`RETENTION`].
const SWEEP_EVERY: Duration = Duration::from_secs(3600);
/// Rows claimed at once.
const BATCH: usize = 32;
/// Sends under way at once, per node.
const IN_FLIGHT: usize = 64;
/// Test notifications a user may send per minute (`POST …/test`): each
/// makes the gateway send a request to a URL the user chose.
pub const TESTS_PER_MINUTE: u32 = 10;
/// How long a Web Push service keeps a notification for an offline device.
const WEB_PUSH_TTL: u32 = 3600;

/// A target's settings, as stored (secrets included).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TargetConfig {
    WebPush {
        endpoint: String,
        p256dh: String,
        auth: String,
    },
    Ntfy {
        url: String,
        token: Option<String>,
    },
    Webhook {
        url: String,
        secret: String,
    },
    Fcm {
        device_token: String,
    },
}

impl TargetConfig {
    pub fn kind(&self) -> &'static str {
        match self {
            TargetConfig::WebPush { .. } => "web_push",
            TargetConfig::Ntfy { .. } => "ntfy",
            TargetConfig::Webhook { .. } => "webhook",
            TargetConfig::Fcm { .. } => "fcm",
        }
    }
}

/// The body as a target of `kind` gets it: channels the operator does not
/// control get it reduced at `detail = "minimal"` (no command, no summary);
/// Web Push is end-to-end encrypted and always gets everything. What the
/// agent wrote is cut to its bounds for every kind, and for the push
/// services further until the body fits what they carry ([`fits`]; see
/// [`fit`]).
pub fn body_for(kind: &str, detail: NotificationDetail, body: &Notification) -> Notification {
    let mut body = body.clone();
    if kind != "web_push" && detail == NotificationDetail::Minimal {
        reduce(&mut body);
    }
    if !fit::fit(&mut body, |body| fits(kind, body)) {
        tracing::warn!(
            kind,
            "a notification does not fit its channel even when reduced"
        );
    }
    body
}

/// Whether a target of `kind` can carry `body`: a Web Push payload
/// ([`web_push::MAX_PAYLOAD`]), an FCM message ([`fcm::fits`]), an ntfy
/// message ([`ntfy::fits`]); webhooks carry anything.
pub fn fits(kind: &str, body: &Notification) -> bool {
    match kind {
        "web_push" => {
            serde_json::to_vec(body).is_ok_and(|json| json.len() <= web_push::MAX_PAYLOAD)
        }
        "fcm" => fcm::fits(body),
        "ntfy" => ntfy::fits(body),
        _ => true,
    }
}

fn reduce(body: &mut Notification) {
    if let Some(request) = &mut body.request {
        request.command = None;
    }
    if let Some(turn) = &mut body.turn {
        turn.summary = None;
    }
}

/// Puts `outgoing` in the outbox of `store` (see [`Enqueue`]); the worker
/// still has to be woken.
pub async fn enqueue_into(
    store: &dyn Store,
    detail: NotificationDetail,
    outgoing: &Outgoing,
) -> Result<bool> {
    let event = outgoing.body.event.as_str();
    let make = |target: &TargetRecord| -> Option<NewDelivery> {
        if !target.wants(event) {
            return None;
        }
        let id = Uuid::now_v7();
        let mut body = body_for(&target.kind, detail, &outgoing.body);
        body.delivery_id = id;
        Some(NewDelivery {
            id,
            target_id: target.id,
            event: event.to_owned(),
            body: serde_json::to_string(&body).expect("a notification serializes"),
            collapse_key: outgoing.collapse_key.clone(),
        })
    };
    store
        .enqueue_notification(&outgoing.body.user, &outgoing.keys, Utc::now(), &make)
        .await
}

/// The outbox and its worker (see the module).
pub struct Outbox {
    store: Arc<dyn Store>,
    client: reqwest::Client,
    wake: Notify,
    detail: NotificationDetail,
    retry_base: Duration,
    allow_private: bool,
    vapid: VapidKeys,
    /// The VAPID `sub`: the base URL's origin where push services accept it.
    subject: String,
    fcm: Option<Fcm>,
    /// The node this outbox claims deliveries for.
    node: Uuid,
    /// Test sends per user (see [`TESTS_PER_MINUTE`]).
    tests: std::sync::Mutex<crate::ratelimit::SlidingWindow<String>>,
    /// Every attempt, once recorded (see [`Outbox::watch`]).
    recorded: tokio::sync::broadcast::Sender<AttemptRecord>,
    /// The deliveries whose attempt is under way on this node.
    in_flight: Arc<std::sync::Mutex<HashSet<Uuid>>>,
    /// Held (written) while claiming and checking [`Outbox::in_flight`],
    /// and (read) while an attempt is recorded and leaves it: a claim sees
    /// a row either before its attempt is recorded (in flight: left to it)
    /// or after it left (claimable as recorded), never recorded but still
    /// in flight, which would leave it claimed and unsent until the claim
    /// ran out.
    claiming: tokio::sync::RwLock<()>,
}

/// A delivery's place in [`Outbox::in_flight`], given up when dropped (the
/// attempt ended, or its task did).
struct InFlight {
    set: Arc<std::sync::Mutex<HashSet<Uuid>>>,
    id: Uuid,
}

impl InFlight {
    /// `None` when an attempt at `id` is already under way here.
    fn take(set: &Arc<std::sync::Mutex<HashSet<Uuid>>>, id: Uuid) -> Option<InFlight> {
        set.lock()
            .expect("not poisoned")
            .insert(id)
            .then(|| InFlight {
                set: set.clone(),
                id,
            })
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.set.lock().expect("not poisoned").remove(&self.id);
    }
}

impl Outbox {
    /// An outbox on `store`, with its VAPID keys (made and stored on first
    /// start) and, if configured, FCM.
    pub async fn new(
        store: Arc<dyn Store>,
        config: &Notifications,
        node: Uuid,
    ) -> anyhow::Result<Outbox> {
        use anyhow::Context;
        let client = guard::client(config.allow_private_targets)?;
        let vapid = VapidKeys::load(&*store)
            .await
            .context("Failed to load the VAPID keys")?;
        let fcm = match &config.fcm {
            Some(fcm) => Some(Fcm::new(fcm, client.clone()).context("Failed to set up FCM")?),
            None => None,
        };
        Ok(Outbox {
            store,
            client,
            wake: Notify::new(),
            detail: config.detail,
            retry_base: config.retry_base,
            allow_private: config.allow_private_targets,
            vapid,
            subject: web_push::subject_for(config.base_url.as_deref()),
            fcm,
            node,
            tests: Default::default(),
            recorded: tokio::sync::broadcast::channel(1024).0,
            in_flight: Default::default(),
            claiming: tokio::sync::RwLock::new(()),
        })
    }

    /// Every attempt this node makes, once it is recorded (tests wait on
    /// it instead of polling).
    pub fn watch(&self) -> tokio::sync::broadcast::Receiver<AttemptRecord> {
        self.recorded.subscribe()
    }

    pub fn vapid(&self) -> &VapidKeys {
        &self.vapid
    }

    /// Whether targets of kind `fcm` can be served.
    pub fn has_fcm(&self) -> bool {
        self.fcm.is_some()
    }

    /// Wakes the worker (something was enqueued).
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// How long to wait before the attempt after attempt `attempt` (1-based).
    fn backoff(&self, attempt: i32) -> Duration {
        self.retry_base * 2u32.saturating_pow(attempt.saturating_sub(1).max(0) as u32)
    }

    /// Sends what is due until `shutdown`: at once when woken (an enqueue,
    /// a send that ended), else at the next row's due time or [`POLL`],
    /// whichever comes first. Each delivery is sent on a task of its own,
    /// [`IN_FLIGHT`] at most, so that a receiver that takes its time holds
    /// up no one else's notification. At shutdown, sends under way finish
    /// (each bounded in time).
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let sends = TaskTracker::new();
        let places = Arc::new(Semaphore::new(IN_FLIGHT));
        let mut swept: Option<std::time::Instant> = None;
        while !shutdown.is_cancelled() {
            if swept.is_none_or(|at| at.elapsed() >= SWEEP_EVERY) {
                swept = Some(std::time::Instant::now());
                let before = Utc::now() - chrono::Duration::from_std(RETENTION).expect("small");
                match self.store.sweep_notifications(before).await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(rows = n, "old notification records forgotten"),
                    Err(e) => {
                        tracing::warn!(error = %e, "could not forget old notification records")
                    }
                }
            }
            // Registered before looking, so a wake during the look counts.
            let woken = self.wake.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            let free = places.available_permits().min(BATCH);
            if free > 0 {
                let now = Utc::now();
                let until = now + chrono::Duration::from_std(CLAIM).expect("small");
                let limit = i64::try_from(free).unwrap_or(1);
                let _claiming = self.claiming.write().await;
                match self
                    .store
                    .claim_deliveries(self.node, now, until, limit)
                    .await
                {
                    Ok(claimed) => {
                        let full = claimed.len() == free;
                        for delivery in claimed {
                            // Claimed again while its attempt still runs
                            // here: that attempt records it.
                            let Some(in_flight) = InFlight::take(&self.in_flight, delivery.id)
                            else {
                                tracing::warn!(delivery_id = %delivery.id,
                                    "a delivery whose attempt is under way was claimed again; left to that attempt");
                                continue;
                            };
                            let place = places
                                .clone()
                                .try_acquire_owned()
                                .expect("claimed no more than the free places");
                            let this = self.clone();
                            sends.spawn(async move {
                                this.process(delivery, in_flight).await;
                                drop(place);
                                this.wake();
                            });
                        }
                        if full {
                            continue;
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "could not claim notification deliveries"),
                }
            }
            let wait = match self.store.next_delivery_due().await {
                Ok(Some(due)) => (due - Utc::now()).to_std().unwrap_or_default().min(POLL),
                _ => POLL,
            };
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = &mut woken => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
        sends.close();
        sends.wait().await;
    }

    /// One attempt at a claimed delivery, recorded; it leaves `in_flight`
    /// once recorded.
    #[tracing::instrument(skip_all, fields(delivery_id = %delivery.id, target_id = %delivery.target_id))]
    async fn process(&self, delivery: DeliveryRecord, in_flight: InFlight) {
        let attempt = delivery.attempts + 1;
        let target = match self.store.get_target(delivery.target_id).await {
            Ok(Some(target)) => target,
            // Deleted meanwhile: its rows went with it.
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(error = %e, "could not read a notification target");
                return;
            }
        };
        // Its user removed after it was enqueued (or while it waited for a
        // retry): nothing more is sent to them.
        let removed = match self.store.user_removed(&target.owner).await {
            Ok(removed) => removed,
            Err(e) => {
                tracing::warn!(error = %e, "could not read whether a target's user was removed");
                return;
            }
        };
        let outcome = if target.gone {
            DeliveryOutcome::Failed {
                status: None,
                error: "the target is gone: not sent".into(),
            }
        } else if removed {
            DeliveryOutcome::Failed {
                status: None,
                error: "its user was removed: not sent".into(),
            }
        } else {
            self.send(
                &target,
                &delivery.body,
                delivery.id,
                delivery.collapse_key.as_deref(),
            )
            .await
        };
        let next = match &outcome {
            DeliveryOutcome::Failed { .. }
                if attempt < MAX_ATTEMPTS && !target.gone && !removed =>
            {
                let wait = chrono::Duration::from_std(self.backoff(attempt)).unwrap_or_default();
                AttemptNext::RetryAt(Utc::now() + wait)
            }
            _ => AttemptNext::Done,
        };
        let record = attempt_record(delivery.id, &target, &delivery.event, attempt, &outcome);
        let _recording = self.claiming.read().await;
        self.record(&target, &record, &outcome, next, true).await;
        drop(in_flight);
    }

    async fn record(
        &self,
        target: &TargetRecord,
        record: &AttemptRecord,
        outcome: &DeliveryOutcome,
        next: AttemptNext,
        from_outbox: bool,
    ) {
        crate::telemetry::notification_attempt(&target.kind, outcome_name(outcome));
        tracing::info!(kind = %target.kind, attempt = record.attempt, outcome = ?outcome, "notification attempt");
        if let Err(e) = self
            .store
            .record_attempt(record, &detail_of(outcome), next, from_outbox)
            .await
        {
            tracing::warn!(error = %e, "could not record a notification attempt");
            return;
        }
        let _ = self.recorded.send(record.clone());
    }

    /// Counts a test send of `user`'s, or 429 past [`TESTS_PER_MINUTE`].
    pub fn check_test_rate(&self, user: &str) -> Result<()> {
        let window = Duration::from_secs(60);
        let mut tests = self.tests.lock().expect("not poisoned");
        tests
            .try_hit(
                user.to_owned(),
                TESTS_PER_MINUTE,
                window,
                tokio::time::Instant::now(),
            )
            .map_err(|wait| crate::error::Error::TooManyRequests {
                detail: format!(
                    "at most {TESTS_PER_MINUTE} test notifications per minute per user"
                ),
                retry_after: wait.as_secs_f64().ceil().max(1.0) as u64,
            })
    }

    /// Sends a test notification to `target` now, records the attempt and
    /// answers it.
    pub async fn send_test(&self, target: &TargetRecord) -> AttemptRecord {
        let id = Uuid::now_v7();
        let body = Notification {
            event: NotificationEvent::Test,
            delivery_id: id,
            at: Utc::now(),
            user: target.owner.clone(),
            conversation: None,
            request: None,
            turn: None,
            count: 0,
            budget: None,
            actions: Vec::new(),
        };
        let text = serde_json::to_string(&body).expect("a notification serializes");
        let outcome = self.send(target, &text, id, None).await;
        let record = attempt_record(id, target, "test", 1, &outcome);
        self.record(target, &record, &outcome, AttemptNext::Done, false)
            .await;
        record
    }

    /// One attempt at the target's service: one HTTP request (FCM: and its
    /// OAuth token), within [`ATTEMPT`].
    async fn send(
        &self,
        target: &TargetRecord,
        body: &str,
        delivery_id: Uuid,
        collapse_key: Option<&str>,
    ) -> DeliveryOutcome {
        let attempt = async {
            let failed = |error: String| DeliveryOutcome::Failed {
                status: None,
                error,
            };
            let config: TargetConfig = match serde_json::from_str(&target.config) {
                Ok(config) => config,
                Err(e) => return failed(format!("unreadable target settings: {e}")),
            };
            let url = match &config {
                TargetConfig::Ntfy { url, .. } | TargetConfig::Webhook { url, .. } => Some(url),
                TargetConfig::WebPush { endpoint, .. } => Some(endpoint),
                TargetConfig::Fcm { .. } => None,
            };
            if let (Some(url), false) = (url, self.allow_private) {
                let checked = reqwest::Url::parse(url)
                    .map_err(|e| e.to_string())
                    .and_then(|u| guard::check_literal(&u));
                if let Err(e) = checked {
                    return failed(format!("refused: {e}"));
                }
            }
            match &config {
                TargetConfig::Webhook { url, secret } => {
                    webhook::deliver(&self.client, url, secret, delivery_id, body.as_bytes()).await
                }
                TargetConfig::Ntfy { url, token } => match serde_json::from_str(body) {
                    Ok(n) => {
                        ntfy::deliver(&self.client, url, token.as_deref(), delivery_id, &n).await
                    }
                    Err(e) => failed(format!("unreadable body: {e}")),
                },
                TargetConfig::WebPush {
                    endpoint,
                    p256dh,
                    auth,
                } => {
                    let sender = web_push::Sender {
                        vapid: &self.vapid,
                        subject: &self.subject,
                    };
                    let to = web_push::Subscription {
                        endpoint,
                        p256dh,
                        auth,
                    };
                    // A body stored by an older version may not fit yet.
                    let fitted = (body.len() > web_push::MAX_PAYLOAD)
                        .then(|| serde_json::from_str::<Notification>(body).ok())
                        .flatten()
                        .map(|n| body_for("web_push", NotificationDetail::Full, &n))
                        .and_then(|n| serde_json::to_string(&n).ok());
                    let push = web_push::Push {
                        payload: fitted.as_deref().unwrap_or(body).as_bytes(),
                        topic: collapse_key,
                        ttl_seconds: WEB_PUSH_TTL,
                    };
                    web_push::deliver_as(&self.client, &sender, &to, &push).await
                }
                TargetConfig::Fcm { device_token } => match (&self.fcm, serde_json::from_str(body))
                {
                    (Some(fcm), Ok(n)) => fcm.deliver(device_token, &n, collapse_key).await,
                    (None, _) => failed("FCM is not configured ([notifications.fcm])".into()),
                    (_, Err(e)) => failed(format!("unreadable body: {e}")),
                },
            }
        };
        tokio::time::timeout(ATTEMPT, attempt)
            .await
            .unwrap_or_else(|_| DeliveryOutcome::Failed {
                status: None,
                error: format!(
                    "no outcome within {} s (the attempt's bound)",
                    ATTEMPT.as_secs()
                ),
            })
    }
}

#[async_trait::async_trait]
impl Enqueue for Outbox {
    async fn enqueue(&self, outgoing: Outgoing) -> Result<bool> {
        let enqueued = enqueue_into(&*self.store, self.detail, &outgoing).await?;
        if enqueued {
            self.wake();
        }
        Ok(enqueued)
    }
}

/// `delivered`, `failed` or `gone`.
pub fn outcome_name(outcome: &DeliveryOutcome) -> &'static str {
    match outcome {
        DeliveryOutcome::Delivered { .. } => "delivered",
        DeliveryOutcome::Failed { .. } => "failed",
        DeliveryOutcome::Gone { .. } => "gone",
    }
}

fn detail_of(outcome: &DeliveryOutcome) -> String {
    match outcome {
        DeliveryOutcome::Delivered { status } | DeliveryOutcome::Gone { status } => {
            format!("HTTP {status}")
        }
        DeliveryOutcome::Failed { error, .. } => error.clone(),
    }
}

fn attempt_record(
    delivery_id: Uuid,
    target: &TargetRecord,
    event: &str,
    attempt: i32,
    outcome: &DeliveryOutcome,
) -> AttemptRecord {
    let (status, error) = match outcome {
        DeliveryOutcome::Delivered { status } | DeliveryOutcome::Gone { status } => {
            (Some(*status), None)
        }
        DeliveryOutcome::Failed { status, error } => (*status, Some(error.clone())),
    };
    AttemptRecord {
        delivery_id,
        target_id: target.id,
        event: event.to_owned(),
        attempt,
        outcome: outcome_name(outcome).to_owned(),
        http_status: status.map(i32::from),
        error,
        at: now_millis(),
    }
}

/// Now, to the millisecond (what both databases keep alike).
fn now_millis() -> DateTime<Utc> {
    let now = Utc::now();
    DateTime::from_timestamp_millis(now.timestamp_millis()).unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::notify::{RequestRef, TurnRef};

    #[test]
    fn minimal_detail_leaves_out_the_command_and_the_summary_but_not_for_web_push() {
        let body = Notification {
            event: NotificationEvent::PermissionWaiting,
            delivery_id: Uuid::nil(),
            at: Utc::now(),
            user: "ann".into(),
            conversation: None,
            request: Some(RequestRef {
                id: Uuid::nil(),
                title: Some("Run".into()),
                kind: Some("execute".into()),
                command: Some("rm -rf /".into()),
            }),
            turn: Some(TurnRef {
                id: Uuid::nil(),
                stop_reason: None,
                summary: Some("secret".into()),
            }),
            count: 1,
            budget: None,
            actions: vec![],
        };
        for kind in ["webhook", "ntfy", "fcm"] {
            let reduced = body_for(kind, NotificationDetail::Minimal, &body);
            assert_eq!(reduced.request.unwrap().command, None);
            assert_eq!(reduced.turn.unwrap().summary, None);
            assert_eq!(body_for(kind, NotificationDetail::Full, &body), body);
        }
        assert_eq!(
            body_for("web_push", NotificationDetail::Minimal, &body),
            body
        );
    }
}
