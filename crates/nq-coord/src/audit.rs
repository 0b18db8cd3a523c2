//! `nq-coord audit`: every job's result, who computed it and how it was
//! checked, as CSV, and the totals added up again from scratch.
//!
//! The audit trusts no cached sum. It rebuilds the run's state the way a
//! resuming coordinator does (`ledger::restore`: each copy's tally derived
//! again from its counts, every job judged again from its stored copies),
//! writes one CSV row per job, and compares the re-added totals with the
//! summary stored when the run finished and, once every job is settled, with
//! the published values of the board where they are known (OEIS A000170 and
//! A002562, N ≤ 27): a count edited in the store together with its summary
//! still differs from the published total. Any difference
//! ([`AuditReport::differences`]), or any damaged or (in a keyed store)
//! tampered record, makes it fail.
//!
//! # Format (version 2)
//!
//! The audit is the record a stranger re-checks (`nq recheck`), so it carries
//! everything needed to rebuild each job's sub-problems from nq-core alone,
//! and ends with a digest of itself. Lines starting with `#` are comments to
//! a CSV reader (`pandas.read_csv(f, comment="#")`); fields holding `,`, `"`,
//! `#` or a line break are quoted.
//!
//! ```text
//! # nq-audit v2
//! # n=12 split_version=1 split=1:0 order=plan solutions=off jobs=179 run=12-19ab…
//! job,first_subproblem,subproblems,estimated_work,state,verification,…,attempts
//! 0,0,3,5120,settled,single,1,96,96,local,avx512,1764…,1,local:agrees,1
//! …
//! # end jobs=179 settled=179 subproblems=516 total=14200 burnside=14296 unique=1787 plan=sha256:…
//! # digest=sha256:…
//! ```
//!
//! * The header names the board, the split (`RING:EXTRA` and nq-core's
//!   `SPLIT_VERSION`) and the order of its sub-problems: `plan` is
//!   `nq_core::split::split_each`'s order, the one jobs are cut from.
//! * Job `j` is the sub-problems `first_subproblem .. first_subproblem +
//!   subproblems` of that order; the rows tile it in job order.
//! * `count_total` and `count_burnside` are the counted copy's
//!   `nq_core::split::Tally` (`Σ w·count` and `Σ w·Σ Fix`); `total` and
//!   `burnside` in the `end` line are their sums over the rows, and `unique`
//!   is `burnside / 8` (`-` until every job is settled).
//! * `copies` and `workers` list every stored copy, each as
//!   `IDENTITY:agrees` or `IDENTITY:differs` (against the counted copy). A
//!   copy that arrived once the run was complete ends in `-after-completion`:
//!   it is evidence only, and `verification` and `state`, like the run
//!   itself, judge the copies without it.
//! * `plan` is the SHA-256 of every job's sub-problem prefixes
//!   (`Prefix::rows()`, N bytes each, 255 for an empty column) in job order:
//!   it proves that the jobs are exactly the split's sub-problems in plan
//!   order, which `nq recheck` verifies by enumerating the split.
//! * `digest` is the SHA-256 of every byte of the file before the digest
//!   line. The run's final line and `report.json` print the same value
//!   ([`digest`] computes it from the store the way the audit writes it), so
//!   a published audit can be told apart from an edited one.

