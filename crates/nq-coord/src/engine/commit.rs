//! The commit loop: the one writer of results.
//!
//! Checked copies queue here from every reporter. The loop takes them in
//! groups, loads each job's stored copies, lets the core decide
//! ([`ledger::decide`]), writes every decision's writes in ONE batch,
//! flushes ONCE for the group, and only then settles the decisions in the
//! scheduler and answers the reporters: group commit, one disk sync per
//! batch instead of per result. A copy that discredits a worker (its first
//! lost conflict, or its ban) makes the loop judge again every job that
//! worker voted for, so that none of its unverified results stays counted
//! without a second vote.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use nq_store::{CommitBatch, JobId, JobState, Scan, StoredResult};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use super::{Engine, blocking, restoring};
use crate::core::ledger::{self, Decision, JobCopies, Verified};
use crate::core::scheduler::{Fallout, Outcome, Settlement};
use crate::error::Result;

/// Most results applied under one flush.
const MAX_GROUP: usize = 2048;

/// Rounds of re-judging at most after one group: each round can discredit
/// more identities, and a chain of them is bounded by the voters.
const REJUDGE_ROUNDS: usize = 16;

/// Verified results of one reporter waiting for the commit loop, with where
/// to send their outcomes. A `ReportBatch` is one request, so that its items
/// cost one queue hand-off and one wake-up, not one each.
#[derive(Debug)]
pub(crate) struct CommitRequest {
    /// The copies still to judge.
    copies: Vec<Verified>,
    /// Answered, one outcome per copy as sent, in order, after the flush
    /// that covers them.
    reply: oneshot::Sender<Vec<Result<Outcome>>>,
    /// Copies refused before judging (late and alone), by their place in
    /// the request as sent; `copies` fill the other places in order.
    refused: Vec<(usize, crate::Error)>,
}

impl CommitRequest {
    /// A request to judge `copies`, answered on `reply`.
    pub(crate) fn new(
        copies: Vec<Verified>,
        reply: oneshot::Sender<Vec<Result<Outcome>>>,
    ) -> CommitRequest {
        CommitRequest {
            copies,
            reply,
            refused: Vec::new(),
        }
    }

    /// Sends `outcomes` (one per copy left in `copies`), with the refusals
    /// in their places, to the reporter.
    fn answer(self, outcomes: Vec<Result<Outcome>>) {
        for (v, outcome) in self.copies.iter().zip(&outcomes) {
            log_outcome(v, outcome);
        }
        let total = outcomes.len() + self.refused.len();
        let mut judged = outcomes.into_iter();
        let mut refused = self.refused.into_iter().peekable();
        let mut all = Vec::with_capacity(total);
        for i in 0..total {
            match refused.next_if(|(at, _)| *at == i) {
                Some((_, e)) => all.push(Err(e)),
                None => all.extend(judged.next()),
            }
        }
        // A reporter that gave up waiting is not an error.
        let _ = self.reply.send(all);
    }
}

/// Group-commits verified results until `token` is cancelled, then drains
/// what is queued and returns.
///
/// # Errors
///
/// A store error (a failed write or flush). It is fatal: acknowledged results
/// must be durable, and a store that cannot flush cannot promise that. Every
/// queued reporter then gets `ShuttingDown` and retries later.
pub(crate) async fn commit_loop(
    engine: Arc<Engine>,
    mut rx: mpsc::Receiver<CommitRequest>,
    token: CancellationToken,
) -> Result<()> {
    let mut group = Vec::with_capacity(MAX_GROUP);
    // A restart that served first checks the stored copies here, between
    // groups (see `restoring`): first in the select, so that a steady flow
    // of reports cannot starve it.
    let mut stored =
        (!engine.checked.is_cancelled()).then(|| restoring::start_reader(&engine));
    loop {
        let received = tokio::select! {
            biased;
            block = next_block(&mut stored), if stored.is_some() => {
                let settled = match block {
                    Some(Ok(block)) => restoring::settle_block(&engine, block).await,
                    Some(Err(e)) => Err(e),
                    None => {
                        stored = None;
                        restoring::finish(&engine);
                        Ok(())
                    }
                };
                if let Err(e) = settled {
                    error!(error = %e.chain(), "cannot check the stored results; stopping the coordinator");
                    rx.close();
                    return Err(e);
                }
                continue;
            }
            n = rx.recv_many(&mut group, MAX_GROUP) => n,
            () = engine.machines_changed.notified(), if !engine.complete.is_cancelled() => {
                let changed = Fallout {
                    selection_changed: true,
                    ..Fallout::default()
                };
                if let Err(e) = rejudge(&engine, changed).await {
                    error!(error = %e.chain(), "cannot store results; stopping the coordinator");
                    rx.close();
                    return Err(e);
                }
                if engine.core().is_complete() {
                    engine.complete.cancel();
                }
                continue;
            }
            () = token.cancelled() => {
                // No new results; finish those already queued.
                rx.close();
                rx.recv_many(&mut group, MAX_GROUP).await
            }
        };
        if received == 0 {
            return Ok(());
        }
        if let Err(e) = commit_group(&engine, &mut group).await {
            error!(error = %e.chain(), "cannot store results; stopping the coordinator");
            rx.close();
            return Err(e);
        }
    }
}

