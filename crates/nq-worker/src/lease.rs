//! The lease loop: one task that owns the worker's registration and every
//! lease it holds.
//!
//! ```text
//!   unregistered ──Register──► registered ──Lease (every ttl/4, or sooner
//!        ▲                          │        when threads run short)
//!        └── FAILED_PRECONDITION ───┘
//!
//!   lease:  leased ──pool──► computed ──ReportBatch (or Report)──► acked
//!              │                                          (entry removed)
//!              │
//!              └─ revoked / handed back: stop flag set, no longer heartbeated
//! ```
//!
//! The protocol asks for a heartbeat at least every TTL/3; the loop beats
//! every TTL/4 so that one slow call does not cost a lease.
//!
//! The loop never waits on the CPU: each leased job gets a report task (see
//! [`crate::client::report_job`]) that waits for the pool's output and reports
//! it, and the loop only hears back when that task ends. Count-only results
//! go through one batcher (`client::Batcher`), which sends everything that
//! finished meanwhile in one `ReportBatch` call.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use nq_core::search::Kernel;
use nq_core::split::SubProblem;
use nq_proto::convert::RunShape;
use nq_proto::pb;
use nq_proto::pb::report_ack::Outcome;
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinError, JoinSet};
use tokio::time::{Instant, sleep_until};
use tracing::{Instrument, debug, error, info, info_span, warn};

use crate::client::{
    Backoff, Batcher, Client, Failure, JobEnd, JobId, JobRef, LeaseId, Outage, ReportCtx,
    ReportGate, Session, SharedOutage, WorkerId, lock, lost, outcome_name, report_job,
};
use crate::config::Prefetch;
use crate::pace::Pace;
use crate::pool::WorkerPool;
use crate::{Config, Error, Exit, Result, Summary};

/// Used when the coordinator announces no lease lifetime.
const DEFAULT_TTL: Duration = Duration::from_secs(30);

/// How often the loop logs its progress at `info`.
const PROGRESS_EVERY: Duration = Duration::from_secs(30);

/// The run the worker joined.
#[derive(Debug)]
struct Run {
    shape: RunShape,
    id: String,
}

/// A lease the worker holds, from the Lease response until its report task
/// ends.
#[derive(Debug)]
struct Held {
    job: JobId,
    /// Kept to compute the job again if its solution stream breaks.
    subproblems: Vec<SubProblem>,
    /// The current attempt's stop flag, shared with the pool threads.
    stop: Arc<AtomicBool>,
    /// Set by the report task when the pool has finished the job.
    computed: Arc<AtomicBool>,
    /// True once the coordinator revoked the lease or the worker handed it
    /// back: it is no longer heartbeated, and its report (if any) is only
    /// compared by the coordinator.
    dropped: bool,
    /// Attempts of this job whose solution stream broke; each waits longer
    /// before it recomputes the job.
    failures: u32,
    /// The kernel the job runs on (the coordinator may ask for one).
    kernel: Kernel,
    /// True when a GPU computes it: its end is measured per launch, not as
    /// a CPU thread's.
    on_gpu: bool,
    /// The report task, to find the lease again if that task panics, and to
    /// abort it when the job's run is over.
    task: tokio::task::AbortHandle,
}

