//! Kernel diversity for GPU copies: two GPU workers whose kernel agrees on
//! wrong counts of large searches are caught by the CPU sample, the
//! trusted side's recomputation of a share of the jobs whose every copy
//! ran on a GPU. See: issue 24, item 6.

use std::path::Path;

use anyhow::{Context, Result, ensure};
use nq_e2e::client::{Dial, ProtocolWorker};
use nq_e2e::{Coord, LOG_ENV, Proc, Report, log_field, within};
use nq_proto::auth::Token;

use crate::{LIMIT, data_dir};

/// The per-worker tokens of the two GPU liars and of the trusted machine.
const TOKENS: [(&str, &str); 3] = [
    ("gpu-a", "token-of-gpu-a-0123456789"),
    ("gpu-b", "token-of-gpu-b-0123456789"),
    ("lab", "token-of-machine-lab-0123456789"),
];

/// The CPU sample's share in this test. With L jobs lied on, the chance
/// that the sample holds none of them is 0.6^L: below 10^-11 from L = 50
/// (the liars lie on every job above half the mean count: about three
/// quarters of the run's 100 jobs, in a trial by hand).
const SAMPLE: &str = "0.4";

/// `nq-liar` posing as `nq-worker --gpu` with a kernel bug: its copies say
/// `cuda`, and it lies on every job whose true count is at least
/// `lie_above`.
fn gpu_liar(name: &str, addr: &str, token: &str, lie_above: u128) -> Result<Proc> {
    let args = [
        "--connect",
        addr,
        "--name",
        name,
        "--token",
        token,
        "--report-kernel",
        "cuda",
        "--lie-above",
        &lie_above.to_string(),
    ]
    .map(str::to_owned);
    Proc::spawn(
        name,
        Path::new(env!("CARGO_BIN_EXE_nq-liar")),
        &args,
        LOG_ENV,
    )
}

/// Two GPU liars at `--verify 1` check each other and agree on every lie:
/// no vote can catch them. The coordinator's CPU sample does, and the total
/// is exact.
///
/// The test keeps the sample the only way to catch them. In the first
/// session the liars are the only computers: a trusted machine (`lab`) is
/// registered, so that the sample's jobs wait for a trusted copy, but it
/// computes nothing. Once the liars gave both copies of every job, that
/// session is killed and the run resumed with the coordinator's own thread
/// and no liar: the only jobs open are the sample's, and the thread's CPU
/// copies of them are the only copies that can disagree with the liars.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gpu_workers_agreeing_on_wrong_large_counts_are_caught_by_the_cpu_sample()
-> Result<()> {
    within(LIMIT, "GPU liars at --verify 1, CPU sample", gpu_liars()).await
}

async fn gpu_liars() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let tokens = tmp.path().join("worker-tokens");
    let lines: String = TOKENS.iter().map(|(n, t)| format!("{n} {t}\n")).collect();
    std::fs::write(&tokens, lines)?;
    let tokens = tokens.display().to_string();
    let dir = data_dir(&tmp);
    let first = [
        "--n",
        "14",
        "--split",
        "0:2",
        "--jobs",
        "100",
        "--local-threads",
        "0",
        "--verify",
        "1",
        "--ban-after",
        "1",
        "--gpu-sample",
        SAMPLE,
        "--worker-tokens",
        &tokens,
        "--trust",
        "token:lab",
        // Nothing may expire while the liars wait for the end: the trusted
        // machine's registration stands for the whole session.
        "--lease-ttl",
        "600s",
    ];
    let mut coord = Coord::ephemeral(&dir, &first).await?;
    // Logged (stderr) before `listening on` (stdout), but the two pipes
    // arrive apart: read it from the log, or wait for it.
    let created = match coord.proc.lines_containing("created run").first() {
        Some(line) => line.clone(),
        None => coord.proc.line_containing("created run").await?,
    };
    let jobs: u64 = log_field(&created, "jobs")
        .and_then(|j| j.parse().ok())
        .with_context(|| format!("no job count in {created:?}"))?;
    let addr = coord.addr;
    // Registered for the whole first session; it never leases.
    let _lab = ProtocolWorker::register_via(
        &Dial {
            addr,
            source: None,
            token: Some(Token::new(TOKENS[2].1)?),
        },
        "lab",
    )
    .await?;
    let (published, _) = nq_core::published::published(14).context("Q(14)")?;
    // "Large": at least half the mean count of a job. A job's counts add up
    // to about an eighth of its share of Q(N): the split counts each class
    // of solutions under the board's eight symmetries once.
    let lie_above = published / 8 / u128::from(jobs) / 2;
    let at = addr.to_string();
    let mut a = gpu_liar("gpu-a", &at, TOKENS[0].1, lie_above)?;
    let mut b = gpu_liar("gpu-b", &at, TOKENS[1].1, lie_above)?;
    // Every job gets exactly one copy from each liar (a worker never checks
    // itself, and the sample's jobs wait for the trusted machine): each
    // liar is done at `jobs` acknowledged reports. Awaited line by line,
    // one liar after the other: a liar that exits early fails the wait, and
    // one that stops reporting makes it a hang, which the deadline reports.
    for liar in [&mut a, &mut b] {
        for _ in 0..jobs {
            liar.line_containing("reported job=").await?;
        }
    }
    let lies =
        a.lines_containing("lied=true").len() + b.lines_containing("lied=true").len();
    let held = coord.proc.lines_containing("held for the CPU sample");
    let log = coord.proc.output();
    ensure!(lies > 0, "the liars told no lie (threshold {lie_above})");
    ensure!(
        !held.is_empty(),
        "the CPU sample held no job of the GPU copies:\n{log}"
    );
    ensure!(
        !log.contains("lost a verification conflict") && !log.contains("BANNED"),
        "the liars were caught before the sample's copies were computed:\n{log}"
    );
    coord.proc.kill().await?;
    a.kill().await?;
    b.kill().await?;

    // The run resumed with the coordinator's own thread, no liar. The
    // stored settings hold: --verify 1, --ban-after 1, the trusted `lab`
    // and the sample's share travel with the run, so the resume names
    // none of them.
    let second = [
        "--local-threads",
        "1",
        "--worker-tokens",
        &tokens,
        "--lease-ttl",
        "2s",
    ];
    let mut coord = Coord::ephemeral(&dir, &second).await?;
    let report = coord.finish().await?;
    report.check_exact()?;
    for name in ["gpu-a", "gpu-b"] {
        let entry = faulty(&report, name)?;
        ensure!(
            entry["lost"].as_u64().is_some_and(|n| n >= 1) && entry["banned"] == true,
            "{name} did not lose to the CPU sample and get banned: {entry}"
        );
    }
    Ok(())
}

/// The entry of `report.json`'s `faulty_workers` whose name holds `name`.
fn faulty<'a>(report: &'a Report, name: &str) -> Result<&'a serde_json::Value> {
    report
        .faulty_workers()?
        .iter()
        .find(|w| w["name"].as_str().is_some_and(|n| n.contains(name)))
        .with_context(|| format!("{name} is not in faulty_workers: {}", report.json))
}
