//! Which copy of a job counts, as pure functions over plain data.
//!
//! A result reaches the ledger as a [`Report`] already bound to its lease
//! (the engine's admission). [`check_counts`] checks it against the job's
//! sub-problems and folds its counts into a [`Tally`], giving a [`Verified`]
//! copy. [`decide`] then judges the job's copies by the rules of
//! [`crate::core::quorum`] and returns a [`Decision`]: the writes to make,
//! the [`Settlement`] for the scheduler once they are durable, and the
//! outcome for the reporter. The engine carries a decision out; nothing here
//! reads a clock, a store or a socket, so every case is a unit test.
//!
//! On restore, [`records_in`] and [`judge_restored`] judge the stored copies
//! again by the same rules: nothing cached is trusted.

use nq_core::split::{SubCounts, SubProblem, Tally};
use nq_proto::convert::RunShape;
use nq_store::{Duplicate, DuplicateKind, JobId, StoredLoss, StoredResult};

use crate::core::lease::LeaseId;
use crate::core::quorum::{
    Beaten, GPU_KERNEL, Identities, IdentityId, Rules, Selection, Verdict, Vote,
    credentialed, judge,
};
use crate::core::scheduler::{Jobs, Outcome, Settlement};
use crate::error::{Error, ReportFault, Result};

/// A report as received, bound to its lease, before checking.
#[derive(Debug)]
pub(crate) struct Report {
    pub(crate) job: JobId,
    pub(crate) lease: LeaseId,
    pub(crate) worker: String,
    pub(crate) counts: Vec<SubCounts>,
    pub(crate) nodes: u64,
    /// The job's estimated work (from its stored definition, which the
    /// caller read to check the report).
    pub(crate) work: u64,
    /// `solutions_sent` of the result chunk.
    pub(crate) solutions_sent: u64,
    /// Solutions received per sub-problem (solutions mode).
    pub(crate) listed: Option<Vec<u64>>,
    /// The kernel that counted, as reported.
    pub(crate) kernel: String,
    /// Solutions mode: true when this report's solutions were stored.
    pub(crate) stored_solutions: bool,
}

/// A report that passed every check, with its contribution to the totals.
#[derive(Debug, Clone)]
pub(crate) struct Verified {
    pub(crate) job: JobId,
    pub(crate) lease: LeaseId,
    /// Solutions mode: true when its solutions are the stored ones.
    pub(crate) stored_solutions: bool,
    /// The job's estimated work.
    pub(crate) work: u64,
    pub(crate) result: StoredResult,
}

/// Checks a report of the job whose sub-problems are `subs`, in a run of
/// `shape`: one `SubCounts` per sub-problem, each passing
/// `SubProblem::check` and folded into the copy's tally, the solutions
/// received matching the counts in solutions mode, and no job above the
/// published total. `identity` is the voice the report's lease was issued
/// to, and `received_unix_ms` the time to record.
///
/// # Errors
///
/// [`Error::BadReport`] naming the fault.
pub(crate) fn check_counts(
    shape: &RunShape,
    subs: &[SubProblem],
    report: Report,
    identity: String,
    received_unix_ms: u64,
) -> Result<Verified> {
    let job = report.job;
    let bad = |fault| Error::BadReport { job, fault };
    if report.counts.len() != subs.len() {
        return Err(bad(ReportFault::CountsLength {
            expected: subs.len(),
            found: report.counts.len(),
        }));
    }
    let mut tally = Tally::default();
    for (i, (sub, counts)) in subs.iter().zip(&report.counts).enumerate() {
        sub.check(shape.spec, counts)
            .and_then(|()| tally.add(sub, counts))
            .map_err(|source| bad(ReportFault::Counts { sub: i, source }))?;
    }
    let solutions = solutions_received(shape.solutions, &report).map_err(bad)?;
    // A job's copies must agree with the published total where one is
    // known: no single job can hold more solutions than the whole board.
    if let Some((total, _)) = nq_core::published::published(shape.board.n())
        && tally.total > total
    {
        return Err(bad(ReportFault::AbovePublished {
            total: tally.total,
            published: total,
        }));
    }
    Ok(Verified {
        job,
        lease: report.lease,
        stored_solutions: report.stored_solutions,
        work: report.work,
        result: StoredResult {
            counts: report.counts,
            solutions,
            tally,
            nodes: report.nodes,
            worker: report.worker,
            lease: report.lease.0,
            identity,
            kernel: report.kernel,
            received_unix_ms,
        },
    })
}

/// The solutions a report listed: in solutions mode, as many per
/// sub-problem as its count says and as many in all as it says it sent;
/// otherwise none.
fn solutions_received(
    solutions_mode: bool,
    report: &Report,
) -> std::result::Result<u64, ReportFault> {
    match (&report.listed, solutions_mode) {
        (Some(listed), true) => {
            let received: u64 = listed.iter().sum();
            if received != report.solutions_sent {
                return Err(ReportFault::SolutionsSent {
                    sent: report.solutions_sent,
                    received,
                });
            }
            for (i, (&l, c)) in listed.iter().zip(&report.counts).enumerate() {
                if u128::from(l) != c.count {
                    return Err(ReportFault::SolutionCount {
                        sub: i,
                        listed: l,
                        count: c.count,
                    });
                }
            }
            Ok(received)
        }
        (None, true) => Err(ReportFault::SolutionsSent {
            sent: report.solutions_sent,
            received: 0,
        }),
        (_, false) if report.solutions_sent != 0 => Err(ReportFault::SolutionsNotWanted),
        (_, false) => Ok(0),
    }
}

