//! The GPU side of a `--gpu` worker: one OS thread that owns the GPU, takes
//! count-only jobs from the lease loop, counts their sub-problems with
//! [`nq_gpu`], and hands each job's outcome back on its channel, like the
//! CPU pool does.
//!
//! Jobs that queue up while the GPU is busy are counted in one launch, and
//! [`nq_gpu::pack`] expands their sub-problems into at least
//! [`MIN_TASKS`] tasks, so that the GPU stays full even with few jobs in
//! flight. The completions fixed by the half and quarter turns (ring-kind
//! sub-problems only, rare and cheap) are counted on this thread by the CPU.
//!
//! A driver error after the startup check ends the GPU's part: the jobs of
//! that launch are cancelled (their leases expire and are reassigned), the
//! error is logged, and later jobs go to the CPU threads.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;

use nq_core::pool::JobOutcome;
use nq_core::split::{SubCounts, SubProblem};
use tokio::sync::mpsc as async_mpsc;
use tracing::{error, info};

use crate::pool::Produced;
use crate::{Error, Result};

/// Tasks a launch is expanded to at least: a few per resident thread of the
/// largest GPUs (an H100 holds about 60,000 of this kernel's threads), so
/// that the persistent threads end together.
const MIN_TASKS: usize = 1 << 19;

/// Sub-problems gathered into one launch at most, which bounds the host
/// buffers (a table is 264 bytes).
const MAX_BATCH: usize = 1 << 20;

/// One job for the GPU.
pub(crate) struct GpuJob {
    pub(crate) subproblems: Vec<SubProblem>,
    /// The job's stop flag, set by the lease loop.
    pub(crate) stop: Arc<AtomicBool>,
    /// Receives exactly one [`Produced::Done`].
    pub(crate) tx: async_mpsc::Sender<Produced>,
}

