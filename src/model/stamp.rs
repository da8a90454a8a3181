//! What every object is stamped with: a new time-ordered id, and the time
//! now at the precision the store keeps.

use chrono::{DateTime, Utc};
use uuid::Uuid;

/// A new time-ordered id.
pub fn new_id() -> Uuid {
    Uuid::now_v7()
}

/// Now, at the microsecond precision Postgres keeps, so that what we publish
/// equals what we read back.
pub fn now() -> DateTime<Utc> {
    let now = Utc::now();
    DateTime::from_timestamp_micros(now.timestamp_micros()).unwrap_or(now)
}
