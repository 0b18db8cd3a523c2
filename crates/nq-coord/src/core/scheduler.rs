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
    Beaten, Identities, IdentityId, LOCAL, Policy, Rules, trusted_from_start,
};
use crate::core::tag::{Caller, Tags, caller_key};
use crate::error::{Error, Refusal, RegistrationLimit, Result};

/// Most jobs one `Lease` call can grant.
pub const MAX_GRANT: u32 = 1024;

/// Runs with at most this many jobs hand them out in exact order of work.
pub const EXACT_ORDER_UP_TO: usize = 1 << 16;

/// How many queued checks one grant looks at for one the worker may take.
const CHECK_SCAN: usize = 64;

/// Registrations one identity may hold at once: enough for a machine's
/// restarts within a few lease lifetimes, not for a flood (each one is a
/// worker record kept until it falls silent).
pub const MAX_REGISTRATIONS_PER_IDENTITY: u32 = 64;

/// Registrations one address may hold at once. Far larger than the
/// identity's limit: on loopback (one machine) every name is its own
/// identity, and the load test simulates 50,000 workers there
/// (BENCHMARKS.md). At about 200 bytes each, a full address holds about
/// 13 MB until its workers are forgotten.
pub const MAX_REGISTRATIONS_PER_ADDRESS: u32 = 1 << 16;

/// The threads assumed for a worker recognised after a restart
/// ([`Scheduler::recognize`]): its claim is not in the call. Its cap is then
/// what its identity's measured allowance says ([`MAX_GRANT`] = 4 × this):
/// the claim can only lower it, and an unknown claim must not.
const RECOGNIZED_THREADS: u32 = MAX_GRANT / 4;

/// Most jobs a restart sets aside ([`Scheduler::defer_unrecorded`]): the
/// first `Lease` call after it reads that far into the hand-out order.
pub const MAX_DEFERRED: u64 = 1 << 20;

/// The most leases a remote worker that claims `threads` threads may hold
/// at once (its measured allowance may lower it).
pub fn claimed_cap(threads: u32) -> u64 {
    u64::from(threads.saturating_mul(4).max(16))
}

/// Lease lifetimes of silence after which a worker is forgotten: its leases
/// expired long before, and it must register again to call.
const FORGET_AFTER_TTLS: u32 = 3;

use nq_store::plan::band;

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
pub struct ExactOrder {
    ids: std::vec::IntoIter<JobId>,
}

