//! `nq-loadtest`: measures how many job results per second a real `nq-coord`
//! process makes durable, with a fleet of simulated workers on loopback, and
//! what that costs the coordinator in memory and disk, with faults injected.
//!
//! It starts `nq-coord --local-threads 0 --verify 0` on a big split (by
//! default N=22, `--split 1:2`, grouped into about a million jobs), then runs
//! `--workers` simulated workers over real gRPC, sharing `--connections`
//! HTTP/2 connections. Each registers, leases `--want` jobs per call and
//! reports synthetic results at once, without computing: ALL-ZERO COUNTS,
//! which are valid for the incomplete prefixes of such a split. That trick is
//! only sound with `--verify 0`, which the tool always passes to nq-coord:
//! with verification on, the coordinator would lease second copies of jobs to
//! check them, and those copies would inflate the rate and skew the plan (do
//! not pass another `--verify` after `--`). The totals of such a run are of
//! course zero.
//!
//! A completion is counted when the coordinator acknowledges it, which it
//! does only once the result is durable: with `--report batch` (the default)
//! a worker reports all its jobs in one `ReportBatch` call, with `--report
//! stream` one `Report` stream per job, as releases before `ReportBatch` did.
//!
//! Faults:
//!
//! * `--vanish SHARE --vanish-at T`: at T after the start of the measurement,
//!   that share of the simulated workers lease once more and disappear without
//!   reporting or releasing: their leases expire after the coordinator's
//!   lease TTL (`--lease-ttl`, passed on) and are reissued to the others.
//! * `--kill-at T1,T2,...` and `--kill-after N1,N2,...`: SIGKILL the
//!   coordinator at those times (after the start of the measurement) or
//!   durable-completion counts, and start it again at once on the same data
//!   directory and port. The workers see failed calls and retry them, as a
//!   real worker does: a report is sent again until it is answered, and a
//!   worker registers again only if the coordinator does not know its id.
//!   `leases_lost_to_restarts` counts the leases that a worker held across a
//!   kill and could not report after it: refused, dropped (its worker had to
//!   register again), or expired and done by another worker meanwhile. A
//!   report answered as a confirmation after a kill (which `--verify 0`
//!   otherwise never gives) is one of two things: another worker computed
//!   the job first (lost), or the worker's own report was made durable just
//!   before the kill, which cut its answer, and this is its retry (not
//!   lost: its copy counts). The answer cannot tell them apart, so after
//!   the run the tool reads those jobs from the store: a job whose copies
//!   come from two identities was computed twice (lost); one whose copies
//!   are all the worker's own is counted in
//!   `retries_of_reports_durable_before_a_kill`.
//!
//! Think time: `--think DURATION` makes each worker wait that long between
//! a lease and its report, as a real worker computes what it leased (the
//! default, 0, is the closed loop: every worker has a call in flight at all
//! times, so by Little's law its latency is bounded below by the workers
//! divided by the rate). The workers' first leases are spread evenly over
//! one think time, so that they do not all report in the same second.
//!
//! It reports completions per second (overall, and the median and lowest of
//! the per-second samples), p50/p90/p99/max of the Lease and report round
//! trips (from histograms, not means), the coordinator's peak RSS over its
//! whole life (VmHWM of every coordinator process, sampled from `/proc` every
//! 100 ms and just before each kill, creation included), the coordinator's
//! CPU time over the measurement and per 1,000 completions (without kills:
//! on a machine shared with other work that compares two builds better than
//! completions per second), the time to create
//! the run and to resume it after each kill, the lease expiries the
//! coordinators logged (vanished workers' leases, reissued), and the store's
//! size on disk (`du` of the data directory, after the coordinator stopped).
//! The coordinator runs with `RUST_LOG=info` (`--coord-log`), as in
//! production: at `debug` it logs a line per job.
//!
//! File descriptors: each connection costs one descriptor here and one in the
//! coordinator. The tool raises its soft `RLIMIT_NOFILE` to the hard limit
//! (the coordinator inherits it) and refuses to start when `--connections`
//! would not fit; by default it opens one connection per 100 workers (at
//! least 100), which keeps every connection below HTTP/2's usual limit of
//! concurrent streams. 50,000 workers need 500 connections, so about 600
//! descriptors per process, which the usual hard limits allow.
//!
//! ```text
//! cargo run --release -p nq-e2e --bin nq-loadtest -- --workers 1000 --duration 30s
//! # does this split give at least 10^7 jobs?
//! cargo run --release -p nq-e2e --bin nq-loadtest -- --n 22 --split 1:3 --plan
//! ```

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use clap::{Parser, ValueEnum};
use nq_e2e::{Coord, binary};
use nq_proto::pb::coordinator_client::CoordinatorClient;
use nq_proto::pb::{self, report_chunk::Body};
use tonic::Code;
use tonic::transport::{Channel, Endpoint};

