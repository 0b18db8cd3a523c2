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
//!   the run `nq-coord audit` reads the store: a job whose copies come from
//!   two identities was computed twice (lost); one whose copies are all the
//!   worker's own is counted in `retries_of_reports_durable_before_a_kill`.
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

/// A latency histogram in microseconds: log-linear buckets (16 per power of
/// two, so a quantile is within about 6% of the true value), lock-free, so
/// that tens of thousands of tasks can record into it.
#[derive(Debug)]
struct Histogram {
    buckets: Vec<AtomicU64>,
}

/// Sub-buckets per power of two, as a power of two.
const SUB_BITS: u32 = 4;

impl Histogram {
    fn new() -> Histogram {
        Histogram {
            buckets: (0..(64 << SUB_BITS)).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn index(us: u64) -> usize {
        if us < (1 << SUB_BITS) {
            return us as usize;
        }
        let exp = 63 - us.leading_zeros();
        let sub = (us >> (exp - SUB_BITS)) & ((1 << SUB_BITS) - 1);
        (((exp - SUB_BITS + 1) << SUB_BITS) as u64 + sub) as usize
    }

    /// The largest value of bucket `i`.
    fn upper(i: usize) -> u64 {
        let i = i as u64;
        if i < (1 << SUB_BITS) {
            return i;
        }
        let exp = (i >> SUB_BITS) + u64::from(SUB_BITS) - 1;
        let sub = i & ((1 << SUB_BITS) - 1);
        let low = (1u64 << exp) + (sub << (exp - u64::from(SUB_BITS)));
        low + (1 << (exp - u64::from(SUB_BITS))) - 1
    }

    fn record(&self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.buckets[Histogram::index(us)].fetch_add(1, Ordering::Relaxed);
    }

    fn count(&self) -> u64 {
        self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).sum()
    }

    /// The value below which a share `q` of the samples lie, in ms (the
    /// upper end of its bucket); `None` without samples.
    fn quantile_ms(&self, q: f64) -> Option<f64> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (i, b) in self.buckets.iter().enumerate() {
            seen += b.load(Ordering::Relaxed);
            if seen >= rank {
                return Some(Histogram::upper(i) as f64 / 1000.0);
            }
        }
        None
    }

    fn summary(&self) -> serde_json::Value {
        serde_json::json!({
            "count": self.count(),
            "p50_ms": self.quantile_ms(0.50),
            "p90_ms": self.quantile_ms(0.90),
            "p99_ms": self.quantile_ms(0.99),
            "max_ms": self.quantile_ms(1.0),
        })
    }
}

/// Counters shared by the simulated workers.
#[derive(Debug)]
struct Stats {
    /// Durable acknowledgements.
    completions: AtomicU64,
    leases: AtomicU64,
    empty_leases: AtomicU64,
    /// Calls that failed (network, coordinator down).
    errors: AtomicU64,
    /// Report items the coordinator refused (PERMISSION_DENIED).
    refused: AtomicU64,
    /// Leases held across a kill that could not be reported after it:
    /// refused, dropped, or done by another worker first (expired).
    lost_to_restarts: AtomicU64,
    /// Jobs of leases held across a kill whose report was answered as a
    /// confirmation: lost, or retried after a durable first send (see the
    /// module doc), told apart by the audit after the run.
    confirmed_after_kill: Mutex<Vec<u64>>,
    conflicts: AtomicU64,
    /// Registrations after the first (a restarted coordinator forgot them).
    registrations: AtomicU64,
    /// Workers that vanished, and the jobs they held.
    vanished: AtomicU64,
    abandoned: AtomicU64,
    /// ReportBatch calls (batch mode), and the items they carried.
    batches: AtomicU64,
    batch_items: AtomicU64,
    lease_latency: Histogram,
    /// One sample per report call (a batch, or one job's stream).
    report_latency: Histogram,
    /// Error lines printed so far (capped, so that 50,000 workers meeting a
    /// restart do not flood the terminal).
    printed: AtomicU64,
}

/// What the coordinator logs (at warn) for each lease that expired.
const LEASE_EXPIRED: &str = "lease expired";

/// Error lines printed at most.
const MAX_PRINTED: u64 = 20;

