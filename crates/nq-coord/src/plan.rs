//! Turning a board into jobs: the split, the work estimates, and grouping,
//! streamed into the store in bounded, restartable batches.
//!
//! A job is a run of consecutive sub-problems (in [`split_each`]'s plan
//! order) whose estimated work adds up to about `total / target_jobs`.
//! Grouping keeps the number of RPCs sensible at large N, where there are far
//! more sub-problems than useful jobs; at small N the target makes a few
//! hundred jobs so the work still balances over many threads.
//!
//! Nothing here holds the whole split. [`PlanParams`] are fixed first, from a
//! count of the sub-problems and a sample of their estimates; then
//! [`build`] streams the split, estimates each batch on every core, groups it
//! and appends whole job chunks with a checkpoint (see `nq_store::plan`).
//! Memory is one batch of sub-problems and the jobs not yet written. A
//! coordinator killed while creating calls [`build`] again with the stored
//! checkpoint: the split is deterministic, so it skips exactly the
//! sub-problems already in stored jobs and makes the same jobs after them.

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nq_core::Board;
use nq_core::split::{SplitSpec, SubProblem, split_each, split_len};
use nq_store::{Checkpoint, JOBS_PER_CHUNK, Manifest, NewJob, PlanParams, Store};
use tracing::{debug, info};

use crate::error::{Error, Result};

/// The most sub-problems in one job. Keeps every job message far below
/// `nq_proto::MAX_MESSAGE_BYTES` (a sub-problem costs about N + 2 bytes on
/// the wire, its result about 40), even when a worker leases many at once.
pub const MAX_SUBS_PER_JOB: usize = 4096;

/// The version of the plan: the order in which sub-problems are consumed
/// ([`split_each`]'s) and the grouping rule. A creation is resumed only by a
/// program with the same version.
pub(crate) const PLAN_FORMAT: u32 = 1;

/// At most this many sub-problems are estimated to fix the job size; a
/// larger split is sampled evenly (every k-th sub-problem).
const SAMPLES: u64 = 1 << 16;

/// Sub-problems per batch: between these, aiming at 64 batches per plan, so
/// that a large creation checkpoints often and a small one is still quick.
const BATCH_MIN: u64 = 1 << 12;
const BATCH_MAX: u64 = 1 << 16;

/// How often creation logs its progress.
const LOG_EVERY: Duration = Duration::from_secs(5);

/// Below this many sub-problems a batch is estimated on one thread.
const PARALLEL_ESTIMATES: usize = 2048;

/// Fixes the plan of a new run: the number of sub-problems, and the work a
/// job is filled up to, so that there are about `target_jobs` jobs of at
/// most `max_size` sub-problems (one job per sub-problem when the target is
/// at least their number).
pub(crate) fn params(
    board: Board,
    spec: SplitSpec,
    target_jobs: u64,
    max_size: usize,
) -> PlanParams {
    let subproblems = split_len(board, spec);
    let stride = subproblems.div_ceil(SAMPLES).max(1);
    let mut sample = Vec::with_capacity(subproblems.min(SAMPLES) as usize);
    let mut index = 0u64;
    let _ = split_each(board, spec, &mut |sub| {
        if index.is_multiple_of(stride) {
            sample.push(sub);
        }
        index += 1;
        ControlFlow::Continue(())
    });
    let max_size = if target_jobs >= subproblems {
        1
    } else {
        max_size.clamp(1, MAX_SUBS_PER_JOB)
    };
    // The sample sets the job size only (the stored total is the exact sum
    // of what was stored).
    let works = estimate_all(&sample, PARALLEL_ESTIMATES);
    let job_work = job_work_for(&works, stride, target_jobs.max(1), max_size);
    PlanParams {
        subproblems,
        job_work: u64::try_from(job_work).unwrap_or(u64::MAX),
        max_size: max_size as u32,
        format: PLAN_FORMAT,
    }
}

