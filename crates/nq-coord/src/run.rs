//! [`run`]: one session of a coordinator, from opening the data directory to
//! the final report.
//!
//! # Shutdown order
//!
//! On the shutdown signal (or after the run completes and the linger ends):
//!
//! 1. stop granting leases (the scheduler is closed; health says NOT_SERVING);
//! 2. stop the local threads, which hand their leases back;
//! 3. stop the gRPC server and let in-flight RPCs finish (reports in flight
//!    are committed and acknowledged);
//! 4. let the committer drain its queue, then flush the store;
//! 5. return the report.
//!
//! On startup, every job a previous session had leased goes back to pending:
//! sled holds the truth, and no lease survives a restart.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use nq_core::split::SPLIT_VERSION;
use nq_proto::convert::RunShape;
use nq_proto::pb::coordinator_server::CoordinatorServer;
use nq_store::{
    Checkpoint, Creation, Manifest, NewRun, RunKey, RunSummary, Store, StoreOptions,
};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tracing::{error, info, warn};

use crate::config::{Config, default_split, default_target_jobs};
use crate::error::{Error, Result};
use crate::ledger;
use crate::local;
use crate::plan::{self, MAX_SUBS_PER_JOB, PLAN_FORMAT};
use crate::progress::Progress;
use crate::quorum::Policy;
use crate::report::{FaultyWorker, REPORT_FILE, RunReport};
use crate::scheduler::{EXACT_ORDER_UP_TO, ExactOrder, HandOut, Scheduler};
use crate::security::{self, TokenCheck};
use crate::service::CoordinatorService;
use crate::session::{Session, unix_ms};

/// How often leases are checked for expiry and progress is published.
const TICK: Duration = Duration::from_millis(250);

/// How often lease records are written (see `Session::write_records`).
const RECORDS_EVERY: Duration = Duration::from_secs(1);

/// How often issued leases of settled jobs are forgotten. Often: at 10,000
/// completions a second, every second of delay holds about a megabyte of
/// leases nothing can use any more.
const PRUNE_EVERY: Duration = Duration::from_secs(1);

/// How often the time spent on the run is recorded.
const ELAPSED_EVERY: Duration = Duration::from_secs(5);

/// How long in-flight RPCs get to finish at shutdown before the server is
/// dropped.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs one session of a coordinator: creates the run in `config.data_dir` or
/// resumes it, serves workers on `listener` (and runs jobs on
/// `config.local_threads` threads) until every job is done or `shutdown`
/// completes, and returns the report.
///
/// A run found already finished returns its stored report at once, without
/// serving. A finished run writes `report.json` into the data directory.
/// An interrupted run returns a report with `complete: false`; running again
/// with the same directory resumes it.
///
/// # Errors
///
/// A data directory that is locked, corrupt or made for another run
/// ([`Error::Store`]), threads that cannot start, a server that fails, or a
/// store that cannot flush (results could no longer be made durable).
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<RunReport> {
    let started = Instant::now();
    // `stop` is cancelled by the shutdown future; `returned` by our return,
    // which ends the task that waits for the shutdown future.
    let stop = CancellationToken::new();
    let returned = CancellationToken::new();
    let watcher = {
        let (stop, returned) = (stop.clone(), returned.clone());
        tokio::spawn(async move {
            tokio::select! {
                () = shutdown => stop.cancel(),
                () = returned.cancelled() => {}
            }
        })
    };
    // A full disk or damaged files are reported with the directory to act on.
    let data_dir = config.data_dir.clone();
    let result = session(config, listener, stop, started)
        .await
        .map_err(|e| e.with_data_dir(&data_dir));
    returned.cancel();
    watcher.await?;
    result
}

/// What setup found in the data directory.
enum Setup {
    /// The run was finished by an earlier session.
    Finished(RunReport),
    /// Ready to serve.
    Ready(Box<Ready>),
}

struct Ready {
    store: Arc<Store>,
    manifest: Manifest,
    sched: Scheduler,
    elapsed_before: Duration,
}

