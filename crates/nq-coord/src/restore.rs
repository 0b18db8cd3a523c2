//! Rebuilds the verification state and the totals of a stored run from its
//! copies: nothing cached is trusted.
//!
//! Three streaming passes over the store in job order ([`Store::scan_jobs`]),
//! so that memory does not grow with the run:
//!
//! 1. the machines of the copies (records and the duplicates received
//!    before the run completed), which set the
//!    selection as the previous session left it;
//! 2. the conflicts lost and the results confirmed in jobs with several
//!    copies, which rebuild every identity's reputation and probation
//!    record: the losses as the run charged them where the store keeps them
//!    ([`Store::keeps_losses`], every run created since), else judged again
//!    ([`ledger::records_in`], which cannot know the reputations each job
//!    settled under), and the confirmations judged again;
//! 3. every copy checked against its job's definition (its tally derived
//!    again from its counts must equal the stored one, or the store is
//!    damaged) and every job judged again with those reputations
//!    ([`ledger::judge_restored`]): settled, or queued for another copy.
//!    Where the reputations found now overturn a Done record, the record
//!    moves to the copy that counts (written and flushed before serving),
//!    so that the store and the totals agree.
//!
//! The judging is [`restore_from`], over plain [`ScannedJob`] values, so
//! that the simulation restores its model of the store exactly as here.
//!
//! That is how a store written before the state index existed is restored,
//! before serving. A store with the index ([`Store::is_indexed`]) is served
//! at once instead: [`restore_indexed`] does pass 1 from the jobs with
//! duplicates and the voters index, and marks the jobs the index calls done
//! as restoring; pass 3 then runs in the background, job by job through
//! [`restore_job`] (`crate::engine::restoring`), before the run can
//! complete.

use std::time::Instant;

use nq_core::split::Tally;
use nq_proto::convert::RunShape;
use nq_store::{
    CommitBatch, DuplicateKind, JobState, Scan, ScannedJob, Store, StoredResult,
};

use crate::core::Core;
use crate::core::ledger::{self, Write};
use crate::error::{Error, Result};
use crate::plan::subproblems_in;

/// Restores `core` from the copies in `store`, a run of `shape`: the I/O
/// around [`restore_from`], which does the judging.
///
/// # Errors
///
/// [`Error::DamagedResult`] when a stored tally does not match its counts;
/// store errors; [`Error::Inconsistent`] if the totals overflow.
pub(crate) fn restore(
    store: &Store,
    shape: &RunShape,
    core: &mut Core,
    now: Instant,
) -> Result<()> {
    let writes = judge_stored(store, shape, core, now)?;
    if !writes.is_empty() {
        let mut batch = CommitBatch::new();
        ledger::add_writes(&mut batch, writes);
        store.apply(batch)?;
        store.flush()?;
    }
    Ok(())
}

/// Judges the copies in `store`, a run of `shape`, into `core` as
/// [`restore`] does, and returns the writes that would move Done records to
/// the copies that count now, without making them. The readers of a run
/// that must not change it (the audit, and through it the report of a
/// finished run, whose records are what it counted) call this and drop the
/// writes.
///
/// # Errors
///
/// As [`restore`].
pub(crate) fn judge_stored(
    store: &Store,
    shape: &RunShape,
    core: &mut Core,
    now: Instant,
) -> Result<Vec<Write>> {
    restore_from(
        core,
        |scan| store.scan_jobs(scan),
        |entry| check(store, shape, entry),
        (shape.solutions, store.keeps_losses()?),
        now,
    )
}

/// What restore learns of a done job beyond its copies, from its stored
/// definition.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Checked {
    /// The job's estimated work.
    pub(crate) work: u64,
    /// Solutions mode: true when the stored solutions are all the Done
    /// record's (always true otherwise).
    pub(crate) stored: bool,
}

