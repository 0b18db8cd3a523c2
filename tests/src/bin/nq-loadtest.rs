//! `nq-loadtest`: measures how many job results per second a real `nq-coord`
//! process makes durable, with a fleet of simulated workers on loopback.
//!
//! It starts `nq-coord --local-threads 0` on a big split (by default N=22,
//! `--split 1:2`, grouped into about a million jobs), then runs `--workers` simulated
//! workers over real gRPC. Each registers, leases jobs and reports synthetic
//! results at once, without computing: all-zero counts are valid for the
//! incomplete prefixes of such a split. A completion is counted when its
//! `ReportAck` arrives, which the coordinator sends only once the result is
//! durable. The tool samples the coordinator's memory from `/proc`, stops
//! everything after `--duration` (or `--max-jobs`), and prints the figures.
//!
//! ```text
//! cargo run --release -p nq-e2e --bin nq-loadtest -- --workers 1000 --duration 30s
//! ```

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use nq_e2e::{Coord, binary};
use nq_proto::pb::coordinator_client::CoordinatorClient;
use nq_proto::pb::{self, report_chunk::Body};
use tonic::Code;
use tonic::transport::{Channel, Endpoint};

/// Load-tests a real nq-coord with simulated workers and reports durable job
/// completions per second and the coordinator's peak memory.
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
    /// gives one sub-problem per job).
    #[arg(long, default_value_t = 1_000_000)]
    jobs: u64,
    /// Simulated workers.
    #[arg(long, default_value_t = 1000)]
    workers: usize,
    /// HTTP/2 connections the workers share (each carries many calls).
    #[arg(long, default_value_t = 100)]
    connections: usize,
    /// Jobs each worker asks for per Lease call.
    #[arg(long, default_value_t = 2)]
    want: u32,
    /// How long to measure, after the workers have registered.
    #[arg(long, default_value = "30s")]
    duration: String,
    /// Stop after this many durable completions instead.
    #[arg(long)]
    max_jobs: Option<u64>,
    /// Data directory for the coordinator [default: a fresh temporary one].
    #[arg(long)]
    data: Option<PathBuf>,
    /// Extra flags passed to nq-coord as they are (after `--`).
    #[arg(last = true)]
    coord_args: Vec<String>,
}

/// Counters shared by the simulated workers.
#[derive(Debug, Default)]
struct Stats {
    completions: AtomicU64,
    leases: AtomicU64,
    empty_leases: AtomicU64,
    errors: AtomicU64,
    conflicts: AtomicU64,
    /// Sum and count of report round trips, in microseconds.
    report_us: AtomicU64,
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

async fn run(args: Args) -> Result<()> {
    let duration = nq_worker::parse_duration(&args.duration)?;
    let tmp = tempfile::tempdir()?;
    let dir = args.data.clone().unwrap_or_else(|| tmp.path().join("run"));
    let coord_bin = binary("nq-coord")?;
    eprintln!("coordinator: {}", coord_bin.display());

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
    ];
    coord_flags.extend(args.coord_args.iter().map(String::as_str));
    let started = Instant::now();
    let mut coord = Coord::ephemeral(&dir, &coord_flags).await?;
    let pid = coord.proc.pid().context("coordinator exited")?;
    // The coordinator listens at once and creates the run's jobs after.
    let created = coord.proc.line_containing("created run").await?;
    let jobs: u64 = field(&created, "jobs").context("no job count in the log")?;
    let subproblems: u64 =
        field(&created, "subproblems").context("no sub-problem count")?;
    coord.proc.line_containing("data directory ready").await?;
    let setup = started.elapsed();
    let setup_mem = proc_status(pid)?.context("the coordinator exited during setup")?;
    let setup_hwm = setup_mem.hwm_kib;
    eprintln!(
        "coordinator pid {pid} on {} ready after {setup:.2?}: {jobs} jobs of \
         {subproblems} sub-problems, peak RSS {} MiB",
        coord.addr,
        setup_hwm / 1024
    );

