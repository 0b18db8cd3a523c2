//! Where a run stands, seen from outside: [`Snapshot`], the one picture of a
//! run behind the `Status` rpc, `nq-coord status`, `/status.json`, the
//! status page and `/metrics`.
//!
//! A snapshot is built from the session's scheduler under its lock (a few
//! microseconds per worker), plus a short history of samples that the
//! ticker takes once a second, from which the recent rates come: a rate over
//! the last [`RATE_WINDOW`] follows a cluster that grows or shrinks, where the
//! session's average would lag behind it for hours.
//!
//! The same snapshot travels as `pb::StatusResponse` ([`Snapshot::to_pb`],
//! `TryFrom<pb::StatusResponse>`), so the client prints exactly what the page
//! shows.

use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use nq_core::published::published;
use nq_core::split::SplitSpec;
use nq_proto::ConvertError;
use nq_proto::convert::RunShape;
use nq_proto::pb;
use serde_json::json;

use crate::core::lease::WorkerId;
use crate::core::report::FaultyWorker;
use crate::core::scheduler::{Counters, Scheduler};

/// Rates are measured over this much recent time.
pub const RATE_WINDOW: Duration = Duration::from_secs(30);

/// The history keeps at most one sample per this interval, so its size is
/// bounded (`RATE_WINDOW / SAMPLE_EVERY` samples) whatever the tick rate.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// Worker rows a `Status` answer lists at most, the coordinator's own first.
/// A row with a name of [`crate::error::MAX_NAME`] bytes and the longest
/// address is under 400 bytes on the wire, so with [`LISTED_FAULTY`] the
/// whole answer stays under 4 MiB, the default decoding limit of gRPC
/// clients (`nq-coord status`, grpcurl), however many workers registered and
/// whatever their names: 50,000 workers with long names, or sybils
/// registering from one address, made it unreadable before.
pub const LISTED_WORKERS: usize = 8_000;

/// Faulty workers a `Status` answer lists at most (see [`LISTED_WORKERS`]).
pub const LISTED_FAULTY: usize = 2_000;

/// The phase of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunState {
    /// Jobs are handed out.
    Running,
    /// Every job is settled.
    Complete,
    /// Shutdown was requested; no new leases. Running again resumes.
    Stopping,
}

impl RunState {
    /// The state as the JSON form and the text output spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Running => "running",
            RunState::Complete => "complete",
            RunState::Stopping => "stopping",
        }
    }
}

/// One worker in a snapshot.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerStatus {
    /// Its registration name (`local` for the coordinator's own threads).
    pub name: String,
    /// The IP address it registered from ("" when unknown or local).
    pub address: String,
    /// CPU threads it runs.
    pub threads: u32,
    /// True for the coordinator's own threads.
    pub local: bool,
    /// Seconds since it last called.
    pub last_seen_seconds: f64,
    /// Copies of jobs it reported that were stored, in this session.
    pub jobs_done: u64,
    /// Their estimated work.
    pub work_done: u128,
    /// Jobs per second over the rate window.
    pub jobs_per_second: f64,
    /// Estimated work per second over the rate window.
    pub work_per_second: f64,
    /// Leases taken back from it (held far past its measured time, or over
    /// its fair share while others waited), this session. Not carried by
    /// the status RPC (0 when read from it).
    pub leases_taken_back: u64,
    /// True while its identity is stalled: it held leases without progress
    /// and may hold one job until it delivers a copy. Not carried by the
    /// status RPC.
    pub stalled: bool,
}

/// The counts of a complete run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunResult {
    /// Q(N).
    pub total: u128,
    /// U(N).
    pub unique: u128,
    /// Whether they equal the published values; `None` when N has none.
    pub published_match: Option<bool>,
}

/// Where a run stands. Work is in the split's estimate units, so progress is
/// weighted by expected cost, not by job count.
#[derive(Clone, Debug, PartialEq)]
pub struct Snapshot {
    /// Board size.
    pub n: u8,
    /// The split.
    pub split: SplitSpec,
    /// The split's version.
    pub split_version: u32,
    /// True for a run that stores every solution.
    pub solutions: bool,
    /// Identifies the run.
    pub run_id: String,
    /// The phase.
    pub state: RunState,
    /// Estimated work of the settled jobs.
    pub work_done: u128,
    /// Estimated work of the whole run.
    pub work_total: u128,
    /// Jobs in the run.
    pub jobs: u64,
    /// Jobs settled.
    pub jobs_done: u64,
    /// Jobs waiting for a worker.
    pub jobs_pending: u64,
    /// Jobs under a live lease.
    pub jobs_leased: u64,
    /// Jobs with copies that wait for another (also pending or leased):
    /// computed, awaiting a check.
    pub jobs_in_check: u64,
    /// The estimated work of those jobs: done, but not settled until
    /// checked (a run on probation shows its work here, not as stalled).
    pub work_awaiting_check: u128,
    /// Jobs whose copies disagree, waiting for a deciding copy.
    pub jobs_disputed: u64,
    /// Jobs settled on one copy where a check was needed (`--verify`, or
    /// probation) and no second machine delivered to give it: the run
    /// ends `unchecked` unless another machine joins before the end.
    pub jobs_unchecked: u64,
    /// Estimated time to completion; `None` when unknown.
    pub eta_seconds: Option<f64>,
    /// Settled work per second over the rate window.
    pub work_per_second: f64,
    /// Settled jobs per second over the rate window.
    pub jobs_per_second: f64,
    /// The window the rates cover, in seconds.
    pub rate_window_seconds: f64,
    /// Seconds since this coordinator session started.
    pub session_seconds: f64,
    /// Remote workers heard from within one lease lifetime.
    pub workers_connected: u32,
    /// Every known worker, sorted by name and address.
    pub workers: Vec<WorkerStatus>,
    /// Copies that agreed with the counted one.
    pub confirmations: u64,
    /// Copies that disagreed.
    pub conflicts: u64,
    /// Leases that expired in this session.
    pub lease_expiries: u64,
    /// Workers that lost verification conflicts.
    pub faulty_workers: Vec<FaultyWorker>,
    /// Known workers not in [`Snapshot::workers`]: none where the snapshot
    /// was built, those past [`LISTED_WORKERS`] in a `Status` answer.
    pub workers_unlisted: u64,
    /// Faulty workers not in [`Snapshot::faulty_workers`], the same way.
    pub faulty_workers_unlisted: u64,
    /// Solutions counted so far.
    pub total_so_far: u128,
    /// The result, once the run is complete.
    pub result: Option<RunResult>,
}