/// The copies of one job as the ledger sees them while it decides: the
/// stored ones, then those decided since. Plain data: the engine loads it,
/// [`decide`] updates it, and the engine keeps it for the rest of a group.
#[derive(Debug, Clone)]
pub(crate) struct JobCopies {
    /// Every copy, in the order received (and judged), wherever the Done
    /// record's copy is among them.
    pub(crate) copies: Vec<StoredResult>,
    /// Which copy the job's Done record holds.
    pub(crate) done: Option<usize>,
    /// The tally the scheduler counts for the job (after the decisions so
    /// far).
    pub(crate) counted: Option<Tally>,
    /// True when the job is settled in the scheduler.
    pub(crate) settled: bool,
    pub(crate) attempts: u32,
    /// The job's estimated work.
    pub(crate) work: u64,
    /// Solutions mode: the copy whose solutions are stored, if any.
    pub(crate) stored: Option<usize>,
}

impl JobCopies {
    /// The copies of `job` as stored (`copies`: the Done record's first;
    /// empty when the job is not done), put back in the order received,
    /// with what the scheduler says of it.
    pub(crate) fn new(
        jobs: &Jobs,
        job: JobId,
        copies: Vec<StoredResult>,
        attempts: u32,
        work: u64,
    ) -> JobCopies {
        let (copies, done) = nq_store::in_received_order(copies);
        let counted = match (jobs.is_counted(job), done) {
            (true, Some(i)) => Some(copies[i].tally),
            _ => None,
        };
        JobCopies {
            stored: if jobs.wants_solutions(job) {
                None
            } else {
                done
            },
            counted,
            settled: jobs.is_done(job),
            copies,
            done,
            attempts,
            work,
        }
    }
}

/// A write that a decision asks for. The engine turns them into one store
/// batch, and acknowledges nothing before that batch is flushed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Write {
    /// The job's first copy: it becomes the Done record.
    First {
        job: JobId,
        result: StoredResult,
        attempts: u32,
    },
    /// Verification overturned the Done record: this copy replaces it.
    Replace {
        job: JobId,
        result: StoredResult,
        attempts: u32,
    },
    /// A copy kept beside the Done record, as evidence.
    Keep { job: JobId, duplicate: Duplicate },
    /// A conflict lost as the job settled, charged to its loser once the
    /// writes are durable: a restart reads it back (`nq_store::losses`).
    Loss { job: JobId, loss: StoredLoss },
}

/// What judging a job's copies decided.
#[derive(Debug)]
pub(crate) struct Decision {
    /// To be made durable first.
    pub(crate) writes: Vec<Write>,
    /// For the scheduler, after the writes are durable.
    pub(crate) settlement: Settlement,
    /// For the reporter of the judged copy (if one was judged).
    pub(crate) outcome: Outcome,
}

/// The copies as votes, in classes of equal results numbered in order of
/// first appearance, with the first copy of each class.
pub(crate) fn votes_of(
    identities: &mut Identities,
    copies: &[StoredResult],
) -> (Vec<Vote>, Vec<usize>) {
    let mut reps: Vec<usize> = Vec::new();
    let votes = copies
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let class = reps
                .iter()
                .position(|&r| copies[r].agrees(c))
                .unwrap_or_else(|| {
                    reps.push(i);
                    reps.len() - 1
                });
            let identity = identities.intern(&c.identity);
            Vote {
                identity,
                class,
                trusted: identities.is_trusted(identity),
                credentialed: credentialed(&c.identity),
                kernel: c.kernel.parse().ok(),
                gpu: c.kernel == GPU_KERNEL,
            }
        })
        .collect();
    (votes, reps)
}

/// A copy kept as evidence: a confirmation when it agrees with the recorded
/// copy, else a conflict; received before the run completed, or
/// `after_completion` (then never judged).
fn keep(job: JobId, copy: &StoredResult, agrees: bool, after_completion: bool) -> Write {
    let kind = if agrees {
        DuplicateKind::Confirmation
    } else {
        DuplicateKind::Conflict
    };
    Write::Keep {
        job,
        duplicate: Duplicate {
            kind,
            result: copy.clone(),
            after_completion,
        },
    }
}

/// Judges `job`'s copies `jc`, the newest being `new` (or none, to judge
/// again after a change of reputations or on restore), and says what to
/// write, what to settle and how the new copy fared. `jc` is updated to the
/// state after the decision. It reads only the identities (their
/// reputations, and new voters interned) and `at`: the rules of the moment
/// and what `job` is selected for.
pub(crate) fn decide(
    identities: &mut Identities,
    at: (Rules, Selection),
    job: JobId,
    jc: &mut JobCopies,
    new: Option<&Verified>,
    solutions_mode: bool,
) -> Decision {
    let old_done = jc.done;
    if let Some(v) = new {
        let mut copy = v.result.clone();
        copy.stamp_after(&jc.copies);
        jc.copies.push(copy);
        if v.stored_solutions {
            jc.stored = Some(jc.copies.len() - 1);
        }
    }
    let (rules, selected) = at;
    let (votes, reps) = votes_of(identities, &jc.copies);
    let ban_after = rules.ban_after;
    let verdict = judge(&votes, selected, identities, rules);
    // The copy the Done record should hold: the leader's first voting copy,
    // or in solutions mode the leader's copy whose solutions are stored.
    let stored_leads = jc
        .stored
        .filter(|&s| verdict.leader == Some(votes[s].class));
    let leader_copy = stored_leads.or_else(|| {
        verdict.leader.map(|l| {
            (0..jc.copies.len())
                .find(|&i| {
                    votes[i].class == l
                        && !identities.is_banned(votes[i].identity, ban_after)
                })
                .unwrap_or(reps[l])
        })
    });
    // Solutions mode: the stored solutions must be the counted copy's; when
    // the majority overturned the copy that stored them, the next copy stores
    // its own (its writer deletes the stale ones first).
    let solutions_missing =
        solutions_mode && verdict.leader.is_some() && stored_leads.is_none();
    let mut writes =
        record_writes(job, jc, new.is_some(), &votes, leader_copy, stored_leads);
    let newest = jc.copies.len() - 1;
    let outcome = match (old_done, verdict.leader) {
        (None, _) => Outcome::Accepted,
        (Some(_), Some(l)) if votes[newest].class == l && jc.done != old_done => {
            Outcome::Accepted
        }
        (Some(_), Some(l)) if votes[newest].class == l => Outcome::Confirmed,
        _ => Outcome::Conflict,
    };
    let counted = leader_copy.map(|l| jc.copies[l].tally);
    let settlement = settlement(
        job,
        jc,
        new.map(|v| v.lease),
        counted,
        &votes,
        verdict,
        solutions_missing,
    );
    jc.counted = counted;
    jc.settled = settlement.settled;
    // Stored with the decision's other writes, so that what a restart
    // reads back is what the scheduler charges (`Scheduler::settle`).
    writes.extend(settlement.losers.iter().map(|&loser| Write::Loss {
        job,
        loss: stored_loss(identities, loser, &settlement.beaten),
    }));
    Decision {
        writes,
        settlement,
        outcome,
    }
}

