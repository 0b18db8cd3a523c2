//! Glue between the CPU pool of `nq-core` and the async side of the worker.
//!
//! [`nq_core::pool::Pool`] runs every job on its own OS threads. What a job
//! produces comes back through a bounded `tokio::sync::mpsc` channel per job:
//! the pool threads call `blocking_send`, so a slow network slows the search
//! down instead of piling solutions up in memory (back-pressure). The async
//! side never blocks on the pool.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use nq_core::pool::{Job, JobOutcome, JobSink, Pool};
use nq_core::search::Kernel;
use nq_core::split::SubProblem;
use tokio::sync::mpsc;

use crate::gpu::{GpuJob, GpuRunner};
use crate::{Error, Result};

/// Solution batches that may wait between the pool threads and a job's report
/// stream. Each batch is at most [`nq_core::pool::SOLUTION_BATCH`] solutions.
const SOLUTION_BACKLOG: usize = 8;

/// What a pool thread hands to the async side for one job.
#[derive(Debug)]
pub(crate) enum Produced {
    /// Solutions of sub-problem `sub`: complete placements of N bytes each.
    Solutions {
        /// Index of the sub-problem in the job.
        sub: u32,
        /// Concatenated `rows[col]` placements.
        rows: Vec<u8>,
    },
    /// The job ended; always the last message of a job.
    Done(JobOutcome),
}

/// One submission of a job to the pool.
#[derive(Debug)]
pub(crate) struct Attempt {
    /// Receives the job's solution batches, then exactly one
    /// [`Produced::Done`]. Dropping it stops the job: the next `blocking_send`
    /// fails and the sink sets `stop`.
    pub(crate) output: mpsc::Receiver<Produced>,
    /// Set by the lease loop to cancel the job (revoked lease, drain timeout);
    /// the pool then ends it with [`JobOutcome::Cancelled`].
    pub(crate) stop: Arc<AtomicBool>,
    /// The kernel that computes it, as reported in `JobResult.kernel`:
    /// a CPU kernel's name, or [`nq_gpu::KERNEL_NAME`].
    pub(crate) kernel: &'static str,
}

/// The worker's CPU threads, and its GPU with `--gpu`.
#[derive(Debug)]
pub(crate) struct WorkerPool {
    /// `None` only inside [`WorkerPool::shutdown`].
    pool: Option<Pool>,
    /// Takes the count-only jobs that leave the kernel to the worker.
    gpu: Option<GpuRunner>,
}

impl WorkerPool {
    /// Starts the threads.
    ///
    /// # Errors
    ///
    /// [`Error::Pool`] when the OS refuses a thread.
    pub(crate) fn new(threads: NonZeroUsize) -> Result<WorkerPool> {
        let pool =
            Pool::new(threads.get(), "nq-worker").map_err(|source| Error::Pool {
                threads: threads.get(),
                source,
            })?;
        Ok(WorkerPool {
            pool: Some(pool),
            gpu: None,
        })
    }

    /// Sends count-only jobs that leave the kernel to the worker
    /// ([`Kernel::Auto`]) to `gpu`. Jobs that list solutions or ask for a CPU
    /// kernel by name (a check of a GPU result, say) stay on the threads.
    pub(crate) fn with_gpu(mut self, gpu: GpuRunner) -> WorkerPool {
        self.gpu = Some(gpu);
        self
    }

    /// The GPUs, while one of them still takes jobs.
    pub(crate) fn gpu(&self) -> Option<&GpuRunner> {
        self.gpu.as_ref().filter(|gpu| gpu.usable())
    }

    /// Queues `subproblems` behind the jobs already queued, to run on
    /// `kernel`. With `list_solutions` the completions are streamed as
    /// batches before the outcome.
    pub(crate) fn submit(
        &self,
        subproblems: Vec<SubProblem>,
        list_solutions: bool,
        kernel: Kernel,
    ) -> Attempt {
        let stop = Arc::new(AtomicBool::new(false));
        let backlog = if list_solutions { SOLUTION_BACKLOG } else { 1 };
        let (tx, output) = mpsc::channel(backlog);
        let subproblems = match &self.gpu {
            Some(gpu) if kernel == Kernel::Auto && !list_solutions => {
                let job = GpuJob {
                    subproblems,
                    stop: Arc::clone(&stop),
                    tx,
                };
                match gpu.submit(job) {
                    Ok(()) => {
                        return Attempt {
                            output,
                            stop,
                            kernel: nq_gpu::KERNEL_NAME,
                        };
                    }
                    // The GPU failed earlier: the CPU threads take it.
                    Err(job) => {
                        return self.submit_cpu(
                            job.subproblems,
                            false,
                            kernel,
                            job.tx,
                            output,
                            stop,
                        );
                    }
                }
            }
            _ => subproblems,
        };
        self.submit_cpu(subproblems, list_solutions, kernel, tx, output, stop)
    }