/// Opens the store, creates or resumes the run and rebuilds the scheduler.
/// Blocking (sled I/O and, for a new run, the split); a creation stops
/// between two batches once `stop` is set.
fn setup(config: &Config, stop: &AtomicBool) -> Result<Setup> {
    let opened = Instant::now();
    let options = StoreOptions {
        cache_capacity: config.cache_bytes,
    };
    let store = Arc::new(Store::open(&config.data_dir, &options)?);
    let stored = store.manifest()?;
    let creating = store.creation()?;
    let spec = config
        .split
        .or(stored.as_ref().map(|m| m.key.spec))
        .or(creating.as_ref().map(|(c, _)| c.run.key.spec))
        .unwrap_or_else(|| default_split(config.board));
    let key = RunKey {
        board: config.board,
        split_version: SPLIT_VERSION,
        spec,
        solutions: config.solutions,
    };
    let manifest = match store.resume(&key)? {
        Some(m) => {
            info!(dir = %config.data_dir.display(), run = %m.run_id, jobs = m.jobs, "resuming run");
            if config.target_jobs.is_some() || config.max_job_size != MAX_SUBS_PER_JOB {
                warn!(
                    "--jobs and --job-size apply to new runs only; the stored jobs are kept"
                );
            }
            m
        }
        None => create(config, &store, key, creating, stop)?,
    };
    if let Some(summary) = store.summary()? {
        return Ok(Setup::Finished(finished_report(
            config, &store, &manifest, &summary,
        )?));
    }
    if config.data_dir.join(REPORT_FILE).exists() {
        return Err(Error::SummaryLost {
            dir: config.data_dir.clone(),
        });
    }
    let requeued = store.requeue_leased()?;
    if requeued > 0 {
        info!(
            jobs = requeued,
            "jobs leased by the previous session are pending again"
        );
    }
    let session_no = store.next_boot()?;
    let mut sched = scheduler(
        &store,
        &manifest,
        session_no,
        config.lease_ttl,
        policy(config, &store)?,
    )?;
    // Totals are derived again from the stored counts, never from a cached sum.
    ledger::restore(&store, &shape_of(&manifest), &mut sched)?;
    if sched.jobs_done() > 0 || sched.jobs_in_check() > 0 {
        info!(
            done = sched.jobs_done(),
            jobs = sched.jobs(),
            in_check = sched.jobs_in_check(),
            "restored finished jobs"
        );
    }
    let elapsed_before = Duration::from_millis(store.elapsed_ms()?);
    info!(
        setup_ms = opened.elapsed().as_millis() as u64,
        session = session_no,
        "data directory ready"
    );
    Ok(Setup::Ready(Box::new(Ready {
        store,
        manifest,
        sched,
        elapsed_before,
    })))
}

/// The verification policy of the run: the configured share and ban limit,
/// keyed by the run's stored secret (drawn on its first session).
fn policy(config: &Config, store: &Store) -> Result<Policy> {
    Ok(Policy {
        secret: store.verify_secret(rand::random())?,
        fraction: config.verify,
        ban_after: config.ban_after.max(1),
    })
}

fn shape_of(manifest: &Manifest) -> RunShape {
    RunShape {
        board: manifest.key.board,
        spec: manifest.key.spec,
        solutions: manifest.key.solutions,
    }
}

/// The scheduler of a stored run: small runs hand their jobs out in exact
/// order of work, from a list in memory; large ones read the order stored
/// with the jobs, a chunk at a time (built first for runs created before
/// it existed).
fn scheduler(
    store: &Arc<Store>,
    manifest: &Manifest,
    session: u64,
    ttl: Duration,
    policy: Policy,
) -> Result<Scheduler> {
    let corrupt = || -> Error {
        nq_store::Error::Corrupt {
            tree: "jobs",
            what: nq_store::Corruption::Field { field: "job count" },
        }
        .into()
    };
    if manifest.jobs <= EXACT_ORDER_UP_TO as u64 {
        let works = store.job_works()?;
        let total: u128 = works.iter().map(|&w| u128::from(w)).sum();
        if works.len() as u64 != manifest.jobs || total != manifest.total_work {
            return Err(corrupt());
        }
        return Ok(Scheduler::new(works, session, ttl, policy));
    }
    if store.ensure_order()? {
        info!(jobs = manifest.jobs, "built the stored hand-out order");
    }
    Ok(Scheduler::with_order(
        manifest.jobs,
        manifest.total_work,
        Box::new(StoredOrder::new(Arc::clone(store))),
        session,
        ttl,
        policy,
    ))
}