use std::fmt;
use std::io::{self, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use nq_core::split::Tally;
use nq_proto::convert::RunShape;
use nq_store::{
    JobId, JobState, Manifest, Scan, ScannedJob, Store, StoreKey, StoreOptions,
    StoredResult,
};
use sha2::{Digest, Sha256};

use crate::core::quorum::Fraction;
use crate::core::scheduler::ExactOrder;
use crate::core::{Core, Standing};
use crate::error::{Error, Result};
use crate::restore::judge_stored;

/// The first line of every audit, after `# `: the format and its version.
pub const FORMAT: &str = "nq-audit v2";

/// The SHA-256 of an audit (see the module docs), written `sha256:HEX`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct AuditDigest(pub [u8; 32]);

impl fmt::Display for AuditDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("sha256:")?;
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl fmt::Debug for AuditDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// What an audit found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditReport {
    /// Jobs in the run.
    pub jobs: u64,
    /// Jobs whose result is settled.
    pub settled: u64,
    /// The re-added total of the counted copies.
    pub total: u128,
    /// The sum of the rows' `count_total`: the total the audit file states.
    pub rows_total: u128,
    /// The total stored when the run finished, if it did.
    pub stored_total: Option<u128>,
    /// The re-added unique count (when every job is settled).
    pub unique: Option<u128>,
    /// The unique count stored when the run finished, if it did.
    pub stored_unique: Option<u128>,
    /// The published total and unique count of the board (`nq_core::published`),
    /// where they are known.
    pub published: Option<(u128, u128)>,
    /// The digest of the audit as written, the value of its last line.
    pub digest: AuditDigest,
}

/// One total of an audit that differs from what it must equal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Difference {
    /// The re-added total differs from the total stored when the run
    /// finished.
    StoredTotal {
        /// The re-added total.
        found: u128,
        /// The stored one.
        stored: u128,
    },
    /// The rows of the audit add up to another total than the stored one.
    RowsTotal {
        /// What the rows add up to.
        found: u128,
        /// The stored total.
        stored: u128,
    },
    /// The re-added unique count differs from the stored one (or cannot be
    /// derived, `None`, though the run finished).
    StoredUnique {
        /// The re-added unique count.
        found: Option<u128>,
        /// The stored one.
        stored: u128,
    },
    /// Every job is settled, but the total differs from the published one.
    PublishedTotal {
        /// The re-added total.
        found: u128,
        /// The published one.
        published: u128,
    },
    /// Every job is settled, but the unique count differs from the
    /// published one.
    PublishedUnique {
        /// The re-added unique count.
        found: u128,
        /// The published one.
        published: u128,
    },
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Difference::StoredTotal { found, stored } => write!(
                f,
                "the re-added total {found} differs from the total {stored} stored \
                 when the run finished"
            ),
            Difference::RowsTotal { found, stored } => write!(
                f,
                "the audit's rows add up to {found}, not to the stored total {stored}"
            ),
            Difference::StoredUnique { found, stored } => match found {
                Some(found) => write!(
                    f,
                    "the re-added unique count {found} differs from the unique \
                     count {stored} stored when the run finished"
                ),
                None => write!(
                    f,
                    "the run is stored as finished with unique count {stored}, but \
                     its jobs are not all settled"
                ),
            },
            Difference::PublishedTotal { found, published } => write!(
                f,
                "the total {found} differs from the published total {published} \
                 (OEIS A000170)"
            ),
            Difference::PublishedUnique { found, published } => write!(
                f,
                "the unique count {found} differs from the published unique count \
                 {published} (OEIS A002562)"
            ),
        }
    }
}

impl AuditReport {
    /// Every total that differs from what it must equal: the stored summary
    /// (when the run finished) and the published values (when every job is
    /// settled and the board's are known). Empty when all agree.
    pub fn differences(&self) -> Vec<Difference> {
        let mut out = Vec::new();
        if let Some(stored) = self.stored_total {
            if self.total != stored {
                out.push(Difference::StoredTotal {
                    found: self.total,
                    stored,
                });
            }
            if self.rows_total != stored {
                out.push(Difference::RowsTotal {
                    found: self.rows_total,
                    stored,
                });
            }
        }
        if let Some(stored) = self.stored_unique
            && self.unique != Some(stored)
        {
            out.push(Difference::StoredUnique {
                found: self.unique,
                stored,
            });
        }
        // `unique` is known once every job is settled: only then is the
        // total the board's.
        if let (Some((total, unique)), Some(found_unique)) = (self.published, self.unique)
        {
            if self.total != total {
                out.push(Difference::PublishedTotal {
                    found: self.total,
                    published: total,
                });
            }
            if found_unique != unique {
                out.push(Difference::PublishedUnique {
                    found: found_unique,
                    published: unique,
                });
            }
        }
        out
    }

