//! A stored count edited by someone who can write the data directory (issue
//! 18, item 6, and its "tampered store" acceptance test).
//!
//! The attacker uses nq-store's own API, which recomputes every CRC: one
//! job's result gets a plausible lie (8 solutions more or fewer for one
//! sub-problem, its tally derived again as the coordinator derives it), and
//! the run's stored summary is rewritten to the new total, so that the
//! store agrees with itself.
//!
//! * Without a store key nothing in the store can tell; `nq-coord audit`
//!   must fail on the published total.
//! * With a key (in a file outside the data directory, which the attacker
//!   cannot read), the attacker writes the same forged value in place of
//!   the real one: resume and audit must refuse the store, naming the
//!   record, and the key must be needed to open it at all.
//!
//! A third test writes no lie into the counted records: it adds copies
//! that judging the run again would read otherwise than the run did, and
//! checks that a finished run is reprinted from its records.
//!
//! See: issue 18 (`issues show 18`).

use std::path::{Path, PathBuf};
use std::process::ExitStatus;

use anyhow::{Context, Result, bail, ensure};
use nq_core::split::{SubProblem, Tally};
use nq_core::{Board, Prefix};
use nq_e2e::client::lie;
use nq_e2e::{Coord, LOG_ENV, Proc, Report, binary, within};
use nq_store::{CommitBatch, Duplicate, DuplicateKind, JobId, Store, StoreOptions};

use crate::LIMIT;

/// Small enough for a debug build on two cores, large enough for jobs of
/// several sub-problems and a published total to miss.
const N: &str = "14";

/// A run on the coordinator's own threads: nothing else can check it, so
/// only the store stands between the run and its report.
const RUN: &[&str] = &["--n", N, "--local-threads", "2", "--linger", "1s"];

/// The store key of the keyed run: 32 bytes in hex, as `openssl rand -hex
/// 32` writes them.
const KEY_HEX: &str = "9f1c2a7e5b3d4c6f8a0b1e2d3c4f5a6b7c8d9e0f1a2b3c4d5e6f708192a3b4c5";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tampered_store_is_refused_with_a_key_and_fails_the_audit_without() -> Result<()>
{
    within(LIMIT, "tampered store", async {
        let tmp = tempfile::tempdir()?;
        // The key lives beside the data directories, not inside them.
        let key_file = tmp.path().join("store.key");
        std::fs::write(&key_file, format!("{KEY_HEX}\n"))?;
        let key_arg = key_file.display().to_string();
        let keyed = tmp.path().join("keyed");
        let plain = tmp.path().join("plain");

        run_to_the_end(&keyed, &["--store-key-file", &key_arg]).await?;
        run_to_the_end(&plain, &[]).await?;
        // Both audits pass before the attack: what fails later, fails
        // because of it.
        let (status, out) = audit(&keyed, &[("NQ_STORE_KEY", KEY_HEX)]).await?;
        ensure!(status.success(), "the keyed run's audit failed:\n{out}");
        let (status, out) = audit(&plain, &[]).await?;
        ensure!(status.success(), "the plain run's audit failed:\n{out}");

        // (b) Without a key: the lie goes in through the API, and only the
        // published total can tell.
        let (true_total, lied_total) = tamper(&plain)?;
        ensure!(lied_total != true_total, "the lie changed nothing");
        let (status, out) = audit(&plain, &[]).await?;
        ensure!(
            !status.success(),
            "audit accepted the tampered store:\n{out}"
        );
        ensure!(
            out.contains(&format!(
                "the total {lied_total} differs from the published total {true_total}"
            )),
            "audit did not name the published mismatch:\n{out}"
        );
        ensure!(
            !out.contains("stored when the run finished"),
            "the summary was rewritten to agree; only the published total may \
             catch the lie:\n{out}"
        );

        // (a) With a key: the attacker puts the forged value (CRCs and all,
        // as nq-store wrote it) in place of the real one.
        transplant_record_chunk(&plain, &keyed, 0)?;
        let keyed_arg = keyed.display().to_string();
        let args = [
            RUN,
            &["--data", &keyed_arg, "--listen", "127.0.0.1:0"],
            &["--store-key-file", &key_arg],
        ]
        .concat()
        .into_iter()
        .map(str::to_owned)
        .collect::<Vec<_>>();
        let mut resume = Proc::spawn("nq-coord", &binary("nq-coord")?, &args, LOG_ENV)?;
        let status = resume.wait().await?;
        let out = resume.output();
        ensure!(
            !status.success(),
            "resume accepted the tampered store:\n{out}"
        );
        // Refused before it announced a port (issue 26).
        ensure!(!out.contains("listening on"), "{out}");
        names_the_forged_record("resume", &out)?;
        let (status, out) = audit(&keyed, &[("NQ_STORE_KEY", KEY_HEX)]).await?;
        ensure!(
            !status.success(),
            "audit accepted the tampered store:\n{out}"
        );
        names_the_forged_record("audit", &out)?;

        // The key is needed to open the store at all, and no other key will
        // do.
        let (status, out) = audit(&keyed, &[]).await?;
        ensure!(
            !status.success() && out.contains("is sealed with a store key"),
            "a keyed store opened without its key:\n{out}"
        );
        let other = KEY_HEX.replace('9', "8");
        let (status, out) = audit(&keyed, &[("NQ_STORE_KEY", &other)]).await?;
        ensure!(
            !status.success() && out.contains("sealed with another store key"),
            "a keyed store opened with another key:\n{out}"
        );
        Ok(())
    })
    .await
}