/// The work a job is filled up to so that the grouping makes about
/// `target` jobs, from sampled estimates (each standing for `stride`
/// neighbouring sub-problems).
///
/// Not `total / target`: the estimates are heavy-tailed (Knuth's estimator
/// sees the heavy sub-problems), and a sub-problem above the job work is a
/// job alone however far above it is, so at N = 20 `0:1` that rule made 625
/// jobs for a target of 4,096. Instead the smallest job work whose
/// predicted job count is at most `target`, by bisection: a sub-problem of
/// work `w` shares a job with about `min(job_work / w, max_size)` others.
fn job_work_for(works: &[u64], stride: u64, target: u64, max_size: usize) -> u128 {
    let jobs = |job_work: u128| -> f64 {
        works
            .iter()
            .map(|&w| {
                let per_job =
                    (job_work / u128::from(w.max(1))).clamp(1, max_size as u128);
                stride as f64 / per_job as f64
            })
            .sum()
    };
    let total: u128 =
        works.iter().map(|&w| u128::from(w)).sum::<u128>() * u128::from(stride);
    let (mut low, mut high) = (1u128, total.max(1));
    while low < high {
        let mid = low + (high - low) / 2;
        if jobs(mid) <= target as f64 {
            high = mid;
        } else {
            low = mid + 1;
        }
    }
    low
}

/// A job being filled, and where its first sub-problem is in the split.
struct Filling {
    job: NewJob,
    subs: u32,
    first: u64,
}

/// The grouping of a stream of estimated sub-problems into jobs.
struct Grouper {
    n: usize,
    job_work: u128,
    max_size: u32,
    /// Closed jobs not yet stored, with the split position of their first
    /// sub-problem.
    closed: Vec<(NewJob, u64)>,
    filling: Option<Filling>,
}

impl Grouper {
    /// Adds the sub-problem at split position `index` with estimate `work`.
    /// A job closes before the sub-problem that would take it past the job
    /// work (a sub-problem larger than that is a job alone), or when full.
    fn add(&mut self, rows: &[u8], work: u64, index: u64) {
        if let Some(f) = &self.filling
            && (f.subs >= self.max_size
                || u128::from(f.job.work) + u128::from(work) > self.job_work)
        {
            let f = self.filling.take().expect("just matched");
            self.closed.push((f.job, f.first));
        }
        let f = self.filling.get_or_insert_with(|| Filling {
            job: NewJob {
                rows: Vec::with_capacity(4 * self.n),
                work: 0,
            },
            subs: 0,
            first: index,
        });
        f.job.rows.extend_from_slice(rows);
        f.job.work = f.job.work.saturating_add(work);
        f.subs += 1;
    }

    /// Closes the job being filled (at the end of the split).
    fn close(&mut self) {
        if let Some(f) = self.filling.take() {
            self.closed.push((f.job, f.first));
        }
    }

    /// Stores the closed jobs: whole chunks only, unless `last`. The
    /// checkpoint's position is the first sub-problem not in a stored job.
    fn store(
        &mut self,
        store: &Store,
        at: &mut Checkpoint,
        end: u64,
        last: bool,
    ) -> Result<()> {
        let take = if last {
            self.closed.len()
        } else {
            self.closed.len() - self.closed.len() % JOBS_PER_CHUNK as usize
        };
        if take == 0 {
            return Ok(());
        }
        let next_first = self
            .closed
            .get(take)
            .map(|(_, first)| *first)
            .or(self.filling.as_ref().map(|f| f.first))
            .unwrap_or(end);
        let jobs: Vec<NewJob> = self.closed.drain(..take).map(|(j, _)| j).collect();
        let next = Checkpoint {
            subproblems: next_first,
            jobs: at.jobs + jobs.len() as u64,
            work: at.work + jobs.iter().map(|j| u128::from(j.work)).sum::<u128>(),
        };
        store.append_jobs(&jobs, next)?;
        *at = next;
        // Tests wait for this line to kill a coordinator mid-creation.
        debug!(jobs = at.jobs, done = at.subproblems, "job batch stored");
        Ok(())
    }
}

