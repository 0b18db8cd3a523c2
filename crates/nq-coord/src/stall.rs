//! The serving coordinator's watch over its store's writes.
//!
//! sled 0.34 can deadlock under heavy writes (spacejam/sled#1412): a
//! segment's truncation waits for sled's I/O pool while it holds the
//! segment accountant's lock, and every writer after it waits on that lock
//! without an error or an end (BENCHMARKS.md §29; `nq-coord restore` watches
//! its import by the same rule, [`Stall`]). A coordinator caught
//! in it would stop settling results and hold its workers' reports forever
//! while its health still says it serves. [`watch`] notices from a thread
//! of its own (the runtime's threads may be the ones stuck) when a write
//! has been in progress for [`STORE_STALL`] with none finishing, and the
//! session then exits as `interrupted` (`crate::run`): nothing else can
//! stop a thread inside the deadlock, and nothing is lost, since every
//! acknowledged result was flushed before its acknowledgement. The same
//! command resumes, and a supervisor that restarts on exit code 3 does so
//! by itself.

use std::sync::Arc;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nq_store::{Stall, WriteProgress};

/// How long a write may be in progress with none finishing before the
/// store counts as stuck. A commit group's batch and flush take
/// milliseconds, and a flush at 10^8 jobs under 1,000 workers well under a
/// second (BENCHMARKS.md §28); a backup holds the commit loop at its write
/// gate, before any write begins, so its minutes do not count here.
pub(crate) const STORE_STALL: Duration = Duration::from_secs(300);

/// The running watch; dropping it stops the watch.
#[derive(Debug)]
pub(crate) struct Watch {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Watches `writes` on a thread of its own: once a write has been in
/// progress for `stall` with none finishing, calls `on_stall` (once) with
/// the error that says so.
///
/// # Errors
///
/// The thread could not be started.
pub(crate) fn watch(
    writes: Arc<WriteProgress>,
    stall: Duration,
    on_stall: impl FnOnce(crate::Error) + Send + 'static,
) -> std::io::Result<Watch> {
    let (stop, stopped) = mpsc::channel::<()>();
    // Often enough to notice within a few percent of `stall`.
    let tick = (stall / 30).clamp(Duration::from_millis(5), Duration::from_secs(10));
    let thread = std::thread::Builder::new()
        .name("nq-store-watch".into())
        .spawn(move || {
            let mut seen = Stall::new(Instant::now(), writes.now());
            while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(tick) {
                let now = writes.now();
                if let Some(after) = seen.observe(Instant::now(), now, stall) {
                    on_stall(crate::Error::StoreStalled {
                        after,
                        in_flight: now.in_flight,
                        finished: now.finished,
                    });
                    return;
                }
            }
        })?;
    Ok(Watch {
        stop: Some(stop),
        thread: Some(thread),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watch_reports_a_write_that_never_ends_and_stops_when_dropped() {
        let progress = Arc::new(WriteProgress::default());
        let (tx, rx) = mpsc::channel();
        let w = watch(Arc::clone(&progress), Duration::from_millis(50), move |e| {
            let _ = tx.send(e);
        })
        .expect("thread");
        let stuck = progress.begin();
        let e = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the stuck write is reported");
        assert!(
            matches!(e, crate::Error::StoreStalled { in_flight: 1, finished: 0, after }
                if after >= Duration::from_millis(50)),
            "{e:?}"
        );
        let message = e.to_string();
        assert!(
            message.contains("spacejam/sled#1412")
                && message.contains("run the same command again"),
            "{message}"
        );
        drop(stuck);
        drop(w);
        // Once reported, never again (the sender went with the watch's thread).
        assert!(rx.recv().is_err());
    }

    #[test]
    fn a_dropped_watch_stops_without_reporting() {
        let progress = Arc::new(WriteProgress::default());
        let (tx, rx) = mpsc::channel();
        let w = watch(Arc::clone(&progress), STORE_STALL, move |e| {
            let _ = tx.send(e);
        })
        .expect("thread");
        let _writing = progress.begin();
        drop(w);
        assert!(rx.recv().is_err(), "the watch ended without a report");
    }
}