/// The writes that keep the Done record on the leader's copy and every
/// other copy as evidence; updates `jc.done`.
fn record_writes(
    job: JobId,
    jc: &mut JobCopies,
    judged_new: bool,
    votes: &[Vote],
    leader_copy: Option<usize>,
    stored_leads: Option<usize>,
) -> Vec<Write> {
    let newest = jc.copies.len() - 1;
    let mut writes = Vec::new();
    match (jc.done, leader_copy) {
        (None, _) => {
            // The job's first copy (whatever its vote): it becomes the record.
            let first = leader_copy.unwrap_or(newest);
            writes.push(Write::First {
                job,
                result: jc.copies[first].clone(),
                attempts: jc.attempts,
            });
            jc.done = Some(first);
        }
        (Some(d), Some(l))
            if d != l
                && (votes[d].class != votes[l].class || stored_leads == Some(l)) =>
        {
            // Verification overturned the recorded copy.
            writes.push(Write::Replace {
                job,
                result: jc.copies[l].clone(),
                attempts: jc.attempts,
            });
            writes.push(keep(job, &jc.copies[d], false, false));
            jc.done = Some(l);
            if judged_new && l != newest {
                let agrees = votes[newest].class == votes[l].class;
                writes.push(keep(job, &jc.copies[newest], agrees, false));
            }
        }
        (Some(d), _) => {
            if judged_new {
                let agrees = votes[newest].class == votes[d].class;
                writes.push(keep(job, &jc.copies[newest], agrees, false));
            }
        }
    }
    writes
}

/// The stored form of a conflict `loser` lost against `beaten`.
fn stored_loss(
    identities: &Identities,
    loser: IdentityId,
    beaten: &Beaten,
) -> StoredLoss {
    StoredLoss {
        identity: identities.name(loser).to_owned(),
        by_trusted: beaten.by_trusted,
        by_credentials: beaten
            .by_credentials
            .iter()
            .map(|&id| identities.name(id).to_owned())
            .collect(),
    }
}

/// A stored conflict lost, as [`Identities::add_loss`] charges it: the
/// loser and whom it lost against, interned.
pub(crate) fn charged(
    identities: &mut Identities,
    loss: &StoredLoss,
) -> (IdentityId, Beaten) {
    let beaten = Beaten {
        by_trusted: loss.by_trusted,
        by_credentials: loss
            .by_credentials
            .iter()
            .map(|name| identities.intern(name))
            .collect(),
    };
    (identities.intern(&loss.identity), beaten)
}

/// The scheduler's side of a verdict.
fn settlement(
    job: JobId,
    jc: &JobCopies,
    lease: Option<LeaseId>,
    counted: Option<Tally>,
    votes: &[Vote],
    verdict: Verdict,
    solutions_missing: bool,
) -> Settlement {
    // Losses are charged when a disputed job settles, once.
    let losers = if verdict.settled && !jc.settled {
        verdict.losers
    } else {
        vec![]
    };
    // A copy that only has to store the leader's solutions may come from
    // one of the leader's voters (it adds no vote).
    let reporters = if solutions_missing {
        let leader = verdict.leader;
        verdict
            .reporters
            .into_iter()
            .filter(|r| {
                !votes
                    .iter()
                    .any(|v| v.identity == *r && Some(v.class) == leader)
            })
            .collect()
    } else {
        verdict.reporters
    };
    let mut kernels: Vec<String> = jc.copies.iter().map(|c| c.kernel.clone()).collect();
    kernels.sort_unstable();
    kernels.dedup();
    Settlement {
        job,
        lease,
        counted_before: jc.counted,
        counted,
        work: jc.work,
        attempts: jc.attempts,
        votes: verdict.votes,
        settled: verdict.settled && !solutions_missing,
        reporters,
        kernels,
        losers,
        beaten: verdict.beaten,
        needs_trusted: verdict.needs_trusted,
        disputed: verdict.conflict,
        solutions_missing,
        confirmed: verdict.confirmed,
        unchecked: verdict.unchecked,
    }
}

/// Refuses a copy `v` that came under a lease no longer live (expired or
/// taken back, see [`Scheduler::is_late`]) when its job has no copy yet
/// (`has_copies` false): it would settle the job alone, and a stalled
/// report's lie must not land as a job's result under a lease that was
/// reissued long before. With other copies it only votes beside them.
///
/// # Errors
///
/// [`Error::Refused`] with [`crate::Refusal::LateCopy`].
pub(crate) fn refuse_late_alone(
    v: &Verified,
    has_copies: bool,
    late: bool,
) -> Result<()> {
    if !has_copies && late {
        return Err(Error::Refused(crate::error::Refusal::LateCopy {
            job: v.job,
            lease: v.lease,
        }));
    }
    Ok(())
}