/// Creates the run, or finishes the creation an earlier session began:
/// splits the board and streams the jobs into the store (see
/// [`crate::plan`]).
fn create(
    config: &Config,
    store: &Store,
    key: RunKey,
    creating: Option<(Creation, Checkpoint)>,
    stop: &AtomicBool,
) -> Result<Manifest> {
    let t = Instant::now();
    let (params, at) = match creating {
        Some((c, at)) => {
            if c.run.key != key || c.plan.format != PLAN_FORMAT {
                return Err(Error::CreationMismatch {
                    dir: config.data_dir.clone(),
                    stored: format!("{} (plan format {})", c.run.key, c.plan.format),
                    requested: format!("{key} (plan format {PLAN_FORMAT})"),
                });
            }
            if config.target_jobs.is_some() || config.max_job_size != MAX_SUBS_PER_JOB {
                warn!(
                    "--jobs and --job-size apply to new runs only; the creation goes on with its own"
                );
            }
            info!(
                run = %c.run.run_id,
                done = at.subproblems,
                subproblems = c.plan.subproblems,
                jobs = at.jobs,
                "resuming the creation of the run's jobs"
            );
            (c.plan, at)
        }
        None => {
            let target = config
                .target_jobs
                .unwrap_or_else(|| default_target_jobs(config.board));
            let params =
                plan::params(config.board, key.spec, target, config.max_job_size);
            let now = SystemTime::now();
            let run = NewRun {
                key,
                run_id: format!(
                    "{}-{:x}-{:x}",
                    config.board.n(),
                    unix_ms(now),
                    std::process::id()
                ),
                program_version: env!("CARGO_PKG_VERSION").to_owned(),
                created_unix_ms: unix_ms(now),
            };
            info!(
                run = %run.run_id,
                subproblems = params.subproblems,
                target_jobs = target,
                "creating the run's jobs"
            );
            store.begin_creation(&Creation { run, plan: params })?;
            (params, Checkpoint::default())
        }
    };
    let manifest = plan::build(store, config.board, key.spec, params, at, stop)?;
    info!(
        n = config.board.n(),
        ring = key.spec.ring,
        extra = key.spec.extra,
        subproblems = params.subproblems,
        jobs = manifest.jobs,
        ms = t.elapsed().as_millis() as u64,
        run = %manifest.run_id,
        "created run"
    );
    Ok(manifest)
}

/// The workers that lost verification conflicts, for the report.
pub(crate) fn faulty_workers(s: &Scheduler) -> Vec<FaultyWorker> {
    let ban_after = s.policy().ban_after;
    s.identities()
        .faulty()
        .map(|(id, name, lost)| {
            FaultyWorker::from_identity(
                name,
                lost,
                s.identities().is_banned(id, ban_after),
            )
        })
        .collect()
}

