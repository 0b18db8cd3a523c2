//! What both programs do at the edges of their process: `NQ_*` environment
//! variables, thread caps, giving up without a coordinator, closed output
//! pipes, JSON logs and the message for a damaged data directory.

use std::io::BufRead;
use std::path::Path;
use std::process::{ExitStatus, Stdio};

use anyhow::{Context, Result, ensure};
use nq_e2e::{Coord, LOG_ENV, Pipe, Proc, Report, binary, free_port, within, worker};

use crate::{LIMIT, data_dir};

/// `NQ_N=12 NQ_DATA=DIR nq-coord --listen 127.0.0.1:0` runs like `--n 12
/// --data DIR`, and a worker configured only through `NQ_*` variables joins
/// it; the counts are exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flags_can_come_from_nq_environment_variables() -> Result<()> {
    within(LIMIT, "NQ_* variables", async {
        let tmp = tempfile::tempdir()?;
        let dir = data_dir(&tmp);
        let dir_text = dir.display().to_string();
        let mut env = LOG_ENV.to_vec();
        env.extend([
            ("NQ_N", "12"),
            ("NQ_DATA", dir_text.as_str()),
            // Only the worker computes, so its variables are tested too.
            ("NQ_LOCAL_THREADS", "0"),
        ]);
        let args = ["--listen", "127.0.0.1:0"].map(str::to_owned);
        let mut coord = Proc::spawn("nq-coord", &binary("nq-coord")?, &args, &env)?;
        let line = coord
            .line(|pipe, l| pipe == Pipe::Stdout && l.starts_with("listening on "))
            .await?;
        let addr = line["listening on ".len()..].trim().to_owned();
        let worker_env = [
            ("NQ_CONNECT", addr.as_str()),
            ("NQ_THREADS", "1"),
            ("NQ_NAME", "from-the-environment"),
        ];
        let mut env = LOG_ENV.to_vec();
        env.extend(worker_env);
        let mut w = Proc::spawn("nq-worker", &binary("nq-worker")?, &[], &env)?;
        coord.line_containing("from-the-environment").await?;
        // Its only machine is one remote worker (`--local-threads 0`): since probation
        // (issue 15, item 7) nobody checks it, so the run ends `unchecked` (exit 6)
        // with the published totals, where it ended `complete` unchecked before.
        let status = coord.wait().await?;
        ensure!(status.code() == Some(6), "exit {status}, not 6 (unchecked)");
        w.success().await?;
        let report = Report::read(&dir)?;
        ensure!(report.n == 12, "ran N = {}", report.n);
        report.check_unchecked()?;

        // The run's variables do not stop a subcommand in the same
        // environment: `health` runs (and finds the coordinator gone).
        let mut env = LOG_ENV.to_vec();
        env.extend([("NQ_N", "12"), ("NQ_DATA", dir_text.as_str())]);
        let args = ["health", "--connect", &addr].map(str::to_owned);
        let mut health = Proc::spawn("health", &binary("nq-coord")?, &args, &env)?;
        let status = health.wait().await?;
        let out = health.output();
        ensure!(status.code() == Some(1), "exit {status}:\n{out}");
        ensure!(out.contains("no coordinator answers"), "{out}");
        Ok(())
    })
    .await
}

/// Thread counts beyond nq-core's cap (`nq_core::pool::MAX_THREADS`) are
/// refused at once as usage errors naming the range, instead of panicking a
/// thread and hanging.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thread_counts_beyond_the_cap_are_refused() -> Result<()> {
    within(LIMIT, "thread caps", async {
        let tmp = tempfile::tempdir()?;
        let dir = data_dir(&tmp).display().to_string();
        let coord_args = ["--n", "8", "--data", &dir, "--local-threads", "100000"];
        let mut coord = Proc::spawn(
            "nq-coord",
            &binary("nq-coord")?,
            &coord_args.map(str::to_owned),
            LOG_ENV,
        )?;
        let status = coord.wait().await?;
        let out = coord.output();
        ensure!(status.code() == Some(2), "exit {status}:\n{out}");
        ensure!(out.contains("0..=4096"), "the range is not named:\n{out}");
        ensure!(!Path::new(&dir).exists(), "a data directory was created");

        let mut w = worker("w", "127.0.0.1:1", &["--threads", "100000"])?;
        let status = w.wait().await?;
        let out = w.output();
        ensure!(status.code() == Some(2), "exit {status}:\n{out}");
        ensure!(out.contains("1..=4096"), "the range is not named:\n{out}");
        Ok(())
    })
    .await
}

