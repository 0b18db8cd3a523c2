//! The scheduler: which job goes to which worker, and what a result does.
//!
//! A pure, synchronous state machine, in the manner of raft-rs's core: it owns
//! no threads, sockets, clocks or storage. The caller passes the time in
//! (`now: Instant`) and persists what it returns, so the lease logic is tested
//! with a fake clock and simulated lost workers, without sleeping.
//!
//! Memory is what makes a record run possible: per job the scheduler keeps
//! four bits (its phase, and whether a copy counts and is verified), so
//! 10^8 jobs cost 50 MB. Everything else it holds is bounded by the work in
//! flight, not by the size of the run: the fresh jobs come from a
//! [`HandOut`] (in a large run, a cursor over the order stored with the jobs,
//! read a chunk at a time), and the leased, requeued, open and disputed jobs
//! and their attempt counts sit in small maps. Job definitions, works and
//! results live in the store; the ledger passes a job's work along with each
//! decision.
//!
//! The state of each job:
//!
//! ```text
//!   Pending ──lease──► Leased{worker, deadline} ──copy, settled──► Done
//!      ▲   ▲                │         │
//!      │   └─expire/release─┘         │ copy, not settled (verification
//!      └──────────────────────────────┘ wants another copy: `checks` queue)
//! ```
//!
//! * Pending jobs are handed out largest estimated work first, so the run ends
//!   on small jobs and the last workers do not wait on one long tail. Above
//!   65536 jobs the order is by octave of work (jobs within a factor of 2
//!   count as equal), then by id: within an octave, consecutive grants are
//!   neighbours in the store, whose chunks then stay in cache (this doubled
//!   the throughput of a million-job run).
//! * Jobs that wait for another copy (a check) go to the `checks` queue and
//!   are granted first, to identities that have not reported them.
//! * An expired or released job goes to the FRONT of its queue: it is late.
//! * Leases are bound: a report counts only under a lease this run issued,
//!   to the worker that sends it, for the job it names. Worker and lease ids
//!   carry a MAC keyed by the run's secret ([`crate::core::tag`]), so they
//!   cannot be guessed, and a restarted coordinator recognises the ids of
//!   the sessions before it without any stored state
//!   ([`Scheduler::recognize`], [`Scheduler::recognize_lease`]).
//! * The ledger decides what each copy does ([`Settlement`]); the scheduler
//!   applies it: the counted tally, settled or not, and lost conflicts.
//!
//! # Owners
//!
//! The state is split by owner, one type and one file each, so that a
//! feature lands in the part it changes and no type holds more than twenty
//! fields (`tests/layout.rs` checks it):
//!
//! * [`Jobs`] (`jobs.rs`): the job table and phases, the hand-out queues,
//!   the jobs with copies and what they wait for;
//! * `Leases` (`leases.rs`): the live leases and their indexes, every lease
//!   issued this session, and those taken back;
//! * `Workers` (`workers.rs`): registrations, presence, allowances, and the
//!   registrations of earlier sessions;
//! * `Verification` (`verification.rs`): the identities, the policy, and
//!   whether a second machine (or a trusted one) is at work;
//! * `Counts` (`counts.rs`): the counters of what settled and how.
//!
//! What changes one owner's state alone is a method of that owner (a job
//! requeued, pending jobs read from the source, a decision applied to its
//! job's phase: `Jobs`; a lease issued: `Leases`; a worker heard from or
//! forgotten: `Workers`; the selection: `Verification`; an outcome counted:
//! `Counts`). Each file also holds the `Scheduler` methods that work on its
//! owner with others; [`Scheduler::settle`], which changes several, stays
//! here and reads as their orchestration. [`Restorer`] (`restore.rs`) holds the doors that
//! only a restart uses. Outside the core, the scheduler is reached only
//! through `crate::core::Core`.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use nq_core::search::Kernel;
use nq_core::split::Tally;
use nq_store::JobId;
use rand::{Rng, SeedableRng};