impl Stats {
    fn new() -> Stats {
        Stats {
            completions: AtomicU64::new(0),
            leases: AtomicU64::new(0),
            empty_leases: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            lost_to_restarts: AtomicU64::new(0),
            confirmed_after_kill: Mutex::new(Vec::new()),
            conflicts: AtomicU64::new(0),
            registrations: AtomicU64::new(0),
            vanished: AtomicU64::new(0),
            abandoned: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            batch_items: AtomicU64::new(0),
            lease_latency: Histogram::new(),
            report_latency: Histogram::new(),
            printed: AtomicU64::new(0),
        }
    }

    fn error(&self, what: &str, status: &tonic::Status, stop: &AtomicBool) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        if !stop.load(Ordering::Relaxed)
            && self.printed.fetch_add(1, Ordering::Relaxed) < MAX_PRINTED
        {
            eprintln!("{what}: {:?}: {}", status.code(), status.message());
        }
    }
}

/// What every simulated worker shares.
#[derive(Debug)]
struct Fleet {
    stats: Stats,
    /// Set when the measurement ends.
    stop: AtomicBool,
    /// Set at `--vanish-at`.
    vanish_now: AtomicBool,
    want: u32,
    mode: ReportMode,
    /// Kills of the coordinator so far: a lease taken before a kill that
    /// was not reported by the time this moved on crossed it.
    kills: AtomicU64,
    /// `--think`.
    think: Duration,
    /// `--workers`, to spread the first leases over one think time.
    workers: usize,
}

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