mod fleet;
use fleet::{Fleet, Stats, simulate};

/// Load-tests a real nq-coord with simulated workers and reports durable job
/// completions per second, latencies, the coordinator's peak memory and its
/// store's size, optionally with vanishing workers and coordinator restarts.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Board size of the run.
    #[arg(long, default_value_t = 22)]
    n: u32,
    /// The coordinator's split, RING:EXTRA.
    #[arg(long, default_value = "1:2")]
    split: String,
    /// Target number of jobs, passed to `nq-coord --jobs` (sub-problems are
    /// grouped into about this many jobs; at least the number of sub-problems
    /// gives one sub-problem per job: see `--plan`).
    #[arg(long, default_value_t = 1_000_000)]
    jobs: u64,
    /// Print the number of sub-problems of `--n` and `--split` (the most jobs
    /// the split can make, `nq_core::split::split_len`) and exit.
    #[arg(long)]
    plan: bool,
    /// Simulated workers.
    #[arg(long, default_value_t = 1000)]
    workers: usize,
    /// HTTP/2 connections the workers share (each carries many calls)
    /// [default: one per 100 workers, at least 100].
    #[arg(long)]
    connections: Option<usize>,
    /// Jobs each worker asks for per Lease call (a worker with this many
    /// threads).
    #[arg(long, default_value_t = 2)]
    want: u32,
    /// How results are reported: `batch` (one ReportBatch call per lease) or
    /// `stream` (one Report stream per job).
    #[arg(long, value_enum, default_value_t = ReportMode::Batch)]
    report: ReportMode,
    /// How long to measure, after the workers have registered.
    #[arg(long, default_value = "30s")]
    duration: String,
    /// Time each worker spends "computing" a leased batch before it reports
    /// it (e.g. `20s`); 0 is the closed loop.
    #[arg(long, default_value = "0s")]
    think: String,
    /// Stop after this many durable completions instead.
    #[arg(long)]
    max_jobs: Option<u64>,
    /// The coordinator's lease lifetime (`nq-coord --lease-ttl`); short, to
    /// see vanished workers' jobs reissued soon.
    #[arg(long)]
    lease_ttl: Option<String>,
    /// Share of the workers, 0 to 1, that vanish at `--vanish-at`.
    #[arg(long, default_value_t = 0.0)]
    vanish: f64,
    /// When the vanishing workers vanish, after the measurement starts.
    #[arg(long, default_value = "5s")]
    vanish_at: String,
    /// SIGKILL the coordinator (and restart it) at these times after the
    /// measurement starts, comma-separated.
    #[arg(long, value_delimiter = ',')]
    kill_at: Vec<String>,
    /// SIGKILL the coordinator (and restart it) once this many completions
    /// are durable, comma-separated.
    #[arg(long, value_delimiter = ',')]
    kill_after: Vec<u64>,
    /// Pad each simulated worker's name to this many bytes (at most 256,
    /// the coordinator's limit), as a cluster's long host names would be.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u16).range(0..=256))]
    name_bytes: u16,
    /// The coordinator's `RUST_LOG` (`debug` logs a line per job, which
    /// costs it time).
    #[arg(long, default_value = "info")]
    coord_log: String,
    /// Data directory for the coordinator [default: a fresh temporary one].
    #[arg(long)]
    data: Option<PathBuf>,
    /// Extra flags passed to nq-coord as they are (after `--`).
    #[arg(last = true)]
    coord_args: Vec<String>,
}

/// How the simulated workers report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum ReportMode {
    /// One `ReportBatch` call for all the jobs of a lease.
    Batch,
    /// One `Report` stream per job.
    Stream,
}