use crate::core::allowance::{Allowances, fair_share};
use crate::core::lease::{Lease, LeaseId, LeaseTable, WorkerId};
use crate::core::presence::Presence;
use crate::core::quorum::{
    Beaten, Identities, IdentityId, LOCAL, Policy, Rules, Selection, trusted_from_start,
};
use crate::core::tag::{Caller, Tags, caller_key};
use crate::error::{Error, Refusal, RegistrationLimit, Result};

/// Most jobs one `Lease` call can grant.
pub(crate) const MAX_GRANT: u32 = 1024;

/// Runs with at most this many jobs hand them out in exact order of work.
pub(crate) const EXACT_ORDER_UP_TO: usize = 1 << 16;

/// How many queued checks one grant looks at for one the worker may take.
const CHECK_SCAN: usize = 64;

/// Registrations one identity may hold at once: enough for a machine's
/// restarts within a few lease lifetimes, not for a flood (each one is a
/// worker record kept until it falls silent).
pub(crate) const MAX_REGISTRATIONS_PER_IDENTITY: u32 = 64;

/// Registrations one address may hold at once. Far larger than the
/// identity's limit: on loopback (one machine) every name is its own
/// identity, and the load test simulates 50,000 workers there
/// (BENCHMARKS.md). At about 200 bytes each, a full address holds about
/// 13 MB until its workers are forgotten.
pub(crate) const MAX_REGISTRATIONS_PER_ADDRESS: u32 = 1 << 16;

/// The threads assumed for a worker recognised after a restart
/// ([`Scheduler::recognize`]): its claim is not in the call. Its cap is then
/// what its identity's measured allowance says ([`MAX_GRANT`] = 4 × this):
/// the claim can only lower it, and an unknown claim must not.
const RECOGNIZED_THREADS: u32 = MAX_GRANT / 4;

/// Most jobs a restart sets aside ([`Scheduler::defer_unrecorded`]): the
/// first `Lease` call after it reads that far into the hand-out order.
pub(crate) const MAX_DEFERRED: u64 = 1 << 20;

/// What a worker says it can compute at once, at registration: its CPU
/// threads and the jobs its GPUs may hold. Nothing checks either; together
/// they only bound the leases its measured allowance may grant
/// ([`Claim::cap`]), so a false claim gains nothing it has not delivered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Claim {
    /// CPU threads.
    pub threads: u32,
    /// Jobs its GPUs may hold at once (0 without a GPU).
    pub gpu_jobs: u32,
}

impl From<u32> for Claim {
    /// A claim of `threads` CPU threads and no GPU.
    fn from(threads: u32) -> Claim {
        Claim {
            threads,
            gpu_jobs: 0,
        }
    }
}

impl From<&nq_store::StoredWorker> for Claim {
    /// The claim a worker registered with, as a session recorded it.
    fn from(w: &nq_store::StoredWorker) -> Claim {
        Claim {
            threads: w.threads,
            gpu_jobs: w.gpu_jobs,
        }
    }
}

impl Claim {
    /// The most leases a remote worker with this claim may hold at once
    /// (its measured allowance may lower it): 4 per thread, at least 16,
    /// plus its GPUs' jobs, and never above what any allowance grants. A
    /// GPU worker started with `--threads 1` was held to 16 jobs for all
    /// its GPUs, about a third of what one H100 keeps in flight.
    pub fn cap(self) -> u64 {
        let threads = u64::from(self.threads.saturating_mul(4).max(16));
        (threads + u64::from(self.gpu_jobs)).min(crate::core::allowance::MAX_CAP as u64)
    }
}

/// Lease lifetimes of silence after which a worker is forgotten: its leases
/// expired long before, and it must register again to call.
const FORGET_AFTER_TTLS: u32 = 3;

use nq_store::plan::band;

mod counts;
mod jobs;
mod leases;
mod restore;
mod verification;
mod workers;

use counts::Counts;
pub(crate) use jobs::Jobs;
use jobs::PhaseChange;
use leases::Leases;
pub(crate) use restore::Restorer;
use verification::Verification;
use workers::Workers;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Pending,
    Leased,
    Done,
    /// Done in the store, as a restart's state index says, and not judged
    /// yet: never handed out, not counted, until the background check of
    /// the stored copies settles it (or finds it not done after all).
    Restoring,
}

