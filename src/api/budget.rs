//! The memory every WebSocket together may hold for clients that have not
//! taken it yet (`ws_buffer_bytes`): the catch-up page a socket read from
//! the store and the frame it is sending. A socket takes bytes before it
//! holds them and gives them back once its client took them; a socket whose
//! next bytes do not fit is closed with 1013 ("try again later") and its
//! client resumes with `after` (see [`super::ws`]).
//!
//! Each socket holds at most one page (`max_page_bytes`) or one frame at a
//! time, so a slow client is bounded on its own; this bounds them all
//! together. What a page costs while it is read from the store is bounded
//! by the database pool instead, and what the kernel buffers for a socket
//! by its socket buffer sizes.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// A cheap-to-clone handle to the budget.
#[derive(Clone, Debug)]
pub struct SendBudget {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    limit: usize,
    /// Taken without a lock: every frame of every socket passes here.
    used: AtomicUsize,
    /// The most ever reserved at once.
    peak: AtomicUsize,
    /// How many takes did not fit (watched: how often a budget is reached
    /// is something to wait for).
    refused: tokio::sync::watch::Sender<usize>,
}

impl SendBudget {
    pub fn new(limit: usize) -> SendBudget {
        SendBudget {
            inner: Arc::new(Inner {
                limit,
                used: AtomicUsize::new(0),
                peak: AtomicUsize::new(0),
                refused: tokio::sync::watch::Sender::new(0),
            }),
        }
    }

    /// `ws_buffer_bytes`.
    pub fn limit(&self) -> usize {
        self.inner.limit
    }

    /// What every socket holds now.
    pub fn used(&self) -> usize {
        self.inner.used.load(Ordering::Relaxed)
    }

    /// The most all sockets ever reserved at once.
    pub fn peak(&self) -> usize {
        self.inner.peak.load(Ordering::Relaxed)
    }

    /// How many times a socket's bytes did not fit (and it was closed).
    pub fn refused(&self) -> usize {
        *self.inner.refused.borrow()
    }

    /// [`SendBudget::refused`], to wait on.
    pub fn watch_refused(&self) -> tokio::sync::watch::Receiver<usize> {
        self.inner.refused.subscribe()
    }

    /// `bytes` more for one socket, if they fit; `None` when they do not.
    /// Bytes larger than the whole budget fit only while nothing else is
    /// reserved (an event that large is sent alone, never refused forever).
    pub fn reserve(&self, bytes: usize) -> Option<Reservation> {
        let fits = |used: usize| used == 0 || used + bytes <= self.inner.limit;
        let taken = self
            .inner
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                fits(used).then_some(used + bytes)
            });
        let Ok(before) = taken else {
            self.inner.refused.send_modify(|n| *n += 1);
            return None;
        };
        self.inner.peak.fetch_max(before + bytes, Ordering::Relaxed);
        crate::telemetry::websocket_buffered(bytes as f64);
        Some(Reservation {
            budget: self.clone(),
            bytes,
        })
    }

    fn give_back(&self, bytes: usize) {
        if bytes == 0 {
            return;
        }
        self.inner.used.fetch_sub(bytes, Ordering::AcqRel);
        crate::telemetry::websocket_buffered(-(bytes as f64));
    }
}

/// Bytes one socket reserved; given back when dropped.
#[derive(Debug)]
pub struct Reservation {
    budget: SendBudget,
    bytes: usize,
}

impl Reservation {
    /// Gives back `bytes` of what is reserved (a frame of a page was taken by
    /// the client).
    pub fn give_back(&mut self, bytes: usize) {
        let bytes = bytes.min(self.bytes);
        self.bytes -= bytes;
        self.budget.give_back(bytes);
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.give_back(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_does_not_fit_is_refused_and_what_is_given_back_fits_again() {
        let budget = SendBudget::new(100);
        let mut page = budget.reserve(60).unwrap();
        let frame = budget.reserve(40).unwrap();
        assert_eq!(budget.used(), 100);
        assert!(budget.reserve(1).is_none());
        assert_eq!(budget.refused(), 1);
        page.give_back(30);
        let more = budget.reserve(30).unwrap();
        drop((page, frame, more));
        assert_eq!(budget.used(), 0);
        assert_eq!(budget.peak(), 100);
    }

    #[test]
    fn bytes_larger_than_the_budget_go_alone() {
        let budget = SendBudget::new(100);
        let small = budget.reserve(10).unwrap();
        assert!(budget.reserve(500).is_none());
        drop(small);
        let large = budget.reserve(500).unwrap();
        assert!(budget.reserve(1).is_none());
        drop(large);
        assert_eq!(budget.used(), 0);
    }
}