/// Counters of one moment, for rates.
#[derive(Debug)]
struct Sample {
    at: Instant,
    /// Jobs settled (a job unsettled again by a lost conflict goes back
    /// out: rates then read 0 rather than negative).
    jobs: u64,
    /// Their estimated work.
    work: u128,
    /// Per worker: copies reported and their work. Taken only every
    /// [`WORKER_SAMPLE_EVERY`]: with 50,000 workers a copy costs megabytes,
    /// and one a second over the window held hundreds of them.
    workers: Option<WorkerCounters>,
}

/// Per worker: copies reported and their estimated work.
type WorkerCounters = HashMap<WorkerId, (u64, u128)>;

/// How often the per-worker counters are sampled (the run's counters are
/// sampled every [`SAMPLE_EVERY`]).
const WORKER_SAMPLE_EVERY: Duration = Duration::from_secs(10);

impl Sample {
    fn of(sched: &Scheduler, at: Instant, with_workers: bool) -> Sample {
        let p = sched.counters(at);
        Sample {
            at,
            jobs: p.jobs_done,
            work: p.work_done,
            workers: with_workers.then(|| {
                sched
                    .workers()
                    .map(|(id, w)| (id.clone(), (w.jobs_reported, w.work_reported)))
                    .collect()
            }),
        }
    }
}

/// Recent samples of a session's counters, the oldest first, spanning at
/// most [`RATE_WINDOW`] (plus one sample).
#[derive(Debug)]
pub(crate) struct History {
    /// When the session started.
    started: Instant,
    samples: VecDeque<Sample>,
}

impl History {
    /// A history whose first sample is `sched` as it is at `now`, the
    /// session's start.
    pub(crate) fn new(sched: &Scheduler, now: Instant) -> History {
        History {
            started: now,
            samples: VecDeque::from([Sample::of(sched, now, true)]),
        }
    }

    /// Takes a sample of `sched` at `now`, unless the last one is younger
    /// than a second, and forgets samples the window no longer needs.
    pub(crate) fn sample(&mut self, sched: &Scheduler, now: Instant) {
        if self
            .samples
            .back()
            .is_some_and(|s| now.saturating_duration_since(s.at) < SAMPLE_EVERY)
        {
            return;
        }
        let with_workers = self
            .samples
            .iter()
            .rev()
            .find(|s| s.workers.is_some())
            .is_none_or(|s| now.saturating_duration_since(s.at) >= WORKER_SAMPLE_EVERY);
        self.samples.push_back(Sample::of(sched, now, with_workers));
        // Keep the newest sample at or before the window's start: it is the
        // base of every rate.
        while self.samples.len() > 1
            && now.saturating_duration_since(self.samples[1].at) >= RATE_WINDOW
        {
            self.samples.pop_front();
        }
    }

    /// The base of rates at `now`: the oldest sample, and the time since it.
    fn base(&self, now: Instant) -> Option<(&Sample, f64)> {
        let base = self.samples.front()?;
        let secs = now.saturating_duration_since(base.at).as_secs_f64();
        (secs > 0.0).then_some((base, secs))
    }

    /// The base of per-worker rates at `now`: the oldest sample with the
    /// workers' counters, their counters, and the time since it.
    fn worker_base(&self, now: Instant) -> Option<(&WorkerCounters, f64)> {
        let base = self.samples.iter().find(|s| s.workers.is_some())?;
        let secs = now.saturating_duration_since(base.at).as_secs_f64();
        (secs > 0.0).then_some((base.workers.as_ref()?, secs))
    }
}

/// `(now - then) / secs`, 0 when `secs` is 0 or the counter went down.
fn rate(now: u128, then: u128, secs: f64) -> f64 {
    if secs > 0.0 {
        now.saturating_sub(then) as f64 / secs
    } else {
        0.0
    }
}

/// The fraction of the estimated work done, 0.0 to 1.0: the one reading of
/// "how far" behind the bar, `nq-coord status`, `/status.json`, the status
/// page and `nq_progress_ratio`. By estimated work, never by jobs: jobs
/// differ in size by orders of magnitude.
pub fn fraction_of(work_done: u128, work_total: u128, complete: bool) -> f64 {
    if work_total == 0 {
        return if complete { 1.0 } else { 0.0 };
    }
    (work_done as f64 / work_total as f64).clamp(0.0, 1.0)
}

/// How fast a run goes and when it should end: the one reading of "how
/// fast" behind every display.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Pace {
    /// Jobs settled per second over the rate window.
    pub jobs_per_second: f64,
    /// Estimated work settled per second over the rate window.
    pub work_per_second: f64,
    /// The window the rates cover, in seconds (0 before the first sample).
    pub window_seconds: f64,
    /// Time spent in this session.
    pub session_seconds: f64,
    /// Seconds to completion: from the windowed rate, else (no job settled
    /// in the window, e.g. one long job) from the session's average; `None`
    /// before any work was settled here.
    pub eta_seconds: Option<f64>,
}

impl History {
    /// The pace of a run whose counters are `p` at `now`.
    pub(crate) fn pace(&self, p: &Counters, now: Instant) -> Pace {
        let (jobs_per_second, work_per_second, window_seconds) = match self.base(now) {
            Some((b, secs)) => (
                rate(p.jobs_done.into(), b.jobs.into(), secs),
                rate(p.work_done, b.work, secs),
                secs,
            ),
            None => (0.0, 0.0, 0.0),
        };
        let left = p.work_total.saturating_sub(p.work_done) as f64;
        let session_seconds = now.saturating_duration_since(self.started).as_secs_f64();
        let eta_seconds = if p.complete {
            Some(0.0)
        } else if work_per_second > 0.0 {
            Some(left / work_per_second)
        } else if p.work_done_here > 0 && session_seconds > 0.0 {
            Some(left * session_seconds / p.work_done_here as f64)
        } else {
            None
        };
        Pace {
            jobs_per_second,
            work_per_second,
            window_seconds,
            session_seconds,
            eta_seconds,
        }
    }
}

/// Where a run stands, for progress displays (the bar, the progress log): the
/// scheduler's counters with the same [`Pace`] and fraction as a
/// [`Snapshot`], without the per-worker table, so that it is cheap enough to
/// publish every tick.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Progress {
    /// The counters.
    pub counters: Counters,
    /// The pace.
    pub pace: Pace,
    /// Jobs computed and awaiting a check, and their estimated work (not
    /// in the counters' settled work).
    pub awaiting_check: (u64, u128),
    /// The coordinator's own threads at work (0 when it runs none).
    pub local_threads: u32,
}