/// A copy that arrives once the run is complete: the result is final, so it
/// is only compared with the recorded copy and kept as evidence, marked so
/// that no later judging reads it ([`Duplicate::after_completion`]).
pub(crate) fn late_copy(copies: &[StoredResult], late: &Verified) -> (Write, Outcome) {
    let agrees = copies.first().is_some_and(|r| r.agrees(&late.result));
    let outcome = if agrees {
        Outcome::Confirmed
    } else {
        Outcome::Conflict
    };
    let mut copy = late.result.clone();
    copy.stamp_after(copies);
    (keep(late.job, &copy, agrees, true), outcome)
}

/// The verification machine a copy came from: the coordinator's threads are
/// one machine whatever kernel they ran.
pub(crate) fn machine_of(identity: &str) -> &str {
    if identity.starts_with("local:") {
        "local"
    } else {
        identity
    }
}

/// Restore: what a job's stored `copies` (the counted one first) say of
/// its voters' records, judged in the order received with no reputations,
/// as the job was when it settled: the conflicts lost (`losers`) and the
/// results confirmed by another identity (`confirmed`, for probation).
pub(crate) fn records_in(
    identities: &mut Identities,
    (rules, selected): (Rules, Selection),
    copies: &[StoredResult],
) -> Verdict {
    let (copies, _) = nq_store::in_received_order(copies.to_vec());
    let (votes, _) = votes_of(identities, &copies);
    judge(&votes, selected, &Identities::default(), rules)
}

/// Restore: judges a done job's stored `copies` (the Done record's first)
/// with the reputations as they stand, and returns the settlement to apply
/// and the writes to make. The writes are not empty when the restored
/// reputations overturn the Done record (they can differ from those it was
/// recorded under): the record must then move to the counted copy, or the
/// store and the totals disagree. `stored` says whether the Done record's
/// solutions are all stored (solutions mode). Losses and confirmations are
/// not charged again: [`records_in`] found them.
pub(crate) fn judge_restored(
    identities: &mut Identities,
    at: (Rules, Selection),
    job: JobId,
    copies: Vec<StoredResult>,
    (attempts, work): (u32, u64),
    stored: bool,
    solutions_mode: bool,
) -> (Settlement, Vec<Write>) {
    let (copies, done) = nq_store::in_received_order(copies);
    let mut jc = JobCopies {
        copies,
        done,
        counted: None,
        settled: false,
        attempts,
        work,
        stored: if stored { done } else { None },
    };
    let mut d = decide(identities, at, job, &mut jc, None, solutions_mode);
    d.settlement.losers.clear();
    d.settlement.confirmed.clear();
    d.writes.retain(|w| !matches!(w, Write::Loss { .. }));
    (d.settlement, d.writes)
}

/// Adds a decision's writes to a store batch (the commit group's, or
/// restore's): the data of a decision, in the form the store applies.
pub(crate) fn add_writes(batch: &mut nq_store::CommitBatch, writes: Vec<Write>) {
    for w in writes {
        match w {
            Write::First {
                job,
                result,
                attempts,
            } => batch.result(job, result, attempts),
            Write::Replace {
                job,
                result,
                attempts,
            } => batch.replace_result(job, result, attempts),
            Write::Keep { job, duplicate } => batch.duplicate(job, &duplicate),
            Write::Loss { job, loss } => batch.loss(job, &loss),
        }
    }
}

#[cfg(test)]
mod tests {
    //! One test per case of [`decide`], each also restored: judging the
    //! stored copies again from scratch ([`records_in`], then
    //! [`judge_restored`]) must reach the live decision's settlement.

    use std::time::Duration;

    use super::*;
    use crate::core::quorum::{Fraction, Policy};
    use crate::core::scheduler::Scheduler;

    // The ledger's functions take only the owners they read; these tests
    // drive them over a whole scheduler, as `Core` does.
    fn decide(
        s: &mut Scheduler,
        job: JobId,
        jc: &mut JobCopies,
        new: Option<&Verified>,
        solutions: bool,
    ) -> Decision {
        let (identities, at) = s.judging(job);
        super::decide(identities, at, job, jc, new, solutions)
    }

    fn records_in(s: &mut Scheduler, job: JobId, copies: &[StoredResult]) -> Verdict {
        let (identities, at) = s.judging(job);
        super::records_in(identities, at, copies)
    }

    fn judge_restored(
        s: &mut Scheduler,
        job: JobId,
        copies: Vec<StoredResult>,
        work: (u32, u64),
        stored: bool,
        solutions: bool,
    ) -> (Settlement, Vec<Write>) {
        let (identities, at) = s.judging(job);
        super::judge_restored(identities, at, job, copies, work, stored, solutions)
    }

    fn refuse_late_alone(s: &Scheduler, v: &Verified, has_copies: bool) -> Result<()> {
        super::refuse_late_alone(v, has_copies, s.is_late(v.lease))
    }

    const JOB: JobId = JobId(0);

    /// A scheduler of one job of work 5; `share` 1.0 selects it for a check.
    fn sched(share: f64) -> Scheduler {
        let policy = Policy {
            secret: [7; 16],
            fraction: Fraction::Fixed(share),
            ban_after: 2,
            gpu_sample: share,
        };
        Scheduler::new(vec![5], 1, Duration::from_secs(30), policy)
    }