/// The state of a worker between [`crate::run`]'s start and end.
pub(crate) struct LeaseLoop<'a> {
    config: &'a Config,
    pool: &'a WorkerPool,
    client: Client,
    /// Set by the first successful registration.
    run: Option<Run>,
    /// `None` while (re-)registering.
    worker: Option<WorkerId>,
    /// Publishes each new registration to report tasks, which wait on it
    /// after an unknown-worker failure and send nothing once it is in another
    /// run than their job's. Lives as long as the loop.
    session: watch::Sender<Session>,
    /// Counts the coordinator's successful answers (Register and Lease). A
    /// report that failed on the network waits for the next one before it is
    /// tried again, so that it learns first whether the coordinator now
    /// serves another run (and then drops itself instead of sending it there).
    heard: watch::Sender<u64>,
    /// The connection the last successful answer came over: reports go out
    /// only on it (see `client::ReportGate`).
    vouched: Arc<AtomicU64>,
    /// Report tasks send the id the coordinator did not know; the loop then
    /// registers again. The loop holds a sender too, so `recv` never ends.
    stale_tx: mpsc::UnboundedSender<WorkerId>,
    stale_rx: mpsc::UnboundedReceiver<WorkerId>,
    held: BTreeMap<LeaseId, Held>,
    /// One report task per held lease. Aborted when the loop ends.
    tasks: JoinSet<(LeaseId, JobEnd)>,
    /// Sends the report tasks' count-only results in batches; every report
    /// task holds a clone.
    batcher: Batcher,
    /// The batcher task, aborted when the loop ends (after the report tasks,
    /// so that none waits on it).
    batch_task: tokio::task::JoinHandle<()>,
    ttl: Duration,
    /// When to call the coordinator next (Register or Lease).
    next_call: Instant,
    backoff: Backoff,
    /// When the coordinator last answered (or when the loop started), for
    /// `Config::give_up`.
    last_answer: Instant,
    /// Whether any coordinator ever answered.
    answered: bool,
    /// What the user is told while the coordinator does not answer; shared
    /// with the report tasks.
    outage: SharedOutage,
    /// The end of the grace period, once draining.
    draining: Option<Instant>,
    exit: Option<Exit>,
    /// Set by a report task's end that must stop the worker (the token was
    /// refused); the loop returns it.
    fatal: Option<Error>,
    summary: Summary,
    last_progress: Instant,
    /// When the loop started: the clock of the logged node rate.
    started: Instant,
    /// The measured job rate and round trip that size the prefetch.
    pace: Pace,
}

impl std::fmt::Debug for LeaseLoop<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseLoop")
            .field("worker", &self.worker)
            .field("held", &self.held.len())
            .field("draining", &self.draining)
            .finish_non_exhaustive()
    }
}