impl Progress {
    /// The progress of `sched` at `now`, with rates from `history`.
    pub(crate) fn of(sched: &Scheduler, history: &History, now: Instant) -> Progress {
        let counters = sched.counters(now);
        Progress {
            pace: history.pace(&counters, now),
            counters,
            awaiting_check: sched.awaiting_check(),
            local_threads: sched.local_threads(),
        }
    }

    /// The fraction of the estimated work computed and awaiting a check,
    /// 0.0 to 1.0, beside [`Progress::fraction`]'s settled work.
    pub fn fraction_awaiting_check(&self) -> f64 {
        fraction_of(self.awaiting_check.1, self.counters.work_total, false)
    }

    /// Who is at work, for progress lines: `local (4 threads) + 2 remote`,
    /// or `2 remote` in a run without local threads.
    pub fn workers_text(&self) -> String {
        workers_text(self.local_threads, self.counters.workers)
    }

    /// The fraction of the estimated work done, 0.0 to 1.0 (see
    /// [`fraction_of`]).
    pub fn fraction(&self) -> f64 {
        let c = &self.counters;
        fraction_of(c.work_done, c.work_total, c.complete)
    }

    /// Estimated time to completion (see [`Pace::eta_seconds`]).
    pub fn eta(&self) -> Option<Duration> {
        self.pace
            .eta_seconds
            .and_then(|s| Duration::try_from_secs_f64(s).ok())
    }

    /// Jobs settled per second over the rate window.
    pub fn jobs_per_second(&self) -> f64 {
        self.pace.jobs_per_second
    }
}

impl Snapshot {
    /// The snapshot of the run `shape`, `run_id` as `sched` has it at `now`,
    /// with rates from `history`.
    pub(crate) fn build(
        shape: &RunShape,
        run_id: &str,
        sched: &Scheduler,
        history: &History,
        now: Instant,
    ) -> Snapshot {
        let p = sched.counters(now);
        let pace = history.pace(&p, now);
        let worker_base = history.worker_base(now);
        let mut workers: Vec<WorkerStatus> = sched
            .workers()
            .map(|(id, w)| {
                let (jobs_then, work_then, secs) = match worker_base {
                    Some((b, secs)) => {
                        let (j, wk) = b.get(id).copied().unwrap_or_default();
                        (j, wk, secs)
                    }
                    None => (0, 0, 0.0),
                };
                WorkerStatus {
                    name: w.name.clone(),
                    address: w.address.map(|a| a.to_string()).unwrap_or_default(),
                    threads: w.threads,
                    local: w.local,
                    last_seen_seconds: now
                        .saturating_duration_since(w.last_seen)
                        .as_secs_f64(),
                    jobs_done: w.jobs_reported,
                    work_done: w.work_reported,
                    jobs_per_second: rate(w.jobs_reported.into(), jobs_then.into(), secs),
                    work_per_second: rate(w.work_reported, work_then, secs),
                    leases_taken_back: w.leases_taken_back,
                    stalled: sched.allowances().is_stalled(w.identity),
                }
            })
            .collect();
        workers.sort_by(|a, b| (&a.name, &a.address).cmp(&(&b.name, &b.address)));
        let complete = p.complete;
        let n = shape.board.n();
        let tally = sched.tally();
        // A tally that does not fold into whole symmetry classes has no
        // unique count; the final report says why, the snapshot shows none.
        let result = complete
            .then(|| tally.unique().ok())
            .flatten()
            .map(|unique| RunResult {
                total: tally.total,
                unique,
                published_match: published(n)
                    .map(|(q, u)| q == tally.total && u == unique),
            });
        let state = if complete {
            RunState::Complete
        } else if sched.is_closed() {
            RunState::Stopping
        } else {
            RunState::Running
        };
        Snapshot {
            n,
            split: shape.spec,
            split_version: nq_core::split::SPLIT_VERSION,
            solutions: shape.solutions,
            run_id: run_id.to_owned(),
            state,
            work_done: p.work_done,
            work_total: p.work_total,
            jobs: p.jobs,
            jobs_done: p.jobs_done,
            jobs_pending: sched.jobs_pending(),
            jobs_leased: p.jobs_leased,
            jobs_in_check: sched.jobs_in_check(),
            work_awaiting_check: sched.awaiting_check().1,
            jobs_disputed: sched.jobs_disputed(),
            jobs_unchecked: sched.jobs_unchecked(),
            eta_seconds: pace.eta_seconds,
            work_per_second: pace.work_per_second,
            jobs_per_second: pace.jobs_per_second,
            rate_window_seconds: pace.window_seconds,
            session_seconds: pace.session_seconds,
            workers_connected: u32::try_from(p.workers).unwrap_or(u32::MAX),
            workers,
            confirmations: sched.confirmations(),
            conflicts: sched.conflicts(),
            lease_expiries: sched.expiries(),
            faulty_workers: crate::core::report::faulty_workers(sched),
            workers_unlisted: 0,
            faulty_workers_unlisted: 0,
            total_so_far: tally.total,
            result,
        }
    }

    /// The fraction of the estimated work done, 0.0 to 1.0 (see
    /// [`fraction_of`]).
    pub fn fraction(&self) -> f64 {
        fraction_of(
            self.work_done,
            self.work_total,
            self.state == RunState::Complete,
        )
    }

    /// The fraction of the estimated work computed and awaiting a check,
    /// 0.0 to 1.0, beside [`Snapshot::fraction`]'s settled work.
    pub fn fraction_awaiting_check(&self) -> f64 {
        fraction_of(self.work_awaiting_check, self.work_total, false)
    }

    /// The CPU threads of the coordinator's own rows in the worker table.
    pub fn local_threads(&self) -> u32 {
        self.workers
            .iter()
            .filter(|w| w.local)
            .fold(0u32, |sum, w| sum.saturating_add(w.threads))
    }

    /// At most `cap` worker rows, the coordinator's own first (a client sums
    /// their threads), then remote workers in name order, and the count of
    /// the rows left out (with those left out before).
    fn listed_workers(&self, cap: usize) -> (Vec<&WorkerStatus>, u64) {
        let local = self.workers.iter().filter(|w| w.local);
        let remote = self.workers.iter().filter(|w| !w.local);
        let listed: Vec<&WorkerStatus> = local.chain(remote).take(cap).collect();
        let unlisted = (self.workers.len() - listed.len()) as u64;
        (listed, self.workers_unlisted.saturating_add(unlisted))
    }