/// Values the coordinator library refuses (`Config::validate`, which
/// clamps nothing) are a bad command line like the ones clap refuses: exit
/// 2, the flag and the accepted values named, and nothing created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_the_library_refuses_exit_2() -> Result<()> {
    within(LIMIT, "library refusals", async {
        let tmp = tempfile::tempdir()?;
        let dir = data_dir(&tmp).display().to_string();
        for (flag, value, accepted) in [
            ("--ban-after", "0", "at least 1"),
            ("--job-size", "5000", "1 to 4096"),
            ("--jobs", "0", "at least 1"),
        ] {
            let args = [
                "--n",
                "8",
                "--data",
                &dir,
                "--listen",
                "127.0.0.1:0",
                flag,
                value,
            ];
            let mut coord = Proc::spawn(
                "nq-coord",
                &binary("nq-coord")?,
                &args.map(str::to_owned),
                LOG_ENV,
            )?;
            let status = coord.wait().await?;
            let out = coord.output();
            ensure!(status.code() == Some(2), "{flag}: exit {status}:\n{out}");
            ensure!(
                out.contains(flag) && out.contains(accepted),
                "{flag}: unclear message:\n{out}"
            );
            ensure!(!out.contains("listening on"), "{flag}: it listened:\n{out}");
            ensure!(
                !Path::new(&dir).exists(),
                "{flag}: a data directory was created"
            );
        }
        Ok(())
    })
    .await
}

/// A worker that no coordinator answers exits 1 after `--give-up`, naming
/// the address and how long it tried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_gives_up_without_a_coordinator() -> Result<()> {
    within(LIMIT, "give up", async {
        let addr = free_port()?.to_string();
        let mut w = worker("lonely", &addr, &["--threads", "1", "--give-up", "1s"])?;
        let status = w.wait().await?;
        let out = w.output();
        ensure!(status.code() == Some(1), "exit {status}:\n{out}");
        let error = out
            .lines()
            .find(|l| l.starts_with("nq-worker: error:"))
            .with_context(|| format!("no error line:\n{out}"))?;
        ensure!(
            error.contains(&format!("no coordinator answered at http://{addr} for 1s"))
                && error.contains("since the worker started"),
            "unclear message: {error}"
        );
        Ok(())
    })
    .await
}

/// With `--log-format json`, every line on stderr is a JSON object, the
/// final error included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_are_json_to_the_last_line() -> Result<()> {
    within(LIMIT, "json logs", async {
        let addr = free_port()?.to_string();
        let args = ["--threads", "1", "--give-up", "1s", "--log-format", "json"];
        let mut w = worker("json", &addr, &args)?;
        let status = w.wait().await?;
        let out = w.output();
        ensure!(status.code() == Some(1), "exit {status}:\n{out}");
        let mut last = None;
        for line in out.lines() {
            let event: serde_json::Value = serde_json::from_str(line)
                .with_context(|| format!("not JSON: {line}\n{out}"))?;
            ensure!(event.get("level").is_some(), "no level: {line}");
            last = Some(event);
        }
        let last = last.context("no log lines")?;
        ensure!(last["level"] == "ERROR", "last event: {last}");
        let error = last["error"].as_str().unwrap_or_default();
        ensure!(error.contains("gave up"), "last event: {last}");
        Ok(())
    })
    .await
}

