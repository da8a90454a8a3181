//! The memory every WebSocket together may hold for clients that have not
//! taken it yet (`ws_buffer_bytes`): the catch-up page a socket read from
//! the store and the frame it is sending. A socket takes bytes before it
//! holds them and gives them back once they were written to its TCP stream
//! (see [`super::ws`]).
//!
//! Each socket holds at most one page (`max_page_bytes`) or one frame at a
//! time, so a slow client is bounded on its own; the sockets of one user
//! together hold at most `ws_buffer_bytes_per_user`, so that one user cannot
//! take the whole budget; and all of them at most `ws_buffer_bytes`. What a
//! page costs while it is read from the store is bounded by the database
//! pool instead, and what the kernel buffers for a socket by its socket
//! buffer sizes.
//!
//! A socket asking for room holds nothing at that moment (it asks between
//! frames): whatever it sent before has been written to its TCP stream, so
//! it keeps up. When its bytes do not fit, those are made room for by
//! evicting the sockets that do not: the ones that have written none of what
//! they hold for [`STALLED_AFTER`] (a client that stops reading fills its
//! TCP window, and its bytes stay queued), the largest holders first, and
//! only as many as needed. An evicted socket stops sending, is closed with
//! 1013 and is dropped; its bytes count as held until the socket is gone,
//! since until then they are still queued in it. The socket asking waits
//! for that, or for sockets still writing to give back theirs, at most
//! [`ROOM_WAIT`]; only then is it refused (and closed with 1013 as well).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

/// A socket that has written none of what it holds to its TCP stream for
/// this long is not reading: it may be evicted to make room.
pub const STALLED_AFTER: Duration = Duration::from_millis(250);
/// The longest a socket waits for room before it is refused: enough for a
/// socket to be seen stalled, evicted and dropped (its close frame gets
/// `EVICTED_CLOSE_TIMEOUT` in `ws.rs`), with time to spare on a busy
/// machine.
pub const ROOM_WAIT: Duration = Duration::from_secs(5);

/// A cheap-to-clone handle to the budget.
#[derive(Clone, Debug)]
pub struct SendBudget {
    inner: Arc<Budget>,
}

/// The budget itself, shared by every handle: the limits, what is held,
/// and who waits for room.
#[derive(Debug)]
struct Budget {
    limit: usize,
    per_user: usize,
    /// One lock for every frame of every socket, held for a few map look-ups
    /// and never across `.await`.
    state: Mutex<State>,
    /// Woken when bytes are given back while a socket waits for room.
    freed: Notify,
    /// How many sockets waited in vain for room (watched: how often a budget
    /// is reached is something to wait for).
    refused: watch::Sender<usize>,
    /// How many sockets were evicted to make room.
    evicted: watch::Sender<usize>,
}

#[derive(Debug, Default)]
struct State {
    used: usize,
    /// The most all sockets ever held at once.
    peak: usize,
    /// The most the sockets of one user ever held at once.
    user_peak: usize,
    users: HashMap<Arc<str>, UserUse>,
    sockets: HashMap<u64, Holder>,
    next_id: u64,
    /// Sockets waiting for room (only then is a give-back announced).
    waiting: usize,
}

#[derive(Debug, Default)]
struct UserUse {
    used: usize,
    sockets: usize,
}

#[derive(Debug)]
struct Holder {
    user: Arc<str>,
    held: usize,
    /// When it last wrote bytes to its TCP stream, or began to hold.
    since: Instant,
    evicted: CancellationToken,
}

impl Holder {
    fn stalled(&self, now: Instant) -> bool {
        self.held > 0 && !self.evicted.is_cancelled() && now >= self.since + STALLED_AFTER
    }
}

/// Whether `bytes` more fit beside `used`: bytes larger than the limit fit
/// only while nothing else is held (an event that large is sent alone,
/// never refused forever).
fn fits(used: usize, bytes: usize, limit: usize) -> bool {
    used == 0 || used + bytes <= limit
}

enum Take {
    Taken,
    /// This socket was evicted itself.
    Evicted,
    /// No room yet; look again when freed or at this instant (a socket still
    /// writing may turn stalled then).
    Wait(Option<Instant>),
}

