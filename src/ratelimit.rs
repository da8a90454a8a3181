//! One sliding-window counter for every rate limit of the gateway: requests
//! per token ([`crate::auth`]) and automatic approvals per policy rule
//! ([`crate::permissions::policy`]).

use std::borrow::Borrow;
use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::time::Duration;

use tokio::time::Instant;

/// Most hits kept per key: more than any limit could ask about.
pub(crate) const MAX_HITS_PER_KEY: usize = 10_000;

/// Hits per key, each at its instant; a limit of `count` per `window`
/// allows one more hit while fewer than `count` fall within the window.
#[derive(Debug)]
pub struct SlidingWindow<K> {
    hits: HashMap<K, VecDeque<Instant>>,
}

impl<K> Default for SlidingWindow<K> {
    fn default() -> Self {
        SlidingWindow {
            hits: HashMap::new(),
        }
    }
}

impl<K: Hash + Eq> SlidingWindow<K> {
    /// How long until `key` may have one more hit under `count` per
    /// `window`; `None` when it may now.
    pub fn wait<Q>(&self, key: &Q, count: u32, window: Duration, now: Instant) -> Option<Duration>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if count == 0 {
            return Some(window);
        }
        let hits = self.hits.get(key)?;
        let recent: Vec<Instant> = hits
            .iter()
            .rev()
            .take_while(|t| now.duration_since(**t) < window)
            .copied()
            .collect();
        let count = count as usize;
        if recent.len() < count {
            return None;
        }
        // The hit that must leave the window before one more fits.
        let blocking = recent[count - 1];
        Some(window.saturating_sub(now.duration_since(blocking)))
    }

    /// Counts a hit of `key` at `now`; hits older than `window` are dropped.
    pub fn hit(&mut self, key: K, window: Duration, now: Instant) {
        let hits = self.hits.entry(key).or_default();
        while hits
            .front()
            .is_some_and(|t| now.duration_since(*t) >= window)
        {
            hits.pop_front();
        }
        hits.push_back(now);
        if hits.len() > MAX_HITS_PER_KEY {
            hits.pop_front();
        }
    }

    /// Counts a hit if the limit allows it; else the time to wait.
    pub fn try_hit(
        &mut self,
        key: K,
        count: u32,
        window: Duration,
        now: Instant,
    ) -> Result<(), Duration> {
        match self.wait(&key, count, window, now) {
            Some(wait) => Err(wait),
            None => {
                self.hit(key, window, now);
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: Duration = Duration::from_secs(60);

    #[tokio::test(start_paused = true)]
    async fn a_full_window_says_how_long_until_its_oldest_hit_leaves() {
        let mut window = SlidingWindow::default();
        let start = Instant::now();
        window.try_hit("a", 2, MINUTE, start).unwrap();
        window
            .try_hit("a", 2, MINUTE, start + Duration::from_secs(20))
            .unwrap();
        let at = start + Duration::from_secs(30);
        assert_eq!(
            window.try_hit("a", 2, MINUTE, at),
            Err(Duration::from_secs(30))
        );
        // Other keys count apart; a refused hit is not counted.
        assert_eq!(window.wait(&"b", 2, MINUTE, at), None);
        assert_eq!(
            window.wait(&"a", 2, MINUTE, start + MINUTE),
            None,
            "the first hit has left the window"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn hits_counted_without_asking_can_exceed_the_limit_and_still_wait_right() {
        let mut window = SlidingWindow::default();
        let start = Instant::now();
        for s in 0..5 {
            window.hit("r", MINUTE, start + Duration::from_secs(s));
        }
        // Limit 2: the 2nd newest hit (at 3 s) must leave first.
        let at = start + Duration::from_secs(10);
        assert_eq!(
            window.wait(&"r", 2, MINUTE, at),
            Some(Duration::from_secs(53))
        );
    }
}