/// Four bits of state per job, two jobs to a byte: the phase (two bits),
/// whether a copy's tally is in the totals, and whether the counted copy has
/// at least two votes.
#[derive(Debug)]
struct JobTable {
    nibbles: Vec<u8>,
    len: u64,
}

const PHASE_BITS: u8 = 0b0011;
const COUNTED: u8 = 0b0100;
const VERIFIED: u8 = 0b1000;

impl JobTable {
    fn new(len: u64) -> JobTable {
        // Every job starts pending (phase 0), uncounted and unverified.
        let bytes = usize::try_from(len.div_ceil(2)).expect("job table fits in memory");
        JobTable {
            nibbles: vec![0; bytes],
            len,
        }
    }

    fn get(&self, job: JobId) -> u8 {
        let byte = self.nibbles[(job.0 / 2) as usize];
        if job.0.is_multiple_of(2) {
            byte & 0x0f
        } else {
            byte >> 4
        }
    }

    fn set(&mut self, job: JobId, bits: u8) {
        let byte = &mut self.nibbles[(job.0 / 2) as usize];
        *byte = if job.0.is_multiple_of(2) {
            (*byte & 0xf0) | bits
        } else {
            (*byte & 0x0f) | (bits << 4)
        };
    }

    fn phase(&self, job: JobId) -> Phase {
        match self.get(job) & PHASE_BITS {
            0 => Phase::Pending,
            1 => Phase::Leased,
            2 => Phase::Done,
            _ => Phase::Restoring,
        }
    }

    fn set_phase(&mut self, job: JobId, phase: Phase) {
        let code = match phase {
            Phase::Pending => 0,
            Phase::Leased => 1,
            Phase::Done => 2,
            Phase::Restoring => 3,
        };
        self.set(job, (self.get(job) & !PHASE_BITS) | code);
    }

    fn flag(&self, job: JobId, flag: u8) -> bool {
        self.get(job) & flag != 0
    }

    fn set_flag(&mut self, job: JobId, flag: u8, on: bool) {
        let bits = self.get(job);
        self.set(job, if on { bits | flag } else { bits & !flag });
    }
}

/// Where the jobs not yet handed out in this session come from, in hand-out
/// order. Each job comes once per session; the scheduler skips those that
/// are no longer pending.
pub trait HandOut: Send + std::fmt::Debug {
    /// The next jobs in hand-out order; empty once every job was given.
    ///
    /// # Errors
    ///
    /// The store's, when the order cannot be read.
    fn next_batch(&mut self) -> Result<Vec<JobId>>;
}

/// A hand-out order held in memory: largest estimated work first, ties in id
/// order (for runs of at most [`EXACT_ORDER_UP_TO`] jobs, and for tests).
#[derive(Debug)]
pub(crate) struct ExactOrder {
    ids: std::vec::IntoIter<JobId>,
}

impl ExactOrder {
    /// The order of jobs `0..works.len()` with the given estimated works.
    pub(crate) fn new(works: &[u64]) -> ExactOrder {
        let mut order: Vec<JobId> = (0..works.len() as u64).map(JobId).collect();
        if works.len() <= EXACT_ORDER_UP_TO {
            order.sort_by_key(|&j| (std::cmp::Reverse(works[j.0 as usize]), j));
        } else {
            // By octave of work, as the stored order of large runs.
            order.sort_by_key(|&j| (std::cmp::Reverse(band(works[j.0 as usize])), j));
        }
        ExactOrder {
            ids: order.into_iter(),
        }
    }
}

impl HandOut for ExactOrder {
    fn next_batch(&mut self) -> Result<Vec<JobId>> {
        Ok(self.ids.by_ref().take(4096).collect())
    }
}

/// The kernel a lease asks for (see `Job.kernel` in the protocol).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelRequest {
    /// The worker's fastest.
    Any,
    /// This kernel, where the worker's CPU has it (never `Kernel::Auto`).
    Named(Kernel),
}

impl KernelRequest {
    /// The protocol's spelling: `""`, or the kernel's name.
    pub fn wire(self) -> &'static str {
        match self {
            KernelRequest::Any => "",
            KernelRequest::Named(k) => k.name(),
        }
    }
}

