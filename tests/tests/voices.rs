//! No run waits for a voice that cannot come: the six cases a new user met
//! on one machine, each with real processes. See: issue 26 ("A new user's
//! first hour"), cases 1 to 6, and its acceptance list.
//!
//! None of these asserts a duration. A run that waits for a voice that
//! cannot come waits at least a lease lifetime, so each test that could
//! stall runs with leases far longer than its deadline ([`LIMIT`]): a stall
//! fails it as a hang, never as a slow run.

use std::path::Path;

use anyhow::{Result, ensure};
use nq_e2e::{Coord, LOG_ENV, Proc, Report, binary, within, worker};

use crate::{LIMIT, data_dir};

/// The run's shared token of the README's cluster.
const TOKEN: &str = "first-hour-0123456789abcdef";

/// Leases that outlive the test's deadline: waiting for one to lapse is a
/// hang here.
const LONG_TTL: &str = "600s";

/// [`LOG_ENV`] plus `NQ_TOKEN`, as the README's commands run.
fn token_env() -> Vec<(&'static str, &'static str)> {
    let mut env = LOG_ENV.to_vec();
    env.push(("NQ_TOKEN", TOKEN));
    env
}

/// `nq-worker --connect ADDR ARGS…`, exactly as the README runs it: no
/// `--name` (it defaults to the host name, the same for every process on
/// this machine), the token from `NQ_TOKEN`.
fn readme_worker(label: &str, addr: &str, args: &[&str]) -> Result<Proc> {
    let mut all = vec!["--connect".to_owned(), addr.to_owned()];
    all.extend(args.iter().map(|a| (*a).to_owned()));
    Proc::spawn(label, &binary("nq-worker")?, &all, &token_env())
}

/// A `--worker-tokens` file naming machines `a` and `b`, in `dir`.
fn two_machine_tokens(dir: &Path) -> Result<String> {
    let path = dir.join("worker-tokens");
    std::fs::write(
        &path,
        "a token-of-machine-a-0123456789\nb token-of-machine-b-0123456789\n",
    )?;
    Ok(path.display().to_string())
}

/// Copies computed in all: one per job plus every kept duplicate.
fn copies(report: &Report) -> u64 {
    let confirmations = report.json["confirmations"].as_u64().unwrap_or(0);
    report.jobs + confirmations + report.conflicts
}

/// Case 1: the README's "cluster in two commands" followed literally on one
/// machine (a shared token, `--local-threads 0`, two workers with no
/// `--name`) ends `complete`, exit 0: loopback workers holding the run's
/// token are the operator's own, one voice with the coordinator's threads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_cluster_on_one_machine_completes() -> Result<()> {
    within(LIMIT, "README cluster on one machine, n=16", async {
        let tmp = tempfile::tempdir()?;
        let args = ["--n", "16", "--local-threads", "0", "--lease-ttl", LONG_TTL];
        let mut coord =
            Coord::start_with_env(&data_dir(&tmp), "127.0.0.1:0", &args, &token_env())
                .await?;
        let addr = coord.addr.to_string();
        let mut w1 = readme_worker("worker-1", &addr, &[])?;
        let mut w2 = readme_worker("worker-2", &addr, &[])?;
        let report = coord.finish().await?;
        report.check_published()?;
        w1.success().await?;
        w2.success().await?;
        let log = coord.proc.output();
        ensure!(
            log.contains("credential=\"local\""),
            "the workers did not register as the operator's own:\n{log}"
        );
        Ok(())
    })
    .await
}