async fn run(args: Args) -> Result<()> {
    if args.plan {
        return plan(&args);
    }
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

    let tmp = tempfile::tempdir()?;
    let dir = args.data.clone().unwrap_or_else(|| tmp.path().join("run"));
    let coord_bin = binary("nq-coord")?;
    eprintln!(
        "coordinator: {}; open-file limit {limit}, {connections} connections",
        coord_bin.display()
    );

    let n = args.n.to_string();
    let target = args.jobs.to_string();
    let mut coord_flags = vec![
        "--n",
        &n,
        "--split",
        &args.split,
        "--jobs",
        &target,
        "--local-threads",
        "0",
        // The all-zero results are only sound without verification.
        "--verify",
        "0",
    ];
    if let Some(ttl) = &args.lease_ttl {
        coord_flags.extend(["--lease-ttl", ttl.as_str()]);
    }
    coord_flags.extend(args.coord_args.iter().map(String::as_str));

    let mem = Arc::new(MemWatch::default());
    let sampler = {
        let mem = Arc::clone(&mem);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            loop {
                tick.tick().await;
                mem.sample();
            }
        })
    };

    let env = [("RUST_LOG", args.coord_log.as_str()), ("NO_COLOR", "1")];
    let started = Instant::now();
    let mut coord =
        Coord::start_with_env(&dir, "127.0.0.1:0", &coord_flags, &env).await?;
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
    let addr = coord.addr;

    let endpoint = Endpoint::from_shared(format!("http://{addr}"))?
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(10));
    let mut channels = vec![];
    for _ in 0..connections {
        channels.push(endpoint.connect().await.context("cannot connect")?);
    }

    let fleet = Arc::new(Fleet {
        stats: Stats::new(),
        stop: AtomicBool::new(false),
        vanish_now: AtomicBool::new(false),
        want: args.want,
        mode: args.report,
        kills: AtomicU64::new(0),
        think,
        workers: args.workers,
    });
    let vanishing = (args.workers as f64 * args.vanish).round() as usize;
    let registered = Arc::new(tokio::sync::Barrier::new(args.workers + 1));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..args.workers {
        let channel = channels[i % channels.len()].clone();
        let (fleet, registered) = (Arc::clone(&fleet), Arc::clone(&registered));
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
    let t0 = Instant::now();
    let stats = &fleet.stats;
    let base = stats.completions.load(Ordering::Relaxed);
    // The coordinator's CPU time over the measurement: on a machine shared
    // with other work, CPU per completion compares builds better than
    // completions per second.
    let cpu_start = coord.proc.pid().and_then(cpu_seconds);
    eprintln!(
        "{} workers registered after {:.2?}",
        args.workers,
        started.elapsed()
    );

    // Every 100 ms: kills and vanishing due; every second: the rate.
    let mut per_second = vec![];
    let mut last = 0;
    let mut restarts: Vec<serde_json::Value> = vec![];
    let mut pending_kills: VecDeque<Kill> = kills.into();
    // Lease expiries logged by the coordinators killed so far.
    let mut expiries = 0;
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let mut ticks = 0u64;
    let mut finished = false;
    loop {
        tick.tick().await;
        ticks += 1;
        let now = stats.completions.load(Ordering::Relaxed) - base;
        if !fleet.vanish_now.load(Ordering::Relaxed)
            && vanishing > 0
            && t0.elapsed() >= vanish_at
        {
            eprintln!(
                "t={:.1}s {vanishing} workers vanish",
                t0.elapsed().as_secs_f64()
            );
            fleet.vanish_now.store(true, Ordering::Relaxed);
        }
        let due = pending_kills.iter().position(|k| match *k {
            Kill::At(t) => t0.elapsed() >= t,
            Kill::After(c) => now >= c,
        });
        if let Some(i) = due {
            pending_kills.remove(i);
            mem.sample();
            let at = t0.elapsed();
            coord.proc.kill().await?;
            fleet.kills.fetch_add(1, Ordering::Relaxed);
            mem.set(None);
            let restarting = Instant::now();
            expiries += coord.proc.lines_containing(LEASE_EXPIRED).len();
            coord = restart(&dir, addr, &coord_flags, &env).await?;
            mem.set(coord.proc.pid());
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
        }
        if !ticks.is_multiple_of(10) {
            continue;
        }
        per_second.push(now - last);
        last = now;
        // A coordinator that finished the run before `--duration` has exited
        // (a zombie has no memory lines): the measurement ends there.
        if !mem.sample() {
            eprintln!("the coordinator finished the run; measuring up to here");
            finished = true;
            break;
        }
        eprintln!(
            "t={:>3}s completions/s={:>6} total={:>9} rss={} MiB peak={} MiB",
            per_second.len(),
            per_second.last().unwrap_or(&0),
            now,
            mem.rss_kib.load(Ordering::Relaxed) / 1024,
            mem.peak_kib.load(Ordering::Relaxed) / 1024
        );
        let done = args.max_jobs.is_some_and(|m| now >= m);
        if t0.elapsed() >= duration || done {
            break;
        }
        if tasks.is_empty() {
            bail!("every simulated worker stopped");
        }
    }
    let elapsed = t0.elapsed();
    let total = stats.completions.load(Ordering::Relaxed) - base;
    // Only one process's time is known: none after a kill.
    let coord_cpu = match (cpu_start, coord.proc.pid().and_then(cpu_seconds)) {
        (Some(a), Some(b)) if fleet.kills.load(Ordering::Relaxed) == 0 => Some(b - a),
        _ => None,
    };
    fleet.stop.store(true, Ordering::Relaxed);
    while tasks.join_next().await.is_some() {}

    // The coordinator's own count of settled jobs.
    let status = if finished {
        None
    } else {
        CoordinatorClient::new(channels[0].clone())
            .max_decoding_message_size(nq_proto::MAX_MESSAGE_BYTES)
            .status(pb::StatusRequest {})
            .await
            .ok()
            .map(tonic::Response::into_inner)
    };

    // Ask the coordinator to stop as an operator would, then make sure.
    let stopping = Instant::now();
    if !finished {
        coord.proc.terminate()?;
    }
    let exited = tokio::time::timeout(Duration::from_secs(60), coord.proc.wait()).await;
    if exited.is_err() {
        eprintln!("coordinator still running 60 s after SIGTERM; killing it");
        coord.proc.kill().await?;
    }
    let shutdown = stopping.elapsed();
    sampler.abort();
    expiries += coord.proc.lines_containing(LEASE_EXPIRED).len();
    let store_bytes = du(&dir)?;
    eprintln!("coordinator stopped in {shutdown:.2?}");
    let confirmed = std::mem::take(
        &mut *(stats.confirmed_after_kill.lock())
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    let retries = if confirmed.is_empty() {
        0
    } else {
        let (twice, retries) = computed_twice(&coord_bin, &dir, &confirmed)?;
        stats.lost_to_restarts.fetch_add(twice, Ordering::Relaxed);
        retries
    };

    // With a think time, the first one passes before any report: the
    // steady state is the seconds after it.
    let warm = (think.as_secs_f64().ceil() as usize + 1).min(per_second.len());
    let mut steady = per_second[if think.is_zero() { 0 } else { warm }..].to_vec();
    steady.sort_unstable();
    let steady_median = steady.get(steady.len() / 2).copied();
    per_second.sort_unstable();
    let median = per_second.get(per_second.len() / 2).copied();
    let batches = stats.batches.load(Ordering::Relaxed);
    let summary = serde_json::json!({
        "n": args.n,
        "split": args.split,
        "workers": args.workers,
        "connections": connections,
        "want": args.want,
        "think_seconds": think.as_secs_f64(),
        "report": format!("{:?}", args.report).to_lowercase(),
        "jobs": jobs,
        "subproblems": subproblems,
        "setup_seconds": setup.as_secs_f64(),
        "setup_peak_rss_mib": setup_peak_kib as f64 / 1024.0,
        "shutdown_seconds": shutdown.as_secs_f64(),
        "seconds": elapsed.as_secs_f64(),
        "completions": total,
        "completions_per_second": total as f64 / elapsed.as_secs_f64(),
        "median_per_second": median,
        "median_per_second_after_first_think": steady_median,
        "min_per_second": per_second.first(),
        "lease_latency": stats.lease_latency.summary(),
        "report_latency": stats.report_latency.summary(),
        "jobs_per_batch": if batches > 0 {
            Some(stats.batch_items.load(Ordering::Relaxed) as f64 / batches as f64)
        } else {
            None
        },
        "leases": stats.leases.load(Ordering::Relaxed),
        "empty_leases": stats.empty_leases.load(Ordering::Relaxed),
        "errors": stats.errors.load(Ordering::Relaxed),
        "refused_reports": stats.refused.load(Ordering::Relaxed),
        "leases_lost_to_restarts": stats.lost_to_restarts.load(Ordering::Relaxed),
        "retries_of_reports_durable_before_a_kill": retries,
        "conflicts": stats.conflicts.load(Ordering::Relaxed),
        "registrations_again": stats.registrations.load(Ordering::Relaxed),
        "vanished_workers": stats.vanished.load(Ordering::Relaxed),
        "abandoned_jobs": stats.abandoned.load(Ordering::Relaxed),
        "lease_expiries": expiries,
        "jobs_done": status.as_ref().map(|s| s.jobs_done),
        "restarts": restarts,
        "coord_peak_rss_mib": mem.peak_kib.load(Ordering::Relaxed) as f64 / 1024.0,
        "coord_cpu_seconds": coord_cpu,
        "coord_cpu_ms_per_1000_completions":
            coord_cpu.map(|c| c * 1e6 / total.max(1) as f64),
        "store_bytes": store_bytes,
        "store_mib": store_bytes as f64 / (1024.0 * 1024.0),
    });
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

/// A registration request of simulated worker `i`.
fn register_request(i: usize, want: u32) -> pb::RegisterRequest {
    pb::RegisterRequest {
        protocol_version: nq_proto::PROTOCOL_VERSION,
        name: format!("sim-{i}"),
        threads: want,
        program_version: "loadtest".into(),
    }
}

/// A wait of 100 ms to 1 s, spread by worker, so that a fleet that meets a
/// restart does not come back in lockstep.
fn pause(i: usize, attempt: u32) -> Duration {
    let spread = (i as u64).wrapping_mul(2_654_435_761) % 400;
    Duration::from_millis((100 + spread) * u64::from(attempt.clamp(1, 2)))
}

/// Registers, retrying while the coordinator is down.
async fn register(
    i: usize,
    client: &mut CoordinatorClient<Channel>,
    fleet: &Fleet,
) -> Result<Option<(String, String)>> {
    let mut attempt = 0;
    loop {
        match client.register(register_request(i, fleet.want)).await {
            Ok(r) => {
                let r = r.into_inner();
                let run = r.run.map(|r| r.run_id).unwrap_or_default();
                return Ok(Some((r.worker_id, run)));
            }
            Err(s)
                if matches!(
                    s.code(),
                    Code::FailedPrecondition | Code::InvalidArgument
                ) =>
            {
                bail!("register refused: {s}")
            }
            Err(s) => {
                fleet.stats.error("register", &s, &fleet.stop);
                if fleet.stop.load(Ordering::Relaxed) {
                    return Ok(None);
                }
                attempt += 1;
                tokio::time::sleep(pause(i, attempt)).await;
            }
        }
    }
}

/// One simulated worker: register, then lease and report until stopped (or,
/// for a vanishing one, until it vanishes holding its last lease).
async fn simulate(
    i: usize,
    channel: Channel,
    fleet: &Fleet,
    registered: &tokio::sync::Barrier,
    vanishes: bool,
) -> Result<()> {
    let stats = &fleet.stats;
    let mut client = CoordinatorClient::new(channel)
        .max_decoding_message_size(nq_proto::MAX_MESSAGE_BYTES)
        .max_encoding_message_size(nq_proto::MAX_MESSAGE_BYTES);
    let first = register(i, &mut client, fleet).await;
    registered.wait().await;
    let Some((mut worker_id, mut run_id)) = first? else {
        return Ok(());
    };
    // The first leases spread over one think time.
    if !fleet.think.is_zero() {
        let offset = fleet.think.mul_f64(i as f64 / fleet.workers.max(1) as f64);
        if !think_for(fleet, offset).await {
            return Ok(());
        }
    }
    let mut failures = 0;
    while !fleet.stop.load(Ordering::Relaxed) {
        let sent = Instant::now();
        let lease = client
            .lease(pb::LeaseRequest {
                worker_id: worker_id.clone(),
                want: fleet.want,
                held: vec![],
            })
            .await;
        let lease = match lease {
            Ok(r) => {
                stats.lease_latency.record(sent.elapsed());
                failures = 0;
                r.into_inner()
            }
            Err(s) if s.code() == Code::FailedPrecondition => {
                // A restarted coordinator knows no worker.
                let Some((id, run)) = register(i, &mut client, fleet).await? else {
                    break;
                };
                stats.registrations.fetch_add(1, Ordering::Relaxed);
                (worker_id, run_id) = (id, run);
                continue;
            }
            Err(s) => {
                stats.error("lease", &s, &fleet.stop);
                failures += 1;
                tokio::time::sleep(pause(i, failures)).await;
                continue;
            }
        };
        stats.leases.fetch_add(1, Ordering::Relaxed);
        if lease.run_complete {
            break;
        }
        if lease.jobs.is_empty() {
            stats.empty_leases.fetch_add(1, Ordering::Relaxed);
            let wait = lease.retry_after_ms.clamp(10, 1000);
            tokio::time::sleep(Duration::from_millis(wait)).await;
            continue;
        }
        if vanishes && fleet.vanish_now.load(Ordering::Relaxed) {
            // Gone without a word: the leases run out at their deadline.
            stats.vanished.fetch_add(1, Ordering::Relaxed);
            stats
                .abandoned
                .fetch_add(lease.jobs.len() as u64, Ordering::Relaxed);
            return Ok(());
        }
        let held = Held {
            worker: i,
            kills: fleet.kills.load(Ordering::Relaxed),
        };
        if !think_for(fleet, fleet.think).await {
            break;
        }
        match fleet.mode {
            ReportMode::Batch => {
                report_batch(&mut client, fleet, &worker_id, &run_id, lease.jobs, held)
                    .await
            }
            ReportMode::Stream => {
                for job in lease.jobs {
                    report_stream(&mut client, fleet, &worker_id, &run_id, job, held)
                        .await;
                }
            }
        }
    }
    Ok(())
}

/// Waits `d` (the think time), in steps, so that the end of the measurement
/// is not kept waiting. False when the measurement ended meanwhile.
async fn think_for(fleet: &Fleet, d: Duration) -> bool {
    let end = Instant::now() + d;
    loop {
        if fleet.stop.load(Ordering::Relaxed) {
            return false;
        }
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return true;
        }
        tokio::time::sleep(left.min(Duration::from_millis(500))).await;
    }
}

/// Who holds a leased batch, and the kills counted when it was leased.
#[derive(Clone, Copy, Debug)]
struct Held {
    /// The simulated worker (for its retry pause).
    worker: usize,
    kills: u64,
}

impl Held {
    /// Counts `items` of this batch as lost to a restart, if a kill came
    /// after they were leased.
    fn lost(self, fleet: &Fleet, items: u64) {
        if items > 0 && fleet.kills.load(Ordering::Relaxed) > self.kills {
            fleet
                .stats
                .lost_to_restarts
                .fetch_add(items, Ordering::Relaxed);
        }
    }

    /// Notes `job` of this batch, answered as a confirmation, for the audit
    /// after the run, if a kill came after it was leased.
    fn confirmed(self, fleet: &Fleet, job: u64) {
        if fleet.kills.load(Ordering::Relaxed) > self.kills {
            (fleet.stats.confirmed_after_kill.lock())
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(job);
        }
    }
}

/// True for a failed call that a worker retries: the coordinator is down,
/// restarting or busy. Anything else is its answer.
fn retryable(s: &tonic::Status) -> bool {
    !matches!(
        s.code(),
        Code::PermissionDenied
            | Code::InvalidArgument
            | Code::FailedPrecondition
            | Code::Unauthenticated
    )
}

/// All-zero counts for `job`: valid for an incomplete prefix (see the module
/// documentation on `--verify 0`).
fn zero_result(job: &pb::Job) -> pb::JobResult {
    let zero = pb::SubCounts {
        count: Some(0u128.into()),
        fixed180: Some(0u128.into()),
        fixed90: Some(0u128.into()),
    };
    pb::JobResult {
        counts: vec![zero; job.subproblems.len()],
        nodes: 0,
        solutions_sent: 0,
        kernel: String::new(),
    }
}

/// Reports the jobs of one lease in one ReportBatch call, sent again until
/// it is answered (or the measurement ends).
async fn report_batch(
    client: &mut CoordinatorClient<Channel>,
    fleet: &Fleet,
    worker_id: &str,
    run_id: &str,
    jobs: Vec<pb::Job>,
    held: Held,
) {
    let stats = &fleet.stats;
    let request = pb::ReportBatchRequest {
        worker_id: worker_id.to_owned(),
        run_id: run_id.to_owned(),
        reports: jobs
            .iter()
            .map(|job| pb::JobReport {
                job_id: job.job_id,
                lease_id: job.lease_id,
                result: Some(zero_result(job)),
            })
            .collect(),
    };
    let mut failures = 0;
    loop {
        let sent = Instant::now();
        match client.report_batch(request.clone()).await {
            Ok(answer) => {
                stats.report_latency.record(sent.elapsed());
                let acks = answer.into_inner().acks;
                stats.batches.fetch_add(1, Ordering::Relaxed);
                stats
                    .batch_items
                    .fetch_add(acks.len() as u64, Ordering::Relaxed);
                let mut lost = 0;
                for ack in acks {
                    let job = ack.job_id;
                    if ack.code != Code::Ok as i32 {
                        stats.refused.fetch_add(1, Ordering::Relaxed);
                        lost += 1;
                        continue;
                    }
                    match ack.outcome() {
                        pb::report_ack::Outcome::Conflict => {
                            stats.conflicts.fetch_add(1, Ordering::Relaxed);
                        }
                        // Another worker did the job first, or this is the
                        // retry of a report made durable before a kill: the
                        // audit after the run tells.
                        pb::report_ack::Outcome::Confirmed => held.confirmed(fleet, job),
                        _ => {}
                    }
                    stats.completions.fetch_add(1, Ordering::Relaxed);
                }
                held.lost(fleet, lost);
                return;
            }
            Err(s) => {
                stats.error("report batch", &s, &fleet.stop);
                if !retryable(&s) {
                    let items = request.reports.len() as u64;
                    stats.refused.fetch_add(items, Ordering::Relaxed);
                    held.lost(fleet, items);
                    return;
                }
                if fleet.stop.load(Ordering::Relaxed) {
                    return;
                }
                failures += 1;
                tokio::time::sleep(pause(held.worker, failures)).await;
            }
        }
    }
}

/// Reports one job in one Report stream, sent again until it is answered
/// (or the measurement ends).
async fn report_stream(
    client: &mut CoordinatorClient<Channel>,
    fleet: &Fleet,
    worker_id: &str,
    run_id: &str,
    job: pb::Job,
    held: Held,
) {
    let stats = &fleet.stats;
    let chunk = pb::ReportChunk {
        worker_id: worker_id.to_owned(),
        job_id: job.job_id,
        lease_id: job.lease_id,
        body: Some(Body::Result(zero_result(&job))),
        run_id: run_id.to_owned(),
    };
    let mut failures = 0;
    loop {
        let sent = Instant::now();
        match client.report(tokio_stream::once(chunk.clone())).await {
            Ok(ack) => {
                stats.report_latency.record(sent.elapsed());
                match ack.get_ref().outcome() {
                    pb::report_ack::Outcome::Conflict => {
                        stats.conflicts.fetch_add(1, Ordering::Relaxed);
                    }
                    pb::report_ack::Outcome::Confirmed => {
                        held.confirmed(fleet, job.job_id)
                    }
                    _ => {}
                }
                stats.completions.fetch_add(1, Ordering::Relaxed);
                return;
            }
            Err(s) if !retryable(&s) => {
                stats.refused.fetch_add(1, Ordering::Relaxed);
                held.lost(fleet, 1);
                return;
            }
            Err(s) => {
                stats.error("report", &s, &fleet.stop);
                if fleet.stop.load(Ordering::Relaxed) {
                    return;
                }
                failures += 1;
                tokio::time::sleep(pause(held.worker, failures)).await;
            }
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

/// Reads `nq-coord audit` of the stopped run in `dir` and sorts `jobs`
/// (each answered as a confirmation after a kill): returns how many were
/// computed by two identities (a lease lost to the restart) and how many
/// hold only one identity's copies (the retry of a report made durable
/// before the kill).
fn computed_twice(coord_bin: &Path, dir: &Path, jobs: &[u64]) -> Result<(u64, u64)> {
    use std::io::BufRead;
    let wanted: std::collections::HashSet<u64> = jobs.iter().copied().collect();
    // Judged as the run was (`--verify 0`, which the tool always passes):
    // judged as `auto`, every job of a store that does not hold its share
    // waits for a check, and the audit's scheduler holds them all (at 10^8
    // jobs, more memory than the machine has).
    let mut child = std::process::Command::new(coord_bin)
        .args(["audit", "--verify", "0", "--data"])
        .arg(dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .context("cannot run nq-coord audit")?;
    let out = child.stdout.take().context("audit without stdout")?;
    let (mut twice, mut retries) = (0, 0);
    // CSV rows: job,…, with the copies' `identity:verdict` list, space
    // separated, in the 14th column.
    for line in std::io::BufReader::new(out).lines() {
        let line = line?;
        let mut cols = line.split(',');
        let Some(job) = cols.next().and_then(|j| j.parse::<u64>().ok()) else {
            continue; // a comment or the header
        };
        if !wanted.contains(&job) {
            continue;
        }
        let workers = cols.nth(12).unwrap_or("");
        let identities: std::collections::HashSet<&str> = workers
            .split(' ')
            .filter_map(|w| w.rsplit_once(':').map(|(identity, _)| identity))
            .collect();
        if identities.len() > 1 {
            twice += 1;
        } else {
            retries += 1;
        }
    }
    child.wait()?;
    ensure!(
        twice + retries == jobs.len() as u64,
        "the audit lists {} of the {} jobs confirmed after a kill",
        twice + retries,
        jobs.len()
    );
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_quantiles_are_within_a_bucket() {
        let h = Histogram::new();
        for us in 1..=10_000u64 {
            h.record(Duration::from_micros(us));
        }
        for (q, exact) in [(0.5, 5.0), (0.99, 9.9), (1.0, 10.0)] {
            let got = h.quantile_ms(q).unwrap();
            assert!(
                got >= exact && got <= exact * 1.07,
                "q={q}: {got} vs {exact}"
            );
        }
        for us in [0u64, 1, 15, 16, 17, 1000, 123_456_789] {
            let i = Histogram::index(us);
            assert!(Histogram::upper(i) >= us, "{us}");
            assert!(i == 0 || Histogram::upper(i - 1) < us, "{us}");
        }
    }
}