impl<'a> LeaseLoop<'a> {
    pub(crate) fn new(
        config: &'a Config,
        pool: &'a WorkerPool,
        client: Client,
    ) -> LeaseLoop<'a> {
        let (stale_tx, stale_rx) = mpsc::unbounded_channel();
        let now = Instant::now();
        let vouched = Arc::new(AtomicU64::new(0));
        let session = watch::Sender::new(Session {
            worker: WorkerId(String::new()),
            run: String::new(),
        });
        let (batcher, batch_task) = Batcher::start(
            client.clone(),
            ReportGate::new(&client, Arc::clone(&vouched), session.subscribe()),
        );
        LeaseLoop {
            batcher,
            batch_task,
            config,
            pool,
            client,
            run: None,
            worker: None,
            session,
            heard: watch::Sender::new(0),
            vouched,
            stale_tx,
            stale_rx,
            held: BTreeMap::new(),
            tasks: JoinSet::new(),
            ttl: DEFAULT_TTL,
            next_call: now,
            backoff: Backoff::new(config.backoff_initial, config.backoff_max),
            last_answer: now,
            answered: false,
            outage: Arc::new(std::sync::Mutex::new(Outage::new(config))),
            draining: None,
            exit: None,
            fatal: None,
            summary: Summary {
                exit: Exit::Drained,
                jobs: 0,
                subproblems: 0,
                nodes: 0,
                solutions: 0,
                conflicts: 0,
                released: 0,
            },
            last_progress: now,
            started: now,
            pace: Pace::default(),
        }
    }

    /// Search nodes per second since the loop started, all threads together:
    /// the same measure on every kernel (`nq_core::search::CountStats`), so
    /// rates compare across workers and machines.
    fn nodes_per_second(&self) -> u64 {
        let seconds = self.started.elapsed().as_secs_f64();
        if seconds > 0.0 {
            (self.summary.nodes as f64 / seconds) as u64
        } else {
            0
        }
    }

    /// Runs until the run is complete, the drain is over, or a fatal error.
    /// Every job still computing is stopped before this returns.
    pub(crate) async fn run(
        mut self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<Summary> {
        let span = info_span!("worker", name = %self.config.name);
        let result = self.serve(shutdown).instrument(span).await;
        // Count the reports that were acknowledged meanwhile.
        while let Some(joined) = self.tasks.try_join_next_with_id() {
            self.on_task_end(joined);
        }
        for h in self.held.values() {
            h.stop.store(true, Ordering::Relaxed);
        }
        // Aborting drops each task's pool output, which also stops its job.
        self.tasks.shutdown().await;
        // A call it has out is not waited for: its items' tasks are gone.
        self.batch_task.abort();
        let _ = (&mut self.batch_task).await;
        // `summary.exit` is only meaningful when the loop ended without error
        // (giving up, for one, is an error, not a drain).
        let exit = match &result {
            Ok(()) => format!("{:?}", self.summary.exit),
            Err(_) => "Error".to_owned(),
        };
        info!(
            exit = %exit,
            jobs = self.summary.jobs,
            nodes = self.summary.nodes,
            nodes_per_second = self.nodes_per_second(),
            released = self.summary.released,
            "worker stopped"
        );
        result.map(|()| self.summary)
    }

    async fn serve(&mut self, shutdown: impl Future<Output = ()>) -> Result<()> {
        tokio::pin!(shutdown);
        info!(
            coordinator = %self.config.coordinator,
            threads = self.config.threads,
            "worker starting"
        );
        loop {
            if let Some(fatal) = self.fatal.take() {
                return Err(fatal);
            }
            if let Some(exit) = self.exit {
                self.summary.exit = exit;
                return Ok(());
            }
            if self.draining.is_some() && self.tasks.is_empty() {
                info!("drained: every job is reported or handed back");
                self.leave().await;
                self.exit = Some(Exit::Drained);
                continue;
            }
            let draining = self.draining.is_some();
            let grace_end = self.draining.unwrap_or(self.next_call);
            tokio::select! {
                () = &mut shutdown, if !draining => self.start_drain().await,
                () = sleep_until(grace_end), if draining => self.abandon().await,
                Some(joined) = self.tasks.join_next_with_id() => self.on_task_end(joined),
                Some(stale) = self.stale_rx.recv() => self.on_stale(stale),
                () = sleep_until(self.next_call) => self.call().await?,
            }
        }
    }

    /// Calls the coordinator: Register when unregistered, else Lease.
    async fn call(&mut self) -> Result<()> {
        match self.worker.clone() {
            None => self.register().await,
            Some(worker) => self.lease(worker).await,
        }
    }

    /// A registration that failed with `status`, which retrying may fix:
    /// says why (a refused client certificate, plain HTTP/2 to a TLS port,
    /// or a coordinator not up yet) and waits to retry, or stops the worker
    /// when retrying cannot help.
    async fn registration_failed(&mut self, status: tonic::Status) -> Result<()> {
        // A connection closed during the first call over TLS may be a
        // refused client certificate: ask rustls.
        if matches!(status.code(), tonic::Code::Cancelled | tonic::Code::Unknown)
            && let Some(reason) = crate::client::diagnose_tls(self.config).await
        {
            return Err(Error::Tls { reason });
        }
        // Plain HTTP/2 to a TLS port fails as an HTTP/2 protocol error
        // (the TLS alert read as a frame, INTERNAL) or a closed
        // connection: ask the port what it speaks, rather than retry
        // until --give-up. A refused connection (UNAVAILABLE) is a
        // coordinator not up yet, and costs no probe.
        if !self.config.coordinator.tls()
            && matches!(
                status.code(),
                tonic::Code::Internal | tonic::Code::Cancelled | tonic::Code::Unknown
            )
            && crate::client::speaks_tls(&self.config.coordinator).await
        {
            return Err(Error::SpeaksTls {
                coordinator: self.config.coordinator.clone(),
            });
        }
        let delay = self.backoff.next_delay();
        if lost(&status) {
            debug!(
                coordinator = %self.config.coordinator,
                code = ?status.code(),
                message = status.message(),
                ?delay,
                "coordinator unreachable; retrying"
            );
            lock(&self.outage).failed(&status);
        } else {
            warn!(
                coordinator = %self.config.coordinator,
                code = ?status.code(),
                message = status.message(),
                ?delay,
                "registration failed; retrying"
            );
        }
        self.retry_after(delay)
    }

    async fn register(&mut self) -> Result<()> {
        let connection = self.client.connection();
        // The coordinator caps a worker's leases by its claim: the threads'
        // share, and what the GPUs still counting may hold.
        let gpu_jobs = self.pool.gpu().map_or(0, crate::gpu::GpuRunner::max_jobs);
        let response = match self.client.register(self.config, gpu_jobs).await {
            Ok(response) => response,
            // FAILED_PRECONDITION here is a protocol version mismatch, not an
            // unknown worker: retrying cannot fix it.
            Err(status) if Failure::of(&status) == Failure::Retry => {
                return self.registration_failed(status).await;
            }
            Err(status) => return Err(fatal("Register", &status)),
        };
        if response.protocol_version != nq_proto::PROTOCOL_VERSION {
            return Err(Error::Protocol {
                coordinator: response.protocol_version,
                worker: nq_proto::PROTOCOL_VERSION,
            });
        }
        let info = response.run.ok_or(Error::Run {
            source: nq_proto::ConvertError::Missing {
                field: "RegisterResponse.run",
            },
        })?;
        let shape = RunShape::try_from(&info).map_err(|source| Error::Run { source })?;
        if let Some(old) = &self.run
            && (old.id != info.run_id || old.shape != shape)
        {
            // Its results belong to the old run: none may reach the new one,
            // where the same job ids name other work. The report tasks check
            // the run before every attempt too, so one racing this still
            // sends nothing.
            info!(
                old = %old.id,
                new = %info.run_id,
                jobs = self.held.len(),
                "the coordinator now runs another run; dropping every job and \
                 unsent report of the old one"
            );
            for h in std::mem::take(&mut self.held).into_values() {
                h.stop.store(true, Ordering::Relaxed);
                h.task.abort();
            }
        }
        self.set_ttl(response.lease_ttl_ms);
        info!(
            worker = %response.worker_id,
            run = %info.run_id,
            n = info.n,
            ring = info.ring,
            extra = info.extra,
            solutions = info.solutions,
            ttl = ?self.ttl,
            "registered"
        );
        let worker = WorkerId(response.worker_id);
        self.session.send_replace(Session {
            worker: worker.clone(),
            run: info.run_id.clone(),
        });
        self.run = Some(Run {
            shape,
            id: info.run_id,
        });
        self.on_answer();
        self.vouch(connection);
        self.worker = Some(worker);
        self.backoff.reset();
        self.next_call = Instant::now();
        Ok(())
    }

    /// The heartbeat: renews every held lease and asks for jobs to keep the
    /// threads and the prefetch full.
    async fn lease(&mut self, worker: WorkerId) -> Result<()> {
        let want = self.want();
        let held: Vec<u64> = self
            .held
            .iter()
            .filter(|(_, h)| !h.dropped)
            .map(|(id, _)| id.0)
            .collect();
        let connection = self.client.connection();
        let asked = Instant::now();
        let response = match self.client.lease(&worker, want, held).await {
            Ok(response) => {
                self.pace.answered(asked.elapsed());
                response
            }
            Err(status) => {
                match Failure::of(&status) {
                    Failure::Retry => {
                        let delay = self.backoff.next_delay();
                        if lost(&status) {
                            debug!(
                                code = ?status.code(),
                                message = status.message(),
                                ?delay,
                                "lease failed; retrying"
                            );
                            lock(&self.outage).failed(&status);
                        } else {
                            // The coordinator answered, with an error a
                            // pause fixes (its store, its load).
                            warn!(
                                code = ?status.code(),
                                message = status.message(),
                                ?delay,
                                "lease failed; retrying"
                            );
                        }
                        self.retry_after(delay)?;
                    }
                    Failure::Register => {
                        self.on_answer();
                        info!(
                            worker = %worker.0,
                            message = status.message(),
                            "the coordinator does not know this worker (restarted?); registering again"
                        );
                        self.worker = None;
                        self.next_call = Instant::now();
                    }
                    _ => return Err(fatal("Lease", &status)),
                }
                return Ok(());
            }
        };
        self.backoff.reset();
        self.on_answer();
        self.vouch(connection);
        self.set_ttl(response.lease_ttl_ms);
        for id in &response.revoked {
            if let Some(h) = self.held.get_mut(&LeaseId(*id))
                && !h.dropped
            {
                debug!(job = h.job.0, lease = id, "lease revoked; stopping the job");
                h.dropped = true;
                h.stop.store(true, Ordering::Relaxed);
            }
        }
        let got = response.jobs.len();
        for job in response.jobs {
            self.start_job(&worker, job).await?;
        }
        if response.run_complete {
            info!("the run is complete");
            self.exit = Some(Exit::RunComplete);
            return Ok(());
        }
        let now = Instant::now();
        let heartbeat = now + self.ttl / 4;
        self.next_call = if want > 0 && got == 0 {
            let retry = Duration::from_millis(response.retry_after_ms.max(20));
            (now + retry).min(heartbeat)
        } else if got > 0 && self.want() > 0 {
            now
        } else {
            heartbeat
        };
        if now >= self.last_progress + PROGRESS_EVERY {
            self.last_progress = now;
            info!(
                jobs = self.summary.jobs,
                nodes = self.summary.nodes,
                nodes_per_second = self.nodes_per_second(),
                held = self.held.len(),
                "progress"
            );
        }
        Ok(())
    }

    /// Validates a leased job and hands it to the pool and a report task.
    async fn start_job(&mut self, worker: &WorkerId, job: pb::Job) -> Result<()> {
        let run = self
            .run
            .as_ref()
            .expect("jobs come only after registration");
        let subproblems: std::result::Result<Vec<SubProblem>, _> = job
            .subproblems
            .iter()
            .map(|s| run.shape.subproblem(s))
            .collect();
        let subproblems = match subproblems {
            Ok(s) => s,
            Err(source) => {
                // Hand the lease back so that the job is not stuck until its
                // deadline; the worker then stops, loudly.
                let _ = self.client.release(worker, vec![job.lease_id], false).await;
                return Err(Error::Job {
                    job: job.job_id,
                    source,
                });
            }
        };
        let lease = LeaseId(job.lease_id);
        if self.held.contains_key(&lease) {
            warn!(
                job = job.job_id,
                lease = lease.0,
                "lease already held; ignoring the duplicate"
            );
            return Ok(());
        }
        let kernel = self.job_kernel(&job);
        debug!(
            job = job.job_id,
            lease = lease.0,
            subproblems = subproblems.len(),
            kernel = kernel.resolved_name(),
            "job leased"
        );
        let held = self.spawn(JobId(job.job_id), lease, subproblems, 0, kernel);
        self.held.insert(lease, held);
        Ok(())
    }

    /// The kernel a job asks for (`Job.kernel`): "" leaves the choice to the
    /// worker (its configured kernel); a kernel name asks for that kernel, so
    /// that a job's verification copy runs other kernel code than its first
    /// computation. A kernel this CPU lacks, or a name this build does not
    /// know, runs the configured kernel (and `JobResult.kernel` says so).
    fn job_kernel(&self, job: &pb::Job) -> Kernel {
        if job.kernel.is_empty() {
            return self.config.kernel;
        }
        match job.kernel.parse::<Kernel>() {
            Ok(k) if k != Kernel::Auto && k.is_available() => k,
            Ok(_) => {
                debug!(
                    job = job.job_id,
                    requested = %job.kernel,
                    kernel = self.config.kernel.resolved_name(),
                    "this CPU lacks the kernel the coordinator asked for; running the configured one"
                );
                self.config.kernel
            }
            Err(_) => {
                warn!(
                    job = job.job_id,
                    requested = %job.kernel,
                    kernel = self.config.kernel.resolved_name(),
                    "the coordinator asked for an unknown kernel; running the configured one"
                );
                self.config.kernel
            }
        }
    }

    /// Submits a job to the pool and starts its report task. `failures` is
    /// the number of earlier attempts whose solution stream broke.
    fn spawn(
        &mut self,
        job: JobId,
        lease: LeaseId,
        subproblems: Vec<SubProblem>,
        failures: u32,
        kernel: Kernel,
    ) -> Held {
        let run = self
            .run
            .as_ref()
            .expect("jobs come only after registration");
        let shape = run.shape;
        let attempt = self
            .pool
            .submit(subproblems.clone(), shape.solutions, kernel);
        let stop = Arc::clone(&attempt.stop);
        let on_gpu = attempt.kernel == nq_gpu::KERNEL_NAME;
        let computed = Arc::new(AtomicBool::new(false));
        let ctx = ReportCtx {
            client: self.client.clone(),
            session: self.session.subscribe(),
            heard: self.heard.subscribe(),
            gate: ReportGate::new(
                &self.client,
                Arc::clone(&self.vouched),
                self.session.subscribe(),
            ),
            run: run.id.clone(),
            kernel: attempt.kernel,
            stale: self.stale_tx.clone(),
            solutions: shape.solutions,
            backoff: Backoff::new(self.config.backoff_initial, self.config.backoff_max)
                .after_failures(failures),
            batcher: self.batcher.clone(),
            outage: Arc::clone(&self.outage),
        };
        let job_ref = JobRef { job, lease };
        let task = report_job(ctx, job_ref, attempt, Arc::clone(&computed));
        let span = info_span!("job", job = job.0, lease = lease.0);
        let handle = self
            .tasks
            .spawn(async move { (lease, task.await) }.instrument(span));
        Held {
            job,
            subproblems,
            stop,
            computed,
            dropped: false,
            failures,
            kernel,
            on_gpu,
            task: handle,
        }
    }

    /// `held`'s report under `lease` was acknowledged with `ack`, for a job
    /// of `nodes` nodes and `solutions` solutions: counted in the summary,
    /// and the run's end or the queue's top-up noted.
    fn on_acked(
        &mut self,
        held: &Held,
        lease: LeaseId,
        ack: &pb::ReportAck,
        (nodes, solutions): (u64, u64),
    ) {
        if !held.on_gpu {
            self.pace.job_ended(Instant::now());
        }
        self.summary.jobs += 1;
        self.summary.subproblems += held.subproblems.len() as u64;
        self.summary.nodes += nodes;
        self.summary.solutions += solutions;
        if ack.outcome() == Outcome::Conflict {
            self.summary.conflicts += 1;
            warn!(
                job = held.job.0,
                lease = lease.0,
                "the coordinator holds a DIFFERENT result for this job (conflict recorded)"
            );
        }
        debug!(
            job = held.job.0,
            lease = lease.0,
            nodes,
            outcome = outcome_name(ack),
            "job reported"
        );
        if ack.run_complete {
            info!("the run is complete");
            self.exit = Some(Exit::RunComplete);
        } else if self.draining.is_none()
            && self.computing().count() <= self.config.threads.get()
        {
            // A thread is about to run dry: top the queue up now rather
            // than at the next heartbeat.
            self.next_call = self.next_call.min(Instant::now());
        }
    }

    fn on_task_end(
        &mut self,
        joined: std::result::Result<(tokio::task::Id, (LeaseId, JobEnd)), JoinError>,
    ) {
        let (task, (lease, end)) = match joined {
            Ok(ended) => ended,
            // Aborted because its run is over: already dropped.
            Err(e) if e.is_cancelled() => return,
            Err(e) => {
                error!(error = %e, "a report task failed");
                let lease = self
                    .held
                    .iter()
                    .find(|(_, h)| h.task.id() == e.id())
                    .map(|(l, _)| *l);
                if let Some(h) = lease.and_then(|l| self.held.remove(&l)) {
                    h.stop.store(true, Ordering::Relaxed);
                }
                return;
            }
        };
        // A task of an earlier run may end after a job of the new run took
        // the same lease id: only the task that owns the entry may end it.
        if self.held.get(&lease).is_none_or(|h| h.task.id() != task) {
            return;
        }
        let Some(held) = self.held.remove(&lease) else {
            return;
        };
        match end {
            JobEnd::Acked {
                ack,
                nodes,
                solutions,
            } => self.on_acked(&held, lease, &ack, (nodes, solutions)),
            JobEnd::Cancelled => {
                debug!(job = held.job.0, lease = lease.0, "job stopped");
            }
            JobEnd::Rerun if !held.dropped => {
                debug!(job = held.job.0, lease = lease.0, "computing the job again");
                let again = self.spawn(
                    held.job,
                    lease,
                    held.subproblems,
                    held.failures + 1,
                    held.kernel,
                );
                self.held.insert(lease, again);
            }
            JobEnd::Rerun => {}
            JobEnd::OtherRun => {
                debug!(
                    job = held.job.0,
                    lease = lease.0,
                    "result of an earlier run dropped unsent"
                );
            }
            JobEnd::Denied(status) => {
                // The lease is not (or no longer) valid for this report: the
                // job is someone else's now, or never was this worker's.
                warn!(
                    job = held.job.0,
                    lease = lease.0,
                    message = status.message(),
                    "the coordinator refused this report (PERMISSION_DENIED); dropping it"
                );
            }
            JobEnd::Unauthenticated(status) => {
                self.fatal = Some(Error::unauthenticated("Report", &status));
            }
            JobEnd::Rejected(status) if held.dropped => {
                debug!(
                    job = held.job.0,
                    lease = lease.0,
                    code = ?status.code(),
                    "report of a dropped lease refused"
                );
            }
            JobEnd::Rejected(status) => {
                error!(
                    job = held.job.0,
                    lease = lease.0,
                    code = ?status.code(),
                    message = status.message(),
                    "the coordinator rejected this job's report; its lease will expire"
                );
            }
        }
    }

    fn on_stale(&mut self, stale: WorkerId) {
        if self.worker.as_ref() == Some(&stale) {
            info!(
                worker = %stale.0,
                "the coordinator does not know this worker (restarted?); registering again"
            );
            self.worker = None;
            self.next_call = Instant::now();
        }
    }

    /// A call started when the channel had opened `before` connections was
    /// answered: the connection it came over is vouched for (reports may go
    /// out on it), and report tasks waiting for an answer wake up.
    fn vouch(&mut self, before: u64) {
        // The answer came over the connection in use now, unless the call
        // opened a new one (then it came over that one) or another call
        // opened one meanwhile: at most one new connection is vouched for.
        let now = self.client.connection();
        if now <= before + 1 {
            self.vouched.store(now, Ordering::SeqCst);
        }
        self.heard.send_modify(|n| *n += 1);
    }

    /// The coordinator answered: the `--give-up` clock starts again.
    fn on_answer(&mut self) {
        self.last_answer = Instant::now();
        self.answered = true;
        lock(&self.outage).answered();
    }

    /// Schedules the next call `delay` after a failed one, or gives up when
    /// the coordinator has been silent for `Config::give_up`. The last try
    /// falls exactly when the limit runs out, so a worker never gives up
    /// while a retry is still due.
    fn retry_after(&mut self, delay: Duration) -> Result<()> {
        let now = Instant::now();
        let Some(limit) = self.config.give_up else {
            self.next_call = now + delay;
            return Ok(());
        };
        let deadline = self.last_answer + limit;
        if now >= deadline {
            error!(
                coordinator = %self.config.coordinator,
                ?limit,
                "no answer from the coordinator; giving up"
            );
            return Err(Error::GaveUp {
                coordinator: self.config.coordinator.clone(),
                limit,
                silence: if self.answered {
                    crate::Silence::SinceLastAnswer
                } else {
                    crate::Silence::SinceStart
                },
            });
        }
        self.next_call = (now + delay).min(deadline);
        Ok(())
    }

    /// First signal: lease nothing more, hand back the jobs that no thread has
    /// started, and keep computing and reporting the rest within the grace.
    async fn start_drain(&mut self) {
        let threads = self.config.threads.get();
        self.draining = Some(Instant::now() + self.config.grace);
        // The pool runs jobs in lease order, so beyond the oldest `threads`
        // jobs still computing, none has started yet.
        let queued: Vec<LeaseId> = self
            .held
            .iter()
            .filter(|(_, h)| !h.dropped && !h.computed.load(Ordering::Relaxed))
            .skip(threads)
            .map(|(l, _)| *l)
            .collect();
        info!(
            grace = ?self.config.grace,
            held = self.held.len(),
            handing_back = queued.len(),
            "draining: no new leases; finishing current jobs"
        );
        self.give_back(queued).await;
    }

    /// The grace is over: stop and hand back everything not yet reported.
    async fn abandon(&mut self) {
        let left: Vec<LeaseId> = self
            .held
            .iter()
            .filter(|(_, h)| !h.dropped)
            .map(|(l, _)| *l)
            .collect();
        warn!(
            leases = left.len(),
            "grace period over; handing the unfinished jobs back"
        );
        self.give_back(left).await;
        self.leave().await;
        self.exit = Some(Exit::Drained);
    }

    /// Tells the coordinator that this worker leaves the run, so that it
    /// does not count as a machine at work until its registration lapses.
    /// Best effort: without it the registration lapses a lease lifetime
    /// later, as before.
    async fn leave(&mut self) {
        let Some(worker) = &self.worker else { return };
        if let Err(status) = self.client.release(worker, Vec::new(), true).await {
            debug!(
                code = ?status.code(),
                message = status.message(),
                "could not tell the coordinator that this worker leaves"
            );
        }
    }

    /// Stops these leases' jobs and tells the coordinator to reissue them now.
    async fn give_back(&mut self, leases: Vec<LeaseId>) {
        if leases.is_empty() {
            return;
        }
        for l in &leases {
            if let Some(h) = self.held.get_mut(l) {
                h.dropped = true;
                h.stop.store(true, Ordering::Relaxed);
            }
        }
        self.summary.released += leases.len() as u64;
        let Some(worker) = &self.worker else { return };
        let ids = leases.iter().map(|l| l.0).collect();
        match self.client.release(worker, ids, false).await {
            Ok(released) => info!(asked = leases.len(), released, "leases handed back"),
            // Best effort: an unreturned lease still expires at its deadline.
            Err(status) => {
                warn!(
                    code = ?status.code(),
                    message = status.message(),
                    "could not hand leases back; they will expire"
                )
            }
        }
    }

    /// Jobs leased and not yet computed: the threads' (and GPUs') queue.
    fn computing(&self) -> impl Iterator<Item = &Held> {
        self.held
            .values()
            .filter(|h| !h.dropped && !h.computed.load(Ordering::Relaxed))
    }

    /// How many new jobs to ask for, up to the configured [`Prefetch`].
    fn want(&self) -> u32 {
        if self.draining.is_some() {
            return 0;
        }
        let (threads, max_jobs) = (self.config.threads.get(), self.config.max_jobs);
        let lists_solutions = self.run.as_ref().is_some_and(|r| r.shape.solutions);
        let outstanding = match (self.config.prefetch, self.pool.gpu()) {
            (Prefetch::Full, _) => max_jobs,
            // Count-only jobs go to the GPUs: what they finish sizes the
            // lease, plus the CPU threads' own (checks that name a CPU
            // kernel), so those never take a GPU's share.
            (Prefetch::Launches, Some(gpu)) if !lists_solutions => (self.pace)
                .launch_outstanding(gpu.rate(), gpu.streams(), max_jobs)
                .saturating_add(self.computing().filter(|h| !h.on_gpu).count()),
            // The CPU threads compute the jobs: listed solutions, or every
            // GPU failed.
            (Prefetch::Measured | Prefetch::Launches, _) => {
                self.pace.outstanding(threads, max_jobs)
            }
        };
        let want = outstanding.saturating_sub(self.computing().count());
        u32::try_from(want).unwrap_or(u32::MAX)
    }

    fn set_ttl(&mut self, ttl_ms: u64) {
        if ttl_ms > 0 {
            self.ttl = Duration::from_millis(ttl_ms);
        }
    }
}

