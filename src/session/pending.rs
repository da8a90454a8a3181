//! The permission requests waiting in a session for their answer: when
//! each times out, what a timeout answers, and the answers the operator's
//! policies give at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;
use uuid::Uuid;

use crate::acp::rpc::Responder;
use crate::model::{Decision, PermissionRequest, PermissionStatus, Rule};
use crate::permissions::policy::{Facts, Policies, RateLimiter};
use crate::permissions::{automatic_answer, timeout_option, OnTimeout};

/// A request waiting for its answer, with the way to send it to the agent.
pub struct Parked {
    pub request: PermissionRequest,
    pub responder: Responder,
    /// When it was due to time out, while it is claimed (see
    /// [`Pending::put_back`]).
    deadline: Option<Instant>,
}

/// Each request waiting for a person, across the sessions of this node: an
/// answer goes straight to its session (the request names its
/// conversation) without asking the database where the request belongs,
/// and an inbox's snapshot shows what the database may not hold yet (a
/// request asked while it was away).
pub type WaitingRequests = Arc<Mutex<HashMap<Uuid, WaitingRequest>>>;

/// A request waiting in a session of this node, and whose conversation it
/// is (for who may see it).
#[derive(Debug, Clone)]
pub struct WaitingRequest {
    pub request: PermissionRequest,
    pub owner: Option<String>,
}

/// See the module docs.
pub struct Pending {
    parked: HashMap<Uuid, Parked>,
    /// This node's index of waiting requests, kept in step with `parked`.
    waiting: WaitingRequests,
    /// Whose conversation's requests these are.
    owner: Option<String>,
    deadlines: Deadlines,
    /// Automatic approvals per policy rule, for `max_auto_per`.
    limiter: RateLimiter,
    timeout: Option<Duration>,
    on_timeout: OnTimeout,
}

