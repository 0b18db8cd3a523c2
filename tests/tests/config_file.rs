//! `nq-coord --config FILE` and the settings that travel with a run (issue
//! 25, item 4), with the real binary: a coordinator started from a TOML file
//! alone completes its run; `--print-config` prints a file that `--config`
//! takes back; bad files are refused naming the file, the line and the key;
//! a resume that gives another `--verify` or `--gpu-sample` (on a flag or
//! in the environment) than the one stored with the run is refused naming
//! both values, and with `--change-settings` it goes on, logs the change as
//! a warning and lists it in report.json.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};
use nq_e2e::{Coord, LOG_ENV, Proc, Report, binary, within};

use crate::{LIMIT, data_dir};

/// Writes `text` into `name` in `dir` and returns its path.
fn write(dir: &Path, name: &str, text: &str) -> Result<PathBuf> {
    let path = dir.join(name);
    std::fs::write(&path, text)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path)
}

/// Runs `nq-coord ARGS…` to its end; returns its exit code and output.
async fn refused(args: &[&str]) -> Result<(Option<i32>, String)> {
    refused_with_env(args, &[]).await
}

/// [`refused`] with the variables `env` set besides the log's.
async fn refused_with_env(
    args: &[&str],
    env: &[(&str, &str)],
) -> Result<(Option<i32>, String)> {
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    let env = [LOG_ENV, env].concat();
    let mut proc = Proc::spawn("nq-coord", &binary("nq-coord")?, &args, &env)?;
    let status = proc.wait().await?;
    Ok((status.code(), proc.output()))
}

/// A coordinator whose every option comes from a TOML file (the data
/// directory, the address, N and the threads included) completes its run,
/// in the directory the file names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_started_from_a_toml_file_completes_its_run() -> Result<()> {
    within(LIMIT, "run from a config file", async {
        let tmp = tempfile::tempdir()?;
        let dir = data_dir(&tmp);
        let file = write(
            tmp.path(),
            "nq.toml",
            &format!(
                "# A run of N = 10 on two local threads.\n\
                 n = 10\n\
                 data = {:?}\n\
                 listen = \"127.0.0.1:0\"\n\
                 local-threads = 2\n\
                 lease-ttl = \"10s\"\n\
                 verify = \"auto\"\n",
                dir.display().to_string()
            ),
        )?;
        let mut coord =
            Coord::spawn(&dir, &["--config", &file.display().to_string()], LOG_ENV)
                .await?;
        let report = coord.finish().await?;
        report.check_published()?;
        ensure!(report.n == 10, "the file's n was not used: {}", report.json);
        ensure!(
            report.json["setting_changes"] == serde_json::json!([]),
            "a run nobody changed lists changes: {}",
            report.json
        );
        Ok(())
    })
    .await
}

/// `--print-config` prints the effective options as a file that
/// `--config` takes back to the same options; a flag wins over the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_printed_configuration_is_taken_back() -> Result<()> {
    within(LIMIT, "print-config round trip", async {
        let tmp = tempfile::tempdir()?;
        let file = write(
            tmp.path(),
            "a.toml",
            "n = 12\nverify = 0.05\ntrust = [\"token:lab\"]\nlocal-threads = 1\n",
        )?;
        let file = file.display().to_string();
        let (code, first) =
            refused(&["--config", &file, "--n", "13", "--print-config"]).await?;
        ensure!(code == Some(0), "exit {code:?}:\n{first}");
        for line in [
            "n = 13",
            "verify = \"0.05\"",
            "trust = [\"token:lab\"]",
            "local-threads = 1",
        ] {
            ensure!(
                first.lines().any(|l| l == line),
                "`{line}` is not printed:\n{first}"
            );
        }
        let again = write(tmp.path(), "b.toml", &first)?;
        let again = again.display().to_string();
        let (code, second) = refused(&["--config", &again, "--print-config"]).await?;
        ensure!(code == Some(0), "exit {code:?}:\n{second}");
        ensure!(
            first == second,
            "printed again, the configuration differs:\n{first}\n---\n{second}"
        );
        Ok(())
    })
    .await
}