/// Makes the jobs of the creation stored in `store`, from checkpoint `at`
/// on, then completes the run and returns its manifest. Stops with
/// [`Error::ShuttingDown`] between batches once `stop` is set; what was
/// stored by then stays, and the next call goes on from it.
///
/// # Errors
///
/// Store errors; [`Error::PlanChanged`] when the split no longer has the
/// number of sub-problems the creation was started with.
pub(crate) fn build(
    store: &Store,
    board: Board,
    spec: SplitSpec,
    params: PlanParams,
    mut at: Checkpoint,
    stop: &AtomicBool,
) -> Result<Manifest> {
    let started = Instant::now();
    let batch_len = (params.subproblems / 64).clamp(BATCH_MIN, BATCH_MAX) as usize;
    let mut grouper = Grouper {
        n: board.len(),
        job_work: u128::from(params.job_work),
        max_size: params.max_size.max(1),
        closed: Vec::new(),
        filling: None,
    };
    let mut batch: Vec<SubProblem> = Vec::with_capacity(batch_len);
    let mut index = 0u64;
    let mut batch_first = at.subproblems;
    let mut failure: Option<Error> = None;
    let mut logged = Instant::now();
    let skip = at.subproblems;
    let mut flush_batch = |batch: &mut Vec<SubProblem>,
                           first: u64,
                           end: u64,
                           at: &mut Checkpoint|
     -> Result<()> {
        let works = estimate_all(batch, PARALLEL_ESTIMATES);
        for (i, (sub, work)) in batch.iter().zip(works).enumerate() {
            grouper.add(sub.prefix().rows(), work, first + i as u64);
        }
        batch.clear();
        grouper.store(store, at, end, false)
    };
    let _ = split_each(board, spec, &mut |sub| {
        if index < skip {
            index += 1;
            return ControlFlow::Continue(());
        }
        batch.push(sub);
        index += 1;
        if batch.len() == batch_len {
            if let Err(e) = flush_batch(&mut batch, batch_first, index, &mut at) {
                failure = Some(e);
                return ControlFlow::Break(());
            }
            batch_first = index;
            if stop.load(Ordering::Relaxed) {
                failure = Some(Error::ShuttingDown);
                return ControlFlow::Break(());
            }
            if logged.elapsed() >= LOG_EVERY {
                logged = Instant::now();
                info!(
                    done = index,
                    subproblems = params.subproblems,
                    jobs = at.jobs,
                    "creating the run's jobs"
                );
            }
        }
        ControlFlow::Continue(())
    });
    if let Some(e) = failure {
        return Err(e);
    }
    if index != params.subproblems {
        return Err(Error::PlanChanged {
            expected: params.subproblems,
            found: index,
        });
    }
    flush_batch(&mut batch, batch_first, index, &mut at)?;
    grouper.close();
    grouper.store(store, &mut at, index, true)?;
    let manifest = store.finish_creation()?;
    info!(
        ms = started.elapsed().as_millis() as u64,
        jobs = manifest.jobs,
        "jobs stored and checked"
    );
    Ok(manifest)
}

/// `SubProblem::estimate` of every sub-problem, in order; on every core when
/// there are at least `parallel_from`.
fn estimate_all(subs: &[SubProblem], parallel_from: usize) -> Vec<u64> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    if subs.len() < parallel_from || threads == 1 {
        return subs.iter().map(SubProblem::estimate).collect();
    }
    // Each thread fills its own part of one vector: no per-thread copies.
    let mut works = vec![0u64; subs.len()];
    let per = subs.len().div_ceil(threads);
    std::thread::scope(|scope| {
        for (part, out) in subs.chunks(per).zip(works.chunks_mut(per)) {
            scope.spawn(move || {
                for (sub, w) in part.iter().zip(out) {
                    *w = sub.estimate();
                }
            });
        }
    });
    works
}

