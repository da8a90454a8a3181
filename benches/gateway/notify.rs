//! Notifications: many conversations asking for permission at
//! once, nobody present; how long from a request becoming due (its
//! `created_at` + `notifications.grace`) until a webhook receiver has its
//! notification, and what that costs the gateway in CPU. The time is split:
//! from `created_at` until the request's socket showed it (its commit
//! published: nothing learns of it sooner, the notifier included), from due
//! until the notifier handed it to the outbox, and from there on.
//!
//! The gateway runs as its own process (`acp-gateway serve`, as in
//! `load.rs`) with a short grace and `allow_private_targets`; the receiver
//! is an axum server in this process, on loopback, that notes when each
//! POST arrived and answers 200 at once. Each conversation has a user of its
//! own (a token each, made by an operator over the API) with one webhook
//! target: requests of one user that become due together make one
//! notification with `count` > 1, so with one user per conversation every
//! request is a notification of its own (checked: `count` is 1 in each).
//! Each conversation's socket is open (to see its agent ready and its
//! request's `created_at`); in the round measured it never says it is
//! visible, so nobody counts as present.
//!
//! Three rounds, each conversation asking once (`ask 1`) at the same
//! moment, then every request answered: one to warm up and a control, both
//! with every owner present (`{"type":"presence","visible":true}`: nothing
//! comes due, the receiver must get nothing), then the one measured, nobody
//! present. The gateway's CPU per delivery is its process's CPU time
//! (`/proc/<pid>/stat`, user + system; the agents are other processes and
//! not counted) over the measured round minus the same over the control
//! round (prompts until 300 ms after the last receipt, or after the grace
//! and the 100 ms batch), divided by the notifications received: what
//! notifying costs beyond the asking (the notifier, the outbox's rows, the
//! HTTP request, the attempt recorded).
//!
//! Sizes (environment): BENCH_NOTIFY_CONVERSATIONS (200; 0 skips it),
//! BENCH_NOTIFY_GRACE_MS (200).

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use futures::StreamExt;
use serde_json::{json, Value};

use crate::common::*;
use crate::load::{quantile, sorted, Cpu, Served, SETUP_CONCURRENCY};

pub struct NotifyReport {
    pub backend: String,
    pub conversations: usize,
    pub grace_ms: u64,
    /// Distinct requests the receiver got a notification of.
    pub received: usize,
    /// Notifications beyond the first of a request.
    pub duplicates: usize,
    /// The largest `count` a notification carried.
    pub max_count: u64,
    /// Arrival at the receiver − (the request's `created_at` + grace), ms.
    /// It can be below 0: the notifier hands over, with what is due, every
    /// request whose grace ends within the next 100 ms (`rules::BATCH`).
    pub latency_ms: Vec<f64>,
    /// The body's `at` (when the notifier handed it over) − due, ms.
    pub handed_ms: Vec<f64>,
    /// Arrival − the body's `at`: the outbox and the HTTP request, ms.
    pub outbox_ms: Vec<f64>,
    /// When the request's socket showed it − its `created_at`, ms: how late
    /// the gateway (and so its notifier) learns of a request under this
    /// load.
    pub shown_ms: Vec<f64>,
    /// From the prompts until every request was shown on its socket, s.
    pub ask_secs: f64,
    /// CPU of the control round: the same asking, owners present.
    control_cpu: Cpu,
    /// CPU of the round measured, until the last notification arrived.
    measured_cpu: Cpu,
}

