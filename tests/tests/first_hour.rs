//! A new user's first hour with the coordinator (issue 26's smaller
//! frictions), with the real binary: a finished run reprints its result
//! without taking a port, a taken port is refused naming `--listen`, `--n`
//! is read from the run being resumed, `audit` refuses a missing store and
//! ends quietly on a closed pipe, `status` after the end shows the stored
//! result, the coordinator's own threads are counted as workers, a short
//! run logs its progress once, and an unchecked run's advice works.

use std::path::Path;
use std::process::Output;

use anyhow::{Context, Result, ensure};
use nq_e2e::{Coord, binary, free_port, within, worker};

use crate::{LIMIT, data_dir};

/// Runs `nq-coord ARGS…` to its end and returns what it did.
async fn nq_coord(args: &[&str]) -> Result<Output> {
    tokio::process::Command::new(binary("nq-coord")?)
        .args(args)
        .env("NO_COLOR", "1")
        .kill_on_drop(true)
        .output()
        .await
        .context("cannot run nq-coord")
}

/// Stdout and stderr of `out`, for messages and searches.
fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Counts N = 8 on one local thread in `dir`, to its end.
async fn finished_run(dir: &Path) -> Result<()> {
    let mut coord = Coord::ephemeral(dir, &["--n", "8", "--local-threads", "1"]).await?;
    coord.finish().await?.check_exact()
}

/// A finished run's data directory, run again while its port is held by
/// someone else and without `--n`, reprints the stored result and exits 0:
/// nothing is bound. A `--n` that differs from the stored run's is refused
/// naming both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_run_reprints_its_result_without_a_port() -> Result<()> {
    within(LIMIT, "finished run", async {
        let tmp = tempfile::tempdir()?;
        let dir = data_dir(&tmp);
        finished_run(&dir).await?;
        let taken = std::net::TcpListener::bind("127.0.0.1:0")?;
        let addr = taken.local_addr()?.to_string();
        let data = dir.display().to_string();
        let out = nq_coord(&["--data", &data, "--listen", &addr]).await?;
        let (stdout, stderr) = text(&out);
        ensure!(out.status.success(), "{}: {stdout}{stderr}", out.status);
        ensure!(
            stdout.starts_with("n=8 status=complete total=92 unique=12 "),
            "{stdout}"
        );
        ensure!(!stdout.contains("listening on"), "{stdout}");

        let out = nq_coord(&["--n", "9", "--data", &data, "--listen", &addr]).await?;
        let (stdout, stderr) = text(&out);
        ensure!(
            out.status.code() == Some(1),
            "{}: {stdout}{stderr}",
            out.status
        );
        ensure!(
            stderr.contains("--n 9 does not match") && stderr.contains("N=8"),
            "{stderr}"
        );
        drop(taken);
        Ok(())
    })
    .await
}

/// A port that is taken is refused naming the address and `--listen`,
/// before the data directory is created, and `listening on` is never
/// printed; `--n` left out of a new run is refused
/// naming it, before anything is created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_port_is_refused_naming_listen() -> Result<()> {
    within(LIMIT, "taken port", async {
        let tmp = tempfile::tempdir()?;
        let taken = std::net::TcpListener::bind("127.0.0.1:0")?;
        let addr = taken.local_addr()?.to_string();
        let data = data_dir(&tmp).display().to_string();
        let out = nq_coord(&["--n", "8", "--data", &data, "--listen", &addr]).await?;
        let (stdout, stderr) = text(&out);
        ensure!(
            out.status.code() == Some(1),
            "{}: {stdout}{stderr}",
            out.status
        );
        ensure!(
            stderr.contains(&format!("cannot listen on {addr} (--listen)"))
                && stderr.contains("already in use")
                && stderr.contains("--listen HOST:PORT"),
            "{stderr}"
        );
        ensure!(!stdout.contains("listening on"), "{stdout}");
        // Refused before anything was created.
        ensure!(!data_dir(&tmp).exists(), "{data} was created");
        drop(taken);

        let fresh = tmp.path().join("fresh");
        let fresh_arg = fresh.display().to_string();
        let out = nq_coord(&["--data", &fresh_arg, "--listen", "127.0.0.1:0"]).await?;
        let (_, stderr) = text(&out);
        ensure!(out.status.code() == Some(2), "{}: {stderr}", out.status);
        ensure!(stderr.contains("invalid --n: (missing)"), "{stderr}");
        ensure!(!fresh.exists(), "{} was created", fresh.display());
        Ok(())
    })
    .await
}

