//! The permission requests waiting in a session for their answer: when
//! each times out, what a timeout answers, and the answers the operator's
//! policies give at once.
//!
//! A waiting request is held once on a node, in its [`WaitingRequests`]:
//! the request, whose conversation it is, and the way to answer its agent.
//! Each session's [`Pending`] is its view of that index (and its deadlines),
//! the API finds a request there without asking the database, and what the
//! database keeps for a restart is derived from it (the request's row, and
//! the agent's JSON-RPC ids of [`Pending::rpc_ids`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;
use uuid::Uuid;

use crate::acp::rpc::Responder;
use crate::error::Result;
use crate::model::{Answer, Decision, PermissionRequest, PermissionStatus, Rule};
use crate::permissions::policy::{Facts, Policies, RateLimiter};
use crate::permissions::{automatic_answer, judge_answer, timeout_answer, Judged, OnTimeout};

/// Each request waiting for a person, across the sessions of this node: an
/// answer goes straight to its session (the request names its
/// conversation) without asking the database where the request belongs,
/// and an inbox's snapshot shows what the database may not hold yet (a
/// request asked while it was away).
pub type WaitingRequests = Arc<Mutex<HashMap<Uuid, WaitingRequest>>>;

/// A request waiting in a session of this node, whose conversation it is
/// (for who may see it), and the way to send its answer to the agent.
pub struct WaitingRequest {
    pub request: PermissionRequest,
    pub owner: Option<String>,
    pub(super) responder: Responder,
    /// The [`Pending`] that holds it (a conversation's ending session and
    /// the next may both have one for a moment).
    held_by: Uuid,
}

/// A request claimed to be answered: out of the index, with when it was
/// due to time out (see [`Pending::put_back`]).
pub struct Parked {
    pub request: PermissionRequest,
    pub responder: Responder,
    owner: Option<String>,
    deadline: Option<Instant>,
}

/// See the module docs.
pub struct Pending {
    /// This node's index of waiting requests; this session's are those
    /// held by `id`.
    waiting: WaitingRequests,
    id: Uuid,
    /// Whose conversation it is.
    owner: Option<String>,
    deadlines: Deadlines,
    /// Automatic approvals per policy rule, for `max_auto_per`.
    limiter: RateLimiter,
    timeout: Option<Duration>,
    on_timeout: OnTimeout,
    /// Requests a remote agent asked before its connection was lost, held
    /// until it asks again on the new one (or its time to do so runs out):
    /// stored as pending, but with no way to answer the agent yet.
    held: HashMap<Uuid, PermissionRequest>,
}

impl Pending {
    /// A session's requests (its conversation owned by `owner`), held in
    /// `waiting`; they time out after `timeout` (never without one),
    /// answered as `on_timeout` says.
    pub fn new(
        timeout: Option<Duration>,
        on_timeout: OnTimeout,
        waiting: WaitingRequests,
        owner: Option<String>,
    ) -> Pending {
        Pending {
            waiting,
            id: Uuid::now_v7(),
            owner,
            deadlines: Deadlines::default(),
            limiter: RateLimiter::default(),
            timeout,
            on_timeout,
            held: HashMap::new(),
        }
    }

    /// Whether `waiting` is one of this session's requests.
    fn is_mine(&self, waiting: &WaitingRequest) -> bool {
        waiting.held_by == self.id
    }

    pub fn is_empty(&self) -> bool {
        let index = self.waiting.lock().unwrap();
        !index.values().any(|w| self.is_mine(w))
    }

    /// The waiting request `id` of this session, as it is now.
    pub fn get(&self, id: Uuid) -> Option<PermissionRequest> {
        let index = self.waiting.lock().unwrap();
        let waiting = index.get(&id).filter(|w| self.is_mine(w))?;
        Some(waiting.request.clone())
    }

    /// Holds a request until it is answered (or times out).
    pub fn park(&mut self, request: PermissionRequest, responder: Responder) {
        let id = request.id;
        self.index(request, responder, self.owner.clone());
        if let Some(timeout) = self.timeout {
            self.deadlines.set(id, timeout);
        }
    }