/// What the coordinator logs (at warn) for each lease that expired.
const LEASE_EXPIRED: &str = "lease expired";

/// Peak memory of every coordinator process of the run, sampled.
#[derive(Debug, Default)]
struct MemWatch {
    /// The coordinator process now running.
    pid: Mutex<Option<u32>>,
    /// The largest VmHWM seen of any coordinator process, in KiB.
    peak_kib: AtomicU64,
    /// The latest VmRSS of the current one.
    rss_kib: AtomicU64,
}

impl MemWatch {
    /// Samples the current process; false once it has exited.
    fn sample(&self) -> bool {
        let Some(pid) = *self.pid.lock().unwrap_or_else(|e| e.into_inner()) else {
            return false;
        };
        match proc_status(pid) {
            Ok(Some(mem)) => {
                self.peak_kib.fetch_max(mem.hwm_kib, Ordering::Relaxed);
                self.rss_kib.store(mem.rss_kib, Ordering::Relaxed);
                true
            }
            _ => false,
        }
    }

    fn set(&self, pid: Option<u32>) {
        *self.pid.lock().unwrap_or_else(|e| e.into_inner()) = pid;
        self.sample();
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match run(Args::parse()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nq-loadtest: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// A kill of the coordinator, due at a time or a completion count.
#[derive(Clone, Copy, Debug)]
enum Kill {
    At(Duration),
    After(u64),
}

/// The run's settings parsed from `Args` and checked.
#[derive(Debug)]
struct Settings {
    duration: Duration,
    think: Duration,
    vanish_at: Duration,
    kills: Vec<Kill>,
    connections: usize,
    /// The open-file limit, raised.
    limit: u64,
}

impl Settings {
    /// Parses and checks the settings of `args`.
    fn of(args: &Args) -> Result<Settings> {
        let duration = nq_worker::parse_duration(&args.duration)?;
        let think = nq_worker::parse_duration(&args.think)?;
        let vanish_at = nq_worker::parse_duration(&args.vanish_at)?;
        ensure!(
            (0.0..=1.0).contains(&args.vanish),
            "--vanish {} is not a share: give a number from 0 to 1",
            args.vanish
        );
        ensure!(
            args.want > 0,
            "--want 0 would lease nothing: give 1 or more"
        );
        let mut kills: Vec<Kill> = args
            .kill_at
            .iter()
            .map(|t| nq_worker::parse_duration(t).map(Kill::At))
            .collect::<Result<_, _>>()?;
        kills.extend(args.kill_after.iter().map(|&n| Kill::After(n)));
        let connections = args
            .connections
            .unwrap_or_else(|| args.workers.div_ceil(100).max(100))
            .max(1);
        let limit = raise_fd_limit()?;
        // Sockets, plus sled's files, pipes and the like.
        let needed = connections as u64 + 256;
        ensure!(
            needed <= limit,
            "{connections} connections need about {needed} open files in this process \
             and in the coordinator, but the hard limit is {limit}: raise it (`ulimit -Hn \
             {needed}` as root, or in /etc/security/limits.conf) or pass fewer \
             --connections"
        );
        Ok(Settings {
            duration,
            think,
            vanish_at,
            kills,
            connections,
            limit,
        })
    }
}

/// The coordinator's flags for a run of `args`.
fn coord_flags(args: &Args) -> Vec<String> {
    let mut flags: Vec<String> = [
        "--n",
        &args.n.to_string(),
        "--split",
        &args.split,
        "--jobs",
        &args.jobs.to_string(),
        "--local-threads",
        "0",
        // The all-zero results are only sound without verification.
        "--verify",
        "0",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    if let Some(ttl) = &args.lease_ttl {
        flags.extend(["--lease-ttl".to_owned(), ttl.clone()]);
    }
    flags.extend(args.coord_args.iter().cloned());
    flags
}

/// Samples the coordinator's memory every 100 ms until aborted.
fn spawn_sampler(mem: &Arc<MemWatch>) -> tokio::task::JoinHandle<()> {
    let mem = Arc::clone(mem);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        loop {
            tick.tick().await;
            mem.sample();
        }
    })
}

/// A coordinator started and its run set up.
struct Started {
    coord: Coord,
    /// From the start to `data directory ready`.
    setup: Duration,
    jobs: u64,
    subproblems: Option<u64>,
    /// The peak RSS during setup, in KiB.
    setup_peak_kib: u64,
}

/// Starts the coordinator on `dir` with `flags` and `env`, watched by
/// `mem`, and waits until its run is set up.
async fn start(
    dir: &Path,
    flags: &[&str],
    env: &[(&str, &str)],
    mem: &MemWatch,
) -> Result<Started> {
    let started = Instant::now();
    let mut coord = Coord::start_with_env(dir, "127.0.0.1:0", flags, env).await?;
    mem.set(coord.proc.pid());
    // The coordinator listens at once and creates (or resumes) the run after.
    coord.proc.line_containing("data directory ready").await?;
    let setup = started.elapsed();
    let created = coord
        .proc
        .lines_containing("created run")
        .into_iter()
        .chain(coord.proc.lines_containing("resuming run"))
        .next()
        .context("neither `created run` nor `resuming run` in the log")?;
    let jobs: u64 = field(&created, "jobs").context("no job count in the log")?;
    let subproblems: Option<u64> = field(&created, "subproblems");
    mem.sample();
    let setup_peak_kib = mem.peak_kib.load(Ordering::Relaxed);
    eprintln!(
        "coordinator on {} ready after {setup:.2?}: {jobs} jobs, peak RSS {} MiB",
        coord.addr,
        setup_peak_kib / 1024
    );
    Ok(Started {
        coord,
        setup,
        jobs,
        subproblems,
        setup_peak_kib,
    })
}

/// Opens `connections` channels to `addr`.
async fn connect(addr: SocketAddr, connections: usize) -> Result<Vec<Channel>> {
    let endpoint = Endpoint::from_shared(format!("http://{addr}"))?
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(10));
    let mut channels = vec![];
    for _ in 0..connections {
        channels.push(endpoint.connect().await.context("cannot connect")?);
    }
    Ok(channels)
}

/// Spawns the `workers` simulated workers of `fleet` over `channels`, the
/// first `vanishing` of them to vanish, and waits until all registered.
async fn launch(
    workers: usize,
    vanishing: usize,
    channels: &[Channel],
    fleet: &Arc<Fleet>,
) -> tokio::task::JoinSet<Result<()>> {
    let registered = Arc::new(tokio::sync::Barrier::new(workers + 1));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..workers {
        let channel = channels[i % channels.len()].clone();
        let (fleet, registered) = (Arc::clone(fleet), Arc::clone(&registered));
        // Workers take the connections in turn, so the vanishing ones are
        // spread over them.
        let vanishes = i < vanishing;
        tasks.spawn(async move {
            let r = simulate(i, channel, &fleet, &registered, vanishes).await;
            if let Err(e) = &r {
                eprintln!("worker {i}: {e:#}");
            }
            r
        });
    }
    registered.wait().await;
    tasks
}

/// What the measurement needs besides the coordinator and the workers.
struct Measuring<'a> {
    args: &'a Args,
    settings: &'a Settings,
    fleet: &'a Fleet,
    mem: &'a MemWatch,
    dir: &'a Path,
    flags: &'a [&'a str],
    env: &'a [(&'a str, &'a str)],
    /// Workers that vanish at `--vanish-at`.
    vanishing: usize,
    /// When the measurement began, and the completions before it.
    t0: Instant,
    base: u64,
}

