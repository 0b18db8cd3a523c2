//! The store's writes in progress, for a watchdog: sled 0.34 can deadlock
//! under heavy writes (spacejam/sled#1412; `backup::Error::Stalled` reads
//! the cause from sled's source), and a writer caught in it waits forever
//! without an error. A process that serves a run watches
//! [`WriteProgress`] and gives up when a write has been in progress for
//! long with none finishing.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

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

#[cfg(test)]
mod tests {
    use super::*;

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
