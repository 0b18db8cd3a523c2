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

mod restore;
pub(crate) use restore::Restorer;

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

    /// The doors that only a restore uses (see [`Restorer`]).
    pub(crate) fn restorer(&mut self) -> Restorer<'_> {
        Restorer { sched: self }
    }

    /// The id of identity `name`, added if new (restoring stored copies).
    pub fn intern(&mut self, name: &str) -> IdentityId {
        self.identities.intern(name)
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

    /// True when `job` waits for the check of its stored copies.
    pub fn is_restoring(&self, job: JobId) -> bool {
        self.phase(job) == Some(Phase::Restoring)
    }

    /// Jobs waiting for the check of their stored copies.
    pub fn restoring(&self) -> u64 {
        self.restoring
    }

    /// True while the stored copies of a restart are not all checked.
    pub fn store_unchecked(&self) -> bool {
        self.unchecked_store
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
        self.restorer().restore_worker(
            id.clone(),
            &name,
            &identity,
            address,
            threads,
            now,
        );
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
            return self
                .restorer()
                .restore_lease(job, lease, worker, attempts, now);
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
            } else if trusted {
                (!reported).then(|| other_kernel(&open.kernels))
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

#[cfg(test)]
mod tick_scans;

#[cfg(test)]
mod tests;
