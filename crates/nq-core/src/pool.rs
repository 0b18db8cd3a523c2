//! A fixed pool of OS threads that solves jobs of sub-problems.
//!
//! This is the one runner of nq: the `nq` CLI, the worker and the
//! coordinator's embedded threads all hand their jobs to a [`Pool`]. CPU work
//! therefore never runs on an async runtime's threads, as the tokio docs ask.
//!
//! Sub-problems, not jobs, are the unit the threads take from the queue: a
//! thread that finishes a sub-problem takes the next one, whichever job it
//! belongs to. A job is finished when its last sub-problem is, so threads never
//! wait for a slow job's tail while other jobs are queued.
//!
//! The pool owns its threads: dropping it cancels queued work (each affected
//! job gets [`JobOutcome::Cancelled`]) and joins every thread.

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;

use crate::search::{CountStats, Kernel};
use crate::split::{SubCounts, SubProblem};

/// Solutions are handed to [`JobSink::solutions`] in batches of at most this
/// many, so a listing never holds more than one batch per thread in memory.
pub const SOLUTION_BATCH: usize = 1024;

/// The most threads a [`Pool`] runs, and so the most any nq program accepts
/// (`nq count --threads`, `nq-worker --threads`, `nq-coord --local-threads`).
///
/// Far more than the cores of any machine nq runs on, and few enough that the
/// OS can start them all: a count of 100 000 exhausted the process's threads,
/// so the async runtime could no longer start its own and the program hung.
pub const MAX_THREADS: usize = 4096;

/// Receives what a job produces. Called from pool threads.
pub trait JobSink: Send + Sync {
    /// A batch of solutions of sub-problem `sub` (index in the job): complete
    /// placements of `n` bytes each (`rows[col]`), concatenated. Only called for
    /// jobs with `list_solutions`. Blocking here is allowed and slows the job
    /// down (back-pressure).
    fn solutions(&self, sub: usize, rows: &[u8]) {
        let _ = (sub, rows);
    }

    /// Sub-problem `sub` is solved. For progress reports.
    fn solved(&self, sub: usize, counts: &SubCounts, stats: &CountStats) {
        let _ = (sub, counts, stats);
    }

    /// The job is over. Called exactly once per job, from a pool thread or from
    /// the thread that drops the pool.
    fn done(&self, outcome: JobOutcome);
}

/// How a job ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobOutcome {
    /// Every sub-problem was solved.
    Done {
        /// One entry per sub-problem, in the job's order.
        counts: Vec<SubCounts>,
        /// Search nodes over the whole job (`crate::search::CountStats::nodes`).
        nodes: u64,
        /// Solutions passed to [`JobSink::solutions`] (0 unless listing).
        solutions: u64,
    },
    /// The job's stop flag was set, or the pool shut down, before it finished.
    Cancelled,
}

/// A job: sub-problems solved together and reported once.
pub struct Job {
    /// The sub-problems, in the order their counts are reported.
    pub subproblems: Vec<SubProblem>,
    /// When true, the completions are also listed to [`JobSink::solutions`].
    pub list_solutions: bool,
    /// The count kernel: [`Kernel::Auto`] unless a second, independent
    /// computation is wanted.
    pub kernel: Kernel,
    /// Set it (from any thread) to cancel this job; its sink then gets
    /// [`JobOutcome::Cancelled`].
    pub stop: Arc<AtomicBool>,
    /// Where results go.
    pub sink: Arc<dyn JobSink>,
}

impl fmt::Debug for Job {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Job")
            .field("subproblems", &self.subproblems.len())
            .field("list_solutions", &self.list_solutions)
            .field("kernel", &self.kernel)
            .finish_non_exhaustive()
    }
}

/// The shared state of one job in flight.
struct Running {
    job: Job,
    /// Results so far and the number of sub-problems not yet finished. Taken
    /// (set to `None`) by whoever ends the job, so `done` runs exactly once.
    state: Mutex<Option<Progress>>,
}

struct Progress {
    counts: Vec<Option<SubCounts>>,
    left: usize,
    nodes: u64,
    solutions: u64,
}

/// The queue shared by the pool's threads.
struct Shared {
    /// Pending `(job, sub-problem index)` pairs, oldest job first.
    queue: Mutex<Queue>,
    /// Signalled when work is queued or the pool shuts down.
    ready: Condvar,
}

struct Queue {
    tasks: VecDeque<(Arc<Running>, usize)>,
    shutdown: bool,
}

/// A fixed set of OS threads solving [`Job`]s.
pub struct Pool {
    shared: Arc<Shared>,
    /// Joined on drop, after `shutdown` is set and the condvar is signalled.
    threads: Vec<JoinHandle<()>>,
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("threads", &self.threads.len())
            .finish()
    }
}