    /// A verified copy of `JOB` by `identity` that counts `count`
    /// solutions in its one sub-problem.
    fn copy(identity: &str, count: u128) -> Verified {
        let counts = vec![SubCounts {
            count,
            fixed180: 0,
            fixed90: 0,
        }];
        Verified {
            job: JOB,
            lease: LeaseId(count as u64),
            stored_solutions: false,
            work: 5,
            result: StoredResult {
                counts,
                solutions: 0,
                tally: Tally {
                    total: 8 * count,
                    burnside: 8 * count,
                },
                identity: identity.to_owned(),
                kernel: "scalar".to_owned(),
                ..StoredResult::default()
            },
        }
    }

    fn empty(sched: &Scheduler) -> JobCopies {
        JobCopies::new(sched.job_phases(), JOB, Vec::new(), 1, 5)
    }

    /// Decides `new` and settles it, as the commit loop does after the flush.
    fn decide_and_settle(
        s: &mut Scheduler,
        jc: &mut JobCopies,
        new: &Verified,
        solutions: bool,
    ) -> Decision {
        let d = decide(s, JOB, jc, Some(new), solutions);
        s.settle(&d.settlement, true).expect("settles");
        d
    }

    /// Restores a fresh scheduler from `copies` as the store holds them
    /// (the Done record first) and returns its settlement.
    fn restored(share: f64, copies: Vec<StoredResult>, losses: &[&str]) -> Settlement {
        let mut s = sched(share);
        let records = records_in(&mut s, JOB, &copies);
        for loser in records.losers {
            s.restorer()
                .restore_loss(loser, &crate::core::quorum::Beaten::trusted());
        }
        for confirmed in records.confirmed {
            s.restorer().restore_confirmation(confirmed);
        }
        for name in losses {
            let id = s.intern(name);
            assert!(s.identities().lost(id) > 0, "{name} lost on restore");
        }
        judge_restored(&mut s, JOB, copies, (1, 5), true, false).0
    }

    /// The copies as the store holds them after `writes`, from `before`
    /// (the same form): the Done record first, then every duplicate in the
    /// order kept, the record's own copy among them where a replacement
    /// moved the record onto a copy kept earlier.
    fn stored_copies(writes: &[Write], before: Vec<StoredResult>) -> Vec<StoredResult> {
        let mut before = before.into_iter();
        let mut record = before.next();
        let mut duplicates: Vec<StoredResult> = before.collect();
        for w in writes {
            match w {
                Write::First { result, .. } => {
                    record.get_or_insert_with(|| result.clone());
                }
                Write::Replace { result, .. } => record = Some(result.clone()),
                Write::Keep { duplicate, .. } => {
                    duplicates.push(duplicate.result.clone())
                }
                Write::Loss { .. } => {}
            }
        }
        record.into_iter().chain(duplicates).collect()
    }

    /// Core simulation seed 15330: an identity that contradicts itself
    /// votes with the first copy it sent, also when the job is judged again
    /// from the store after verification moved the Done record (the old
    /// record then follows the duplicates). All copies arrive in one
    /// millisecond, so only their stamps keep the order.
    #[test]
    fn an_identity_votes_with_its_first_copy_wherever_the_record_moved() {
        let mut s = sched(0.0);
        let mut jc = empty(&s);
        let mut stored = Vec::new();
        for (who, count) in [("liar", 6), ("liar", 5), ("x", 5), ("a", 2), ("b", 2)] {
            let d = decide_and_settle(&mut s, &mut jc, &copy(who, count), false);
            stored = stored_copies(&d.writes, stored);
        }
        // Two votes for 2 against one for 5 (the liar's vote is for 6).
        assert!(jc.settled);
        assert_eq!(jc.counted.map(|t| t.total), Some(16));
        let identities: Vec<&str> = stored.iter().map(|c| c.identity.as_str()).collect();
        assert_eq!(
            identities,
            ["a", "liar", "x", "a", "liar", "b"],
            "the record moved, and the old one follows the duplicates"
        );
        let mut again = JobCopies::new(s.job_phases(), JOB, stored.clone(), 1, 5);
        let d = decide(&mut s, JOB, &mut again, None, false);
        assert!(d.settlement.settled && d.settlement.votes == 2, "{d:?}");
        assert!(d.writes.is_empty(), "the record stays: {:?}", d.writes);
        // A restart judges the stored copies the same way.
        assert!(restored(0.0, stored, &["liar", "x"]).settled);
    }

    /// See: issue 18, item 4: a stalled stream's count-0 report landed as
    /// its job's result under a lease expired and reissued long before.
    #[test]
    fn a_late_copy_never_settles_a_job_alone() {
        let mut s = sched(0.0);
        let t0 = std::time::Instant::now();
        let a = s.register("a", 1, None, t0).unwrap();
        let b = s.register("b", 1, None, t0).unwrap();
        let la = s.lease(&a, 1, &[], t0).unwrap().jobs[0].lease;
        let later = t0 + Duration::from_secs(31);
        s.expire(later);
        let lb = s.lease(&b, 1, &[], later).unwrap().jobs[0].lease;
        let late = Verified {
            lease: la,
            ..copy("a@unknown", 0)
        };
        assert!(matches!(
            refuse_late_alone(&s, &late, false),
            Err(Error::Refused(crate::Refusal::LateCopy { .. }))
        ));
        // Beside another copy it is one vote among others.
        assert!(refuse_late_alone(&s, &late, true).is_ok());
        let on_time = Verified {
            lease: lb,
            ..copy("b@unknown", 3)
        };
        assert!(refuse_late_alone(&s, &on_time, false).is_ok());
        // A lease this session never issued is admission's business.
        assert!(refuse_late_alone(&s, &copy("c@unknown", 3), false).is_ok());
    }

