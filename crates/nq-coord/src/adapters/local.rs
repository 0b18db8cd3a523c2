//! The embedded worker: the coordinator's own cores run jobs too.
//!
//! It leases straight from the engine (no gRPC loopback), runs jobs on
//! `nq_core::pool::Pool` (the one runner of nq), and sends results through the
//! same pipeline as remote results ([`Engine::admit`], then
//! [`Engine::accept`]). It keeps a small prefetch: whenever fewer than two sub-problems
//! per thread are queued in the pool, it leases another job, so the threads
//! never wait for the scheduler. The pool's threads take sub-problems, not
//! jobs, so the queue can run dry while a job is still running: every solved
//! sub-problem therefore wakes the driver, not only every finished job.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use nq_core::pool::{Job, JobOutcome, JobSink, Pool};
use nq_core::search::{CountStats, Kernel};
use nq_core::split::{SubCounts, SubProblem};
use nq_store::JobId;
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, error, info, warn};

use crate::core::lease::{LeaseId, WorkerId};
use crate::core::scheduler::KernelRequest;
use crate::engine::solutions::SolutionWriter;
use crate::engine::{Definition, Engine, Submission};
use crate::error::{Error, Result};
use crate::plan::subproblems_in;

/// How long to wait before asking again when nothing is pending (the rest of
/// the jobs are leased to remote workers).
const STARVED_RETRY: Duration = Duration::from_millis(100);

/// A job the pool is running.
struct Running {
    job: JobId,
    /// The job's estimated work (for throughput figures).
    work: u64,
    subs: Vec<SubProblem>,
    /// The kernel the job runs on (the lease may ask for the scalar one).
    kernel: Kernel,
    /// Shared with the pool's job: setting it cancels the job.
    stop: Arc<AtomicBool>,
}

/// A job leased for the local threads, ready to run.
struct Leased {
    lease: LeaseId,
    job: JobId,
    work: u64,
    subs: Vec<SubProblem>,
    /// The kernel the lease asks for.
    kernel: Kernel,
}

/// What a pool thread reports when a job ends.
struct Finished {
    lease: LeaseId,
    outcome: JobOutcome,
    writer: Option<Arc<SolutionWriter>>,
    fault: Option<Error>,
}

/// The pool's view of one job: forwards solutions to the job's writer and
/// the end of the job to the driver.
struct LocalSink {
    lease: LeaseId,
    /// The driver's inbox. Sending fails only once the driver has stopped, and
    /// then the result is not wanted.
    tx: mpsc::UnboundedSender<Finished>,
    /// Taken by `done`.
    writer: Mutex<Option<Arc<SolutionWriter>>>,
    /// The first error the writer raised; the job is stopped then.
    fault: Mutex<Option<Error>>,
    /// The job's stop flag (shared with the pool): set here when a batch of
    /// solutions is refused, so the job ends early as cancelled.
    stop: Arc<AtomicBool>,
    /// Signalled (from a pool thread) each time a sub-problem is solved, so
    /// the driver tops the queue up before it runs dry. Holds one permit
    /// while the driver is busy, so no wake-up is lost.
    wake: Arc<Notify>,
}

impl JobSink for LocalSink {
    fn solved(&self, _sub: usize, _counts: &SubCounts, _stats: &CountStats) {
        self.wake.notify_one();
    }

    fn solutions(&self, sub: usize, rows: &[u8]) {
        let writer = self
            .writer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(w) = writer {
            let sub = u32::try_from(sub).expect("a job has fewer than 2^32 sub-problems");
            if let Err(e) = w.batch(sub, rows) {
                let mut fault = self.fault.lock().unwrap_or_else(PoisonError::into_inner);
                fault.get_or_insert(e);
                self.stop.store(true, Ordering::Relaxed);
            }
        }
    }

    fn done(&self, outcome: JobOutcome) {
        let writer = self
            .writer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let fault = self
            .fault
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let _ = self.tx.send(Finished {
            lease: self.lease,
            outcome,
            writer,
            fault,
        });
    }
}

/// Runs jobs on `threads` local threads until `token` is cancelled or the run
/// is complete; then cancels what is running and hands its leases back.
/// Commits are spawned on `tracker`, which the caller waits for before it
/// stops the committer.
///
/// # Errors
///
/// [`Error::Io`] when the threads cannot be started; scheduler errors.
pub(crate) async fn run_local(
    engine: Arc<Engine>,
    threads: usize,
    token: CancellationToken,
    tracker: TaskTracker,
) -> Result<()> {
    nq_core::split::check_kernel(Kernel::Auto).map_err(Error::Kernel)?;
    let pool = Pool::new(threads, "nq-local").map_err(|source| Error::Io {
        context: "cannot start the local worker threads".into(),
        source,
    })?;
    let threads = pool.threads();
    let worker = engine
        .core()
        .register_local(u32::try_from(threads).unwrap_or(u32::MAX), Instant::now());
    info!(
        threads,
        kernel = Kernel::Auto.resolved_name(),
        "local threads running jobs"
    );
    let (tx, mut rx) = mpsc::unbounded_channel();
    let wake = Arc::new(Notify::new());
    let mut running: HashMap<LeaseId, Running> = HashMap::new();
    let low_water = 2 * threads;
    let renew_every = engine.ttl / 3;
    let mut last_call = Instant::now();
    while !token.is_cancelled() && !engine.complete.is_cancelled() {
        // Top up, so that the pool's queue never runs dry.
        let mut starved = false;
        while pool.queued() < low_water && !token.is_cancelled() {
            let more = lease(&engine, &worker, &mut running, 1)?;
            last_call = Instant::now();
            let Some(leased) = more.into_iter().next() else {
                starved = true;
                break;
            };
            submit(&engine, &pool, (&tx, &wake), &mut running, leased);
        }
        // The heartbeat keeps long jobs' leases alive.
        if last_call.elapsed() >= renew_every {
            lease(&engine, &worker, &mut running, 0)?;
            last_call = Instant::now();
        }
        let wait = if starved { STARVED_RETRY } else { renew_every };
        tokio::select! {
            biased;
            () = token.cancelled() => break,
            () = engine.complete.cancelled() => break,
            Some(first) = rx.recv() => {
                finish(&engine, &tracker, &worker, &mut running, first);
                while let Ok(next) = rx.try_recv() {
                    finish(&engine, &tracker, &worker, &mut running, next);
                }
            }
            () = wake.notified() => {}
            () = tokio::time::sleep(wait) => {}
        }
    }
    // Stop: cancel what runs and hand the leases back, so that a remote worker
    // (or the next session) takes the jobs at once.
    for r in running.values() {
        r.stop.store(true, Ordering::Relaxed);
    }
    let leases: Vec<LeaseId> = running.keys().copied().collect();
    engine.release(&worker, &leases);
    // Dropping the pool joins its threads: a blocking call, kept off the
    // async workers. The stop flags make it quick.
    tokio::task::spawn_blocking(move || drop(pool)).await?;
    Ok(())
}