/// A finished run whose coordinator died before writing report.json (in
/// the audit digest, which takes minutes at 10^8 jobs) is reprinted from
/// its stored summary, checked against its Done records: they are what the
/// run counted. Judging its copies again is not the run's verdict (a store
/// written before copies kept after completion were marked holds such
/// copies unmarked, and restore judges confirmations without the moments
/// each job settled). Here job 0's record is a remote identity's true copy,
/// and two other identities agree on a lie beside it, which judging again
/// would count. The reprint must print the run's total, exit 0 and move no
/// record; it used to refuse the directory as damaged, after moving the
/// record to the lie. The audit, which judges every copy again, names the
/// difference, and lists a copy kept after completion as such.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_run_is_reprinted_from_its_records_not_judged_again() -> Result<()> {
    within(LIMIT, "finished run reprinted", async {
        let tmp = tempfile::tempdir()?;
        let dir = tmp.path().join("run");
        let report = run_to_the_end(&dir, &[]).await?;
        let record = outvote_job_0(&dir)?;
        std::fs::remove_file(dir.join("report.json"))?;

        let args = [
            "--data",
            &dir.display().to_string(),
            "--listen",
            "127.0.0.1:0",
        ]
        .map(str::to_owned);
        let mut again = Proc::spawn("nq-coord", &binary("nq-coord")?, &args, LOG_ENV)?;
        let status = again.wait().await?;
        let out = again.output();
        ensure!(status.success(), "the finished run was refused:\n{out}");
        ensure!(
            out.contains(&format!("status=complete total={} ", report.total)),
            "the reprint did not print the run's total {}:\n{out}",
            report.total
        );
        {
            let store = Store::open(&dir, &StoreOptions::default())?;
            ensure!(
                store.result(JobId(0))?.as_ref() == Some(&record),
                "the reprint moved job 0's record"
            );
        }
        let (status, out) = audit(&dir, &[]).await?;
        ensure!(
            !status.success() && out.contains("differs from the total"),
            "the audit did not name the copies that judge otherwise:\n{out}"
        );
        let csv = std::fs::read_to_string(dir.with_extension("audit.csv"))?;
        let row = csv
            .lines()
            .find(|l| l.starts_with("0,"))
            .context("no row for job 0")?;
        ensure!(
            row.contains(
                "token:honest:agrees token:liar-a:differs token:liar-b:differs \
                 token:late:differs-after-completion"
            ),
            "job 0's row does not list its copies as stored: {row}"
        );
        Ok(())
    })
    .await
}

/// Rewrites job 0's record in the finished run in `dir` as a remote
/// identity's copy (the same counts) and adds two copies from two other
/// identities that agree on a lie, received after it, and a third lie kept
/// after the run completed. Returns the record.
fn outvote_job_0(dir: &Path) -> Result<nq_store::StoredResult> {
    let store = Store::open(dir, &StoreOptions::default())?;
    let manifest = store.manifest()?.context("no run stored")?;
    let (board, spec) = (manifest.key.board, manifest.key.spec);
    let mut record = store.result(JobId(0))?.context("job 0 is not done")?;
    record.identity = "token:honest".into();
    let mut batch = CommitBatch::new();
    batch.replace_result(
        JobId(0),
        record.clone(),
        store.job_record(JobId(0))?.attempts,
    );
    let copies = [
        ("token:liar-a", false),
        ("token:liar-b", false),
        ("token:late", true),
    ];
    for (at, (identity, after_completion)) in copies.into_iter().enumerate() {
        let mut copy = record.clone();
        lie(&mut copy.counts);
        copy.tally = tally_of(&store, board, spec, &copy.counts)?;
        copy.identity = identity.into();
        copy.received_unix_ms = record.received_unix_ms + 1 + at as u64;
        let duplicate = Duplicate {
            kind: DuplicateKind::Conflict,
            result: copy,
            after_completion,
        };
        batch.duplicate(JobId(0), &duplicate);
    }
    store.apply(batch)?;
    store.flush()?;
    Ok(record)
}