    #[test]
    fn a_first_copy_becomes_the_record_and_settles_an_unselected_job() {
        let mut s = sched(0.0);
        let mut jc = empty(&s);
        let a = copy("a@127.0.0.1", 3);
        let d = decide_and_settle(&mut s, &mut jc, &a, false);
        assert_eq!(d.outcome, Outcome::Accepted);
        assert_eq!(
            d.writes,
            vec![Write::First {
                job: JOB,
                result: a.result.clone(),
                attempts: 1
            }]
        );
        assert!(d.settlement.settled);
        assert_eq!(d.settlement.counted, Some(a.result.tally));
        assert!(s.is_complete());
        assert_eq!(s.tally().total, 24);
        let r = restored(0.0, vec![a.result], &[]);
        assert!(r.settled);
        assert_eq!(r.counted, d.settlement.counted);
    }

    #[test]
    fn a_selected_job_waits_for_a_confirmation_from_another_identity() {
        let mut s = sched(1.0);
        // A second machine is at work to give the check.
        s.restorer()
            .restore_two_machines(true, std::time::Instant::now());
        let mut jc = empty(&s);
        let a = copy("a@127.0.0.1", 3);
        let d = decide_and_settle(&mut s, &mut jc, &a, false);
        assert_eq!(d.outcome, Outcome::Accepted);
        assert!(!d.settlement.settled, "one vote does not settle a check");
        // The same identity again is still one vote.
        let again = copy("a@127.0.0.1", 3);
        let d = decide_and_settle(&mut s, &mut jc, &again, false);
        assert!(!d.settlement.settled);
        let b = copy("b@127.0.0.1", 3);
        let d = decide_and_settle(&mut s, &mut jc, &b, false);
        assert_eq!(d.outcome, Outcome::Confirmed);
        assert!(d.settlement.settled);
        assert_eq!(d.settlement.votes, 2);
        assert!(matches!(
            &d.writes[..],
            [Write::Keep { duplicate, .. }] if duplicate.kind == DuplicateKind::Confirmation
        ));
        assert_eq!(s.tally().total, 24, "a confirmation adds nothing");
        let r = restored(1.0, vec![a.result, again.result, b.result], &[]);
        assert!(r.settled);
        assert_eq!(
            r.counted,
            Some(Tally {
                total: 24,
                burnside: 24
            })
        );
    }

    #[test]
    fn a_conflict_waits_for_a_third_copy_which_overturns_the_record() {
        let mut s = sched(1.0);
        let mut jc = empty(&s);
        let liar = copy("liar@127.0.0.1", 9);
        decide_and_settle(&mut s, &mut jc, &liar, false);
        let honest = copy("b@127.0.0.1", 3);
        let d = decide_and_settle(&mut s, &mut jc, &honest, false);
        assert_eq!(d.outcome, Outcome::Conflict);
        assert!(!d.settlement.settled);
        assert!(d.settlement.disputed);
        assert_eq!(s.jobs_disputed(), 1);
        let third = copy("c@127.0.0.1", 3);
        let d = decide_and_settle(&mut s, &mut jc, &third, false);
        assert_eq!(
            d.outcome,
            Outcome::Accepted,
            "the record changed to its class"
        );
        assert!(d.settlement.settled);
        assert_eq!(d.settlement.counted_before, Some(liar.result.tally));
        assert_eq!(d.settlement.counted, Some(honest.result.tally));
        assert!(
            matches!(&d.writes[0], Write::Replace { result, .. }
                if result.identity == honest.result.identity && result.agrees(&honest.result)),
            "the honest copy, stamped after the liar's: {:?}",
            d.writes[0]
        );
        assert!(d.writes.iter().any(|w| matches!(w,
            Write::Keep { duplicate, .. }
                if duplicate.kind == DuplicateKind::Conflict && duplicate.result == liar.result)));
        let liar_id = s.intern("liar@127.0.0.1");
        assert_eq!(s.identities().lost(liar_id), 1, "the loser is charged once");
        // The loss is stored with the decision that charges it.
        let stored: Vec<&StoredLoss> = d
            .writes
            .iter()
            .filter_map(|w| match w {
                Write::Loss { loss, .. } => Some(loss),
                _ => None,
            })
            .collect();
        assert_eq!(stored.len(), 1);
        assert_eq!(stored[0].identity, "liar@127.0.0.1");
        assert_eq!(s.tally().total, 24);
        assert_eq!(s.jobs_disputed(), 0);
        // The store now holds the honest copy as the record.
        let copies = vec![honest.result.clone(), liar.result, third.result];
        let r = restored(1.0, copies.clone(), &["liar@127.0.0.1"]);
        assert!(r.settled);
        assert_eq!(r.counted, Some(honest.result.tally));
        assert!(r.losers.is_empty(), "restore does not charge losses twice");
        // Read back as stored, the loss is the one charged.
        let mut back = sched(1.0);
        back.restorer()
            .learn_records(JOB, &copies, Some(&[stored[0].clone()]));
        let id = back.intern("liar@127.0.0.1");
        assert_eq!(back.identities().lost(id), 1);
        // Judging the copies again on restore stores no loss.
        let (_, writes) = judge_restored(&mut back, JOB, copies, (1, 5), true, false);
        assert!(!writes.iter().any(|w| matches!(w, Write::Loss { .. })));
    }