    /// At most `cap` faulty workers, and the count of those left out (with
    /// those left out before).
    fn listed_faulty(&self, cap: usize) -> (&[FaultyWorker], u64) {
        let listed = &self.faulty_workers[..self.faulty_workers.len().min(cap)];
        let unlisted = (self.faulty_workers.len() - listed.len()) as u64;
        (
            listed,
            self.faulty_workers_unlisted.saturating_add(unlisted),
        )
    }

    /// The wire form, its lists capped at [`LISTED_WORKERS`] (the
    /// coordinator's own rows first, then remote workers in name order) and
    /// [`LISTED_FAULTY`], with counts of the rows left out.
    pub fn to_pb(&self) -> pb::StatusResponse {
        let (listed, workers_unlisted) = self.listed_workers(LISTED_WORKERS);
        let (faulty, faulty_workers_unlisted) = self.listed_faulty(LISTED_FAULTY);
        let state = match self.state {
            RunState::Running => pb::RunState::Running,
            RunState::Complete => pb::RunState::Complete,
            RunState::Stopping => pb::RunState::Stopping,
        };
        pb::StatusResponse {
            n: self.n.into(),
            split_version: self.split_version,
            ring: self.split.ring.into(),
            extra: self.split.extra.into(),
            solutions: self.solutions,
            run_id: self.run_id.clone(),
            state: state.into(),
            work_done: Some(self.work_done.into()),
            work_total: Some(self.work_total.into()),
            fraction: self.fraction(),
            jobs: self.jobs,
            jobs_done: self.jobs_done,
            jobs_pending: self.jobs_pending,
            jobs_leased: self.jobs_leased,
            jobs_in_check: self.jobs_in_check,
            work_awaiting_check: Some(self.work_awaiting_check.into()),
            jobs_disputed: self.jobs_disputed,
            jobs_unchecked: self.jobs_unchecked,
            eta_seconds: self.eta_seconds,
            work_per_second: self.work_per_second,
            jobs_per_second: self.jobs_per_second,
            rate_window_seconds: self.rate_window_seconds,
            session_seconds: self.session_seconds,
            workers_connected: self.workers_connected,
            workers_unlisted,
            faulty_workers_unlisted,
            workers: listed
                .into_iter()
                .map(|w| pb::WorkerStatus {
                    name: w.name.clone(),
                    address: w.address.clone(),
                    threads: w.threads,
                    local: w.local,
                    last_seen_seconds: w.last_seen_seconds,
                    jobs_done: w.jobs_done,
                    work_done: Some(w.work_done.into()),
                    jobs_per_second: w.jobs_per_second,
                    work_per_second: w.work_per_second,
                })
                .collect(),
            confirmations: self.confirmations,
            conflicts: self.conflicts,
            lease_expiries: self.lease_expiries,
            faulty_workers: faulty
                .iter()
                .map(|f| pb::FaultyWorkerStatus {
                    name: f.name.clone(),
                    address: f.address.clone(),
                    lost: f.lost,
                    banned: f.banned,
                })
                .collect(),
            total_so_far: Some(self.total_so_far.into()),
            result: self.result.as_ref().map(|r| pb::RunResult {
                total: Some(r.total.into()),
                unique: Some(r.unique.into()),
                published_match: r.published_match,
            }),
        }
    }

    /// The JSON form, for scripts and the status page. Counts and work are
    /// u128 and are written as decimal STRINGS (JSON numbers lose precision
    /// beyond 2^53 in most readers); `fraction` is a number. Every worker is
    /// listed ([`Snapshot::to_json_listing`] caps the lists).
    pub fn to_json(&self) -> serde_json::Value {
        self.to_json_listing(usize::MAX)
    }

    /// [`Snapshot::to_json`] with at most `cap` workers and `cap` faulty
    /// workers listed (chosen as in [`Snapshot::to_pb`]), and the rest
    /// counted in `workers_unlisted` and `faulty_workers_unlisted`: the
    /// status page polls every second, and a list of 50,000 workers is
    /// 8.8 MB.
    pub fn to_json_listing(&self, cap: usize) -> serde_json::Value {
        let (listed, workers_unlisted) = self.listed_workers(cap);
        let (faulty, faulty_workers_unlisted) = self.listed_faulty(cap);
        let workers: Vec<serde_json::Value> = listed
            .into_iter()
            .map(|w| {
                json!({
                    "name": w.name,
                    "address": w.address,
                    "threads": w.threads,
                    "local": w.local,
                    "last_seen_seconds": w.last_seen_seconds,
                    "jobs_done": w.jobs_done,
                    "work_done": w.work_done.to_string(),
                    "jobs_per_second": w.jobs_per_second,
                    "work_per_second": w.work_per_second,
                })
            })
            .collect();
        let faulty: Vec<serde_json::Value> = faulty
            .iter()
            .map(|f| {
                json!({"name": f.name, "address": f.address, "lost": f.lost, "banned": f.banned})
            })
            .collect();
        let result = self.result.as_ref().map(|r| {
            json!({
                "total": r.total.to_string(),
                "unique": r.unique.to_string(),
                "published_match": r.published_match,
            })
        });
        json!({
            "n": self.n,
            "split": {
                "version": self.split_version,
                "ring": self.split.ring,
                "extra": self.split.extra,
            },
            "solutions": self.solutions,
            "run_id": self.run_id,
            "state": self.state.as_str(),
            "progress": {
                "work_done": self.work_done.to_string(),
                "work_total": self.work_total.to_string(),
                "fraction": self.fraction(),
                "work_awaiting_check": self.work_awaiting_check.to_string(),
                "fraction_awaiting_check": self.fraction_awaiting_check(),
            },
            "jobs": {
                "total": self.jobs,
                "done": self.jobs_done,
                "pending": self.jobs_pending,
                "leased": self.jobs_leased,
                "in_check": self.jobs_in_check,
                "disputed": self.jobs_disputed,
                "unchecked": self.jobs_unchecked,
            },
            "eta_seconds": self.eta_seconds,
            "rate": {
                "work_per_second": self.work_per_second,
                "jobs_per_second": self.jobs_per_second,
                "window_seconds": self.rate_window_seconds,
            },
            "session_seconds": self.session_seconds,
            "workers_connected": self.workers_connected,
            "local_threads": self.local_threads(),
            "workers": workers,
            "workers_unlisted": workers_unlisted,
            "confirmations": self.confirmations,
            "conflicts": self.conflicts,
            "lease_expiries": self.lease_expiries,
            "faulty_workers": faulty,
            "faulty_workers_unlisted": faulty_workers_unlisted,
            "total_so_far": self.total_so_far.to_string(),
            "result": result,
        })
    }