/// The report of a run an earlier session finished. The workers that lost
/// conflicts are found again in the stored copies.
fn finished_report(
    config: &Config,
    store: &Store,
    m: &Manifest,
    s: &RunSummary,
) -> Result<RunReport> {
    // Judging needs no hand-out order: nothing is handed out.
    let mut sched = Scheduler::with_order(
        m.jobs,
        m.total_work,
        Box::new(ExactOrder::new(&[])),
        0,
        config.lease_ttl,
        policy(config, store)?,
    );
    ledger::restore(store, &shape_of(m), &mut sched)?;
    // The stored summary is a cached sum too: it must equal the results.
    let derived = sched.tally().total;
    if derived != s.total {
        return Err(Error::SummaryMismatch {
            dir: config.data_dir.clone(),
            stored: s.total,
            derived,
        });
    }
    Ok(RunReport {
        n: m.key.board.n(),
        complete: true,
        total: s.total,
        unique: s.unique,
        seconds: Duration::from_millis(s.elapsed_ms).as_secs_f64(),
        jobs: m.jobs,
        jobs_done: s.jobs,
        split: m.key.spec,
        split_version: m.key.split_version,
        confirmations: s.confirmations,
        conflicts: s.conflicts,
        run_id: m.run_id.clone(),
        data_dir: config.data_dir.clone(),
        faulty_workers: faulty_workers(&sched),
        disputed: 0,
        audit_digest: Some(crate::audit::digest(store)?),
    })
}