/// Each option takes its value from the highest layer that sets it: flag,
/// then `NQ_*` variable, then file, then default.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flag_beats_the_environment_which_beats_the_file() -> Result<()> {
    within(LIMIT, "precedence of the layers", async {
        let tmp = tempfile::tempdir()?;
        let file = write(
            tmp.path(),
            "layers.toml",
            "n = 9\nverify = 0.2\nban-after = 4\nlease-ttl = \"7s\"\n",
        )?;
        let args = [
            "--config".to_owned(),
            file.display().to_string(),
            "--ban-after".to_owned(),
            "6".to_owned(),
            "--print-config".to_owned(),
        ];
        let env = [LOG_ENV, &[("NQ_VERIFY", "0.5"), ("NQ_BAN_AFTER", "5")]].concat();
        let mut proc = Proc::spawn("nq-coord", &binary("nq-coord")?, &args, &env)?;
        let status = proc.wait().await?;
        let out = proc.output();
        ensure!(status.success(), "exit {status}:\n{out}");
        for (line, why) in [
            (
                "ban-after = 6",
                "the flag beats the environment and the file",
            ),
            ("verify = \"0.5\"", "the environment beats the file"),
            ("lease-ttl = \"7s\"", "the file beats the default"),
            ("n = 9", "the file sets what nothing above it sets"),
            (
                "# cache-mib = 16 (default)",
                "the default, where nothing sets it",
            ),
        ] {
            ensure!(
                out.lines().any(|l| l == line),
                "{why}: no `{line}` in\n{out}"
            );
        }
        Ok(())
    })
    .await
}

/// Bad files are refused before anything is created, exit 2, with the
/// file, the line, the key and the accepted form; a missing file is named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_config_files_are_refused_clearly() -> Result<()> {
    within(LIMIT, "bad config files", async {
        let tmp = tempfile::tempdir()?;
        let dir = data_dir(&tmp).display().to_string();
        let cases = [
            (
                "n = 8\nlisten = \"127.0.0.1:0\"\nlocal-thread = 0\n",
                ":3: unknown key `local-thread`",
                "local-threads",
            ),
            (
                "n = 8\nlocal-threads = \"four\"\n",
                ":2: `local-threads` takes an integer",
                "found a string",
            ),
            (
                "solutions = 1\n",
                ":1: `solutions` takes `true` or `false`",
                "found an integer",
            ),
            (
                "n = 8\nverify = 2\n",
                ":2: the value of `verify`",
                "from 0 to 1",
            ),
        ];
        for (i, (text, problem, accepted)) in cases.into_iter().enumerate() {
            let file = write(tmp.path(), &format!("bad{i}.toml"), text)?;
            let file = file.display().to_string();
            let (code, out) =
                refused(&["--config", &file, "--data", &dir, "--listen", "127.0.0.1:0"])
                    .await?;
            ensure!(code == Some(2), "{text:?}: exit {code:?}:\n{out}");
            ensure!(
                out.contains(&format!("{file}{problem}")) && out.contains(accepted),
                "{text:?}: unclear message:\n{out}"
            );
            ensure!(
                !out.contains("listening on"),
                "{text:?}: it listened:\n{out}"
            );
            ensure!(
                !Path::new(&dir).exists(),
                "{text:?}: a data directory was created"
            );
        }
        let missing = tmp.path().join("missing.toml").display().to_string();
        let (code, out) = refused(&["--config", &missing]).await?;
        ensure!(code == Some(2), "missing file: exit {code:?}:\n{out}");
        ensure!(
            out.contains(&format!("cannot read the config file {missing}"))
                && out.contains("No such file"),
            "missing file: unclear message:\n{out}"
        );
        Ok(())
    })
    .await
}