/// The next block of the background check of stored copies.
async fn next_block(
    stored: &mut Option<mpsc::Receiver<Result<restoring::Block>>>,
) -> Option<Result<restoring::Block>> {
    match stored {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// A job's stored copies and attempts, read from the store without the
/// core's lock.
struct Stored {
    copies: Vec<nq_store::StoredResult>,
    attempts: u32,
}

/// Reads the stored copies of `job`.
fn read(engine: &Engine, job: JobId) -> Result<Stored> {
    let record = engine.store.job_record(job)?;
    let copies = match record.state {
        JobState::Done(result) => {
            nq_store::judged_copies(*result, engine.store.job_duplicates(job)?)
        }
        _ => Vec::new(),
    };
    Ok(Stored {
        copies,
        attempts: record.attempts,
    })
}

/// Reads the stored copies of `job`, whose estimated work is `work`, as the
/// core should judge them.
fn load(engine: &Engine, job: JobId, work: u64) -> Result<JobCopies> {
    let stored = read(engine, job)?;
    let core = engine.core();
    Ok(core.job(job).copies(stored.copies, stored.attempts, work))
}

/// Decides, writes, flushes, settles and acknowledges one group.
async fn commit_group(engine: &Engine, group: &mut Vec<CommitRequest>) -> Result<()> {
    if engine.complete.is_cancelled() {
        return keep_late_copies(engine, group).await;
    }
    // 0. Jobs whose stored copies wait for the background check are
    // checked and counted first: the copies below are judged with them.
    // Listed only while some job waits: after a restart's check, this is
    // one lock per group and no allocation.
    if engine.core().standing().jobs_restoring > 0 {
        let jobs = group
            .iter()
            .flat_map(|req| req.copies.iter().map(|v| v.job))
            .collect();
        restoring::restore_now(engine, jobs).await?;
    }
    // A late copy never settles a job alone.
    refuse_late_alone(engine, group)?;
    if group.is_empty() {
        return Ok(());
    }
    // 1. Decide, in queue order. Only this task changes results, so what it
    // reads now still holds after the flush. The store is read first, without
    // the core's lock; the decisions then take it once for the group, not
    // once per copy, so that lease and report calls wait on it less.
    let copies = group.iter().flat_map(|req| &req.copies);
    let mut overlay: HashMap<JobId, JobCopies> = HashMap::new();
    let mut decisions: Vec<Decision> = Vec::with_capacity(group.len());
    let mut batch = CommitBatch::new();
    blocking(|| -> Result<()> {
        let mut stored: HashMap<JobId, Stored> = HashMap::new();
        for v in copies.clone() {
            if let Entry::Vacant(e) = stored.entry(v.job) {
                e.insert(read(engine, v.job)?);
            }
        }
        let mut core = engine.core();
        for v in copies {
            let jc = match overlay.entry(v.job) {
                Entry::Occupied(e) => e.into_mut(),
                Entry::Vacant(e) => {
                    let s = stored.remove(&v.job).expect("read above");
                    e.insert(core.job(v.job).copies(s.copies, s.attempts, v.work))
                }
            };
            let mut d = core.decide(v.job, jc, Some(v), engine.shape.solutions);
            ledger::add_writes(&mut batch, std::mem::take(&mut d.writes));
            decisions.push(d);
        }
        Ok(())
    })?;
    // 2. Write and make durable, before anything is acknowledged.
    engine.apply_and_flush(batch).await?;
    // 3. Settle in the scheduler.
    let mut outcomes = Vec::with_capacity(group.len());
    let mut fallout = Fallout::default();
    {
        let mut core = engine.core();
        for d in &decisions {
            let f = core.settle(&d.settlement, true);
            warn_alone(engine, &d.settlement);
            note_cpu_sample(&d.settlement);
            outcomes.push(f.map(|f| {
                core.note_outcome(d.outcome);
                fallout.absorb(f);
                d.outcome
            }));
        }
    }
    // 4. Answer.
    let mut outcomes = outcomes.into_iter();
    for req in group.drain(..) {
        let mine = outcomes.by_ref().take(req.copies.len()).collect();
        req.answer(mine);
    }
    // 5. Discredited workers and a grown selection: judge again what they
    // touched.
    rejudge(engine, fallout).await?;
    if engine.core().is_complete() {
        engine.complete.cancel();
    }
    Ok(())
}

/// Answers and removes the copies of `group` that came under a lease no
/// longer live for a job with no copy yet, stored or earlier in the group
/// ([`ledger::refuse_late_alone`]). Nothing is written for them, so the
/// refusal needs no flush.
fn refuse_late_alone(engine: &Engine, group: &mut Vec<CommitRequest>) -> Result<()> {
    let mut seen: HashSet<JobId> = HashSet::new();
    let mut kept = Vec::with_capacity(group.len());
    for mut req in group.drain(..) {
        let mut judged = Vec::with_capacity(req.copies.len());
        for (at, v) in std::mem::take(&mut req.copies).into_iter().enumerate() {
            let late = engine.core().leases().is_late(v.lease);
            // The store is read only for late copies, which are rare.
            let has_copies = seen.contains(&v.job)
                || (late
                    && matches!(
                        blocking(|| engine.store.job_record(v.job))?.state,
                        JobState::Done(_)
                    ));
            let verdict = ledger::refuse_late_alone(&v, has_copies, late);
            if let Err(e) = verdict {
                warn!(job = %v.job, lease = %v.lease, worker = %v.result.identity, "refused a late copy: its lease is no longer live and the job has no other copy");
                req.refused.push((at, e));
                continue;
            }
            seen.insert(v.job);
            judged.push(v);
        }
        req.copies = judged;
        if req.copies.is_empty() {
            req.answer(Vec::new());
        } else {
            kept.push(req);
        }
    }
    *group = kept;
    Ok(())
}

fn log_outcome(v: &Verified, outcome: &Result<Outcome>) {
    let worker = &v.result.identity;
    match outcome {
        Ok(Outcome::Accepted) => {
            debug!(job = %v.job, lease = %v.lease, worker = %worker, "copy counts")
        }
        Ok(Outcome::Confirmed) => {
            debug!(job = %v.job, lease = %v.lease, worker = %worker, "copy confirms the counted one")
        }
        Ok(Outcome::Conflict) => warn!(
            job = %v.job,
            lease = %v.lease,
            worker = %worker,
            "CONFLICT: a copy disagrees with the counted one; kept as evidence, another copy decides"
        ),
        Err(e) => {
            error!(job = %v.job, error = %e.chain(), "cannot apply a stored result")
        }
    }
}

/// Once every job is settled the run's result is final: copies that arrive
/// during the linger (a worker that was slow, or lying) are compared with the
/// recorded ones and kept as evidence, and change nothing else.
async fn keep_late_copies(engine: &Engine, group: &mut Vec<CommitRequest>) -> Result<()> {
    let mut batch = CommitBatch::new();
    let mut outcomes = Vec::with_capacity(group.len());
    blocking(|| -> Result<()> {
        // Each job's copies, stored and kept in this group, so that every
        // late copy is stamped after them (`StoredResult::stamp_after`).
        let mut copies: HashMap<JobId, Vec<StoredResult>> = HashMap::new();
        for v in group.iter().flat_map(|req| &req.copies) {
            let job = match copies.entry(v.job) {
                Entry::Occupied(e) => e.into_mut(),
                Entry::Vacant(e) => e.insert(read(engine, v.job)?.copies),
            };
            let (write, outcome) = ledger::late_copy(job, v);
            if let ledger::Write::Keep { duplicate, .. } = &write {
                job.push(duplicate.result.clone());
            }
            ledger::add_writes(&mut batch, vec![write]);
            outcomes.push(outcome);
        }
        Ok(())
    })?;
    engine.apply_and_flush(batch).await?;
    let mut outcomes = outcomes.into_iter();
    let mut core = engine.core();
    for req in group.drain(..) {
        let mut mine = Vec::with_capacity(req.copies.len());
        for (v, outcome) in req.copies.iter().zip(outcomes.by_ref()) {
            core.note_outcome(outcome);
            if outcome == Outcome::Conflict {
                warn!(job = %v.job, worker = %v.result.identity, "a copy that arrived after the run was complete disagrees; kept as evidence");
            }
            mine.push(Ok(outcome));
        }
        let _ = req.reply.send(mine);
    }
    Ok(())
}

/// Warns, once a session, when `settled` is the first job that settled
/// unchecked: a check it needed (probation, or the `--verify` selection)
/// had no second machine to give it, and the run will end `unchecked`
/// unless one delivers before the end (issue 26, item 1).
fn warn_alone(engine: &Engine, settled: &Settlement) {
    use std::sync::atomic::Ordering;
    if settled.settled
        && settled.unchecked
        && !engine.warned_alone.swap(true, Ordering::Relaxed)
    {
        warn!(
            job = %settled.job,
            "NO SECOND MACHINE delivers: jobs that need a check (a new worker's probation, or the --verify share) settle on one copy, marked unchecked; the run ends `unchecked` unless another machine (a worker with its own identity, or the coordinator's local threads) delivers before the end"
        );
    }
}

/// Logs a job that the CPU sample holds back: its copies ran on GPUs and
/// would settle it, and a trusted CPU kernel computes it first (see
/// [`crate::quorum`], "Kernel diversity for GPU copies"). A few per
/// thousand GPU jobs at the default share.
fn note_cpu_sample(settled: &Settlement) {
    if settled.held_for_cpu_sample() {
        info!(
            job = %settled.job,
            kernels = ?settled.kernels,
            "held for the CPU sample: every copy ran on a GPU; a trusted CPU kernel computes the job again before it counts"
        );
    }
}

/// Logs what `fallout` changed, and lists the jobs it may have unsettled:
/// when the selection grew, settled jobs that are now selected (and jobs
/// waiting for checks a single machine cannot give).
fn announce(engine: &Engine, fallout: &Fallout) -> Vec<JobId> {
    let core = engine.core();
    let s = core.verification();
    for &id in &fallout.discredited {
        let (name, lost) = (s.identities().label(id), s.identities().lost(id));
        if s.identities().is_banned(id, s.policy().ban_after) {
            error!(
                worker = name,
                lost,
                "worker BANNED: it lost too many verification conflicts; its results are computed again by others"
            );
        } else {
            warn!(
                worker = name,
                lost,
                "worker lost a verification conflict; each of its results now needs a second vote"
            );
        }
    }
    if fallout.selection_changed {
        if s.second_source() {
            info!(
                share = s.policy().share(true),
                "two machines are at work: checking that share of the jobs"
            );
        } else {
            info!(
                "one machine is left at work: jobs stop waiting for checks it cannot give"
            );
        }
    }
    for &id in &fallout.left_probation {
        info!(
            worker = s.identities().label(id),
            "worker left probation: its results count on one vote, spot-checked"
        );
    }
    s.jobs_to_judge_again(fallout)
}

/// The jobs that the identities `names` voted for: the counted copies in
/// the job records, the others in the duplicates tree. A scan of the store,
/// not of memory, which holds no voter per job; discredits are rare.
async fn jobs_voted_by(engine: &Engine, names: Vec<String>) -> Result<Vec<JobId>> {
    let store = Arc::clone(&engine.store);
    tokio::task::spawn_blocking(move || -> Result<Vec<JobId>> {
        let mut out = Vec::new();
        for entry in store.scan_jobs(Scan::Done) {
            let entry = entry?;
            let job = entry.job;
            if entry
                .into_copies()
                .iter()
                .any(|c| names.contains(&c.identity))
            {
                out.push(job);
            }
        }
        Ok(out)
    })
    .await?
}

/// Judges again every job that `fallout` may have unsettled: those a
/// discredited identity voted for (its unverified results now need a second
/// vote, and a banned identity's votes no longer count), and, when the
/// selection grew, settled jobs that are now selected. Repeats while judging
/// discredits more identities.
pub(crate) async fn rejudge(engine: &Engine, mut fallout: Fallout) -> Result<()> {
    for _round in 0..REJUDGE_ROUNDS {
        if fallout.is_empty() {
            return Ok(());
        }
        let mut jobs = announce(engine, &fallout);
        if !fallout.discredited.is_empty() {
            let names: Vec<String> = {
                let core = engine.core();
                fallout
                    .discredited
                    .iter()
                    .map(|&id| core.verification().identities().name(id).to_owned())
                    .collect()
            };
            jobs.extend(jobs_voted_by(engine, names).await?);
        }
        jobs.sort_unstable();
        jobs.dedup();
        restoring::restore_now(engine, jobs.clone()).await?;
        let mut batch = CommitBatch::new();
        let mut settlements = Vec::with_capacity(jobs.len());
        for &job in &jobs {
            let mut jc = blocking(|| load(engine, job, engine.store.job(job)?.work()))?;
            if jc.copies.is_empty() {
                continue;
            }
            let mut core = engine.core();
            let d = core.decide(job, &mut jc, None, engine.shape.solutions);
            ledger::add_writes(&mut batch, d.writes);
            settlements.push(d.settlement);
        }
        engine.apply_and_flush(batch).await?;
        fallout = Fallout::default();
        let mut core = engine.core();
        let mut reopened = 0;
        for st in &settlements {
            if !st.settled {
                reopened += 1;
            }
            fallout.absorb(core.settle(st, false)?);
            warn_alone(engine, st);
            note_cpu_sample(st);
        }
        if reopened > 0 {
            info!(jobs = reopened, "jobs wait for another copy");
        }
    }
    Ok(())
}