    let endpoint = Endpoint::from_shared(format!("http://{}", coord.addr))?
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(10));
    let mut channels = vec![];
    for _ in 0..args.connections.max(1) {
        channels.push(endpoint.connect().await.context("cannot connect")?);
    }

    let stats = Arc::new(Stats::default());
    let stop = Arc::new(AtomicBool::new(false));
    let registered = Arc::new(tokio::sync::Barrier::new(args.workers + 1));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..args.workers {
        let channel = channels[i % channels.len()].clone();
        let (stats, stop, registered) = (stats.clone(), stop.clone(), registered.clone());
        let want = args.want;
        tasks.spawn(async move {
            let r = simulate(i, channel, want, &stats, &stop, &registered).await;
            if let Err(e) = &r {
                eprintln!("worker {i}: {e:#}");
            }
            r
        });
    }
    registered.wait().await;
    let t0 = Instant::now();
    let base = stats.completions.load(Ordering::Relaxed);
    eprintln!(
        "{} workers registered after {:.2?}",
        args.workers,
        started.elapsed()
    );

    // Sample once a second: per-second rates, and the coordinator's memory.
    let mut per_second = vec![];
    let mut last = base;
    let mut peak_rss_kib = 0;
    let mut last_mem = setup_mem;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = stats.completions.load(Ordering::Relaxed);
        per_second.push(now - last);
        last = now;
        // A coordinator that finished the run before `--duration` has exited
        // (a zombie has no memory lines): the measurement ends there.
        let Some(mem) = proc_status(pid)? else {
            eprintln!("the coordinator finished the run; measuring up to here");
            break;
        };
        peak_rss_kib = peak_rss_kib.max(mem.rss_kib);
        eprintln!(
            "t={:>3}s completions/s={:>6} total={:>8} rss={} MiB hwm={} MiB",
            per_second.len(),
            per_second.last().unwrap(),
            now - base,
            mem.rss_kib / 1024,
            mem.hwm_kib / 1024
        );
        last_mem = mem;
        let done = args.max_jobs.is_some_and(|m| now - base >= m);
        if t0.elapsed() >= duration || done {
            break;
        }
        if tasks.is_empty() {
            bail!("every simulated worker stopped");
        }
    }
    let elapsed = t0.elapsed();
    let total = stats.completions.load(Ordering::Relaxed) - base;
    let mem = proc_status(pid)?.unwrap_or(last_mem);
    let cpu = proc_cpu_seconds(pid)?;
    stop.store(true, Ordering::Relaxed);
    while tasks.join_next().await.is_some() {}

    // Ask the coordinator to stop as an operator would, then make sure.
    let stopping = Instant::now();
    coord.proc.terminate()?;
    let exited = tokio::time::timeout(Duration::from_secs(30), coord.proc.wait()).await;
    if exited.is_err() {
        eprintln!("coordinator still running 30 s after SIGTERM; killing it");
        coord.proc.kill().await?;
    }
    let shutdown = stopping.elapsed();
    eprintln!("coordinator stopped in {shutdown:.2?}");

    per_second.sort_unstable();
    let median = per_second[per_second.len() / 2];
    let reports = stats.completions.load(Ordering::Relaxed).max(1);
    let summary = serde_json::json!({
        "n": args.n,
        "split": args.split,
        "workers": args.workers,
        "connections": args.connections,
        "want": args.want,
        "jobs": jobs,
        "subproblems": subproblems,
        "setup_seconds": setup.as_secs_f64(),
        "setup_peak_rss_mib": setup_hwm as f64 / 1024.0,
        "shutdown_seconds": shutdown.as_secs_f64(),
        "seconds": elapsed.as_secs_f64(),
        "completions": total,
        "completions_per_second": total as f64 / elapsed.as_secs_f64(),
        "median_per_second": median,
        "min_per_second": per_second.first(),
        "mean_report_ms": stats.report_us.load(Ordering::Relaxed) as f64 / reports as f64 / 1000.0,
        "leases": stats.leases.load(Ordering::Relaxed),
        "empty_leases": stats.empty_leases.load(Ordering::Relaxed),
        "errors": stats.errors.load(Ordering::Relaxed),
        "conflicts": stats.conflicts.load(Ordering::Relaxed),
        "coord_peak_rss_mib": mem.hwm_kib.max(peak_rss_kib) as f64 / 1024.0,
        "coord_cpu_seconds": cpu,
    });
    println!("{}", serde_json::to_string_pretty(&summary)?);
    Ok(())
}