impl SendBudget {
    /// All sockets together hold at most `limit` bytes, those of one user at
    /// most `per_user`.
    pub fn new(limit: usize, per_user: usize) -> SendBudget {
        SendBudget {
            inner: Arc::new(Budget {
                limit,
                per_user,
                state: Mutex::default(),
                freed: Notify::new(),
                refused: watch::Sender::new(0),
                evicted: watch::Sender::new(0),
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding it; a poisoned lock's state is whole.
        self.inner
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// `ws_buffer_bytes`.
    pub fn limit(&self) -> usize {
        self.inner.limit
    }

    /// `ws_buffer_bytes_per_user`.
    pub fn per_user(&self) -> usize {
        self.inner.per_user
    }

    /// What every socket holds now.
    pub fn used(&self) -> usize {
        self.state().used
    }

    /// The most all sockets ever held at once.
    pub fn peak(&self) -> usize {
        self.state().peak
    }

    /// The most the sockets of one user ever held at once.
    pub fn user_peak(&self) -> usize {
        self.state().user_peak
    }

    /// How many times a socket found no room in time (and was closed).
    pub fn refused(&self) -> usize {
        *self.inner.refused.borrow()
    }

    /// [`SendBudget::refused`], to wait on.
    pub fn watch_refused(&self) -> watch::Receiver<usize> {
        self.inner.refused.subscribe()
    }

    /// How many sockets were evicted to make room (and closed).
    pub fn evicted(&self) -> usize {
        *self.inner.evicted.borrow()
    }

    /// [`SendBudget::evicted`], to wait on.
    pub fn watch_evicted(&self) -> watch::Receiver<usize> {
        self.inner.evicted.subscribe()
    }

    /// A new socket of `user`'s, holding nothing yet.
    pub fn join(&self, user: &str) -> SocketBudget {
        let evicted = CancellationToken::new();
        let mut state = self.state();
        let id = state.next_id;
        state.next_id += 1;
        let user: Arc<str> = match state.users.get_key_value(user) {
            Some((name, _)) => name.clone(),
            None => user.into(),
        };
        state.users.entry(user.clone()).or_default().sockets += 1;
        state.sockets.insert(
            id,
            Holder {
                user,
                held: 0,
                since: Instant::now(),
                evicted: evicted.clone(),
            },
        );
        SocketBudget {
            budget: self.clone(),
            id,
            evicted,
        }
    }

    /// Takes `bytes` for socket `id` if they fit, else evicts the stalled
    /// sockets that keep them from fitting (largest first).
    fn try_take(&self, id: u64, bytes: usize) -> Take {
        let now = Instant::now();
        let (limit, per_user) = (self.inner.limit, self.inner.per_user);
        let mut state = self.state();
        let state = &mut *state;
        let me = &state.sockets[&id];
        if me.evicted.is_cancelled() {
            return Take::Evicted;
        }
        let user = me.user.clone();
        let user_used = state.users[&user].used;
        if fits(state.used, bytes, limit) && fits(user_used, bytes, per_user) {
            state.used += bytes;
            state.peak = state.peak.max(state.used);
            let user_use = state.users.get_mut(&user).expect("joined");
            user_use.used += bytes;
            state.user_peak = state.user_peak.max(user_use.used);
            let me = state.sockets.get_mut(&id).expect("joined");
            if me.held == 0 {
                me.since = now;
            }
            me.held += bytes;
            crate::telemetry::websocket_buffered(bytes as f64);
            return Take::Taken;
        }
        // What is left once the sockets evicted already are gone.
        let (mut rest, mut user_rest) = (state.used, user_used);
        for holder in state.sockets.values() {
            if holder.evicted.is_cancelled() {
                rest -= holder.held;
                if holder.user == user {
                    user_rest -= holder.held;
                }
            }
        }
        let mut stalled: Vec<&Holder> = state
            .sockets
            .iter()
            .filter(|(other, holder)| **other != id && holder.stalled(now))
            .map(|(_, holder)| holder)
            .collect();
        stalled.sort_unstable_by_key(|holder| std::cmp::Reverse(holder.held));
        let mut evicted = 0;
        for holder in stalled {
            let all_fit = fits(rest, bytes, limit);
            if all_fit && fits(user_rest, bytes, per_user) {
                break;
            }
            let same_user = holder.user == user;
            // Over the user's share only: another user's socket is no help.
            if all_fit && !same_user {
                continue;
            }
            holder.evicted.cancel();
            evicted += 1;
            rest -= holder.held;
            if same_user {
                user_rest -= holder.held;
            }
        }
        if evicted > 0 {
            self.inner.evicted.send_modify(|n| *n += evicted);
        }
        // The next socket still writing that may turn stalled.
        let next_look = state
            .sockets
            .iter()
            .filter(|(other, holder)| {
                **other != id && holder.held > 0 && !holder.evicted.is_cancelled()
            })
            .map(|(_, holder)| holder.since + STALLED_AFTER)
            .filter(|at| *at > now)
            .min();
        state.waiting += 1;
        Take::Wait(next_look)
    }

    /// Gives back `bytes` socket `id` held: `written` when they went to its
    /// TCP stream (it makes progress), else because the socket is gone.
    fn give_back(&self, id: u64, bytes: usize, written: bool) {
        if bytes == 0 {
            return;
        }
        let mut state = self.state();
        state.used -= bytes;
        let holder = state.sockets.get_mut(&id).expect("joined");
        holder.held -= bytes;
        if written {
            holder.since = Instant::now();
        }
        let user = holder.user.clone();
        state.users.get_mut(&user).expect("joined").used -= bytes;
        let waiting = state.waiting > 0;
        drop(state);
        crate::telemetry::websocket_buffered(-(bytes as f64));
        if waiting {
            self.inner.freed.notify_waiters();
        }
    }

    fn stop_waiting(&self) {
        self.state().waiting -= 1;
    }
}

/// One socket's part of the budget; what it still holds is given back when
/// it is dropped (drop it after the socket itself: until then the bytes may
/// still be queued in it).
#[derive(Debug)]
pub struct SocketBudget {
    budget: SendBudget,
    id: u64,
    evicted: CancellationToken,
}

/// Counts a socket among those waiting for room while it waits.
struct Waiting<'a>(&'a SendBudget);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.stop_waiting();
    }
}

impl SocketBudget {
    /// `bytes` more for this socket, once they fit (making room by evicting
    /// stalled sockets; see the module's documentation); `None` when this
    /// socket was evicted itself, or no room was found within [`ROOM_WAIT`].
    pub async fn reserve(&self, bytes: usize) -> Option<Reservation<'_>> {
        let budget = &self.budget;
        let deadline = Instant::now() + ROOM_WAIT;
        loop {
            // Listening before looking: a give-back after the look wakes it.
            let freed = budget.inner.freed.notified();
            let mut freed = std::pin::pin!(freed);
            freed.as_mut().enable();
            let next_look = match budget.try_take(self.id, bytes) {
                Take::Taken => {
                    return Some(Reservation {
                        socket: self,
                        bytes,
                    })
                }
                Take::Evicted => return None,
                Take::Wait(next_look) => next_look,
            };
            let _waiting = Waiting(budget);
            let now = Instant::now();
            if now >= deadline {
                budget.inner.refused.send_modify(|n| *n += 1);
                return None;
            }
            let until = next_look.map_or(deadline, |at| at.min(deadline));
            tokio::select! {
                _ = tokio::time::timeout_at(until, freed) => {}
                _ = self.evicted.cancelled() => return None,
            }
        }
    }