/// Restores `core` from the jobs that `scan` yields, in job order, with
/// the three passes of the module doc, and returns the writes that move
/// Done records to the copies that count now (see
/// [`ledger::judge_restored`]), for the caller to make durable. `check` checks a done job's copies
/// against its definition (the store's damage checks) and says what restore
/// needs of it. `solutions_mode` is the run's; `kept_losses` says whether
/// the store keeps the conflicts charged (`Store::keeps_losses`), which are
/// then read back rather than judged again. The judging is all here, over
/// plain [`ScannedJob`] values, so that a model of the store (the
/// simulation) restores exactly as the coordinator does.
///
/// # Errors
///
/// What `scan` and `check` return; [`Error::Inconsistent`] if the totals
/// overflow.
pub(crate) fn restore_from<I>(
    core: &mut Core,
    mut scan: impl FnMut(Scan) -> I,
    mut check: impl FnMut(&ScannedJob) -> Result<Checked>,
    (solutions_mode, kept_losses): (bool, bool),
    now: Instant,
) -> Result<Vec<Write>>
where
    I: Iterator<Item = nq_store::Result<ScannedJob>>,
{
    let mut voters = Voters::default();
    for entry in scan(Scan::Done) {
        let mut entry = entry?;
        let (job, duplicates) = (entry.job, entry.duplicates.clone());
        let losses = std::mem::take(&mut entry.losses);
        let copies = entry.into_copies();
        for c in &copies {
            voters.note(&c.identity);
        }
        voters.learn(
            core,
            job,
            &duplicates,
            &copies,
            kept_losses.then_some(losses.as_slice()),
        );
    }
    voters.restore(core, now);
    let mut writes = Vec::new();
    for entry in scan(Scan::Every) {
        let entry = entry?;
        let checked = if entry.is_done() {
            Some(check(&entry)?)
        } else {
            None
        };
        writes.extend(restore_job(core, entry, checked, solutions_mode)?.writes);
    }
    Ok(writes)
}

/// What the stored copies say of who voted, and the confirmations and
/// conflicts they record: pass 1 of the module doc, over every done job
/// (a full restore) or over the jobs with duplicates and the voters index
/// (a restart that serves first, [`restore_indexed`]).
#[derive(Debug, Default)]
struct Voters {
    /// The remote identities that voted.
    remote: std::collections::BTreeSet<String>,
    /// Whether the coordinator's own threads did (one machine, whatever
    /// kernels they ran).
    local: bool,
    confirmations: u64,
    conflicts: u64,
}

impl Voters {
    /// Notes a voter.
    fn note(&mut self, identity: &str) {
        if ledger::machine_of(identity) == "local" {
            self.local = true;
        } else if !self.remote.contains(identity) {
            self.remote.insert(identity.to_owned());
        }
    }

    /// Learns the conflicts lost and the results confirmed in done `job`,
    /// whose copies are `copies` (the counted one first), whose recorded
    /// duplicates are `duplicates` and, in a run that keeps them, whose
    /// conflicts charged are `losses`: they rebuild every identity's
    /// reputation and probation record. Only a job with duplicates can hold
    /// either.
    fn learn(
        &mut self,
        core: &mut Core,
        job: nq_store::JobId,
        duplicates: &[nq_store::Duplicate],
        copies: &[StoredResult],
        losses: Option<&[nq_store::StoredLoss]>,
    ) {
        if duplicates.is_empty() {
            return;
        }
        for d in duplicates {
            match d.kind {
                DuplicateKind::Confirmation => self.confirmations += 1,
                DuplicateKind::Conflict => self.conflicts += 1,
            }
        }
        core.restorer().learn_records(job, copies, losses);
    }

    /// Gives `core` what was learnt: the duplicates' counts, and the
    /// selection as the previous session left it (two machines at work if
    /// the stored copies came from two).
    fn restore(self, core: &mut Core, now: Instant) {
        let mut restorer = core.restorer();
        restorer.restore_duplicates(self.confirmations, self.conflicts);
        let machines = self.remote.len() + usize::from(self.local);
        restorer.restore_two_machines(machines >= 2, now);
        restorer.expect_back(self.remote.iter().map(String::as_str));
    }
}

/// What [`restore_job`] did with one stored job.
#[derive(Debug, Default)]
pub(crate) struct RestoredJob {
    /// Writes that move its Done record to the copy that counts now, for
    /// the caller to make durable.
    pub(crate) writes: Vec<Write>,
    /// The job was marked restoring, but the store has no result for it: it
    /// is pending again.
    pub(crate) not_stored: bool,
    /// Judged from its stored copies: `Some(true)` when that settled it,
    /// `Some(false)` when it waits for another copy.
    pub(crate) judged: Option<bool>,
}

