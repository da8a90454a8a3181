//! The agent's output a shim holds until a gateway acknowledges it: a byte
//! stream numbered from 0, of which the shim keeps the part after the last
//! acknowledgement, at most a fixed number of bytes.

use std::collections::VecDeque;

/// Output read from the agent and not yet acknowledged.
#[derive(Debug)]
pub struct Held {
    /// The offset of the first byte held.
    start: u64,
    bytes: VecDeque<u8>,
    capacity: usize,
}

impl Held {
    /// Holds at most `capacity` bytes (at least 1).
    pub fn new(capacity: usize) -> Held {
        Held {
            start: 0,
            bytes: VecDeque::new(),
            capacity: capacity.max(1),
        }
    }

    /// The offset of the first byte held: everything before it was
    /// acknowledged.
    pub fn start(&self) -> u64 {
        self.start
    }

    /// The offset after the last byte read.
    pub fn end(&self) -> u64 {
        self.start + self.bytes.len() as u64
    }

    /// How many more bytes it can take (0: the agent waits).
    pub fn room(&self) -> usize {
        self.capacity - self.bytes.len()
    }

    /// Adds what was read; the caller reads no more than [`Held::room`].
    pub fn push(&mut self, bytes: &[u8]) {
        debug_assert!(bytes.len() <= self.room());
        self.bytes.extend(bytes);
    }

    /// Lets go of everything before `to`: false (and nothing changes) when
    /// `to` lies beyond what was read. An acknowledgement of what was already
    /// let go changes nothing.
    pub fn acknowledge(&mut self, to: u64) -> bool {
        if to > self.end() {
            return false;
        }
        if to > self.start {
            self.bytes.drain(..(to - self.start) as usize);
            self.start = to;
        }
        true
    }

    /// Up to `max` bytes from offset `from` on (empty at the end); `None`
    /// when `from` was already let go or lies beyond what was read.
    pub fn from(&self, from: u64, max: usize) -> Option<Vec<u8>> {
        if from < self.start || from > self.end() {
            return None;
        }
        let first = (from - self.start) as usize;
        let last = (first + max).min(self.bytes.len());
        Some(self.bytes.range(first..last).copied().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_run_on_across_acknowledgements() {
        let mut held = Held::new(8);
        held.push(b"abcde");
        assert_eq!((held.start(), held.end(), held.room()), (0, 5, 3));
        assert_eq!(held.from(1, 2).unwrap(), b"bc");
        assert_eq!(held.from(3, 100).unwrap(), b"de");
        assert_eq!(held.from(5, 100).unwrap(), b"");
        assert!(held.acknowledge(2));
        assert_eq!((held.start(), held.end(), held.room()), (2, 5, 5));
        assert_eq!(held.from(1, 1), None, "let go");
        assert_eq!(held.from(6, 1), None, "not read yet");
        held.push(b"fghij");
        assert_eq!(held.room(), 0);
        assert_eq!(held.from(2, 100).unwrap(), b"cdefghij");
        assert!(held.acknowledge(1), "already let go: nothing changes");
        assert_eq!(held.start(), 2);
        assert!(!held.acknowledge(11), "beyond what was read");
        assert!(held.acknowledge(10));
        assert_eq!((held.start(), held.end(), held.room()), (10, 10, 8));
    }
}