/// The kernel a trusted remote identity's check asks for, given the kernels
/// its job's copies ran: one they did not run, the cheapest first (the other
/// SIMD kernel before the scalar one, which is several times slower), so
/// that the copies share as little code as the workers allow at the least
/// cost. Untrusted workers are never asked for a kernel (see
/// `Scheduler::next_job`).
pub(crate) fn other_kernel(ran: &[String]) -> KernelRequest {
    let seen = |k: Kernel| ran.iter().any(|r| r == k.name());
    if seen(Kernel::Avx512) && !seen(Kernel::Avx2) {
        KernelRequest::Named(Kernel::Avx2)
    } else if seen(Kernel::Avx2) && !seen(Kernel::Avx512) {
        KernelRequest::Named(Kernel::Avx512)
    } else if !seen(Kernel::Scalar) && !ran.is_empty() {
        KernelRequest::Named(Kernel::Scalar)
    } else {
        KernelRequest::Any
    }
}

/// The kernel a trusted remote machine runs to check its own copy of a job
/// whose copies ran `ran`: the scalar kernel, which every CPU has, unless a
/// copy ran it. A trusted machine is the operator's, as the coordinator's
/// threads are, and checks itself on a kernel no copy ran as they do
/// ([`local_choice`]): without it, a run whose one trusted machine is its
/// only voice waited for a check nobody could give. The coordinator does
/// not know which SIMD kernels a remote CPU has, and a worker asked for one
/// it lacks runs its own, a copy that adds no vote: hence the scalar
/// kernel. Where the scalar kernel ran already, the machine has nothing new
/// to add.
fn self_check(ran: &[String]) -> Option<KernelRequest> {
    let scalar = Kernel::Scalar;
    (!ran.iter().any(|r| r == scalar.name())).then_some(KernelRequest::Named(scalar))
}

/// The kernel the coordinator's own threads run to check a job whose copies
/// ran `ran`: the cheapest kernel of this CPU that none of them ran (its
/// fastest, else the other SIMD kernel, else the scalar one), so that a
/// trusted copy shares no kernel code with the copies it judges. When every
/// kernel of this CPU ran, the fastest, unless the threads computed the job
/// already (`reported`): they then have nothing new to add.
fn local_choice(ran: &[String], reported: bool) -> Option<KernelRequest> {
    let mut options = vec![(Kernel::Auto.resolved(), KernelRequest::Any)];
    for k in [Kernel::Avx512, Kernel::Avx2, Kernel::Neon, Kernel::Scalar] {
        if k.is_available() {
            options.push((k, KernelRequest::Named(k)));
        }
    }
    options
        .iter()
        .find(|(k, _)| !ran.iter().any(|r| r == k.name()))
        .map(|&(_, request)| request)
        .or_else(|| (!reported).then_some(KernelRequest::Any))
}

/// A registered worker.
#[derive(Clone, Debug)]
pub struct Worker {
    /// Its self-chosen name, for logs.
    pub name: String,
    /// The address it registered from, if known.
    pub address: Option<IpAddr>,
    /// Its identity for verification (`name@address`).
    pub identity: IdentityId,
    /// CPU threads it runs.
    pub threads: u32,
    /// Jobs its GPUs may hold at once, as it claimed (0 without a GPU).
    pub gpu_jobs: u32,
    /// The last time it called in.
    pub last_seen: Instant,
    /// True once a response told it the run is complete.
    pub told_complete: bool,
    /// True for the coordinator's own threads.
    pub local: bool,
    /// Copies of jobs it reported that were stored (any outcome), for
    /// throughput figures ([`Scheduler::note_copy`]).
    pub jobs_reported: u64,
    /// Their estimated work.
    pub work_reported: u128,
    /// Leases taken back from its identity ([`Reclaimed`]).
    pub leases_taken_back: u64,
}

impl Worker {
    /// What it claimed at registration.
    pub fn claim(&self) -> Claim {
        Claim {
            threads: self.threads,
            gpu_jobs: self.gpu_jobs,
        }
    }