/// The session proper; `stop` is the shutdown signal.
async fn session(
    mut config: Config,
    listener: TcpListener,
    stop: CancellationToken,
    started: Instant,
) -> Result<RunReport> {
    let setup = {
        let cfg = config.clone();
        // A shutdown during a long creation stops it between two batches.
        let halt = Arc::new(AtomicBool::new(false));
        let watch = {
            let (halt, stop) = (Arc::clone(&halt), stop.clone());
            tokio::spawn(async move {
                stop.cancelled().await;
                halt.store(true, Ordering::Relaxed);
            })
        };
        let setup = tokio::task::spawn_blocking(move || setup(&cfg, &halt)).await?;
        watch.abort();
        match setup {
            Err(Error::ShuttingDown) => return Err(Error::CreationInterrupted),
            other => other?,
        }
    };
    let ready = match setup {
        Setup::Finished(report) => {
            info!(dir = %config.data_dir.display(), "the run is already finished");
            report.write_json(&config.data_dir)?;
            return Ok(report);
        }
        Setup::Ready(ready) => *ready,
    };
    let Ready {
        store,
        manifest,
        sched,
        elapsed_before,
    } = ready;
    let shape = shape_of(&manifest);
    let (session, commits) =
        Session::new(Arc::clone(&store), sched, shape, manifest.run_id.clone());
    let session = Arc::new(session);

    // One token per stage, cancelled in the shutdown order below, because the
    // stages must stop one after the other: a single token would stop the
    // committer while in-flight reports still wait for it. The tracker holds
    // the ticker and the local threads' commit tasks, which must end before
    // the committer does.
    let tracker = TaskTracker::new();
    let commit_token = CancellationToken::new();
    let mut committer = tokio::spawn(ledger::committer(
        Arc::clone(&session),
        commits,
        commit_token.clone(),
    ));
    let (health, health_service) = tonic_health::server::health_reporter();
    let serve_token = CancellationToken::new();
    let mut server = tokio::spawn(serve(
        Arc::clone(&session),
        listener,
        health_service,
        Guard {
            token: config.token.clone(),
            tls: config.tls.clone(),
        },
        serve_token.clone(),
    ));
    health
        .set_serving::<CoordinatorServer<CoordinatorService>>()
        .await;
    // From here the health service says SERVING (`nq-coord health`).
    info!("serving workers");
    let local_token = CancellationToken::new();
    let mut local = (config.local_threads > 0).then(|| {
        tokio::spawn(local::run_local(
            Arc::clone(&session),
            config.local_threads,
            local_token.clone(),
            tracker.clone(),
        ))
    });
    let tick_token = CancellationToken::new();
    if let Some(http) = config.http_listener.take() {
        // Stops with the ticker: it shows the run until the report is due.
        let listener = http_listener(&http)?;
        let (session, token) = (Arc::clone(&session), tick_token.clone());
        tracker.spawn(async move {
            if let Err(e) = crate::http::serve(session, listener, token).await {
                error!(error = %e.chain(), "the HTTP port stopped");
            }
        });
    }
    let progress = config.progress.take();
    tracker.spawn(ticker(
        Arc::clone(&session),
        progress.clone(),
        config.progress_log,
        (started, elapsed_before),
        tick_token.clone(),
    ));

    // Wait for the end of the run, the shutdown signal, or a failure. The
    // committer and the server only end early on a fatal error (the store
    // cannot flush, the listener broke): then the session stops the same way.
    let mut fatal: Option<Error> = None;
    let mut committer_done = false;
    let mut server_done = false;
    tokio::select! {
        // Biased, so that completion wins over the local threads ending
        // because of it.
        biased;
        () = stop.cancelled() => info!("shutdown requested"),
        () = session.complete.cancelled() => {
            info!("every job is done");
            linger(&session, &stop, config.linger).await;
        }
        r = &mut committer => {
            committer_done = true;
            fatal = Some(r.map_err(Error::from).and_then(|r| r).err().unwrap_or(Error::ShuttingDown));
        }
        r = &mut server => {
            server_done = true;
            fatal = Some(r.map_err(Error::from).and_then(|r| r).err().unwrap_or(Error::ShuttingDown));
        }
        // The local threads stop by themselves only when the run is complete
        // (handled above) or on an error, which would leave a run without
        // workers waiting forever.
        r = async { local.as_mut().expect("guarded by the condition").await },
            if local.is_some() => {
            local = None;
            match r.map_err(Error::from).and_then(|r| r) {
                Ok(()) => {}
                Err(e) => fatal = Some(e),
            }
        }
    }

    // 1. Stop granting leases.
    session.sched().close();
    health
        .set_not_serving::<CoordinatorServer<CoordinatorService>>()
        .await;
    // 2. Stop the local threads; they release their leases.
    local_token.cancel();
    if let Some(local) = local {
        match local.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => error!(error = %e.chain(), "local threads failed"),
            Err(e) => error!(error = %e, "local threads panicked"),
        }
    }
    // 3. Let in-flight RPCs finish.
    serve_token.cancel();
    if !server_done {
        match tokio::time::timeout(DRAIN_TIMEOUT, &mut server).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => error!(error = %e, "gRPC server failed"),
            Ok(Err(e)) => error!(error = %e, "gRPC server panicked"),
            Err(_) => {
                warn!("in-flight requests did not finish in time; dropping them");
                server.abort();
            }
        }
    }
    tick_token.cancel();
    tracker.close();
    tracker.wait().await;
    // 4. Drain the committer, then flush.
    commit_token.cancel();
    if !committer_done {
        match committer.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => fatal = fatal.or(Some(e)),
            Err(e) => fatal = fatal.or(Some(e.into())),
        }
    }
    if let Err(e) = session.write_records() {
        error!(error = %e.chain(), "cannot record leases");
    }
    let elapsed = elapsed_before + started.elapsed();
    let elapsed_ms = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
    store.set_elapsed_ms(elapsed_ms)?;
    if let Some(e) = fatal {
        // Best effort: the store may be what failed.
        let _ = store.flush_async().await;
        return Err(e);
    }

    // 5. The report.
    let (mut report, summary) = {
        let s = session.sched();
        if let Some(tx) = &progress {
            let mut last = s.progress(Instant::now());
            last.elapsed = started.elapsed();
            tx.send_replace(last);
        }
        let complete = s.is_complete();
        let tally = s.tally();
        let unique = if complete {
            tally.unique().map_err(Error::Inconsistent)?
        } else {
            0
        };
        let report = RunReport {
            n: manifest.key.board.n(),
            complete,
            total: tally.total,
            unique,
            seconds: elapsed.as_secs_f64(),
            jobs: s.jobs(),
            jobs_done: s.jobs_done(),
            split: manifest.key.spec,
            split_version: manifest.key.split_version,
            confirmations: s.confirmations(),
            conflicts: s.conflicts(),
            run_id: manifest.run_id.clone(),
            data_dir: config.data_dir.clone(),
            faulty_workers: faulty_workers(&s),
            disputed: s.jobs_disputed(),
            audit_digest: None,
        };
        let summary = complete.then(|| RunSummary {
            total: tally.total,
            unique,
            elapsed_ms,
            jobs: s.jobs(),
            confirmations: s.confirmations(),
            conflicts: s.conflicts(),
            finished_unix_ms: unix_ms(SystemTime::now()),
        });
        (report, summary)
    };
    if let Some(summary) = &summary {
        store.set_summary(summary)?;
    }
    // One flush makes the time spent and the summary durable, before the
    // report file says that the run is finished.
    store.flush_async().await?;
    if summary.is_some() {
        // Read back as `nq-coord audit` reads it, so that the two agree.
        let store = Arc::clone(&store);
        let digest = tokio::task::spawn_blocking(move || crate::audit::digest(&store));
        report.audit_digest = Some(digest.await??);
        let path = report.write_json(&config.data_dir)?;
        info!(report = %path.display(), "run finished");
        if report.conflicts > 0 {
            error!(
                conflicts = report.conflicts,
                "the run recorded conflicting results"
            );
        }
    } else {
        info!(
            done = report.jobs_done,
            jobs = report.jobs,
            "run interrupted; run again to resume"
        );
    }
    Ok(report)
}