impl Pool {
    /// Starts `threads` threads (at least one), named `{name}-{i}`.
    ///
    /// # Errors
    ///
    /// An error of kind `InvalidInput` (wrapping [`ErrorKind::Threads`]) for
    /// more than [`MAX_THREADS`] threads, and the OS error if a thread cannot
    /// be spawned. Either way no thread is left running.
    ///
    /// [`ErrorKind::Threads`]: crate::ErrorKind::Threads
    pub fn new(threads: usize, name: &str) -> std::io::Result<Pool> {
        if threads > MAX_THREADS {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                crate::Error::new(crate::ErrorKind::Threads(threads)),
            ));
        }
        let mut pool = Pool {
            shared: Arc::new(Shared {
                queue: Mutex::new(Queue {
                    tasks: VecDeque::new(),
                    shutdown: false,
                }),
                ready: Condvar::new(),
            }),
            threads: Vec::with_capacity(threads.max(1)),
        };
        for i in 0..threads.max(1) {
            let shared = Arc::clone(&pool.shared);
            // On failure `pool` is dropped, which stops and joins the threads
            // started so far instead of leaving them blocked forever.
            let handle = std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || work(&shared))?;
            pool.threads.push(handle);
        }
        Ok(pool)
    }

    /// The number of threads.
    pub fn threads(&self) -> usize {
        self.threads.len()
    }

    /// Queues a job behind those already queued. A job with no sub-problems is
    /// done at once, on the calling thread.
    pub fn submit(&self, job: Job) {
        let len = job.subproblems.len();
        let running = Arc::new(Running {
            state: Mutex::new(Some(Progress {
                counts: vec![None; len],
                left: len,
                nodes: 0,
                solutions: 0,
            })),
            job,
        });
        if len == 0 {
            finish(&running);
            return;
        }
        let mut q = lock(&self.shared.queue);
        if q.shutdown {
            drop(q);
            cancel(&running);
            return;
        }
        q.tasks.extend((0..len).map(|i| (Arc::clone(&running), i)));
        drop(q);
        self.shared.ready.notify_all();
    }

    /// Sub-problems queued and not yet started, over all jobs.
    pub fn queued(&self) -> usize {
        lock(&self.shared.queue).tasks.len()
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let pending: Vec<_> = {
            let mut q = lock(&self.shared.queue);
            q.shutdown = true;
            q.tasks.drain(..).collect()
        };
        self.shared.ready.notify_all();
        for (running, _) in pending {
            running.job.stop.store(true, Ordering::Relaxed);
            cancel(&running);
        }
        for t in self.threads.drain(..) {
            // A panicking task already reported itself through the panic hook;
            // there is nothing more to do with it here.
            let _ = t.join();
        }
    }
}

/// A poisoned lock only means another thread panicked while holding it; the
/// queue is still consistent (every change to it is a single push or pop).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn work(shared: &Shared) {
    loop {
        let (running, i) = {
            let mut q = lock(&shared.queue);
            loop {
                if q.shutdown {
                    return;
                }
                if let Some(task) = q.tasks.pop_front() {
                    break task;
                }
                q = shared.ready.wait(q).unwrap_or_else(PoisonError::into_inner);
            }
        };
        run_one(&running, i);
    }
}

/// Solves sub-problem `i` of a job and, if it was the last, ends the job.
fn run_one(running: &Arc<Running>, i: usize) {
    let job = &running.job;
    if job.stop.load(Ordering::Relaxed) {
        cancel(running);
        return;
    }
    let sub = &job.subproblems[i];
    let mut listed = 0u64;
    if job.list_solutions {
        listed = match list(sub, i, job) {
            Some(k) => k,
            None => return cancel(running),
        };
    }
    let Some((counts, stats)) = sub.solve_with(job.kernel, &job.stop) else {
        return cancel(running);
    };
    // The listing and the count are separate searches; if they disagree, the
    // listing must not be trusted, so the job is not reported at all.
    assert!(
        !job.list_solutions || u128::from(listed) == counts.count,
        "listing found {listed} solutions but the count is {}",
        counts.count
    );
    job.sink.solved(i, &counts, &stats);
    let mut state = lock(&running.state);
    let Some(p) = state.as_mut() else { return };
    p.counts[i] = Some(counts);
    p.left -= 1;
    // A figure for throughput only; a job's nodes fit u64 many times over,
    // and saturating keeps even an absurd one from wrapping.
    p.nodes = p.nodes.saturating_add(stats.nodes);
    p.solutions += listed;
    if p.left == 0 {
        drop(state);
        finish(running);
    }
}