/// Leases up to `want` jobs (renewing what runs) and stops revoked jobs.
fn lease(
    engine: &Engine,
    worker: &WorkerId,
    running: &mut HashMap<LeaseId, Running>,
    want: u32,
) -> Result<Vec<Leased>> {
    let held: Vec<LeaseId> = running.keys().copied().collect();
    let (grant, definitions) = engine.grant(worker, want, &held, Instant::now())?;
    for id in &grant.revoked {
        if let Some(r) = running.remove(id) {
            debug!(job = %r.job, lease = %id, "local job revoked");
            r.stop.store(true, Ordering::Relaxed);
        }
    }
    let mut out = Vec::with_capacity(grant.jobs.len());
    for (g, stored) in grant.jobs.into_iter().zip(definitions) {
        let kernel = match g.kernel {
            KernelRequest::Named(k) => k,
            KernelRequest::Any => Kernel::Auto,
        };
        out.push(Leased {
            lease: g.lease,
            job: g.job,
            work: stored.work(),
            subs: subproblems_in(&stored, &engine.shape, g.job)?,
            kernel,
        });
    }
    Ok(out)
}

/// Queues one job on the pool.
fn submit(
    engine: &Arc<Engine>,
    pool: &Pool,
    (tx, wake): (&mpsc::UnboundedSender<Finished>, &Arc<Notify>),
    running: &mut HashMap<LeaseId, Running>,
    Leased {
        lease,
        job,
        work,
        subs,
        kernel,
    }: Leased,
) {
    let stop = Arc::new(AtomicBool::new(false));
    let mut fault = None;
    let writer = if engine.shape.solutions {
        match SolutionWriter::open(engine, job, &subs) {
            Ok(w) => Some(Arc::new(w)),
            Err(e) => {
                // Busy: a remote report of this job is storing its solutions;
                // running it here too would be wasted work.
                fault = Some(e);
                stop.store(true, Ordering::Relaxed);
                None
            }
        }
    } else {
        None
    };
    let sink = Arc::new(LocalSink {
        lease,
        tx: tx.clone(),
        writer: Mutex::new(writer),
        fault: Mutex::new(fault),
        stop: Arc::clone(&stop),
        wake: Arc::clone(wake),
    });
    running.insert(
        lease,
        Running {
            job,
            work,
            subs: subs.clone(),
            kernel,
            stop: Arc::clone(&stop),
        },
    );
    pool.submit(Job {
        subproblems: subs,
        list_solutions: engine.shape.solutions,
        kernel,
        stop,
        sink,
    });
}

/// Handles the end of a local job: a finished one takes the engine's one
/// pipeline (admission under its lease, then acceptance) in a task of its
/// own, so the driver goes straight back to topping up.
fn finish(
    engine: &Arc<Engine>,
    tracker: &TaskTracker,
    worker: &WorkerId,
    running: &mut HashMap<LeaseId, Running>,
    f: Finished,
) {
    let Some(r) = running.remove(&f.lease) else {
        return; // revoked meanwhile; its result is not needed
    };
    if let Some(e) = f.fault {
        // The lease expires and the job is reissued, perhaps to a remote worker.
        warn!(job = %r.job, error = %e.chain(), "local job failed");
        return;
    }
    let JobOutcome::Done {
        counts,
        nodes,
        solutions,
    } = f.outcome
    else {
        return; // cancelled
    };
    let engine = Arc::clone(engine);
    let worker = worker.0.clone();
    let lease = f.lease;
    tracker.spawn(async move {
        let definition = Definition {
            work: r.work,
            subs: r.subs,
        };
        let submission = Submission {
            counts,
            nodes,
            solutions_sent: solutions,
            kernel: r.kernel.resolved_name().to_owned(),
            writer: f.writer.as_deref(),
        };
        // The local threads' reports are bound to their leases like any.
        let accepted = match engine.admit(&worker, r.job.0, lease.0, &engine.run_id) {
            Ok(admitted) => engine.accept(&admitted, &definition, submission).await,
            Err(e) => Err(e),
        };
        // The claim on the job's solutions ends once the result is durable.
        drop(f.writer);
        match accepted {
            Ok(a) => debug!(job = %r.job, outcome = ?a.outcome, "local job stored"),
            Err(Error::ShuttingDown) => {}
            Err(e) => error!(job = %r.job, error = %e.chain(), "local result rejected"),
        }
    });
}
