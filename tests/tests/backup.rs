//! Backups and disaster recovery (issue 17, item 5): a backup taken while the
//! run serves, a lost data directory rebuilt from it, the run resumed with
//! exact counts and the jobs finished after the backup computed again;
//! periodic backups that keep the newest two; and a backup cut short or
//! edited refused by name.

use std::path::Path;

use anyhow::{Context, Result, ensure};
use nq_e2e::{Coord, LOG_ENV, Proc, binary, log_field, within};

use crate::{LIMIT, data_dir};

/// The coordinator's log line for a job's first result made durable and
/// counted (debug level; logged after the flush that covers it).
const DONE: &str = "copy counts";

/// A run of 440 jobs of about 5 ms of one core each (N=17, two extra
/// columns) on one local thread: a backup and a kill land in its first
/// tenth, and the whole test takes seconds.
const SHORT_JOBS: [&str; 8] = [
    "--n",
    "17",
    "--split",
    "0:2",
    "--jobs",
    "400",
    "--local-threads",
    "1",
];

/// A run of 195 jobs of about 75 ms of one core each (N=18, one extra
/// column) on one local thread: it outlasts three backups 200 ms apart by
/// seconds, and is stopped after them.
const LONG_JOBS: [&str; 8] = [
    "--n",
    "18",
    "--split",
    "0:1",
    "--jobs",
    "200",
    "--local-threads",
    "1",
];

/// Runs `nq-coord ARGS…` to its end; returns its exit code and output.
async fn nq_coord(args: &[&str]) -> Result<(Option<i32>, String)> {
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    let mut p = Proc::spawn("nq-coord", &binary("nq-coord")?, &args, LOG_ENV)?;
    let status = p.wait().await?;
    Ok((status.code(), p.output()))
}

/// Runs `nq-coord ARGS…`, which must succeed, and returns its line that
/// starts with `prefix`.
async fn nq_coord_line(args: &[&str], prefix: &str) -> Result<String> {
    let (code, out) = nq_coord(args).await?;
    ensure!(code == Some(0), "nq-coord {args:?} exited {code:?}:\n{out}");
    out.lines()
        .find(|l| l.starts_with(prefix))
        .map(str::to_owned)
        .with_context(|| format!("no {prefix:?} line from nq-coord {args:?}:\n{out}"))
}

/// A numeric field of a `key=value` line.
fn field(line: &str, key: &str) -> Result<u64> {
    log_field(line, key)
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("no numeric {key}= in {line:?}"))
}

fn text(path: &Path) -> String {
    path.display().to_string()
}

/// A run is backed up while it serves, finishes more jobs, is SIGKILLed and
/// loses its data directory; restored from the backup and resumed, it ends
/// with the published counts, having computed again exactly the jobs the
/// backup did not hold (more than it finished after the backup).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_directory_restored_from_a_backup_resumes_exactly() -> Result<()> {
    within(LIMIT, "backup, kill, restore, resume", async {
        let tmp = tempfile::tempdir()?;
        let dir = data_dir(&tmp);
        let file = tmp.path().join("run.nqbackup");
        let mut coord = Coord::ephemeral(&dir, &SHORT_JOBS).await?;
        for _ in 0..5 {
            coord.proc.line_containing(DONE).await?;
        }
        let written = nq_coord_line(
            &["backup", "--data", &text(&dir), "--to", &text(&file)],
            "backup written:",
        )
        .await?;
        ensure!(
            log_field(&written, "by") == Some("serving-run"),
            "{written}"
        );
        let at_backup = field(&written, "done")?;
        ensure!(at_backup >= 5, "{written}");
        // More jobs finish after the backup; each line is logged after its
        // flush, so every one counted here is durable at the kill.
        let mut seen = 5;
        while seen < at_backup + 10 {
            coord.proc.line_containing(DONE).await?;
            seen += 1;
        }
        coord.proc.kill().await?;
        let at_kill = coord.proc.lines_containing(DONE).len() as u64;
        ensure!(
            at_kill > at_backup,
            "done at kill {at_kill}, at backup {at_backup}"
        );

        std::fs::remove_dir_all(&dir)?;
        let restored = nq_coord_line(
            &["restore", "--from", &text(&file), "--data", &text(&dir)],
            "restored:",
        )
        .await?;
        ensure!(field(&restored, "done")? == at_backup, "{restored}");

        let mut resumed =
            Coord::ephemeral(&dir, &["--n", "17", "--local-threads", "2"]).await?;
        let report = resumed.finish().await?;
        report.check_published()?;
        let restored_line = resumed
            .proc
            .lines_containing("restored finished jobs")
            .pop()
            .context("the resumed run restored no finished jobs")?;
        ensure!(
            field(&restored_line, "done")? == at_backup,
            "{restored_line}"
        );
        let recomputed = resumed.proc.lines_containing(DONE).len() as u64;
        // Shown with --nocapture: what the backup held, what the kill lost.
        eprintln!(
            "jobs {}: done at the backup {at_backup}, at the kill at least {at_kill}; \
             computed after the restore {recomputed}",
            report.jobs
        );
        ensure!(
            recomputed == report.jobs - at_backup && recomputed > report.jobs - at_kill,
            "jobs {}, done at backup {at_backup}, at kill {at_kill}, computed after \
             the restore {recomputed}",
            report.jobs
        );
        Ok(())
    })
    .await
}

