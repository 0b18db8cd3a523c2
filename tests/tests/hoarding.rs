//! Workers that hold what they do not work on: a lease hoarder and a report
//! stream staller, each a real `nq-liar` process against a real
//! coordinator and honest workers. See: issue 18, items 3 and 4 ("No
//! hoarding", "No stalled streams") and their acceptance tests.

use std::path::Path;

use anyhow::{Result, ensure};
use nq_e2e::{Coord, LOG_ENV, Proc, Report, within, worker};

use crate::{LIMIT, data_dir};

/// Starts `nq-liar` in one of its adversary modes (`extra` are its flags).
fn adversary(name: &str, addr: &str, extra: &[&str]) -> Result<Proc> {
    let mut args = vec!["--connect", addr, "--name", name];
    args.extend_from_slice(extra);
    let args: Vec<String> = args.into_iter().map(str::to_owned).collect();
    Proc::spawn(
        name,
        Path::new(env!("CARGO_BIN_EXE_nq-liar")),
        &args,
        LOG_ENV,
    )
}

/// N = 16 with a hoarder that registers 14 times, leases all it is granted,
/// heartbeats and never reports: its leases are taken back and reissued, the
/// coordinator names it, and the run ends exact while it still heartbeats.
/// (Before issue 18 it held all 210 jobs for as long as it liked.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_hoarder_is_named_and_loses_its_leases_and_n16_ends_exact() -> Result<()>
{
    within(LIMIT, "hoarder, n=16", hoarder()).await?;
    Ok(())
}

async fn hoarder() -> Result<Report> {
    let tmp = tempfile::tempdir()?;
    let args = [
        "--n",
        "16",
        "--local-threads",
        "0",
        "--verify",
        "0",
        "--lease-ttl",
        "2s",
    ];
    let mut coord = Coord::ephemeral(&data_dir(&tmp), &args).await?;
    let addr = coord.addr.to_string();
    // The hoarder first, so that it takes the largest jobs.
    let mut h = adversary("hoarder", &addr, &["--hoard", "--registrations", "14"])?;
    h.line_containing("hoarding job=").await?;
    let mut w1 = worker("honest-1", &addr, &["--threads", "1"])?;
    let mut w2 = worker("honest-2", &addr, &["--threads", "1"])?;

    let report = coord.finish().await?;
    report.check_exact()?;
    w1.success().await?;
    w2.success().await?;
    // It heartbeated to the end, and heard that the run is complete.
    h.success().await?;
    let hoarded = h.lines_containing("hoarding job=").len();
    let revoked = h.lines_containing("revoked lease=").len();
    ensure!(
        hoarded <= 16 + revoked,
        "the hoarder held more than its identity's cap of 16:\n{}",
        h.output()
    );
    ensure!(
        revoked > 0,
        "no lease of the hoarder was revoked:\n{}",
        h.output()
    );
    let log = coord.proc.output();
    let named: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("LEASES WITHOUT PROGRESS") && l.contains("name=hoarder"))
        .collect();
    ensure!(
        !named.is_empty(),
        "no WARN line names the hoarder as holding leases without progress:\n{log}"
    );
    ensure!(
        !log.lines()
            .any(|l| l.contains("LEASES WITHOUT PROGRESS") && l.contains("name=honest")),
        "an honest worker was named as a hoarder:\n{log}"
    );
    eprintln!(
        "the hoarder was granted {hoarded} leases and lost {revoked}; \
         {} WARN lines name it",
        named.len()
    );
    Ok(report)
}

/// A `--solutions` run (N = 12) with a worker that opens a Report stream
/// with one true solution and then stalls it, heartbeating its lease: the
/// coordinator ends the stream (its claim never blocks the job past its
/// deadlines), the job is computed by an honest worker, the staller's late
/// count-0 report cannot settle anything, and the run is exact. (Before
/// issue 18 the total was 6,312 instead of 14,200.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_report_stream_ends_and_the_solutions_run_is_exact() -> Result<()> {
    within(LIMIT, "staller, n=12 --solutions", staller()).await?;
    Ok(())
}

async fn staller() -> Result<Report> {
    let tmp = tempfile::tempdir()?;
    let args = [
        "--n",
        "12",
        "--solutions",
        "--local-threads",
        "0",
        "--verify",
        "0",
        "--lease-ttl",
        "2s",
    ];
    let mut coord = Coord::ephemeral(&data_dir(&tmp), &args).await?;
    let addr = coord.addr.to_string();
    let mut s = adversary("staller", &addr, &["--stall"])?;
    s.line_containing("stalling job=").await?;
    let mut w = worker("honest", &addr, &["--threads", "1"])?;
    let ended = s.line_containing("stream ended:").await?;
    let lie = s.line_containing("lie ").await?;

    let report = coord.finish().await?;
    report.check_exact()?;
    w.success().await?;
    s.success().await?;
    ensure!(
        !ended.contains("OK"),
        "the stalled stream was accepted: {ended}"
    );
    ensure!(
        lie.contains("refused") || lie.contains("Conflict"),
        "the late count-0 report was not refused or outvoted: {lie}"
    );
    eprintln!("{ended}; {lie}");
    Ok(report)
}