impl ExactOrder {
    /// The order of jobs `0..works.len()` with the given estimated works.
    pub fn new(works: &[u64]) -> ExactOrder {
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
pub fn other_kernel(ran: &[String]) -> KernelRequest {
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
    /// A worker registered at `now`, with nothing reported yet.
    fn new(
        name: &str,
        address: Option<IpAddr>,
        identity: IdentityId,
        threads: u32,
        now: Instant,
        local: bool,
    ) -> Worker {
        Worker {
            name: name.to_owned(),
            address,
            identity,
            threads,
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
    table: JobTable,
    /// Attempt counts of the jobs leased at least once and not settled.
    attempts: HashMap<JobId, u32>,
    /// Where fresh jobs come from.
    source: Box<dyn HandOut>,
    /// Fresh jobs set aside on a restart ([`Scheduler::defer_unrecorded`]),
    /// how many more to set aside, and until when.
    deferred: VecDeque<JobId>,
    defer_left: u64,
    deferred_until: Option<Instant>,
    /// The source's current batch, in hand-out order.
    window: VecDeque<JobId>,
    /// True once the source has given every job.
    source_drained: bool,
    /// Jobs whose lease ended (expired or released), handed out again
    /// before fresh ones: they are late.
    requeued: VecDeque<JobId>,
    /// Jobs waiting for another copy, granted before `pending`.
    checks: VecDeque<JobId>,
    /// Jobs that have copies but are not settled.
    open: HashMap<JobId, Open>,
    /// The estimated work of the jobs in `open`.
    open_work: u128,
    /// Open jobs whose valid copies disagree.
    disputed: std::collections::HashSet<JobId>,
    /// Solutions mode: jobs whose stored solutions are not the counted
    /// copy's.
    solutions_missing: std::collections::HashSet<JobId>,
    /// Settled jobs that counted one vote where a check was needed and no
    /// second machine was at work to give it.
    unchecked: JobBits,
    pending_count: u64,
    /// Jobs in [`Phase::Restoring`].
    restoring: u64,
    /// True from a restart that serves before it checked the stored copies
    /// until that check has read every job ([`Scheduler::stored_checked`]):
    /// the run is not complete before, whatever is settled.
    unchecked_store: bool,
    leases: LeaseTable,
    /// Every lease this session issued, until its job is settled.
    issued: HashMap<LeaseId, Issued>,
    /// The last lease in `issued` of each job that has one, and for each
    /// such lease the one issued before it for the same job: the leases
    /// [`Scheduler::prune_issued`] forgets when a job is settled, found
    /// without a scan.
    issued_by_job: HashMap<JobId, LeaseId>,
    issued_before: HashMap<LeaseId, LeaseId>,
    /// Jobs settled since the last [`Scheduler::prune_issued`] that have
    /// issued leases.
    settled_since_prune: Vec<JobId>,
    workers: HashMap<WorkerId, Worker>,
    /// The remote workers ordered by when they were last heard from, so
    /// that the clock's questions (who is at work, on how many machines,
    /// who to forget) cost what changed, not the number of workers.
    presence: Presence,
    /// The coordinator's own threads registered: one machine, always at
    /// work, never forgotten.
    locals: usize,
    /// The CPU threads of those registrations.
    local_threads: u32,
    /// Live registrations per identity and per address (bounded by
    /// [`MAX_REGISTRATIONS_PER_IDENTITY`] and
    /// [`MAX_REGISTRATIONS_PER_ADDRESS`]); entries leave with their workers.
    registrations: HashMap<IdentityId, u32>,
    registrations_by_address: HashMap<IpAddr, u32>,
    /// What each identity may hold, measured ([`crate::core::allowance`]).
    allowances: Allowances,
    /// Leases taken back since the caller last took this list.
    reclaimed: Vec<Reclaimed>,
    identities: Identities,
    policy: Policy,
    /// True while two machines are at work (workers heard from within one
    /// lease TTL, the local threads counting as one machine): automatic
    /// verification checks jobs only then, since a check needs a second
    /// machine, and a run whose second machine left must not wait for one.
    two_machines: bool,
    /// True when a second machine was seen at registration or lease, ahead
    /// of the ticker: the next [`Scheduler::refresh_machines`] reports the
    /// change, so that the jobs it affects are judged again.
    machines_unreported: bool,
    /// Until when two machines count as at work although fewer were heard
    /// from: set on restore when the previous session had two, because its
    /// workers reconnect with back-off and a lone early one must not settle
    /// every job unchecked before the others are back (as if each machine
    /// had been heard from at the restart).
    restored_machines_until: Option<Instant>,
    /// Remote identities that voted in earlier sessions and have not
    /// registered in this one: a run that ends soon after a restart lingers
    /// for them too, so that a worker still backing off is told the run is
    /// over instead of retrying until it gives up.
    returning: std::collections::HashSet<IdentityId>,
    /// True when the coordinator runs threads of its own
    /// ([`Scheduler::expect_local_threads`]).
    local_arbiter: bool,
    rng: rand::rngs::StdRng,
    /// The keys of the run's worker and lease ids.
    tags: Tags,
    /// Registrations recorded by earlier sessions, until their workers are
    /// recognised ([`Scheduler::expect_recorded`]).
    recorded: HashMap<WorkerId, nq_store::StoredWorker>,
    session: u64,
    next_worker: u64,
    ttl: Duration,
    closed: bool,
    tally: Tally,
    done_jobs: u64,
    done_work: u128,
    total_work: u128,
    done_here: u64,
    work_here: u128,
    confirmations: u64,
    conflicts: u64,
    expiries: u64,
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
            pending_count: jobs,
            restoring: 0,
            unchecked_store: false,
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
            open: HashMap::new(),
            open_work: 0,
            disputed: std::collections::HashSet::new(),
            solutions_missing: std::collections::HashSet::new(),
            unchecked: JobBits::default(),
            leases: LeaseTable::default(),
            issued: HashMap::new(),
            issued_by_job: HashMap::new(),
            issued_before: HashMap::new(),
            settled_since_prune: Vec::new(),
            workers: HashMap::new(),
            presence: Presence::new(ttl),
            locals: 0,
            local_threads: 0,
            registrations: HashMap::new(),
            registrations_by_address: HashMap::new(),
            allowances: Allowances::new(ttl),
            reclaimed: Vec::new(),
            identities: Identities::default(),
            policy,
            two_machines: false,
            machines_unreported: false,
            restored_machines_until: None,
            returning: std::collections::HashSet::new(),
            local_arbiter: false,
            rng: rand::rngs::StdRng::from_os_rng(),
            tags,
            recorded: HashMap::new(),
            session,
            next_worker: 1,
            ttl,
            closed: false,
            tally: Tally::default(),
            done_jobs: 0,
            done_work: 0,
            total_work,
            done_here: 0,
            work_here: 0,
            confirmations: 0,
            conflicts: 0,
            expiries: 0,
        }
    }

    /// Checks that `job` is one of the run's.
    fn known(&self, job: JobId) -> Result<()> {
        if job.0 < self.table.len {
            Ok(())
        } else {
            Err(Error::UnknownJob {
                job,
                jobs: self.table.len,
            })
        }
    }

    fn phase(&self, job: JobId) -> Option<Phase> {
        self.known(job).ok().map(|()| self.table.phase(job))
    }

    /// The verification identities of the run (for judging and reports).
    pub fn identities(&self) -> &Identities {
        &self.identities
    }

    /// The id of identity `name`, added if new (restoring stored copies).
    pub fn intern(&mut self, name: &str) -> IdentityId {
        self.identities.intern(name)
    }

    /// Records a conflict lost against `beaten`'s winners, found in stored
    /// copies (on startup).
    pub fn restore_loss(&mut self, identity: IdentityId, beaten: &Beaten) {
        self.identities.add_loss(identity, beaten);
    }

    /// Trusts the identities `names` (the operator's own machines,
    /// `--trust`): their copies decide disputes, as the coordinator's
    /// threads' do.
    pub fn trust<'a>(&mut self, names: impl IntoIterator<Item = &'a str>) {
        for name in names {
            self.identities.trust(name);
        }
    }

    /// Says whether the coordinator runs threads of its own: they are the
    /// trusted computation that settles disputes, from the start of the
    /// session (restored disputes included), before they register.
    pub fn expect_local_threads(&mut self, local: bool) {
        self.local_arbiter = local;
    }

    /// True while a trusted computation is available: the coordinator's
    /// threads, or a trusted identity with a live registration.
    fn arbiter(&self) -> bool {
        // The local threads never register; a remote worker of the local
        // identity (the operator's, see `crate::adapters::security`) does.
        self.local_arbiter
            || self
                .identities
                .trusted_ids()
                .any(|id| self.registrations.get(&id).is_some_and(|&n| n > 0))
    }

    /// The verification settings.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// What judging depends on besides a job's copies: the ban limit,
    /// probation, and whether a second machine is at work.
    pub fn rules(&self) -> Rules {
        Rules {
            ban_after: self.policy.ban_after,
            probation: self.policy.probation(),
            second_machine: self.two_machines,
            arbiter: self.arbiter(),
        }
    }

    /// Records a result of `identity` confirmed by another identity, found
    /// in stored copies (on startup).
    pub fn restore_confirmation(&mut self, identity: IdentityId) {
        self.identities.add_confirmation(identity);
    }

    /// True while two machines are at work: a check is possible.
    pub fn second_source(&self) -> bool {
        self.two_machines
    }

    /// Counts the machines at work at `now` (distinct identities of workers
    /// heard from within one lease TTL; the local threads are one machine).
    /// Returns true when that changed whether two are at work and the change
    /// matters to the jobs to check (the selection of `Fraction::Auto`, or
    /// probation, which `--verify 0` turns off): the caller then judges the
    /// affected jobs again.
    pub fn refresh_machines(&mut self, now: Instant) -> bool {
        // Once every job is settled the run is over: a machine that starts
        // then checks nothing, and must not make a complete run incomplete.
        let restoring = self.restored_machines_until.is_some_and(|t| now < t);
        let two = (self.machines_at_work(now) || restoring && self.two_machines)
            && (self.two_machines || !self.all_settled());
        let unreported = std::mem::take(&mut self.machines_unreported);
        if two == self.two_machines && !unreported {
            return false;
        }
        self.two_machines = two;
        self.policy.share(true) != self.policy.share(false) || self.policy.probation() > 0
    }

    /// Notes a second machine as soon as a worker registers or calls in,
    /// not at the next tick: copies judged in between would count unchecked,
    /// and a short run could end on them with a second machine at work. Only
    /// the start of a second machine is noted here (cheaply: only while one
    /// is at work); the ticker notes the end of one.
    fn note_machine(&mut self, now: Instant) {
        if !self.two_machines && !self.all_settled() && self.machines_at_work(now) {
            self.two_machines = true;
            self.machines_unreported = true;
        }
    }

    /// True when a second machine began since the last
    /// [`Scheduler::refresh_machines`]: jobs settled before may now be
    /// selected for a check, and are judged again once the caller learns of
    /// it from that refresh.
    pub fn selection_pending(&self) -> bool {
        self.machines_unreported
    }

    /// True when two machines are at work at `now` (see
    /// [`Scheduler::refresh_machines`]): two voices that can give a check.
    ///
    /// The coordinator's machine is one voice: its own threads, and the
    /// workers that proved to be the operator's (identity [`LOCAL`]; see
    /// `crate::adapters::security`), once heard from. Any other identity
    /// counts only while it delivers: heard from within one lease lifetime,
    /// and a copy delivered within its progress window
    /// ([`Allowances::without_progress`]). A machine that leases and never
    /// reports (a hoarder), or that has not delivered its first copy yet,
    /// cannot give the check a job would wait for, so no job waits for it
    /// (issue 26, item 1). Costs what changed since the last call plus the
    /// identities read until two deliver.
    fn machines_at_work(&mut self, now: Instant) -> bool {
        let local = self.identities.get(LOCAL);
        let allowances = &self.allowances;
        let mut local_voice = self.locals > 0;
        let mut delivering = 0;
        for id in self.presence.identities(now) {
            if Some(id) == local {
                local_voice = true;
            } else if !allowances.without_progress(id, now) {
                delivering += 1;
            }
            if delivering + usize::from(local_voice) >= 2 {
                return true;
            }
        }
        false
    }

    /// Records that `worker` called in at `now`.
    fn heard_from(&mut self, worker: &WorkerId, now: Instant) {
        if let Some(w) = self.workers.get_mut(worker) {
            let before = std::mem::replace(&mut w.last_seen, now);
            if !w.local {
                self.presence.touch(worker, w.identity, Some(before), now);
            }
        }
    }

    /// Sets whether two machines are at work (on startup at `now`: whether
    /// the stored copies came from two machines, so that jobs waiting for a
    /// check stay waiting as the previous session left them). The ticker
    /// corrects it once it sees who is at work, but not before one lease TTL
    /// has passed: the previous session's machines get the time a live one
    /// gets to call in again.
    pub fn restore_two_machines(&mut self, two: bool, now: Instant) {
        self.two_machines = two;
        self.restored_machines_until = two.then(|| now + self.ttl);
    }

    /// True when `job` is chosen for a second copy now.
    pub fn selected(&self, job: JobId) -> bool {
        self.policy.selected(job, self.second_source())
    }

    /// Jobs waiting for a check (for judging again when the selection
    /// changed).
    pub fn jobs_waiting_for_checks(&self) -> Vec<JobId> {
        self.open.keys().copied().collect()
    }

    /// The jobs in memory that `fallout` may have changed the verdict of:
    /// when the selection changed, the settled jobs now selected or left
    /// unchecked and every job waiting for a check; for identities that left
    /// probation, the jobs waiting for a check that they reported. The jobs
    /// of discredited identities are in the store, not here: the caller
    /// finds them there.
    pub fn jobs_to_judge_again(&self, fallout: &Fallout) -> Vec<JobId> {
        let mut jobs = Vec::new();
        if fallout.selection_changed {
            jobs.extend(self.unchecked_selected());
            jobs.extend(self.jobs_waiting_for_checks());
        } else if !fallout.left_probation.is_empty() {
            let left = &fallout.left_probation;
            jobs.extend(
                self.open
                    .iter()
                    .filter(|(_, o)| o.reporters.iter().any(|r| left.contains(r)))
                    .map(|(&job, _)| job),
            );
        }
        jobs
    }

    /// Sets the attempt count of a job that is not done (on startup).
    pub fn restore_attempts(&mut self, job: JobId, attempts: u32) {
        if attempts > 0 && self.known(job).is_ok() {
            self.attempts.insert(job, attempts);
        }
    }

    /// Marks pending `job` done in the store but not judged yet (a restart's
    /// state index names it done): it is not handed out until
    /// [`Scheduler::settle`] settles it or [`Scheduler::not_stored`] gives
    /// it back. Call [`Scheduler::begin_store_check`] too.
    pub fn mark_restoring(&mut self, job: JobId) {
        if self.phase(job) == Some(Phase::Pending) {
            self.table.set_phase(job, Phase::Restoring);
            self.pending_count -= 1;
            self.restoring += 1;
        }
    }

    /// True when `job` waits for the check of its stored copies.
    pub fn is_restoring(&self, job: JobId) -> bool {
        self.phase(job) == Some(Phase::Restoring)
    }

    /// Jobs waiting for the check of their stored copies.
    pub fn restoring(&self) -> u64 {
        self.restoring
    }

    /// `job` was marked restoring but the store holds no result for it (the
    /// index was wrong): it is pending again, handed out before fresh jobs.
    pub fn not_stored(&mut self, job: JobId) {
        if self.phase(job) == Some(Phase::Restoring) {
            self.table.set_phase(job, Phase::Pending);
            self.restoring -= 1;
            self.pending_count += 1;
            self.requeued.push_back(job);
        }
    }

    /// A restart serves before it checked the stored copies: the run is not
    /// complete until [`Scheduler::stored_checked`].
    pub fn begin_store_check(&mut self) {
        self.unchecked_store = true;
    }

    /// The background check has read every stored job: a run whose jobs are
    /// all settled may now complete.
    pub fn stored_checked(&mut self) {
        self.unchecked_store = false;
    }

    /// True while the stored copies of a restart are not all checked.
    pub fn store_unchecked(&self) -> bool {
        self.unchecked_store
    }

    /// Adds the confirmations and conflicts of earlier sessions.
    pub fn restore_duplicates(&mut self, confirmations: u64, conflicts: u64) {
        self.confirmations += confirmations;
        self.conflicts += conflicts;
    }

    /// Registers a remote worker, calling from `address`, and returns its new
    /// id.
    ///
    /// # Errors
    ///
    /// [`Error::Refused`] with [`Refusal::TooManyRegistrations`] when its
    /// identity or its address already holds as many live registrations as
    /// allowed.
    pub fn register(
        &mut self,
        name: &str,
        threads: u32,
        address: Option<IpAddr>,
        now: Instant,
    ) -> Result<WorkerId> {
        self.register_as(name, threads, address, None, now)
    }

    /// [`Scheduler::register`] for a caller whose calls carry `credential`
    /// (see [`crate::credentials`]): it votes as that credential, whatever
    /// its name or address, so that one credential is one voice. Without
    /// one, its address is its identity.
    ///
    /// # Errors
    ///
    /// As [`Scheduler::register`].
    pub fn register_as(
        &mut self,
        name: &str,
        threads: u32,
        address: Option<IpAddr>,
        credential: Option<&str>,
        now: Instant,
    ) -> Result<WorkerId> {
        let key = match credential {
            Some(c) => c.to_owned(),
            None => remote_identity(name, address),
        };
        let caller = caller_key(credential, address);
        let address = address.map(|ip| ip.to_canonical());
        self.within_limits(&key, address)?;
        let identity = self.identities.intern(&key);
        if let Some(ip) = address {
            let label = match credential {
                Some(c) => format!("{c} ({name}@{ip})"),
                None => format!("{name}@{ip}"),
            };
            self.identities.set_label(identity, &label);
            *self.registrations_by_address.entry(ip).or_insert(0) += 1;
        }
        *self.registrations.entry(identity).or_insert(0) += 1;
        Ok(self.add_worker(name, address, identity, threads, now, &caller))
    }

    /// Refuses one more registration of identity `key` from `address` when
    /// either already holds as many live registrations as allowed.
    fn within_limits(&self, key: &str, address: Option<IpAddr>) -> Result<()> {
        let over = |count: Option<&u32>, limit: u32| count.is_some_and(|&n| n >= limit);
        let known = self.identities.get(key);
        let refusal = if over(
            known.and_then(|id| self.registrations.get(&id)),
            MAX_REGISTRATIONS_PER_IDENTITY,
        ) {
            Some((
                RegistrationLimit::Identity,
                key.to_owned(),
                MAX_REGISTRATIONS_PER_IDENTITY,
            ))
        } else if let Some(ip) = address
            && over(
                self.registrations_by_address.get(&ip),
                MAX_REGISTRATIONS_PER_ADDRESS,
            )
        {
            Some((
                RegistrationLimit::Address,
                ip.to_string(),
                MAX_REGISTRATIONS_PER_ADDRESS,
            ))
        } else {
            None
        };
        match refusal {
            Some((per, holder, limit)) => {
                Err(Error::Refused(Refusal::TooManyRegistrations {
                    per,
                    holder,
                    limit,
                }))
            }
            None => Ok(()),
        }
    }

    /// Keeps the registrations that earlier sessions recorded (on startup),
    /// so that a worker recognised by its id ([`Scheduler::recognize`])
    /// keeps its name, its claimed threads and, on loopback where the name
    /// is part of it, its identity: its copies before and after the restart
    /// are one voice.
    pub fn expect_recorded(
        &mut self,
        workers: impl IntoIterator<Item = (WorkerId, nq_store::StoredWorker)>,
    ) {
        self.recorded.extend(workers);
    }

    /// Registers again, under its id, a remote worker of an earlier session
    /// of this run that calls after a restart: its id's tag must check out
    /// for what the call proves of its caller (its credential, else its
    /// address; see [`crate::core::tag`]), so a made-up id, or a true one
    /// used by another caller, is not. Its identity is resolved as at
    /// registration (the credential, else [`remote_identity`]), with the
    /// name and threads of its recorded registration
    /// ([`Scheduler::expect_recorded`]), else its id for a name (the call
    /// carries none) and `RECOGNIZED_THREADS`. Returns true when it was
    /// registered again; false, changing nothing, for a worker already
    /// registered, an id that does not check, or an id of this session (a
    /// worker forgotten after a silence registers again, as before).
    ///
    /// # Errors
    ///
    /// [`Refusal::TooManyRegistrations`], as [`Scheduler::register_as`]: the
    /// limits hold for workers recognised after a restart too.
    pub fn recognize(
        &mut self,
        id: &WorkerId,
        caller: &Caller,
        now: Instant,
    ) -> Result<bool> {
        if self.workers.contains_key(id) {
            return Ok(false);
        }
        let key = caller_key(caller.credential.as_deref(), caller.address);
        match self.tags.check_worker_id(id, &key) {
            Some(session) if session < self.session => {}
            _ => return Ok(false),
        }
        // Its recorded registration, if any, names it as before; the tag
        // bound the id to this caller, as the identity was at registration.
        let resolve = |name: &str| match &caller.credential {
            Some(c) => c.clone(),
            None => remote_identity(name, caller.address),
        };
        let (name, threads) = match self.recorded.remove(id) {
            Some(w) if w.identity == resolve(&w.name) => (w.name, w.threads),
            _ => (id.0.clone(), RECOGNIZED_THREADS),
        };
        let identity = resolve(&name);
        let address = caller.address.map(|ip| ip.to_canonical());
        self.within_limits(&identity, address)?;
        self.restore_worker(id.clone(), &name, &identity, address, threads, now);
        self.note_machine(now);
        Ok(true)
    }

    /// Binds a report under `lease`, unknown to this session, to what an
    /// earlier session of this run issued: when the lease id's tag checks out
    /// for (`worker`, `job`) ([`crate::core::tag`]), and `worker` is a
    /// registered remote worker of an earlier session, the lease is issued
    /// again, so that [`Scheduler::check_report`] admits the report with the
    /// usual binding rules. A pending job is leased under it again, live
    /// ([`Scheduler::restore_lease`]); for a job leased to another worker or
    /// done, the lease is kept as ended, so that the report is a late copy,
    /// as under a lease of this session that expired. Anything else changes
    /// nothing (and the report is refused as before). Returns true when the
    /// lease was recognised.
    pub fn recognize_lease(
        &mut self,
        job: JobId,
        lease: LeaseId,
        worker: &WorkerId,
        now: Instant,
    ) -> bool {
        if self.issued.contains_key(&lease) || self.known(job).is_err() {
            return false;
        }
        let Some(w) = self.workers.get(worker) else {
            return false;
        };
        if w.local
            || !self.of_earlier_session(worker)
            || !self.tags.check_lease_id(lease, worker, job)
        {
            return false;
        }
        if self.table.phase(job) == Phase::Pending {
            let attempts = self.attempts(job).saturating_add(1);
            return self.restore_lease(job, lease, worker, attempts, now);
        }
        let issued = Issued {
            job,
            worker: worker.clone(),
            identity: w.identity,
            local: false,
            granted: now,
        };
        if let Some(before) = self.issued_by_job.insert(job, lease) {
            self.issued_before.insert(lease, before);
        }
        self.issued.insert(lease, issued);
        if self.table.phase(job) == Phase::Done {
            // Forgotten at the next prune, as the leases of a job settled
            // now.
            self.settled_since_prune.push(job);
        }
        true
    }

    /// True when `id` reads as a worker id of a session before this one.
    fn of_earlier_session(&self, id: &WorkerId) -> bool {
        id.0.strip_prefix('w')
            .and_then(|rest| rest.split_once('.'))
            .and_then(|(session, _)| session.parse::<u64>().ok())
            .is_some_and(|session| session < self.session)
    }

    /// Registers again, under its id `id` of an earlier session, a remote
    /// worker whose leases a restart keeps (see
    /// [`Scheduler::restore_lease`]): its identity is the stored
    /// `identity` string, so that its votes and its cap are the same
    /// identity's as before. A worker id already registered is left alone.
    pub fn restore_worker(
        &mut self,
        id: WorkerId,
        name: &str,
        identity: &str,
        address: Option<IpAddr>,
        threads: u32,
        now: Instant,
    ) {
        if self.workers.contains_key(&id) {
            return;
        }
        let identity = self.identities.intern(identity);
        let address = address.map(|ip| ip.to_canonical());
        if let Some(ip) = address {
            *self.registrations_by_address.entry(ip).or_insert(0) += 1;
        }
        *self.registrations.entry(identity).or_insert(0) += 1;
        self.returning.remove(&identity);
        self.presence.touch(&id, identity, None, now);
        let worker = Worker::new(name, address, identity, threads, now, false);
        self.workers.insert(id, worker);
    }

    /// Restores a lease `lease` of an earlier session on `job`, held by
    /// `worker` (registered again with [`Scheduler::restore_worker`]), with
    /// a fresh lifetime from `now`: a report under it is then admitted with
    /// the same binding rules as under a lease of this session (this
    /// worker, this job). Returns false, restoring nothing, when the job is
    /// not pending (done, or leased already), the lease id is taken, or the
    /// worker is unknown.
    pub fn restore_lease(
        &mut self,
        job: JobId,
        lease: LeaseId,
        worker: &WorkerId,
        attempts: u32,
        now: Instant,
    ) -> bool {
        let Some(identity) = self.workers.get(worker).map(|w| w.identity) else {
            return false;
        };
        if self.phase(job) != Some(Phase::Pending)
            || lease.0 == 0
            || self.issued.contains_key(&lease)
        {
            return false;
        }
        self.attempts.insert(job, attempts.max(1));
        let issued = Issued {
            job,
            worker: worker.clone(),
            identity,
            local: false,
            granted: now,
        };
        self.issue(lease, issued, now + self.ttl);
        true
    }

    /// Leases pending `issued.job` under `lease` until `deadline`: the job
    /// is leased, the lease live and bound to its worker and job.
    fn issue(&mut self, lease: LeaseId, issued: Issued, deadline: Instant) {
        let job = issued.job;
        self.table.set_phase(job, Phase::Leased);
        self.pending_count -= 1;
        self.leases.insert(Lease {
            id: lease,
            job,
            worker: issued.worker.clone(),
            identity: issued.identity,
            granted: issued.granted,
            deadline,
        });
        if let Some(before) = self.issued_by_job.insert(job, lease) {
            self.issued_before.insert(lease, before);
        }
        self.issued.insert(lease, issued);
    }

    /// Registers the coordinator's own threads. They lease like a remote
    /// worker but are not counted among the workers to tell that the run is
    /// over, and they are one identity, [`LOCAL`], whatever kernel they run:
    /// one machine is one voice.
    pub fn register_local(&mut self, threads: u32, now: Instant) -> WorkerId {
        let identity = self.identities.intern(LOCAL);
        self.local_arbiter = true;
        self.local_threads = self.local_threads.saturating_add(threads);
        self.add_worker("local", None, identity, threads, now, "local")
    }

    /// Adds a registration of `caller` ([`caller_key`]; `"local"` for the
    /// coordinator's own threads).
    fn add_worker(
        &mut self,
        name: &str,
        address: Option<IpAddr>,
        identity: IdentityId,
        threads: u32,
        now: Instant,
        caller: &str,
    ) -> WorkerId {
        let local = caller == "local";
        if !local {
            self.returning.remove(&identity);
        }
        // The session and a sequence number for people, and a MAC of both
        // and the caller under the run's key, so that an id can neither be
        // guessed (and used to renew or report under another worker's
        // leases), nor pass in another run, nor from another caller; and so
        // that a restarted coordinator recognises it ([`Scheduler::recognize`]).
        let id = self.tags.worker_id(self.session, self.next_worker, caller);
        self.next_worker += 1;
        if local {
            self.locals += 1;
        } else {
            self.presence.touch(&id, identity, None, now);
        }
        let worker = Worker::new(name, address, identity, threads, now, local);
        self.workers.insert(id.clone(), worker);
        self.note_machine(now);
        id
    }

    /// A registered worker.
    pub fn worker(&self, id: &WorkerId) -> Option<&Worker> {
        self.workers.get(id)
    }

    /// Every registered worker.
    pub fn workers(&self) -> impl Iterator<Item = (&WorkerId, &Worker)> {
        self.workers.iter()
    }

    /// Refuses a banned worker.
    fn admit(&self, worker: &WorkerId) -> Result<&Worker> {
        let w = self
            .workers
            .get(worker)
            .ok_or_else(|| Error::UnknownWorker {
                worker: worker.0.clone(),
            })?;
        let lost = self.identities.lost(w.identity);
        if !w.local && self.identities.is_banned(w.identity, self.policy.ban_after) {
            return Err(Error::Refused(Refusal::Banned {
                identity: self.identities.name(w.identity).to_owned(),
                lost,
            }));
        }
        Ok(w)
    }

    /// The heartbeat: renews every lease in `held` that `worker` still holds,
    /// reports the others as revoked, and grants up to `want` new jobs. A
    /// remote worker's identity holds at most its measured allowance over all
    /// its registrations ([`crate::core::allowance`]; the claimed threads,
    /// `max(16, 4 × threads)`, can only lower it); the local threads hold at
    /// most `max(16, 4 × threads)`. Nothing is granted when the scheduler is
    /// closed. Jobs waiting for a check go first, to workers that have not
    /// reported them. A caller that gets nothing because every job not done
    /// is leased takes back the excess of identities above their fair share
    /// (see [`Scheduler::take_reclaimed`]).
    ///
    /// Call [`Scheduler::expire`] before, so that late leases are reissued.
    ///
    /// # Errors
    ///
    /// [`Error::UnknownWorker`] when `worker` is not registered in this
    /// session; [`Error::Refused`] when it is banned.
    pub fn lease(
        &mut self,
        worker: &WorkerId,
        want: u32,
        held: &[LeaseId],
        now: Instant,
    ) -> Result<Grant> {
        let deadline = now + self.ttl;
        let complete = self.is_complete();
        let (threads, identity, local) = {
            let w = self.admit(worker)?;
            (w.threads, w.identity, w.local)
        };
        self.heard_from(worker, now);
        if complete {
            self.mark_told(worker);
        }
        self.note_machine(now);
        // `threads` is whatever the worker registered with: saturate, never
        // overflow (found by tests/fuzz_messages.rs).
        let claimed = claimed_cap(threads) as usize;
        let mut grant = Grant {
            run_complete: complete,
            ..Grant::default()
        };
        let mut renewed = 0;
        // A worker of an earlier session may hold leases that session issued
        // and never recorded: their jobs are not in the call, so they cannot
        // be checked here; its report under them decides
        // ([`Scheduler::recognize_lease`]). Only the leases this session
        // knows to have ended are revoked to it.
        let earlier = !local && self.of_earlier_session(worker);
        for &id in held {
            if self.leases.renew(id, worker, deadline) {
                renewed += 1;
                if self.leases.review(id).is_none() {
                    self.schedule_review(id); // see `reclaim_overdue`
                }
            } else if !earlier || self.issued.contains_key(&id) {
                grant.revoked.push(id);
            }
        }
        if self.closed || complete {
            return Ok(grant);
        }
        // The local threads are trusted and lease for themselves; a remote
        // identity's cap counts every lease it holds, under any of its
        // registrations, renewed in this call or not.
        let room = if local {
            claimed.saturating_sub(renewed)
        } else {
            let cap = claimed.min(self.allowances.cap(identity, now));
            cap.saturating_sub(self.leases.held_by_identity(identity))
        };
        let want = (want.min(MAX_GRANT) as usize).min(room);
        self.fill(worker, identity, local, want, now, &mut grant)?;
        // A stalled identity claims no share of the others' leases.
        if grant.jobs.is_empty()
            && want > 0
            && (local || !self.allowances.is_stalled(identity))
            && self.take_back_excess(identity, now)
        {
            self.fill(worker, identity, local, want, now, &mut grant)?;
        }
        grant.starved = want > 0 && grant.jobs.is_empty();
        Ok(grant)
    }

    /// Grants `worker` new jobs until `grant` holds `want` or none is left.
    fn fill(
        &mut self,
        worker: &WorkerId,
        identity: IdentityId,
        local: bool,
        want: usize,
        now: Instant,
        grant: &mut Grant,
    ) -> Result<()> {
        let deadline = now + self.ttl;
        while grant.jobs.len() < want {
            let Some((job, identity, kernel)) = self.next_job(identity, local)? else {
                break;
            };
            let Some(lease) = self.fresh_lease_id(worker, job) else {
                // Every nonce of this job and worker is on record: it goes
                // back to the front of its queue, for another worker.
                if self.open.contains_key(&job) {
                    self.checks.push_front(job);
                } else {
                    self.requeued.push_front(job);
                }
                break;
            };
            let attempts = self.attempts.entry(job).or_insert(0);
            *attempts = attempts.saturating_add(1);
            let attempts = *attempts;
            let issued = Issued {
                job,
                worker: worker.clone(),
                identity,
                local,
                granted: now,
            };
            self.issue(lease, issued, deadline);
            grant.jobs.push(Granted {
                job,
                lease,
                attempts,
                deadline,
                kernel,
            });
        }
        Ok(())
    }

    /// Fair share: `asker` got no job because every job not done is
    /// leased. Takes back, from each remote identity holding more than its
    /// share of the live leases (none, for an identity without progress),
    /// its excess among the leases it was granted at least a lease lifetime
    /// ago (work just started is not thrown away), the most recently granted
    /// first. Returns true when any job went back to the queue.
    fn take_back_excess(&mut self, asker: IdentityId, now: Instant) -> bool {
        let holders: Vec<(IdentityId, usize)> = self.leases.holders().collect();
        let askers =
            holders.len() + usize::from(!holders.iter().any(|&(i, _)| i == asker));
        let share = fair_share(self.leases.len(), askers);
        let mut victims: Vec<(Lease, TakenBack)> = Vec::new();
        for (holder, held) in holders {
            // An identity that delivered nothing lately has no share while
            // others wait.
            let keep = if self.allowances.without_progress(holder, now) {
                0
            } else {
                share
            };
            if holder == asker || held <= keep || self.is_local_identity(holder) {
                continue;
            }
            let mut old: Vec<&Lease> = (self.leases.held_by(holder))
                .filter_map(|id| self.leases.get(id))
                .filter(|l| l.granted + self.ttl <= now)
                .collect();
            old.sort_by_key(|l| std::cmp::Reverse((l.granted, l.job)));
            victims.extend(
                old.into_iter()
                    .take(held - keep)
                    .map(|l| (l.clone(), TakenBack::OverShare)),
            );
        }
        let any = !victims.is_empty();
        for (lease, reason) in victims {
            self.take_back(lease, reason, now);
        }
        any
    }

    /// Ends a live lease before its deadline and reissues its job; records
    /// it for [`Scheduler::take_reclaimed`].
    fn take_back(&mut self, lease: Lease, reason: TakenBack, now: Instant) {
        if self.leases.remove(lease.id).is_none() {
            return;
        }
        self.requeue(lease.job);
        let stalled = self.allowances.note_revoked(lease.identity, now);
        let name = match self.workers.get_mut(&lease.worker) {
            Some(w) => {
                w.leases_taken_back += 1;
                w.name.clone()
            }
            None => String::new(),
        };
        self.reclaimed.push(Reclaimed {
            identity: self.identities.label(lease.identity).to_owned(),
            lease,
            reason,
            name,
            stalled,
        });
    }

    /// Takes back every remote lease held far past the time its holder was
    /// measured to need ([`crate::core::allowance`]); their jobs are
    /// reissued. Call it with [`Scheduler::expire`], on the clock's tick.
    ///
    /// Costs what comes due, not what is live: each renewed remote lease
    /// has a review time in the lease table, when it becomes overdue if its
    /// holder's measured time does not grow meanwhile. A lease never renewed
    /// needs none: it expires one lease lifetime after its grant, before it
    /// can be overdue (more than [`crate::core::allowance::OVERDUE_TTLS`]
    /// lifetimes), and [`Scheduler::expire`] runs first. A lease reviewed
    /// early (the time grew) gets its new review time. A review time can
    /// only be late when the time got shorter, which happens at an
    /// identity's first copy or the session's first, and
    /// [`Scheduler::note_copy`] sets those leases' review times again.
    pub fn reclaim_overdue(&mut self, now: Instant) {
        for id in self.leases.take_due_for_review(now) {
            let Some(lease) = self.leases.get(id) else {
                continue;
            };
            match self.review_time(lease) {
                Some(at) if at < now => {
                    let lease = lease.clone();
                    self.take_back(lease, TakenBack::Overdue, now);
                }
                at => {
                    self.leases.set_review(id, at);
                }
            }
        }
    }

    /// When live lease `lease` becomes overdue as its holder's time is
    /// measured now: `None` for the local threads' leases (exempt) and
    /// while nothing is measured.
    fn review_time(&self, lease: &Lease) -> Option<Instant> {
        if self.is_local_identity(lease.identity) {
            return None;
        }
        let limit = self.allowances.overdue_after(lease.identity)?;
        lease.granted.checked_add(limit)
    }

    /// Sets the review time of live lease `id` from its holder's measured
    /// time now, if it was renewed (see [`Scheduler::reclaim_overdue`]).
    fn schedule_review(&mut self, id: LeaseId) {
        if !self.leases.is_renewed(id) {
            return;
        }
        let at = self.leases.get(id).and_then(|l| self.review_time(l));
        self.leases.set_review(id, at);
    }

    /// Every live lease, in no particular order.
    pub fn live_leases(&self) -> impl Iterator<Item = &Lease> {
        self.leases.iter()
    }

    /// The leases taken back since the last call, for the log and metrics.
    pub fn take_reclaimed(&mut self) -> Vec<Reclaimed> {
        std::mem::take(&mut self.reclaimed)
    }

    /// True for the identities of the coordinator's own threads.
    fn is_local_identity(&self, identity: IdentityId) -> bool {
        trusted_from_start(self.identities.name(identity))
    }

    /// The allowances of the identities (for displays and tests).
    pub fn allowances(&self) -> &Allowances {
        &self.allowances
    }

    /// A lease id for `job` granted to `worker` ([`Tags::lease_id`], with
    /// a random nonce) not issued before in this session; `None` when all
    /// 65,536 nonces are on record (a job granted to one worker that often
    /// without being settled).
    fn fresh_lease_id(&mut self, worker: &WorkerId, job: JobId) -> Option<LeaseId> {
        let start: u16 = self.rng.random();
        (0..=u16::MAX)
            .map(|i| self.tags.lease_id(worker, job, start.wrapping_add(i)))
            .find(|id| id.0 != 0 && !self.issued.contains_key(id))
    }

    /// The next job `identity` may compute, with the identity it computes
    /// under and the kernel to ask for. A job waiting for a trusted copy
    /// goes only to a trusted identity while one is available; the local
    /// threads may check their own copy on a kernel no copy ran.
    ///
    /// An untrusted worker is never told which kernel to run: first copies
    /// and checks then ask alike, and it cannot tell a check from a first
    /// copy by its lease. Kernel diversity comes from the trusted side, which
    /// settles a dispute on a kernel none of the copies ran.
    fn next_job(
        &mut self,
        identity: IdentityId,
        local: bool,
    ) -> Result<Option<(JobId, IdentityId, KernelRequest)>> {
        let trusted = local || self.identities.is_trusted(identity);
        let arbiter = self.arbiter();
        // A stalled identity (a lease was taken back from it while it
        // delivered nothing) gets no check: its copy is unlikely to come,
        // and two of them would pass the job to and fro between them by
        // fair share while the copy it waits for never comes.
        let may_check = trusted || !self.allowances.is_stalled(identity);
        let mut scanned = 0;
        let mut i = 0;
        while may_check && i < self.checks.len() && scanned < CHECK_SCAN {
            let job = self.checks[i];
            let Some(open) = self.open.get(&job) else {
                self.checks.remove(i); // settled meanwhile
                continue;
            };
            if self.table.phase(job) != Phase::Pending {
                self.checks.remove(i); // leased again, or done
                continue;
            }
            scanned += 1;
            let reported = open.reporters.contains(&identity);
            let choice = if open.trusted_only && arbiter && !trusted {
                None
            } else if local {
                local_choice(&open.kernels, reported)
            } else if trusted && reported {
                self_check(&open.kernels)
            } else if trusted {
                Some(other_kernel(&open.kernels))
            } else {
                (!reported).then_some(KernelRequest::Any)
            };
            if let Some(kernel) = choice {
                self.checks.remove(i);
                return Ok(Some((job, identity, kernel)));
            }
            i += 1;
        }
        let smallest = !trusted && self.checked_from_the_small_end(identity);
        while let Some(job) = self.next_pending(smallest)? {
            if self.table.phase(job) != Phase::Pending || self.open.contains_key(&job) {
                continue; // done by a late result, or waiting in `checks`
            }
            return Ok(Some((job, identity, KernelRequest::Any)));
        }
        Ok(None)
    }

    /// True when the untrusted `identity` should take its jobs from the
    /// small end of the hand-out order: while it is on probation and another
    /// voice could check it (the trusted side, or another identity
    /// registered that is not stalled). Every copy of a probationer waits
    /// for a second one, and its first copies are those checked: from the
    /// large end, two new machines would compute the run's heaviest jobs
    /// twice (at N = 18 the first dozen jobs hold most of the work), where
    /// probation is meant to cost a few small checks (issue 26, item 3).
    /// Alone it keeps the large end, since nobody can check it and its
    /// largest jobs should not be the run's tail.
    fn checked_from_the_small_end(&self, identity: IdentityId) -> bool {
        let probation = self.policy.probation();
        probation > 0
            && self.identities.on_probation(identity, probation)
            && (self.arbiter()
                || self.registrations.iter().any(|(&other, &n)| {
                    other != identity && n > 0 && !self.allowances.is_stalled(other)
                }))
    }

    /// The next candidate for a fresh grant: a requeued job, else the next
    /// job of the hand-out order (read from the source a batch at a time),
    /// from the small end of what was read when `smallest`. The first fresh
    /// pending jobs of a restarted session are set aside (see
    /// [`Scheduler::defer_unrecorded`]) and come only once no other is left.
    fn next_pending(&mut self, smallest: bool) -> Result<Option<JobId>> {
        if let Some(job) = self.requeued.pop_front() {
            return Ok(Some(job));
        }
        loop {
            while self.window.is_empty() && !self.source_drained {
                let batch = self.source.next_batch()?;
                self.source_drained = batch.is_empty();
                self.window.extend(batch);
            }
            let next = if smallest {
                self.window.pop_back()
            } else {
                self.window.pop_front()
            };
            let Some(job) = next else {
                return Ok(self.deferred.pop_front());
            };
            let pending = self.table.phase(job) == Phase::Pending;
            // The jobs set aside are the first of the order: the small end
            // holds none of them.
            if !smallest
                && self.defer_left > 0
                && pending
                && !self.open.contains_key(&job)
            {
                self.defer_left -= 1;
                self.deferred.push_back(job);
                continue;
            }
            return Ok(Some(job));
        }
    }

    /// On a restart (at `now`): sets aside the first `leases` fresh pending
    /// jobs of the hand-out order, at most [`MAX_DEFERRED`], for one lease
    /// lifetime or until no other job is left. A lease granted in the
    /// second before a crash has no record, so its job is pending again, and
    /// since the hand-out follows one order, the jobs of such leases are
    /// the first pending ones: handed out at once, another worker would
    /// compute them before their holders report them (recognised by their
    /// ids, [`Scheduler::recognize_lease`]). `leases` bounds the leases that
    /// were live at the crash (the caller sums the lease caps of the
    /// recorded workers); the order of the rest is unchanged.
    pub fn defer_unrecorded(&mut self, leases: u64, now: Instant) {
        self.defer_left = leases.min(MAX_DEFERRED);
        self.deferred_until = (self.defer_left > 0).then(|| now + self.ttl);
    }

    /// Ends the set-aside of [`Scheduler::defer_unrecorded`] at its time:
    /// the jobs still pending go to the front of the queue, like expired
    /// leases' jobs.
    fn end_deferral(&mut self, now: Instant) {
        if self.deferred_until.is_none_or(|t| now < t) {
            return;
        }
        self.deferred_until = None;
        self.defer_left = 0;
        while let Some(job) = self.deferred.pop_back() {
            self.requeued.push_front(job);
        }
    }

    /// Takes back leases that `worker` hands in; their jobs go to the front of
    /// their queue. Unknown, expired or foreign leases are ignored. Returns the
    /// jobs released.
    pub fn release(
        &mut self,
        worker: &WorkerId,
        leases: &[LeaseId],
        now: Instant,
    ) -> Vec<JobId> {
        self.heard_from(worker, now);
        let mut out = vec![];
        for &id in leases {
            if self.leases.get(id).is_some_and(|l| l.worker == *worker) {
                let lease = self.leases.remove(id).expect("just checked");
                self.requeue(lease.job);
                out.push(lease.job);
            }
        }
        out
    }

    /// Expires every lease whose deadline is before `now`; their jobs go to
    /// the front of their queue. Returns the expired leases.
    pub fn expire(&mut self, now: Instant) -> Vec<Lease> {
        self.end_deferral(now);
        let expired = self.leases.expire(now);
        self.expiries += expired.len() as u64;
        // Pushed to the front in reverse, so the oldest grant is reissued first.
        for lease in expired.iter().rev() {
            self.requeue(lease.job);
        }
        expired
    }

    /// Puts a job whose live lease just ended back in its queue.
    fn requeue(&mut self, job: JobId) {
        if self.table.phase(job) == Phase::Leased {
            self.table.set_phase(job, Phase::Pending);
            self.pending_count += 1;
            if self.open.contains_key(&job) {
                self.checks.push_front(job);
            } else {
                self.requeued.push_front(job);
            }
        }
    }

    /// Binds a report to its lease: `lease` must have been issued in this
    /// session, to `worker`, for `job`, and the worker must not be banned.
    /// Returns the lease as issued.
    ///
    /// # Errors
    ///
    /// [`Error::UnknownJob`]; [`Error::Refused`] naming what does not match.
    pub fn check_report(
        &self,
        job: JobId,
        lease: LeaseId,
        worker: &WorkerId,
    ) -> Result<Issued> {
        self.known(job)?;
        let refuse = |r| Err(Error::Refused(r));
        let Some(issued) = self.issued.get(&lease) else {
            return refuse(Refusal::UnknownLease { lease });
        };
        if issued.job != job {
            return refuse(Refusal::LeaseOfAnotherJob {
                lease,
                job,
                leased: issued.job,
            });
        }
        if issued.worker != *worker {
            return refuse(Refusal::LeaseOfAnotherWorker { lease });
        }
        if !issued.local
            && self
                .identities
                .is_banned(issued.identity, self.policy.ban_after)
        {
            return refuse(Refusal::Banned {
                identity: self.identities.name(issued.identity).to_owned(),
                lost: self.identities.lost(issued.identity),
            });
        }
        Ok(issued.clone())
    }

    /// True when `lease` was issued in this session and is no longer live
    /// (expired, released, or taken back): a copy under it is late.
    pub fn is_late(&self, lease: LeaseId) -> bool {
        self.issued.contains_key(&lease) && self.leases.get(lease).is_none()
    }

    /// True when `lease` is live (granted, not expired, released or done).
    pub fn is_live(&self, lease: LeaseId) -> bool {
        self.leases.get(lease).is_some()
    }

    /// True when `job` is settled: its result counts and needs no copy.
    pub fn is_done(&self, job: JobId) -> bool {
        self.phase(job) == Some(Phase::Done)
    }

    /// True when a copy of `job` counts in the totals.
    pub fn is_counted(&self, job: JobId) -> bool {
        self.known(job).is_ok() && self.table.flag(job, COUNTED)
    }

    /// Solutions mode: true when the next copy of `job` must store its
    /// solutions (no copy counts yet, or the counted copy's solutions are not
    /// the stored ones).
    pub fn wants_solutions(&self, job: JobId) -> bool {
        !self.is_counted(job) || self.solutions_missing.contains(&job)
    }

    /// How many times `job` was leased (0 for a settled job: its record
    /// holds the count).
    pub fn attempts(&self, job: JobId) -> u32 {
        self.attempts.get(&job).copied().unwrap_or(0)
    }

    /// Settled jobs with a single vote that the current selection wants
    /// checked (after the selection grew), and those that settled without
    /// the check they needed (unchecked: a second machine may now give it).
    /// A scan of the whole table, run only when a second machine starts or
    /// stops working.
    pub fn unchecked_selected(&self) -> Vec<JobId> {
        (0..self.table.len)
            .map(JobId)
            .filter(|&j| {
                self.table.phase(j) == Phase::Done
                    && !self.table.flag(j, VERIFIED)
                    && (self.unchecked.get(j) || self.selected(j))
            })
            .collect()
    }

    /// True when `job` settled on one vote where a check was needed that no
    /// second machine was at work to give.
    pub fn is_unchecked(&self, job: JobId) -> bool {
        self.unchecked.get(job)
    }

    /// Settled jobs that counted one vote where a check was needed that no
    /// second machine was at work to give (see [`crate::quorum`], "One
    /// machine left"). A run that completes with any is `unchecked`.
    pub fn jobs_unchecked(&self) -> u64 {
        self.unchecked.ones
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
            && self.leases.get(lease).is_some_and(|l| l.job == s.job)
        {
            self.leases.remove(lease);
            if self.table.phase(s.job) == Phase::Leased {
                self.table.set_phase(s.job, Phase::Pending);
                self.pending_count += 1;
            }
        }
        let phase = self.table.phase(s.job);
        let mut tally = self.tally;
        if let Some(before) = &s.counted_before {
            tally.total = tally
                .total
                .checked_sub(before.total)
                .ok_or_else(underflow)?;
            tally.burnside = tally
                .burnside
                .checked_sub(before.burnside)
                .ok_or_else(underflow)?;
        }
        if let Some(now) = &s.counted {
            tally.merge(now).map_err(Error::Inconsistent)?;
        }
        self.tally = tally;
        let was_done = phase == Phase::Done;
        if phase == Phase::Restoring {
            // Judged now: settled below, or pending for another copy.
            self.restoring -= 1;
            if !s.settled {
                self.table.set_phase(s.job, Phase::Pending);
                self.pending_count += 1;
                self.checks.push_back(s.job);
            }
        }
        self.table.set_flag(s.job, COUNTED, s.counted.is_some());
        self.table.set_flag(s.job, VERIFIED, s.votes >= 2);
        let work = u128::from(s.work);
        if s.settled {
            if !was_done {
                if phase == Phase::Pending {
                    self.pending_count -= 1;
                }
                self.table.set_phase(s.job, Phase::Done);
                self.note_settled(s.job);
                self.attempts.remove(&s.job);
                self.leases.remove_job(s.job);
                self.close_open(s.job);
                self.done_jobs += 1;
                self.done_work += work;
                if here {
                    self.done_here += 1;
                    self.work_here += work;
                }
            }
        } else {
            self.hold_open(s);
            if was_done {
                self.done_jobs -= 1;
                self.done_work -= work;
                self.table.set_phase(s.job, Phase::Pending);
                self.attempts.insert(s.job, s.attempts);
                self.pending_count += 1;
                self.checks.push_back(s.job);
            } else if phase == Phase::Pending {
                // Not leased (or its lease just ended): wait for a check.
                self.checks.push_back(s.job);
            }
        }
        if s.disputed && !s.settled {
            self.disputed.insert(s.job);
        } else {
            self.disputed.remove(&s.job);
        }
        if s.solutions_missing {
            self.solutions_missing.insert(s.job);
        } else {
            self.solutions_missing.remove(&s.job);
        }
        self.unchecked
            .set(s.job, self.table.len, s.settled && s.unchecked);
        let mut left = Vec::new();
        if s.settled && !was_done {
            // Once per settlement of the job: a job settled again after it
            // was reopened (a voter discredited) counts again, which only
            // shortens a probation that its voters' losses already weighed.
            let probation = self.policy.probation();
            for &c in &s.confirmed {
                if self.identities.add_confirmation(c) == probation && probation > 0 {
                    left.push(c);
                }
            }
        }
        let mut fallout = self.charge_losses(&s.losers, &s.beaten);
        fallout.left_probation = left;
        Ok(fallout)
    }

    /// Charges a settled dispute's `losers` with a conflict lost against
    /// `beaten`'s winners each; says who was discredited by it (a first
    /// loss, or a ban).
    fn charge_losses(&mut self, losers: &[IdentityId], beaten: &Beaten) -> Fallout {
        let mut fallout = Fallout::default();
        let ban_after = self.policy.ban_after;
        for &loser in losers {
            let was_banned = self.identities.is_banned(loser, ban_after);
            let lost = self.identities.add_loss(loser, beaten);
            let banned = !was_banned && self.identities.is_banned(loser, ban_after);
            if lost == 1 || banned {
                fallout.discredited.push(loser);
            }
            if banned {
                // A banned worker's leases end now: its jobs go to others at
                // once instead of when the leases would have expired.
                let workers = &self.workers;
                let revoked = self.leases.remove_held_by(|w| {
                    workers
                        .get(w)
                        .is_some_and(|w| !w.local && w.identity == loser)
                });
                for lease in revoked.iter().rev() {
                    self.requeue(lease.job);
                }
            }
        }
        fallout
    }

    /// Counts a stored copy of a job of estimated `work` (any outcome),
    /// made under `lease`, towards `worker`'s throughput and its identity's
    /// allowance ([`crate::core::allowance`]), at `now`. Call it once per
    /// acknowledged report; an unknown worker (pruned meanwhile) or a lease
    /// already forgotten counts for nothing.
    pub fn note_copy(
        &mut self,
        worker: &WorkerId,
        lease: LeaseId,
        work: u64,
        now: Instant,
    ) {
        if let Some(w) = self.workers.get_mut(worker) {
            w.jobs_reported += 1;
            w.work_reported += u128::from(work);
        }
        if let Some(i) = self.issued.get(&lease)
            && !i.local
        {
            let held = now.saturating_duration_since(i.granted);
            let identity = i.identity;
            let before = (
                self.allowances.expected(identity),
                self.allowances.longest(),
            );
            self.allowances.note_copy(identity, held, now);
            self.review_sooner(identity, before);
            // A first delivery may make a second machine at work.
            self.note_machine(now);
        }
    }

    /// Sets again the review times that a copy of `identity` made too late
    /// (see [`Scheduler::reclaim_overdue`]); `before` is the identity's
    /// expected time and the session's longest before the copy. Later
    /// review times need nothing: a lease reviewed early is scheduled
    /// again.
    fn review_sooner(&mut self, identity: IdentityId, before: (Duration, Duration)) {
        let (expected, longest) = before;
        let ids: Vec<LeaseId> =
            if longest.is_zero() && !self.allowances.longest().is_zero() {
                // The session's first measurement: every renewed lease gets
                // a review time (once per session).
                self.leases.iter().map(|l| l.id).collect()
            } else if self.allowances.expected(identity) < expected {
                // The identity's first copy, shorter than the longest: only its
                // leases, at most its starting cap.
                self.leases.held_by(identity).collect()
            } else {
                return;
            };
        for id in ids {
            self.schedule_review(id);
        }
    }

    /// Counts an outcome of a copy (for the report).
    pub fn note_outcome(&mut self, outcome: Outcome) {
        match outcome {
            Outcome::Accepted => {}
            Outcome::Confirmed => self.confirmations += 1,
            Outcome::Conflict => self.conflicts += 1,
        }
    }

    /// Forgets issued leases of settled jobs: no report under them can
    /// change anything any more, and a run's leases would otherwise grow
    /// memory without bound.
    ///
    /// Costs what was settled since the last call, not what was issued:
    /// only the jobs settled meanwhile are looked at, and those still
    /// settled (not reopened for a check) lose their issued leases.
    pub fn prune_issued(&mut self) {
        for job in std::mem::take(&mut self.settled_since_prune) {
            if self.table.phase(job) != Phase::Done {
                continue; // reopened; listed again when settled again
            }
            let mut next = self.issued_by_job.remove(&job);
            while let Some(id) = next {
                self.issued.remove(&id);
                next = self.issued_before.remove(&id);
            }
        }
    }

    /// Lists `job`, just settled, for [`Scheduler::prune_issued`] if it has
    /// issued leases (the jobs restored as settled have none).
    fn note_settled(&mut self, job: JobId) {
        if self.issued_by_job.contains_key(&job) {
            self.settled_since_prune.push(job);
        }
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
            && !self.unchecked_store
            && !(self.two_machines && self.unchecked.ones > 0)
    }

    /// True when every job is settled (checked or not).
    fn all_settled(&self) -> bool {
        self.done_jobs == self.table.len
    }

    /// The totals of the counted copies.
    pub fn tally(&self) -> Tally {
        self.tally
    }

    /// Number of jobs in the run.
    pub fn jobs(&self) -> u64 {
        self.table.len
    }

    /// Number of jobs settled.
    pub fn jobs_done(&self) -> u64 {
        self.done_jobs
    }

    /// Number of jobs waiting for a worker.
    pub fn jobs_pending(&self) -> u64 {
        self.pending_count
    }

    /// Jobs with copies that wait for another one.
    pub fn jobs_in_check(&self) -> u64 {
        self.open.len() as u64
    }

    /// Jobs whose copies disagree and that wait for a copy to decide.
    pub fn jobs_disputed(&self) -> u64 {
        self.disputed.len() as u64
    }

    /// Copies that agreed with the counted one (all sessions).
    pub fn confirmations(&self) -> u64 {
        self.confirmations
    }

    /// Copies that disagreed (all sessions).
    pub fn conflicts(&self) -> u64 {
        self.conflicts
    }

    /// Leases that expired in this session.
    pub fn expiries(&self) -> u64 {
        self.expiries
    }

    /// The lease lifetime.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Remote workers heard from within one lease TTL before `now`.
    /// Costs what changed since the last tick, not the number of workers.
    pub fn active_workers(&self, now: Instant) -> usize {
        self.presence.at_work(now)
    }

    /// Notes the remote identities that voted in earlier sessions (on
    /// restore): until each registers again, [`Scheduler::not_back`] counts
    /// it.
    pub fn expect_back<'a>(&mut self, identities: impl IntoIterator<Item = &'a str>) {
        for name in identities {
            let id = self.identities.intern(name);
            self.returning.insert(id);
        }
    }

