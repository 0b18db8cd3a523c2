//! Allocator tuning for a long-running process whose memory must stay
//! bounded: the coordinator keeps a million-job run under 200 MB only with
//! it (BENCHMARKS.md §7 has the figures).
//!
//! [`tune`] caps glibc's arenas and fixes its mmap threshold; [`Trimmer`]
//! hands freed heap memory back to the system every [`TRIM_EVERY`].
//! `nq_coord::run` starts both, so that every caller gets them (the binary,
//! the e2e tests that run a coordinator in-process, an embedder); the
//! `nq-coord` binary also calls [`tune`] first thing in `main`, before any
//! other thread exists, where the arena cap takes full effect.
//!
//! Both are no-ops on anything but glibc on Linux.

use std::sync::Once;
use std::time::Duration;

/// How often a [`Trimmer`] hands freed heap memory back to the system.
pub const TRIM_EVERY: Duration = Duration::from_secs(5);

/// Tunes glibc's malloc for a long-running process whose memory must stay
/// bounded:
///
/// * at most 2 arenas (the default is 8 per core): every thread that
///   allocates (tokio workers, blocking threads, sled's pool) gets its own
///   arena, and memory freed across many arenas is not given back; with 1000
///   workers the cap saves about 50 MB, at no measurable cost in speed;
/// * a fixed 1 MiB mmap threshold (the default adapts upwards to 32 MiB), so
///   the large temporary vectors of a new run's split are returned to the
///   system when freed instead of staying in the heap.
///
/// Tunes once per process; later calls do nothing. Call it before other
/// threads start where possible: arenas that threads already made are kept
/// (the cap applies to those made afterwards).
pub fn tune() {
    static TUNED: Once = Once::new();
    TUNED.call_once(|| {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        {
            /// Parameters from glibc's `malloc.h`.
            const M_MMAP_THRESHOLD: i32 = -3;
            const M_ARENA_MAX: i32 = -8;
            unsafe extern "C" {
                fn mallopt(param: i32, value: i32) -> i32;
            }
            // SAFETY: `mallopt` only tunes the allocator and is safe to call
            // at any time, from any thread (it takes the main arena's lock);
            // an unknown parameter returns 0 and changes nothing.
            unsafe {
                mallopt(M_ARENA_MAX, 2);
                mallopt(M_MMAP_THRESHOLD, 1 << 20);
            }
        }
    });
}

/// Returns free heap memory to the operating system (glibc only; a no-op
/// elsewhere). It walks every arena under its lock: call it off async
/// threads.
pub fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        unsafe extern "C" {
            fn malloc_trim(pad: usize) -> i32;
        }
        // SAFETY: `malloc_trim` only releases free memory and is safe to call
        // from any thread at any time.
        unsafe {
            malloc_trim(0);
        }
    }
}

/// A task that calls [`trim`] every [`TRIM_EVERY`] until the `Trimmer` is
/// dropped.
///
/// sled allocates and frees a great deal while it reads a large store (a new
/// run's final re-scan, a resume's re-scan) and while results stream in;
/// glibc keeps what is freed in its arenas, so without this the resident set
/// stays at every peak and creeps up with fragmentation.
#[derive(Debug)]
pub struct Trimmer {
    /// The periodic task; aborted on drop, since it owns nothing that needs
    /// an orderly end.
    task: tokio::task::JoinHandle<()>,
}

impl Trimmer {
    /// Starts trimming on the current tokio runtime.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    pub fn start() -> Trimmer {
        let task = tokio::spawn(async {
            let mut tick = tokio::time::interval(TRIM_EVERY);
            loop {
                tick.tick().await;
                // A panic in `trim` cannot happen; a cancelled blocking task
                // at runtime shutdown is harmless.
                let _ = tokio::task::spawn_blocking(trim).await;
            }
        });
        Trimmer { task }
    }
}

impl Drop for Trimmer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A trimmer ends with its owner: after the drop its task is finished,
    /// and nothing trims behind the caller's back.
    #[tokio::test]
    async fn a_trimmer_stops_when_dropped() {
        tune();
        tune(); // a second call is harmless
        let trimmer = Trimmer::start();
        // The first tick is immediate: one trim has run or is running.
        tokio::task::yield_now().await;
        let task = trimmer.task.abort_handle();
        drop(trimmer);
        let gone = tokio::time::timeout(Duration::from_secs(30), async {
            while !task.is_finished() {
                tokio::task::yield_now().await;
            }
        })
        .await;
        assert!(gone.is_ok(), "the trimming task outlived its Trimmer");
        // Trimming itself is safe to call at any time, from any thread.
        std::thread::spawn(trim).join().unwrap();
    }
}