    /// True when no total differs ([`AuditReport::differences`] is empty).
    pub fn agrees(&self) -> bool {
        self.differences().is_empty()
    }
}

/// Audits the run in `dir`: writes the CSV to `out` and returns the totals.
/// The verification share is read as `--verify 1` would see it only for the
/// `selected` column's sake; which copies count does not depend on it beyond
/// what the stored copies show.
///
/// # Errors
///
/// [`Error::NoDataDir`] when `dir` does not exist and [`Error::NoRun`] when
/// it holds no run (neither creates anything); [`Error::DamagedResult`] or
/// store corruption errors for a damaged directory; I/O errors writing
/// `out`.
pub fn audit(dir: &Path, out: &mut dyn Write, verify: Fraction) -> Result<AuditReport> {
    audit_with_key(dir, None, out, verify)
}

/// [`audit`] of a store sealed with `key` (or unkeyed, for `None`): every
/// value read is checked against its tag.
///
/// # Errors
///
/// As [`audit`]; [`nq_store::Error::Tampered`] for a value the key does not
/// vouch for, naming the record; [`nq_store::Error::KeyNeeded`],
/// [`nq_store::Error::WrongKey`] or [`nq_store::Error::NotKeyed`] when the
/// key does not fit the store.
pub fn audit_with_key(
    dir: &Path,
    key: Option<&StoreKey>,
    out: &mut dyn Write,
    verify: Fraction,
) -> Result<AuditReport> {
    // Opening creates a store: a mistyped path must not become one.
    if !dir.exists() {
        return Err(Error::NoDataDir {
            dir: dir.to_path_buf(),
        });
    }
    if !dir.join("db").is_file() && !dir.join(nq_store::MARKER_FILE).is_file() {
        return Err(Error::NoRun {
            dir: dir.to_path_buf(),
        });
    }
    let options = StoreOptions {
        key: key.cloned(),
        ..StoreOptions::default()
    };
    let store = Store::open(dir, &options)?;
    audit_store(&store, out, verify)
}

/// The digest of the audit that `nq-coord audit` writes for `store` (the one
/// the run's final line and `report.json` print): the audit written to
/// nowhere, hashed. Reads the whole store, as the audit does.
///
/// # Errors
///
/// As [`audit`].
pub fn digest(store: &Store) -> Result<AuditDigest> {
    // `nq-coord audit` judges with the automatic share: the `votes_needed`
    // column must read the same here, or the digests would differ.
    Ok(audit_store(store, &mut io::sink(), Fraction::Auto)?.digest)
}

/// Passes everything written on to `out`, and hashes it.
struct Hashing<'a> {
    /// Where the audit goes.
    out: &'a mut dyn Write,
    /// Every byte that went to `out`, so far.
    sha: Sha256,
}

impl Write for Hashing<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.out.write(buf)?;
        // Only what `out` took: a short write is retried by `write_all`
        // with the rest, which is hashed then.
        self.sha.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// [`audit`] of an open store.
///
/// Memory does not grow with the run beyond the scheduler's own compact
/// state: the rows are written as the scan reads them, one job at a time, and
/// each job's estimated work comes from its stored definition, not from a
/// list of every job's work (at 10^8 jobs such a list, with the scheduler's
/// copy and a hand-out order, took about 2.8 GB).
///
/// # Errors
///
/// As [`audit`].
pub fn audit_store(
    store: &Store,
    out: &mut dyn Write,
    verify: Fraction,
) -> Result<AuditReport> {
    Ok(judged(store, out, verify)?.0)
}

