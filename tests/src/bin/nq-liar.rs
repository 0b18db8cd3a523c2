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
//!   when the coordinator refuses it with PERMISSION_DENIED (banned);
//! * exit 1 on any other failure.
//!
//! ```text
//! nq-liar --connect 127.0.0.1:50051 --name liar --lie-rate 1.0
//! ```

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Result, anyhow};
use clap::Parser;
use nq_e2e::client::{ProtocolWorker, lie, status_of};
use nq_e2e::rng::Rng;
use nq_proto::pb::report_ack::Outcome;
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
    /// Share of jobs reported with wrong counts, 0.0 to 1.0 (1.0 = every job).
    #[arg(long, value_name = "FRACTION", default_value_t = 1.0)]
    lie_rate: f64,
    /// Seed of the choice of jobs to lie on (only matters below 1.0).
    #[arg(long, default_value_t = 1)]
    seed: u64,
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
    match run(&args).await {
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

async fn run(args: &Args) -> Result<End> {
    let mut rng = Rng::new(args.seed);
    let mut w = match ProtocolWorker::register(args.connect, &args.name).await {
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
                w = ProtocolWorker::register(args.connect, &args.name).await?;
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
        let lied = rng.chance(args.lie_rate);
        if lied {
            lie(&mut counts);
        }
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
            Err(s) if s.code() == Code::PermissionDenied => return Ok(End::Refused(s)),
            // Anything else (the lease expired, the coordinator restarted):
            // the job is someone else's now; go on with the next one.
            Err(s) => eprintln!(
                "nq-liar: report of job {} refused: {:?}: {}",
                job.job_id,
                s.code(),
                s.message()
            ),
        }
    }
}