/// One simulated worker: register, then lease and report until stopped.
async fn simulate(
    i: usize,
    channel: Channel,
    want: u32,
    stats: &Stats,
    stop: &AtomicBool,
    registered: &tokio::sync::Barrier,
) -> Result<()> {
    let mut client = CoordinatorClient::new(channel)
        .max_decoding_message_size(nq_proto::MAX_MESSAGE_BYTES)
        .max_encoding_message_size(nq_proto::MAX_MESSAGE_BYTES);
    let register = || pb::RegisterRequest {
        protocol_version: nq_proto::PROTOCOL_VERSION,
        name: format!("sim-{i}"),
        threads: 1,
        program_version: "loadtest".into(),
    };
    let first = client.register(register()).await;
    registered.wait().await;
    let first = first.context("register")?.into_inner();
    let run_id = first.run.map(|r| r.run_id).unwrap_or_default();
    let mut worker_id = first.worker_id;
    while !stop.load(Ordering::Relaxed) {
        let lease = client
            .lease(pb::LeaseRequest {
                worker_id: worker_id.clone(),
                want,
                held: vec![],
            })
            .await;
        let lease = match lease {
            Ok(r) => r.into_inner(),
            Err(s) if s.code() == Code::FailedPrecondition => {
                worker_id = client.register(register()).await?.into_inner().worker_id;
                continue;
            }
            Err(s) => {
                stats.errors.fetch_add(1, Ordering::Relaxed);
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                eprintln!("lease: {s}");
                tokio::time::sleep(Duration::from_millis(100)).await;
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
        for job in lease.jobs {
            let zero = pb::SubCounts {
                count: Some(0u128.into()),
                fixed180: Some(0u128.into()),
                fixed90: Some(0u128.into()),
            };
            let chunk = pb::ReportChunk {
                worker_id: worker_id.clone(),
                job_id: job.job_id,
                lease_id: job.lease_id,
                body: Some(Body::Result(pb::JobResult {
                    counts: vec![zero; job.subproblems.len()],
                    nodes: 0,
                    solutions_sent: 0,
                    kernel: String::new(),
                })),
                run_id: run_id.clone(),
            };
            let sent = Instant::now();
            match client.report(tokio_stream_once(chunk)).await {
                Ok(ack) => {
                    let us = sent.elapsed().as_micros() as u64;
                    stats.report_us.fetch_add(us, Ordering::Relaxed);
                    if ack.get_ref().outcome() == pb::report_ack::Outcome::Conflict {
                        stats.conflicts.fetch_add(1, Ordering::Relaxed);
                    }
                    stats.completions.fetch_add(1, Ordering::Relaxed);
                }
                Err(s) => {
                    stats.errors.fetch_add(1, Ordering::Relaxed);
                    if !stop.load(Ordering::Relaxed) {
                        eprintln!("report: {s}");
                    }
                }
            }
        }
    }
    Ok(())
}

fn tokio_stream_once(
    chunk: pb::ReportChunk,
) -> impl tonic::IntoStreamingRequest<Message = pb::ReportChunk> {
    tonic::Request::new(tokio_stream::once(chunk))
}

/// The value of `name=VALUE` in a log line.
fn field<T: std::str::FromStr>(line: &str, name: &str) -> Option<T> {
    let key = format!("{name}=");
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&key))
        .and_then(|v| v.parse().ok())
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
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
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

/// User plus system CPU time of a process, from `/proc/<pid>/stat`.
fn proc_cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the parenthesised command name; utime and stime are the
    // 14th and 15th fields of the line, in clock ticks.
    let rest = &stat[stat.rfind(')').context("bad stat")? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>()? + fields[12].parse::<u64>()?;
    // SAFETY: sysconf has no memory effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Ok(ticks as f64 / hz)
}