/// [`audit_store`], with the core that judged the stored copies: the
/// report of a finished run reads the workers that lost conflicts from it,
/// rather than judging the store a second time.
///
/// # Errors
///
/// As [`audit`].
pub(crate) fn judged(
    store: &Store,
    out: &mut dyn Write,
    verify: Fraction,
) -> Result<(AuditReport, Core)> {
    let manifest = store.manifest()?.ok_or_else(|| Error::NoRun {
        dir: store
            .dir()
            .map_or_else(|| "<temporary store>".into(), Path::to_path_buf),
    })?;
    let mut core = restored_core(store, &manifest, verify)?;
    let mut out = Hashing {
        out,
        sha: Sha256::new(),
    };
    write_header(&mut out, &manifest)?;
    // A finished run settled every job; judging again now (with the
    // machines of its copies) may want checks that the run rightly skipped
    // once a single machine was left.
    let finished = store.summary()?.is_some();
    let mut rows = Rows::default();
    for entry in store.scan_jobs(Scan::Every) {
        let row = Row::of(entry?, &mut core, finished);
        rows.write(&mut out, &row)?;
    }
    let standing = core.standing();
    let complete = standing.complete;
    let rows_total = rows.tally.total;
    write_end(&mut out, &standing, rows, complete)?;
    let digest = AuditDigest(out.sha.finalize_reset().into());
    // The digest line is not part of what it digests.
    writeln!(out.out, "# digest={digest}").map_err(write_error)?;
    let summary = store.summary()?;
    let tally = standing.tally;
    let report = AuditReport {
        jobs: standing.jobs,
        settled: standing.jobs_done,
        total: tally.total,
        rows_total,
        stored_total: summary.as_ref().map(|s| s.total),
        unique: if complete {
            Some(tally.unique().map_err(Error::Inconsistent)?)
        } else {
            None
        },
        stored_unique: summary.as_ref().map(|s| s.unique),
        published: nq_core::published::published(manifest.key.board.n()),
        digest,
    };
    Ok((report, core))
}

/// The error of a failed write of the audit.
fn write_error(source: io::Error) -> Error {
    Error::Io {
        context: "cannot write the audit".into(),
        source,
    }
}

/// The run's core, every job judged again from its stored copies the way a
/// resuming coordinator judges them (`restore`). Nothing is handed out, so
/// it gets no hand-out order: its memory is the judging state only.
fn restored_core(store: &Store, manifest: &Manifest, verify: Fraction) -> Result<Core> {
    let shape = RunShape {
        board: manifest.key.board,
        spec: manifest.key.spec,
        solutions: manifest.key.solutions,
    };
    // Judged by the settings stored with the run (`verify` for a run from
    // before they were stored), so that trusted copies read as settled. No
    // hand-out order: the audit hands nothing out, and an order would hold
    // every job's work in memory.
    let (policy, trusted) = crate::settings::judging(store, verify)?;
    let mut core = Core::with_order(
        (manifest.jobs, manifest.total_work),
        Box::new(ExactOrder::new(&[])),
        0,
        Duration::from_secs(30),
        policy,
        Instant::now(),
    );
    core.restorer().trust(trusted.iter().map(String::as_str));
    // The audit reads; it never moves a record (see `judge_stored`).
    judge_stored(store, &shape, &mut core, Instant::now())?;
    Ok(core)
}

/// The two header lines and the column names.
fn write_header(out: &mut impl Write, manifest: &Manifest) -> Result<()> {
    let key = &manifest.key;
    writeln!(out, "# {FORMAT}").map_err(write_error)?;
    writeln!(
        out,
        "# n={} split_version={} split={}:{} order=plan solutions={} jobs={} run={}",
        key.board.n(),
        key.split_version,
        key.spec.ring,
        key.spec.extra,
        if key.solutions { "on" } else { "off" },
        manifest.jobs,
        csv(&manifest.run_id),
    )
    .map_err(write_error)?;
    writeln!(
        out,
        "job,first_subproblem,subproblems,estimated_work,state,verification,\
         votes_needed,count_total,count_burnside,counted_worker,counted_kernel,\
         received_unix_ms,copies,workers,attempts"
    )
    .map_err(write_error)
}

