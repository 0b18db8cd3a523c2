//! Wall-clock time as the store records it. The one place that turns a
//! `SystemTime` into the milliseconds of a lease deadline, a backup or a
//! summary, so that the engine, setup and restore agree on it without
//! depending on each other.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch (0 for times before it).
pub(crate) fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