/// Case 2: `--verify 1` with one worker identity and no local threads does
/// not hang: every job needs a check that no second machine can give, so the
/// coordinator says so in a WARN and the run ends `unchecked` (exit 6), with
/// the published totals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_1_with_one_identity_ends_unchecked_with_a_warning() -> Result<()> {
    within(LIMIT, "--verify 1 with one identity, n=14", async {
        let tmp = tempfile::tempdir()?;
        let args = [
            "--n",
            "14",
            "--local-threads",
            "0",
            "--verify",
            "1",
            "--lease-ttl",
            LONG_TTL,
        ];
        let mut coord = Coord::ephemeral(&data_dir(&tmp), &args).await?;
        let addr = coord.addr.to_string();
        let mut w = worker("alone", &addr, &["--threads", "1"])?;
        let report = coord.finish_unchecked().await?;
        w.success().await?;
        let warned = coord.proc.lines_containing("NO SECOND MACHINE");
        ensure!(
            !warned.is_empty() && warned.iter().all(|l| l.contains("WARN")),
            "no WARN said that no second machine delivers:\n{}",
            coord.proc.output()
        );
        ensure!(
            report.json["unchecked"] == report.json["jobs"],
            "every job needed a check: {}",
            report.json
        );
        Ok(())
    })
    .await
}

/// Case 3: a hoarder (one registration that leases, renews and never
/// reports) beside one honest worker: the honest worker's results do not
/// wait for the hoarder's voice, its lease is taken back within a few lease
/// lifetimes, and the run ends while the hoarder still heartbeats.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hoarder_holds_no_run_hostage() -> Result<()> {
    within(LIMIT, "hoarder beside one honest worker, n=16", async {
        let tmp = tempfile::tempdir()?;
        let args = ["--n", "16", "--local-threads", "0", "--lease-ttl", "2s"];
        let mut coord = Coord::ephemeral(&data_dir(&tmp), &args).await?;
        let addr = coord.addr.to_string();
        let mut h = Proc::spawn(
            "hoarder",
            Path::new(env!("CARGO_BIN_EXE_nq-liar")),
            &["--connect", &addr, "--name", "hoarder", "--hoard"].map(str::to_owned),
            LOG_ENV,
        )?;
        h.line_containing("hoarding job=").await?;
        let mut honest = worker("honest", &addr, &["--threads", "1"])?;
        // One honest voice: its results settle unchecked, not waiting for
        // the hoarder's, and the run ends while the hoarder still heartbeats.
        let report = coord.finish_unchecked().await?;
        honest.success().await?;
        h.success().await?;
        ensure!(report.jobs == 210, "{}", report.json);
        Ok(())
    })
    .await
}

/// Case 4: Ctrl-C of one of two workers (two machines, a per-machine token
/// each, no local threads) once it has reported: it drains, tells the
/// coordinator that it leaves, and the run goes on with the other at once
/// instead of waiting a lease lifetime for the voice that left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_drains_leaves_at_once() -> Result<()> {
    within(LIMIT, "Ctrl-C of one of two workers, n=17", async {
        let tmp = tempfile::tempdir()?;
        let tokens = two_machine_tokens(tmp.path())?;
        let args = [
            "--n",
            "17",
            "--local-threads",
            "0",
            "--worker-tokens",
            &tokens,
            "--lease-ttl",
            LONG_TTL,
        ];
        let mut coord = Coord::ephemeral(&data_dir(&tmp), &args).await?;
        let addr = coord.addr.to_string();
        let mut a = worker("a", &addr, &["--token", "token-of-machine-a-0123456789"])?;
        let mut b = worker("b", &addr, &["--token", "token-of-machine-b-0123456789"])?;
        a.line_containing("job reported").await?;
        a.signal(libc::SIGINT)?;
        a.success().await?;
        coord
            .proc
            .line_containing("worker drained and leaves the run")
            .await?;
        // The jobs that waited for a's check settle by the rules once it
        // left: checked by b where a's copies need it, else unchecked.
        let status = coord.proc.wait().await?;
        ensure!(
            matches!(status.code(), Some(0 | 6)),
            "the coordinator exited with {status}:\n{}",
            coord.proc.output()
        );
        let report = Report::read(&coord.dir)?;
        b.success().await?;
        ensure!(
            report.total == nq_core::published::published(17).expect("published").0,
            "{}",
            report.json
        );
        Ok(())
    })
    .await
}

