//! `nq-worker`: leases jobs of sub-problems from an nq coordinator, solves them
//! on a fixed pool of CPU threads, and reports the counts back.
//!
//! A worker is stateless: everything it computes is keyed by the coordinator's
//! job ids, so it can be killed, restarted or duplicated at any time without
//! changing a total. [`run`] returns when the run is complete, or when the
//! shutdown future fires and the current jobs are finished or handed back.
//!
//! ```text
//!            Register ──► Lease (heartbeat + prefetch) ◄─────────────┐
//!                            │ jobs                                   │
//!                            ▼                                        │
//!   pool threads ── bounded mpsc ──► job task ─┬─ batcher ── ReportBatch ──► acks ┘
//!                                              └─ Report stream (solutions,
//!                                                 or an older coordinator)
//! ```
//!
//! # Layout
//!
//! * [`config`]: [`Config`] and the duration parsers; the coordinator's
//!   address is nq-proto's [`CoordinatorAddress`], shared with `nq-coord`.
//! * `lease` (private): the lease loop. It owns the registration, the set of
//!   held leases, the heartbeat, prefetch, revocation, reconnection and drain.
//! * `client` (private): typed gRPC calls, the sorting of failures into
//!   retryable and fatal, the retry backoff, the per-job report task, and the
//!   batcher that sends count-only results of many jobs per `ReportBatch`
//!   call (falling back to one `Report` per job against a coordinator
//!   without it).
//! * `pool` (private): glue between [`nq_core::pool::Pool`], the one CPU runner
//!   of nq, and the async side: a `JobSink` that hands results and solution
//!   batches over bounded channels with `blocking_send`.
//! * `gpu` (private): with `--gpu`, the thread that owns the GPU and counts
//!   the jobs that leave the kernel to the worker through [`nq_gpu`],
//!   handing their outcomes back like the CPU pool.
//!
//! The CPU work never runs on tokio's threads; the async side only moves
//! messages.

#![deny(missing_docs)]

mod client;
pub mod config;
mod gpu;
mod lease;
mod pace;
mod pool;

#[cfg(test)]
mod testutil;

use std::future::Future;

pub use config::{Config, CoordinatorAddress, DEFAULT_PORT, parse_duration};