/// One job's row of the audit.
struct Row {
    job: JobId,
    subproblems: u64,
    work: u64,
    state: &'static str,
    verification: &'static str,
    votes_needed: u32,
    /// The counted copy's tally, who computed it, on which kernel, and when
    /// it was received (none for a job without a copy).
    counted: Option<(Tally, String, String, u64)>,
    copies: usize,
    /// Each copy's identity and whether it agrees with the counted one.
    workers: String,
    attempts: u32,
    /// The SHA-256 input of the plan: the job's sub-problem prefixes.
    prefixes: Vec<u8>,
}

impl Row {
    /// The row of `entry`, judged by `core` (restored from the store).
    fn of(entry: ScannedJob, core: &mut Core, finished: bool) -> Row {
        let job = entry.job;
        let (subproblems, work, prefixes) = match &entry.definition {
            Some(d) => (
                d.len() as u64,
                d.work(),
                d.prefixes().flatten().copied().collect(),
            ),
            None => (0, 0, Vec::new()),
        };
        let attempts = entry.record.attempts;
        let state = state_of(&entry.record.state, job, core, finished);
        let late: Vec<StoredResult> = entry.kept_after_completion().cloned().collect();
        let copies = entry.into_copies();
        let listed = |c: &StoredResult, after: &str| {
            let verdict = if c.agrees(&copies[0]) {
                "agrees"
            } else {
                "differs"
            };
            format!("{}:{verdict}{after}", c.identity)
        };
        let workers = copies
            .iter()
            .map(|c| listed(c, ""))
            .chain(late.iter().map(|c| listed(c, "-after-completion")))
            .collect::<Vec<_>>()
            .join(" ");
        Row {
            job,
            subproblems,
            work,
            state,
            verification: verification_of(&copies, core),
            votes_needed: if core.job(job).selected() { 2 } else { 1 },
            counted: copies.first().map(|c| {
                (
                    c.tally,
                    c.identity.clone(),
                    c.kernel.clone(),
                    c.received_unix_ms,
                )
            }),
            copies: copies.len() + late.len(),
            workers,
            attempts,
            prefixes,
        }
    }
}

/// A job's `state` column.
fn state_of(record: &JobState, job: JobId, core: &Core, finished: bool) -> &'static str {
    match (record, core.job(job).is_done()) {
        (_, true) | (JobState::Done(_), false) if finished => "settled",
        (_, true) => "settled",
        (JobState::Done(_), false) if core.job(job).is_counted() => "in_check",
        (JobState::Done(_), false) => "recompute",
        (JobState::Leased { .. }, _) => "leased",
        (JobState::Pending, _) => "pending",
    }
}

/// A job's `verification` column, from its voices as the rule book counts
/// them (`core::quorum::judge` over the copies in classes of equal results):
/// one per untrusted identity that is not banned, one per kernel of a
/// trusted one. The counted copy is the first, so its class is class 0.
fn verification_of(copies: &[StoredResult], core: &mut Core) -> &'static str {
    if copies.is_empty() {
        return "none";
    }
    let verdict = core.voices_of(copies);
    match (verdict.conflict, verdict.leader == Some(0), verdict.votes) {
        (false, _, 0 | 1) => "single",
        (false, _, _) => "verified",
        (true, true, 2..) => "verified_over_conflict",
        (true, _, _) => "disputed",
    }
}

/// What the rows state, added up as they are written: the `end` line.
#[derive(Default)]
struct Rows {
    /// The SHA-256 of every job's sub-problem prefixes, in job order.
    plan: Sha256,
    /// The next job's first sub-problem: the sub-problems so far.
    first: u64,
    /// The sum of the rows' counted tallies.
    tally: Tally,
}

impl Rows {
    /// Writes `row` and adds it up.
    fn write(&mut self, out: &mut impl Write, row: &Row) -> Result<()> {
        self.plan.update(&row.prefixes);
        let (total, burnside, who, kernel, when) = match &row.counted {
            Some((tally, who, kernel, when)) => {
                self.tally.merge(tally).map_err(Error::Inconsistent)?;
                (
                    tally.total.to_string(),
                    tally.burnside.to_string(),
                    who.as_str(),
                    kernel.as_str(),
                    when.to_string(),
                )
            }
            None => Default::default(),
        };
        writeln!(
            out,
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            row.job.0,
            self.first,
            row.subproblems,
            row.work,
            row.state,
            row.verification,
            row.votes_needed,
            total,
            burnside,
            csv(who),
            csv(kernel),
            when,
            row.copies,
            csv(&row.workers),
            row.attempts,
        )
        .map_err(write_error)?;
        self.first += row.subproblems;
        Ok(())
    }
}