    /// Puts a request in this node's index of waiting requests.
    fn index(&self, request: PermissionRequest, responder: Responder, owner: Option<String>) {
        let waiting = WaitingRequest {
            request,
            owner,
            responder,
            held_by: self.id,
        };
        let mut index = self.waiting.lock().unwrap();
        index.insert(waiting.request.id, waiting);
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

    /// Holds a request a remote agent asked before its connection was
    /// lost, until it asks again (see [`Pending::asked_again`]); after
    /// `within`, [`Pending::due`] returns it for [`Pending::take_held`].
    pub fn hold(&mut self, request: PermissionRequest, within: Duration) {
        self.deadlines.set(request.id, within);
        self.held.insert(request.id, request);
    }

    /// Whether `id` is held, waiting for its agent to ask again.
    pub fn is_held(&self, id: Uuid) -> bool {
        self.held.contains_key(&id)
    }

    /// The (oldest) held request that `asks` says the agent asks again: it
    /// is no longer held, and no longer due.
    pub fn asked_again(
        &mut self,
        asks: impl Fn(&PermissionRequest) -> bool,
    ) -> Option<PermissionRequest> {
        let id = self.held.values().filter(|r| asks(r)).map(|r| r.id).min()?;
        self.deadlines.remove(id);
        self.held.remove(&id)
    }

    /// Takes the held request `id` (its agent did not ask again in time).
    pub fn take_held(&mut self, id: Uuid) -> Option<PermissionRequest> {
        self.held.remove(&id)
    }

    /// Claims a request to answer it: it no longer waits, nor times out.
    pub fn claim(&mut self, id: Uuid) -> Option<Parked> {
        let (parked, ()) = self.claim_checked(id, |_| Ok(()))?.ok()?;
        Some(parked)
    }

    /// Claims a request for a person's `answer`, judged against it first
    /// (see [`judge_answer`]): a refused answer leaves it waiting as it was.
    /// `None` when this session holds no request `id`.
    pub fn claim_answered(
        &mut self,
        id: Uuid,
        answer: &Answer,
    ) -> Option<Result<(Parked, Judged)>> {
        self.claim_checked(id, |request| judge_answer(request, answer))
    }

    /// Claims the request `id` if `check` lets it, with what `check` said.
    fn claim_checked<T>(
        &mut self,
        id: Uuid,
        check: impl FnOnce(&PermissionRequest) -> Result<T>,
    ) -> Option<Result<(Parked, T)>> {
        let mut index = self.waiting.lock().unwrap();
        let waiting = index.get(&id).filter(|w| self.is_mine(w))?;
        let checked = match check(&waiting.request) {
            Ok(checked) => checked,
            Err(refused) => return Some(Err(refused)),
        };
        let claimed = index.remove(&id)?;
        let parked = Parked {
            request: claimed.request,
            responder: claimed.responder,
            owner: claimed.owner,
            deadline: self.deadlines.take(id),
        };
        Some(Ok((parked, checked)))
    }

    /// Returns a request whose answer could not be recorded: it is pending
    /// as before it was claimed, so nothing is lost, and times out when it
    /// would have (at once, if that time passed meanwhile).
    pub fn put_back(&mut self, parked: Parked) {
        let id = parked.request.id;
        if let Some(at) = parked.deadline {
            self.deadlines.set_at(id, at);
        }
        self.index(parked.request, parked.responder, parked.owner);
    }

    /// Times `id` out again after `after` (its answer could not be
    /// recorded just now).
    pub fn retry_later(&mut self, id: Uuid, after: Duration) {
        if self.get(id).is_some() {
            self.deadlines.set(id, after);
        }
    }

    /// Every waiting request, oldest first.
    pub fn ids(&self) -> Vec<Uuid> {
        let index = self.waiting.lock().unwrap();
        let mine = index.values().filter(|w| self.is_mine(w));
        let mut ids: Vec<Uuid> = mine.map(|w| w.request.id).collect();
        ids.sort();
        ids
    }

    /// The request the agent sent as JSON-RPC request `rpc_id`.
    pub fn find_by_rpc_id(&self, rpc_id: &Value) -> Option<Uuid> {
        let index = self.waiting.lock().unwrap();
        let mut mine = index.values().filter(|w| self.is_mine(w));
        mine.find(|w| w.responder.id() == rpc_id)
            .map(|w| w.request.id)
    }

    /// The agent's JSON-RPC id of each waiting request: what the link to a
    /// shim keeps with each commit, so that a gateway taking the agent up
    /// again answers it on the same ids.
    pub fn rpc_ids(&self) -> BTreeMap<Uuid, Value> {
        let index = self.waiting.lock().unwrap();
        let mine = index.values().filter(|w| self.is_mine(w));
        mine.map(|w| (w.request.id, w.responder.id().clone()))
            .collect()
    }

    /// Waits until requests time out, then returns them (cancel-safe; never
    /// returns while none can).
    pub async fn due(&self) -> Vec<Uuid> {
        self.deadlines.due().await
    }

    /// A request that timed out: its deadline is cleared, and (if it is
    /// still waiting) the answer it gets.
    pub fn expire(&mut self, id: Uuid) -> Option<Answer> {
        self.deadlines.remove(id);
        let request = self.get(id)?;
        Some(timeout_answer(&request, self.on_timeout))
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
        let (status, answer) = automatic_answer(request, &verdict)?;
        let rule = verdict.rule.as_deref().unwrap_or("default");
        tracing::info!(permission_id = %request.id, rule, decision = ?verdict.decision, "decided by policy");
        let decision = Decision::new(
            answer,
            format!("policy:{rule}"),
            Some(verdict.reason.clone()),
        );
        self.limiter.record(&verdict, now);
        Some((status, decision))
    }
}

impl Drop for Pending {
    /// The session ended: its requests no longer wait on this node (and
    /// their agent hears so, as each responder goes: see [`Responder`]),
    /// answered outside the index's lock.
    fn drop(&mut self) {
        let gone: Vec<WaitingRequest> = {
            let mut waiting = self.waiting.lock().unwrap();
            let ids: Vec<Uuid> = waiting
                .values()
                .filter(|w| self.is_mine(w))
                .map(|w| w.request.id)
                .collect();
            ids.iter().filter_map(|id| waiting.remove(id)).collect()
        };
        drop(gone);
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
            kind: Default::default(),
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
        assert_eq!(pending.expire(id), Some(Answer::Option("no".into())));
        let claimed = pending.claim(id).unwrap();
        pending.put_back(claimed);
        let nothing = tokio::time::timeout(Duration::from_secs(3600), pending.due()).await;
        assert!(nothing.is_err(), "no deadline, nothing due");
    }
}
