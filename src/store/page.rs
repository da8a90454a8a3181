//! One page of what a read returns, bounded in items and in bytes of JSON,
//! so that paging through a long history costs a page at a time: no row
//! past the bound is read.

use crate::error::Result;

/// One page of items read in order, bounded in count (`limit`) and in bytes
/// of JSON (`max_bytes`): it stops before the item that would pass the byte
/// bound, but always holds at least one, so that paging moves on.
#[derive(Debug)]
pub struct Bounded<T> {
    pub items: Vec<T>,
    /// Whether it stopped before the end: at `limit` items, or before an
    /// item that would have passed `max_bytes`.
    pub more: bool,
    bytes: usize,
    limit: usize,
    max_bytes: usize,
}

impl<T: serde::Serialize> Bounded<T> {
    pub fn new(limit: i64, max_bytes: usize) -> Self {
        Bounded {
            items: Vec::new(),
            more: false,
            bytes: 0,
            limit: usize::try_from(limit).unwrap_or(0),
            max_bytes,
        }
    }

    /// The bytes of JSON its items take.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whether the page is full: read no more.
    pub fn is_full(&self) -> bool {
        self.more
    }

    /// Adds the next item, unless it would pass the byte bound (the first
    /// always fits); whether it was added.
    pub fn push(&mut self, item: T) -> bool {
        let size = json_size(&item);
        if !self.grow(size) {
            return false;
        }
        self.items.push(item);
        if self.items.len() >= self.limit {
            self.more = true;
        }
        true
    }

    /// Reads `rows` into the page, each made an item by `item`, until the
    /// page is full or the rows run out: what lies past the bound is never
    /// read (the rows are streamed, and dropped there).
    pub async fn fill<R>(
        &mut self,
        mut rows: impl futures::Stream<Item = Result<R, sqlx::Error>> + Unpin,
        item: impl Fn(R) -> Result<T>,
    ) -> Result<()> {
        use futures::TryStreamExt as _;
        while let Some(row) = rows.try_next().await? {
            if !self.push(item(row)?) || self.is_full() {
                break;
            }
        }
        Ok(())
    }

    /// Counts `size` more bytes for what the page holds, whatever the bound
    /// (its first item grew).
    pub fn count(&mut self, size: usize) {
        self.bytes = self.bytes.saturating_add(size);
    }

    /// Counts `size` more bytes for what the page holds (the last item grew,
    /// or is about to be added); `false`, and the page is full, when that
    /// would pass the byte bound and the page already holds an item.
    pub fn grow(&mut self, size: usize) -> bool {
        if !self.items.is_empty() && self.bytes.saturating_add(size) > self.max_bytes {
            self.more = true;
            return false;
        }
        self.bytes = self.bytes.saturating_add(size);
        true
    }
}

/// How many bytes `value` takes as JSON, without building the text.
pub fn json_size<T: serde::Serialize + ?Sized>(value: &T) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing to a counter cannot fail; a value that cannot serialize
    // counts what was written before it failed.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}