/// Judges one stored job (`checked`: its copies checked, for a done job)
/// into `core`, as pass 3 of the module doc does: a done job not settled
/// in this session (pending, restoring, or leased where the state index
/// missed its result) is judged from its copies; a job marked restoring that
/// has no result is pending again; a job with a record of attempts keeps
/// them. A job this session settled already is left alone: its copies were
/// read from the store when it was judged.
///
/// # Errors
///
/// [`Error::Inconsistent`] if the totals overflow.
pub(crate) fn restore_job(
    core: &mut Core,
    entry: ScannedJob,
    checked: Option<Checked>,
    solutions_mode: bool,
) -> Result<RestoredJob> {
    let job = entry.job;
    let mut out = RestoredJob::default();
    match checked {
        Some(checked) if entry.is_done() && !core.job(job).is_done() => {
            let attempts = entry.record.attempts;
            let (settlement, moved) = core.restorer().judge_restored(
                job,
                entry.into_copies(),
                (attempts, checked.work),
                checked.stored,
                solutions_mode,
            )?;
            out.writes = moved;
            out.judged = Some(settlement.settled);
        }
        _ if entry.is_done() => {}
        _ => {
            if core.job(job).is_restoring() {
                core.restorer().not_stored(job);
                out.not_stored = true;
            }
            // The leased jobs of the last session are pending again.
            if core.job(job).attempts() == 0 {
                core.restorer().restore_attempts(job, entry.record.attempts);
            }
        }
    }
    Ok(out)
}

/// The first half of a restart that serves before it checked the stored
/// copies, for a store whose state index is complete
/// ([`Store::is_indexed`]): the jobs the index names done are marked
/// restoring (not handed out, not counted), the reputations are learnt from
/// the jobs with duplicates, and the voters from the voters index. Reads no
/// result but those with duplicates. Returns the records of the jobs the
/// index names leased, for [`restore_leases`]. The check of every stored
/// copy, which settles the restoring jobs, follows in the background
/// (`engine::restoring`) once the caller has called
/// `Restorer::begin_store_check` (every resumed run: the index may have
/// missed a result).
///
/// # Errors
///
/// Store errors.
pub(crate) fn restore_indexed(
    store: &Store,
    core: &mut Core,
    now: Instant,
) -> Result<Vec<(nq_store::JobId, nq_store::JobRecord)>> {
    let mut leased = Vec::new();
    store.visit_states(|job, kind| match kind {
        nq_store::RecordKind::Done => core.restorer().mark_restoring(job),
        nq_store::RecordKind::Leased => leased.push(job),
        nq_store::RecordKind::Pending => {}
    })?;
    let mut voters = Voters::default();
    for identity in store.voters()? {
        voters.note(&identity);
    }
    let kept_losses = store.keeps_losses()?;
    let mut duplicates = store.duplicates().peekable();
    while let Some(first) = duplicates.next() {
        let (job, d) = first?;
        let mut of_job = vec![d];
        while let Some(Ok((next, _))) = duplicates.peek()
            && *next == job
        {
            of_job.push(duplicates.next().expect("peeked")?.1);
        }
        if let JobState::Done(counted) = store.job_record(job)?.state {
            let copies = nq_store::judged_copies(*counted, of_job.iter().cloned());
            let losses = if kept_losses {
                Some(store.job_losses(job)?)
            } else {
                None
            };
            voters.learn(core, job, &of_job, &copies, losses.as_deref());
        }
    }
    voters.restore(core, now);
    let mut records = Vec::with_capacity(leased.len());
    for job in leased {
        records.push((job, store.job_record(job)?));
    }
    Ok(records)
}

/// How long after its recorded deadline a lease of an earlier session is
/// still restored: the coordinator was down meanwhile, and its workers went
/// on computing. An older lease (a long outage, or a store rebuilt from a
/// backup) is void, and its job pending again.
pub(crate) const LEASE_GRACE: std::time::Duration = std::time::Duration::from_secs(600);

/// What [`restore_leases`] kept.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KeptLeases {
    /// Leases restored.
    pub(crate) restored: usize,
    /// Workers registered again, under their ids, for them.
    pub(crate) workers: usize,
    /// Jobs recorded as leased whose lease could not be kept: pending again.
    pub(crate) requeued: u64,
}