/// `--backup-every` keeps the newest two backups, each whole (no temporary
/// file is left); the newest restores; a copy cut short, a copy with one
/// byte changed, and a restore over a non-empty directory are refused with
/// what is wrong named; a stopped run's directory is backed up directly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn periodic_backups_keep_two_and_damaged_ones_are_refused() -> Result<()> {
    within(LIMIT, "periodic backups", async {
        let tmp = tempfile::tempdir()?;
        let dir = data_dir(&tmp);
        let backups = tmp.path().join("backups");
        let mut args = LONG_JOBS.to_vec();
        let to = text(&backups);
        args.extend(["--backup-every", "200ms", "--backup-to", &to]);
        let mut coord = Coord::ephemeral(&dir, &args).await?;
        let mut last = String::new();
        for _ in 0..3 {
            last = coord.proc.line_containing("backup written").await?;
        }
        coord.proc.terminate()?;
        coord.proc.wait().await?;
        // The backups written before the stop, the newest last.
        let mut names: Vec<String> = std::fs::read_dir(&backups)?
            .map(|e| Ok(e?.file_name().to_string_lossy().into_owned()))
            .collect::<Result<_>>()?;
        names.sort();
        ensure!(
            names.len() == 2 && names.iter().all(|n| n.ends_with(".nqbackup")),
            "{names:?}"
        );
        let newest = backups.join(&names[1]);
        let logged = coord
            .proc
            .lines_containing("backup written")
            .pop()
            .unwrap_or(last);
        ensure!(logged.contains(&names[1]), "{logged} is not {names:?}");

        let target = tmp.path().join("restored");
        let restored = nq_coord_line(
            &[
                "restore",
                "--from",
                &text(&newest),
                "--data",
                &text(&target),
            ],
            "restored:",
        )
        .await?;
        ensure!(
            field(&restored, "done")? == field(&logged, "jobs_done")?,
            "{restored} vs {logged}"
        );

        // Over a non-empty directory: refused, naming --force; with it, done.
        let over = [
            "restore",
            "--from",
            &text(&newest),
            "--data",
            &text(&target),
        ];
        let (code, out) = nq_coord(&over).await?;
        ensure!(
            code == Some(1) && out.contains("--force"),
            "{code:?}:\n{out}"
        );
        let forced = [&over[..], &["--force"]].concat();
        nq_coord_line(&forced, "restored:").await?;

        let bytes = std::fs::read(&newest)?;
        let cut = tmp.path().join("cut.nqbackup");
        std::fs::write(&cut, &bytes[..bytes.len() * 2 / 3])?;
        let elsewhere = text(&tmp.path().join("elsewhere"));
        let (code, out) =
            nq_coord(&["restore", "--from", &text(&cut), "--data", &elsewhere]).await?;
        ensure!(
            code == Some(1) && out.contains("is truncated"),
            "{code:?}:\n{out}"
        );
        let mut edited = bytes.clone();
        let middle = edited.len() / 2;
        edited[middle] ^= 0x01;
        let altered = tmp.path().join("edited.nqbackup");
        std::fs::write(&altered, &edited)?;
        let (code, out) =
            nq_coord(&["restore", "--from", &text(&altered), "--data", &elsewhere])
                .await?;
        ensure!(
            code == Some(1) && out.contains("was altered after it was sealed"),
            "{code:?}:\n{out}"
        );
        ensure!(
            !tmp.path().join("elsewhere").exists(),
            "a refused restore wrote"
        );

        // The stopped run's directory, read directly.
        let offline = tmp.path().join("offline.nqbackup");
        let line = nq_coord_line(
            &["backup", "--data", &text(&dir), "--to", &text(&offline)],
            "backup written:",
        )
        .await?;
        ensure!(log_field(&line, "by") == Some("stopped-run"), "{line}");
        Ok(())
    })
    .await
}