    /// A worker registered at `now`, with nothing reported yet.
    fn new(
        name: &str,
        address: Option<IpAddr>,
        identity: IdentityId,
        claim: Claim,
        now: Instant,
        local: bool,
    ) -> Worker {
        Worker {
            name: name.to_owned(),
            address,
            identity,
            threads: claim.threads,
            gpu_jobs: claim.gpu_jobs,
            last_seen: now,
            told_complete: false,
            local,
            jobs_reported: 0,
            work_reported: 0,
            leases_taken_back: 0,
        }
    }
}

/// One job handed out by [`Scheduler::lease`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Granted {
    /// The job.
    pub job: JobId,
    /// Its new lease.
    pub lease: LeaseId,
    /// Attempts so far, this one included.
    pub attempts: u32,
    /// When the lease expires unless renewed.
    pub deadline: Instant,
    /// The kernel the lease asks for.
    pub kernel: KernelRequest,
}

/// A lease as it was issued, kept for the whole session so that a report can
/// be bound to it (also after the lease expired: a late copy is still a copy).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Issued {
    /// The job it granted.
    pub job: JobId,
    /// The worker it was granted to.
    pub worker: WorkerId,
    /// Who computes under it, for verification.
    pub identity: IdentityId,
    /// True for the coordinator's own threads.
    pub local: bool,
    /// When it was granted: the lease time of the copy made under it.
    pub granted: Instant,
}

/// Why a live lease was taken back before it expired.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TakenBack {
    /// Held far past the time its holder was measured to need
    /// ([`crate::core::allowance::Allowances::is_overdue`]).
    Overdue,
    /// Its holder held more than its fair share while another identity
    /// waited for work.
    OverShare,
}

/// A live lease taken back and its job reissued (for the WARN line that
/// names the holder, and the metrics).
#[derive(Clone, Debug)]
pub struct Reclaimed {
    /// The lease as it was.
    pub lease: Lease,
    /// Why.
    pub reason: TakenBack,
    /// The holder's registration name, if it is still known.
    pub name: String,
    /// Its identity's label.
    pub identity: String,
    /// True when its holder made no progress and is now stalled (a cap of
    /// one job until it delivers).
    pub stalled: bool,
}

/// The answer to a `Lease` call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Grant {
    /// New jobs.
    pub jobs: Vec<Granted>,
    /// Leases from `held` that are no longer live: expired and reissued, or
    /// their job is done. The worker should stop them.
    pub revoked: Vec<LeaseId>,
    /// True when every job is done.
    pub run_complete: bool,
    /// True when the worker had room for jobs under its cap and none was
    /// left to give: it waits for one (or for the end), not for its cap.
    pub starved: bool,
}

/// What a result did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The job's first copy, or a copy that changed which result counts.
    Accepted,
    /// The copy agrees with the result that counts.
    Confirmed,
    /// The copy disagrees with the result that counts. Kept, not counted.
    Conflict,
}

/// What the ledger decided about one job, applied by
/// [`Scheduler::settle`] once the decision is durable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settlement {
    /// The job.
    pub job: JobId,
    /// The lease the deciding copy came under (it ends), if any.
    pub lease: Option<LeaseId>,
    /// The tally that was counted for the job before, if any.
    pub counted_before: Option<Tally>,
    /// The tally that counts now, if any copy votes.
    pub counted: Option<Tally>,
    /// The job's estimated work (for progress).
    pub work: u64,
    /// How many times the job was leased, in every session.
    pub attempts: u32,
    /// The counted copy's votes.
    pub votes: u32,
    /// True when the job needs no further copy.
    pub settled: bool,
    /// Every identity that reported the job.
    pub reporters: Vec<IdentityId>,
    /// The kernels the job's copies ran (as reported).
    pub kernels: Vec<String>,
    /// Identities that lost a conflict on this job.
    pub losers: Vec<IdentityId>,
    /// Who beat them.
    pub beaten: Beaten,
    /// True when the next copy must come from a trusted computation
    /// ([`crate::core::quorum::Verdict::needs_trusted`]).
    pub needs_trusted: bool,
    /// True when the job's valid copies disagree.
    pub disputed: bool,
    /// Solutions mode: the stored solutions are not the counted copy's (it
    /// was overturned), so the next copy must store its own.
    pub solutions_missing: bool,
    /// Identities whose copy of the job another identity confirmed (their
    /// record for probation), counted when the job settles.
    pub confirmed: Vec<IdentityId>,
    /// True when the job settled on one vote that needed a check no second
    /// machine could give ([`crate::core::quorum::Verdict::unchecked`]).
    pub unchecked: bool,
}