    /// A lie that comes after its job settled is kept, not charged: the run
    /// stores no loss for it, and a restart that reads the stored losses
    /// charges none either (judging the copies again would, as restarts did
    /// before the losses were kept: core simulation seed 3040, where such a
    /// charge banned an honest identity).
    #[test]
    fn a_lie_after_the_job_settled_costs_nothing_across_a_restart() {
        let mut s = sched(1.0);
        let mut jc = empty(&s);
        let a = copy("a@127.0.0.1", 3);
        let b = copy("b@127.0.0.1", 3);
        decide_and_settle(&mut s, &mut jc, &a, false);
        decide_and_settle(&mut s, &mut jc, &b, false);
        assert!(jc.settled);
        let late_liar = copy("liar@127.0.0.1", 9);
        let d = decide_and_settle(&mut s, &mut jc, &late_liar, false);
        assert_eq!(d.outcome, Outcome::Conflict);
        assert!(!d.writes.iter().any(|w| matches!(w, Write::Loss { .. })));
        let liar_id = s.intern("liar@127.0.0.1");
        assert_eq!(s.identities().lost(liar_id), 0, "not charged live");
        let copies = vec![a.result, b.result, late_liar.result];
        let mut kept = sched(1.0);
        kept.restorer().learn_records(JOB, &copies, Some(&[]));
        let id = kept.intern("liar@127.0.0.1");
        assert_eq!(kept.identities().lost(id), 0, "nor on a restart");
        let mut judged = sched(1.0);
        judged.restorer().learn_records(JOB, &copies, None);
        let id = judged.intern("liar@127.0.0.1");
        assert_eq!(
            judged.identities().lost(id),
            1,
            "judging again charges what the run did not"
        );
    }

    /// A verified copy of `JOB` that ran on a GPU (`nq-worker --gpu`).
    fn gpu_copy(identity: &str, count: u128) -> Verified {
        let mut v = copy(identity, count);
        v.result.kernel = GPU_KERNEL.to_owned();
        v
    }

    /// See: issue 24, item 6.
    #[test]
    fn gpu_copies_in_the_cpu_sample_wait_for_the_threads_whose_cpu_copy_decides() {
        use crate::core::quorum::LOCAL;
        let mut s = sched(1.0);
        let now = std::time::Instant::now();
        let local = s.register_local(1, now);
        let mut jc = empty(&s);
        let (a, b) = (gpu_copy("a@127.0.0.1", 9), gpu_copy("b@127.0.0.1", 9));
        decide_and_settle(&mut s, &mut jc, &a, false);
        let d = decide_and_settle(&mut s, &mut jc, &b, false);
        assert_eq!(d.outcome, Outcome::Confirmed);
        assert!(d.settlement.held_for_cpu_sample(), "{:?}", d.settlement);
        assert_eq!(s.tally().total, 72, "the GPU copies count while they wait");
        // Only a trusted computation may give the sample's copy.
        let c = s.register("c", 1, None, now).unwrap();
        assert!(s.lease(&c, 1, &[], now).unwrap().jobs.is_empty());
        let g = s.lease(&local, 1, &[], now).unwrap();
        assert_eq!(g.jobs.iter().map(|j| j.job).collect::<Vec<_>>(), vec![JOB]);
        // The threads' CPU copy disagrees: it counts at once, checks itself
        // on a second kernel, and then the GPU workers lose.
        let mut cpu = copy(LOCAL, 3);
        cpu.result.kernel = "avx2".to_owned();
        let d = decide_and_settle(&mut s, &mut jc, &cpu, false);
        assert!(!d.settlement.settled && d.settlement.disputed);
        assert_eq!(s.tally().total, 24);
        let d = decide_and_settle(&mut s, &mut jc, &copy(LOCAL, 3), false);
        assert!(d.settlement.settled);
        assert_eq!(d.settlement.counted, Some(cpu.result.tally));
        for gpu in ["a@127.0.0.1", "b@127.0.0.1"] {
            let id = s.intern(gpu);
            assert_eq!(s.identities().lost(id), 1, "{gpu} lost to the CPU kernel");
        }
        // Restored with the threads at work, the GPU copies alone wait again.
        let mut r = sched(1.0);
        r.restorer().expect_local_threads(true);
        let copies = vec![a.result, b.result];
        let (st, _) = judge_restored(&mut r, JOB, copies, (1, 5), true, false);
        assert!(st.held_for_cpu_sample(), "{st:?}");
    }

    #[test]
    fn solutions_stored_by_an_overturned_copy_are_stored_again() {
        let mut s = sched(1.0);
        let mut jc = empty(&s);
        let mut liar = copy("liar@127.0.0.1", 9);
        liar.stored_solutions = true;
        decide_and_settle(&mut s, &mut jc, &liar, true);
        decide_and_settle(&mut s, &mut jc, &copy("b@127.0.0.1", 3), true);
        let d = decide_and_settle(&mut s, &mut jc, &copy("c@127.0.0.1", 3), true);
        assert!(d.settlement.solutions_missing);
        assert!(
            !d.settlement.settled,
            "the leader's solutions are not stored yet"
        );
        assert!(s.wants_solutions(JOB));
        // The next copy comes from someone other than the leader's voters.
        let b = s.intern("b@127.0.0.1");
        let c = s.intern("c@127.0.0.1");
        assert!(
            !d.settlement.reporters.contains(&b) && !d.settlement.reporters.contains(&c)
        );
        // A leader's copy whose solutions are stored settles it.
        let mut d4 = copy("d@127.0.0.1", 3);
        d4.stored_solutions = true;
        let d = decide_and_settle(&mut s, &mut jc, &d4, true);
        assert!(d.settlement.settled);
        assert!(!s.wants_solutions(JOB));
    }

    #[test]
    fn a_banned_identity_never_votes() {
        let mut s = sched(0.0);
        let banned = s.intern("bad@127.0.0.1");
        s.restorer()
            .restore_loss(banned, &crate::core::quorum::Beaten::trusted());
        s.restorer()
            .restore_loss(banned, &crate::core::quorum::Beaten::trusted());
        assert!(s.identities().is_banned(banned, 2));
        let mut jc = empty(&s);
        let bad = copy("bad@127.0.0.1", 9);
        let d = decide_and_settle(&mut s, &mut jc, &bad, false);
        // Its copy is kept as the record for lack of another, but counts
        // nothing and settles nothing.
        assert!(!d.settlement.settled);
        assert_eq!(d.settlement.counted, None);
        assert_eq!(s.tally().total, 0);
        let good = copy("good@127.0.0.1", 3);
        let d = decide_and_settle(&mut s, &mut jc, &good, false);
        assert!(d.settlement.settled);
        assert_eq!(d.settlement.counted, Some(good.result.tally));
        assert_eq!(s.tally().total, 24);
        let copies = stored_copies(&d.writes, vec![bad.result]);
        let mut r = sched(0.0);
        let id = r.intern("bad@127.0.0.1");
        r.restorer()
            .restore_loss(id, &crate::core::quorum::Beaten::trusted());
        r.restorer()
            .restore_loss(id, &crate::core::quorum::Beaten::trusted());
        let (st, _) = judge_restored(&mut r, JOB, copies, (1, 5), true, false);
        assert!(st.settled);
        assert_eq!(st.counted, Some(good.result.tally));
    }