/// What the measurement saw.
struct Measured {
    /// Completions in each second.
    per_second: Vec<u64>,
    restarts: Vec<serde_json::Value>,
    /// Lease expiries logged by the coordinators killed so far.
    expiries: usize,
    /// The coordinator finished the run before the measurement's end.
    finished: bool,
}

/// Measures until `--duration` (or `--max-jobs`, or the run's end): every
/// 100 ms the kills and vanishing due, every second the rate.
async fn measure(
    m: &Measuring<'_>,
    coord: &mut Coord,
    tasks: &tokio::task::JoinSet<Result<()>>,
) -> Result<Measured> {
    let (stats, addr) = (&m.fleet.stats, coord.addr);
    let mut out = Measured {
        per_second: vec![],
        restarts: vec![],
        expiries: 0,
        finished: false,
    };
    let mut last = 0;
    let mut pending_kills: VecDeque<Kill> = m.settings.kills.clone().into();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let mut ticks = 0u64;
    loop {
        tick.tick().await;
        ticks += 1;
        let now = stats.completions.load(Ordering::Relaxed) - m.base;
        if !m.fleet.vanish_now.load(Ordering::Relaxed)
            && m.vanishing > 0
            && m.t0.elapsed() >= m.settings.vanish_at
        {
            let at = m.t0.elapsed().as_secs_f64();
            eprintln!("t={at:.1}s {} workers vanish", m.vanishing);
            m.fleet.vanish_now.store(true, Ordering::Relaxed);
        }
        let due = pending_kills.iter().position(|k| match *k {
            Kill::At(t) => m.t0.elapsed() >= t,
            Kill::After(c) => now >= c,
        });
        if let Some(i) = due {
            pending_kills.remove(i);
            out.expiries += kill(m, coord, addr, now, &mut out.restarts).await?;
        }
        if !ticks.is_multiple_of(10) {
            continue;
        }
        out.per_second.push(now - last);
        last = now;
        // A coordinator that finished the run before `--duration` has exited
        // (a zombie has no memory lines): the measurement ends there.
        if !m.mem.sample() {
            eprintln!("the coordinator finished the run; measuring up to here");
            out.finished = true;
            break;
        }
        eprintln!(
            "t={:>3}s completions/s={:>6} total={:>9} rss={} MiB peak={} MiB",
            out.per_second.len(),
            out.per_second.last().unwrap_or(&0),
            now,
            m.mem.rss_kib.load(Ordering::Relaxed) / 1024,
            m.mem.peak_kib.load(Ordering::Relaxed) / 1024
        );
        let done = m.args.max_jobs.is_some_and(|c| now >= c);
        if m.t0.elapsed() >= m.settings.duration || done {
            break;
        }
        if tasks.is_empty() {
            bail!("every simulated worker stopped");
        }
    }
    Ok(out)
}