/// A data directory in use by another coordinator is refused before the
/// second one says `listening on`: the line means a run that will serve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_directory_is_never_announced() -> Result<()> {
    within(LIMIT, "locked directory", async {
        let tmp = tempfile::tempdir()?;
        let dir = data_dir(&tmp);
        // No local threads and no worker: it serves until stopped.
        let mut first =
            Coord::ephemeral(&dir, &["--n", "12", "--local-threads", "0"]).await?;
        first.proc.line_containing("serving workers").await?;
        let data = dir.display().to_string();
        let out =
            nq_coord(&["--n", "12", "--data", &data, "--listen", "127.0.0.1:0"]).await?;
        let (stdout, stderr) = text(&out);
        ensure!(!out.status.success(), "{}: {stdout}{stderr}", out.status);
        ensure!(stderr.contains("lock"), "{stderr}");
        ensure!(!stdout.contains("listening on"), "{stdout}");
        first.proc.signal(libc::SIGINT)?;
        let status = first.proc.wait().await?;
        ensure!(
            status.code() == Some(3),
            "interrupted run exited with {status}"
        );
        Ok(())
    })
    .await
}

/// `audit` on a path that does not exist fails naming it and creates
/// nothing there; on a closed stdout (`| head`) it ends with exit 0 and no
/// error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_refuses_a_missing_store_and_ends_quietly_on_a_closed_pipe() -> Result<()> {
    within(LIMIT, "audit", async {
        let tmp = tempfile::tempdir()?;
        let typo = tmp.path().join("typo");
        let typo_arg = typo.display().to_string();
        let out = nq_coord(&["audit", "--data", &typo_arg]).await?;
        let (_, stderr) = text(&out);
        ensure!(!out.status.success(), "{}: {stderr}", out.status);
        ensure!(
            stderr.contains(&format!("{typo_arg} does not exist")),
            "{stderr}"
        );
        ensure!(!typo.exists(), "{} was created", typo.display());

        let dir = data_dir(&tmp);
        finished_run(&dir).await?;
        // The reader is gone before the first write: the audit's first line
        // meets a closed pipe, whatever the pipe's buffer holds.
        let (reader, writer) = std::io::pipe()?;
        drop(reader);
        let out = tokio::process::Command::new(binary("nq-coord")?)
            .args(["audit", "--data", &dir.display().to_string()])
            .stdout(writer)
            .kill_on_drop(true)
            .output()
            .await?;
        let (_, stderr) = text(&out);
        ensure!(out.status.success(), "{}: {stderr}", out.status);
        ensure!(!stderr.contains("error"), "{stderr}");
        Ok(())
    })
    .await
}

/// `status` with nothing listening: without `--data` it says the
/// coordinator does not answer, in the OS's words, and where a finished
/// run's result is; with the `--data` of a finished run it shows that
/// result and exits 0; with an unfinished one it says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_after_the_end_points_to_the_report() -> Result<()> {
    within(LIMIT, "status after the end", async {
        let tmp = tempfile::tempdir()?;
        let dir = data_dir(&tmp);
        finished_run(&dir).await?;
        let data = dir.display().to_string();
        let nobody = free_port()?.to_string();

        let out = nq_coord(&["status", "--connect", &nobody]).await?;
        let (_, stderr) = text(&out);
        ensure!(!out.status.success(), "{}: {stderr}", out.status);
        ensure!(
            stderr.contains(&format!(
                "no coordinator answers at {nobody} (connection refused)"
            )) && stderr.contains("report.json")
                && !stderr.contains("tcp connect error"),
            "{stderr}"
        );

        let out = nq_coord(&["status", "--connect", &nobody, "--data", &data]).await?;
        let (stdout, stderr) = text(&out);
        ensure!(out.status.success(), "{}: {stdout}{stderr}", out.status);
        ensure!(
            stdout.starts_with("the run is over: the coordinator is not running")
                && stdout.contains("n=8 status=complete total=92 unique=12")
                && stdout.contains(&dir.join("report.json").display().to_string()),
            "{stdout}"
        );
        let out = nq_coord(&["status", "--connect", &nobody, "--data", &data, "--json"])
            .await?;
        let json: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        ensure!(
            json["status"] == "complete" && json["total"] == 92,
            "{json}"
        );

        let unfinished = tmp.path().join("unfinished");
        std::fs::create_dir(&unfinished)?;
        let out = nq_coord(&[
            "status",
            "--connect",
            &nobody,
            "--data",
            &unfinished.display().to_string(),
        ])
        .await?;
        let (_, stderr) = text(&out);
        ensure!(!out.status.success(), "{}: {stderr}", out.status);
        ensure!(stderr.contains("is not finished"), "{stderr}");
        Ok(())
    })
    .await
}