impl Settlement {
    /// True when the job waits for a trusted copy although its copies do
    /// not disagree: only the CPU sample asks for that (every copy ran on a
    /// GPU, see [`crate::core::quorum::judge`]).
    pub fn held_for_cpu_sample(&self) -> bool {
        !self.settled && self.needs_trusted && !self.disputed
    }
}

#[cfg(test)]
impl Settlement {
    /// The ledger's decision for one copy of `job` (estimated work 1, first
    /// attempt, one vote) that counts `counted` and settles the job: no
    /// lease, reporter, kernel, loser, confirmation or mark. A test sets the
    /// fields it is about with struct update syntax, so that each literal
    /// names only what the test is about.
    pub(crate) fn one_copy(job: JobId, counted: Option<Tally>) -> Settlement {
        Settlement {
            job,
            lease: None,
            counted_before: None,
            counted,
            work: 1,
            attempts: 1,
            votes: 1,
            settled: true,
            reporters: vec![],
            kernels: vec![],
            losers: vec![],
            beaten: Beaten::default(),
            needs_trusted: false,
            disputed: false,
            solutions_missing: false,
            confirmed: vec![],
            unchecked: false,
        }
    }
}

/// What a [`Scheduler::settle`] changed beyond its job: the caller must
/// re-examine other jobs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fallout {
    /// Identities that just became suspect or banned: every job they voted
    /// for is judged again.
    pub discredited: Vec<IdentityId>,
    /// True when a second machine began or the last but one stopped
    /// working: the jobs to check changed (the selection of
    /// `Fraction::Auto`, and whether probation can be checked), and the jobs
    /// it adds or drops are judged again.
    pub selection_changed: bool,
    /// Identities that just left probation: their copies that wait for a
    /// check only because they were on probation are judged again, so that
    /// a results queue built up while they were new is not checked whole
    /// (issue 26, item 3).
    pub left_probation: Vec<IdentityId>,
}

impl Fallout {
    /// Adds what `other` changed to what this one changed.
    pub fn absorb(&mut self, other: Fallout) {
        self.discredited.extend(other.discredited);
        self.selection_changed |= other.selection_changed;
        self.left_probation.extend(other.left_probation);
    }

    /// True when nothing beyond the settled job changed.
    pub fn is_empty(&self) -> bool {
        self.discredited.is_empty()
            && !self.selection_changed
            && self.left_probation.is_empty()
    }
}

/// A job waiting for another copy.
#[derive(Clone, Debug, Default)]
struct Open {
    /// Identities that reported it; none of them may compute it again.
    reporters: Vec<IdentityId>,
    /// The kernels its copies ran.
    kernels: Vec<String>,
    /// True when only a trusted computation may give the next copy.
    trusted_only: bool,
    /// The job's estimated work ([`Scheduler::awaiting_check`]).
    work: u64,
}

/// One bit per job, allocated on first use: the jobs settled without the
/// check they needed. Most runs never set one; a lone worker's run sets one
/// per job, 12.5 MB at 10^8 jobs.
#[derive(Debug, Default)]
struct JobBits {
    words: Vec<u64>,
    ones: u64,
}

impl JobBits {
    fn get(&self, job: JobId) -> bool {
        self.words
            .get((job.0 / 64) as usize)
            .is_some_and(|w| w & (1 << (job.0 % 64)) != 0)
    }

    fn set(&mut self, job: JobId, len: u64, on: bool) {
        if on == self.get(job) {
            return;
        }
        if self.words.is_empty() {
            self.words = vec![0; len.div_ceil(64) as usize];
        }
        self.words[(job.0 / 64) as usize] ^= 1 << (job.0 % 64);
        if on {
            self.ones += 1;
        } else {
            self.ones -= 1;
        }
    }
}