    /// The `progress` line of [`Snapshot::to_text`].
    fn progress_text(&self) -> String {
        format!(
            "{:.1}% of the estimated work settled ({} of {}){}",
            self.fraction() * 100.0,
            self.work_done,
            self.work_total,
            if self.work_awaiting_check > 0 {
                format!(
                    ", {:.1}% more computed, awaiting a check",
                    self.fraction_awaiting_check() * 100.0
                )
            } else {
                String::new()
            }
        )
    }

    /// The `jobs` line of [`Snapshot::to_text`].
    fn jobs_text(&self) -> String {
        format!(
            "{} of {} done, {} computed awaiting a check, {} leased, {} pending{}",
            self.jobs_done,
            self.jobs,
            self.jobs_in_check,
            self.jobs_leased,
            self.jobs_pending,
            if self.jobs_disputed > 0 {
                format!(", {} disputed", self.jobs_disputed)
            } else {
                String::new()
            }
        )
    }

    /// The form for people: aligned lines, then a table of the workers.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let mut line = |key: &str, value: String| {
            let _ = writeln!(out, "{key:<10} {value}");
        };
        line(
            "run",
            format!(
                "{} (N={}, split {}:{} v{}{})",
                self.run_id,
                self.n,
                self.split.ring,
                self.split.extra,
                self.split_version,
                if self.solutions { ", solutions" } else { "" }
            ),
        );
        line("state", self.state.as_str().to_owned());
        line("progress", self.progress_text());
        line("jobs", self.jobs_text());
        if self.jobs_unchecked > 0 {
            line(
                "WARNING",
                format!(
                    "no second machine delivers: {} jobs settled on one copy where a \
                     check was needed; the run ends `unchecked` unless another machine \
                     joins before the end",
                    self.jobs_unchecked
                ),
            );
        }
        line(
            "rate",
            format!(
                "{} work/s, {:.2} jobs/s (last {:.0}s)",
                si(self.work_per_second),
                self.jobs_per_second,
                self.rate_window_seconds
            ),
        );
        line(
            "eta",
            self.eta_seconds
                .map_or_else(|| "unknown".to_owned(), duration_text),
        );
        line("elapsed", duration_text(self.session_seconds));
        line(
            "checks",
            format!(
                "{} confirmations, {} conflicts, {} lease expiries",
                self.confirmations, self.conflicts, self.lease_expiries
            ),
        );
        if !self.faulty_workers.is_empty() {
            let mut faulty = faulty_text(&self.faulty_workers);
            if self.faulty_workers_unlisted > 0 {
                let _ = write!(faulty, ", and {} more", self.faulty_workers_unlisted);
            }
            line("faulty", faulty);
        }
        match &self.result {
            Some(r) => line(
                "result",
                format!(
                    "total={} unique={} published={}",
                    r.total,
                    r.unique,
                    match r.published_match {
                        Some(true) => "match",
                        Some(false) => "MISMATCH",
                        None => "unknown",
                    }
                ),
            ),
            None => line("counted", format!("{} solutions so far", self.total_so_far)),
        }
        line(
            "workers",
            workers_text(self.local_threads(), self.workers_connected as usize),
        );
        out.push('\n');
        self.workers_table(&mut out);
        if self.workers_unlisted > 0 {
            let _ = writeln!(
                out,
                "... and {} more workers, not listed: a status answer lists {LISTED_WORKERS} \
                 at most (/status.json on the --metrics port lists them all)",
                self.workers_unlisted
            );
        }
        out
    }

    /// The table of workers of [`Snapshot::to_text`], one line each.
    fn workers_table(&self, out: &mut String) {
        let rows: Vec<[String; 7]> = self
            .workers
            .iter()
            .map(|w| {
                [
                    w.name.clone(),
                    if w.local {
                        "(local)".to_owned()
                    } else {
                        w.address.clone()
                    },
                    w.threads.to_string(),
                    w.jobs_done.to_string(),
                    format!("{:.2}", w.jobs_per_second),
                    si(w.work_per_second),
                    format!("{:.1}s ago", w.last_seen_seconds),
                ]
            })
            .collect();
        let header = [
            "WORKER",
            "ADDRESS",
            "THREADS",
            "JOBS",
            "JOBS/S",
            "WORK/S",
            "LAST SEEN",
        ]
        .map(str::to_owned);
        let mut widths = header.clone().map(|h| h.len());
        for r in &rows {
            for (w, cell) in widths.iter_mut().zip(r) {
                *w = (*w).max(cell.chars().count());
            }
        }
        for r in std::iter::once(&header).chain(&rows) {
            let cells: Vec<String> = r
                .iter()
                .zip(widths)
                .enumerate()
                // Names left-aligned, numbers right-aligned.
                .map(|(i, (c, w))| {
                    if i < 2 {
                        format!("{c:<w$}")
                    } else {
                        format!("{c:>w$}")
                    }
                })
                .collect();
            let _ = writeln!(out, "{}", cells.join("  ").trim_end());
        }
    }
}

/// Who is at work: the coordinator's own threads, which work as a worker
/// does, then the remote workers heard from within a lease lifetime.
fn workers_text(local_threads: u32, remote: usize) -> String {
    let remote = format!("{remote} remote connected");
    match local_threads {
        0 => remote,
        1 => format!("local (1 thread) + {remote}"),
        t => format!("local ({t} threads) + {remote}"),
    }
}

/// The workers that lost conflicts, on one line.
fn faulty_text(faulty: &[FaultyWorker]) -> String {
    let names: Vec<String> = faulty
        .iter()
        .map(|f| {
            format!(
                "{}@{} (lost {}{})",
                f.name,
                f.address,
                f.lost,
                if f.banned { ", banned" } else { "" }
            )
        })
        .collect();
    names.join(", ")
}

