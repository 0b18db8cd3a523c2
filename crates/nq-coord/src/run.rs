//! [`run`]: one session of a coordinator, from opening the data directory to
//! the final report. Wiring and the shutdown order only: set-up is
//! [`crate::setup`], the work is the [`crate::engine`]'s, and the adapters
//! serve it.
//!
//! # Shutdown order
//!
//! On the shutdown signal (or after the run completes and the linger ends):
//!
//! 1. stop granting leases (the scheduler is closed; health says NOT_SERVING);
//! 2. stop the local threads, which hand their leases back;
//! 3. stop the gRPC server and let in-flight RPCs finish (reports in flight
//!    are committed and acknowledged);
//! 4. let the commit loop drain its queue, then flush the store;
//! 5. return the report.
//!
//! On startup, the leases a previous session recorded are kept with their
//! workers (or their jobs are pending again), and a store with a state
//! index is served at once while its stored copies are checked in the
//! background (`crate::restore`, `crate::engine::restoring`).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, error, info, warn};

use crate::adapters::in_flight::InFlight;
use crate::adapters::{backup_socket, grpc, http, local};
use crate::config::Config;
use crate::engine::ticker::{Publish, ticker};
use crate::engine::{Engine, backup, commit};
use crate::error::{Error, Result};
use crate::report::{REPORT_FILE, RunReport, Totals};
use crate::setup::{Accepted, Opened, Ready, build, open, shape_of};
use crate::wall::unix_ms;

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
/// A store whose writes are stuck (sled's deadlock, see `crate::stall`)
/// ends the process: its error is logged ([`Error::StoreStalled`]) and the
/// process exits with code 3 (`interrupted`), since nothing else can stop a
/// thread caught in it. Every result acknowledged before was durable, and
/// the same command resumes.
///
/// # Errors
///
/// A `config` field out of range ([`Error::Option`], from
/// [`Config::validate`]), before anything is opened. A data directory that
/// is locked, corrupt or made for another run
/// ([`Error::Store`]), threads that cannot start, a server that fails, or a
/// store that cannot flush (results could no longer be made durable).
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<RunReport> {
    let bind = async move {
        Ok(Listeners {
            grpc: listener,
            http: None,
        })
    };
    run_binding(config, bind, |_| Ok(()), shutdown).await
}

/// The ports a serving session listens on.
#[derive(Debug)]
pub struct Listeners {
    /// Where workers are served.
    pub grpc: TcpListener,
    /// The HTTP port (`--metrics`), if any; replaces
    /// [`Config::http_listener`] when given.
    pub http: Option<std::net::TcpListener>,
}