/// Case 5: a coordinator running alone, killed with `kill -9` and resumed,
/// does not wait for its own dead threads: their leases are not kept, their
/// jobs are pending again at once, and the resumed run completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_solo_coordinator_resumed_after_kill_9_does_not_wait_for_its_threads()
-> Result<()> {
    within(LIMIT, "solo coordinator, kill -9 and resume, n=17", async {
        let tmp = tempfile::tempdir()?;
        let dir = data_dir(&tmp);
        let args = ["--n", "17", "--lease-ttl", LONG_TTL];
        let mut coord = Coord::ephemeral(&dir, &args).await?;
        coord.proc.line_containing("copy counts").await?;
        coord.proc.kill().await?;
        let mut resumed = Coord::ephemeral(&dir, &args).await?;
        let report = resumed.finish().await?;
        report.check_published()?;
        let kept = resumed
            .proc
            .lines_containing("leases of the previous session");
        ensure!(
            kept.iter().all(|l| l.contains("restored=0")),
            "the resumed coordinator kept leases of its own dead threads: {kept:?}"
        );
        Ok(())
    })
    .await
}

/// Case 6: two workers with their own per-machine tokens at N = 18 under
/// `--local-threads 0`: probation costs about its ten checks per identity,
/// not the whole run (at most 1.15 copies per job; before issue 26 every
/// job was computed twice in two runs of three).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probation_costs_a_few_checks_on_a_two_machine_cluster() -> Result<()> {
    within(LIMIT, "probation with two per-token workers, n=18", async {
        let tmp = tempfile::tempdir()?;
        let tokens = two_machine_tokens(tmp.path())?;
        let args = [
            "--n",
            "18",
            "--local-threads",
            "0",
            "--worker-tokens",
            &tokens,
        ];
        let mut coord = Coord::ephemeral(&data_dir(&tmp), &args).await?;
        let addr = coord.addr.to_string();
        let mut a = worker("a", &addr, &["--token", "token-of-machine-a-0123456789"])?;
        let mut b = worker("b", &addr, &["--token", "token-of-machine-b-0123456789"])?;
        let report = coord.finish().await?;
        report.check_published()?;
        a.success().await?;
        b.success().await?;
        let copies = copies(&report);
        ensure!(
            copies * 100 <= report.jobs * 115,
            "{copies} copies of {} jobs: probation doubled the run ({})",
            report.jobs,
            report.json
        );
        eprintln!("{copies} copies of {} jobs", report.jobs);
        Ok(())
    })
    .await
}

/// `--verify 1` with one trusted remote machine as the only voice (no local
/// threads): every job is selected for a check, and the trusted machine
/// checks its own copy on another kernel, as the coordinator's threads do,
/// instead of the run waiting for a second machine that never comes. The
/// run ends `complete`, each job confirmed by the second kernel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trusted_machine_checks_itself_with_verify_1() -> Result<()> {
    within(LIMIT, "--verify 1 with one trusted machine, n=12", async {
        let tmp = tempfile::tempdir()?;
        let tokens = tmp.path().join("worker-tokens");
        std::fs::write(&tokens, "lab token-of-machine-lab-0123456789\n")?;
        let tokens = tokens.display().to_string();
        let args = [
            "--n",
            "12",
            "--local-threads",
            "0",
            "--verify",
            "1",
            "--worker-tokens",
            &tokens,
            "--trust",
            "token:lab",
            "--lease-ttl",
            LONG_TTL,
        ];
        let mut coord = Coord::ephemeral(&data_dir(&tmp), &args).await?;
        let addr = coord.addr.to_string();
        let mut w = worker(
            "lab",
            &addr,
            &[
                "--token",
                "token-of-machine-lab-0123456789",
                "--threads",
                "1",
            ],
        )?;
        let report = coord.finish().await?;
        report.check_published()?;
        w.success().await?;
        ensure!(
            report.json["confirmations"] == report.json["jobs"]
                && report.json["unchecked"] == 0,
            "every job needed a check, and the trusted machine gave it: {}",
            report.json
        );
        Ok(())
    })
    .await
}