/// The `# end` line: the jobs, what the rows add up to, and the plan.
fn write_end(
    out: &mut impl Write,
    standing: &Standing,
    rows: Rows,
    complete: bool,
) -> Result<()> {
    writeln!(
        out,
        "# end jobs={} settled={} subproblems={} total={} \
         burnside={} unique={} plan={}",
        standing.jobs,
        standing.jobs_done,
        rows.first,
        rows.tally.total,
        rows.tally.burnside,
        // The rows' own unique count: what a reader derives from them.
        if complete && let Ok(u) = rows.tally.unique() {
            u.to_string()
        } else {
            "-".to_owned()
        },
        AuditDigest(rows.plan.finalize().into()),
    )
    .map_err(write_error)
}

/// Quotes a CSV field when it holds a comma, a quote, a `#` (which comment
/// aware readers would take for a comment) or a line break.
fn csv(field: &str) -> String {
    if field.contains([',', '"', '#', '\n']) {
        format!("\"{}\"", field.replace('"', "\"\""))
    } else {
        field.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// N = 14, finished, every total as it should be.
    fn honest() -> AuditReport {
        AuditReport {
            jobs: 10,
            settled: 10,
            total: 365_596,
            rows_total: 365_596,
            stored_total: Some(365_596),
            unique: Some(45_752),
            stored_unique: Some(45_752),
            published: nq_core::published::published(14),
            digest: AuditDigest([0; 32]),
        }
    }

    #[test]
    fn an_honest_finished_run_has_no_difference() {
        assert_eq!(honest().differences(), vec![]);
        assert!(honest().agrees());
    }

    /// Issue 18, item 4: a count edited with its summary made to agree
    /// passes every comparison inside the store; the published values
    /// catch it, and the difference names them.
    #[test]
    fn a_lie_that_the_store_agrees_with_fails_on_the_published_values() {
        let lied = AuditReport {
            total: 365_612,
            rows_total: 365_612,
            stored_total: Some(365_612),
            unique: Some(45_754),
            stored_unique: Some(45_754),
            ..honest()
        };
        let found = lied.differences();
        assert_eq!(
            found,
            vec![
                Difference::PublishedTotal {
                    found: 365_612,
                    published: 365_596
                },
                Difference::PublishedUnique {
                    found: 45_754,
                    published: 45_752
                },
            ]
        );
        assert!(found[0].to_string().contains("published total 365596"));
        assert!(!lied.agrees());
    }

    #[test]
    fn a_summary_that_differs_from_the_counts_is_named() {
        let edited = AuditReport {
            total: 365_612,
            rows_total: 365_612,
            unique: Some(45_754),
            published: None,
            ..honest()
        };
        let found = edited.differences();
        assert!(
            matches!(found[0], Difference::StoredTotal { .. }),
            "{found:?}"
        );
        assert!(
            matches!(found[1], Difference::RowsTotal { .. }),
            "{found:?}"
        );
        assert!(
            matches!(found[2], Difference::StoredUnique { .. }),
            "{found:?}"
        );
        assert_eq!(found.len(), 3);
    }

    /// An unfinished run's partial total is not the board's: nothing is
    /// compared with the published values until every job is settled.
    #[test]
    fn an_unfinished_run_is_not_held_to_the_published_values() {
        let partial = AuditReport {
            settled: 4,
            total: 120_000,
            rows_total: 120_000,
            stored_total: None,
            unique: None,
            stored_unique: None,
            ..honest()
        };
        assert_eq!(partial.differences(), vec![]);
    }
}