/// The error that stops the worker after `rpc` failed with `status`, which
/// retrying and registering again cannot fix.
fn fatal(rpc: &'static str, status: &tonic::Status) -> Error {
    match Failure::of(status) {
        Failure::Token => Error::unauthenticated(rpc, status),
        Failure::Tls(reason) => Error::Tls { reason },
        // PERMISSION_DENIED (a refused worker), a protocol mismatch, and the
        // rest: the coordinator's message says why.
        _ => Error::Refused {
            rpc,
            code: status.code(),
            message: status.message().to_owned(),
        },
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use nq_core::split::SplitSpec;
    use tokio_util::sync::CancellationToken;

    use crate::testutil::{Fake, gave_up_after_the_coordinator_left, listener};
    use crate::{Config, run};

    /// The log lines written while it is the thread's subscriber, as a user
    /// reads them.
    #[derive(Clone, Default)]
    struct Logs(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Logs {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logs {
        type Writer = Logs;

        fn make_writer(&'a self) -> Logs {
            self.clone()
        }
    }

    impl Logs {
        fn text(&self) -> String {
            String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
        }
    }

    /// A current-thread runtime: every task of the worker logs on this
    /// thread, to the subscriber the test sets.
    #[tokio::test]
    async fn a_worker_says_it_waits_for_a_coordinator_that_went_away() {
        let logs = Logs::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(logs.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .finish();
        let _guard = tracing::subscriber::set_default(subscriber);

        let fake = Fake::new(10, SplitSpec::new(1, 0).unwrap(), 4, false);
        // No jobs: the worker only registers and heartbeats.
        fake.state().hold_back = true;
        let (listener, addr) = listener().await;
        let token = CancellationToken::new();
        let server = tokio::spawn(fake.clone().serve(listener, token.clone()));
        let mut config = Config::new(addr.into());
        config.name = "test".into();
        config.backoff_initial = Duration::from_millis(10);
        config.backoff_max = Duration::from_millis(100);
        config.give_up = Some(Duration::from_secs(2));
        let worker = tokio::spawn(run(config, std::future::pending()));
        tokio::time::timeout(Duration::from_secs(60), async {
            while fake.state().workers.is_empty() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the worker registers");
        // The coordinator leaves without telling the worker.
        token.cancel();
        server.await.unwrap();
        gave_up_after_the_coordinator_left(worker, Duration::from_secs(60)).await;
        let text = logs.text();
        let lost = format!("lost the coordinator at http://{addr} (");
        // Said once, however many retries the two seconds held (a hundred
        // or so, at a backoff of at most 100 ms).
        assert_eq!(text.matches(&lost).count(), 1, "{text}");
        assert!(
            text.contains("waiting for it to come back, for up to "),
            "{text}"
        );
        assert!(
            text.contains(" more (--give-up 2s), then the worker stops"),
            "{text}"
        );
        assert!(!text.contains("lease failed; retrying"), "{text}");
    }
}