    fn submit_cpu(
        &self,
        subproblems: Vec<SubProblem>,
        list_solutions: bool,
        kernel: Kernel,
        tx: mpsc::Sender<Produced>,
        output: mpsc::Receiver<Produced>,
        stop: Arc<AtomicBool>,
    ) -> Attempt {
        let name = kernel.resolved_name();
        if subproblems.is_empty() {
            // The pool would end an empty job on this (async) thread, where
            // `blocking_send` panics; a fresh channel always has room for one.
            let done = JobOutcome::Done {
                counts: vec![],
                nodes: 0,
                solutions: 0,
            };
            tx.try_send(Produced::Done(done))
                .expect("a new channel with capacity ≥ 1 has room");
            return Attempt {
                output,
                stop,
                kernel: name,
            };
        }
        let sink = Arc::new(ChannelSink {
            tx,
            stop: Arc::clone(&stop),
        });
        self.pool
            .as_ref()
            .expect("the pool lives until shutdown")
            .submit(Job {
                subproblems,
                list_solutions,
                kernel,
                stop: Arc::clone(&stop),
                sink,
            });
        Attempt {
            output,
            stop,
            kernel: name,
        }
    }

    /// Cancels the queued jobs and joins the threads, off the async runtime.
    ///
    /// The caller MUST first set the stop flag of every job still running:
    /// the pool only cancels jobs that have not started.
    pub(crate) async fn shutdown(mut self) {
        if let Some(gpu) = self.gpu.take() {
            gpu.shutdown().await;
        }
        if let Some(pool) = self.pool.take() {
            // Dropping the pool joins its threads, and the pool ends queued jobs
            // on the dropping thread, whose sinks `blocking_send`: both are
            // forbidden on a runtime thread.
            let joined = tokio::task::spawn_blocking(move || drop(pool)).await;
            if let Err(e) = joined {
                tracing::error!(error = %e, "a pool thread panicked during shutdown");
            }
        }
    }
}

/// Forwards a job's output to its channel. Runs on pool threads.
struct ChannelSink {
    /// Bounded; the job's report task receives. When that task is gone the
    /// send fails and the job is stopped, since nobody wants its output.
    tx: mpsc::Sender<Produced>,
    /// The job's stop flag, shared with the pool and the lease loop.
    stop: Arc<AtomicBool>,
}

impl JobSink for ChannelSink {
    fn solutions(&self, sub: usize, rows: &[u8]) {
        let sub = u32::try_from(sub).expect("a job has fewer than 2^32 sub-problems");
        let batch = Produced::Solutions {
            sub,
            rows: rows.to_vec(),
        };
        if self.tx.blocking_send(batch).is_err() {
            self.stop.store(true, Ordering::Relaxed);
        }
    }

    fn done(&self, outcome: JobOutcome) {
        // A closed channel means the job was abandoned; the outcome is unwanted.
        let _ = self.tx.blocking_send(Produced::Done(outcome));
    }
}

#[cfg(test)]
mod tests {
    use nq_core::board::Board;
    use nq_core::split::{SplitSpec, split};

    use super::*;

    fn subproblems(n: u64) -> Vec<SubProblem> {
        split(Board::new(n).unwrap(), SplitSpec::new(1, 0).unwrap())
    }

    #[tokio::test]
    async fn counts_and_lists_through_bounded_channels() {
        let pool = WorkerPool::new(NonZeroUsize::new(2).unwrap()).unwrap();
        let subs = subproblems(8);
        let mut attempt = pool.submit(subs.clone(), true, Kernel::Auto);
        let mut listed = 0;
        let outcome = loop {
            match attempt.output.recv().await.unwrap() {
                Produced::Solutions { rows, .. } => listed += rows.len() / 8,
                Produced::Done(o) => break o,
            }
        };
        let JobOutcome::Done {
            counts, solutions, ..
        } = outcome
        else {
            panic!("cancelled")
        };
        assert_eq!(counts.len(), subs.len());
        assert_eq!(solutions, listed as u64);
        assert_eq!(counts.iter().map(|c| c.count).sum::<u128>(), listed as u128);
        pool.shutdown().await;
    }

    #[tokio::test]
    async fn empty_jobs_and_stopped_jobs_end_once() {
        let pool = WorkerPool::new(NonZeroUsize::MIN).unwrap();
        let mut empty = pool.submit(vec![], false, Kernel::Scalar);
        assert!(matches!(
            empty.output.recv().await,
            Some(Produced::Done(JobOutcome::Done { .. }))
        ));
        let mut stopped = pool.submit(subproblems(14), false, Kernel::Scalar);
        stopped.stop.store(true, Ordering::Relaxed);
        assert!(matches!(
            stopped.output.recv().await,
            Some(Produced::Done(JobOutcome::Cancelled))
        ));
        pool.shutdown().await;
    }

    #[tokio::test]
    async fn dropping_the_receiver_stops_a_listing() {
        let pool = WorkerPool::new(NonZeroUsize::MIN).unwrap();
        let attempt = pool.submit(subproblems(13), true, Kernel::Auto);
        let stop = Arc::clone(&attempt.stop);
        drop(attempt.output);
        // The pool's thread notices on its next send; shutdown joins it, so
        // this returns only if the listing really stopped.
        pool.shutdown().await;
        assert!(stop.load(Ordering::Relaxed));
    }
}
