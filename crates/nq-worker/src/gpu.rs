//! The GPU side of a `--gpu` worker: one OS thread per GPU, all taking
//! count-only jobs from one shared queue, and one finisher thread that
//! completes and reports what they counted.
//!
//! ```text
//!   pool.submit ──► queue (Mutex + Condvar) ──► GPU thread 0 ─┐ (jobs, counts,
//!                                          └──► GPU thread 1 ─┴► times) ──► finisher ──► job channels
//! ```
//!
//! * **Sharing.** Each GPU thread takes the queued jobs of one board when it
//!   has a stream free, so a faster GPU simply takes more: the work follows
//!   each GPU's measured speed without any static share.
//! * **Leasing.** The finisher notes every launch's end and jobs
//!   ([`crate::pace::Launches`]): the worker leases for its GPUs in
//!   proportion to what they finish, seconds of work per GPU, not a fixed
//!   number of jobs.
//! * **Overlap.** A GPU thread keeps up to [`nq_gpu::SLOTS`] launches in
//!   flight, one per stream: it packs (and splits, and orders) the next batch
//!   on the host while the GPU counts the previous one, and the next launch's
//!   blocks take the SMs the previous one's tail frees.
//! * **Tails.** What a launch's last lanes give back (the kernel's spill
//!   queue) is counted by a follow-up launch of the same jobs before they
//!   are reported.
//! * **Off the GPU thread.** The completions fixed by the half and quarter
//!   turns (ring-kind sub-problems only, on the CPU) are counted by the
//!   finisher, and their time is logged per launch with the pack, kernel and
//!   wall times and the nodes per second.
//!
//! A driver error after the startup check ends that GPU's part: the jobs of
//! its launches are cancelled (their leases expire and are reassigned), the
//! error is logged, and the other GPUs go on; once every GPU has failed,
//! later jobs go to the CPU threads.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, mpsc};
use std::time::Instant;

use nq_core::pool::JobOutcome;
use nq_core::search::CountStats;
use nq_core::split::{SubCounts, SubProblem};
use tokio::sync::mpsc as async_mpsc;
use tracing::{error, info};

use crate::config::GpuDevices;
use crate::pace::Launches;
use crate::pool::Produced;
use crate::{Error, Result};

/// Tasks a launch is expanded to at least: a few per resident thread of the
/// largest GPUs (an H100 holds about 67,000 of this kernel's threads), so
/// that pack's longest-first order can end the launch on small tasks.
const MIN_TASKS: usize = 1 << 19;

/// Sub-problems gathered into one launch at most, which bounds the host
/// buffers (a table is 264 bytes, and a sub-problem has one per prefix that
/// its CPU count searches: a few where the strict border lines are
/// pre-placed).
const MAX_BATCH: usize = 1 << 20;

/// One job for the GPU.
pub(crate) struct GpuJob {
    pub(crate) subproblems: Vec<SubProblem>,
    /// The job's stop flag, set by the lease loop.
    pub(crate) stop: Arc<AtomicBool>,
    /// Receives exactly one [`Produced::Done`].
    pub(crate) tx: async_mpsc::Sender<Produced>,
}

/// The jobs waiting for a GPU.
#[derive(Default)]
struct Queue {
    state: Mutex<QueueState>,
    /// Signalled on every new job and on close; GPU threads with nothing in
    /// flight wait on it.
    ready: Condvar,
}

#[derive(Default)]
struct QueueState {
    jobs: VecDeque<GpuJob>,
    /// Set by [`GpuRunner::shutdown`]: the threads finish what is queued and
    /// in flight, then end.
    closed: bool,
}