    /// Remote identities of earlier sessions that have not registered in
    /// this one. The coordinator lingers for them as for untold workers
    /// (within the same cap).
    pub fn not_back(&self) -> usize {
        self.returning.len()
    }

    /// Remote workers heard from within one lease TTL that have not yet been
    /// told the run is complete. The coordinator lingers until this is 0.
    pub fn untold_workers(&self, now: Instant) -> usize {
        self.workers
            .values()
            .filter(|w| {
                !w.local
                    && !w.told_complete
                    && now.saturating_duration_since(w.last_seen) <= self.ttl
            })
            .count()
    }

    /// Records that `worker` was told the run is complete (in a report ack).
    pub fn mark_told(&mut self, worker: &WorkerId) {
        if let Some(w) = self.workers.get_mut(worker) {
            w.told_complete = true;
        }
    }

    /// Forgets workers not heard from for three lease TTLs
    /// (their leases expired long before): their registrations, and the
    /// allowances of identities left with no worker and no lease, so that
    /// churn does not grow memory. A forgotten worker that calls again is
    /// told to register again.
    ///
    /// Costs what is forgotten, not the number of workers (`Presence`).
    pub fn prune_workers(&mut self, now: Instant) {
        let Some(horizon) = now.checked_sub(self.ttl * FORGET_AFTER_TTLS) else {
            return; // nobody was heard from before the clock's start
        };
        let gone = self.presence.silent_since(horizon);
        if gone.is_empty() {
            return;
        }
        for id in &gone {
            self.forget_worker(id);
        }
        let (registrations, leases) = (&self.registrations, &self.leases);
        self.allowances.retain(|id| {
            registrations.contains_key(&id) || leases.held_by_identity(id) > 0
        });
        // A flood of registrations must not keep its memory after it ends.
        shrink(&mut self.workers);
        shrink(&mut self.registrations);
        shrink(&mut self.registrations_by_address);
    }