/// Kills the coordinator after `now` completions and restarts it on
/// `addr`, noting the restart in `restarts`. Returns the lease expiries the
/// killed one logged.
async fn kill(
    m: &Measuring<'_>,
    coord: &mut Coord,
    addr: SocketAddr,
    now: u64,
    restarts: &mut Vec<serde_json::Value>,
) -> Result<usize> {
    m.mem.sample();
    let at = m.t0.elapsed();
    coord.proc.kill().await?;
    m.fleet.kills.fetch_add(1, Ordering::Relaxed);
    m.mem.set(None);
    let restarting = Instant::now();
    let expiries = coord.proc.lines_containing(LEASE_EXPIRED).len();
    *coord = restart(m.dir, addr, m.flags, m.env).await?;
    m.mem.set(coord.proc.pid());
    coord.proc.line_containing("data directory ready").await?;
    let ready = restarting.elapsed();
    eprintln!(
        "t={:.1}s coordinator killed after {now} completions; resumed in {ready:.2?}",
        at.as_secs_f64()
    );
    restarts.push(serde_json::json!({
        "at_seconds": at.as_secs_f64(),
        "completions_before": now,
        "resume_seconds": ready.as_secs_f64(),
    }));
    Ok(expiries)
}

/// Asks the coordinator to stop as an operator would (unless it `finished`
/// and exited), then makes sure. Returns how long it took.
async fn stop(coord: &mut Coord, finished: bool) -> Result<Duration> {
    let stopping = Instant::now();
    if !finished {
        coord.proc.terminate()?;
    }
    let exited = tokio::time::timeout(Duration::from_secs(60), coord.proc.wait()).await;
    if exited.is_err() {
        eprintln!("coordinator still running 60 s after SIGTERM; killing it");
        coord.proc.kill().await?;
    }
    Ok(stopping.elapsed())
}

/// The coordinator's own count of settled jobs, unless it `finished` (and
/// exited).
async fn status(channel: &Channel, finished: bool) -> Option<pb::StatusResponse> {
    if finished {
        return None;
    }
    CoordinatorClient::new(channel.clone())
        .max_decoding_message_size(nq_proto::MAX_MESSAGE_BYTES)
        .status(pb::StatusRequest {})
        .await
        .ok()
        .map(tonic::Response::into_inner)
}