/// The scheduling state of one coordinator session.
#[derive(Debug)]
pub struct Scheduler {
    /// The jobs and their phases: the job table, the hand-out queues, the
    /// jobs with copies and what they wait for.
    jobs: Jobs,
    /// The leases and their indexes: the live ones, every one issued this
    /// session, and those taken back.
    leases: Leases,
    /// The workers: registrations, presence, allowances, and the
    /// registrations of earlier sessions.
    workers: Workers,
    /// Verification: the identities, the policy, and whether a second
    /// machine (or a trusted one) is at work to give a check.
    verify: Verification,
    /// The counters of what settled and how.
    counts: Counts,
    /// The keys of the run's worker and lease ids.
    tags: Tags,
    session: u64,
    ttl: Duration,
    closed: bool,
}

impl Scheduler {
    /// A scheduler for jobs `0..works.len()` with the given estimated works,
    /// all pending, handed out in [`ExactOrder`] (for small runs and tests).
    /// `session` numbers this coordinator session (from `Store::next_boot`);
    /// `ttl` is the lease lifetime; `policy` the verification settings.
    pub fn new(
        works: Vec<u64>,
        session: u64,
        ttl: Duration,
        policy: Policy,
    ) -> Scheduler {
        let total_work = works.iter().map(|&w| u128::from(w)).sum();
        let order = ExactOrder::new(&works);
        Scheduler::with_order(
            works.len() as u64,
            total_work,
            Box::new(order),
            session,
            ttl,
            policy,
        )
    }

    /// A scheduler for jobs `0..jobs` of `total_work` in all, all pending,
    /// that takes fresh jobs from `source`.
    pub fn with_order(
        jobs: u64,
        total_work: u128,
        source: Box<dyn HandOut>,
        session: u64,
        ttl: Duration,
        policy: Policy,
    ) -> Scheduler {
        let tags = Tags::new(&policy.secret);
        Scheduler {
            jobs: Jobs {
                table: JobTable::new(jobs),
                attempts: HashMap::new(),
                source,
                deferred: VecDeque::new(),
                defer_left: 0,
                deferred_until: None,
                window: VecDeque::new(),
                source_drained: false,
                requeued: VecDeque::new(),
                checks: VecDeque::new(),
                trusted_checks: VecDeque::new(),
                open: HashMap::new(),
                open_work: 0,
                disputed: std::collections::HashSet::new(),
                solutions_missing: std::collections::HashSet::new(),
                unchecked: JobBits::default(),
                pending_count: jobs,
                restoring: 0,
                unchecked_store: false,
            },
            leases: Leases {
                table: LeaseTable::default(),
                issued: HashMap::new(),
                issued_by_job: HashMap::new(),
                issued_before: HashMap::new(),
                settled_since_prune: Vec::new(),
                reclaimed: Vec::new(),
                rng: rand::rngs::StdRng::from_os_rng(),
            },
            workers: Workers {
                by_id: HashMap::new(),
                presence: Presence::new(ttl),
                locals: 0,
                local_threads: 0,
                registrations: HashMap::new(),
                registrations_by_address: HashMap::new(),
                allowances: Allowances::new(ttl),
                recorded: HashMap::new(),
                returning: std::collections::HashSet::new(),
                next_worker: 1,
            },
            verify: Verification {
                identities: Identities::default(),
                policy,
                two_machines: false,
                machines_unreported: false,
                restored_machines_until: None,
                local_arbiter: false,
            },
            counts: Counts {
                tally: Tally::default(),
                done_jobs: 0,
                done_work: 0,
                total_work,
                done_here: 0,
                work_here: 0,
                confirmations: 0,
                conflicts: 0,
                expiries: 0,
            },
            tags,
            session,
            ttl,
            closed: false,
        }
    }