impl fmt::Display for NotifyReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lost = self.conversations - self.received;
        write!(
            f,
            "[{}] notifications: {} conversations asking at once (a user and a webhook each), nobody present, grace {} ms; \
             due → webhook received p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms, min {:.1} ms (target p99 ≤ 250) \
             [created → shown on its socket p50 {:.1} ms, p99 {:.1} ms; \
             due → handed to the outbox p50 {:.1} ms, p99 {:.1} ms; handed → received p50 {:.1} ms, p99 {:.1} ms]; \
             received {} of {}, lost {lost}, duplicates {}, largest count {}; \
             gateway CPU per delivery {:.2} ms (the round's {:.0} ms − {:.0} ms for the same asking with owners present; \
             asking itself {:.2} ms per request, {:.2} s to ask them all); bench clients and receiver {:.2} ms per delivery",
            self.backend,
            self.conversations,
            self.grace_ms,
            quantile(&self.latency_ms, 0.5),
            quantile(&self.latency_ms, 0.99),
            self.latency_ms.last().copied().unwrap_or(f64::NAN),
            self.latency_ms.first().copied().unwrap_or(f64::NAN),
            quantile(&self.shown_ms, 0.5),
            quantile(&self.shown_ms, 0.99),
            quantile(&self.handed_ms, 0.5),
            quantile(&self.handed_ms, 0.99),
            quantile(&self.outbox_ms, 0.5),
            quantile(&self.outbox_ms, 0.99),
            self.received,
            self.conversations,
            self.duplicates,
            self.max_count,
            (self.measured_cpu.gateway - self.control_cpu.gateway) / self.received.max(1) as f64,
            self.measured_cpu.gateway,
            self.control_cpu.gateway,
            self.control_cpu.gateway / self.conversations as f64,
            self.ask_secs,
            (self.measured_cpu.client - self.control_cpu.client) / self.received.max(1) as f64,
        )
    }
}

/// What the receiver got: when, and the body.
struct Arrival {
    at: DateTime<Utc>,
    body: Value,
}