/// Lists the completions of `sub` to the job's sink in batches. `None` when
/// the job was stopped meanwhile.
fn list(sub: &SubProblem, i: usize, job: &Job) -> Option<u64> {
    let n = sub.prefix().board().len();
    let mut batch = Vec::with_capacity(n * SOLUTION_BATCH.min(64));
    let mut count = 0u64;
    let mut stopped = false;
    sub.list(&mut |rows: &[u8]| {
        if job.stop.load(Ordering::Relaxed) {
            stopped = true;
            return std::ops::ControlFlow::Break(());
        }
        batch.extend_from_slice(rows);
        count += 1;
        if batch.len() == n * SOLUTION_BATCH {
            job.sink.solutions(i, &batch);
            batch.clear();
        }
        std::ops::ControlFlow::Continue(())
    });
    if stopped {
        return None;
    }
    if !batch.is_empty() {
        job.sink.solutions(i, &batch);
    }
    Some(count)
}

/// Ends a job successfully, once.
fn finish(running: &Running) {
    let Some(p) = lock(&running.state).take() else {
        return;
    };
    let counts = p
        .counts
        .into_iter()
        .map(|c| c.expect("a finished job has every count"))
        .collect();
    running.job.sink.done(JobOutcome::Done {
        counts,
        nodes: p.nodes,
        solutions: p.solutions,
    });
}

/// Ends a job as cancelled, once; later tasks of the job see it is over.
fn cancel(running: &Running) {
    if lock(&running.state).take().is_some() {
        running.job.stop.store(true, Ordering::Relaxed);
        running.job.sink.done(JobOutcome::Cancelled);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;
    use crate::board::Board;
    use crate::split::{SplitSpec, Tally, split};

    struct ToChannel(Mutex<mpsc::Sender<JobOutcome>>);

    impl JobSink for ToChannel {
        fn done(&self, outcome: JobOutcome) {
            lock(&self.0).send(outcome).unwrap();
        }
    }

    #[test]
    fn pool_counts_jobs_exactly() {
        let board = Board::new(10).unwrap();
        let spec = SplitSpec::new(1, 1).unwrap();
        let subs = split(board, spec);
        let pool = Pool::new(3, "test").unwrap();
        let (tx, rx) = mpsc::channel();
        let sink = Arc::new(ToChannel(Mutex::new(tx)));
        let chunks: Vec<Vec<SubProblem>> = subs.chunks(7).map(<[_]>::to_vec).collect();
        for chunk in &chunks {
            pool.submit(Job {
                subproblems: chunk.clone(),
                list_solutions: false,
                kernel: Kernel::Auto,
                stop: Arc::new(AtomicBool::new(false)),
                sink: sink.clone(),
            });
        }
        let mut tally = Tally::default();
        let mut outcomes: Vec<_> =
            (0..chunks.len()).map(|_| rx.recv().unwrap()).collect();
        // Completion order varies; match results to chunks by content is not
        // needed for the sum, which is order-independent.
        let mut all = vec![];
        for o in outcomes.drain(..) {
            let JobOutcome::Done { counts, .. } = o else {
                panic!("cancelled")
            };
            all.push(counts);
        }
        let total: u128 = all.iter().flatten().map(|c| c.count).sum();
        for sub in &subs {
            let (c, _) = sub.solve(&AtomicBool::new(false)).unwrap();
            tally.add(sub, &c).unwrap();
        }
        assert_eq!(tally.total, 724);
        let plain: u128 = subs
            .iter()
            .map(|s| s.solve(&AtomicBool::new(false)).unwrap().0.count)
            .sum();
        assert_eq!(total, plain);
    }

    #[test]
    fn more_threads_than_the_cap_are_refused_with_the_cap_named() {
        assert_eq!(
            Pool::new(MAX_THREADS, "test").unwrap().threads(),
            MAX_THREADS
        );
        let err = Pool::new(MAX_THREADS + 1, "test").unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
        assert!(err.to_string().contains("1 to 4096"), "{err}");
    }

    #[test]
    fn stopped_job_is_cancelled_once() {
        let board = Board::new(12).unwrap();
        let subs = split(board, SplitSpec::new(1, 0).unwrap());
        let pool = Pool::new(1, "test").unwrap();
        let (tx, rx) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(true));
        pool.submit(Job {
            subproblems: subs,
            list_solutions: false,
            kernel: Kernel::Auto,
            stop,
            sink: Arc::new(ToChannel(Mutex::new(tx))),
        });
        assert_eq!(rx.recv().unwrap(), JobOutcome::Cancelled);
        drop(pool);
        assert!(rx.try_recv().is_err(), "done is called exactly once");
    }
}