    /// Removes remote worker `id` (its leases stay, to expire or be
    /// reported): it is no longer at work, nor counts towards its
    /// identity's and address's registrations. An unknown worker is
    /// ignored.
    fn forget_worker(&mut self, id: &WorkerId) {
        // Presence lists only registered workers.
        let Some(w) = self.workers.remove(id) else {
            return;
        };
        self.presence.forget(id, w.identity, w.last_seen);
        release_count(&mut self.registrations, w.identity);
        if let Some(ip) = w.address {
            release_count(&mut self.registrations_by_address, ip);
        }
    }

    /// Remote worker `id` drained and leaves the run (its `Release` says
    /// so): its leases are handed back and it is forgotten at once, so that
    /// no job waits a lease lifetime for a machine that has stopped (issue
    /// 26, item 1). Returns the jobs whose leases it still held. A later
    /// call of the same id is an unknown worker's, as after a silence.
    pub fn leave(&mut self, id: &WorkerId, now: Instant) -> Vec<JobId> {
        let held: Vec<LeaseId> = self
            .leases
            .iter()
            .filter(|l| l.worker == *id)
            .map(|l| l.id)
            .collect();
        let released = self.release(id, &held, now);
        if self.workers.get(id).is_some_and(|w| !w.local) {
            self.forget_worker(id);
        }
        released
    }

    /// Entries in the per-worker structures: workers, registrations by
    /// identity and by address, allowances (for memory tests).
    pub fn worker_entries(&self) -> [usize; 4] {
        [
            self.workers.len(),
            self.registrations.len(),
            self.registrations_by_address.len(),
            self.allowances.len(),
        ]
    }

    /// The run's counters now, for [`crate::core::status`], the one place
    /// that reads them as progress.
    pub fn counters(&self, now: Instant) -> Counters {
        Counters {
            jobs: self.jobs(),
            jobs_done: self.done_jobs,
            jobs_leased: self.leases.len() as u64,
            work_total: self.total_work,
            work_done: self.done_work,
            workers: self.active_workers(now),
            total_so_far: self.tally.total,
            complete: self.is_complete(),
            jobs_done_here: self.done_here,
            work_done_here: self.work_here,
        }
    }

    // Read-only views for `crate::core::status` (issue 26's display points).

    /// Jobs computed and waiting for a check (with copies, not settled),
    /// and their estimated work: work done that the run does not count as
    /// settled yet. O(1).
    pub fn awaiting_check(&self) -> (u64, u128) {
        (self.open.len() as u64, self.open_work)
    }

    /// CPU threads of the coordinator's own registered threads (0 when it
    /// runs none): they work as a worker does. O(1).
    pub fn local_threads(&self) -> u32 {
        self.local_threads
    }

    /// Holds the job of `s`, not settled, open for another copy, with its
    /// reporters and kernels as `s` has them (its work counted once in the
    /// open work).
    fn hold_open(&mut self, s: &Settlement) {
        let open = Open {
            reporters: s.reporters.clone(),
            kernels: s.kernels.clone(),
            trusted_only: s.needs_trusted,
            work: s.work,
        };
        if let Some(before) = self.open.insert(s.job, open) {
            self.open_work -= u128::from(before.work);
        }
        self.open_work += u128::from(s.work);
    }