/// Keeps the leases of the previous session, `leased` (the records of the
/// jobs recorded as leased), that carry their lease id and whose worker's
/// registration is stored, and whose deadline
/// (wall clock, `now_wall`) is at most [`LEASE_GRACE`] past: their workers
/// are registered again under their ids, and the leases restored with a
/// fresh lifetime from `now`, so that reports under them are admitted by
/// the usual binding rules (this worker, this job, this run). Every other
/// job recorded as leased is pending again, and the registrations of
/// workers that kept no lease are forgotten. Call after [`restore`].
///
/// # Errors
///
/// Store errors.
pub(crate) fn restore_leases(
    store: &Store,
    leased: Vec<(nq_store::JobId, nq_store::JobRecord)>,
    core: &mut Core,
    now_wall: std::time::SystemTime,
    now: Instant,
) -> Result<KeptLeases> {
    use std::collections::{HashMap, HashSet};

    let stored: HashMap<String, nq_store::StoredWorker> =
        store.workers()?.into_iter().collect();
    let oldest =
        crate::wall::unix_ms(now_wall).saturating_sub(LEASE_GRACE.as_millis() as u64);
    let (mut jobs, mut workers) = (HashSet::new(), HashSet::new());
    // One scan of the records: the leases not kept are requeued from it.
    let mut requeue = Vec::new();
    for (job, record) in leased {
        if keep_lease(core, &stored, oldest, job, &record, now) {
            if let JobState::Leased { worker, .. } = &record.state {
                workers.insert(worker.clone());
            }
            jobs.insert(job);
        } else {
            requeue.push((job, record));
        }
    }
    let requeued = store.requeue(requeue)?;
    store.retain_workers(&workers)?;
    store.flush()?;
    Ok(KeptLeases {
        restored: jobs.len(),
        workers: workers.len(),
        requeued,
    })
}

/// Restores the lease of `record` on `job` (see [`restore_leases`]), with
/// its worker's registration from `stored`, unless its deadline is before
/// `oldest` (wall clock, ms), it has no lease id or no stored worker, or the
/// job is done. Returns true when the lease is restored.
fn keep_lease(
    core: &mut Core,
    stored: &std::collections::HashMap<String, nq_store::StoredWorker>,
    oldest: u64,
    job: nq_store::JobId,
    record: &nq_store::JobRecord,
    now: Instant,
) -> bool {
    use crate::core::lease::{LeaseId, WorkerId};

    let JobState::Leased {
        worker,
        deadline_unix_ms,
        lease: Some(lease),
    } = &record.state
    else {
        return false; // written before lease ids were kept
    };
    let Some(w) = stored.get(worker).filter(|_| *deadline_unix_ms >= oldest) else {
        return false;
    };
    // The previous session's own threads died with it: their jobs are
    // pending again at once, instead of waiting a lease lifetime for threads
    // that cannot report (issue 26, case 5).
    if own_threads(w) {
        return false;
    }
    if core.job(job).is_done() {
        return false; // a stale record: the job was done meanwhile
    }
    let id = WorkerId(worker.clone());
    let address = w.address.as_deref().and_then(|a| a.parse().ok());
    let mut restorer = core.restorer();
    restorer.restore_worker(id.clone(), &w.name, &w.identity, address, w, now);
    restorer.restore_lease(job, LeaseId(*lease), &id, record.attempts, now)
}

/// True for the recorded registration of a session's own threads: the
/// local identity with no address. A worker of the local identity on
/// loopback (the operator's, which may come back after a restart) has one.
pub(crate) fn own_threads(w: &nq_store::StoredWorker) -> bool {
    crate::core::quorum::trusted_from_start(&w.identity) && w.address.is_none()
}