/// What can stop a worker. Network trouble is not here: the worker retries it
/// with backoff until the coordinator answers again.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A coordinator address that cannot be parsed.
    #[error(transparent)]
    Address(#[from] nq_proto::address::AddressError),
    /// The count kernel failed its startup check against the scalar kernel
    /// (`nq_core::split::check_kernel`): its counts cannot be trusted here.
    #[error("the count kernel failed its startup check")]
    Kernel(#[source] nq_core::Error),
    /// `--gpu` was asked for and the GPU cannot count: no driver, no device,
    /// no compiler, or a failed startup check. The message names which.
    #[error(transparent)]
    Gpu(nq_gpu::Error),
    /// A `--gpu` value that is not `all` or distinct device indices.
    #[error(
        "invalid GPU list {input:?}: expected `all` or distinct device indices separated by commas, such as 0 or 0,2"
    )]
    GpuDevices {
        /// What was given.
        input: String,
    },
    /// A duration that cannot be parsed.
    #[error(transparent)]
    Duration(#[from] nq_proto::duration::DurationError),
    /// The CPU threads could not be started.
    #[error("cannot start {threads} CPU threads")]
    Pool {
        /// Threads asked for.
        threads: usize,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The coordinator answered a call with a status the worker cannot recover
    /// from, such as a protocol version mismatch.
    #[error("the coordinator refused {rpc}: {message} ({code:?})")]
    Refused {
        /// The rpc that failed.
        rpc: &'static str,
        /// The gRPC status code.
        code: tonic::Code,
        /// The coordinator's message.
        message: String,
    },
    /// The coordinator refused the token (UNAUTHENTICATED): the worker's
    /// token is missing or is not the coordinator's.
    #[error(
        "the coordinator refused the token ({rpc}: {message}); start the worker with \
         the coordinator's token in --token or NQ_TOKEN"
    )]
    Unauthenticated {
        /// The rpc that was refused.
        rpc: &'static str,
        /// The coordinator's message.
        message: String,
    },
    /// The coordinator is in protected mode (it has neither a token nor TLS)
    /// and serves workers on its own machine only; this worker is on another.
    /// The coordinator's message says how to open the run.
    #[error("the coordinator refused this worker ({rpc}): {message}")]
    LoopbackOnly {
        /// The rpc that was refused.
        rpc: &'static str,
        /// The coordinator's message.
        message: String,
    },
    /// The worker spoke plain HTTP/2 to a coordinator that answered with TLS.
    #[error(
        "the coordinator at {coordinator} speaks TLS, and this worker connected in \
         plain text: connect to {} instead, with --ca FILE (the CA that signed the \
         coordinator's certificate) unless a public CA signed it",
        coordinator.clone().with_tls()
    )]
    SpeaksTls {
        /// The address the worker was given.
        coordinator: CoordinatorAddress,
    },
    /// TLS with the coordinator cannot work: settings rustls refuses, or a
    /// handshake that failed on a certificate.
    #[error(
        "TLS with the coordinator failed: {reason}; check --ca (the CA that signed \
         the coordinator's certificate) and, if the coordinator requires client \
         certificates, --tls-cert and --tls-key"
    )]
    Tls {
        /// What rustls said.
        reason: String,
    },
    /// The coordinator accepted the registration but speaks another protocol.
    #[error(
        "the coordinator speaks protocol version {coordinator}, this worker version \
         {worker}; run the same nq release on both"
    )]
    Protocol {
        /// The coordinator's version.
        coordinator: u32,
        /// [`nq_proto::PROTOCOL_VERSION`].
        worker: u32,
    },
    /// The run the coordinator describes cannot be joined (unknown split
    /// version, board size out of range, or no description at all).
    #[error("cannot join the coordinator's run")]
    Run {
        /// What is wrong with the description.
        #[source]
        source: nq_proto::ConvertError,
    },
    /// No coordinator answered for [`Config::give_up`]: the run is probably
    /// over (or the address is wrong), and the worker stops rather than hold
    /// its machine forever.
    #[error(
        "gave up: no coordinator answered at {coordinator} for {} {silence}; if the \
         run is over there is nothing to do, otherwise check the address and start \
         the worker again (--give-up never waits forever)",
        config::human(*limit)
    )]
    GaveUp {
        /// The coordinator's address.
        coordinator: CoordinatorAddress,
        /// The limit that ran out.
        limit: std::time::Duration,
        /// Since when nothing answered.
        silence: Silence,
    },
    /// The coordinator sent a job that is not part of its own run. Counting
    /// it could corrupt the total, so the worker stops.
    #[error("the coordinator sent job {job}, which is not a job of its run")]
    Job {
        /// The job id.
        job: u64,
        /// Which sub-problem failed validation, and why.
        #[source]
        source: nq_proto::ConvertError,
    },
}

/// How long a worker went without an answer before it gave up, and since
/// when; see [`Error::GaveUp`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Silence {
    /// No coordinator ever answered this worker.
    SinceStart,
    /// A coordinator answered once, then stopped answering.
    SinceLastAnswer,
}

impl std::fmt::Display for Silence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Silence::SinceStart => "since the worker started",
            Silence::SinceLastAnswer => "since it last answered",
        })
    }
}

impl Error {
    /// The error for an UNAUTHENTICATED answer to `rpc`: a refusal by
    /// protected mode ([`nq_proto::auth::is_loopback_only`]) or of the token.
    pub(crate) fn unauthenticated(rpc: &'static str, status: &tonic::Status) -> Error {
        let message = status.message().to_owned();
        if nq_proto::auth::is_loopback_only(status) {
            Error::LoopbackOnly { rpc, message }
        } else {
            Error::Unauthenticated { rpc, message }
        }
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// Why [`run`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// The coordinator reported that every job of the run is done.
    RunComplete,
    /// The shutdown future fired; current jobs were finished or handed back.
    Drained,
}

/// What a worker did, returned by [`run`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Summary {
    /// Why the worker stopped.
    pub exit: Exit,
    /// Jobs whose acknowledgement the worker received before it stopped
    /// (acks still in flight when the run completes are not waited for).
    pub jobs: u64,
    /// Sub-problems in those jobs.
    pub subproblems: u64,
    /// Search nodes in those jobs (`nq_core::search::CountStats::nodes`).
    pub nodes: u64,
    /// Solutions streamed in those jobs (solutions mode only).
    pub solutions: u64,
    /// Acknowledged reports that the coordinator recorded as a CONFLICT with
    /// an earlier result for the same job. Should always be 0.
    pub conflicts: u64,
    /// Leases handed back unfinished while draining.
    pub released: u64,
}

