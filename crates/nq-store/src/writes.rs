//! The store's writes in progress, for a watchdog: sled 0.34 can deadlock
//! under heavy writes (spacejam/sled#1412; `backup::Error::Stalled` reads
//! the cause from sled's source), and a writer caught in it waits forever
//! without an error. A process that serves a run watches
//! [`WriteProgress`] and gives up when a write has been in progress for
//! long with none finishing.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Counts of the writes (batches applied, flushes) that a
/// [`crate::Store`] has in progress and has finished; shared with whoever
/// watches them ([`crate::Store::writes`]).
#[derive(Debug, Default)]
pub struct WriteProgress {
    in_flight: AtomicUsize,
    finished: AtomicU64,
}

/// What [`WriteProgress::now`] read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Writes {
    /// Writes begun and not finished.
    pub in_flight: usize,
    /// Writes finished (with or without an error) since the store opened.
    pub finished: u64,
}

impl WriteProgress {
    /// The counts now.
    pub fn now(&self) -> Writes {
        Writes {
            in_flight: self.in_flight.load(Ordering::Acquire),
            finished: self.finished.load(Ordering::Acquire),
        }
    }

    /// Notes a write begun; it is finished when the guard drops (also on
    /// an error, or when a future holding it is dropped). The store's own
    /// writes call it; public for a writer beside the store, and for
    /// tests of a watchdog.
    pub fn begin(&self) -> Writing<'_> {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        Writing(self)
    }
}

/// A write in progress ([`WriteProgress::begin`]).
#[derive(Debug)]
pub struct Writing<'a>(&'a WriteProgress);

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        // Finished first: a watcher that sees none in flight has seen it end.
        self.0.finished.fetch_add(1, Ordering::AcqRel);
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What a watchdog has seen of the writes: since when none has finished
/// while some were in progress. Its rule ([`Stall::observe`]) is the one
/// by which a serving coordinator and a restore's import call a store
/// stuck.
#[derive(Debug)]
pub struct Stall {
    finished: u64,
    since: Instant,
}

impl Stall {
    /// Nothing seen yet but `writes`, read at `now`.
    pub fn new(now: Instant, writes: Writes) -> Stall {
        Stall {
            finished: writes.finished,
            since: now,
        }
    }

    /// Notes `writes` read at `now`; returns how long no write finished
    /// while some were in progress, once that reaches `stall`.
    pub fn observe(
        &mut self,
        now: Instant,
        writes: Writes,
        stall: Duration,
    ) -> Option<Duration> {
        if writes.in_flight == 0 || writes.finished != self.finished {
            *self = Stall::new(now, writes);
            return None;
        }
        let stuck = now.saturating_duration_since(self.since);
        (stuck >= stall).then_some(stuck)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STALL: Duration = Duration::from_secs(300);

    fn seen(in_flight: usize, finished: u64) -> Writes {
        Writes {
            in_flight,
            finished,
        }
    }

    #[test]
    fn a_write_in_progress_with_none_finishing_is_a_stall_once_it_lasts() {
        let t0 = Instant::now();
        let mut s = Stall::new(t0, seen(0, 7));
        // Idle for an hour: no write in progress, no stall.
        assert_eq!(
            s.observe(t0 + Duration::from_secs(3600), seen(0, 7), STALL),
            None
        );
        // A write begins a second later; the stall counts from the last look
        // without one, at most one look before it began.
        let looked = t0 + Duration::from_secs(3600);
        let begun = looked + Duration::from_secs(1);
        assert_eq!(s.observe(begun, seen(1, 7), STALL), None);
        assert_eq!(s.observe(looked + STALL / 2, seen(1, 7), STALL), None);
        assert_eq!(
            s.observe(looked + STALL - Duration::from_millis(1), seen(1, 7), STALL),
            None
        );
        assert_eq!(s.observe(looked + STALL, seen(1, 7), STALL), Some(STALL));
    }

    #[test]
    fn writes_that_keep_finishing_are_no_stall_however_many_overlap() {
        let t0 = Instant::now();
        let mut s = Stall::new(t0, seen(0, 0));
        // Always some in progress (the commit loop and the lease records
        // overlapping), but one finishing every minute: never stuck.
        for minute in 1..=60u64 {
            let at = t0 + Duration::from_secs(60 * minute);
            assert_eq!(
                s.observe(at, seen(2, minute), STALL),
                None,
                "minute {minute}"
            );
        }
        // A flush that then hangs is measured from the last one finished.
        let last = t0 + Duration::from_secs(3600);
        assert_eq!(
            s.observe(last + STALL - Duration::from_secs(1), seen(1, 60), STALL),
            None
        );
        assert!(s.observe(last + STALL, seen(1, 60), STALL).is_some());
    }

    #[test]
    fn a_write_is_in_flight_until_its_guard_drops() {
        let p = WriteProgress::default();
        assert_eq!(
            p.now(),
            Writes {
                in_flight: 0,
                finished: 0
            }
        );
        let a = p.begin();
        let b = p.begin();
        assert_eq!(
            p.now(),
            Writes {
                in_flight: 2,
                finished: 0
            }
        );
        drop(a);
        assert_eq!(
            p.now(),
            Writes {
                in_flight: 1,
                finished: 1
            }
        );
        drop(b);
        assert_eq!(
            p.now(),
            Writes {
                in_flight: 0,
                finished: 2
            }
        );
    }
}