/// Counts the reports that were durable before a kill and sent again
/// after it (the coordinator computed them twice), from the store in `dir`.
fn retries_after_kills(stats: &Stats, dir: &Path) -> Result<u64> {
    let confirmed = std::mem::take(
        &mut *(stats.confirmed_after_kill.lock())
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    if confirmed.is_empty() {
        return Ok(0);
    }
    let (twice, retries) = computed_twice(dir, &confirmed)?;
    stats.lost_to_restarts.fetch_add(twice, Ordering::Relaxed);
    Ok(retries)
}

/// What the run measured, besides the fleet's counters, for its summary.
struct Totals {
    /// Seconds measured and completions in them.
    elapsed: Duration,
    total: u64,
    coord_cpu: Option<f64>,
    shutdown: Duration,
    retries: u64,
    jobs_done: Option<u64>,
    store_bytes: u64,
}

/// The run's summary, as printed.
fn summary(
    args: &Args,
    settings: &Settings,
    started: &Started,
    measured: &mut Measured,
    fleet: &Fleet,
    t: &Totals,
    peak_kib: u64,
) -> serde_json::Value {
    let (stats, think) = (&fleet.stats, settings.think);
    let per_second = &mut measured.per_second;
    // With a think time, the first one passes before any report: the
    // steady state is the seconds after it.
    let warm = (think.as_secs_f64().ceil() as usize + 1).min(per_second.len());
    let mut steady = per_second[if think.is_zero() { 0 } else { warm }..].to_vec();
    steady.sort_unstable();
    let steady_median = steady.get(steady.len() / 2).copied();
    per_second.sort_unstable();
    let median = per_second.get(per_second.len() / 2).copied();
    let batches = stats.batches.load(Ordering::Relaxed);
    let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
    serde_json::json!({
        "n": args.n,
        "split": args.split,
        "workers": args.workers,
        "connections": settings.connections,
        "want": args.want,
        "think_seconds": think.as_secs_f64(),
        "report": format!("{:?}", args.report).to_lowercase(),
        "jobs": started.jobs,
        "subproblems": started.subproblems,
        "setup_seconds": started.setup.as_secs_f64(),
        "setup_peak_rss_mib": started.setup_peak_kib as f64 / 1024.0,
        "shutdown_seconds": t.shutdown.as_secs_f64(),
        "seconds": t.elapsed.as_secs_f64(),
        "completions": t.total,
        "completions_per_second": t.total as f64 / t.elapsed.as_secs_f64(),
        "median_per_second": median,
        "median_per_second_after_first_think": steady_median,
        "min_per_second": per_second.first(),
        "lease_latency": stats.lease_latency.summary(),
        "report_latency": stats.report_latency.summary(),
        "jobs_per_batch": if batches > 0 {
            Some(load(&stats.batch_items) as f64 / batches as f64)
        } else {
            None
        },
        "leases": load(&stats.leases),
        "empty_leases": load(&stats.empty_leases),
        "errors": load(&stats.errors),
        "refused_reports": load(&stats.refused),
        "leases_lost_to_restarts": load(&stats.lost_to_restarts),
        "retries_of_reports_durable_before_a_kill": t.retries,
        "conflicts": load(&stats.conflicts),
        "registrations_again": load(&stats.registrations),
        "vanished_workers": load(&stats.vanished),
        "abandoned_jobs": load(&stats.abandoned),
        "lease_expiries": measured.expiries,
        "jobs_done": t.jobs_done,
        "restarts": measured.restarts,
        "coord_peak_rss_mib": peak_kib as f64 / 1024.0,
        "coord_cpu_seconds": t.coord_cpu,
        "coord_cpu_ms_per_1000_completions":
            t.coord_cpu.map(|c| c * 1e6 / t.total.max(1) as f64),
        "store_bytes": t.store_bytes,
        "store_mib": t.store_bytes as f64 / (1024.0 * 1024.0),
    })
}

async fn run(args: Args) -> Result<()> {
    if args.plan {
        return plan(&args);
    }
    let settings = Settings::of(&args)?;
    let tmp = tempfile::tempdir()?;
    let dir = args.data.clone().unwrap_or_else(|| tmp.path().join("run"));
    let coord_bin = binary("nq-coord")?;
    eprintln!(
        "coordinator: {}; open-file limit {}, {} connections",
        coord_bin.display(),
        settings.limit,
        settings.connections
    );
    let flags = coord_flags(&args);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mem = Arc::new(MemWatch::default());
    let sampler = spawn_sampler(&mem);
    let env = [("RUST_LOG", args.coord_log.as_str()), ("NO_COLOR", "1")];
    let started_at = Instant::now();
    let mut started = start(&dir, &flags, &env, &mem).await?;
    let channels = connect(started.coord.addr, settings.connections).await?;
    let fleet = Arc::new(Fleet {
        stats: Stats::new(),
        stop: AtomicBool::new(false),
        vanish_now: AtomicBool::new(false),
        want: args.want,
        mode: args.report,
        kills: AtomicU64::new(0),
        think: settings.think,
        workers: args.workers,
        name_bytes: args.name_bytes.into(),
    });
    let vanishing = (args.workers as f64 * args.vanish).round() as usize;
    let mut tasks = launch(args.workers, vanishing, &channels, &fleet).await;
    let t0 = Instant::now();
    let stats = &fleet.stats;
    let base = stats.completions.load(Ordering::Relaxed);
    // The coordinator's CPU time over the measurement: on a machine shared
    // with other work, CPU per completion compares builds better than
    // completions per second.
    let cpu_start = started.coord.proc.pid().and_then(cpu_seconds);
    eprintln!(
        "{} workers registered after {:.2?}",
        args.workers,
        started_at.elapsed()
    );
    let measuring = Measuring {
        args: &args,
        settings: &settings,
        fleet: &fleet,
        mem: &mem,
        dir: &dir,
        flags: &flags,
        env: &env,
        vanishing,
        t0,
        base,
    };
    let mut measured = measure(&measuring, &mut started.coord, &tasks).await?;
    let coord = &mut started.coord;
    let elapsed = t0.elapsed();
    let total = stats.completions.load(Ordering::Relaxed) - base;
    // Only one process's time is known: none after a kill.
    let coord_cpu = match (cpu_start, coord.proc.pid().and_then(cpu_seconds)) {
        (Some(a), Some(b)) if fleet.kills.load(Ordering::Relaxed) == 0 => Some(b - a),
        _ => None,
    };
    fleet.stop.store(true, Ordering::Relaxed);
    while tasks.join_next().await.is_some() {}
    let status = status(&channels[0], measured.finished).await;
    let shutdown = stop(coord, measured.finished).await?;
    sampler.abort();
    measured.expiries += coord.proc.lines_containing(LEASE_EXPIRED).len();
    let store_bytes = du(&dir)?;
    eprintln!("coordinator stopped in {shutdown:.2?}");
    let retries = retries_after_kills(stats, &dir)?;
    let totals = Totals {
        elapsed,
        total,
        coord_cpu,
        shutdown,
        retries,
        jobs_done: status.as_ref().map(|s| s.jobs_done),
        store_bytes,
    };
    let peak_kib = mem.peak_kib.load(Ordering::Relaxed);
    let summary = summary(
        &args,
        &settings,
        &started,
        &mut measured,
        &fleet,
        &totals,
        peak_kib,
    );
    println!("{}", serde_json::to_string_pretty(&summary)?);
    Ok(())
}

/// `--plan`: the number of sub-problems of the split, the most jobs a run of
/// it can have.
fn plan(args: &Args) -> Result<()> {
    let board = nq_core::Board::new(u64::from(args.n))
        .with_context(|| format!("--n {} is not a board size", args.n))?;
    let (ring, extra) = args
        .split
        .split_once(':')
        .and_then(|(r, e)| Some((r.parse().ok()?, e.parse().ok()?)))
        .with_context(|| {
            format!("--split {:?} is not RING:EXTRA, such as 1:2", args.split)
        })?;
    let spec = nq_core::split::SplitSpec::new(ring, extra)
        .with_context(|| format!("--split {} is out of range", args.split))?;
    let t = Instant::now();
    let subproblems = nq_core::split::split_len(board, spec);
    println!(
        "n={} split={} subproblems={subproblems} (counted in {:.2?}): --jobs {} gives \
         {} jobs",
        args.n,
        args.split,
        t.elapsed(),
        args.jobs,
        args.jobs.min(subproblems)
    );
    Ok(())
}

/// Starts the coordinator again on `dir` and the same address. The port was
/// the killed process's a moment ago; binding it can fail briefly while the
/// kernel lets go of it, so a few tries are made.
async fn restart(
    dir: &Path,
    addr: SocketAddr,
    flags: &[&str],
    env: &[(&str, &str)],
) -> Result<Coord> {
    let mut tries = 0;
    loop {
        match Coord::start_with_env(dir, &addr.to_string(), flags, env).await {
            Ok(c) => return Ok(c),
            Err(e) if tries < 20 => {
                tries += 1;
                eprintln!("restart on {addr} failed ({e:#}); trying again");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e.context("cannot restart the coordinator")),
        }
    }
}

/// Raises the soft limit on open files to the hard limit (children inherit
/// it) and returns it.
fn raise_fd_limit() -> Result<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write `lim`.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            bail!("getrlimit: {}", std::io::Error::last_os_error());
        }
        if lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                bail!("setrlimit: {}", std::io::Error::last_os_error());
            }
        }
    }
    Ok(lim.rlim_cur)
}

