//! `nq-coord audit`: every job's result, who computed it and how it was
//! checked, as CSV, and the totals added up again from scratch.
//!
//! The audit trusts no cached sum. It rebuilds the run's state the way a
//! resuming coordinator does (`ledger::restore`: each copy's tally derived
//! again from its counts, every job judged again from its stored copies),
//! writes one CSV row per job, and compares the re-added totals with the
//! summary stored when the run finished. Any difference, or any damaged
//! record, makes it fail.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use nq_proto::convert::RunShape;
use nq_store::{JobState, Scan, Store, StoreOptions};

use crate::core::quorum::{Fraction, Policy};
use crate::core::scheduler::Scheduler;
use crate::error::{Error, Result};
use crate::restore::restore;

/// What an audit found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditReport {
    /// Jobs in the run.
    pub jobs: u64,
    /// Jobs whose result is settled.
    pub settled: u64,
    /// The re-added total of the counted copies.
    pub total: u128,
    /// The total stored when the run finished, if it did.
    pub stored_total: Option<u128>,
    /// The re-added unique count (when every job is settled).
    pub unique: Option<u128>,
    /// The unique count stored when the run finished, if it did.
    pub stored_unique: Option<u128>,
}

impl AuditReport {
    /// True when the re-added totals equal the stored ones (or the run is not
    /// finished, so nothing was stored to compare).
    pub fn agrees(&self) -> bool {
        self.stored_total.is_none_or(|t| t == self.total)
            && self.stored_unique.is_none_or(|u| Some(u) == self.unique)
    }
}

/// Audits the run in `dir`: writes the CSV to `out` and returns the totals.
/// The verification share is read as `--verify 1` would see it only for the
/// `selected` column's sake; which copies count does not depend on it beyond
/// what the stored copies show.
///
/// # Errors
///
/// [`Error::NoRun`]; [`Error::DamagedResult`] or store corruption errors for
/// a damaged directory; I/O errors writing `out`.
pub fn audit(dir: &Path, out: &mut dyn Write, verify: Fraction) -> Result<AuditReport> {
    let store = Store::open(dir, &StoreOptions::default())?;
    let manifest = store.manifest()?.ok_or_else(|| Error::NoRun {
        dir: dir.to_path_buf(),
    })?;
    let shape = RunShape {
        board: manifest.key.board,
        spec: manifest.key.spec,
        solutions: manifest.key.solutions,
    };
    let works = store.job_works()?;
    let policy = Policy {
        secret: store.verify_secret(rand::random())?,
        fraction: verify,
        ban_after: crate::core::quorum::DEFAULT_BAN_AFTER,
    };
    let mut sched = Scheduler::new(works.clone(), 0, Duration::from_secs(30), policy);
    restore(&store, &shape, &mut sched)?;
    let io = |source| Error::Io {
        context: "cannot write the audit".into(),
        source,
    };
    writeln!(
        out,
        "job,subproblems,estimated_work,state,verification,votes_needed,count_total,\
         count_burnside,counted_worker,counted_kernel,received_unix_ms,copies,workers,attempts"
    )
    .map_err(io)?;
    // A finished run settled every job; judging again now (with the
    // machines of its copies) may want checks that the run rightly skipped
    // once a single machine was left.
    let finished = store.summary()?.is_some();
    for entry in store.scan_jobs(Scan::Every) {
        let entry = entry?;
        let job = entry.job;
        let work = works[job.0 as usize];
        let subs = entry.definition.as_ref().map_or(0, |d| d.len());
        let needed = if sched.selected(job) { 2 } else { 1 };
        let record = entry.record.clone();
        let copies = entry.into_copies();
        let state = match (&record.state, sched.is_done(job)) {
            (_, true) | (JobState::Done(_), false) if finished => "settled",
            (_, true) => "settled",
            (JobState::Done(_), false) if sched.is_counted(job) => "in_check",
            (JobState::Done(_), false) => "recompute",
            (JobState::Leased { .. }, _) => "leased",
            (JobState::Pending, _) => "pending",
        };
        let verification = if copies.is_empty() {
            "none"
        } else {
            let counted = &copies[0];
            let agreeing = {
                let mut ids: Vec<&str> = copies
                    .iter()
                    .filter(|c| c.agrees(counted))
                    .map(|c| c.identity.as_str())
                    .collect();
                ids.sort_unstable();
                ids.dedup();
                ids.len()
            };
            let disagreeing = copies.iter().any(|c| !c.agrees(counted));
            match (agreeing, disagreeing) {
                (1, false) => "single",
                (_, false) => "verified",
                (_, true) if agreeing >= 2 => "verified_over_conflict",
                _ => "disputed",
            }
        };
        let workers: Vec<String> = copies
            .iter()
            .map(|c| {
                format!(
                    "{}:{}",
                    c.identity,
                    if c.agrees(&copies[0]) {
                        "agrees"
                    } else {
                        "differs"
                    }
                )
            })
            .collect();
        let (total, burnside, who, kernel, when) = match copies.first() {
            Some(c) => (
                c.tally.total.to_string(),
                c.tally.burnside.to_string(),
                c.identity.clone(),
                c.kernel.clone(),
                c.received_unix_ms.to_string(),
            ),
            None => Default::default(),
        };
        writeln!(
            out,
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            job.0,
            subs,
            work,
            state,
            verification,
            needed,
            total,
            burnside,
            csv(&who),
            csv(&kernel),
            when,
            copies.len(),
            csv(&workers.join(" ")),
            record.attempts,
        )
        .map_err(io)?;
    }
    let summary = store.summary()?;
    let tally = sched.tally();
    let complete = sched.is_complete();
    Ok(AuditReport {
        jobs: sched.jobs(),
        settled: sched.jobs_done(),
        total: tally.total,
        stored_total: summary.as_ref().map(|s| s.total),
        unique: if complete {
            Some(tally.unique().map_err(Error::Inconsistent)?)
        } else {
            None
        },
        stored_unique: summary.as_ref().map(|s| s.unique),
    })
}

/// Quotes a CSV field when it holds a comma, a quote or a line break.
fn csv(field: &str) -> String {
    if field.contains([',', '"', '\n']) {
        format!("\"{}\"", field.replace('"', "\"\""))
    } else {
        field.to_owned()
    }
}
