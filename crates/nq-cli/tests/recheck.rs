//! `nq recheck` against a real run: the coordinator library counts N = 11 on
//! its own threads into a sled directory, `nq_coord::audit` writes the audit
//! from that directory, and the built `nq` binary re-checks it, as a
//! stranger would with the published files.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use nq_coord::Config;
use nq_coord::quorum::Fraction;
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;

/// A finished run and its audit.
struct Published {
    /// Holds the data directory and the audit.
    _dir: tempfile::TempDir,
    /// The audit as `nq-coord audit` writes it.
    audit: PathBuf,
    /// The digest the run's final line and report.json print.
    digest: String,
}

/// Runs N = `n` to completion on the coordinator's own threads, then audits
/// it. The audit's digest must be the run's.
fn publish(n: u64) -> Published {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("run");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let run = || {
        runtime.block_on(async {
            let mut config = Config::new(n, &data).unwrap();
            config.local_threads = 2;
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let run = nq_coord::run(config, listener, std::future::pending());
            tokio::time::timeout(Duration::from_secs(120), run)
                .await
                .expect("the run finishes within two minutes")
                .unwrap()
        })
    };
    let report = run();
    // Started again on the finished directory, the coordinator prints the
    // stored result: with the same digest, found again from the store.
    assert_eq!(run().audit_digest, report.audit_digest);
    assert!(report.complete, "{}", report.summary_line());
    let digest = report
        .audit_digest
        .expect("a complete run has an audit digest");
    let line = report.summary_line();
    assert!(line.contains(&format!(" audit={digest} ")), "{line}");
    let json = std::fs::read_to_string(data.join("report.json")).unwrap();
    assert!(
        json.contains(&format!("\"audit_digest\":\"{digest}\"")),
        "{json}"
    );

    let mut csv = Vec::new();
    let audit = nq_coord::audit::audit(&data, &mut csv, Fraction::Auto).unwrap();
    assert!(audit.agrees());
    assert_eq!(
        audit.digest, digest,
        "the audit and the run's final line disagree"
    );
    let path = dir.path().join("audit.csv");
    std::fs::write(&path, &csv).unwrap();
    Published {
        _dir: dir,
        audit: path,
        digest: digest.to_string(),
    }
}

