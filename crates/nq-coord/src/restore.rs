//! Rebuilds the verification state and the totals of a stored run from its
//! copies: nothing cached is trusted.
//!
//! Three streaming passes over the store in job order ([`Store::scan_jobs`]),
//! so that memory does not grow with the run:
//!
//! 1. the machines of the copies (records and duplicates), which set the
//!    selection as the previous session left it;
//! 2. the conflicts lost in disputed jobs ([`ledger::losses_in`]), which
//!    rebuild every identity's reputation;
//! 3. every copy checked against its job's definition (its tally derived
//!    again from its counts must equal the stored one, or the store is
//!    damaged) and every job judged again with those reputations
//!    ([`ledger::judge_restored`]): settled, or queued for another copy.

use nq_core::split::Tally;
use nq_proto::convert::RunShape;
use nq_store::{DuplicateKind, Scan, ScannedJob, Store, StoredResult};

use crate::core::ledger;
use crate::core::scheduler::Scheduler;
use crate::engine::subproblems_in;
use crate::error::{Error, Result};

/// Restores `sched` from the copies in `store`, a run of `shape`.
///
/// # Errors
///
/// [`Error::DamagedResult`] when a stored tally does not match its counts;
/// store errors; [`Error::Inconsistent`] if the totals overflow.
pub(crate) fn restore(
    store: &Store,
    shape: &RunShape,
    sched: &mut Scheduler,
) -> Result<()> {
    let (mut confirmations, mut conflicts) = (0, 0);
    let mut machines: Vec<String> = Vec::new();
    for entry in store.scan_jobs(Scan::Done) {
        let entry = entry?;
        for d in &entry.duplicates {
            match d.kind {
                DuplicateKind::Confirmation => confirmations += 1,
                DuplicateKind::Conflict => conflicts += 1,
            }
        }
        let has_duplicates = !entry.duplicates.is_empty();
        let job = entry.job;
        let copies = entry.into_copies();
        for c in &copies {
            let m = ledger::machine_of(&c.identity);
            if machines.len() < 2 && !machines.iter().any(|x| x == m) {
                machines.push(m.to_owned());
            }
        }
        // Only jobs with duplicates can hold a lost conflict.
        if has_duplicates {
            for loser in ledger::losses_in(sched, job, &copies) {
                sched.restore_loss(loser);
            }
        }
    }
    sched.restore_duplicates(confirmations, conflicts);
    // The selection as the previous session left it: two machines at work if
    // the stored copies came from two.
    sched.restore_two_machines(machines.len() >= 2);
    for entry in store.scan_jobs(Scan::Every) {
        let entry = entry?;
        if entry.is_done() {
            judge(store, shape, sched, entry)?;
        } else {
            // The leased jobs of the last session are pending again.
            sched.restore_attempts(entry.job, entry.record.attempts);
        }
    }
    Ok(())
}

/// Checks a done job's copies against its definition and judges it.
fn judge(
    store: &Store,
    shape: &RunShape,
    sched: &mut Scheduler,
    entry: ScannedJob,
) -> Result<()> {
    let job = entry.job;
    let attempts = entry.record.attempts;
    let definition = entry
        .definition
        .clone()
        .ok_or(Error::DamagedResult { job })?;
    let work = definition.work();
    let subs = subproblems_in(&definition, shape, job)?;
    let copies = entry.into_copies();
    for c in &copies {
        check_tally(&subs, c).map_err(|()| Error::DamagedResult { job })?;
    }
    // Solutions mode: the stored solutions must be the recorded copy's.
    let stored = if shape.solutions {
        let n = usize::from(shape.board.n()).max(1);
        let mut rows = 0u64;
        for batch in store.job_solutions(job) {
            rows += (batch?.rows.len() / n) as u64;
        }
        rows == copies[0].solutions
    } else {
        true
    };
    let settlement = ledger::judge_restored(
        sched,
        job,
        copies,
        (attempts, work),
        stored,
        shape.solutions,
    );
    sched.settle(&settlement, false)?;
    Ok(())
}

/// A stored copy's tally must be what its counts add up to, over every
/// sub-problem of its job.
fn check_tally(
    subs: &[nq_core::split::SubProblem],
    copy: &StoredResult,
) -> std::result::Result<(), ()> {
    if copy.counts.len() != subs.len() {
        return Err(());
    }
    let mut tally = Tally::default();
    for (sub, counts) in subs.iter().zip(&copy.counts) {
        tally.add(sub, counts).map_err(|_| ())?;
    }
    if tally == copy.tally { Ok(()) } else { Err(()) }
}