/// The thread that owns the GPU.
#[derive(Debug)]
pub(crate) struct GpuRunner {
    /// Jobs for the thread; dropping it ends the thread.
    jobs: Option<mpsc::Sender<GpuJob>>,
    /// Set by the thread when the GPU failed; jobs then go to the CPU.
    failed: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl GpuRunner {
    /// Opens CUDA device `device`, runs its startup self-test
    /// ([`nq_gpu::Gpu::self_test`]) and starts the thread.
    ///
    /// # Errors
    ///
    /// [`Error::Gpu`] naming what is missing (driver, device, compiler) or the
    /// self-test's difference: the worker refuses to start.
    pub(crate) fn start(device: usize) -> Result<GpuRunner> {
        let (ready_tx, ready_rx) = mpsc::channel();
        let (jobs, rx) = mpsc::channel::<GpuJob>();
        let failed = Arc::new(AtomicBool::new(false));
        let failed_thread = Arc::clone(&failed);
        // The GPU is opened on its own thread, which keeps the context
        // current there for every later call.
        let thread = std::thread::Builder::new()
            .name("nq-gpu".into())
            .spawn(move || {
                let gpu = nq_gpu::Gpu::open(device).and_then(|mut gpu| {
                    gpu.self_test()?;
                    Ok(gpu)
                });
                let mut gpu = match gpu {
                    Ok(gpu) => {
                        info!(
                            device,
                            gpu = gpu.name(),
                            compiler = gpu.compiler(),
                            "GPU ready: passed its startup check (N = 12 against the CPU reference)"
                        );
                        let _ = ready_tx.send(Ok(()));
                        gpu
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                serve(&mut gpu, &rx, &failed_thread);
            })
            .map_err(|source| Error::Pool {
                threads: 1,
                source,
            })?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(GpuRunner {
                jobs: Some(jobs),
                failed,
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(Error::Gpu(e))
            }
            Err(_) => {
                let _ = thread.join();
                Err(Error::Gpu(nq_gpu::Error::NoDevice {
                    reason: "the GPU thread ended during start-up".into(),
                }))
            }
        }
    }

    /// True while the GPU takes jobs.
    pub(crate) fn usable(&self) -> bool {
        !self.failed.load(Ordering::Relaxed)
    }

    /// Queues a job. Returns it when the GPU can no longer take it.
    pub(crate) fn submit(&self, job: GpuJob) -> std::result::Result<(), GpuJob> {
        match &self.jobs {
            Some(tx) if self.usable() => tx.send(job).map_err(|e| e.0),
            _ => Err(job),
        }
    }

    /// Ends the thread after the queued jobs (whose stop flags the caller
    /// has set) and joins it, off the async runtime.
    pub(crate) async fn shutdown(mut self) {
        self.jobs = None;
        if let Some(thread) = self.thread.take() {
            let joined = tokio::task::spawn_blocking(move || thread.join()).await;
            if !matches!(joined, Ok(Ok(()))) {
                error!("the GPU thread panicked");
            }
        }
    }
}

/// The thread's loop: gathers the queued jobs, counts them in one launch.
fn serve(gpu: &mut nq_gpu::Gpu, rx: &mpsc::Receiver<GpuJob>, failed: &AtomicBool) {
    while let Ok(first) = rx.recv() {
        let mut jobs = vec![first];
        let mut subs = jobs[0].subproblems.len();
        while subs < MAX_BATCH {
            match rx.try_recv() {
                Ok(job) => {
                    subs += job.subproblems.len();
                    jobs.push(job);
                }
                Err(_) => break,
            }
        }
        if failed.load(Ordering::Relaxed) {
            jobs.into_iter().for_each(cancel);
            continue;
        }
        // A run change can leave jobs of two boards in the queue: one
        // launch per board.
        let mut boards: Vec<u8> = jobs.iter().filter_map(board_of).collect();
        boards.sort_unstable();
        boards.dedup();
        let mut rest = vec![];
        for job in jobs {
            if job.stop.load(Ordering::Relaxed) {
                cancel(job);
            } else if job.subproblems.is_empty() {
                done(job, vec![], 0);
            } else {
                rest.push(job);
            }
        }
        for n in boards {
            let (same, others): (Vec<GpuJob>, Vec<GpuJob>) =
                rest.into_iter().partition(|j| board_of(j) == Some(n));
            rest = others;
            if let Err(e) = count_launch(gpu, same) {
                error!(error = %e, "the GPU failed; its jobs are handed back and later jobs run on the CPU threads");
                failed.store(true, Ordering::Relaxed);
            }
        }
    }
}

fn board_of(job: &GpuJob) -> Option<u8> {
    job.subproblems.first().map(|s| s.prefix().board().n())
}

/// Counts the jobs (all on one board) in one launch and reports each.
fn count_launch(gpu: &mut nq_gpu::Gpu, jobs: Vec<GpuJob>) -> nq_gpu::Result<()> {
    let all: Vec<SubProblem> = jobs
        .iter()
        .flat_map(|j| j.subproblems.iter().copied())
        .collect();
    let stats = match nq_gpu::pack(&all, MIN_TASKS).and_then(|b| gpu.count(&b)) {
        Ok(stats) => stats,
        Err(e) => {
            jobs.into_iter().for_each(cancel);
            return Err(e);
        }
    };
    let mut at = 0;
    for job in jobs {
        let stats = &stats[at..at + job.subproblems.len()];
        at += job.subproblems.len();
        let mut counts = Vec::with_capacity(stats.len());
        let mut nodes = 0u64;
        let mut stopped = false;
        for (sub, s) in job.subproblems.iter().zip(stats) {
            match nq_gpu::fixed_counts(sub, s.count, &job.stop) {
                Some(c) => counts.push(c),
                None => {
                    stopped = true;
                    break;
                }
            }
            nodes = nodes.saturating_add(s.nodes);
        }
        if stopped {
            cancel(job);
        } else {
            done(job, counts, nodes);
        }
    }
    Ok(())
}

fn done(job: GpuJob, counts: Vec<SubCounts>, nodes: u64) {
    let outcome = JobOutcome::Done {
        counts,
        nodes,
        solutions: 0,
    };
    // A closed channel means the job was abandoned; the outcome is unwanted.
    let _ = job.tx.blocking_send(Produced::Done(outcome));
}

fn cancel(job: GpuJob) {
    let _ = job.tx.blocking_send(Produced::Done(JobOutcome::Cancelled));
}