    /// Closes `job`'s entry in the open jobs, if it has one.
    fn close_open(&mut self, job: JobId) {
        if let Some(open) = self.open.remove(&job) {
            self.open_work -= u128::from(open.work);
        }
    }
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
pub fn remote_identity(name: &str, address: Option<IpAddr>) -> String {
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

/// The clock's questions, asked of indexes ([`Presence`], the lease table's
/// review and deadline indexes), answer as full scans of the workers and
/// leases would, over random sequences of events.
#[cfg(test)]
mod tick_scans {
    use proptest::prelude::*;

    use super::*;

    const TTL: Duration = Duration::from_secs(30);

    fn scheduler() -> Scheduler {
        let policy = Policy {
            secret: [3; 16],
            fraction: crate::core::quorum::Fraction::Fixed(0.0),
            ban_after: 2,
        };
        Scheduler::new(vec![1; 400], 1, TTL, policy)
    }

    /// What the clock's questions answered before they were indexed: the
    /// remote workers at work, whether two machines are at work, and the
    /// workers to forget, by a scan of every worker.
    fn scanned_workers(s: &Scheduler, now: Instant) -> (usize, bool, Vec<WorkerId>) {
        let at_work = |w: &Worker| now.saturating_duration_since(w.last_seen) <= s.ttl;
        let active = s.workers().filter(|(_, w)| !w.local && at_work(w)).count();
        // A remote identity counts as a machine only while it delivers;
        // the local threads (and workers of the local identity) are one.
        let mut machines: Vec<Option<IdentityId>> = s
            .workers()
            .filter(|(_, w)| {
                w.local
                    || at_work(w)
                        && (s.is_local_identity(w.identity)
                            || !s.allowances().without_progress(w.identity, now))
            })
            .map(|(_, w)| {
                (!w.local && !s.is_local_identity(w.identity)).then_some(w.identity)
            })
            .collect();
        machines.sort_unstable();
        machines.dedup();
        let horizon = s.ttl * FORGET_AFTER_TTLS;
        let mut silent: Vec<WorkerId> = s
            .workers()
            .filter(|(_, w)| {
                !w.local && now.saturating_duration_since(w.last_seen) > horizon
            })
            .map(|(id, _)| id.clone())
            .collect();
        silent.sort();
        (active, machines.len() >= 2, silent)
    }

    /// The leases a scan of every live lease finds overdue at `now`.
    fn scanned_overdue(s: &Scheduler, now: Instant) -> Vec<LeaseId> {
        let mut ids: Vec<LeaseId> = s
            .live_leases()
            .filter(|l| {
                !s.is_local_identity(l.identity)
                    && s.allowances()
                        .is_overdue(l.identity, now.saturating_duration_since(l.granted))
            })
            .map(|l| l.id)
            .collect();
        ids.sort();
        ids
    }

    /// The ledger's decision for one copy of `job` under `lease`: settled,
    /// or (`settled` false) waiting for a check, which reopens a settled
    /// job.
    fn decided(job: JobId, lease: Option<LeaseId>, settled: bool) -> Settlement {
        Settlement {
            job,
            lease,
            counted_before: None,
            counted: None,
            work: 1,
            attempts: 1,
            votes: 1,
            settled,
            reporters: vec![],
            kernels: vec![],
            losers: vec![],
            beaten: crate::core::quorum::Beaten::default(),
            needs_trusted: false,
            disputed: false,
            solutions_missing: false,
            confirmed: vec![],
            unchecked: false,
        }
    }

    /// Renews every lease of `workers` at `now` (their heartbeats).
    fn heartbeat(s: &mut Scheduler, workers: &[&WorkerId], now: Instant) {
        for &w in workers {
            let held: Vec<LeaseId> = (s.live_leases())
                .filter(|l| l.worker == *w)
                .map(|l| l.id)
                .collect();
            s.lease(w, 0, &held, now).unwrap();
        }
    }

    #[test]
    fn a_lease_reviewed_before_its_time_grew_is_reviewed_again_later() {
        let mut s = scheduler();
        let t0 = Instant::now();
        let at = |secs: u64| t0 + Duration::from_secs(secs);
        let [a, b, h] = ["a", "b", "h"].map(|n| s.register(n, 1, None, t0).unwrap());
        let held = s.lease(&h, 1, &[], t0).unwrap().jobs[0].lease;
        let la = s.lease(&a, 1, &[], t0).unwrap().jobs[0].lease;
        let lb = s.lease(&b, 1, &[], t0).unwrap().jobs[0].lease;
        // a delivers in 2 s: h, never measured, is expected to need 2 s
        // too, and is overdue after 3 × 30 + 8 × 2 = 106 s.
        s.note_copy(&a, la, 1, at(2));
        s.release(&a, &[la], at(2));
        // b delivers in 25 s: h is now expected to need 25 s, overdue
        // after 3 × 30 + 8 × 25 = 290 s.
        s.note_copy(&b, lb, 1, at(25));
        s.release(&b, &[lb], at(25));
        for secs in (20..=280).step_by(20) {
            heartbeat(&mut s, &[&h, &a, &b], at(secs));
            s.expire(at(secs));
            s.reclaim_overdue(at(secs));
            assert!(s.take_reclaimed().is_empty(), "{secs} s: not overdue yet");
        }
        heartbeat(&mut s, &[&h], at(291));
        s.reclaim_overdue(at(291));
        let taken: Vec<LeaseId> = s.take_reclaimed().iter().map(|r| r.lease.id).collect();
        assert_eq!(taken, vec![held], "reviewed at 106 s, then again at 290 s");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// After any sequence of registrations (names and addresses
        /// collide, so machines repeat), heartbeats, releases, grants,
        /// delivered copies and ticks, the indexed answers equal the scans:
        /// workers at work, two machines at work, the workers forgotten,
        /// the leases expired and the leases taken back as overdue.
        #[test]
        fn tick_answers_equal_full_scans(
            events in proptest::collection::vec((0u8..10, 0u8..16, 0u64..120), 1..150),
        ) {
            let mut s = scheduler();
            let mut now = Instant::now();
            let mut ids: Vec<WorkerId> = Vec::new();
            for (kind, who, secs) in events {
                let pick = |ids: &[WorkerId]| ids[usize::from(who) % ids.len()].clone();
                match kind {
                    0 => {
                        let ip = IpAddr::from([10, 0, 0, who % 3]);
                        if let Ok(id) = s.register(&format!("w{}", who % 4), 1, Some(ip), now) {
                            ids.push(id);
                        }
                    }
                    1 if !ids.is_empty() => {
                        // A heartbeat that renews what it holds and asks
                        // for more.
                        let id = pick(&ids);
                        let held: Vec<LeaseId> = (s.live_leases())
                            .filter(|l| l.worker == id)
                            .map(|l| l.id)
                            .collect();
                        let _ = s.lease(&id, u32::from(who % 3), &held, now);
                    }
                    2 if !ids.is_empty() => {
                        let id = pick(&ids);
                        s.release(&id, &[], now);
                    }
                    3 if !ids.is_empty() => {
                        // A copy delivered under a live lease, which then
                        // ends: the holder's measured time changes.
                        let live: Vec<Lease> = s.live_leases().cloned().collect();
                        if !live.is_empty() {
                            let l = &live[usize::from(who) % live.len()];
                            s.note_copy(&l.worker, l.id, 1, now);
                            s.release(&l.worker, &[l.id], now);
                        }
                    }
                    8 => {
                        // A job decided: one with a live lease, or any
                        // (a late copy, or a check that reopens it).
                        let live: Vec<Lease> = s.live_leases().cloned().collect();
                        let (job, lease) = match live.get(usize::from(who)) {
                            Some(l) => (l.job, Some(l.id)),
                            None => (JobId(u64::from(who) % 24), None),
                        };
                        s.settle(&decided(job, lease, secs % 4 != 0), true).unwrap();
                    }
                    4 if s.locals == 0 && who == 0 => {
                        ids.push(s.register_local(1, now));
                    }
                    5 => {
                        now += Duration::from_secs(secs);
                    }
                    6 | 7 => {
                        // Every worker renews what it holds, some time
                        // later: leases outlive their expected time.
                        now += Duration::from_secs(secs % 25);
                        for id in ids.clone() {
                            let held: Vec<LeaseId> = (s.live_leases())
                                .filter(|l| l.worker == id)
                                .map(|l| l.id)
                                .collect();
                            let _ = s.lease(&id, u32::from(kind == 6), &held, now);
                        }
                    }
                    _ => {
                        now += Duration::from_secs(secs % 10);
                    }
                }
                // The tick, as `Core::tick` runs it, each answer checked
                // against its scan.
                let mut due: Vec<LeaseId> = (s.live_leases())
                    .filter(|l| l.deadline < now)
                    .map(|l| l.id)
                    .collect();
                due.sort();
                let mut expired: Vec<LeaseId> = s.expire(now).iter().map(|l| l.id).collect();
                expired.sort();
                prop_assert_eq!(expired, due);
                let overdue = scanned_overdue(&s, now);
                s.reclaim_overdue(now);
                let mut taken: Vec<LeaseId> =
                    s.take_reclaimed().iter().map(|r| r.lease.id).collect();
                taken.sort();
                prop_assert_eq!(taken, overdue);
                let (active, two, silent) = scanned_workers(&s, now);
                prop_assert_eq!(s.active_workers(now), active);
                prop_assert_eq!(s.machines_at_work(now), two);
                let before: Vec<WorkerId> = s.workers().map(|(id, _)| id.clone()).collect();
                s.prune_workers(now);
                let mut pruned: Vec<WorkerId> = before
                    .into_iter()
                    .filter(|id| s.worker(id).is_none())
                    .collect();
                pruned.sort();
                prop_assert_eq!(pruned, silent);
                let mut kept: Vec<LeaseId> = (s.issued.iter())
                    .filter(|(_, i)| s.table.phase(i.job) != Phase::Done)
                    .map(|(&id, _)| id)
                    .collect();
                kept.sort();
                s.prune_issued();
                let mut issued: Vec<LeaseId> = s.issued.keys().copied().collect();
                issued.sort();
                prop_assert_eq!(issued, kept);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(30);

    /// A fake clock: time moves only when the test says so.
    struct Clock(Instant);

    impl Clock {
        fn now(&self) -> Instant {
            self.0
        }
        fn advance(&mut self, secs: u64) -> Instant {
            self.0 += Duration::from_secs(secs);
            self.0
        }
    }

    /// `worker` leases one job and delivers a copy of it at `now`: it is at
    /// work (its lease stays live, as a report's settlement is not
    /// modelled here).
    fn deliver(s: &mut Scheduler, worker: &WorkerId, now: Instant) {
        let lease = s.lease(worker, 1, &[], now).unwrap().jobs[0].lease;
        s.note_copy(worker, lease, 1, now);
    }

    fn tally(total: u128) -> Tally {
        Tally {
            total,
            burnside: 8 * total,
        }
    }

    fn policy(share: f64) -> Policy {
        Policy {
            secret: [3; 16],
            fraction: crate::core::quorum::Fraction::Fixed(share),
            ban_after: 2,
        }
    }

    fn setup(works: &[u64]) -> (Scheduler, Clock) {
        (
            Scheduler::new(works.to_vec(), 1, TTL, policy(0.0)),
            Clock(Instant::now()),
        )
    }

    /// The ledger's decision for a single, unselected copy: it settles.
    fn first_copy(s: &mut Scheduler, job: JobId, lease: LeaseId, total: u128) -> Fallout {
        let settlement = Settlement {
            job,
            lease: Some(lease),
            counted_before: None,
            counted: Some(tally(total)),
            work: 1,
            attempts: 1,
            votes: 1,
            settled: true,
            reporters: vec![],
            kernels: vec![],
            losers: vec![],
            beaten: crate::core::quorum::Beaten::default(),
            needs_trusted: false,
            disputed: false,
            solutions_missing: false,
            confirmed: vec![],
            unchecked: false,
        };
        s.settle(&settlement, true).unwrap()
    }

    fn jobs_of(g: &Grant) -> Vec<u64> {
        g.jobs.iter().map(|j| j.job.0).collect()
    }

    #[test]
    fn largest_jobs_go_first() {
        // Octaves: 5 → 3, 50 → 6, 12 → 4, 40 → 6; in id order within one.
        let (mut s, clock) = setup(&[5, 50, 12, 50, 40]);
        let a = s.register("a", 1, None, clock.now()).unwrap();
        let g = s.lease(&a, 5, &[], clock.now()).unwrap();
        assert_eq!(jobs_of(&g), vec![1, 3, 4, 2, 0]);
        assert!(g.jobs.iter().all(|j| j.attempts == 1));
        assert_eq!(s.jobs_pending(), 0);
    }

    #[test]
    fn large_runs_go_by_octave_then_id() {
        // 100 and 120 share an octave; 300 is in a higher one.
        let mut works: Vec<u64> = (0..EXACT_ORDER_UP_TO as u64 + 10)
            .map(|i| if i % 2 == 0 { 100 } else { 120 })
            .collect();
        works[7] = 300;
        let (mut s, clock) = setup(&works);
        let a = s.register("a", 4, None, clock.now()).unwrap();
        let g = s.lease(&a, 4, &[], clock.now()).unwrap();
        assert_eq!(jobs_of(&g), vec![7, 0, 1, 2]);
    }

    #[test]
    fn an_expired_lease_goes_back_to_pending_and_is_reissued() {
        let (mut s, mut clock) = setup(&[10, 5, 1]);
        let a = s.register("a", 1, None, clock.now()).unwrap();
        let b = s.register("b", 1, None, clock.now()).unwrap();
        let first = s.lease(&a, 1, &[], clock.now()).unwrap().jobs[0].clone();
        assert_eq!(first.job, JobId(0));
        // Within the TTL nothing expires.
        assert!(s.expire(clock.advance(29)).is_empty());
        let expired = s.expire(clock.advance(2));
        assert_eq!(expired.len(), 1);
        assert_eq!(expired[0].id, first.lease);
        assert_eq!(s.jobs_pending(), 3);
        // The late job is reissued before the others, with a new lease.
        let again = s.lease(&b, 1, &[], clock.now()).unwrap().jobs[0].clone();
        assert_eq!(again.job, JobId(0));
        assert_ne!(again.lease, first.lease);
        assert_eq!(again.attempts, 2);
        // The old holder's heartbeat learns its lease is gone.
        let g = s.lease(&a, 0, &[first.lease], clock.now()).unwrap();
        assert_eq!(g.revoked, vec![first.lease]);
    }

    #[test]
    fn a_lost_worker_loses_its_jobs_but_a_live_one_keeps_them() {
        let (mut s, mut clock) = setup(&[9, 8, 7, 6]);
        let lost = s.register("lost", 1, None, clock.now()).unwrap();
        let live = s.register("live", 1, None, clock.now()).unwrap();
        let gl = s.lease(&lost, 2, &[], clock.now()).unwrap();
        let gv = s.lease(&live, 2, &[], clock.now()).unwrap();
        let held: Vec<LeaseId> = gv.jobs.iter().map(|j| j.lease).collect();
        // `live` heartbeats every 10 s; `lost` never calls again.
        for _ in 0..4 {
            clock.advance(10);
            s.expire(clock.now());
            let g = s.lease(&live, 0, &held, clock.now()).unwrap();
            assert!(g.revoked.is_empty(), "a renewed lease is not revoked");
        }
        assert_eq!(
            s.jobs_pending(),
            2,
            "the lost worker's two jobs are pending"
        );
        assert_eq!(s.active_workers(clock.now()), 1);
        let g = s.lease(&live, 4, &held, clock.now()).unwrap();
        assert_eq!(jobs_of(&g), jobs_of(&gl));
    }

    #[test]
    fn a_selected_job_is_checked_by_another_worker_whose_lease_looks_like_a_first_copy() {
        let mut s = Scheduler::new(vec![1, 1], 1, TTL, policy(1.0));
        let now = Instant::now();
        let ip = |d| Some(IpAddr::from([127, 0, 0, d]));
        let a = s.register("a", 1, ip(1), now).unwrap();
        let b = s.register("b", 1, ip(2), now).unwrap();
        let g = s.lease(&a, 1, &[], now).unwrap();
        let (job, lease, first_kernel) =
            (g.jobs[0].job, g.jobs[0].lease, g.jobs[0].kernel);
        let ia = s.worker(&a).unwrap().identity;
        let one_vote = Settlement {
            job,
            lease: Some(lease),
            counted_before: None,
            counted: Some(tally(5)),
            work: 1,
            attempts: 1,
            votes: 1,
            settled: false,
            reporters: vec![ia],
            kernels: vec!["avx512".to_owned()],
            losers: vec![],
            beaten: crate::core::quorum::Beaten::default(),
            needs_trusted: false,
            disputed: false,
            solutions_missing: false,
            confirmed: vec![],
            unchecked: false,
        };
        s.settle(&one_vote, true).unwrap();
        assert_eq!(
            s.tally().total,
            5,
            "a first copy counts while it is checked"
        );
        assert!(!s.is_done(job) && !s.is_complete());
        assert_eq!(s.jobs_in_check(), 1);
        // `a` may not check itself: it gets the other job, not the check.
        let again = s.lease(&a, 2, &[], now).unwrap();
        assert!(again.jobs.iter().all(|j| j.job != job));
        // `b` gets the check first, and its lease asks for no kernel, as the
        // first copy's did: a worker cannot tell a check from a first copy.
        let check = s.lease(&b, 1, &[], now).unwrap().jobs[0].clone();
        assert_eq!(check.job, job);
        assert_eq!(
            (first_kernel, check.kernel),
            (KernelRequest::Any, KernelRequest::Any)
        );
        // A trusted remote identity's check names a kernel no copy ran: AVX2
        // after AVX-512 and the other way round, the cheapest one.
        assert_eq!(
            other_kernel(&["avx512".into()]),
            KernelRequest::Named(Kernel::Avx2)
        );
        assert_eq!(
            other_kernel(&["avx2".into(), "avx512".into()]),
            KernelRequest::Named(Kernel::Scalar)
        );
        assert_eq!(
            other_kernel(&["neon".into()]),
            KernelRequest::Named(Kernel::Scalar)
        );
        // A GPU copy (`nq-worker --gpu` reports `cuda`) is settled by a
        // trusted remote machine on a CPU kernel that every worker has.
        assert_eq!(
            other_kernel(&["cuda".into()]),
            KernelRequest::Named(Kernel::Scalar)
        );
        let ib = s.worker(&b).unwrap().identity;
        let two_votes = Settlement {
            lease: Some(check.lease),
            counted_before: Some(tally(5)),
            counted: Some(tally(5)),
            votes: 2,
            settled: true,
            reporters: vec![ia, ib],
            ..one_vote
        };
        s.settle(&two_votes, true).unwrap();
        assert!(s.is_done(job));
        assert_eq!(s.tally().total, 5, "a confirmation adds nothing");
    }

    #[test]
    fn one_address_is_one_voice_whatever_names_it_registers() {
        let mut s = Scheduler::new(vec![1], 1, TTL, policy(1.0));
        let now = Instant::now();
        let host = Some(IpAddr::from([10, 1, 2, 3]));
        let a = s.register("liar-1", 1, host, now).unwrap();
        let b = s.register("liar-2", 1, host, now).unwrap();
        let (ia, ib) = (
            s.worker(&a).unwrap().identity,
            s.worker(&b).unwrap().identity,
        );
        assert_eq!(ia, ib, "two names from one address are one identity");
        assert_eq!(s.identities().label(ia), "liar-1@10.1.2.3");
        // IPv4 seen through an IPv6 socket is the same address.
        let mapped = Some("::ffff:10.1.2.3".parse().unwrap());
        let c = s.register("liar-3", 1, mapped, now).unwrap();
        assert_eq!(s.worker(&c).unwrap().identity, ia);
        // On loopback (one machine, tests) names tell processes apart.
        let lo = Some(IpAddr::from([127, 0, 0, 1]));
        let x = s.register("x", 1, lo, now).unwrap();
        let y = s.register("y", 1, lo, now).unwrap();
        assert_ne!(
            s.worker(&x).unwrap().identity,
            s.worker(&y).unwrap().identity
        );
        // The first copy's reporter cannot check it under another name.
        let g = s.lease(&a, 1, &[], now).unwrap();
        let one = Settlement {
            job: g.jobs[0].job,
            lease: Some(g.jobs[0].lease),
            counted_before: None,
            counted: Some(tally(1)),
            work: 1,
            attempts: 1,
            votes: 1,
            settled: false,
            reporters: vec![ia],
            kernels: vec![],
            losers: vec![],
            beaten: crate::core::quorum::Beaten::default(),
            needs_trusted: false,
            disputed: false,
            solutions_missing: false,
            confirmed: vec![],
            unchecked: false,
        };
        s.settle(&one, true).unwrap();
        assert!(s.lease(&b, 1, &[], now).unwrap().jobs.is_empty());
        assert_eq!(s.lease(&x, 1, &[], now).unwrap().jobs.len(), 1);
    }

    #[test]
    fn one_credential_is_one_identity_whatever_its_addresses() {
        let mut s = Scheduler::new(vec![1; 4], 1, TTL, policy(0.5));
        let now = Instant::now();
        let ip = |d| Some(IpAddr::from([10, 0, 0, d]));
        let a = s
            .register_as("liar-1", 1, ip(2), Some("token:rack9"), now)
            .unwrap();
        let b = s
            .register_as("liar-2", 1, ip(3), Some("token:rack9"), now)
            .unwrap();
        let c = s
            .register_as("honest", 1, ip(3), Some("token:rack1"), now)
            .unwrap();
        // Without a credential the address is the identity, as before.
        let d = s.register("x", 1, ip(2), now).unwrap();
        let e = s.register("y", 1, ip(4), now).unwrap();
        let id = |w| s.worker(w).unwrap().identity;
        assert_eq!(id(&a), id(&b), "two addresses, one credential: one voice");
        assert_ne!(id(&b), id(&c), "one address, two credentials: two voices");
        assert_ne!(id(&d), id(&e));
        assert_ne!(id(&d), id(&a));
    }

    #[test]
    fn identities_of_earlier_sessions_are_awaited_until_they_register() {
        let mut s = Scheduler::new(vec![1; 4], 2, TTL, policy(0.5));
        let now = Instant::now();
        s.expect_back(["a@127.0.0.1", "b@127.0.0.1"]);
        assert_eq!(s.not_back(), 2);
        let lo = Some(IpAddr::from([127, 0, 0, 1]));
        s.register("a", 1, lo, now).unwrap();
        assert_eq!(s.not_back(), 1, "a is back; b is still awaited");
        s.register_local(1, now);
        assert_eq!(s.not_back(), 1, "the local threads are not b");
        s.register("b", 1, lo, now).unwrap();
        assert_eq!(s.not_back(), 0);
    }

    #[test]
    fn a_restored_second_machine_counts_for_one_lease_ttl() {
        // The previous session had two machines; after the restart only one
        // has called in yet (the other is still backing off). Its copies must
        // keep waiting for checks for one TTL, as a live machine heard from
        // at the restart would, and not settle unchecked at the first tick.
        let mut clock = Clock(Instant::now());
        let mut s = Scheduler::new(vec![1; 4], 2, TTL, policy(0.5));
        s.restore_two_machines(true, clock.now());
        let lo = Some(IpAddr::from([127, 0, 0, 1]));
        s.register("b", 1, lo, clock.now()).unwrap();
        assert!(!s.refresh_machines(clock.now()), "still two within the TTL");
        assert!(s.second_source());
        clock.advance(29);
        assert!(!s.refresh_machines(clock.now()));
        assert!(s.second_source());
        // The other machine never came back: one is left after one TTL.
        clock.advance(2);
        assert!(s.refresh_machines(clock.now()), "one machine left");
        assert!(!s.second_source());
        // A session restored with one machine gets no such grace.
        let mut one = Scheduler::new(vec![1; 4], 2, TTL, policy(0.5));
        one.restore_two_machines(false, clock.now());
        one.register("b", 1, lo, clock.now()).unwrap();
        assert!(!one.refresh_machines(clock.now()));
        assert!(!one.second_source());
    }

    #[test]
    fn a_hoarder_is_no_second_machine_and_a_worker_that_leaves_is_gone_at_once() {
        let mut clock = Clock(Instant::now());
        let mut s = Scheduler::new(vec![1; 8], 1, TTL, policy(0.5));
        let lo = Some(IpAddr::from([127, 0, 0, 1]));
        let honest = s.register("honest", 1, lo, clock.now()).unwrap();
        deliver(&mut s, &honest, clock.now());
        // The hoarder leases and renews, but never delivers a copy.
        let hoarder = s.register("hoarder", 1, lo, clock.now()).unwrap();
        let held = s.lease(&hoarder, 1, &[], clock.now()).unwrap().jobs[0].lease;
        for _ in 0..4 {
            s.lease(&hoarder, 0, &[held], clock.advance(10)).unwrap();
            s.lease(&honest, 0, &[], clock.now()).unwrap();
            s.refresh_machines(clock.now());
            assert!(!s.second_source(), "a hoarder is no second machine");
        }
        // A second worker delivers: two machines; then it leaves.
        let other = s.register("other", 1, lo, clock.now()).unwrap();
        deliver(&mut s, &other, clock.now());
        s.refresh_machines(clock.now());
        assert!(s.second_source());
        let leased = s.live_leases().filter(|l| l.worker == other).count();
        assert_eq!(
            s.leave(&other, clock.now()).len(),
            leased,
            "its leases go back"
        );
        assert!(s.worker(&other).is_none(), "forgotten at once");
        assert!(
            s.refresh_machines(clock.now()),
            "one machine again, at once"
        );
        assert!(!s.second_source());
    }

    #[test]
    fn automatic_checks_need_two_machines_at_work() {
        let auto = Policy {
            secret: [5; 16],
            fraction: crate::core::quorum::Fraction::Auto,
            ban_after: 3,
        };
        let mut clock = Clock(Instant::now());
        let mut s = Scheduler::new(vec![1; 4], 1, TTL, auto);
        s.register_local(1, clock.now());
        assert!(!s.refresh_machines(clock.now()), "the local threads alone");
        assert!(!s.second_source());
        let lo = Some(IpAddr::from([127, 0, 0, 1]));
        let w = s.register("w", 1, lo, clock.now()).unwrap();
        assert!(
            !s.refresh_machines(clock.now()),
            "registered, nothing delivered"
        );
        deliver(&mut s, &w, clock.now());
        assert!(s.refresh_machines(clock.now()), "a second machine began");
        assert!(s.second_source());
        assert!(!s.refresh_machines(clock.now()), "nothing changed");
        // The worker falls silent for longer than a lease: one machine left.
        clock.advance(31);
        assert!(s.refresh_machines(clock.now()));
        assert!(!s.second_source());
        // It comes back.
        s.lease(&w, 0, &[], clock.now()).unwrap();
        assert!(s.refresh_machines(clock.now()));
        // A fixed share does not depend on the machines at work, but
        // probation does: whether a probationer's copy can be checked (this
        // assertion said `false` before probation; only `--verify 0`, which
        // turns probation off, leaves the jobs to check unchanged now).
        let mut fixed = Scheduler::new(vec![1], 1, TTL, policy(0.5));
        fixed.register_local(1, clock.now());
        let w = fixed.register("w", 1, lo, clock.now()).unwrap();
        deliver(&mut fixed, &w, clock.now());
        assert!(fixed.refresh_machines(clock.now()));
        let mut none = Scheduler::new(vec![1], 1, TTL, policy(0.0));
        none.register_local(1, clock.now());
        let w = none.register("w", 1, lo, clock.now()).unwrap();
        deliver(&mut none, &w, clock.now());
        assert!(!none.refresh_machines(clock.now()));
    }

    #[test]
    fn confirmations_end_probation_and_unchecked_jobs_are_counted_and_reopened() {
        let mut clock = Clock(Instant::now());
        // `--verify 0` has no probation; any other setting has.
        let none = Scheduler::new(vec![1; 4], 1, TTL, policy(0.0));
        assert_eq!(none.rules().probation, 0);
        let mut s = Scheduler::new(vec![1; 4], 1, TTL, policy(0.02));
        assert_eq!(s.rules().probation, crate::core::quorum::PROBATION);
        let lo = Some(IpAddr::from([127, 0, 0, 1]));
        let a = s.register("a", 1, lo, clock.now()).unwrap();
        let ia = s.worker(&a).unwrap().identity;
        assert!(!s.rules().second_machine);
        // A lone probationer's job settles unchecked, and is counted as such.
        let lone = Settlement {
            job: JobId(0),
            lease: None,
            counted_before: None,
            counted: Some(tally(3)),
            work: 1,
            attempts: 1,
            votes: 1,
            settled: true,
            reporters: vec![ia],
            kernels: vec![],
            losers: vec![],
            beaten: crate::core::quorum::Beaten::default(),
            needs_trusted: false,
            disputed: false,
            solutions_missing: false,
            confirmed: vec![],
            unchecked: true,
        };
        s.settle(&lone, true).unwrap();
        assert_eq!(s.jobs_unchecked(), 1);
        assert!(s.is_done(JobId(0)));
        // A second machine begins (it delivers a copy of another job): the
        // unchecked job is judged again.
        let b = s.register("b", 1, lo, clock.now()).unwrap();
        deliver(&mut s, &a, clock.now());
        deliver(&mut s, &b, clock.now());
        assert!(s.refresh_machines(clock.now()));
        assert_eq!(s.unchecked_selected(), vec![JobId(0)]);
        // Judged again it waits for a check, and is no longer unchecked.
        let reopened = Settlement {
            settled: false,
            unchecked: false,
            counted_before: Some(tally(3)),
            ..lone.clone()
        };
        s.settle(&reopened, false).unwrap();
        assert_eq!(s.jobs_unchecked(), 0);
        assert!(!s.is_done(JobId(0)));
        let check = s.lease(&b, 1, &[], clock.advance(1)).unwrap().jobs[0].clone();
        assert_eq!(check.job, JobId(0), "the check goes first, to the other");
        let ib = s.worker(&b).unwrap().identity;
        let confirmed = Settlement {
            lease: Some(check.lease),
            votes: 2,
            settled: true,
            unchecked: false,
            reporters: vec![ia, ib],
            confirmed: vec![ia, ib],
            ..reopened.clone()
        };
        s.settle(&confirmed, true).unwrap();
        assert_eq!(s.identities().confirmed(ia), 1);
        assert_eq!(s.identities().confirmed(ib), 1);
        assert_eq!(s.tally().total, 3);
        // Confirmations count once per settlement, not per copy decided.
        s.settle(&confirmed, true).unwrap();
        assert_eq!(s.identities().confirmed(ia), 1);
    }

    #[test]
    fn losers_are_discredited_then_refused() {
        let mut s = Scheduler::new(vec![1; 4], 1, TTL, policy(1.0));
        let now = Instant::now();
        let liar = s.register("liar", 1, None, now).unwrap();
        let il = s.worker(&liar).unwrap().identity;
        let lost = |job| Settlement {
            job: JobId(job),
            lease: None,
            counted_before: None,
            counted: Some(tally(1)),
            work: 1,
            attempts: 1,
            votes: 2,
            settled: true,
            reporters: vec![],
            kernels: vec!["scalar".into()],
            losers: vec![il],
            beaten: crate::core::quorum::Beaten::trusted(),
            needs_trusted: false,
            disputed: false,
            solutions_missing: false,
            confirmed: vec![],
            unchecked: false,
        };
        assert_eq!(s.settle(&lost(0), true).unwrap().discredited, vec![il]);
        assert!(
            s.lease(&liar, 1, &[], now).is_ok(),
            "one loss: suspect, not refused"
        );
        let held = s.lease(&liar, 3, &[], now).unwrap().jobs.pop().unwrap();
        assert!(held.job.0 > 1, "a job the settlements below do not touch");
        assert_eq!(s.settle(&lost(1), true).unwrap().discredited, vec![il]);
        assert!(
            !s.is_live(held.lease),
            "a banned worker's leases end at once"
        );
        assert!(matches!(
            s.lease(&liar, 1, &[], now),
            Err(Error::Refused(Refusal::Banned { lost: 2, .. }))
        ));
    }

    #[test]
    fn losses_to_addresses_alone_never_ban_but_losses_to_two_credentials_do() {
        let mut s = Scheduler::new(vec![1; 8], 1, TTL, policy(0.0));
        let now = Instant::now();
        let victim = s
            .register_as("honest", 1, None, Some("token:honest"), now)
            .unwrap();
        let iv = s.worker(&victim).unwrap().identity;
        let (cred_a, cred_b) = (s.intern("token:a"), s.intern("token:b"));
        // A dispute `iv` lost against winners of which `by_credentials`
        // are credentials (the others being addresses).
        let lost = |job, by_credentials| Settlement {
            job: JobId(job),
            lease: None,
            counted_before: None,
            counted: Some(tally(1)),
            work: 1,
            attempts: 1,
            votes: 2,
            settled: true,
            reporters: vec![],
            kernels: vec![],
            losers: vec![iv],
            beaten: Beaten {
                by_trusted: false,
                by_credentials,
            },
            needs_trusted: false,
            disputed: true,
            solutions_missing: false,
            confirmed: vec![],
            unchecked: false,
        };
        // Two addresses outvote it three times: suspect, never banned.
        for job in 0..3 {
            s.settle(&lost(job, vec![]), true).unwrap();
        }
        assert_eq!(s.identities().lost(iv), 3);
        assert!(s.identities().is_suspect(iv));
        assert!(
            s.lease(&victim, 1, &[], now).is_ok(),
            "losses to addresses alone do not ban"
        );
        // One credential among the winners: still not enough.
        let f = s.settle(&lost(3, vec![cred_a]), true).unwrap();
        assert!(f.discredited.is_empty());
        assert!(s.lease(&victim, 1, &[], now).is_ok());
        // A second, distinct credential: banned now.
        let f = s.settle(&lost(4, vec![cred_b]), true).unwrap();
        assert_eq!(f.discredited, vec![iv]);
        assert!(matches!(
            s.lease(&victim, 1, &[], now),
            Err(Error::Refused(Refusal::Banned { .. }))
        ));
    }

    #[test]
    fn a_dispute_goes_only_to_the_trusted_threads_on_a_kernel_no_copy_ran() {
        let mut s = Scheduler::new(vec![1], 1, TTL, policy(1.0));
        let now = Instant::now();
        let ip = |d| Some(IpAddr::from([10, 0, 0, d]));
        let a = s.register("a", 1, ip(1), now).unwrap();
        let b = s.register("b", 1, ip(2), now).unwrap();
        let c = s.register("c", 1, ip(3), now).unwrap();
        let local = s.register_local(1, now);
        assert!(s.rules().arbiter);
        let (ia, ib) = (
            s.worker(&a).unwrap().identity,
            s.worker(&b).unwrap().identity,
        );
        let lease = s.lease(&a, 1, &[], now).unwrap().jobs[0].lease;
        let disputed = Settlement {
            job: JobId(0),
            lease: Some(lease),
            counted_before: None,
            counted: Some(tally(5)),
            work: 1,
            attempts: 2,
            votes: 1,
            settled: false,
            reporters: vec![ia, ib],
            kernels: vec!["avx512".into()],
            losers: vec![],
            beaten: Beaten::default(),
            needs_trusted: true,
            disputed: true,
            solutions_missing: false,
            confirmed: vec![],
            unchecked: false,
        };
        s.settle(&disputed, true).unwrap();
        assert!(
            s.lease(&c, 1, &[], now).unwrap().jobs.is_empty(),
            "an untrusted third identity may not settle a dispute"
        );
        let g = s.lease(&local, 1, &[], now).unwrap();
        assert_eq!(g.jobs.len(), 1);
        let kernel = g.jobs[0].kernel;
        assert_ne!(kernel, KernelRequest::Named(Kernel::Avx512));
        if Kernel::Avx512.is_available() {
            assert_ne!(kernel, KernelRequest::Any, "the fastest kernel already ran");
        }
    }

    #[test]
    fn a_restored_lease_binds_its_worker_and_job_as_before_the_restart() {
        let now = Instant::now();
        let mut before = Scheduler::new(vec![1, 1, 1], 1, TTL, policy(0.0));
        let ip = Some(IpAddr::from([10, 0, 0, 1]));
        let a = before.register("a", 4, ip, now).unwrap();
        let b = before
            .register("b", 4, Some(IpAddr::from([10, 0, 0, 2])), now)
            .unwrap();
        let held = before.lease(&a, 2, &[], now).unwrap().jobs;
        let other = before.lease(&b, 1, &[], now).unwrap().jobs[0].clone();
        // The next session, as setup restores it.
        let mut s = Scheduler::new(vec![1, 1, 1], 2, TTL, policy(0.0));
        let later = now + Duration::from_secs(5);
        s.restore_worker(a.clone(), "a", "10.0.0.1", ip, 4, later);
        s.restore_worker(b.clone(), "b", "10.0.0.2", None, 4, later);
        for g in held.iter().chain([&other]) {
            let w = if g.job == other.job { &b } else { &a };
            assert!(s.restore_lease(g.job, g.lease, w, g.attempts, later));
        }
        assert!(
            !s.restore_lease(held[0].job, LeaseId(7), &a, 1, later),
            "a job is leased once"
        );
        assert_eq!(s.jobs_pending(), 0);
        let (j0, l0) = (held[0].job, held[0].lease);
        // The same binding rules: this worker, this job.
        assert!(s.check_report(j0, l0, &a).is_ok());
        assert!(
            matches!(s.check_report(j0, l0, &b), Err(Error::Refused(_))),
            "another worker's id with a lease really issued before the restart"
        );
        assert!(
            matches!(s.check_report(held[1].job, l0, &a), Err(Error::Refused(_))),
            "the lease of another job"
        );
        assert!(matches!(
            s.check_report(j0, LeaseId(l0.0 ^ 1), &a),
            Err(Error::Refused(_))
        ));
        // The worker renews it under its old id, and the lease cap counts it.
        let g = s.lease(&a, 0, &[l0], later).unwrap();
        assert!(g.revoked.is_empty());
        assert_eq!(
            s.identities().name(s.worker(&a).unwrap().identity),
            "10.0.0.1"
        );
        // Unrenewed, it expires as any lease, and its job is pending again.
        s.expire(later + TTL + Duration::from_secs(1));
        assert!(s.jobs_pending() >= 1);
    }

    /// What a call from `ip` with `credential` proves (as the gRPC adapter
    /// resolves it).
    fn caller(ip: [u8; 4], credential: Option<&str>) -> Caller {
        Caller {
            credential: credential.map(str::to_owned),
            address: Some(IpAddr::from(ip)),
        }
    }

    #[test]
    fn ids_of_an_earlier_session_are_recognised_by_their_tags_alone() {
        let now = Instant::now();
        let mut before = Scheduler::new(vec![1; 4], 1, TTL, policy(0.0));
        let a = before.register("a", 4, Some(IpAddr::from([10, 0, 0, 1])), now);
        let a = a.unwrap();
        let b = (before.register_as(
            "b",
            4,
            Some(IpAddr::from([10, 0, 0, 2])),
            Some("token:b"),
            now,
        ))
        .unwrap();
        let held = before.lease(&a, 2, &[], now).unwrap().jobs;
        let (j0, l0, j1, l1) = (held[0].job, held[0].lease, held[1].job, held[1].lease);
        let theirs = before.lease(&b, 1, &[], now).unwrap().jobs[0].clone();
        // A restart that recorded nothing: a scheduler rebuilt from scratch.
        let later = now + Duration::from_secs(1);
        let mut s = Scheduler::new(vec![1; 4], 2, TTL, policy(0.0));
        assert!(matches!(
            s.lease(&a, 1, &[], later),
            Err(Error::UnknownWorker { .. })
        ));
        // A tag made for another caller, another run, or a made-up id.
        let a_from = caller([10, 0, 0, 1], None);
        for wrong in [
            caller([10, 0, 0, 9], None),
            caller([10, 0, 0, 1], Some("token:a")),
        ] {
            assert!(!s.recognize(&a, &wrong, later).unwrap(), "{wrong:?}");
        }
        let mut other_run = Scheduler::new(
            vec![1; 4],
            2,
            TTL,
            Policy {
                secret: [4; 16],
                ..policy(0.0)
            },
        );
        assert!(!other_run.recognize(&a, &a_from, later).unwrap());
        let tag = a.0.split_once('-').unwrap().1;
        let forged = WorkerId(format!("w1.7-{tag}"));
        assert!(!s.recognize(&forged, &a_from, later).unwrap());
        assert!(s.worker(&a).is_none() && s.worker(&forged).is_none());
        // The genuine ids: `a` from its address, `b` with its credential
        // from anywhere; each votes as before.
        assert!(s.recognize(&a, &a_from, later).unwrap());
        assert!(!s.recognize(&a, &a_from, later).unwrap(), "once");
        assert!(
            s.recognize(&b, &caller([10, 0, 0, 7], Some("token:b")), later)
                .unwrap()
        );
        let identity = |w: &WorkerId| s.identities().name(s.worker(w).unwrap().identity);
        assert_eq!((identity(&a), identity(&b)), ("10.0.0.1", "token:b"));
        // Lease ids: one bit flipped, another job, another worker: refused.
        for (job, lease, w) in [
            (j0, LeaseId(l0.0 ^ (1 << 63)), &a),
            (j0, LeaseId(l0.0 ^ 1), &a),
            (j1, l0, &a),
            (j0, l0, &b),
        ] {
            assert!(!s.recognize_lease(job, lease, w, later));
            assert!(
                matches!(s.check_report(job, lease, w), Err(Error::Refused(_))),
                "{job} {lease} {w}"
            );
        }
        // The genuine lease of a pending job: live again, bound as before.
        assert!(s.recognize_lease(j0, l0, &a, later));
        assert!(s.is_live(l0) && s.check_report(j0, l0, &a).is_ok());
        assert!(matches!(s.check_report(j0, l0, &b), Err(Error::Refused(_))));
        assert!(!s.recognize_lease(j0, l0, &a, later), "known now");
        // Its worker renews it, and holds on to a lease the call cannot
        // check (its report decides); a worker of this session is told that
        // an id this session never issued is void.
        let c = s.register("c", 4, Some(IpAddr::from([10, 0, 0, 3])), later);
        let c = c.unwrap();
        let g = s.lease(&a, 0, &[l0, l1], later).unwrap();
        assert!(g.revoked.is_empty(), "{:?}", g.revoked);
        assert_eq!(s.lease(&c, 0, &[l1], later).unwrap().revoked, vec![l1]);
        // `b`'s job went to `c` meanwhile: `b`'s report is a late copy.
        let got = s.lease(&c, 4, &[], later).unwrap().jobs;
        assert!(got.iter().any(|g| g.job == theirs.job));
        assert!(s.recognize_lease(theirs.job, theirs.lease, &b, later));
        assert!(s.is_late(theirs.lease));
        assert!(s.check_report(theirs.job, theirs.lease, &b).is_ok());
        // A job done meanwhile: a late copy too, forgotten with the job's
        // other leases.
        let cj1 = got.iter().find(|g| g.job == j1).unwrap().lease;
        first_copy(&mut s, j1, cj1, 1);
        assert!(s.recognize_lease(j1, l1, &a, later) && s.is_late(l1));
        assert!(s.check_report(j1, l1, &a).is_ok());
        s.prune_issued();
        assert!(matches!(s.check_report(j1, l1, &a), Err(Error::Refused(_))));
    }

    #[test]
    fn a_restart_hands_the_jobs_of_unrecorded_leases_out_last() {
        // Equal works: the hand-out order is the id order.
        let (mut s, clock) = setup(&[1; 8]);
        let a = s.register("a", 4, None, clock.now()).unwrap();
        s.defer_unrecorded(3, clock.now());
        let g = s.lease(&a, 5, &[], clock.now()).unwrap();
        assert_eq!(jobs_of(&g), [3, 4, 5, 6, 7], "the first three set aside");
        let g = s.lease(&a, 3, &[], clock.now()).unwrap();
        assert_eq!(jobs_of(&g), [0, 1, 2], "no other job left: they go now");

        // Or they go first once a lease lifetime has passed.
        let (mut s, mut clock) = setup(&[1; 8]);
        let a = s.register("a", 4, None, clock.now()).unwrap();
        s.defer_unrecorded(2, clock.now());
        assert_eq!(jobs_of(&s.lease(&a, 1, &[], clock.now()).unwrap()), [2]);
        s.expire(clock.advance(31));
        assert_eq!(
            jobs_of(&s.lease(&a, 3, &[], clock.now()).unwrap()),
            [2, 0, 1]
        );
    }

    #[test]
    fn a_recognised_worker_keeps_its_recorded_name_and_identity() {
        let now = Instant::now();
        let lo = Some(IpAddr::from([127, 0, 0, 1]));
        let mut before = Scheduler::new(vec![1], 1, TTL, policy(0.0));
        let a = before.register("a", 8, lo, now).unwrap();
        let b = before.register("b", 8, lo, now).unwrap();
        let mut s = Scheduler::new(vec![1], 2, TTL, policy(0.0));
        let recorded = nq_store::StoredWorker {
            name: "a".into(),
            identity: "a@127.0.0.1".into(),
            address: Some("127.0.0.1".into()),
            threads: 8,
        };
        s.expect_recorded([(a.clone(), recorded)]);
        let from = caller([127, 0, 0, 1], None);
        assert!(s.recognize(&a, &from, now).unwrap());
        assert!(s.recognize(&b, &from, now).unwrap());
        let w = s.worker(&a).unwrap();
        assert_eq!((w.name.as_str(), w.threads), ("a", 8));
        assert_eq!(s.identities().name(w.identity), "a@127.0.0.1", "one voice");
        // Unrecorded (registered in the second before the crash): its id
        // names it.
        let w = s.worker(&b).unwrap();
        assert_eq!((&w.name, w.threads), (&b.0, RECOGNIZED_THREADS));
        assert_eq!(s.identities().name(w.identity), format!("{b}@127.0.0.1"));
    }

    #[test]
    fn a_banned_identity_stays_banned_when_its_worker_is_recognised() {
        let now = Instant::now();
        let ip = Some(IpAddr::from([10, 0, 0, 1]));
        let mut before = Scheduler::new(vec![1; 4], 1, TTL, policy(0.0));
        let a = before.register("a", 1, ip, now).unwrap();
        let g = before.lease(&a, 1, &[], now).unwrap().jobs[0].clone();
        let mut s = Scheduler::new(vec![1; 4], 2, TTL, policy(0.0));
        // Its lost conflicts, as restore finds them in the stored copies.
        let identity = s.intern("10.0.0.1");
        for _ in 0..2 {
            s.restore_loss(identity, &crate::core::quorum::Beaten::trusted());
        }
        assert!(s.recognize(&a, &caller([10, 0, 0, 1], None), now).unwrap());
        assert!(matches!(
            s.lease(&a, 1, &[], now),
            Err(Error::Refused(Refusal::Banned { .. }))
        ));
        s.recognize_lease(g.job, g.lease, &a, now);
        assert!(matches!(
            s.check_report(g.job, g.lease, &a),
            Err(Error::Refused(Refusal::Banned { .. }))
        ));
    }

    #[test]
    fn a_recognised_worker_counts_against_the_registration_limits() {
        let now = Instant::now();
        let mut before = Scheduler::new(vec![1], 1, TTL, policy(0.0));
        let ip = Some(IpAddr::from([10, 0, 0, 2]));
        let b = before
            .register_as("b", 1, ip, Some("token:b"), now)
            .unwrap();
        let mut s = Scheduler::new(vec![1], 2, TTL, policy(0.0));
        for i in 0..MAX_REGISTRATIONS_PER_IDENTITY {
            s.register_as(&format!("b{i}"), 1, ip, Some("token:b"), now)
                .unwrap();
        }
        assert!(matches!(
            s.recognize(&b, &caller([10, 0, 0, 2], Some("token:b")), now),
            Err(Error::Refused(Refusal::TooManyRegistrations { .. }))
        ));
        assert!(s.worker(&b).is_none());
    }

    #[test]
    fn a_late_result_after_reissue_counts_once() {
        let (mut s, mut clock) = setup(&[3]);
        let a = s.register("a", 1, None, clock.now()).unwrap();
        let b = s.register("b", 1, None, clock.now()).unwrap();
        let la = s.lease(&a, 1, &[], clock.now()).unwrap().jobs[0].lease;
        s.expire(clock.advance(31));
        let lb = s.lease(&b, 1, &[], clock.now()).unwrap().jobs[0].lease;
        // `a` was slow, not dead: its result arrives under the expired lease,
        // which is still bound to it.
        s.check_report(JobId(0), la, &a).unwrap();
        first_copy(&mut s, JobId(0), la, 7);
        assert!(s.is_complete());
        assert_eq!(s.tally().total, 7);
        // `b` learns at its next heartbeat that its lease is revoked.
        let g = s.lease(&b, 1, &[lb], clock.now()).unwrap();
        assert_eq!(g.revoked, vec![lb]);
        assert!(g.run_complete && g.jobs.is_empty());
    }

    #[test]
    fn released_jobs_are_reissued_first() {
        let (mut s, clock) = setup(&[9, 8, 7]);
        let a = s.register("a", 1, None, clock.now()).unwrap();
        let g = s.lease(&a, 1, &[], clock.now()).unwrap();
        let other = s.register("other", 1, None, clock.now()).unwrap();
        assert!(
            s.release(&other, &[g.jobs[0].lease], clock.now())
                .is_empty()
        );
        assert_eq!(
            s.release(&a, &[g.jobs[0].lease], clock.now()),
            vec![JobId(0)]
        );
        assert!(
            s.release(&a, &[g.jobs[0].lease], clock.now()).is_empty(),
            "idempotent"
        );
        assert_eq!(jobs_of(&s.lease(&a, 1, &[], clock.now()).unwrap()), vec![0]);
    }

    #[test]
    fn reports_are_bound_to_their_lease_worker_and_job() {
        let (mut s, clock) = setup(&[1, 1]);
        let a = s.register("a", 1, None, clock.now()).unwrap();
        let b = s.register("b", 1, None, clock.now()).unwrap();
        let stranger = WorkerId("w9.9".into());
        assert!(matches!(
            s.lease(&stranger, 1, &[], clock.now()),
            Err(Error::UnknownWorker { .. })
        ));
        let g = s.lease(&a, 2, &[], clock.now()).unwrap();
        let (l0, l1) = (g.jobs[0].lease, g.jobs[1].lease);
        assert_ne!(l0.0 + 1, l1.0, "lease ids are not a counter");
        let refused = |r: Result<Issued>| matches!(r, Err(Error::Refused(_)));
        assert!(
            refused(s.check_report(g.jobs[1].job, l0, &a)),
            "another job's lease"
        );
        assert!(
            refused(s.check_report(g.jobs[0].job, l0, &b)),
            "another worker's lease"
        );
        assert!(
            refused(s.check_report(g.jobs[0].job, LeaseId(12345), &a)),
            "made up"
        );
        assert!(matches!(
            s.check_report(JobId(2), l1, &a),
            Err(Error::UnknownJob { .. })
        ));
        s.check_report(g.jobs[0].job, l0, &a).unwrap();
    }

    #[test]
    fn leases_are_capped_per_worker() {
        let (mut s, clock) = setup(&[1; 100]);
        let a = s.register("a", 2, None, clock.now()).unwrap();
        let g = s.lease(&a, 50, &[], clock.now()).unwrap();
        assert_eq!(g.jobs.len(), 16);
        let held: Vec<LeaseId> = g.jobs.iter().map(|j| j.lease).collect();
        assert!(s.lease(&a, 50, &held, clock.now()).unwrap().jobs.is_empty());
        // Leases left out of `held` are not renewed, but still held until
        // they expire: leaving them out earns no room.
        assert!(
            s.lease(&a, 50, &held[..10], clock.now())
                .unwrap()
                .jobs
                .is_empty()
        );
    }

    /// See: issue 18, item 3. Fourteen registrations, or a claim of 2^31 - 1
    /// threads, leased all 210 jobs of N = 16.
    #[test]
    fn the_lease_cap_belongs_to_the_identity_not_to_its_registrations() {
        let (mut s, clock) = setup(&[1; 300]);
        let host = Some(IpAddr::from([10, 9, 9, 9]));
        let mut granted = 0;
        for i in 0..14 {
            let w = s
                .register(&format!("hoarder-{i}"), i32::MAX as u32, host, clock.now())
                .unwrap();
            granted += s.lease(&w, 1024, &[], clock.now()).unwrap().jobs.len();
        }
        assert_eq!(granted, crate::core::allowance::START_CAP);
        let ident = s.workers().next().unwrap().1.identity;
        assert_eq!(s.leases.held_by_identity(ident), granted);
    }

    #[test]
    fn the_cap_grows_with_the_identitys_delivered_work() {
        let (mut s, mut clock) = setup(&[1; 400]);
        let host = Some(IpAddr::from([10, 0, 0, 7]));
        let w = s.register("gpu", 1, host, clock.now()).unwrap();
        let g = s.lease(&w, 1024, &[], clock.now()).unwrap();
        assert_eq!(g.jobs.len(), 16, "claimed threads do not raise the start");
        // All 16 delivered after 20 s each, within one lease lifetime: 16 × 20 s
        // of lease time per 30 s, about 11 at once, earns a cap of 22 (the
        // claim of one thread, `max(16, 4)`, lowers it back to 16).
        clock.advance(20);
        for j in &g.jobs {
            first_copy(&mut s, j.job, j.lease, 1);
            s.note_copy(&w, j.lease, 1, clock.now());
        }
        assert_eq!(
            s.allowances()
                .cap(s.worker(&w).unwrap().identity, clock.now()),
            22
        );
        assert_eq!(s.lease(&w, 1024, &[], clock.now()).unwrap().jobs.len(), 16);
        // A worker whose claim does not bind gets the measured cap.
        let big = s.register("gpu", 64, host, clock.now()).unwrap();
        assert_eq!(
            s.lease(&big, 1024, &[], clock.now()).unwrap().jobs.len(),
            22 - 16
        );
    }

    #[test]
    fn a_lease_renewed_far_past_its_measured_time_is_taken_back_and_reissued() {
        let (mut s, mut clock) = setup(&[1; 40]);
        let honest = s.register("honest", 1, None, clock.now()).unwrap();
        let hoarder = s.register("hoarder", 1, None, clock.now()).unwrap();
        let hoarded = s.lease(&hoarder, 1, &[], clock.now()).unwrap().jobs[0].clone();
        // Nothing measured yet: nothing is overdue, however long.
        let g = s.lease(&honest, 1, &[], clock.now()).unwrap().jobs[0].clone();
        clock.advance(2);
        first_copy(&mut s, g.job, g.lease, 1);
        s.note_copy(&honest, g.lease, 1, clock.now());
        // The hoarder heartbeats: 3 lease lifetimes + 8 × 2 s = 106 s.
        for _ in 0..5 {
            clock.advance(20);
            s.lease(&hoarder, 0, &[hoarded.lease], clock.now()).unwrap();
            s.lease(&honest, 0, &[], clock.now()).unwrap();
            s.reclaim_overdue(clock.now());
        }
        assert!(s.is_live(hoarded.lease), "100 s: not yet");
        clock.advance(10);
        s.lease(&hoarder, 0, &[hoarded.lease], clock.now()).unwrap();
        s.reclaim_overdue(clock.now());
        assert!(!s.is_live(hoarded.lease));
        let taken = s.take_reclaimed();
        assert_eq!(taken.len(), 1);
        assert_eq!(taken[0].name, "hoarder");
        assert_eq!(taken[0].reason, TakenBack::Overdue);
        assert!(taken[0].stalled, "it never delivered");
        assert_eq!(s.worker(&hoarder).unwrap().leases_taken_back, 1);
        // Its next heartbeat hears of it; the job goes to the honest worker,
        // and the stalled hoarder may hold one job only.
        let g = s.lease(&hoarder, 5, &[hoarded.lease], clock.now()).unwrap();
        assert_eq!(g.revoked, vec![hoarded.lease]);
        assert_eq!(g.jobs.len(), 1);
        assert!(
            s.lease(&hoarder, 5, &[g.jobs[0].lease], clock.now())
                .unwrap()
                .jobs
                .is_empty()
        );
        let again = s.lease(&honest, 1, &[], clock.now()).unwrap();
        assert_eq!(
            jobs_of(&again),
            vec![hoarded.job.0 + 2],
            "after the hoarder's new one"
        );
        assert!(s.take_reclaimed().is_empty());
    }

    #[test]
    fn while_others_wait_no_identity_holds_more_than_its_fair_share() {
        let (mut s, mut clock) = setup(&[1; 21]);
        let busy = s.register("busy", 1, None, clock.now()).unwrap();
        let g = s.lease(&busy, 16, &[], clock.now()).unwrap();
        let held: Vec<LeaseId> = g.jobs.iter().map(|j| j.lease).collect();
        let honest = s.register("honest", 1, None, clock.now()).unwrap();
        let mine = s.lease(&honest, 16, &[], clock.now()).unwrap();
        assert_eq!(mine.jobs.len(), 5, "the rest of the pending jobs");
        let mine: Vec<LeaseId> = mine.jobs.iter().map(|j| j.lease).collect();
        // Work just granted is not taken back.
        assert!(
            s.lease(&honest, 16, &mine, clock.now())
                .unwrap()
                .jobs
                .is_empty()
        );
        // A lease lifetime later `busy` delivers one of its jobs, and the
        // honest worker still waits: `busy`, holding 15 of 20 leased jobs,
        // gives back all above its share of 10.
        clock.advance(30);
        first_copy(&mut s, g.jobs[0].job, held[0], 1);
        s.note_copy(&busy, held[0], 1, clock.now());
        s.lease(&busy, 0, &held[1..], clock.now()).unwrap();
        let got = s.lease(&honest, 16, &mine, clock.now()).unwrap();
        assert_eq!(got.jobs.len(), 5);
        let taken = s.take_reclaimed();
        assert_eq!(taken.len(), 5);
        assert!(
            taken.iter().all(|r| r.reason == TakenBack::OverShare
                && r.name == "busy"
                && !r.stalled)
        );
        let ident = s.worker(&busy).unwrap().identity;
        assert_eq!(s.leases.held_by_identity(ident), 10);
    }

    #[test]
    fn an_identity_without_progress_has_no_share_while_others_wait() {
        let (mut s, mut clock) = setup(&[1; 20]);
        let hoarder = s.register("hoarder", 1, None, clock.now()).unwrap();
        let held: Vec<LeaseId> = (s.lease(&hoarder, 16, &[], clock.now()).unwrap().jobs)
            .iter()
            .map(|j| j.lease)
            .collect();
        let honest = s.register("honest", 1, None, clock.now()).unwrap();
        let mine = s.lease(&honest, 4, &[], clock.now()).unwrap();
        let mine: Vec<LeaseId> = mine.jobs.iter().map(|j| j.lease).collect();
        clock.advance(31);
        s.lease(&hoarder, 0, &held, clock.now()).unwrap();
        let got = s.lease(&honest, 16, &mine, clock.now()).unwrap();
        assert_eq!(got.jobs.len(), 12, "all it may hold: 16 less its 4");
        let taken = s.take_reclaimed();
        assert_eq!(taken.len(), 16, "every old lease of the hoarder");
        assert!(taken.iter().all(|r| r.name == "hoarder" && r.stalled));
        // Stalled: one job at a time, and the honest worker gets the rest.
        let g = s.lease(&hoarder, 16, &held, clock.now()).unwrap();
        assert_eq!((g.revoked.len(), g.jobs.len()), (16, 1));
    }

    /// See: issue 18, item 7: 20,000 registrations from one address grew
    /// memory for good.
    #[test]
    fn registrations_are_bounded_per_identity_and_per_address() {
        let (mut s, clock) = setup(&[1]);
        let host = Some(IpAddr::from([10, 1, 1, 1]));
        for i in 0..MAX_REGISTRATIONS_PER_IDENTITY {
            s.register(&format!("w{i}"), 1, host, clock.now()).unwrap();
        }
        let refused = s.register("one-more", 1, host, clock.now()).unwrap_err();
        assert!(matches!(
            refused,
            Error::Refused(Refusal::TooManyRegistrations {
                per: RegistrationLimit::Identity,
                limit: MAX_REGISTRATIONS_PER_IDENTITY,
                ..
            })
        ));
        assert!(
            refused.to_string().contains("64 live registrations"),
            "{refused}"
        );
        // On loopback every name is an identity; the address bounds them.
        let lo = Some(IpAddr::from([127, 0, 0, 1]));
        for i in 0..MAX_REGISTRATIONS_PER_ADDRESS {
            s.register(&format!("p{i}"), 1, lo, clock.now()).unwrap();
        }
        assert!(matches!(
            s.register("p-extra", 1, lo, clock.now()),
            Err(Error::Refused(Refusal::TooManyRegistrations {
                per: RegistrationLimit::Address,
                ..
            }))
        ));
    }

    #[test]
    fn a_forgotten_workers_memory_is_freed() {
        let (mut s, mut clock) = setup(&[1; 4]);
        s.register_local(1, clock.now());
        let lo = Some(IpAddr::from([127, 0, 0, 1]));
        let mut ids = vec![];
        for i in 0..1000 {
            ids.push(
                s.register(&format!("flood-{i}"), 1, lo, clock.now())
                    .unwrap(),
            );
        }
        let w = &ids[0];
        let g = s.lease(w, 1, &[], clock.now()).unwrap().jobs[0].clone();
        s.note_copy(w, g.lease, 1, clock.now());
        assert_eq!(s.worker_entries(), [1001, 1000, 1, 1]);
        let capacity = s.workers.capacity();
        // Silent for three lease lifetimes: forgotten, with everything kept
        // for them; the local threads stay.
        s.expire(clock.advance(91));
        s.prune_workers(clock.now());
        assert_eq!(s.worker_entries(), [1, 0, 0, 0]);
        assert!(
            s.workers.capacity() < capacity / 4,
            "the map gave its memory back"
        );
        assert!(matches!(
            s.lease(w, 1, &[], clock.now()),
            Err(Error::UnknownWorker { .. })
        ));
        // The address may register again.
        s.register("back", 1, lo, clock.now()).unwrap();
    }

    #[test]
    fn a_closed_scheduler_grants_nothing_but_still_renews() {
        let (mut s, mut clock) = setup(&[1, 1]);
        let a = s.register("a", 1, None, clock.now()).unwrap();
        let l = s.lease(&a, 1, &[], clock.now()).unwrap().jobs[0].lease;
        s.close();
        clock.advance(20);
        let g = s.lease(&a, 5, &[l], clock.now()).unwrap();
        assert!(g.jobs.is_empty() && g.revoked.is_empty());
        assert!(s.expire(clock.advance(20)).is_empty(), "renewed at t=20");
    }

    #[test]
    fn completion_is_announced_to_every_recent_worker() {
        let (mut s, mut clock) = setup(&[1]);
        let a = s.register("a", 1, None, clock.now()).unwrap();
        let b = s.register("b", 1, None, clock.now()).unwrap();
        let _local = s.register_local(2, clock.now());
        let l = s.lease(&a, 1, &[], clock.now()).unwrap().jobs[0].lease;
        first_copy(&mut s, JobId(0), l, 1);
        assert_eq!(
            s.untold_workers(clock.now()),
            2,
            "the local threads do not count"
        );
        s.mark_told(&a);
        assert!(s.lease(&b, 1, &[], clock.now()).unwrap().run_complete);
        assert_eq!(s.untold_workers(clock.now()), 0);
        // Workers gone for long are forgotten.
        s.prune_workers(clock.advance(3600));
        assert!(s.worker(&a).is_none());
    }

    #[test]
    fn restored_jobs_are_never_granted() {
        let (mut s, clock) = setup(&[5, 4, 3]);
        let restored = Settlement {
            job: JobId(0),
            lease: None,
            counted_before: None,
            counted: Some(tally(10)),
            work: 5,
            attempts: 1,
            votes: 1,
            settled: true,
            reporters: vec![],
            kernels: vec![],
            losers: vec![],
            beaten: crate::core::quorum::Beaten::default(),
            needs_trusted: false,
            disputed: false,
            solutions_missing: false,
            confirmed: vec![],
            unchecked: false,
        };
        s.settle(&restored, false).unwrap();
        s.restore_attempts(JobId(1), 3);
        s.restore_duplicates(2, 1);
        let a = s.register("a", 1, None, clock.now()).unwrap();
        let g = s.lease(&a, 3, &[], clock.now()).unwrap();
        assert_eq!(jobs_of(&g), vec![1, 2]);
        assert_eq!(g.jobs[0].attempts, 4);
        assert_eq!(s.tally().total, 10);
        assert_eq!((s.confirmations(), s.conflicts()), (2, 1));
        let p = s.counters(clock.now());
        assert_eq!(
            (p.jobs, p.jobs_done, p.work_done, p.work_total),
            (3, 1, 5, 12)
        );
        assert_eq!(p.jobs_done_here, 0);
    }

    /// Found by tests/fuzz_messages.rs: a worker registered with 2^30
    /// threads or more made its next Lease overflow the lease cap (a panic in
    /// debug builds, a wrong cap in release builds).
    #[test]
    fn a_huge_thread_count_caps_leases_without_overflow() {
        let (mut s, clock) = setup(&[1; 40]);
        for threads in [1 << 30, u32::MAX] {
            let w = s.register("greedy", threads, None, clock.now()).unwrap();
            let g = s.lease(&w, 8, &[], clock.now()).unwrap();
            assert_eq!(g.jobs.len(), 8);
        }
    }
}