/// Starts `program` with stdout and stderr into one pipe, reads its first
/// line, closes the pipe (as `2>&1 | head -1` does) and returns its exit
/// status.
async fn run_with_output_closed_after_one_line(
    program: &Path,
    args: &[&str],
) -> Result<ExitStatus> {
    let (reader, writer) = std::io::pipe()?;
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .envs(LOG_ENV.iter().copied())
        .stdin(Stdio::null())
        .stdout(writer.try_clone()?)
        .stderr(writer)
        .kill_on_drop(true);
    let mut child = cmd.spawn()?;
    // Only the child may hold the write end, so that closing the read end
    // is seen by the child and nobody else.
    drop(cmd);
    let first = tokio::task::spawn_blocking(move || {
        let mut reader = std::io::BufReader::new(reader);
        let mut line = String::new();
        reader.read_line(&mut line).map(|_| line)
        // `reader` is dropped here: the pipe is closed.
    })
    .await??;
    ensure!(!first.is_empty(), "no output at all");
    Ok(child.wait().await?)
}

/// `nq-worker … 2>&1 | head -1`: the worker keeps logging into the closed
/// pipe, and its exit status is its own (1, it gave up), not a panic's (101).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_pipe_does_not_kill_a_worker() -> Result<()> {
    within(LIMIT, "worker | head -1", async {
        let addr = free_port()?.to_string();
        let args = ["--connect", &addr, "--threads", "1", "--give-up", "2s"];
        let status =
            run_with_output_closed_after_one_line(&binary("nq-worker")?, &args).await?;
        ensure!(status.code() == Some(1), "exit {status}");
        Ok(())
    })
    .await
}

/// `nq-coord … 2>&1 | head -1`: the coordinator logs and prints its result
/// line into the closed pipe, finishes the run exactly and exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_pipe_does_not_change_a_coordinators_run() -> Result<()> {
    within(LIMIT, "coord | head -1", async {
        let tmp = tempfile::tempdir()?;
        let dir = data_dir(&tmp);
        let dir_text = dir.display().to_string();
        let args = [
            "--n",
            "10",
            "--data",
            &dir_text,
            "--listen",
            "127.0.0.1:0",
            "--local-threads",
            "1",
        ];
        let status =
            run_with_output_closed_after_one_line(&binary("nq-coord")?, &args).await?;
        ensure!(status.success(), "exit {status}");
        Report::read(&dir)?.check_published()
    })
    .await
}

/// A data directory whose sled `conf` file was overwritten is refused with a
/// message naming the directory and what to do, and is left as it was: the
/// run is not silently started over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_data_directory_is_refused_with_what_to_do() -> Result<()> {
    within(LIMIT, "damaged conf", async {
        let tmp = tempfile::tempdir()?;
        let dir = data_dir(&tmp);
        // Interrupted after it started, so that a restart would resume it.
        let mut coord =
            Coord::ephemeral(&dir, &["--n", "12", "--local-threads", "0"]).await?;
        coord.proc.line_containing("serving workers").await?;
        coord.proc.terminate()?;
        coord.proc.wait().await?;
        let garbage = b"this is not a sled configuration\n";
        std::fs::write(dir.join("conf"), garbage)?;

        let dir_text = dir.display().to_string();
        let args = ["--n", "12", "--data", &dir_text, "--listen", "127.0.0.1:0"];
        let mut again = Proc::spawn(
            "nq-coord",
            &binary("nq-coord")?,
            &args.map(str::to_owned),
            LOG_ENV,
        )?;
        let status = again.wait().await?;
        let out = again.output();
        ensure!(
            !status.success(),
            "a damaged directory was accepted:\n{out}"
        );
        let error = out
            .lines()
            .find(|l| l.starts_with("nq-coord: error:"))
            .with_context(|| format!("no error line:\n{out}"))?;
        for want in [
            &format!("data directory {dir_text} is damaged")[..],
            "restore the directory from a backup",
            "start a new run in another directory",
        ] {
            ensure!(error.contains(want), "{want:?} missing: {error}");
        }
        ensure!(!error.contains("backtrace"), "sled's raw text: {error}");
        ensure!(
            std::fs::read(dir.join("conf"))? == garbage,
            "the damaged directory was changed"
        );
        Ok(())
    })
    .await
}