impl Pending {
    /// Requests time out after `timeout` (never without one), answered as
    /// `on_timeout` says.
    pub fn new(
        timeout: Option<Duration>,
        on_timeout: OnTimeout,
        waiting: WaitingRequests,
        owner: Option<String>,
    ) -> Pending {
        Pending {
            parked: HashMap::new(),
            waiting,
            owner,
            deadlines: Deadlines::default(),
            limiter: RateLimiter::default(),
            timeout,
            on_timeout,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.parked.is_empty()
    }

    pub fn get(&self, id: Uuid) -> Option<&PermissionRequest> {
        self.parked.get(&id).map(|p| &p.request)
    }

    /// Holds a request until it is answered (or times out).
    pub fn park(&mut self, request: PermissionRequest, responder: Responder) {
        let id = request.id;
        self.index(&request);
        self.parked.insert(
            id,
            Parked {
                request,
                responder,
                deadline: None,
            },
        );
        if let Some(timeout) = self.timeout {
            self.deadlines.set(id, timeout);
        }
    }

    /// Puts `request` in this node's index of waiting requests.
    fn index(&self, request: &PermissionRequest) {
        let waiting = WaitingRequest {
            request: request.clone(),
            owner: self.owner.clone(),
        };
        self.waiting.lock().unwrap().insert(request.id, waiting);
    }

    /// Holds a request an earlier run of the gateway parked (its agent
    /// reattached): it times out when it would have then.
    pub fn park_restored(&mut self, request: PermissionRequest, responder: Responder) {
        let waited = (crate::model::now() - request.created_at)
            .to_std()
            .unwrap_or_default();
        let timeout = self.timeout;
        let id = request.id;
        self.park(request, responder);
        if let Some(timeout) = timeout {
            self.deadlines.set(id, timeout.saturating_sub(waited));
        }
    }

    /// Claims a request to answer it: it no longer waits, nor times out.
    pub fn claim(&mut self, id: Uuid) -> Option<Parked> {
        let deadline = self.deadlines.take(id);
        self.waiting.lock().unwrap().remove(&id);
        let parked = self.parked.remove(&id)?;
        Some(Parked { deadline, ..parked })
    }

    /// Returns a request whose answer could not be recorded: it is pending
    /// as before it was claimed, so nothing is lost, and times out when it
    /// would have (at once, if that time passed meanwhile).
    pub fn put_back(&mut self, parked: Parked) {
        let id = parked.request.id;
        self.index(&parked.request);
        if let Some(at) = parked.deadline {
            self.deadlines.set_at(id, at);
        }
        self.parked.insert(
            id,
            Parked {
                deadline: None,
                ..parked
            },
        );
    }

    /// Times `id` out again after `after` (its answer could not be
    /// recorded just now).
    pub fn retry_later(&mut self, id: Uuid, after: Duration) {
        if self.parked.contains_key(&id) {
            self.deadlines.set(id, after);
        }
    }

    /// Every waiting request, oldest first.
    pub fn ids(&self) -> Vec<Uuid> {
        let mut ids: Vec<Uuid> = self.parked.keys().copied().collect();
        ids.sort();
        ids
    }

    /// The request the agent sent as JSON-RPC request `rpc_id`.
    pub fn find_by_rpc_id(&self, rpc_id: &Value) -> Option<Uuid> {
        self.parked
            .iter()
            .find(|(_, p)| p.responder.id() == rpc_id)
            .map(|(id, _)| *id)
    }

    /// Waits until requests time out, then returns them (cancel-safe; never
    /// returns while none can).
    pub async fn due(&self) -> Vec<Uuid> {
        self.deadlines.due().await
    }

    /// A request that timed out: its deadline is cleared, and (if it is
    /// still waiting) the option it is answered with (`None`: cancelled).
    pub fn expire(&mut self, id: Uuid) -> Option<Option<String>> {
        self.deadlines.remove(id);
        let request = self.get(id)?;
        Some(timeout_option(request, self.on_timeout))
    }

    /// Why timed-out requests were answered as they were.
    pub fn timeout_reason(&self) -> String {
        let after = self.timeout.unwrap_or_default();
        format!(
            "no answer within {} (on_timeout = {})",
            humantime_serde::re::humantime::format_duration(after),
            match self.on_timeout {
                OnTimeout::Reject => "reject",
                OnTimeout::Cancel => "cancel",
            }
        )
    }

    /// What the operator's policies answer a new request at once, counting
    /// the approval against its rule's rate limit; `None`: a person decides.
    pub fn decide(
        &mut self,
        request: &PermissionRequest,
        policies: &Policies,
        facts: &Facts<'_>,
        remembered: &[Rule],
    ) -> Option<(PermissionStatus, Decision)> {
        let now = Instant::now();
        let verdict = policies.evaluate(facts, remembered, Some(&self.limiter), now);
        let (status, option_id) = automatic_answer(request, &verdict)?;
        let rule = verdict.rule.as_deref().unwrap_or("default");
        tracing::info!(permission_id = %request.id, rule, decision = ?verdict.decision, "decided by policy");
        let decision = Decision::new(
            option_id,
            format!("policy:{rule}"),
            Some(verdict.reason.clone()),
        );
        self.limiter.record(&verdict, now);
        Some((status, decision))
    }
}

impl Drop for Pending {
    /// The session ended: its requests no longer wait on this node.
    fn drop(&mut self) {
        let mut waiting = self.waiting.lock().unwrap();
        for id in self.parked.keys() {
            waiting.remove(id);
        }
    }
}

/// When pending requests run out of time. Owned by one session; waiting on
/// [`Deadlines::due`] is cancel-safe, so it can sit in a `select!`.
#[derive(Debug, Default)]
pub struct Deadlines {
    at: HashMap<Uuid, Instant>,
}

impl Deadlines {
    /// `id` times out `after` from now.
    pub fn set(&mut self, id: Uuid, after: Duration) {
        self.at.insert(id, Instant::now() + after);
    }

    /// `id` times out at `at`.
    pub fn set_at(&mut self, id: Uuid, at: Instant) {
        self.at.insert(id, at);
    }

    /// `id` was answered: it no longer times out.
    pub fn remove(&mut self, id: Uuid) {
        self.at.remove(&id);
    }

    /// Like [`Deadlines::remove`], returning when `id` was due.
    pub fn take(&mut self, id: Uuid) -> Option<Instant> {
        self.at.remove(&id)
    }

    /// Waits until a deadline has passed, then returns every id that is due,
    /// earliest first. Never returns while there is none.
    pub async fn due(&self) -> Vec<Uuid> {
        let Some(next) = self.at.values().min().copied() else {
            return std::future::pending().await;
        };
        tokio::time::sleep_until(next).await;
        let now = Instant::now();
        let mut due: Vec<(Instant, Uuid)> = self
            .at
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(id, at)| (*at, *id))
            .collect();
        due.sort();
        due.into_iter().map(|(_, id)| id).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model;