/// Runs N = 14 to the end in `dir` and checks its exact totals.
async fn run_to_the_end(dir: &Path, extra: &[&str]) -> Result<Report> {
    let mut coord =
        Coord::start_with_env(dir, "127.0.0.1:0", &[RUN, extra].concat(), LOG_ENV)
            .await?;
    let report = coord.finish().await?;
    report.check_exact()?;
    Ok(report)
}

/// `nq-coord audit --data DIR` with `env`: its exit status and everything
/// it wrote to stderr (the CSV goes to a file).
async fn audit(dir: &Path, env: &[(&str, &str)]) -> Result<(ExitStatus, String)> {
    let csv: PathBuf = dir.with_extension("audit.csv");
    let args = [
        "audit".to_owned(),
        "--data".to_owned(),
        dir.display().to_string(),
        "--output".to_owned(),
        csv.display().to_string(),
    ];
    let env: Vec<(&str, &str)> = LOG_ENV.iter().chain(env).copied().collect();
    let mut proc = Proc::spawn("nq-coord audit", &binary("nq-coord")?, &args, &env)?;
    let status = proc.wait().await?;
    Ok((status, proc.output()))
}

/// The attack, through nq-store's own API (no key): job 0's result gets a
/// plausible lie, its tally derived again from the job's sub-problems, and
/// the summary is set to the new totals. Returns the true total and the
/// lied one.
fn tamper(dir: &Path) -> Result<(u128, u128)> {
    let store = Store::open(dir, &StoreOptions::default())?;
    let manifest = store.manifest()?.context("no run stored")?;
    let (board, spec) = (manifest.key.board, manifest.key.spec);
    let mut summary = store.summary()?.context("the run did not finish")?;
    let true_total = summary.total;
    let mut result = store.result(JobId(0))?.context("job 0 is not done")?;
    lie(&mut result.counts);
    result.tally = tally_of(&store, board, spec, &result.counts)?;
    let attempts = store.job_record(JobId(0))?.attempts;
    let mut batch = CommitBatch::new();
    batch.replace_result(JobId(0), result, attempts);
    store.apply(batch)?;
    // The summary, rewritten to what the store now adds up to.
    let mut all = Tally::default();
    for entry in store.results() {
        all.merge(&entry?.1.tally)?;
    }
    summary.total = all.total;
    summary.unique = all.unique()?;
    store.set_summary(&summary)?;
    store.flush()?;
    Ok((true_total, all.total))
}

/// The tally of job 0 with `counts`, as the coordinator derives it.
fn tally_of(
    store: &Store,
    board: Board,
    spec: nq_core::split::SplitSpec,
    counts: &[nq_core::split::SubCounts],
) -> Result<Tally> {
    let job = store.job(JobId(0))?;
    let mut tally = Tally::default();
    for (rows, c) in job.prefixes().zip(counts) {
        let sub = SubProblem::from_prefix(spec, Prefix::from_rows(board, rows)?)?;
        // The lie keeps every invariant a single copy is checked against.
        sub.check(spec, c)?;
        tally.add(&sub, c)?;
    }
    Ok(tally)
}

/// Copies the raw `records` value of `chunk` from `from` to `to`, with sled
/// itself: the attacker cannot make the tag (no key), so puts the value the
/// API wrote as it is. Both runs are the same N with the same jobs, so the
/// chunk holds the same jobs in both.
fn transplant_record_chunk(from: &Path, to: &Path, chunk: u64) -> Result<()> {
    let key = chunk.to_be_bytes();
    let value = {
        let db = sled::Config::new().path(from).open()?;
        let value = db.open_tree("records")?.get(key)?;
        value.context("no record chunk to copy")?
    };
    let db = sled::Config::new().path(to).open()?;
    let records = db.open_tree("records")?;
    let old = records.insert(key, value.clone())?;
    ensure!(old.as_ref() != Some(&value), "the value was already there");
    db.flush()?;
    Ok(())
}

/// Fails unless `out` refuses the forged record chunk 0 by name.
fn names_the_forged_record(who: &str, out: &str) -> Result<()> {
    if out.contains("the store key does not vouch for job record chunk 0 (jobs 0 to 15)")
    {
        return Ok(());
    }
    bail!("{who} did not name the forged record:\n{out}")
}