/// The sub-problems of a stored job, validated.
pub(crate) fn subproblems_in(
    stored: &nq_store::StoredJob,
    shape: &nq_proto::convert::RunShape,
    job: nq_store::JobId,
) -> Result<Vec<SubProblem>> {
    let mut subs = Vec::with_capacity(stored.len());
    for rows in stored.prefixes() {
        let sub = nq_core::board::Prefix::from_rows(shape.board, rows)
            .and_then(|p| SubProblem::from_prefix(shape.spec, p))
            .map_err(|source| Error::StoredJob { job, source })?;
        subs.push(sub);
    }
    Ok(subs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nq_store::{Creation, NewRun, RunKey};

    /// The sub-problems of the split in plan order, with their estimates.
    fn plan_order(board: Board, spec: SplitSpec) -> Vec<(Vec<u8>, u64)> {
        let mut out = vec![];
        let _ = split_each(board, spec, &mut |s| {
            out.push((s.prefix().rows().to_vec(), s.estimate()));
            ControlFlow::Continue(())
        });
        out
    }

    /// A whole creation of the plan `params` into `store`, from the start.
    fn create(
        store: &Store,
        board: Board,
        spec: SplitSpec,
        params: PlanParams,
    ) -> Manifest {
        begin(store, board, spec, params);
        build(
            store,
            board,
            spec,
            params,
            Checkpoint::default(),
            &AtomicBool::new(false),
        )
        .unwrap()
    }

    fn begin(store: &Store, board: Board, spec: SplitSpec, params: PlanParams) {
        store
            .begin_creation(&Creation {
                run: NewRun {
                    key: RunKey {
                        board,
                        split_version: nq_core::split::SPLIT_VERSION,
                        spec,
                        solutions: false,
                    },
                    run_id: "test".into(),
                    program_version: "0".into(),
                    created_unix_ms: 0,
                },
                plan: params,
            })
            .unwrap();
    }

    /// Every job's rows, concatenated, and every job's work.
    fn stored(store: &Store) -> (Vec<u8>, Vec<u64>) {
        let mut rows = vec![];
        let mut works = vec![];
        for entry in store.stored_jobs() {
            let (_, job) = entry.unwrap();
            rows.extend(job.prefixes().flatten());
            works.push(job.work());
        }
        (rows, works)
    }

    #[test]
    fn jobs_cover_every_subproblem_once_in_plan_order() {
        let board = Board::new(10).unwrap();
        let spec = SplitSpec::new(1, 1).unwrap();
        let want = plan_order(board, spec);
        let rows: Vec<u8> = want.iter().flat_map(|(r, _)| r.clone()).collect();
        let total: u128 = want.iter().map(|(_, w)| u128::from(*w)).sum();
        for (target, size) in [
            (1, MAX_SUBS_PER_JOB),
            (7, MAX_SUBS_PER_JOB),
            (50, 3),
            (1_000_000, 9),
        ] {
            let store = Store::temporary().unwrap();
            let p = params(board, spec, target, size);
            assert_eq!(p.subproblems, want.len() as u64);
            let m = create(&store, board, spec, p);
            let (got, works) = stored(&store);
            assert_eq!(got, rows, "target {target}");
            assert_eq!(m.total_work, total);
            assert_eq!(m.jobs, works.len() as u64);
            // Greedy grouping makes at most about twice the target.
            if size == MAX_SUBS_PER_JOB {
                assert!(m.jobs <= 2 * target + 1, "{} jobs", m.jobs);
            }
            if target >= want.len() as u64 {
                assert_eq!(m.jobs, want.len() as u64, "one job per sub-problem");
            }
            for entry in store.stored_jobs() {
                assert!(entry.unwrap().1.len() <= size);
            }
        }
    }

    /// The grouping makes about the target number of jobs although the
    /// estimates are heavy-tailed: within a factor of two either way. N = 20
    /// `0:1` with 4,096 jobs is `nq-coord --n 20`'s default plan, where
    /// `total / target` made 625 jobs.
    #[test]
    fn the_job_count_follows_the_target() {
        for (n, extra, target) in [(13, 2, 200), (20, 1, 1024), (20, 1, 4096)] {
            let board = Board::new(n).unwrap();
            let spec = SplitSpec::border(extra).unwrap();
            let store = Store::temporary().unwrap();
            let p = params(board, spec, target, MAX_SUBS_PER_JOB);
            assert!(p.subproblems > target, "{}", p.subproblems);
            let m = create(&store, board, spec, p);
            assert!(
                (target / 2..=2 * target).contains(&m.jobs),
                "{} jobs for a target of {target} at n={n} 0:{extra}",
                m.jobs
            );
        }
    }

    #[test]
    fn a_creation_resumed_from_any_checkpoint_makes_the_same_jobs() {
        // Big enough for several batches of BATCH_MIN sub-problems.
        let board = Board::new(12).unwrap();
        let spec = SplitSpec::border(4).unwrap();
        let p = params(board, spec, 3000, MAX_SUBS_PER_JOB);
        assert!(p.subproblems > 2 * BATCH_MIN, "{}", p.subproblems);
        let whole = Store::temporary().unwrap();
        begin(&whole, board, spec, p);
        let m = build(
            &whole,
            board,
            spec,
            p,
            Checkpoint::default(),
            &AtomicBool::new(false),
        )
        .unwrap();
        let want = stored(&whole);

        // Stop after the first batch (as a kill would), then go on from the
        // stored checkpoint.
        let store = Store::temporary().unwrap();
        begin(&store, board, spec, p);
        let stop = AtomicBool::new(true);
        assert!(matches!(
            build(&store, board, spec, p, Checkpoint::default(), &stop),
            Err(Error::ShuttingDown)
        ));
        let (_, at) = store.creation().unwrap().unwrap();
        assert!(at.jobs > 0 && at.subproblems > 0 && at.subproblems < p.subproblems);
        let again = build(&store, board, spec, p, at, &AtomicBool::new(false)).unwrap();
        assert_eq!(stored(&store), want);
        assert_eq!((again.jobs, again.total_work), (m.jobs, m.total_work));
    }
}