/// [`run`], binding its ports only when the run is to be served: a
/// finished run returns its stored report without awaiting `bind`, so that
/// reprinting a result never takes a port another run may need. Any other
/// run awaits `bind` before it opens the data directory (so that a port it
/// cannot have is refused first, as when [`run`]'s caller binds). Then,
/// once the directory is accepted (not locked, damaged, keyed otherwise or
/// holding another run) and before a new run's jobs are created,
/// `announce` is called with the bound ports: `nq-coord` prints
/// `listening on ADDR` there, so that the line means a run that will
/// serve.
///
/// # Errors
///
/// As [`run`]; `bind`'s error, as it returns it; [`Error::Io`] for
/// `announce`'s.
pub async fn run_binding(
    config: Config,
    bind: impl Future<Output = Result<Listeners>> + Send,
    announce: impl FnOnce(&Listeners) -> std::io::Result<()> + Send,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<RunReport> {
    let started = Instant::now();
    config.validate()?;
    // Every caller's memory stays bounded, in-process runs included.
    nq_process::alloc::tune();
    let _trimmer = nq_process::alloc::Trimmer::start();
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
    let result = session(config, (bind, announce), stop, started)
        .await
        .map_err(|e| e.with_data_dir(&data_dir));
    returned.cancel();
    watcher.await?;
    result
}

/// The session proper; `stop` is the shutdown signal.
async fn session(
    mut config: Config,
    (bind, announce): (
        impl Future<Output = Result<Listeners>> + Send,
        impl FnOnce(&Listeners) -> std::io::Result<()> + Send,
    ),
    stop: CancellationToken,
    started: Instant,
) -> Result<RunReport> {
    let (accepted, listener) = match accept(&mut config, bind, announce).await? {
        Accept::Finished(report) => return Ok(*report),
        Accept::Serve(accepted, listener) => (*accepted, listener),
    };
    let Ready {
        store,
        manifest,
        core,
        elapsed_before,
    } = prepare(&config, accepted, &stop).await?;
    // Held for the session: a stuck store ends the process (see `stall`).
    let _watch = crate::stall::watch(store.writes(), crate::stall::STORE_STALL, |e| {
        // The log is the last word: nothing returns to the caller.
        error!(error = %e, "the store is stuck; exiting as interrupted (code 3)");
        std::process::exit(i32::from(crate::report::RunStatus::Interrupted.exit_code()));
    })
    .map_err(|source| Error::Io {
        context: "cannot start the thread that watches the store's writes".into(),
        source,
    })?;
    let (engine, commits) = Engine::new(
        Arc::clone(&store),
        core,
        shape_of(&manifest),
        manifest.run_id.clone(),
    );
    let engine = Arc::new(engine);
    let mut tasks = Tasks::start(
        &engine,
        commits,
        listener,
        &mut config,
        (started, elapsed_before),
    )
    .await?;
    let fatal = tasks.wait(&engine, &stop, config.linger).await;
    let progress = tasks.progress.clone();
    let fatal = tasks.shut_down(&engine, fatal).await;

    let elapsed = elapsed_before + started.elapsed();
    let elapsed_ms = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
    store.set_elapsed_ms(elapsed_ms)?;
    if let Some(e) = fatal {
        // Best effort: the store may be what failed.
        let _ = store.flush_async().await;
        return Err(e);
    }
    let ended = Ended {
        engine: &engine,
        store: &store,
        manifest: &manifest,
        elapsed_ms,
    };
    ended.report(&config, progress.as_ref()).await
}

/// What opening the data directory decided ([`accept`]).
enum Accept {
    /// The run was finished by an earlier session: its report.
    Finished(Box<RunReport>),
    /// A run to serve, on this listener.
    Serve(Box<Accepted>, TcpListener),
}

/// Opens the data directory; for a run to serve, binds and announces the
/// ports. A finished run has its report.json (or, if it crashed just
/// before writing it, its stored summary): it is reprinted without taking
/// a port. Any other run binds first, so that a port it cannot have is
/// refused before the directory is touched; it is announced once the
/// directory is accepted, before a long creation.
async fn accept(
    config: &mut Config,
    bind: impl Future<Output = Result<Listeners>> + Send,
    announce: impl FnOnce(&Listeners) -> std::io::Result<()> + Send,
) -> Result<Accept> {
    let binding = if config.data_dir.join(REPORT_FILE).exists() {
        Binding::Later(bind)
    } else {
        Binding::Bound(bind.await?)
    };
    let cfg = config.clone();
    let accepted = match tokio::task::spawn_blocking(move || open(&cfg)).await?? {
        Opened::Finished(report) => {
            info!(dir = %config.data_dir.display(), "the run is already finished");
            report.write_json(&config.data_dir)?;
            return Ok(Accept::Finished(report));
        }
        Opened::Accepted(accepted) => accepted,
    };
    let listeners = match binding {
        Binding::Bound(listeners) => listeners,
        Binding::Later(bind) => bind.await?,
    };
    announce(&listeners).map_err(|source| Error::Io {
        context: "cannot announce the bound ports".into(),
        source,
    })?;
    if let Some(http) = listeners.http {
        config.http_listener = Some(Arc::new(http));
    }
    Ok(Accept::Serve(accepted, listeners.grpc))
}

/// A session whose tasks have ended without a fatal error: what step 5 of
/// the shutdown order reports.
struct Ended<'a> {
    engine: &'a Engine,
    store: &'a Arc<nq_store::Store>,
    manifest: &'a nq_store::Manifest,
    /// Time spent on the run, over all its sessions.
    elapsed_ms: u64,
}

impl Ended<'_> {
    /// Step 5 of the shutdown order, the report: a complete run stores its
    /// summary, then writes its report.json (with the audit's digest); an
    /// interrupted one says how far it got.
    async fn report(
        self,
        config: &Config,
        progress: Option<&tokio::sync::watch::Sender<crate::Progress>>,
    ) -> Result<RunReport> {
        let (mut report, summary) = {
            let core = self.engine.core();
            let standing = core.standing();
            let totals = Totals::of_standing(&standing, self.elapsed_ms)?;
            let report = RunReport::new(
                self.manifest,
                &config.data_dir,
                totals,
                core.verification().faulty_workers(),
            );
            (
                report,
                totals.summary(standing.jobs, unix_ms(SystemTime::now())),
            )
        };
        report.setting_changes = crate::settings::changes(self.store)?;
        if let Some(tx) = progress {
            tx.send_replace(self.engine.progress());
        }
        if let Some(summary) = &summary {
            self.store.set_summary(summary)?;
        }
        // One flush makes the time spent and the summary durable, before the
        // report file says that the run is finished.
        self.store.flush_async().await?;
        if summary.is_none() {
            info!(
                done = report.jobs_done,
                jobs = report.jobs,
                "run interrupted; run again to resume"
            );
            return Ok(report);
        }
        // Read back as `nq-coord audit` reads it, so that the two agree.
        let store = Arc::clone(self.store);
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
        Ok(report)
    }
}