    #[test]
    fn a_restore_that_overturns_the_record_moves_it_to_the_counted_copy() {
        // Live, "bad" was in good standing when its copy became the record;
        // the restore finds its ban, so the other copy counts, and the
        // record must follow, or the next copy of the job would take back a
        // tally that was never counted.
        let bad = copy("bad@127.0.0.1", 9);
        let good = copy("good@127.0.0.1", 3);
        let mut r = sched(0.0);
        let id = r.intern("bad@127.0.0.1");
        r.restorer()
            .restore_loss(id, &crate::core::quorum::Beaten::trusted());
        r.restorer()
            .restore_loss(id, &crate::core::quorum::Beaten::trusted());
        let copies = vec![bad.result.clone(), good.result.clone()];
        let (st, writes) = judge_restored(&mut r, JOB, copies, (1, 5), true, false);
        assert!(st.settled);
        assert_eq!(st.counted, Some(good.result.tally));
        assert!(
            matches!(&writes[0], Write::Replace { result, .. } if *result == good.result),
            "{writes:?}"
        );
        // Nothing moves when the record stands.
        let mut r = sched(0.0);
        let copies = vec![good.result.clone(), good.result.clone()];
        let (_, writes) = judge_restored(&mut r, JOB, copies, (1, 5), true, false);
        assert!(writes.is_empty());
    }

    #[test]
    fn a_late_copy_after_completion_changes_nothing() {
        let recorded = copy("a@127.0.0.1", 3);
        let (w, outcome) = late_copy(
            std::slice::from_ref(&recorded.result),
            &copy("b@127.0.0.1", 3),
        );
        assert_eq!(outcome, Outcome::Confirmed);
        // Kept after the recorded copy though both read the same clock.
        assert!(
            matches!(w, Write::Keep { duplicate, .. } if duplicate.kind == DuplicateKind::Confirmation
                && duplicate.after_completion
                && duplicate.result.received_unix_ms > recorded.result.received_unix_ms)
        );
        let (w, outcome) = late_copy(
            std::slice::from_ref(&recorded.result),
            &copy("liar@127.0.0.1", 9),
        );
        assert_eq!(outcome, Outcome::Conflict);
        // Marked, so that no later judging reads it: the result is final.
        assert!(
            matches!(w, Write::Keep { duplicate, .. } if duplicate.kind == DuplicateKind::Conflict
                && duplicate.after_completion)
        );
    }

    #[test]
    fn a_suspect_leader_needs_a_second_vote() {
        let mut s = sched(0.0);
        let suspect = s.intern("sus@127.0.0.1");
        s.restorer()
            .restore_loss(suspect, &crate::core::quorum::Beaten::trusted());
        let mut jc = empty(&s);
        let d = decide_and_settle(&mut s, &mut jc, &copy("sus@127.0.0.1", 3), false);
        assert!(
            !d.settlement.settled,
            "a suspect's result alone does not settle"
        );
        assert_eq!(
            d.settlement.counted,
            Some(Tally {
                total: 24,
                burnside: 24
            })
        );
        let d = decide_and_settle(&mut s, &mut jc, &copy("b@127.0.0.1", 3), false);
        assert!(d.settlement.settled);
        assert_eq!(d.outcome, Outcome::Confirmed);
        // Restored with the suspect's loss found elsewhere: the same.
        let mut r = sched(0.0);
        let id = r.intern("sus@127.0.0.1");
        r.restorer()
            .restore_loss(id, &crate::core::quorum::Beaten::trusted());
        let (st, _) = judge_restored(
            &mut r,
            JOB,
            vec![copy("sus@127.0.0.1", 3).result],
            (1, 5),
            true,
            false,
        );
        assert!(!st.settled);
    }

    #[test]
    fn counts_are_checked_against_the_job() {
        use nq_core::board::Board;
        use nq_core::split::SplitSpec;
        let board = Board::new(8).expect("a board");
        let spec = SplitSpec::BORDER;
        let shape = RunShape {
            board,
            spec,
            solutions: false,
        };
        let subs: Vec<SubProblem> = nq_core::split::split(board, spec)
            .into_iter()
            .take(1)
            .collect();
        let report = |count: u128, n: usize| Report {
            job: JOB,
            lease: LeaseId(1),
            worker: "w".into(),
            counts: vec![
                SubCounts {
                    count,
                    fixed180: 0,
                    fixed90: 0
                };
                n
            ],
            nodes: 0,
            work: 1,
            solutions_sent: 0,
            listed: None,
            kernel: "scalar".into(),
            stored_solutions: false,
        };
        let err = check_counts(&shape, &subs, report(0, 2), "w".into(), 0).unwrap_err();
        assert!(matches!(
            err,
            Error::BadReport {
                fault: ReportFault::CountsLength { .. },
                ..
            }
        ));
        let err =
            check_counts(&shape, &subs, report(1 << 90, 1), "w".into(), 0).unwrap_err();
        assert!(matches!(err, Error::BadReport { .. }), "{err}");
    }
}