    /// Resolves once this socket is evicted to make room for others: it must
    /// stop sending, close and be dropped.
    pub fn evicted(&self) -> WaitForCancellationFuture<'_> {
        self.evicted.cancelled()
    }

    /// Whether it was evicted.
    pub fn is_evicted(&self) -> bool {
        self.evicted.is_cancelled()
    }
}

impl Drop for SocketBudget {
    fn drop(&mut self) {
        let budget = &self.budget;
        let mut state = budget.state();
        let holder = state.sockets.remove(&self.id).expect("joined");
        state.used -= holder.held;
        let user = state.users.get_mut(&holder.user).expect("joined");
        user.used -= holder.held;
        user.sockets -= 1;
        if user.sockets == 0 {
            state.users.remove(&holder.user);
        }
        let waiting = state.waiting > 0;
        drop(state);
        if holder.held > 0 {
            crate::telemetry::websocket_buffered(-(holder.held as f64));
            if waiting {
                budget.inner.freed.notify_waiters();
            }
        }
    }
}

/// Bytes one socket reserved. Those it gives back were written to its TCP
/// stream; those it does not (a send cut short) stay held until the socket's
/// [`SocketBudget`] is dropped.
#[derive(Debug)]
#[must_use = "bytes not given back stay held until the socket is gone"]
pub struct Reservation<'a> {
    socket: &'a SocketBudget,
    bytes: usize,
}