/// The settings that decide what counts travel with the run: made with
/// `verify = 0` and `gpu-sample = "2%"` in its file, the run refuses a
/// resume with `--verify auto`, and one with `NQ_GPU_SAMPLE=0.5%`, naming
/// both values and the way to change them; a resume without them judges
/// by the stored ones; with `--change-settings` the resume goes on, warns,
/// and report.json lists the change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_under_another_verify_is_refused_unless_changed() -> Result<()> {
    within(LIMIT, "settings travel with the run", async {
        let tmp = tempfile::tempdir()?;
        let dir = data_dir(&tmp);
        let data = dir.display().to_string();
        // No local threads and no worker: the run serves until stopped.
        let file = write(
            tmp.path(),
            "made.toml",
            &format!(
                "n = 11\ndata = {data:?}\nlisten = \"127.0.0.1:0\"\nlocal-threads = 0\nverify = 0\ngpu-sample = \"2%\"\n"
            ),
        )?;
        let mut made = Coord::spawn(&dir, &["--config", &file.display().to_string()], LOG_ENV).await?;
        made.proc.line_containing("serving workers").await?;
        made.proc.signal(libc::SIGINT)?;
        let status = made.proc.wait().await?;
        ensure!(status.code() == Some(3), "interrupted run exited with {status}");

        let resume = ["--data", &data, "--listen", "127.0.0.1:0", "--local-threads", "2"];
        let (code, out) = refused(&[&resume[..], &["--verify", "auto"]].concat()).await?;
        // Exit 2, as for other refused options: a retry would only repeat it.
        ensure!(code == Some(2), "exit {code:?}:\n{out}");
        ensure!(
            out.contains("--verify: stored 0, given auto") && out.contains("--change-settings"),
            "the refusal does not name both values and the way out:\n{out}"
        );
        ensure!(!out.contains("listening on"), "the refused resume listened:\n{out}");
        // The CPU sample's share travels too, given in the environment here
        // (the default, 0.5 %, written out: a given value, not a default).
        let (code, out) = refused_with_env(&resume, &[("NQ_GPU_SAMPLE", "0.5%")]).await?;
        ensure!(code == Some(2), "exit {code:?}:\n{out}");
        ensure!(
            out.contains("--gpu-sample: stored 0.02, given 0.005")
                && out.contains("--change-settings")
                && !out.contains("--verify:"),
            "the refusal does not name the stored and the given --gpu-sample:\n{out}"
        );
        ensure!(!out.contains("listening on"), "the refused resume listened:\n{out}");

        // Left out, the setting is the stored one (not the default, auto).
        // Logged before `listening on`, which `Coord::spawn` waits for.
        let mut kept = Coord::spawn(&dir, &resume, LOG_ENV).await?;
        let judged = kept
            .proc
            .lines_containing("judging by the settings stored with the run");
        ensure!(
            judged.len() == 1
                && nq_e2e::log_field(&judged[0], "verify") == Some("0")
                && nq_e2e::log_field(&judged[0], "gpu_sample") == Some("0.02"),
            "the resume without --verify and --gpu-sample does not judge by the stored 0 and 0.02:\n{}",
            kept.proc.output()
        );
        kept.proc.signal(libc::SIGINT)?;
        let status = kept.proc.wait().await?;
        ensure!(status.code() == Some(3), "interrupted resume exited with {status}");

        let changed = [&resume[..], &["--verify", "auto", "--change-settings"]].concat();
        let mut coord = Coord::spawn(&dir, &changed, LOG_ENV).await?;
        let report = coord.finish().await?;
        report.check_published()?;
        let warned = coord.proc.lines_containing("changing a setting that decides what counts");
        ensure!(
            warned.len() == 1 && warned[0].contains("WARN") && warned[0].contains("verify"),
            "the change was not logged once as a warning:\n{}",
            coord.proc.output()
        );
        let changes = report.json["setting_changes"]
            .as_array()
            .with_context(|| format!("no setting_changes: {}", report.json))?;
        ensure!(
            changes.len() == 1
                && changes[0]["setting"] == "verify"
                && changes[0]["from"] == "0"
                && changes[0]["to"] == "auto"
                && changes[0]["unix_ms"].as_u64().is_some_and(|t| t > 0),
            "report.json does not record the change: {}",
            report.json
        );
        // The finished run's report, read again, keeps it.
        ensure!(
            Report::read(&dir)?.json["setting_changes"] == report.json["setting_changes"],
            "report.json lost the change"
        );
        Ok(())
    })
    .await
}
