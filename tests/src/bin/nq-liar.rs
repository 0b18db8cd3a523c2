//! `nq-liar`: a test double of a faulty worker. It speaks the real protocol
//! (`nq_proto::pb` over gRPC), registers under `--name`, leases jobs one at a
//! time, computes their true counts with `nq-core`, and reports a share of
//! them (`--lie-rate`) altered into wrong but plausible counts (see
//! `nq_e2e::client::lie`). Everything else about its reports is honest: its
//! own worker id, the job's lease, the run id of its registration, and the
//! kernel that counted.
//!
//! Output, for tests to wait on:
//!
//! * stdout, one line per acknowledged report:
//!   `reported job=J lease=L lied=true|false outcome=accepted|confirmed|conflict`;
//! * exit 0 when the coordinator says the run is complete;
//! * exit 3 with `nq-liar: refused: PERMISSION_DENIED: <message>` on stderr
//!   when the coordinator refuses its registration or a Lease with
//!   PERMISSION_DENIED (banned); a report refused so is dropped, as
//!   `nq-worker` drops it, because that refusal may be about the report (a
//!   copy under a lease that is no longer live) rather than the worker;
//! * exit 1 on any other failure.
//!
//! ```text
//! nq-liar --connect 127.0.0.1:50051 --name liar --lie-rate 1.0
//! ```
//!
//! `--token` (or `NQ_TOKEN`) presents a token as `nq-worker` does: the run's
//! shared one or a per-worker one. `--source` binds the source address of its
//! connection, so that liar processes on one machine call from different
//! addresses of it (issue 18, attack 1). The lies are deterministic (see
//! `lie`): two liars report the same wrong count for the same job, and so
//! agree with each other.
//!
//! A faulty GPU kernel (issue 24, item 6): `--report-kernel cuda` reports
//! every copy as `nq-worker --gpu` does, and `--lie-above SOLUTIONS` lies
//! only on jobs whose true count is at least that, as a kernel bug that
//! shows only on large searches (and passes the start-up self-test at
//! N = 12). Two such liars agree on every job, as two GPUs running one
//! buggy kernel would:
//!
//! ```text
//! nq-liar --connect 127.0.0.1:50051 --name gpu-a --report-kernel cuda --lie-above 2000
//! ```
//!
//! Two more adversaries of issue 18:
//!
//! * `--hoard`: registers `--registrations` times under one name, leases as
//!   many jobs as each registration is granted, heartbeats them forever and
//!   never reports. Prints `hoarding job=J lease=L` per lease it gets and
//!   `revoked lease=L` per lease the coordinator says it lost.
//! * `--stall`: in a `--solutions` run, leases a job, opens its Report
//!   stream with one true solution and then sends nothing, heartbeating the
//!   lease, until the coordinator ends the stream (`stream ended: CODE:
//!   MESSAGE`); then reports the job with count 0 under the same lease and
//!   prints `lie job=J outcome=…` or `lie refused: CODE: MESSAGE`, and waits
//!   for the end of the run.

use std::net::{IpAddr, SocketAddr};
use std::ops::ControlFlow;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Result, anyhow};
use clap::Parser;
use nq_e2e::client::{Dial, ProtocolWorker, lie, status_of};
use nq_e2e::rng::Rng;
use nq_proto::auth::Token;
use nq_proto::pb;
use nq_proto::pb::report_ack::Outcome;
use tokio_stream::StreamExt;
use tonic::Code;

/// The exit status when the coordinator refuses this worker
/// (PERMISSION_DENIED): distinct from success (0) and other failures (1).
const EXIT_REFUSED: u8 = 3;

/// A worker that reports wrong counts, for verification tests.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// The coordinator, HOST:PORT.
    #[arg(long, value_name = "HOST:PORT")]
    connect: SocketAddr,
    /// The name to register under.
    #[arg(long, default_value = "liar")]
    name: String,
    /// Call from this local address (one of this machine's): a second
    /// address of one machine looks like a second machine to a coordinator
    /// that knows workers by address. Default: the kernel picks.
    #[arg(long, value_name = "IP")]
    source: Option<IpAddr>,
    /// The token to present (`authorization: Bearer TOKEN`), as nq-worker's
    /// --token: the run's shared token or a per-worker one.
    #[arg(long, value_name = "TOKEN", env = "NQ_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Share of jobs reported with wrong counts, 0.0 to 1.0 (1.0 = every job).
    #[arg(long, value_name = "FRACTION", default_value_t = 1.0)]
    lie_rate: f64,
    /// Seed of the choice of jobs to lie on (only matters below 1.0).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Report this kernel name instead of the one that counted: `cuda`
    /// poses as `nq-worker --gpu`.
    #[arg(long, value_name = "NAME")]
    report_kernel: Option<String>,
    /// Lie only on jobs whose true count is at least this many solutions
    /// (a bug that shows only on large searches); 0: any job.
    #[arg(long, value_name = "SOLUTIONS", default_value_t = 0)]
    lie_above: u128,
    /// Hoard leases instead: never report, heartbeat forever.
    #[arg(long, conflicts_with = "stall")]
    hoard: bool,
    /// With --hoard: registrations to hoard under, all with --name.
    #[arg(long, default_value_t = 1, value_name = "N")]
    registrations: u32,
    /// Stall a report stream instead (a --solutions run).
    #[arg(long)]
    stall: bool,
}