    #[tokio::test(start_paused = true)]
    async fn deadlines_fire_in_order_as_time_passes_and_answered_ones_never() {
        let (a, b, c) = (model::new_id(), model::new_id(), model::new_id());
        let mut deadlines = Deadlines::default();
        let start = Instant::now();
        deadlines.set(b, Duration::from_secs(20));
        deadlines.set(a, Duration::from_secs(10));
        deadlines.set(c, Duration::from_secs(15));
        deadlines.remove(c); // answered in time
        assert_eq!(deadlines.due().await, [a]);
        assert_eq!(start.elapsed(), Duration::from_secs(10));
        deadlines.remove(a);
        assert_eq!(deadlines.due().await, [b]);
        assert_eq!(start.elapsed(), Duration::from_secs(20));
        deadlines.remove(b);
        let nothing = tokio::time::timeout(Duration::from_secs(3600), deadlines.due()).await;
        assert!(nothing.is_err(), "no deadline, nothing due");
    }

    #[tokio::test(start_paused = true)]
    async fn deadlines_that_passed_together_are_returned_together() {
        let (a, b) = (model::new_id(), model::new_id());
        let mut deadlines = Deadlines::default();
        deadlines.set(a, Duration::from_secs(5));
        deadlines.set(b, Duration::from_secs(1));
        tokio::time::advance(Duration::from_secs(6)).await;
        assert_eq!(deadlines.due().await, [b, a]);
    }

    /// A request parked with `timeout`, its responder on a peer of its own.
    fn parked(timeout: Duration) -> (Pending, Uuid, crate::acp::rpc::RpcPeer) {
        use crate::acp::rpc::{RpcConfig, RpcPeer};
        let (ours, _theirs) = tokio::io::duplex(1024);
        let (reader, writer) = tokio::io::split(ours);
        let (peer, _incoming) =
            RpcPeer::spawn::<crate::acp::chunk::TextChunk>(reader, writer, RpcConfig::default());
        let request = PermissionRequest {
            id: model::new_id(),
            conversation_id: model::new_id(),
            turn_id: None,
            tool_call: serde_json::json!({"toolCallId": "t"}),
            options: vec![serde_json::json!({"optionId": "no", "kind": "reject_once"})],
            status: PermissionStatus::Pending,
            decision: None,
            created_at: model::now(),
        };
        let id = request.id;
        let mut pending = Pending::new(Some(timeout), OnTimeout::Reject, Default::default(), None);
        pending.park(
            request,
            peer.responder_for(1.into(), "session/request_permission"),
        );
        (pending, id, peer)
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_put_back_after_a_failed_answer_times_out_when_it_would_have() {
        let (mut pending, id, _peer) = parked(Duration::from_secs(60));
        let start = Instant::now();
        tokio::time::advance(Duration::from_secs(20)).await;
        let claimed = pending.claim(id).unwrap();
        assert!(pending.is_empty());
        // The answer could not be recorded: the request is as it was.
        tokio::time::advance(Duration::from_secs(5)).await;
        pending.put_back(claimed);
        assert_eq!(pending.ids(), [id]);
        assert!(pending.waiting.lock().unwrap().contains_key(&id));
        let due = tokio::time::timeout(Duration::from_secs(3600), pending.due()).await;
        assert_eq!(due.ok(), Some(vec![id]), "it still times out");
        assert_eq!(start.elapsed(), Duration::from_secs(60));
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_put_back_past_its_deadline_times_out_at_once() {
        let (mut pending, id, _peer) = parked(Duration::from_secs(10));
        let claimed = pending.claim(id).unwrap();
        // The failed answer took longer than the request had left.
        tokio::time::advance(Duration::from_secs(30)).await;
        pending.put_back(claimed);
        let now = Instant::now();
        let due = tokio::time::timeout(Duration::from_secs(3600), pending.due()).await;
        assert_eq!(due.ok(), Some(vec![id]), "it still times out");
        assert_eq!(now.elapsed(), Duration::ZERO);
        // Expired for its timeout, then put back after a failed answer
        // again: no deadline comes back with it (`retry_later` sets one).
        assert_eq!(pending.expire(id), Some(Some("no".into())));
        let claimed = pending.claim(id).unwrap();
        pending.put_back(claimed);
        let nothing = tokio::time::timeout(Duration::from_secs(3600), pending.due()).await;
        assert!(nothing.is_err(), "no deadline, nothing due");
    }
}