/// Runs a worker until the run is complete or `shutdown` fires.
///
/// Connects to `config.coordinator` (waiting with backoff while it is not up),
/// registers, and then leases, computes and reports jobs. When `shutdown`
/// completes the worker drains: it stops leasing, finishes the jobs it is
/// computing within `config.grace`, hands the rest back with `Release`, and
/// returns [`Exit::Drained`].
///
/// The CPU threads are started here and joined before this returns.
///
/// # Errors
///
/// Only for conditions that retrying cannot fix: the threads cannot start,
/// the coordinator refuses the registration (protocol version mismatch) or
/// this worker (PERMISSION_DENIED on Register or Lease, e.g. after lost
/// verification conflicts), the coordinator refuses the token
/// ([`Error::Unauthenticated`]) or, in protected mode, this worker's machine
/// ([`Error::LoopbackOnly`]), TLS fails ([`Error::Tls`]) or the coordinator
/// speaks TLS to a plain-text worker ([`Error::SpeaksTls`]), its run cannot
/// be joined (unknown split version), or it sends an invalid job.
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<Summary> {
    // The GPU and its own check first, before anything is logged or leased:
    // a machine without a usable GPU stops here with one line naming what is
    // missing.
    let gpu = config.gpu.as_ref().map(gpu::GpuRunner::start).transpose()?;
    let mut config = config;
    if let Some(gpu) = &gpu {
        // `--gpu all` is resolved only now: each GPU may hold up to its own
        // limit.
        config.max_jobs = config.max_jobs.max(gpu.max_jobs());
    }
    tracing::info!(
        threads = config.threads.get(),
        kernel = config.kernel.resolved_name(),
        "starting the search threads"
    );
    // Four milliseconds against hours of counts that nobody could recheck.
    nq_core::split::check_kernel(config.kernel).map_err(Error::Kernel)?;
    // Before any thread starts: TLS files that rustls refuses stop the worker
    // here.
    let client = client::Client::new(&config)?;
    let mut pool = pool::WorkerPool::new(config.threads)?;
    if let Some(gpu) = gpu {
        pool = pool.with_gpu(gpu);
    }
    let result = lease::LeaseLoop::new(&config, &pool, client)
        .run(shutdown)
        .await;
    pool.shutdown().await;
    result
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::time::Duration;

    use nq_core::split::{SplitSpec, images_of_completion};
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::testutil::{Fake, Slot, gave_up_after_the_coordinator_left, listener};

    const LIMIT: Duration = Duration::from_secs(60);

    fn config(addr: std::net::SocketAddr, threads: usize) -> Config {
        let mut c = Config::new(addr.into())
            .with_threads(std::num::NonZeroUsize::new(threads).unwrap());
        c.name = "test".into();
        c.backoff_initial = Duration::from_millis(10);
        c.backoff_max = Duration::from_millis(100);
        c.rpc_timeout = Duration::from_secs(5);
        c
    }

    /// [`config`] with a full queue behind the running jobs at once (a
    /// measured prefetch queues nothing behind the long jobs these tests
    /// use).
    fn queueing_config(addr: std::net::SocketAddr, threads: usize) -> Config {
        let mut c = config(addr, threads);
        c.prefetch = crate::config::Prefetch::Full;
        c
    }

    /// Serves `fake` and runs one worker against it to the end.
    async fn run_against(fake: &Fake, threads: usize) -> Result<Summary> {
        let (listener, addr) = listener().await;
        let token = CancellationToken::new();
        let server = tokio::spawn(fake.clone().serve(listener, token.clone()));
        let result = tokio::time::timeout(
            LIMIT,
            run(
                config(addr, threads),
                CancellationToken::new().cancelled_owned(),
            ),
        )
        .await
        .expect("the worker finishes in time");
        token.cancel();
        server.await.unwrap();
        result
    }

    /// Polls the fake until `ready` holds: a real readiness signal, checked
    /// often, never a fixed sleep.
    async fn until(fake: &Fake, ready: impl Fn(&crate::testutil::State) -> bool) {
        tokio::time::timeout(LIMIT, async {
            while !ready(&fake.state()) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("condition reached in time");
    }

    /// Serves `fake`, runs a one-thread worker (with drain time `grace`, if
    /// given), sends it the shutdown signal once it holds two leases, and
    /// returns its summary after stopping the server.
    async fn drain_holding_two_leases(fake: &Fake, grace: Option<Duration>) -> Summary {
        let (listener, addr) = listener().await;
        let server_token = CancellationToken::new();
        let server = tokio::spawn(fake.clone().serve(listener, server_token.clone()));
        let shutdown = CancellationToken::new();
        let mut cfg = queueing_config(addr, 1);
        cfg.grace = grace.unwrap_or(cfg.grace);
        let worker = tokio::spawn(run(cfg, shutdown.clone().cancelled_owned()));
        until(fake, |s| s.leased >= 2).await;
        shutdown.cancel();
        let summary = tokio::time::timeout(LIMIT, worker)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        server_token.cancel();
        server.await.unwrap();
        summary
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn counts_every_job_exactly_once() {
        let fake = Fake::new(10, SplitSpec::new(1, 1).unwrap(), 5, false);
        let summary = run_against(&fake, 2).await.unwrap();
        let s = fake.state();
        assert_eq!(summary.exit, Exit::RunComplete);
        assert_eq!((s.tally.total, s.tally.unique().unwrap()), (724, 92));
        assert_eq!(s.accepted, s.jobs.len() as u64);
        // Acks still in flight when the run completes are not waited for.
        assert!(summary.jobs <= s.accepted && summary.jobs > 0);
        assert_eq!(summary.conflicts, 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn count_only_results_go_in_report_batches() {
        let fake = Fake::new(10, SplitSpec::new(1, 1).unwrap(), 2, false);
        run_against(&fake, 2).await.unwrap();
        let s = fake.state();
        assert_eq!((s.tally.total, s.tally.unique().unwrap()), (724, 92));
        assert_eq!(s.accepted, s.jobs.len() as u64);
        assert_eq!(s.report_calls, 0, "no job needed the Report stream");
        assert!(s.batch_calls > 0 && s.batch_items >= s.accepted);
    }

    /// A coordinator without ReportBatch (an older release) answers
    /// UNIMPLEMENTED: the worker asks once, then reports every job with
    /// Report, and the totals are exact.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn falls_back_to_report_when_the_coordinator_lacks_report_batch() {
        let fake = Fake::new(10, SplitSpec::new(1, 1).unwrap(), 2, false);
        fake.state().no_batch = true;
        run_against(&fake, 2).await.unwrap();
        let s = fake.state();
        assert_eq!((s.tally.total, s.tally.unique().unwrap()), (724, 92));
        assert_eq!(s.accepted, s.jobs.len() as u64);
        assert_eq!(s.unimplemented, 1, "asked once, then never again");
        assert_eq!(s.batch_items, 0);
        assert!(s.report_calls >= s.accepted);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn streams_every_solution() {
        let spec = SplitSpec::new(1, 0).unwrap();
        let fake = Fake::new(8, spec, 3, true);
        let summary = run_against(&fake, 2).await.unwrap();
        let s = fake.state();
        let all: HashSet<Vec<u8>> = s
            .solutions
            .iter()
            .flat_map(|rows| images_of_completion(spec, rows).unwrap())
            .collect();
        assert_eq!(all.len(), 92);
        assert_eq!(s.tally.total, 92);
        assert!(summary.solutions <= s.solutions.len() as u64);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn broken_solution_streams_are_recomputed() {
        let spec = SplitSpec::new(1, 0).unwrap();
        let fake = Fake::new(8, spec, 2, true);
        fake.state().fail_reports = 4;
        run_against(&fake, 2).await.unwrap();
        let s = fake.state();
        assert_eq!(s.fail_reports, 0);
        let all: HashSet<Vec<u8>> = s
            .solutions
            .iter()
            .flat_map(|rows| images_of_completion(spec, rows).unwrap())
            .collect();
        assert_eq!((all.len(), s.tally.total), (92, 92));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_long_job_is_not_queued_behind_another() {
        // Sub-problems of N=21 run for seconds: nothing was measured yet,
        // so the worker holds one job per thread and, renewing it, asks for
        // no second one to queue behind it.
        let fake = Fake::new(21, SplitSpec::new(1, 0).unwrap(), 1, false);
        fake.state().ttl = Duration::from_millis(400);
        let (listener, addr) = listener().await;
        let token = CancellationToken::new();
        let server = tokio::spawn(fake.clone().serve(listener, token.clone()));
        let worker = tokio::spawn(run(config(addr, 1), token.clone().cancelled_owned()));
        until(&fake, |s| s.last_held == 1).await;
        {
            let s = fake.state();
            assert_eq!((s.leased, s.last_want), (1, 0));
        }
        token.cancel();
        let _ = tokio::time::timeout(LIMIT, worker).await.unwrap();
        server.await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn revoked_leases_are_stopped_and_no_longer_renewed() {
        // Sub-problems of N=21 run for seconds, far longer than the test.
        let fake = Fake::new(21, SplitSpec::new(1, 0).unwrap(), 1, false);
        fake.state().ttl = Duration::from_millis(400);
        let (listener, addr) = listener().await;
        let token = CancellationToken::new();
        let server = tokio::spawn(fake.clone().serve(listener, token.clone()));
        let worker = tokio::spawn(run(
            queueing_config(addr, 1),
            token.clone().cancelled_owned(),
        ));
        // One thread, so two jobs fill the queue and the worker wants no more.
        until(&fake, |s| {
            s.leased == 2 && s.last_want == 0 && s.last_held == 2
        })
        .await;
        {
            // As if both leases expired and were reissued elsewhere.
            let mut s = fake.state();
            s.hold_back = true;
            for slot in &mut s.slots {
                *slot = Slot::Pending;
            }
        }
        // Revoked jobs free the thread: the worker asks for two new jobs and
        // stops renewing the old leases.
        until(&fake, |s| s.last_want == 2 && s.last_held == 0).await;
        {
            let mut s = fake.state();
            for slot in &mut s.slots {
                *slot = Slot::Done;
            }
        }
        let summary = tokio::time::timeout(LIMIT, worker)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!((summary.exit, summary.jobs), (Exit::RunComplete, 0));
        token.cancel();
        server.await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn protocol_mismatch_is_fatal_with_the_coordinators_message() {
        let fake = Fake::new(8, SplitSpec::new(1, 0).unwrap(), 1, false);
        fake.state().protocol_version = nq_proto::PROTOCOL_VERSION + 1;
        let err = run_against(&fake, 1).await.unwrap_err();
        assert!(
            matches!(
                &err,
                Error::Refused {
                    code: tonic::Code::FailedPrecondition,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("speaks version"), "{err}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reports_are_retried_until_acknowledged() {
        let fake = Fake::new(9, SplitSpec::new(1, 0).unwrap(), 4, false);
        fake.state().fail_reports = 5;
        run_against(&fake, 2).await.unwrap();
        let s = fake.state();
        assert_eq!(s.fail_reports, 0);
        assert_eq!((s.tally.total, s.accepted), (352, s.jobs.len() as u64));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn registers_again_when_the_coordinator_forgets_it() {
        let fake = Fake::new(10, SplitSpec::new(1, 0).unwrap(), 4, false);
        fake.state().hold_back = true;
        let (listener, addr) = listener().await;
        let token = CancellationToken::new();
        let server = tokio::spawn(fake.clone().serve(listener, token.clone()));
        let worker = tokio::spawn(run(config(addr, 1), token.clone().cancelled_owned()));
        until(&fake, |s| !s.workers.is_empty()).await;
        {
            // A restarted coordinator knows no worker.
            let mut s = fake.state();
            s.workers.clear();
            s.hold_back = false;
        }
        let summary = tokio::time::timeout(LIMIT, worker)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(summary.exit, Exit::RunComplete);
        {
            let s = fake.state();
            assert_eq!(s.workers.len(), 1, "registered again");
            assert_eq!(s.tally.total, 724);
        }
        token.cancel();
        server.await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn waits_for_a_coordinator_that_starts_later() {
        let (listener, addr) = listener().await;
        drop(listener);
        let token = CancellationToken::new();
        let worker = tokio::spawn(run(config(addr, 1), token.clone().cancelled_owned()));
        // Give the worker time to fail a few connection attempts. Only the
        // ordering depends on this; the outcome does not.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let fake = Fake::new(8, SplitSpec::new(1, 0).unwrap(), 2, false);
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        let server = tokio::spawn(fake.clone().serve(listener, token.clone()));
        let summary = tokio::time::timeout(LIMIT, worker)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(summary.exit, Exit::RunComplete);
        assert_eq!(fake.state().tally.total, 92);
        token.cancel();
        server.await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn drains_by_handing_unfinished_jobs_back() {
        // One sub-problem of N=21 takes seconds, far longer than the test: the
        // only way to finish in time is to stop it and hand it back.
        let fake = Fake::new(21, SplitSpec::new(1, 0).unwrap(), 1, false);
        let summary =
            drain_holding_two_leases(&fake, Some(Duration::from_millis(200))).await;
        assert_eq!(summary.exit, Exit::Drained);
        assert_eq!(summary.jobs, 0);
        let s = fake.state();
        assert_eq!(summary.released, s.leased);
        assert_eq!(s.released, s.leased, "every lease went back at once");
        assert!(s.slots.iter().all(|slot| matches!(slot, Slot::Pending)));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn drains_by_finishing_the_job_it_computes() {
        // Jobs of 6 sub-problems of N=18 take a good fraction of a second on
        // one thread: at the signal the first job is computing and the second
        // is queued behind it.
        let fake = Fake::new(18, SplitSpec::new(1, 0).unwrap(), 6, false);
        let summary = drain_holding_two_leases(&fake, None).await;
        assert_eq!(summary.exit, Exit::Drained);
        // The computing job was finished and reported; the queued one was
        // handed back at once.
        assert_eq!((summary.jobs, summary.released), (1, 1));
        let s = fake.state();
        assert_eq!((s.accepted, s.released), (1, 1));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shutdown_before_any_coordinator_returns_at_once() {
        let (listener, addr) = listener().await;
        drop(listener);
        let summary = tokio::time::timeout(LIMIT, run(config(addr, 1), async {}))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(summary.exit, Exit::Drained);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_job_outside_the_run_is_refused() {
        let fake = Fake::new(8, SplitSpec::new(1, 0).unwrap(), 1, false);
        {
            // Sub-problems of another split (two extra columns) are not jobs of
            // this run.
            let board = nq_core::Board::new(8).unwrap();
            let mut s = fake.state();
            s.jobs[0] =
                nq_core::split::split(board, SplitSpec::new(1, 2).unwrap())[..1].to_vec();
        }
        let err = run_against(&fake, 1).await.unwrap_err();
        assert!(matches!(err, Error::Job { job: 0, .. }), "{err:?}");
        assert!(fake.state().released >= 1, "the bad lease is handed back");
    }

    /// An honest worker moved from a killed run to a new run on the same
    /// address sends nothing from the old run: its unsent results of run A
    /// (reports that kept failing) are dropped when it registers into run B.
    /// See: issue 7 ("An honest worker carries results from one run into
    /// another").
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_worker_moved_to_another_run_sends_nothing_of_the_old_one() {
        let fake = Fake::new(9, SplitSpec::new(1, 0).unwrap(), 2, false);
        // Run A takes no report: every result stays pending in the worker.
        fake.state().fail_reports = u32::MAX;
        let (listener, addr) = listener().await;
        let token = CancellationToken::new();
        let server = tokio::spawn(fake.clone().serve(listener, token.clone()));
        let worker = tokio::spawn(run(config(addr, 1), token.clone().cancelled_owned()));
        // Several results of A were computed and are being retried.
        until(&fake, |s| s.failed >= 4).await;
        let b = Fake::new(10, SplitSpec::new(1, 0).unwrap(), 4, false);
        b.state().run_id = "run-b".into();
        fake.switch_run(&b, 100, 1000);
        let summary = tokio::time::timeout(LIMIT, worker)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(summary.exit, Exit::RunComplete);
        {
            let s = fake.state();
            assert_eq!(s.run_id, "run-b");
            assert_eq!(s.tally.total, 724);
            assert_eq!(s.accepted, s.jobs.len() as u64);
            assert!(!s.reports.is_empty());
            for seen in &s.reports {
                assert_eq!(seen.run_id, "run-b", "a report of the old run: {seen:?}");
                assert!(seen.lease > 1000, "a lease of the old run: {seen:?}");
                assert!(seen.job < s.jobs.len() as u64, "{seen:?}");
            }
        }
        token.cancel();
        server.await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn refused_reports_are_dropped_and_their_jobs_done_again() {
        let fake = Fake::new(9, SplitSpec::new(1, 0).unwrap(), 2, false);
        {
            let mut s = fake.state();
            s.deny_reports = 3;
            // The dropped jobs' leases expire soon and are handed out again.
            s.ttl = Duration::from_millis(300);
        }
        let summary = run_against(&fake, 2).await.unwrap();
        assert_eq!(summary.exit, Exit::RunComplete);
        let s = fake.state();
        assert_eq!(s.denied, 3);
        assert_eq!((s.tally.total, s.accepted), (352, s.jobs.len() as u64));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refused_worker_stops_with_the_coordinators_message() {
        let fake = Fake::new(8, SplitSpec::new(1, 0).unwrap(), 1, false);
        fake.state().refuse_lease = Some(tonic::Status::permission_denied(
            "refused: lost 3 verification conflicts",
        ));
        let err = run_against(&fake, 1).await.unwrap_err();
        assert!(
            matches!(
                &err,
                Error::Refused {
                    rpc: "Lease",
                    code: tonic::Code::PermissionDenied,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(
            err.to_string().contains("lost 3 verification conflicts"),
            "{err}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refused_token_stops_the_worker() {
        let fake = Fake::new(8, SplitSpec::new(1, 0).unwrap(), 1, false);
        fake.state().refuse_lease = Some(nq_proto::auth::Refusal::Wrong.status());
        let err = run_against(&fake, 1).await.unwrap_err();
        assert!(matches!(&err, Error::Unauthenticated { .. }), "{err:?}");
        assert!(
            err.to_string()
                .contains("the coordinator refused the token"),
            "{err}"
        );
    }

    /// A coordinator in protected mode refuses a worker from another machine:
    /// the worker stops with the coordinator's message (how to open the run),
    /// not with a claim that its token was wrong.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_worker_refused_by_protected_mode_stops_with_how_to_open_the_run() {
        let fake = Fake::new(8, SplitSpec::new(1, 0).unwrap(), 1, false);
        fake.state().refuse_lease = Some(nq_proto::auth::loopback_only_status());
        let err = run_against(&fake, 1).await.unwrap_err();
        assert!(
            matches!(&err, Error::LoopbackOnly { rpc: "Lease", .. }),
            "{err:?}"
        );
        let msg = err.to_string();
        assert!(msg.contains("--insecure-open-port"), "{msg}");
        assert!(!msg.contains("refused the token"), "{msg}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn jobs_run_on_the_kernel_they_ask_for() {
        let configured = nq_core::search::Kernel::Auto.resolved_name();
        for (asked, ran) in [
            ("scalar", "scalar"),
            ("", configured),
            ("quantum", configured),
        ] {
            let fake = Fake::new(9, SplitSpec::new(1, 0).unwrap(), 3, false);
            fake.state().job_kernel = asked.into();
            run_against(&fake, 2).await.unwrap();
            let s = fake.state();
            assert_eq!(s.tally.total, 352, "{asked:?}");
            assert!(!s.reports.is_empty());
            for seen in &s.reports {
                assert_eq!(seen.kernel, ran, "asked {asked:?}: {seen:?}");
                assert_eq!(seen.run_id, s.run_id);
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn gives_up_when_no_coordinator_ever_answers() {
        let (listener, addr) = listener().await;
        drop(listener);
        let mut cfg = config(addr, 1);
        cfg.give_up = Some(Duration::from_millis(300));
        let err = tokio::time::timeout(LIMIT, run(cfg, std::future::pending()))
            .await
            .expect("the worker gives up in time")
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::GaveUp {
                    silence: Silence::SinceStart,
                    ..
                }
            ),
            "{err:?}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains(&format!(
                "at http://{addr} for 300ms since the worker started"
            )),
            "{msg}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn gives_up_once_the_coordinator_is_gone() {
        let fake = Fake::new(10, SplitSpec::new(1, 0).unwrap(), 4, false);
        // No jobs: the worker only registers and heartbeats.
        fake.state().hold_back = true;
        let (listener, addr) = listener().await;
        let token = CancellationToken::new();
        let server = tokio::spawn(fake.clone().serve(listener, token.clone()));
        let mut cfg = config(addr, 1);
        cfg.give_up = Some(Duration::from_millis(500));
        let worker = tokio::spawn(run(cfg, std::future::pending()));
        until(&fake, |s| !s.workers.is_empty()).await;
        // The coordinator leaves without telling the worker.
        token.cancel();
        server.await.unwrap();
        gave_up_after_the_coordinator_left(worker, LIMIT).await;
    }
}