/// The tokio form of the caller's bound HTTP listener (a duplicate of its
/// socket, so that the caller's copy may stay in the config).
fn http_listener(l: &std::net::TcpListener) -> Result<TcpListener> {
    let io = |source| Error::Io {
        context: "cannot use the --metrics listener".into(),
        source,
    };
    let l = l.try_clone().map_err(io)?;
    l.set_nonblocking(true).map_err(io)?;
    TcpListener::from_std(l).map_err(io)
}

/// Who may call the coordinator's service: see [`Config::token`] and
/// [`Config::tls`].
struct Guard {
    token: Option<nq_proto::auth::Token>,
    tls: Option<nq_proto::tls::ServerTls>,
}

/// Serves the coordinator, health and reflection services until `token` is
/// cancelled, then lets in-flight RPCs finish.
///
/// With `guard.token`, every call of the coordinator's service must carry it
/// (health and reflection stay open, for probes and `grpcurl list`); with
/// `guard.tls`, the port speaks TLS only.
async fn serve(
    session: Arc<Session>,
    listener: TcpListener,
    health: tonic_health::pb::health_server::HealthServer<
        impl tonic_health::pb::health_server::Health,
    >,
    guard: Guard,
    token: CancellationToken,
) -> Result<()> {
    if let Ok(addr) = listener.local_addr() {
        security::warn_if_exposed(addr, guard.token.is_some(), guard.tls.is_some());
    }
    if let Some(tls) = &guard.tls {
        info!(mutual = tls.mutual(), "serving TLS");
    }
    let service = CoordinatorServer::new(CoordinatorService::new(session))
        .max_decoding_message_size(nq_proto::MAX_MESSAGE_BYTES)
        .max_encoding_message_size(nq_proto::MAX_MESSAGE_BYTES);
    let service = InterceptedService::new(service, TokenCheck::new(guard.token));
    // The descriptor set is compiled from our own proto at build time, and a
    // test lists the services through it: decoding it cannot fail at run time.
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(nq_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 = reflection()
        .build_v1()
        .expect("the built-in descriptor sets decode");
    // grpcurl and older tools still ask the v1alpha service.
    let reflection_v1alpha = reflection()
        .build_v1alpha()
        .expect("the built-in descriptor sets decode");
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let mut builder = Server::builder();
    if let Some(tls) = &guard.tls {
        builder = builder.tls_config(tls.config())?;
    }
    builder
        // Detects dead connections, so that a report stuck on a vanished
        // worker does not hold its job's claim forever.
        .http2_keepalive_interval(Some(Duration::from_secs(20)))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        .add_service(health)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(service)
        .serve_with_incoming_shutdown(incoming, token.cancelled_owned())
        .await?;
    Ok(())
}

/// After the last job: keep answering until every recently seen worker was
/// told the run is complete, or `cap` passes, or shutdown is requested.
async fn linger(session: &Session, stop: &CancellationToken, cap: Duration) {
    let until = Instant::now() + cap;
    loop {
        let untold = session.sched().untold_workers(Instant::now());
        if untold == 0 {
            return;
        }
        if Instant::now() >= until {
            info!(
                workers = untold,
                "not every worker heard that the run is over"
            );
            return;
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
    }
}

/// Expires leases, writes lease records, publishes progress and logs it,
/// every [`TICK`]; records the time spent every few seconds (so that a killed
/// session's time is not lost).
async fn ticker(
    session: Arc<Session>,
    progress: Option<tokio::sync::watch::Sender<Progress>>,
    log_every: Option<Duration>,
    (started, elapsed_before): (Instant, Duration),
    token: CancellationToken,
) {
    let mut interval = tokio::time::interval(TICK);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_log = Instant::now();
    let mut last_elapsed = Instant::now();
    let mut last_records = Instant::now();
    let mut last_prune = Instant::now();
    loop {
        tokio::select! {
            () = token.cancelled() => return,
            _ = interval.tick() => {}
        }
        let now = Instant::now();
        let (expired, mut snapshot, in_check) = {
            let mut s = session.sched();
            let expired = s.expire(now);
            s.prune_workers(now);
            if s.refresh_machines(now) {
                session.machines_changed.notify_one();
            }
            if now.duration_since(last_prune) >= PRUNE_EVERY {
                last_prune = now;
                s.prune_issued();
            }
            (expired, s.progress(now), s.jobs_in_check())
        };
        session.sample_status(now);
        for lease in &expired {
            warn!(job = %lease.job, lease = %lease.id, worker = %lease.worker, "lease expired; job is pending again");
        }
        session.persist_expired(&expired);
        if last_records.elapsed() >= RECORDS_EVERY {
            last_records = now;
            if let Err(e) = crate::session::blocking(|| session.write_records()) {
                error!(error = %e.chain(), "cannot record leases");
            }
        }
        snapshot.elapsed = started.elapsed();
        if last_elapsed.elapsed() >= ELAPSED_EVERY {
            last_elapsed = now;
            let ms = (elapsed_before + snapshot.elapsed).as_millis();
            // Durable with the next flush; losing it costs a few seconds of
            // accounting, nothing else.
            if let Err(e) = session
                .store
                .set_elapsed_ms(u64::try_from(ms).unwrap_or(u64::MAX))
            {
                error!(error = %e, "cannot record the time spent");
            }
        }
        if let Some(every) = log_every
            && last_log.elapsed() >= every
        {
            last_log = now;
            info!(
                jobs_done = snapshot.jobs_done,
                jobs = snapshot.jobs,
                percent = (snapshot.fraction() * 1000.0).round() / 10.0,
                jobs_per_s = (snapshot.jobs_per_second() * 10.0).round() / 10.0,
                eta_s = snapshot.eta().map(|d| d.as_secs()),
                workers = snapshot.workers,
                leased = snapshot.jobs_leased,
                // Jobs waiting for a check copy by another worker.
                in_check,
                "progress"
            );
        }
        if let Some(tx) = &progress {
            tx.send_replace(snapshot);
        }
    }
}

/// The hand-out order stored with a large run's jobs, read a chunk at a
/// time: the scheduler's memory holds one chunk of ids, not a queue of
/// every job.
#[derive(Debug)]
struct StoredOrder {
    store: Arc<Store>,
    /// The key of the last chunk read.
    cursor: Option<Vec<u8>>,
}

impl StoredOrder {
    fn new(store: Arc<Store>) -> StoredOrder {
        StoredOrder {
            store,
            cursor: None,
        }
    }
}

impl HandOut for StoredOrder {
    fn next_batch(&mut self) -> Result<Vec<nq_store::JobId>> {
        match self.store.order_after(self.cursor.as_deref())? {
            Some((key, ids)) => {
                self.cursor = Some(key);
                Ok(ids)
            }
            None => Ok(Vec::new()),
        }
    }
}