/// Checks a done job's copies against its stored definition: every tally
/// derived again from its counts, and in solutions mode the stored
/// solutions counted.
pub(crate) fn check(
    store: &Store,
    shape: &RunShape,
    entry: &ScannedJob,
) -> Result<Checked> {
    let job = entry.job;
    let definition = entry
        .definition
        .as_ref()
        .ok_or(Error::DamagedResult { job })?;
    let work = definition.work();
    let subs = subproblems_in(definition, shape, job)?;
    let JobState::Done(recorded) = &entry.record.state else {
        return Err(Error::DamagedResult { job });
    };
    let copies =
        std::iter::once(&**recorded).chain(entry.duplicates.iter().map(|d| &d.result));
    for c in copies {
        check_tally(&subs, c).map_err(|()| Error::DamagedResult { job })?;
    }
    // Solutions mode: the stored solutions must be the recorded copy's.
    let stored = if shape.solutions {
        let n = usize::from(shape.board.n()).max(1);
        let mut rows = 0u64;
        for batch in store.job_solutions(job) {
            rows += (batch?.rows.len() / n) as u64;
        }
        rows == recorded.solutions
    } else {
        true
    };
    Ok(Checked { work, stored })
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use nq_core::split::{SubCounts, Tally};
    use nq_store::{JobId, JobRecord};

    use super::*;
    use crate::core::quorum::{Fraction, Policy};

    /// A job as the store holds it: done with one copy of `count`
    /// solutions (eight symmetric images each), computed by the local
    /// threads, or pending.
    fn stored(job: u64, count: Option<u128>) -> ScannedJob {
        let state = match count {
            Some(count) => JobState::Done(Box::new(StoredResult {
                counts: vec![SubCounts {
                    count,
                    ..SubCounts::default()
                }],
                tally: Tally {
                    total: count * 8,
                    burnside: count * 8,
                },
                identity: "local".into(),
                worker: "w1.0-00".into(),
                lease: 1,
                ..StoredResult::default()
            })),
            None => JobState::Pending,
        };
        ScannedJob {
            job: JobId(job),
            record: JobRecord { state, attempts: 1 },
            duplicates: Vec::new(),
            losses: Vec::new(),
            definition: None,
        }
    }

    const CHECKED: Option<Checked> = Some(Checked {
        work: 1,
        stored: true,
    });

    #[test]
    fn restoring_jobs_count_only_once_checked_and_the_run_waits_for_the_whole_store() {
        let now = Instant::now();
        let policy = Policy {
            secret: [0; 16],
            fraction: Fraction::Fixed(0.0),
            ban_after: 3,
            gpu_sample: 0.0,
        };
        let mut s = Core::with_works(vec![1; 4], 2, Duration::from_secs(30), policy, now);
        // The index names jobs 0 and 1 done.
        s.restorer().mark_restoring(JobId(0));
        s.restorer().mark_restoring(JobId(1));
        s.restorer().begin_store_check();
        let standing = s.standing();
        assert_eq!(
            (
                standing.jobs_restoring,
                standing.jobs_pending,
                standing.jobs_done
            ),
            (2, 2, 0)
        );
        assert_eq!(
            standing.tally,
            Tally::default(),
            "nothing counts before its check"
        );
        // Only the jobs the index does not name done are handed out.
        let w = s.register_local(1, now);
        let granted: Vec<u64> = (s.lease(&w, 4, &[], now).unwrap().jobs)
            .iter()
            .map(|g| g.job.0)
            .collect();
        assert_eq!(granted, vec![2, 3]);
        // Job 0's copy, checked, is judged and counted.
        let r = restore_job(&mut s, stored(0, Some(5)), CHECKED, false).unwrap();
        assert_eq!(r.judged, Some(true));
        assert!(s.job(JobId(0)).is_done() && !s.job(JobId(0)).is_restoring());
        assert_eq!(s.standing().tally.total, 40);
        // Job 1 has no result after all (a wrong index): pending again, and
        // handed out next.
        let r = restore_job(&mut s, stored(1, None), None, false).unwrap();
        assert!(r.not_stored && r.judged.is_none());
        let again = s.lease(&w, 4, &[], now).unwrap().jobs;
        assert_eq!(again.iter().map(|g| g.job.0).collect::<Vec<_>>(), vec![1]);
        // Results the index missed (jobs leased in this session) are judged
        // from the store all the same; a job already settled is left alone.
        for job in [1, 2, 3] {
            let r = restore_job(&mut s, stored(job, Some(1)), CHECKED, false).unwrap();
            assert_eq!(r.judged, Some(true), "job {job}");
        }
        let r = restore_job(&mut s, stored(0, Some(7)), CHECKED, false).unwrap();
        assert_eq!(r.judged, None, "a settled job is not judged twice");
        assert_eq!(s.standing().tally.total, 40 + 3 * 8);
        // Every job is settled, but the run is complete only once the whole
        // store was read.
        assert_eq!(s.standing().jobs_done, 4);
        assert!(!s.is_complete());
        s.restorer().stored_checked();
        assert!(s.is_complete());
    }
}