/// `x` with an SI prefix: `1.23M`.
fn si(x: f64) -> String {
    const PREFIXES: [(f64, &str); 5] =
        [(1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")];
    for (scale, p) in PREFIXES {
        if x >= scale {
            return format!("{:.2}{p}", x / scale);
        }
    }
    format!("{x:.1}")
}

/// Seconds as `1h 02m 03s`, `2m 03s` or `3s`.
fn duration_text(secs: f64) -> String {
    if !secs.is_finite() {
        return "unknown".to_owned();
    }
    let s = secs.round() as u64;
    let (h, m, s) = (s / 3600, s / 60 % 60, s % 60);
    if h > 0 {
        format!("{h}h {m:02}m {s:02}s")
    } else if m > 0 {
        format!("{m}m {s:02}s")
    } else {
        format!("{s}s")
    }
}

fn count(c: Option<pb::Count>, field: &'static str) -> Result<u128, ConvertError> {
    c.map(u128::from).ok_or(ConvertError::Missing { field })
}

fn narrow(v: u32, field: &'static str) -> Result<u8, ConvertError> {
    u8::try_from(v).map_err(|_| ConvertError::Range {
        field,
        value: v.into(),
    })
}

impl TryFrom<pb::StatusResponse> for Snapshot {
    type Error = ConvertError;

    /// Reads a `Status` answer. Absent counts (which a coordinator always
    /// sends) and an unknown state fail, naming the field.
    fn try_from(r: pb::StatusResponse) -> Result<Snapshot, ConvertError> {
        let state = match r.state() {
            pb::RunState::Running => RunState::Running,
            pb::RunState::Complete => RunState::Complete,
            pb::RunState::Stopping => RunState::Stopping,
            pb::RunState::Unspecified => {
                return Err(ConvertError::Range {
                    field: "state",
                    value: r.state as u64,
                });
            }
        };
        let workers = r
            .workers
            .into_iter()
            .map(|w| {
                Ok(WorkerStatus {
                    work_done: count(w.work_done, "workers.work_done")?,
                    name: w.name,
                    address: w.address,
                    threads: w.threads,
                    local: w.local,
                    last_seen_seconds: w.last_seen_seconds,
                    jobs_done: w.jobs_done,
                    jobs_per_second: w.jobs_per_second,
                    work_per_second: w.work_per_second,
                    leases_taken_back: 0,
                    stalled: false,
                })
            })
            .collect::<Result<Vec<_>, ConvertError>>()?;
        let result = r
            .result
            .map(|res| {
                Ok::<_, ConvertError>(RunResult {
                    total: count(res.total, "result.total")?,
                    unique: count(res.unique, "result.unique")?,
                    published_match: res.published_match,
                })
            })
            .transpose()?;
        Ok(Snapshot {
            n: narrow(r.n, "n")?,
            split: SplitSpec {
                ring: narrow(r.ring, "ring")?,
                extra: narrow(r.extra, "extra")?,
            },
            split_version: r.split_version,
            solutions: r.solutions,
            run_id: r.run_id,
            state,
            work_done: count(r.work_done, "work_done")?,
            work_total: count(r.work_total, "work_total")?,
            jobs: r.jobs,
            jobs_done: r.jobs_done,
            jobs_pending: r.jobs_pending,
            jobs_leased: r.jobs_leased,
            jobs_in_check: r.jobs_in_check,
            // Absent from an older coordinator, which did not count it.
            work_awaiting_check: r.work_awaiting_check.map_or(0, u128::from),
            jobs_disputed: r.jobs_disputed,
            jobs_unchecked: r.jobs_unchecked,
            eta_seconds: r.eta_seconds,
            work_per_second: r.work_per_second,
            jobs_per_second: r.jobs_per_second,
            rate_window_seconds: r.rate_window_seconds,
            session_seconds: r.session_seconds,
            workers_connected: r.workers_connected,
            workers,
            confirmations: r.confirmations,
            conflicts: r.conflicts,
            lease_expiries: r.lease_expiries,
            faulty_workers: r
                .faulty_workers
                .into_iter()
                .map(|f| FaultyWorker {
                    name: f.name,
                    address: f.address,
                    lost: f.lost,
                    banned: f.banned,
                })
                .collect(),
            workers_unlisted: r.workers_unlisted,
            faulty_workers_unlisted: r.faulty_workers_unlisted,
            total_so_far: count(r.total_so_far, "total_so_far")?,
            result,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::quorum::{Fraction, Policy};
    use crate::core::scheduler::Settlement;
    use nq_core::Board;
    use nq_core::split::Tally;

    const TTL: Duration = Duration::from_secs(30);

    fn shape() -> RunShape {
        RunShape {
            board: Board::new(8).unwrap(),
            spec: SplitSpec::BORDER,
            solutions: false,
        }
    }

    /// A scheduler of two jobs (work 30 and 10) with one worker that holds
    /// both.
    fn setup(t0: Instant) -> (Scheduler, WorkerId) {
        let policy = Policy {
            secret: [3; 16],
            fraction: Fraction::Fixed(0.0),
            ban_after: 2,
            gpu_sample: 0.0,
        };
        let mut s = Scheduler::new(vec![30, 10], 1, TTL, policy);
        let w = s
            .register("w1", 2, Some("10.0.0.1".parse().unwrap()), t0)
            .unwrap();
        let grant = s.lease(&w, 2, &[], t0).unwrap();
        assert_eq!(grant.jobs.len(), 2);
        (s, w)
    }

    /// Settles `job` as the ledger would for a single unselected copy.
    fn settle(s: &mut Scheduler, w: &WorkerId, job: u64, total: u128, burnside: u128) {
        let settlement = Settlement {
            work: [30, 10][job as usize],
            ..Settlement::one_copy(JobId(job), Some(Tally { total, burnside }))
        };
        s.settle(&settlement, true).unwrap();
        s.note_copy(
            w,
            crate::core::lease::LeaseId(0),
            [30, 10][job as usize],
            Instant::now(),
        );
    }

    use nq_store::JobId;

    #[test]
    fn rates_eta_and_workers_come_from_the_window() {
        let t0 = Instant::now();
        let (mut s, w) = setup(t0);
        let mut history = History::new(&s, t0);
        let snap = Snapshot::build(&shape(), "r", &s, &history, t0);
        assert_eq!(snap.state, RunState::Running);
        assert_eq!(snap.eta_seconds, None);
        assert_eq!((snap.jobs, snap.jobs_done, snap.jobs_leased), (2, 0, 2));

        settle(&mut s, &w, 0, 50, 48);
        let t10 = t0 + Duration::from_secs(10);
        history.sample(&s, t10);
        let snap = Snapshot::build(&shape(), "r", &s, &history, t10);
        assert_eq!(snap.fraction(), 0.75);
        assert_eq!(snap.rate_window_seconds, 10.0);
        assert_eq!(snap.work_per_second, 3.0);
        assert_eq!(snap.jobs_per_second, 0.1);
        // 10 units left at 3 per second.
        assert_eq!(snap.eta_seconds, Some(10.0 / 3.0));
        let worker = &snap.workers[0];
        assert_eq!(
            (
                worker.name.as_str(),
                worker.address.as_str(),
                worker.threads
            ),
            ("w1", "10.0.0.1", 2)
        );
        assert_eq!((worker.jobs_done, worker.work_done), (1, 30));
        assert_eq!(worker.work_per_second, 3.0);
        assert_eq!(worker.last_seen_seconds, 10.0);
        assert_eq!(snap.result, None);
        assert_eq!(snap.total_so_far, 50);

        // Forty seconds later with nothing settled: the window has moved
        // past the settled job, and the session's average gives the ETA.
        for t in 11..=50 {
            history.sample(&s, t0 + Duration::from_secs(t));
        }
        let t50 = t0 + Duration::from_secs(50);
        let snap = Snapshot::build(&shape(), "r", &s, &history, t50);
        assert!(snap.rate_window_seconds >= RATE_WINDOW.as_secs_f64());
        assert!(snap.rate_window_seconds <= RATE_WINDOW.as_secs_f64() + 1.0);
        assert_eq!(snap.work_per_second, 0.0);
        assert_eq!(snap.eta_seconds, Some(10.0 * 50.0 / 30.0));
        assert!(history.samples.len() <= RATE_WINDOW.as_secs() as usize + 2);
    }

    #[test]
    fn a_complete_run_has_its_result_and_survives_the_wire() {
        let t0 = Instant::now();
        let (mut s, w) = setup(t0);
        let history = History::new(&s, t0);
        // Q(8) = 92, U(8) = 12: the Burnside sum is 8 × 12.
        settle(&mut s, &w, 0, 50, 48);
        settle(&mut s, &w, 1, 42, 48);
        let snap =
            Snapshot::build(&shape(), "8-run", &s, &history, t0 + Duration::from_secs(2));
        assert_eq!(snap.state, RunState::Complete);
        assert_eq!(snap.eta_seconds, Some(0.0));
        assert_eq!(
            snap.result,
            Some(RunResult {
                total: 92,
                unique: 12,
                published_match: Some(true)
            })
        );
        let back = Snapshot::try_from(snap.to_pb()).unwrap();
        assert_eq!(back, snap);

        let json = snap.to_json();
        assert_eq!(json["n"], 8);
        assert_eq!(json["state"], "complete");
        assert_eq!(json["result"]["total"], "92");
        assert_eq!(json["result"]["published_match"], true);
        assert_eq!(json["progress"]["fraction"], 1.0);
        assert_eq!(json["progress"]["work_total"], "40");
        assert_eq!(json["workers"][0]["address"], "10.0.0.1");

        let text = snap.to_text();
        assert!(text.contains("state      complete"), "{text}");
        assert!(
            text.contains("total=92 unique=12 published=match"),
            "{text}"
        );
        let row = text.lines().find(|l| l.starts_with("w1")).expect(&text);
        assert!(row.contains("10.0.0.1"), "{row}");
    }

    /// However many workers registered and however long their names, a
    /// `Status` answer fits the 4 MiB that gRPC clients decode by default:
    /// the lists are capped, the coordinator's own rows kept, and what was
    /// left out is counted in every form.
    #[test]
    fn a_status_answer_fits_a_default_client_however_many_workers() {
        let t0 = Instant::now();
        let (s, _) = setup(t0);
        let mut snap = Snapshot::build(&shape(), "r", &s, &History::new(&s, t0), t0);
        let longest = |i: usize| format!("{i:0>width$}", width = crate::error::MAX_NAME);
        let row = |i: usize, local: bool| WorkerStatus {
            name: longest(i),
            address: "ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255".into(),
            threads: u32::MAX,
            local,
            last_seen_seconds: 1e9,
            jobs_done: u64::MAX,
            work_done: u128::MAX,
            jobs_per_second: 1e9,
            work_per_second: 1e18,
            leases_taken_back: 0,
            stalled: false,
        };
        // 60,000 remote workers, sorted by name like a built snapshot, and
        // the coordinator's own row last by name.
        snap.workers = (0..60_000).map(|i| row(i, false)).collect();
        snap.workers.push(row(60_000, true));
        snap.faulty_workers = (0..10_000)
            .map(|i| FaultyWorker {
                name: longest(i),
                address: "ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255".into(),
                lost: u32::MAX,
                banned: true,
            })
            .collect();
        let answer = snap.to_pb();
        let bytes = prost::Message::encoded_len(&answer);
        assert!(bytes < 4 << 20, "{bytes} bytes");
        assert_eq!(answer.workers.len(), LISTED_WORKERS);
        assert!(answer.workers[0].local, "the local row is listed first");
        assert_eq!(answer.workers_unlisted, 60_001 - LISTED_WORKERS as u64);
        assert_eq!(answer.faulty_workers.len(), LISTED_FAULTY);
        assert_eq!(
            answer.faulty_workers_unlisted,
            10_000 - LISTED_FAULTY as u64
        );

        let back = Snapshot::try_from(answer).unwrap();
        assert_eq!(back.local_threads(), u32::MAX);
        assert_eq!(back.workers_unlisted, 52_001);
        // Sent on again (a proxy, a second hop), nothing is counted twice.
        assert_eq!(back.to_pb().workers_unlisted, 52_001);
        let text = back.to_text();
        assert!(
            text.contains("... and 52001 more workers, not listed"),
            "{}",
            &text[text.len() - 300..]
        );
        assert!(text.contains(", and 8000 more"));
        assert_eq!(back.to_json()["workers_unlisted"], 52_001);
        assert_eq!(back.to_json()["faulty_workers_unlisted"], 8_000);
        // Where the snapshot was built nothing is left out.
        assert_eq!(snap.to_json()["workers_unlisted"], 0);
        assert_eq!(
            snap.to_json()["workers"].as_array().map(Vec::len),
            Some(60_001)
        );
        // The status page's form: the local row, then the first by name.
        let page = snap.to_json_listing(200);
        let listed = page["workers"].as_array().unwrap();
        assert_eq!(listed.len(), 200);
        assert_eq!(listed[0]["local"], true);
        assert_eq!(listed[1]["name"], longest(0).as_str());
        assert_eq!(page["workers_unlisted"], 60_001 - 200);
        assert_eq!(page["faulty_workers"].as_array().map(Vec::len), Some(200));
        assert_eq!(page["faulty_workers_unlisted"], 10_000 - 200);
        // Under 256 KiB a second, with the longest names (8.8 MB listing all).
        assert!(
            page.to_string().len() < 256 << 10,
            "the page's poll is small"
        );
    }

    /// A job computed but waiting for a check is shown as work done apart
    /// from the settled work (issue 26: a probation run read "0.0 %" while
    /// most jobs were computed), in every form and across the wire; the
    /// coordinator's own threads are counted as workers at work.
    #[test]
    fn work_awaiting_a_check_and_local_threads_are_shown() {
        let t0 = Instant::now();
        let (mut s, w) = setup(t0);
        let local = s.register_local(4, t0);
        assert!(!local.0.is_empty());
        let history = History::new(&s, t0);
        let mut waiting = Settlement {
            work: 30,
            settled: false,
            ..Settlement::one_copy(JobId(0), None)
        };
        s.settle(&waiting, true).unwrap();
        // A second copy that still waits does not count its work twice.
        s.settle(&waiting, true).unwrap();
        assert_eq!(s.awaiting_check(), (1, 30));
        let progress = Progress::of(&s, &history, t0);
        assert_eq!(progress.fraction(), 0.0);
        assert_eq!(progress.fraction_awaiting_check(), 0.75);
        assert_eq!(progress.local_threads, 4);
        assert_eq!(
            progress.workers_text(),
            "local (4 threads) + 1 remote connected"
        );

        let snap = Snapshot::build(&shape(), "r", &s, &history, t0);
        assert_eq!((snap.jobs_in_check, snap.work_awaiting_check), (1, 30));
        assert_eq!(snap.local_threads(), 4);
        let back = Snapshot::try_from(snap.to_pb()).unwrap();
        assert_eq!(back, snap);
        let json = snap.to_json();
        assert_eq!(json["progress"]["work_awaiting_check"], "30");
        assert_eq!(json["progress"]["fraction_awaiting_check"], 0.75);
        assert_eq!(json["local_threads"], 4);
        let text = snap.to_text();
        assert!(
            text.contains("0.0% of the estimated work settled (0 of 40), 75.0% more computed, awaiting a check"),
            "{text}"
        );
        assert!(text.contains("1 computed awaiting a check"), "{text}");
        assert!(
            text.contains("workers    local (4 threads) + 1 remote connected"),
            "{text}"
        );
        let row = text.lines().find(|l| l.starts_with("local")).expect(&text);
        assert!(row.contains("(local)") && row.contains(" 4 "), "{row}");

        // Settled at last: the work moves from awaiting to done.
        waiting.settled = true;
        waiting.votes = 2;
        waiting.counted = Some(Tally {
            total: 50,
            burnside: 48,
        });
        s.settle(&waiting, true).unwrap();
        assert_eq!(s.awaiting_check(), (0, 0));
        let snap = Snapshot::build(&shape(), "r", &s, &history, t0);
        assert_eq!(snap.fraction(), 0.75);
        assert!(
            !snap.to_text().contains("more computed"),
            "{}",
            snap.to_text()
        );
        let _ = w;
    }

    #[test]
    fn a_job_settled_unchecked_is_named_while_the_run_goes_on() {
        let t0 = Instant::now();
        let (mut s, _w) = setup(t0);
        let history = History::new(&s, t0);
        let quiet = Snapshot::build(&shape(), "r", &s, &history, t0);
        assert_eq!(quiet.jobs_unchecked, 0);
        assert!(!quiet.to_text().contains("WARNING"), "{}", quiet.to_text());
        let alone = Settlement {
            work: 30,
            unchecked: true,
            ..Settlement::one_copy(
                JobId(0),
                Some(Tally {
                    total: 50,
                    burnside: 48,
                }),
            )
        };
        s.settle(&alone, true).unwrap();
        let snap = Snapshot::build(&shape(), "r", &s, &history, t0);
        assert_eq!(snap.jobs_unchecked, 1);
        assert_eq!(Snapshot::try_from(snap.to_pb()).unwrap(), snap);
        assert_eq!(snap.to_json()["jobs"]["unchecked"], 1);
        let text = snap.to_text();
        assert!(
            text.contains(
                "WARNING    no second machine delivers: 1 jobs settled on one copy"
            ),
            "{text}"
        );
    }

    #[test]
    fn a_malformed_answer_names_the_field() {
        let t0 = Instant::now();
        let (s, _) = setup(t0);
        let snap = Snapshot::build(&shape(), "r", &s, &History::new(&s, t0), t0);
        let mut pb = snap.to_pb();
        pb.work_total = None;
        let e = Snapshot::try_from(pb).unwrap_err();
        assert!(e.to_string().contains("work_total"), "{e}");
        let mut pb = snap.to_pb();
        pb.state = 0;
        assert!(Snapshot::try_from(pb).is_err());
    }

    #[test]
    fn every_series_is_exposed() {
        let t0 = Instant::now();
        let (mut s, w) = setup(t0);
        let mut history = History::new(&s, t0);
        settle(&mut s, &w, 0, 50, 48);
        history.sample(&s, t0 + Duration::from_secs(5));
        let snap =
            Snapshot::build(&shape(), "r", &s, &history, t0 + Duration::from_secs(5));
        let text = crate::metrics::render(&snap);
        for series in [
            "nq_run_info{",
            "nq_jobs{state=\"pending\"} 0",
            "nq_jobs{state=\"leased\"} 1",
            "nq_jobs{state=\"in_check\"} 0",
            "nq_jobs{state=\"done\"} 1",
            "nq_work_done 30",
            "nq_work_total 40",
            "nq_progress_ratio 0.75",
            "nq_completion_jobs_per_second 0.2",
            "nq_completion_work_per_second 6",
            "nq_eta_seconds ",
            "nq_workers_connected 1",
            "nq_lease_expiries_total 0",
            "nq_conflicts_total 0",
            "nq_confirmations_total 0",
            "nq_worker_jobs_total{worker=\"w1\",address=\"10.0.0.1\"} 1",
            "nq_worker_work_total{worker=\"w1\",address=\"10.0.0.1\"} 30",
            "nq_worker_work_per_second{worker=\"w1\",address=\"10.0.0.1\"} 6",
            "nq_worker_last_seen_seconds{worker=\"w1\",address=\"10.0.0.1\"} 5",
            "nq_worker_leases_taken_back_total{worker=\"w1\",address=\"10.0.0.1\"} 0",
            "nq_worker_stalled{worker=\"w1\",address=\"10.0.0.1\"} 0",
            "# TYPE nq_worker_jobs counter\n",
            "# TYPE nq_worker_stalled gauge\n",
        ] {
            assert!(text.contains(series), "no {series:?} in\n{text}");
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