impl Queue {
    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        // A GPU thread that panicked left the queue as it was: still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The threads that own the GPUs.
pub(crate) struct GpuRunner {
    queue: Arc<Queue>,
    /// GPUs still counting; jobs go to the CPU threads once it is 0.
    working: Arc<AtomicUsize>,
    devices: Vec<usize>,
    /// What the GPUs finished, launch by launch: their measured speed.
    launches: Arc<Mutex<Launches>>,
    threads: Vec<std::thread::JoinHandle<()>>,
    finisher: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for GpuRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuRunner")
            .field("devices", &self.devices)
            .field("working", &self.working.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// What a GPU thread hands the finisher for one launch.
struct Counted {
    device: usize,
    jobs: Vec<GpuJob>,
    stats: Vec<CountStats>,
    times: nq_gpu::LaunchTimes,
    pack_ms: f64,
}

impl GpuRunner {
    /// Opens each CUDA device of `devices`, runs its startup self-test
    /// ([`nq_gpu::Gpu::self_test`]) on its own thread, and starts the threads.
    ///
    /// # Errors
    ///
    /// [`Error::Gpu`] naming what is missing (driver, device, compiler) or a
    /// self-test's difference, for the first device that fails: the worker
    /// refuses to start.
    pub(crate) fn start(devices: &GpuDevices) -> Result<GpuRunner> {
        let devices: Vec<usize> = match devices {
            GpuDevices::All => (0..nq_gpu::device_count().map_err(Error::Gpu)?).collect(),
            GpuDevices::List(list) => list.clone(),
        };
        if devices.is_empty() {
            return Err(Error::Gpu(nq_gpu::Error::NoDevice {
                reason: "no device was listed".into(),
            }));
        }
        let queue = Arc::new(Queue::default());
        let working = Arc::new(AtomicUsize::new(devices.len()));
        let (done_tx, done_rx) = mpsc::channel::<Counted>();
        let launches = Arc::new(Mutex::new(Launches::default()));
        let noted = Arc::clone(&launches);
        let finisher = std::thread::Builder::new()
            .name("nq-gpu-finish".into())
            .spawn(move || finish(&done_rx, &noted))
            .map_err(|source| Error::Pool { threads: 1, source })?;
        let mut threads = vec![];
        let mut ready = vec![];
        for &device in &devices {
            let (ready_tx, ready_rx) = mpsc::channel();
            let (queue, working, done) =
                (Arc::clone(&queue), Arc::clone(&working), done_tx.clone());
            // The GPU is opened on its own thread, which keeps the context
            // current there for every later call.
            let thread = std::thread::Builder::new()
                .name(format!("nq-gpu-{device}"))
                .spawn(move || {
                    let gpu = nq_gpu::Gpu::open(device).and_then(|mut gpu| {
                        gpu.self_test()?;
                        Ok(gpu)
                    });
                    match gpu {
                        Ok(mut gpu) => {
                            info!(
                                device,
                                gpu = gpu.name(),
                                compiler = gpu.compiler(),
                                "GPU ready: passed its startup check (N = 12 against the CPU reference)"
                            );
                            let _ = ready_tx.send(Ok(()));
                            serve(device, &mut gpu, &queue, &working, &done);
                        }
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                        }
                    }
                })
                .map_err(|source| Error::Pool {
                    threads: 1,
                    source,
                })?;
            threads.push(thread);
            ready.push(ready_rx);
        }
        drop(done_tx);
        let mut runner = GpuRunner {
            queue,
            working,
            devices,
            launches,
            threads,
            finisher: Some(finisher),
        };
        for (rx, &device) in ready.iter().zip(&runner.devices) {
            let outcome = rx.recv().unwrap_or_else(|_| {
                Err(nq_gpu::Error::NoDevice {
                    reason: format!("the thread of GPU {device} ended during start-up"),
                })
            });
            if let Err(e) = outcome {
                runner.stop();
                return Err(Error::Gpu(e));
            }
        }
        Ok(runner)
    }

    /// Jobs its GPUs may hold at most: [`crate::config::GPU_MAX_JOBS`]
    /// each (what the worker leases for them, and claims at registration).
    pub(crate) fn max_jobs(&self) -> usize {
        crate::config::GPU_MAX_JOBS.saturating_mul(self.devices.len())
    }

    /// Launch streams on the GPUs still counting: how many launches can be
    /// in flight at once.
    pub(crate) fn streams(&self) -> usize {
        self.working
            .load(Ordering::Relaxed)
            .saturating_mul(nq_gpu::SLOTS)
    }

    /// Jobs per second the GPUs finish, all together, over their last
    /// launches ([`Launches::rate`]); `None` before the first launch ended.
    pub(crate) fn rate(&self) -> Option<f64> {
        // A finisher that panicked left the record as it was: still usable.
        self.launches
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .rate()
    }

    /// True while some GPU takes jobs.
    pub(crate) fn usable(&self) -> bool {
        self.working.load(Ordering::Relaxed) > 0
    }

    /// Queues a job. Returns it when no GPU can take it any more.
    pub(crate) fn submit(&self, job: GpuJob) -> std::result::Result<(), GpuJob> {
        let mut q = self.queue.lock();
        if q.closed || !self.usable() {
            return Err(job);
        }
        q.jobs.push_back(job);
        drop(q);
        self.queue.ready.notify_one();
        Ok(())
    }

    /// Closes the queue and joins every thread (after the queued jobs, whose
    /// stop flags the caller has set).
    fn stop(&mut self) {
        self.queue.lock().closed = true;
        self.queue.ready.notify_all();
        for thread in self.threads.drain(..) {
            if thread.join().is_err() {
                error!("a GPU thread panicked");
            }
        }
        // The GPU threads held the finisher's senders: it ends now.
        if let Some(f) = self.finisher.take()
            && f.join().is_err()
        {
            error!("the GPU finisher thread panicked");
        }
    }

    /// Ends the threads after the queued jobs and joins them, off the async
    /// runtime.
    pub(crate) async fn shutdown(mut self) {
        let joined = tokio::task::spawn_blocking(move || self.stop()).await;
        if joined.is_err() {
            error!("the GPU shutdown panicked");
        }
    }
}

impl Drop for GpuRunner {
    /// A runner dropped without [`GpuRunner::shutdown`] (an error path of
    /// the worker) still closes the queue, so that its threads finish what
    /// is queued and end instead of waiting for jobs forever; it does not
    /// join them.
    fn drop(&mut self) {
        self.queue.lock().closed = true;
        self.queue.ready.notify_all();
    }
}

/// A launch in flight on a GPU thread, with the jobs it counts.
struct InFlight {
    launch: nq_gpu::Launch,
    jobs: Vec<GpuJob>,
    pack_ms: f64,
    /// For a follow-up launch (of what an earlier launch of these jobs
    /// spilled): the results and times so far.
    so_far: Option<(Vec<CountStats>, nq_gpu::LaunchTimes)>,
}

/// A GPU thread's loop: while a stream is free and jobs wait, packs and
/// submits them; otherwise finishes its oldest launch, launches a follow-up
/// of what it spilled in its tail, or hands the results to the finisher;
/// waits for jobs only when nothing is in flight.
fn serve(
    device: usize,
    gpu: &mut nq_gpu::Gpu,
    queue: &Queue,
    working: &AtomicUsize,
    done: &mpsc::Sender<Counted>,
) {
    let mut in_flight: VecDeque<InFlight> = VecDeque::new();
    loop {
        let jobs = if gpu.can_submit() {
            take(queue, in_flight.is_empty())
        } else {
            Some(vec![])
        };
        let Some(jobs) = jobs else {
            // Closed, drained and nothing in flight.
            return;
        };
        let jobs: Vec<GpuJob> = jobs.into_iter().filter_map(pass_trivial).collect();
        let failure = if jobs.is_empty() {
            match in_flight.pop_front() {
                Some(f) => settle(device, gpu, f, &mut in_flight, done),
                None => None,
            }
        } else {
            let started = Instant::now();
            let all: Vec<SubProblem> = jobs
                .iter()
                .flat_map(|j| j.subproblems.iter().copied())
                .collect();
            let submitted = nq_gpu::pack(&all, MIN_TASKS).and_then(|b| gpu.submit(b));
            let pack_ms = started.elapsed().as_secs_f64() * 1e3;
            match submitted {
                Ok(launch) => {
                    in_flight.push_back(InFlight {
                        launch,
                        jobs,
                        pack_ms,
                        so_far: None,
                    });
                    None
                }
                Err(e) => Some((e, jobs)),
            }
        };
        if let Some((e, jobs)) = failure {
            error!(device, error = %e, "the GPU failed; its jobs are handed back and later jobs go to the other GPUs or the CPU threads");
            jobs.into_iter().for_each(cancel);
            in_flight.drain(..).flat_map(|f| f.jobs).for_each(cancel);
            // Under the queue's lock, which submit holds while it checks that
            // a GPU still works: no job can be queued after the last GPU
            // drained the queue.
            let mut q = queue.lock();
            if working.fetch_sub(1, Ordering::Relaxed) == 1 {
                // The last GPU: nobody will take what is queued.
                q.jobs.drain(..).for_each(cancel);
            }
            return;
        }
    }
}

/// Finishes one launch: adds its results to those of the launches before it
/// (of the same jobs), then either launches a follow-up of what it spilled
/// (queued behind the other launches in flight) or hands everything to the
/// finisher. Returns the error and the jobs to cancel when the GPU failed.
fn settle(
    device: usize,
    gpu: &mut nq_gpu::Gpu,
    f: InFlight,
    in_flight: &mut VecDeque<InFlight>,
    done: &mpsc::Sender<Counted>,
) -> Option<(nq_gpu::Error, Vec<GpuJob>)> {
    let finished = match gpu.finish(f.launch) {
        Ok(finished) => finished,
        Err(e) => return Some((e, f.jobs)),
    };
    let (mut stats, mut times) = (finished.stats, finished.times);
    if let Some((before, t)) = f.so_far {
        if let Err(e) = nq_gpu::add_stats(&mut stats, &before) {
            return Some((e, f.jobs));
        }
        times.kernel_ms += t.kernel_ms;
        times.wall_ms += t.wall_ms;
        times.spilled += t.spilled;
        times.follow_ups = t.follow_ups + 1;
        times.tasks = t.tasks;
    }
    if !finished.spilled.is_empty() {
        let follow_up = finished
            .batch
            .follow_up(&finished.spilled)
            .and_then(|b| gpu.submit(b));
        return match follow_up {
            Ok(launch) => {
                in_flight.push_back(InFlight {
                    launch,
                    jobs: f.jobs,
                    pack_ms: f.pack_ms,
                    so_far: Some((stats, times)),
                });
                None
            }
            Err(e) => Some((e, f.jobs)),
        };
    }
    // The finisher ends only after every GPU thread.
    let _ = done.send(Counted {
        device,
        jobs: f.jobs,
        stats,
        times,
        pack_ms: f.pack_ms,
    });
    None
}

/// Takes the queued jobs of the first job's board, up to [`MAX_BATCH`]
/// sub-problems (a run change can queue jobs of two boards: one launch per
/// board). With `wait`, blocks until there is a job or the queue is closed.
/// Returns `None` when the queue is closed and empty, `Some(vec![])` when
/// there is nothing to take now.
fn take(queue: &Queue, wait: bool) -> Option<Vec<GpuJob>> {
    let mut q = queue.lock();
    while wait && q.jobs.is_empty() && !q.closed {
        q = queue.ready.wait(q).unwrap_or_else(|e| e.into_inner());
    }
    if q.jobs.is_empty() {
        return if q.closed && wait { None } else { Some(vec![]) };
    }
    let board = board_of(&q.jobs[0]);
    let mut taken = vec![];
    let mut subs = 0;
    let mut rest = VecDeque::with_capacity(q.jobs.len());
    while let Some(job) = q.jobs.pop_front() {
        if subs < MAX_BATCH && board_of(&job) == board {
            subs += job.subproblems.len();
            taken.push(job);
        } else {
            rest.push_back(job);
        }
    }
    q.jobs = rest;
    Some(taken)
}

/// Settles the jobs that need no GPU: stopped ones are cancelled, empty ones
/// done. Returns the others.
fn pass_trivial(job: GpuJob) -> Option<GpuJob> {
    if job.stop.load(Ordering::Relaxed) {
        cancel(job);
        None
    } else if job.subproblems.is_empty() {
        done(job, vec![], 0);
        None
    } else {
        Some(job)
    }
}

fn board_of(job: &GpuJob) -> Option<u8> {
    job.subproblems.first().map(|s| s.prefix().board().n())
}

/// The finisher's loop: for each launch, the fixed counts of each job on the
/// CPU, then its outcome, then its end noted in `launches`; one log line per
/// launch with its times.
fn finish(rx: &mpsc::Receiver<Counted>, launches: &Mutex<Launches>) {
    while let Ok(c) = rx.recv() {
        let started = Instant::now();
        let jobs = c.jobs.len();
        let mut at = 0;
        let mut nodes_total = 0u64;
        for job in c.jobs {
            let stats = &c.stats[at..at + job.subproblems.len()];
            at += job.subproblems.len();
            let mut counts = Vec::with_capacity(stats.len());
            let mut nodes = 0u64;
            let mut stopped = false;
            for (sub, s) in job.subproblems.iter().zip(stats) {
                match nq_gpu::fixed_counts(sub, s.count, &job.stop) {
                    Some(counts_of_sub) => counts.push(counts_of_sub),
                    None => {
                        stopped = true;
                        break;
                    }
                }
                nodes = nodes.saturating_add(s.nodes);
            }
            nodes_total = nodes_total.saturating_add(nodes);
            if stopped {
                cancel(job);
            } else {
                done(job, counts, nodes);
            }
        }
        launches.lock().unwrap_or_else(|e| e.into_inner()).ended(
            tokio::time::Instant::now(),
            jobs,
            std::time::Duration::try_from_secs_f64(c.times.wall_ms / 1e3)
                .unwrap_or_default(),
        );
        let fixed_ms = started.elapsed().as_secs_f64() * 1e3;
        let rate = if c.times.kernel_ms > 0.0 {
            nodes_total as f64 / (c.times.kernel_ms / 1e3)
        } else {
            0.0
        };
        info!(
            device = c.device,
            jobs,
            tasks = c.times.tasks,
            pack_ms = format_args!("{:.1}", c.pack_ms),
            kernel_ms = format_args!("{:.1}", c.times.kernel_ms),
            wall_ms = format_args!("{:.1}", c.times.wall_ms),
            fixed_ms = format_args!("{fixed_ms:.1}"),
            nodes = nodes_total,
            nodes_per_s = format_args!("{rate:.3e}"),
            spilled = c.times.spilled,
            follow_ups = c.times.follow_ups,
            "GPU launch counted"
        );
    }
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

#[cfg(test)]
mod tests {
    use nq_core::board::Board;
    use nq_core::split::{SplitSpec, split};

    use super::*;

    fn job(n: u64, subs: usize) -> (GpuJob, async_mpsc::Receiver<Produced>) {
        let (tx, rx) = async_mpsc::channel(1);
        let subproblems = split(Board::new(n).unwrap(), SplitSpec::BORDER)
            .into_iter()
            .take(subs)
            .collect();
        let job = GpuJob {
            subproblems,
            stop: Arc::new(AtomicBool::new(false)),
            tx,
        };
        (job, rx)
    }

    /// A launch takes the queued jobs of the first job's board, and leaves
    /// the others queued in their order (a run change can mix two boards).
    #[test]
    fn a_launch_takes_one_board_and_leaves_the_rest_in_order() {
        let queue = Queue::default();
        let mut receivers = vec![];
        for (n, subs) in [(10, 3), (11, 2), (10, 1), (11, 4)] {
            let (j, rx) = job(n, subs);
            queue.lock().jobs.push_back(j);
            receivers.push(rx);
        }
        let first = take(&queue, false).unwrap();
        let sizes: Vec<usize> = first.iter().map(|j| j.subproblems.len()).collect();
        assert_eq!(sizes, [3, 1]);
        assert!(first.iter().all(|j| board_of(j) == Some(10)));
        let second = take(&queue, false).unwrap();
        let sizes: Vec<usize> = second.iter().map(|j| j.subproblems.len()).collect();
        assert_eq!(sizes, [2, 4]);
        assert!(take(&queue, false).unwrap().is_empty());
    }

    /// With launches in flight a GPU thread only looks (no wait); with none
    /// it waits, and ends once the queue is closed and empty.
    #[test]
    fn an_idle_thread_ends_only_on_a_closed_empty_queue() {
        let queue = Queue::default();
        assert!(take(&queue, false).unwrap().is_empty());
        queue.lock().closed = true;
        assert!(take(&queue, false).unwrap().is_empty());
        assert!(take(&queue, true).is_none());
        let (j, _rx) = job(8, 1);
        queue.lock().jobs.push_back(j);
        // Closed but not empty: what was queued is still counted.
        assert_eq!(take(&queue, true).unwrap().len(), 1);
    }

    /// Stopped jobs are cancelled and empty ones done without a launch.
    #[test]
    fn trivial_jobs_are_settled_without_the_gpu() {
        let (stopped, mut rx1) = job(8, 2);
        stopped.stop.store(true, Ordering::Relaxed);
        assert!(pass_trivial(stopped).is_none());
        assert!(matches!(
            rx1.try_recv(),
            Ok(Produced::Done(JobOutcome::Cancelled))
        ));
        let (empty, mut rx2) = job(8, 0);
        assert!(pass_trivial(empty).is_none());
        assert!(matches!(
            rx2.try_recv(),
            Ok(Produced::Done(JobOutcome::Done { nodes: 0, .. }))
        ));
        let (real, _rx3) = job(8, 1);
        assert!(pass_trivial(real).is_some());
    }
}