/// Reads the copies of `jobs` (each answered as a confirmation after a
/// kill) from the stopped run's store in `dir`: returns how many were
/// computed by two identities (a lease lost to the restart) and how many
/// hold only one identity's copies (the retry of a report made durable
/// before the kill). One read per job, not the audit's scan of the whole
/// store: at 10^8 jobs that scan took a quarter of an hour.
fn computed_twice(dir: &Path, jobs: &[u64]) -> Result<(u64, u64)> {
    let store = nq_store::Store::open(dir, &nq_store::StoreOptions::default())
        .with_context(|| {
            format!("cannot open the stopped run's store in {}", dir.display())
        })?;
    let wanted: std::collections::BTreeSet<u64> = jobs.iter().copied().collect();
    let (mut twice, mut retries) = (0, 0);
    for &job in &wanted {
        let copies = store
            .scanned_job(nq_store::JobId(job))
            .with_context(|| format!("cannot read job {job}"))?
            .into_copies();
        ensure!(
            !copies.is_empty(),
            "job {job}, confirmed after a kill, has no stored copy"
        );
        let identities: std::collections::HashSet<&str> =
            copies.iter().map(|c| c.identity.as_str()).collect();
        if identities.len() > 1 {
            twice += 1;
        } else {
            retries += 1;
        }
    }
    Ok((twice, retries))
}