/// A webhook receiver on loopback: every POST is noted (time first) and
/// answered 200.
struct Receiver {
    base: String,
    arrivals: Arc<Mutex<Vec<Arrival>>>,
    /// Woken on each arrival.
    arrived: Arc<tokio::sync::Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl Receiver {
    async fn start() -> Receiver {
        let arrivals: Arc<Mutex<Vec<Arrival>>> = Arc::default();
        let arrived = Arc::new(tokio::sync::Notify::new());
        let (noted, woken) = (arrivals.clone(), arrived.clone());
        let app = axum::Router::new().route(
            "/hook/{user}",
            axum::routing::post(move |body: axum::body::Bytes| {
                let at = Utc::now();
                let (noted, woken) = (noted.clone(), woken.clone());
                async move {
                    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                    noted.lock().unwrap().push(Arrival { at, body });
                    woken.notify_one();
                    axum::http::StatusCode::OK
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Receiver {
            base,
            arrivals,
            arrived,
            task,
        }
    }

    /// Distinct request ids received so far.
    fn distinct(&self) -> usize {
        let arrivals = self.arrivals.lock().unwrap();
        let ids: std::collections::HashSet<&Value> =
            arrivals.iter().map(|a| &a.body["request"]["id"]).collect();
        ids.len()
    }
}

/// One user of the scenario: a token, a conversation, a socket on it.
struct Asker {
    token: String,
    conversation: String,
    ws: Ws,
}

/// Makes user `i`: a token (from the operator), a webhook target, a
/// conversation whose agent is ready, a socket on it.
async fn asker(served: &Served, operator: &str, receiver: &str, i: usize) -> Asker {
    let post = |path: String, token: String, body: Value| {
        let req = served
            .http
            .post(served.url(&path))
            .bearer_auth(token)
            .json(&body);
        async move {
            let resp = req.send().await.unwrap();
            let status = resp.status().as_u16();
            let body: Value = resp.json().await.unwrap();
            (status, body)
        }
    };
    let user = format!("bench-user-{i}");
    let (status, made) = post(
        "/api/v1/tokens".into(),
        operator.to_owned(),
        json!({"user": user, "role": "user"}),
    )
    .await;
    assert_eq!(status, 201, "token: {made}");
    let token = made["token"].as_str().unwrap().to_owned();
    let (status, target) = post(
        "/api/v1/notification-targets".into(),
        token.clone(),
        json!({"kind": "webhook", "url": format!("{receiver}/hook/{i}"), "events": ["permission_waiting"]}),
    )
    .await;
    assert_eq!(status, 201, "webhook target: {target}");
    let (status, conversation) = post(
        "/api/v1/conversations".into(),
        token.clone(),
        json!({"agent": "demo"}),
    )
    .await;
    assert_eq!(status, 201, "conversation: {conversation}");
    let conversation = conversation["id"].as_str().unwrap().to_owned();
    let mut ws = served
        .gw
        .ws(&format!(
            "/api/v1/conversations/{conversation}/ws?after=0&access_token={token}"
        ))
        .await;
    ws.until(|e| e["type"] == "agent_status" && e["data"]["status"] == "ready")
        .await;
    Asker {
        token,
        conversation,
        ws,
    }
}

impl Asker {
    /// `{"type":"presence","visible":…}` on its socket.
    async fn say_present(&mut self, visible: bool) {
        use futures::SinkExt;
        let frame = json!({"type": "presence", "visible": visible}).to_string();
        self.ws
            .stream
            .send(tokio_tungstenite::tungstenite::Message::Text(frame.into()))
            .await
            .unwrap();
    }
}

/// Prompts `ask 1`; the request's id and `created_at` once its socket shows
/// it, and when it showed it.
async fn ask(served: &Served, asker: &mut Asker) -> (String, DateTime<Utc>, DateTime<Utc>) {
    let resp = served
        .http
        .post(served.url(&format!(
            "/api/v1/conversations/{}/prompts",
            asker.conversation
        )))
        .bearer_auth(&asker.token)
        .json(&json!({"text": "ask 1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202, "prompt accepted");
    let shown = asker.ws.until_type("permission_requested").await;
    let shown_at = Utc::now();
    let data = &shown.last().unwrap()["data"];
    let created: DateTime<Utc> = serde_json::from_value(data["created_at"].clone()).unwrap();
    (data["id"].as_str().unwrap().to_owned(), created, shown_at)
}

/// Answers the request (allow once) and waits for the turn to end.
async fn answer(served: &Served, asker: &mut Asker, request: &str) {
    let resp = served
        .http
        .post(served.url(&format!("/api/v1/permissions/{request}/respond")))
        .bearer_auth(&asker.token)
        .json(&json!({"option_id": "allow-once"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "answered");
    asker.ws.until_type("turn_ended").await;
}

/// What one round measured.
struct Round {
    /// Each request's id, `created_at`, and when its socket showed it.
    asked: Vec<(String, DateTime<Utc>, DateTime<Utc>)>,
    ask_secs: f64,
    /// From the prompts until what is waited for is done and [`SETTLE`]
    /// more (the attempts recorded).
    cpu: Cpu,
}

/// How long a round's CPU window runs on after what it waits for.
const SETTLE: Duration = Duration::from_millis(300);

/// Every conversation asks at once, its owner `present` or not; then, with
/// owners present, the grace and the notifier's 100 ms batch pass (nothing
/// comes due).
async fn round(served: &Served, askers: &mut [Asker], present: bool, grace_ms: u64) -> Round {
    let waited = tokio::time::sleep(Duration::from_millis(grace_ms + 100));
    round_until(served, askers, present, waited).await
}

/// Every conversation asks at once, its owner `present` or not; the CPU
/// window closes [`SETTLE`] after `waited` (begun once every request is
/// shown); then every request is answered and every turn ends.
async fn round_until(
    served: &Served,
    askers: &mut [Asker],
    present: bool,
    waited: impl std::future::Future<Output = ()>,
) -> Round {
    if present {
        for a in askers.iter_mut() {
            a.say_present(true).await;
        }
        // The frames have no answer: time for the gateway to take them in.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let cpu_before = served.cpu();
    let started = Instant::now();
    let asked: Vec<(String, DateTime<Utc>, DateTime<Utc>)> =
        futures::future::join_all(askers.iter_mut().map(|a| ask(served, a))).await;
    let ask_secs = started.elapsed().as_secs_f64();
    waited.await;
    tokio::time::sleep(SETTLE).await;
    let cpu = served.cpu() - cpu_before;
    futures::future::join_all(
        askers
            .iter_mut()
            .zip(&asked)
            .map(|(a, (request, _, _))| answer(served, a, request)),
    )
    .await;
    if present {
        for a in askers.iter_mut() {
            a.say_present(false).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    Round {
        asked,
        ask_secs,
        cpu,
    }
}

/// `conversations` conversations of as many users, each asking once at the
/// same moment, nobody present: see the module.
pub async fn notifications(
    backend: &str,
    db: &TestDb,
    conversations: usize,
    grace_ms: u64,
) -> NotifyReport {
    let operator = cli_token(db, "bench-operator", "operator");
    let receiver = Receiver::start().await;
    let extra =
        format!("[notifications]\ngrace = \"{grace_ms}ms\"\nallow_private_targets = true\n");
    let served = Served::start_with(db, &[], &extra);
    let mut askers: Vec<Asker> = futures::stream::iter(0..conversations)
        .map(|i| asker(&served, &operator, &receiver.base, i))
        .buffer_unordered(SETUP_CONCURRENCY)
        .collect()
        .await;

    // A round to warm up, then the control: the same asking, everyone
    // present (nothing is due); then the round measured, nobody present.
    round(&served, &mut askers, true, grace_ms).await;
    let control = round(&served, &mut askers, true, grace_ms).await;
    assert_eq!(
        receiver.arrivals.lock().unwrap().len(),
        0,
        "nothing is notified while its owner is present"
    );
    let waited = {
        let receiver = &receiver;
        async move {
            let deadline = tokio::time::Instant::now() + WAIT + Duration::from_millis(grace_ms);
            while receiver.distinct() < conversations {
                let arrived = receiver.arrived.notified();
                if tokio::time::timeout_at(deadline, arrived).await.is_err() {
                    break;
                }
            }
        }
    };
    let measured = round_until(&served, &mut askers, false, waited).await;
    for a in askers {
        a.ws.close().await;
    }
    served.stop();
    receiver.task.abort();
    let asked = measured.asked;

    let created: HashMap<&str, DateTime<Utc>> =
        asked.iter().map(|(id, at, _)| (id.as_str(), *at)).collect();
    let grace = chrono::Duration::milliseconds(grace_ms as i64);
    let ms = |d: chrono::Duration| d.num_microseconds().unwrap_or(i64::MAX) as f64 / 1000.0;
    let arrivals = std::mem::take(&mut *receiver.arrivals.lock().unwrap());
    let mut seen = std::collections::HashSet::new();
    let (mut latency_ms, mut handed_ms, mut outbox_ms) = (Vec::new(), Vec::new(), Vec::new());
    let (mut duplicates, mut max_count) = (0, 0);
    for arrival in &arrivals {
        let body = &arrival.body;
        assert_eq!(body["event"], "permission_waiting", "{body}");
        let request = body["request"]["id"].as_str().unwrap_or_default();
        let Some(&created_at) = created.get(request) else {
            panic!("a notification of a request nobody asked: {body}");
        };
        max_count = max_count.max(body["count"].as_u64().unwrap_or(0));
        if !seen.insert(request.to_owned()) {
            duplicates += 1;
            continue;
        }
        let due = created_at + grace;
        let handed: DateTime<Utc> = serde_json::from_value(body["at"].clone()).unwrap();
        latency_ms.push(ms(arrival.at - due));
        handed_ms.push(ms(handed - due));
        outbox_ms.push(ms(arrival.at - handed));
    }
    let report = NotifyReport {
        backend: backend.to_owned(),
        conversations,
        grace_ms,
        received: seen.len(),
        duplicates,
        max_count,
        latency_ms: sorted(latency_ms),
        handed_ms: sorted(handed_ms),
        outbox_ms: sorted(outbox_ms),
        shown_ms: sorted(
            asked
                .iter()
                .map(|(_, at, shown)| ms(*shown - *at))
                .collect(),
        ),
        ask_secs: measured.ask_secs,
        control_cpu: control.cpu,
        measured_cpu: measured.cpu,
    };
    println!("{report}");
    assert_eq!(
        report.received,
        conversations,
        "every request is notified (lost {})",
        conversations - report.received
    );
    assert_eq!(report.max_count, 1, "one request per notification");
    report
}