fn recheck(audit: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_nq"))
        .arg("recheck")
        .arg(audit)
        .args(args)
        .output()
        .expect("the binary runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The audit's lines, with `edit` applied to the first row (in file order)
/// for which it returns a new line.
fn edited(audit: &Path, edit: impl Fn(&[&str]) -> Option<String>) -> String {
    let text = std::fs::read_to_string(audit).unwrap();
    let mut done = false;
    let mut out = String::new();
    for line in text.lines() {
        let row = !(done || line.starts_with('#') || line.starts_with("job,"));
        let cells: Vec<&str> = line.split(',').collect();
        match row.then(|| edit(&cells)).flatten() {
            Some(new) => {
                done = true;
                out.push_str(&new);
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    assert!(done, "no row to edit");
    out
}

/// Replaces the digest line with the digest of everything before it, as a
/// forger who edits the audit would.
fn redigest(text: &str) -> String {
    let body = &text[..text.find("# digest=").expect("a digest line")];
    let hex: String = Sha256::digest(body.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{body}# digest=sha256:{hex}\n")
}

#[test]
fn a_sample_of_a_finished_run_matches_and_so_does_every_job() {
    let run = publish(11);
    let out = recheck(
        &run.audit,
        &[
            "--sample",
            "8",
            "--seed",
            "2026-11-25",
            "--digest",
            &run.digest,
        ],
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    // One summary line and nothing else.
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    let last = stdout.lines().last().unwrap();
    assert!(last.contains(&format!("digest={}", run.digest)), "{last}");
    assert!(last.contains("total=2680 unique=341"), "{last}");
    assert!(last.contains("sampled=8 matched=8"), "{last}");
    assert!(last.ends_with("status=match"), "{last}");
    // The same seed chooses the same jobs; another seed, others.
    let sample = |o: &Output| {
        text(&o.stdout)
            .lines()
            .find(|l| l.starts_with("sample: "))
            .map(|l| l.split(": ").nth(1).unwrap().to_owned())
            .unwrap()
    };
    let sampled = recheck(
        &run.audit,
        &["--sample", "8", "--seed", "2026-11-25", "--verbose"],
    );
    let again = recheck(
        &run.audit,
        &["--sample", "8", "--seed", "2026-11-25", "--verbose"],
    );
    assert_eq!(sample(&again), sample(&sampled));
    let other = recheck(
        &run.audit,
        &["--sample", "8", "--seed", "another", "--verbose"],
    );
    assert_ne!(sample(&other), sample(&sampled));
    // A line per job solved again, with --verbose only.
    let jobs = |o: &Output| {
        text(&o.stdout)
            .lines()
            .filter(|l| l.starts_with("job "))
            .count()
    };
    assert_eq!(jobs(&sampled), 8, "{}", text(&sampled.stdout));
    assert_eq!(jobs(&out), 0, "{stdout}");
    // Every job, on the portable kernel.
    let all = recheck(
        &run.audit,
        &["--sample", "100000", "--seed", "x", "--kernel", "scalar"],
    );
    let stdout = text(&all.stdout);
    assert!(all.status.success(), "{stdout}{}", text(&all.stderr));
    assert!(!stdout.contains("MISMATCH"), "{stdout}");
}

#[test]
fn by_default_the_digest_and_sums_are_checked_in_one_line() {
    let run = publish(10);
    let out = recheck(&run.audit, &["--digest", &run.digest]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    assert!(stdout.starts_with("recheck n=10 "), "{stdout}");
    assert!(stdout.contains("total=724 unique=92"), "{stdout}");
    assert!(stdout.contains("sampled=0 matched=0"), "{stdout}");
    assert!(stdout.ends_with("status=match\n"), "{stdout}");
    // Another digest fails, with no sample either.
    let other = format!("sha256:{}", "ab".repeat(32));
    let out = recheck(&run.audit, &["--digest", &other]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("not the published one"),
        "{}",
        text(&out.stderr)
    );
    // A sample needs its seed: a usage error that names it.
    let out = recheck(&run.audit, &["--sample", "3"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("--seed"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn an_edited_count_fails_naming_the_job() {
    let run = publish(11);
    // The first job with solutions, one more than it has.
    let mut job = String::new();
    let text_of = edited(&run.audit, |cells| {
        let total: u128 = cells[7].parse().ok()?;
        if total == 0 {
            return None;
        }
        let mut cells: Vec<String> = cells.iter().map(|c| (*c).to_owned()).collect();
        cells[7] = (total + 1).to_string();
        Some(cells.join(","))
    });
    for line in text_of.lines() {
        let original = std::fs::read_to_string(&run.audit).unwrap();
        if !line.starts_with('#') && !original.lines().any(|l| l == line) {
            job = line.split(',').next().unwrap().to_owned();
        }
    }
    let path = run.audit.with_file_name("edited.csv");

    // Edited as it is: the digest and the sums give it away, and the job
    // itself when it is solved again.
    std::fs::write(&path, &text_of).unwrap();
    let out = recheck(&path, &["--sample", "100000", "--seed", "s"]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("the audit was edited"), "{stderr}");
    assert!(stderr.contains("the rows do not add up"), "{stderr}");
    assert!(
        stderr.contains(&format!("job {job} (sub-problems")),
        "{stderr}"
    );
    assert!(text(&out.stdout).ends_with("status=MISMATCH\n"));

    // A careful forger also fixes the stated total and the digest line: the
    // file is consistent, but it is not the published audit, and the job
    // still computes to its true count.
    let total = text_of
        .lines()
        .find(|l| l.starts_with("# end "))
        .unwrap()
        .to_owned();
    let forged =
        redigest(&text_of.replace(&total, &total.replace("total=2680", "total=2681")));
    std::fs::write(&path, &forged).unwrap();
    let out = recheck(
        &path,
        &["--sample", "100000", "--seed", "s", "--digest", &run.digest],
    );
    let stderr = text(&out.stderr);
    assert!(!out.status.success());
    assert!(!stderr.contains("the audit was edited"), "{stderr}");
    assert!(!stderr.contains("do not add up"), "{stderr}");
    assert!(stderr.contains("not the published one"), "{stderr}");
    assert!(
        stderr.contains(&format!("job {job} (sub-problems")),
        "{stderr}"
    );
}

#[test]
fn an_edited_row_without_a_digest_change_fails() {
    let run = publish(10);
    // Who computed a job is part of the record too: the counts are intact.
    let forged = edited(&run.audit, |cells| {
        let mut cells: Vec<String> = cells.iter().map(|c| (*c).to_owned()).collect();
        cells[9] = "someone-else@10.0.0.9".to_owned();
        Some(cells.join(","))
    });
    let path = run.audit.with_file_name("edited.csv");
    std::fs::write(&path, &forged).unwrap();
    let out = recheck(&path, &[]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("the audit was edited: its content hashes to"),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("but its digest line says {}", run.digest)),
        "{stderr}"
    );
    assert!(!stderr.contains("do not add up"), "{stderr}");
}