/// Bytes on disk under `dir`, as `du` counts them (allocated blocks).
fn du(dir: &Path) -> Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d)
            .with_context(|| format!("cannot list {}", d.display()))?
        {
            let entry = entry?;
            let meta = entry.metadata()?;
            if meta.is_dir() {
                stack.push(entry.path());
            } else {
                total += meta.blocks() * 512;
            }
        }
    }
    Ok(total)
}

/// The value of `name=VALUE` in a log line.
fn field<T: std::str::FromStr>(line: &str, name: &str) -> Option<T> {
    nq_e2e::log_field(line, name).and_then(|v| v.parse().ok())
}

/// The CPU time (user and system, all threads) a live process has used so
/// far, from `/proc/<pid>/stat`; `None` when it cannot be read.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces: count from the `)` that
    // ends it. utime and stime are fields 14 and 15.
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    // Linux reports them in USER_HZ, 100 per second on every architecture
    // it exports to user space.
    Some((utime + stime) as f64 / 100.0)
}

/// Resident memory of a process, from `/proc/<pid>/status`.
#[derive(Debug)]
struct Mem {
    rss_kib: u64,
    /// The peak resident set ("high water mark").
    hwm_kib: u64,
}

/// `None` once the process has exited (a zombie keeps its status file but no
/// memory lines).
fn proc_status(pid: u32) -> Result<Option<Mem>> {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return Ok(None);
    };
    let exited = text
        .lines()
        .any(|l| l.starts_with("State:") && l.contains('Z'));
    if exited {
        return Ok(None);
    }
    let field = |name: &str| -> Result<u64> {
        let line = text
            .lines()
            .find(|l| l.starts_with(name))
            .with_context(|| format!("no {name} in /proc/{pid}/status"))?;
        Ok(line[name.len()..]
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()?)
    };
    Ok(Some(Mem {
        rss_kib: field("VmRSS:")?,
        hwm_kib: field("VmHWM:")?,
    }))
}