/// The ports of a session: bound before the data directory is opened, or
/// to be bound once it is known not to hold a finished run.
enum Binding<B> {
    Bound(Listeners),
    Later(B),
}

/// Creates or resumes the accepted run off the async threads (see
/// [`build`]). A shutdown during a long creation stops it between two
/// batches.
async fn prepare(
    config: &Config,
    accepted: Accepted,
    stop: &CancellationToken,
) -> Result<Ready> {
    let cfg = config.clone();
    let halt = Arc::new(AtomicBool::new(false));
    let watch = {
        let (halt, stop) = (Arc::clone(&halt), stop.clone());
        tokio::spawn(async move {
            stop.cancelled().await;
            halt.store(true, Ordering::Relaxed);
        })
    };
    let setup = tokio::task::spawn_blocking(move || build(&cfg, accepted, &halt)).await?;
    watch.abort();
    match setup {
        Err(Error::ShuttingDown) => Err(Error::CreationInterrupted),
        other => other,
    }
}

/// The session's tasks, one token per stage, cancelled in the shutdown
/// order: a single token would stop the commit loop while in-flight reports
/// still wait for it. The tracker holds the ticker, the HTTP port, the
/// backup socket and periodic backups, and the local threads' commit tasks,
/// which must end before the commit loop does.
struct Tasks {
    tracker: TaskTracker,
    committer: JoinHandle<Result<()>>,
    commit_token: CancellationToken,
    committer_done: bool,
    server: JoinHandle<Result<()>>,
    serve_token: CancellationToken,
    in_flight: InFlight,
    server_done: bool,
    health: tonic_health::server::HealthReporter,
    local: Option<JoinHandle<Result<()>>>,
    local_token: CancellationToken,
    tick_token: CancellationToken,
    progress: Option<tokio::sync::watch::Sender<crate::Progress>>,
}

impl Tasks {
    /// Starts the commit loop, the gRPC server, the local threads, the HTTP
    /// port and the ticker.
    async fn start(
        engine: &Arc<Engine>,
        commits: tokio::sync::mpsc::Receiver<commit::CommitRequest>,
        listener: TcpListener,
        config: &mut Config,
        (started, elapsed_before): (Instant, Duration),
    ) -> Result<Tasks> {
        let tracker = TaskTracker::new();
        let commit_token = CancellationToken::new();
        let committer = tokio::spawn(commit::commit_loop(
            Arc::clone(engine),
            commits,
            commit_token.clone(),
        ));
        let serve_token = CancellationToken::new();
        let guard = grpc::Guard {
            token: config.token.clone(),
            worker_tokens: config.worker_tokens.clone(),
            tls: config.tls.clone(),
            insecure_open_port: config.insecure_open_port,
        };
        let in_flight = InFlight::default();
        let (health, server) = grpc::start(
            Arc::clone(engine),
            listener,
            guard,
            in_flight.clone(),
            serve_token.clone(),
        )
        .await;
        // From here the health service says SERVING (`nq-coord health`).
        info!("serving workers");
        let local_token = CancellationToken::new();
        let local = (config.local_threads > 0).then(|| {
            tokio::spawn(local::run_local(
                Arc::clone(engine),
                config.local_threads,
                local_token.clone(),
                tracker.clone(),
            ))
        });
        let tick_token = CancellationToken::new();
        if let Some(listener) = config.http_listener.take() {
            // Stops with the ticker: it shows the run until the report is due.
            let (engine, token) = (Arc::clone(engine), tick_token.clone());
            let health = health.clone();
            tracker.spawn(async move {
                if let Err(e) = http::serve_apart(engine, listener, health, token).await {
                    error!(error = %e.chain(), "the HTTP port stopped");
                }
            });
        }
        spawn_backups(engine, config, &tracker, &tick_token)?;
        let progress = config.progress.take();
        let publish = Publish {
            progress: progress.clone(),
            log_every: config.progress_log,
            elapsed_before,
            started,
        };
        tracker.spawn(ticker(Arc::clone(engine), publish, tick_token.clone()));
        Ok(Tasks {
            tracker,
            committer,
            commit_token,
            committer_done: false,
            server,
            serve_token,
            in_flight,
            server_done: false,
            health,
            local,
            local_token,
            tick_token,
            progress,
        })
    }