impl Reservation<'_> {
    /// Gives back `bytes` of what is reserved (a frame of a page was written).
    pub fn give_back(&mut self, bytes: usize) {
        let bytes = bytes.min(self.bytes);
        self.bytes -= bytes;
        self.socket.budget.give_back(self.socket.id, bytes, true);
    }

    /// Gives back all that is left (the frame was written, or the rest of a
    /// page will not be sent and is dropped).
    pub fn release(mut self) {
        let bytes = self.bytes;
        self.give_back(bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn what_does_not_fit_waits_and_what_is_given_back_fits_again() {
        let budget = SendBudget::new(100, 100);
        let (a, b) = (budget.join("a"), budget.join("b"));
        let mut page = a.reserve(60).await.unwrap();
        let frame = b.reserve(40).await.unwrap();
        assert_eq!(budget.used(), 100);
        let c = budget.join("c");
        let waiting = c.reserve(30);
        tokio::pin!(waiting);
        assert!(futures::poll!(waiting.as_mut()).is_pending());
        page.give_back(30);
        let more = waiting.await.unwrap();
        assert_eq!(budget.used(), 100);
        page.release();
        frame.release();
        more.release();
        assert_eq!(budget.used(), 0);
        assert_eq!(budget.peak(), 100);
        assert_eq!(budget.evicted(), 0);
    }

    #[tokio::test]
    async fn bytes_larger_than_the_budget_go_alone() {
        let budget = SendBudget::new(100, 100);
        let (a, b) = (budget.join("a"), budget.join("b"));
        let small = a.reserve(10).await.unwrap();
        let large = b.reserve(500);
        tokio::pin!(large);
        assert!(futures::poll!(large.as_mut()).is_pending());
        small.release();
        let large = large.await.unwrap();
        large.release();
        assert_eq!(budget.used(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_largest_stalled_holders_are_evicted_and_their_bytes_freed_when_dropped() {
        let budget = SendBudget::new(100, 100);
        let (big, small, reader) = (budget.join("x"), budget.join("x"), budget.join("y"));
        let held_big = big.reserve(50).await.unwrap();
        let held_small = small.reserve(30).await.unwrap();
        // Neither writes anything on.
        tokio::time::advance(STALLED_AFTER).await;
        let wanted = reader.reserve(40);
        tokio::pin!(wanted);
        assert!(futures::poll!(wanted.as_mut()).is_pending());
        assert_eq!(budget.evicted(), 1);
        assert!(big.is_evicted());
        assert!(!small.is_evicted());
        // Its bytes are freed when the socket is gone, not before.
        drop(held_big);
        assert!(futures::poll!(wanted.as_mut()).is_pending());
        drop(big);
        let frame = wanted.await.unwrap();
        assert_eq!(budget.used(), 70);
        frame.release();
        held_small.release();
        assert!(budget.peak() <= 100);
    }

    #[tokio::test(start_paused = true)]
    async fn a_socket_that_keeps_writing_is_not_evicted_however_much_it_holds() {
        let budget = SendBudget::new(100, 100);
        let (writing, stuck, asking) = (budget.join("x"), budget.join("x"), budget.join("y"));
        let mut page = writing.reserve(80).await.unwrap();
        let held = stuck.reserve(20).await.unwrap();
        tokio::time::advance(STALLED_AFTER / 2).await;
        page.give_back(5);
        tokio::time::advance(STALLED_AFTER / 2).await;
        // The stuck one is stalled, the writer not: the stuck one goes,
        // and the rest comes from the writer going on.
        let wanted = asking.reserve(30);
        tokio::pin!(wanted);
        assert!(futures::poll!(wanted.as_mut()).is_pending());
        assert!(stuck.is_evicted());
        assert!(!writing.is_evicted());
        drop(held);
        drop(stuck);
        assert!(futures::poll!(wanted.as_mut()).is_pending());
        page.give_back(5);
        let frame = wanted.await.unwrap();
        assert!(!writing.is_evicted());
        frame.release();
        page.release();
        assert_eq!(budget.used(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn one_users_sockets_hold_at_most_their_share_and_pay_for_it_themselves() {
        let budget = SendBudget::new(1000, 100);
        let (a1, a2, a3) = (budget.join("a"), budget.join("a"), budget.join("a"));
        let b = budget.join("b");
        let held1 = a1.reserve(60).await.unwrap();
        let held2 = a2.reserve(30).await.unwrap();
        let theirs = b.reserve(90).await.unwrap();
        tokio::time::advance(STALLED_AFTER).await;
        // Over user a's share, not the budget: a's largest stalled socket
        // goes, never b's (larger, and stalled too).
        let wanted = a3.reserve(40);
        tokio::pin!(wanted);
        assert!(futures::poll!(wanted.as_mut()).is_pending());
        assert!(a1.is_evicted());
        assert!(!a2.is_evicted());
        assert!(!b.is_evicted());
        drop(held1);
        drop(a1);
        let frame = wanted.await.unwrap();
        assert_eq!(budget.user_peak(), 90);
        frame.release();
        held2.release();
        theirs.release();
    }

    #[tokio::test(start_paused = true)]
    async fn a_socket_finding_no_room_in_time_is_refused() {
        let budget = SendBudget::new(100, 100);
        let (writing, asking) = (budget.join("x"), budget.join("y"));
        let mut page = writing.reserve(100).await.unwrap();
        let wanted = asking.reserve(100);
        tokio::pin!(wanted);
        // The writer writes a little, often enough never to be stalled,
        // and never enough to make room (the bytes asked for fit only
        // beside nothing).
        for _ in 0..(ROOM_WAIT.as_millis() / 100) {
            assert!(futures::poll!(wanted.as_mut()).is_pending());
            tokio::time::advance(Duration::from_millis(100)).await;
            page.give_back(1);
        }
        tokio::time::advance(Duration::from_millis(100)).await;
        assert!(wanted.await.is_none());
        assert_eq!((budget.refused(), budget.evicted()), (1, 0));
        page.release();
    }
}