/// While only the coordinator's own thread works, `status` counts it as a
/// worker at work (text and JSON), with its row in the table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_coordinators_threads_are_shown_as_workers() -> Result<()> {
    within(LIMIT, "local threads in status", async {
        let tmp = tempfile::tempdir()?;
        // Minutes of work on one thread: interrupted below.
        let mut coord =
            Coord::ephemeral(&data_dir(&tmp), &["--n", "19", "--local-threads", "1"])
                .await?;
        coord
            .proc
            .line_containing("local threads running jobs")
            .await?;
        let addr = coord.addr.to_string();
        let out = nq_coord(&["status", "--connect", &addr]).await?;
        let (stdout, stderr) = text(&out);
        ensure!(out.status.success(), "{}: {stdout}{stderr}", out.status);
        ensure!(
            stdout.contains("workers    local (1 thread) + 0 remote connected"),
            "{stdout}"
        );
        let row = stdout
            .lines()
            .find(|l| l.starts_with("local "))
            .with_context(|| format!("no local row in\n{stdout}"))?;
        ensure!(row.contains("(local)"), "{row}");
        let out = nq_coord(&["status", "--connect", &addr, "--json"]).await?;
        let json: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        ensure!(json["local_threads"] == 1, "{json}");
        coord.proc.signal(libc::SIGINT)?;
        let status = coord.proc.wait().await?;
        ensure!(
            status.code() == Some(3),
            "interrupted run exited with {status}"
        );
        Ok(())
    })
    .await
}

/// A run shorter than `--progress-interval`, logging (stderr is no
/// terminal), still logs its progress once, at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_run_logs_its_progress_once() -> Result<()> {
    within(LIMIT, "short run progress", async {
        let tmp = tempfile::tempdir()?;
        let args = [
            "--n",
            "8",
            "--local-threads",
            "1",
            "--progress-interval",
            "1h",
        ];
        let mut coord = Coord::ephemeral(&data_dir(&tmp), &args).await?;
        coord.finish().await?.check_exact()?;
        let lines = coord.proc.lines_containing("ticker: progress ");
        let last = lines
            .last()
            .with_context(|| format!("no progress line in\n{}", coord.proc.output()))?;
        ensure!(
            last.contains("percent=100") && last.contains("local_threads=1"),
            "{last}"
        );
        Ok(())
    })
    .await
}

/// A run that ends unchecked (one remote worker, no local threads) gives
/// advice that works on a finished directory: running it again there only
/// reprints the result (no port taken), and the audit the advice names can
/// be written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_unchecked_advice_works() -> Result<()> {
    within(LIMIT, "unchecked advice", async {
        let tmp = tempfile::tempdir()?;
        let dir = data_dir(&tmp);
        let mut coord =
            Coord::ephemeral(&dir, &["--n", "10", "--local-threads", "0"]).await?;
        let mut w = worker("lone", &coord.addr.to_string(), &["--threads", "1"])?;
        coord.finish_unchecked().await?;
        w.success().await?;
        let advice = coord
            .proc
            .lines_containing("nq-coord: unchecked:")
            .pop()
            .with_context(|| format!("no advice in\n{}", coord.proc.output()))?;
        let data = dir.display().to_string();
        ensure!(
            advice.contains("only prints this result")
                && advice.contains(&format!(
                    "nq-coord audit --data {data} --output audit.csv"
                ))
                && advice.contains("nq recheck audit.csv --sample ")
                && advice.contains("new --data directory")
                && !advice.contains("run again with"),
            "{advice}"
        );
        // As the advice says: the same directory reprints the result.
        let out = nq_coord(&["--data", &data, "--listen", "127.0.0.1:0"]).await?;
        let (stdout, stderr) = text(&out);
        ensure!(
            out.status.code() == Some(6),
            "{}: {stdout}{stderr}",
            out.status
        );
        ensure!(stdout.starts_with("n=10 status=unchecked "), "{stdout}");
        ensure!(!stdout.contains("listening on"), "{stdout}");
        let csv = tmp.path().join("audit.csv");
        let out = nq_coord(&[
            "audit",
            "--data",
            &data,
            "--output",
            &csv.display().to_string(),
        ])
        .await?;
        let (_, stderr) = text(&out);
        ensure!(out.status.success(), "{}: {stderr}", out.status);
        ensure!(std::fs::read_to_string(&csv)?.starts_with("# nq-audit v2"));
        Ok(())
    })
    .await
}