    /// Waits for the end of the run (then lingers), the shutdown signal, or
    /// a failure: the commit loop and the server only end early on a fatal
    /// error (the store cannot flush, the listener broke), and then the
    /// session stops the same way. Returns the fatal error, if any.
    async fn wait(
        &mut self,
        engine: &Engine,
        stop: &CancellationToken,
        linger_cap: Duration,
    ) -> Option<Error> {
        let fatal_of = |r: std::result::Result<Result<()>, tokio::task::JoinError>| {
            r.map_err(Error::from)
                .and_then(|r| r)
                .err()
                .unwrap_or(Error::ShuttingDown)
        };
        tokio::select! {
            // Biased, so that completion wins over the local threads ending
            // because of it.
            biased;
            () = stop.cancelled() => { info!("shutdown requested"); None }
            () = engine.complete.cancelled() => {
                info!("every job is done");
                linger(engine, stop, linger_cap).await;
                None
            }
            r = &mut self.committer => { self.committer_done = true; Some(fatal_of(r)) }
            r = &mut self.server => { self.server_done = true; Some(fatal_of(r)) }
            // The local threads stop by themselves only when the run is
            // complete (handled above) or on an error, which would leave a
            // run without workers waiting forever.
            r = async { self.local.as_mut().expect("guarded by the condition").await },
                if self.local.is_some() => {
                self.local = None;
                r.map_err(Error::from).and_then(|r| r).err()
            }
        }
    }

    /// Steps 1 to 4 of the shutdown order. Returns the first fatal error.
    async fn shut_down(
        mut self,
        engine: &Engine,
        mut fatal: Option<Error>,
    ) -> Option<Error> {
        // 1. Stop granting leases.
        engine.close();
        grpc::not_serving(&mut self.health).await;
        // 2. Stop the local threads; they release their leases.
        self.local_token.cancel();
        if let Some(local) = self.local.take() {
            match local.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => error!(error = %e.chain(), "local threads failed"),
                Err(e) => error!(error = %e, "local threads panicked"),
            }
        }
        // 3. Let in-flight RPCs finish. The server's own graceful end also
        // waits for every client to acknowledge the close, which a half-open
        // connection never does: once no call is in flight, the connections
        // left are dropped (see `in_flight`).
        self.serve_token.cancel();
        if !self.server_done {
            tokio::select! {
                r = &mut self.server => match r {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => error!(error = %e, "gRPC server failed"),
                    Err(e) => error!(error = %e, "gRPC server panicked"),
                },
                () = self.in_flight.idle() => {
                    debug!("no call in flight; closing the connections left");
                    self.server.abort();
                }
                () = tokio::time::sleep(DRAIN_TIMEOUT) => {
                    warn!(
                        calls = self.in_flight.count(),
                        "in-flight requests did not finish in time; dropping them"
                    );
                    self.server.abort();
                }
            }
        }
        self.tick_token.cancel();
        self.tracker.close();
        self.tracker.wait().await;
        // 4. Drain the commit loop, then flush (the caller's).
        self.commit_token.cancel();
        if !self.committer_done {
            match (&mut self.committer).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => fatal = fatal.or(Some(e)),
                Err(e) => fatal = fatal.or(Some(e.into())),
            }
        }
        if let Err(e) = engine.write_records() {
            error!(error = %e.chain(), "cannot record leases");
        }
        fatal
    }
}

/// Starts the backup socket and, with `--backup-every`, the periodic
/// backups; both stop with the ticker.
fn spawn_backups(
    engine: &Arc<Engine>,
    config: &Config,
    tracker: &TaskTracker,
    token: &CancellationToken,
) -> Result<()> {
    if let Some((listener, path)) = backup_socket::bind(&config.data_dir) {
        let (engine, token) = (Arc::clone(engine), token.clone());
        tracker.spawn(backup_socket::serve(engine, listener, path, token));
    }
    if let Some(periodic) = &config.backup {
        std::fs::create_dir_all(&periodic.to).map_err(|source| Error::Io {
            context: format!("cannot create --backup-to {}", periodic.to.display()),
            source,
        })?;
        tracker.spawn(backup::every(
            Arc::clone(engine),
            periodic.every,
            periodic.to.clone(),
            token.clone(),
        ));
    }
    Ok(())
}

/// After the last job: keep answering until every recently seen worker was
/// told the run is complete, and every identity of an earlier session came
/// back to be told, or `cap` passes, or shutdown is requested.
async fn linger(engine: &Engine, stop: &CancellationToken, cap: Duration) {
    let until = Instant::now() + cap;
    loop {
        let untold = {
            let core = engine.core();
            core.workers().still_to_tell(Instant::now())
        };
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