/// How the liar ended.
enum End {
    Complete,
    Refused(tonic::Status),
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = Args::parse();
    if !(0.0..=1.0).contains(&args.lie_rate) {
        eprintln!(
            "nq-liar: error: --lie-rate {} is out of range; give a fraction from 0.0 to 1.0",
            args.lie_rate
        );
        return ExitCode::from(2);
    }
    let token = match args.token.as_deref().map(Token::new).transpose() {
        Ok(token) => token,
        Err(e) => {
            eprintln!("nq-liar: error: invalid --token (or NQ_TOKEN): {e}");
            return ExitCode::from(2);
        }
    };
    let dial = Dial {
        addr: args.connect,
        source: args.source,
        token,
    };
    let ended = if args.hoard {
        hoard(&args, &dial).await
    } else if args.stall {
        stall(&args, &dial).await
    } else {
        run(&args, &dial).await
    };
    match ended {
        Ok(End::Complete) => ExitCode::SUCCESS,
        Ok(End::Refused(status)) => {
            eprintln!("nq-liar: refused: PERMISSION_DENIED: {}", status.message());
            ExitCode::from(EXIT_REFUSED)
        }
        Err(e) => {
            eprintln!("nq-liar: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// A PERMISSION_DENIED status, if `e` carries one.
fn denied(e: &anyhow::Error) -> Option<tonic::Status> {
    status_of(e)
        .filter(|s| s.code() == Code::PermissionDenied)
        .cloned()
}

async fn run(args: &Args, dial: &Dial) -> Result<End> {
    let mut rng = Rng::new(args.seed);
    let mut w = match ProtocolWorker::register_via(dial, &args.name).await {
        Ok(w) => w,
        Err(e) => return denied(&e).map(End::Refused).ok_or(e),
    };
    eprintln!(
        "nq-liar: registered as {} in run {} (lie rate {})",
        w.id, w.run_id, args.lie_rate
    );
    // Consecutive failed calls; the coordinator vanishing for good (its run
    // over) must not keep the liar alive forever.
    let mut failures = 0u32;
    loop {
        let job = match w.lease_one().await {
            Ok(Some(job)) => job,
            Ok(None) => return Ok(End::Complete),
            Err(s) if s.code() == Code::PermissionDenied => return Ok(End::Refused(s)),
            Err(s) if s.code() == Code::FailedPrecondition => {
                // The coordinator restarted and forgot us: register again.
                w = ProtocolWorker::register_via(dial, &args.name).await?;
                continue;
            }
            Err(s) => {
                failures += 1;
                if failures > 20 {
                    return Err(anyhow!(s).context("the coordinator keeps failing"));
                }
                // A simple fixed backoff: the liar is a test double, not a
                // production client.
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        failures = 0;
        let (mut counts, kernel) = w.solve(&job)?;
        let large = counts.iter().map(|c| c.count).sum::<u128>() >= args.lie_above;
        // Drawn only for large jobs: below the threshold the liar is honest.
        let lied = large && rng.chance(args.lie_rate);
        if lied {
            lie(&mut counts);
        }
        let kernel = args.report_kernel.as_deref().unwrap_or(kernel);
        let chunk = w.result_chunk(&job, &counts, kernel);
        match w.send(chunk).await {
            Ok(ack) => {
                let outcome = match ack.outcome() {
                    Outcome::Accepted => "accepted",
                    Outcome::Confirmed => "confirmed",
                    Outcome::Conflict => "conflict",
                    Outcome::Unspecified => "unspecified",
                };
                println!(
                    "reported job={} lease={} lied={lied} outcome={outcome}",
                    job.job_id, job.lease_id
                );
                if ack.run_complete {
                    return Ok(End::Complete);
                }
            }
            // Anything else (the lease expired or was taken back, the
            // coordinator restarted): the job is someone else's now; go on
            // with the next one. PERMISSION_DENIED included, as nq-worker
            // does: it refuses this report (a late copy, say), and a ban
            // shows on the next Lease.
            Err(s) => eprintln!(
                "nq-liar: report of job {} refused: {:?}: {}",
                job.job_id,
                s.code(),
                s.message()
            ),
        }
    }
}

/// The heartbeat interval the coordinator's lease lifetime asks for.
fn heartbeat(lease_ttl_ms: u64) -> Duration {
    Duration::from_millis((lease_ttl_ms / 3).max(10))
}

/// `--hoard`: see the module doc.
async fn hoard(args: &Args, dial: &Dial) -> Result<End> {
    let mut hoarders = Vec::new();
    for _ in 0..args.registrations.max(1) {
        match ProtocolWorker::register_via(dial, &args.name).await {
            Ok(w) => hoarders.push((w, Vec::<u64>::new())),
            Err(e) => return denied(&e).map(End::Refused).ok_or(e),
        }
    }
    eprintln!(
        "nq-liar: hoarding under {} registrations as {}",
        hoarders.len(),
        args.name
    );
    let mut failures = 0u32;
    loop {
        let mut ttl_ms = 1000;
        for (w, held) in &mut hoarders {
            let request = pb::LeaseRequest {
                worker_id: w.id.clone(),
                want: 1024,
                held: held.clone(),
            };
            let resp = match w.client.lease(request).await {
                Ok(r) => r.into_inner(),
                Err(s) if s.code() == Code::PermissionDenied => {
                    return Ok(End::Refused(s));
                }
                Err(s) if s.code() == Code::FailedPrecondition => {
                    // Forgotten: register again, holding nothing.
                    *w = ProtocolWorker::register_via(dial, &args.name).await?;
                    held.clear();
                    continue;
                }
                Err(s) => {
                    failures += 1;
                    if failures > 20 {
                        return Err(anyhow!(s).context("the coordinator keeps failing"));
                    }
                    continue;
                }
            };
            failures = 0;
            for lost in &resp.revoked {
                held.retain(|l| l != lost);
                println!("revoked lease={lost}");
            }
            for job in &resp.jobs {
                held.push(job.lease_id);
                println!("hoarding job={} lease={}", job.job_id, job.lease_id);
            }
            if resp.run_complete {
                return Ok(End::Complete);
            }
            ttl_ms = resp.lease_ttl_ms;
        }
        tokio::time::sleep(heartbeat(ttl_ms)).await;
    }
}

/// One true solution of a sub-problem of `job`: its index and rows.
fn first_solution(w: &ProtocolWorker, job: &pb::Job) -> Result<Option<(u32, Vec<u8>)>> {
    for (i, s) in job.subproblems.iter().enumerate() {
        let sub = w.shape.subproblem(s)?;
        let mut found = None;
        sub.list(&mut |rows: &[u8]| {
            found = Some(rows.to_vec());
            ControlFlow::Break(())
        });
        if let Some(rows) = found {
            return Ok(Some((u32::try_from(i)?, rows)));
        }
    }
    Ok(None)
}

/// `--stall`: see the module doc.
async fn stall(args: &Args, dial: &Dial) -> Result<End> {
    let mut w = match ProtocolWorker::register_via(dial, &args.name).await {
        Ok(w) => w,
        Err(e) => return denied(&e).map(End::Refused).ok_or(e),
    };
    // A job with a solution to open the stream with.
    let (job, (sub, rows)) = loop {
        let Some(job) = w.lease_one().await? else {
            return Ok(End::Complete);
        };
        if let Some(first) = first_solution(&w, &job)? {
            break (job, first);
        }
    };
    let first = pb::ReportChunk {
        worker_id: w.id.clone(),
        job_id: job.job_id,
        lease_id: job.lease_id,
        body: Some(pb::report_chunk::Body::Solutions(pb::SolutionBatch {
            subproblem: sub,
            rows,
        })),
        run_id: w.run_id.clone(),
    };
    // One chunk, then silence: the stream never ends by itself.
    let stream = tokio_stream::iter([first]).chain(tokio_stream::pending());
    let mut client = w.client.clone();
    let call = client.report(stream);
    tokio::pin!(call);
    println!("stalling job={} lease={}", job.job_id, job.lease_id);
    let ended = loop {
        tokio::select! {
            r = &mut call => break r,
            () = tokio::time::sleep(Duration::from_millis(300)) => {
                // The heartbeat: the lease stays live while the stream stalls.
                let request = pb::LeaseRequest {
                    worker_id: w.id.clone(),
                    want: 0,
                    held: vec![job.lease_id],
                };
                if let Ok(r) = w.client.lease(request).await
                    && r.get_ref().revoked.contains(&job.lease_id)
                {
                    println!("revoked lease={}", job.lease_id);
                }
            }
        }
    };
    match ended {
        Ok(ack) => println!("stream ended: OK: {:?}", ack.get_ref().outcome()),
        Err(s) => println!("stream ended: {:?}: {}", s.code(), s.message()),
    }
    // The lie, late: every sub-problem counted 0.
    let zeros = vec![nq_core::split::SubCounts::default(); job.subproblems.len()];
    let chunk = w.result_chunk(&job, &zeros, "scalar");
    match w.send(chunk).await {
        Ok(ack) => println!("lie job={} outcome={:?}", job.job_id, ack.outcome()),
        Err(s) => println!("lie refused: {:?}: {}", s.code(), s.message()),
    }
    // Then wait for the end of the run, asking for nothing.
    loop {
        let resp = w.lease(0).await?;
        if resp.run_complete {
            return Ok(End::Complete);
        }
        tokio::time::sleep(Duration::from_millis(resp.retry_after_ms.max(100))).await;
    }
}