    /// The doors that only a restore uses (see [`Restorer`]).
    pub(crate) fn restorer(&mut self) -> Restorer<'_> {
        Restorer { sched: self }
    }

    /// Applies a decision of the ledger about one job, which the caller has
    /// made durable. Returns what changed beyond the job.
    ///
    /// # Errors
    ///
    /// [`Error::UnknownJob`]; [`Error::Inconsistent`] if a total would
    /// overflow or go below zero (never expected: the ledger subtracts only
    /// what it added).
    pub fn settle(&mut self, s: &Settlement, here: bool) -> Result<Fallout> {
        self.known(s.job)?;
        if let Some(lease) = s.lease
            && self.leases.table.get(lease).is_some_and(|l| l.job == s.job)
        {
            self.leases.table.remove(lease);
            self.jobs.lease_ended(s.job);
        }
        // The totals first: they are all that can fail.
        self.counts.recount(s)?;
        let work = u128::from(s.work);
        let change = self.jobs.apply(s);
        match change {
            PhaseChange::Settled => {
                self.leases.note_settled(s.job);
                self.leases.table.remove_job(s.job);
                self.counts.settled(work, here);
            }
            PhaseChange::Reopened => self.counts.reopened(work),
            PhaseChange::None => {}
        }
        let mut left = Vec::new();
        if change == PhaseChange::Settled {
            // Once per settlement of the job: a job settled again after it
            // was reopened (a voter discredited) counts again, which only
            // shortens a probation that its voters' losses already weighed.
            let probation = self.verify.policy.probation();
            for &c in &s.confirmed {
                if self.verify.identities.add_confirmation(c) == probation
                    && probation > 0
                {
                    left.push(c);
                }
            }
        }
        let mut fallout = self.charge_losses(&s.losers, &s.beaten);
        fallout.left_probation = left;
        Ok(fallout)
    }

    /// Stops granting leases (the first step of shutdown). Heartbeats still
    /// renew leases, and results are still taken.
    pub fn close(&mut self) {
        self.closed = true;
    }

    /// True once [`Scheduler::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// True when every job is settled, and none settled unchecked while a
    /// second machine is at work to check it (the caller judges those again
    /// once [`Scheduler::refresh_machines`] reports the second machine).
    pub fn is_complete(&self) -> bool {
        self.all_settled()
            && !self.jobs.unchecked_store
            && !(self.verify.two_machines && self.jobs.unchecked.ones > 0)
    }

    /// The lease lifetime.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    // Read-only views for `crate::core::status` (issue 26's display points).
}

/// The scheduler's counters at one moment. Work is in the split's estimate
/// units, so progress read from them is weighted by expected cost, not by
/// job count.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Jobs in the run.
    pub jobs: u64,
    /// Jobs settled.
    pub jobs_done: u64,
    /// Jobs currently leased (to remote workers or the local threads).
    pub jobs_leased: u64,
    /// Estimated work of the whole run.
    pub work_total: u128,
    /// Estimated work of the jobs settled.
    pub work_done: u128,
    /// Workers heard from within the last lease TTL.
    pub workers: usize,
    /// Solutions counted so far (Q(N) once complete).
    pub total_so_far: u128,
    /// True once every job is settled.
    pub complete: bool,
    /// Jobs settled in this session.
    pub jobs_done_here: u64,
    /// Estimated work settled in this session.
    pub work_done_here: u128,
}

/// The verification identity of a remote worker named `name` calling from
/// `address`: the address alone, so that one machine is one voice whatever
/// names it registers under; on loopback (one machine, as in tests) the name
/// tells its processes apart.
pub(crate) fn remote_identity(name: &str, address: Option<IpAddr>) -> String {
    match address.map(|ip| ip.to_canonical()) {
        Some(ip) if ip.is_loopback() => format!("{name}@{ip}"),
        Some(ip) => ip.to_string(),
        None => format!("{name}@unknown"),
    }
}

fn underflow() -> Error {
    Error::Uncounted
}

/// Lowers a registration count, dropping the entry at zero.
fn release_count<K: std::hash::Hash + Eq>(counts: &mut HashMap<K, u32>, key: K) {
    if let std::collections::hash_map::Entry::Occupied(mut e) = counts.entry(key) {
        *e.get_mut() -= 1;
        if *e.get() == 0 {
            e.remove();
        }
    }
}

/// Gives back a map's spare capacity once it is mostly empty (a `HashMap`
/// never shrinks by itself).
fn shrink<K: std::hash::Hash + Eq, V>(map: &mut HashMap<K, V>) {
    if map.capacity() > 4 * map.len().max(16) {
        map.shrink_to_fit();
    }
}

#[cfg(test)]
mod tick_scans;

#[cfg(test)]
mod tests;
