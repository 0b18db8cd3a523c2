//! Verification: which jobs are computed twice, who may compute a copy, and
//! which copy of a job's result counts.
//!
//! No worker is trusted: a faulty DIMM or a lying program returns counts
//! that pass every invariant check (`SubProblem::check`), so the only
//! defence is to compute again, somewhere else, and compare. The only
//! computations trusted are the coordinator's own threads (they hold the
//! store and add up the totals: nothing is safe if they are not) and the
//! identities the operator names (`--trust`). This module is the rule book,
//! pure and synchronous; the ledger applies it to stored copies, and the
//! scheduler hands out the copies it asks for.
//!
//! # The rules
//!
//! * **Identities.** Verification tells computations apart by who made them:
//!   a remote worker is its credential (client certificate or per-machine
//!   token, see `crate::credentials`), else the IP address it called from,
//!   so that one machine cannot outvote the others by registering under
//!   several names; only on loopback (one machine, as in tests) does the
//!   registration name tell processes apart (`name@127.0.0.1`). The
//!   coordinator's threads are one identity, [`LOCAL`], whatever kernel they
//!   run. Two copies from one untrusted identity are one vote, for the
//!   result of the first it sent: copies are judged in the order received,
//!   which the store keeps by stamping each job's copies strictly apart
//!   (`nq_store::in_received_order`), so a worker that contradicts itself
//!   votes the same way every time its job is judged. A worker never
//!   checks itself. A trusted identity's copies count once per kernel:
//!   the trusted machine may check itself only with another kernel, which
//!   catches a faulty vector unit or a miscompiled kernel.
//! * **Selection.** A share of the jobs ([`Policy::fraction`]) is chosen for a
//!   second copy by a keyed hash of the job id and the run's secret: the same
//!   jobs in every session, unknown to workers. An untrusted worker's lease
//!   never names a kernel, so it cannot tell a check from a first copy.
//! * **Trusted copies decide.** When a job has trusted copies, the class of
//!   equal results they agree on counts, whatever the number of untrusted
//!   copies against it; every untrusted identity outside it loses. A
//!   trusted copy alone against every other copy first checks itself on a
//!   second kernel, and trusted copies that disagree wait for a kernel that
//!   breaks the tie. A selected job with no dispute needs its second copy,
//!   untrusted or on another trusted kernel.
//! * **Kernel diversity for GPU copies.** Checks by untrusted workers never
//!   name a kernel, so two GPU workers can agree on a GPU kernel's bug that
//!   their start-up self-test (N = 12) misses: a count wrong only at large
//!   N. A second share of the jobs, the *CPU sample*
//!   ([`Policy::gpu_sample`], drawn by the keyed hash with another salt, so
//!   independent of the selection), is recomputed by the trusted side on a
//!   CPU kernel when every copy of the job ran on a GPU ([`GPU_KERNEL`]): a
//!   sampled job whose copies would settle it waits instead for a trusted
//!   copy, and the scheduler asks the coordinator's threads or a trusted
//!   machine for one on a CPU kernel. From there the rules above apply: a
//!   trusted copy that disagrees checks itself on a second kernel, then
//!   decides, and the GPU workers lose the conflict. Without a trusted
//!   computation at work ([`Rules::arbiter`]) the sample is not taken, so
//!   that no job waits for a voice that cannot come: a GPU run that wants
//!   it keeps `--local-threads` above 0 or names a `--trust` machine.
//! * **Disputes.** Untrusted copies that disagree wait for a trusted copy,
//!   on a kernel none of them ran, while a trusted computation is available
//!   ([`Rules::arbiter`]): a majority of untrusted identities may be one
//!   attacker's addresses. Only without one does the majority decide.
//! * **Votes** (no trusted copy). The copies of a job fall into classes of
//!   equal results. A class's votes are its distinct identities that are not
//!   banned. The leader is the class with the most votes (ties: the class
//!   seen first). A job is *settled* when its leader has strictly more votes
//!   than any other class and at least the votes it needs: 2 when its valid
//!   copies disagree, when every voter of the leader is suspect (has lost a
//!   conflict), or when the job was selected or every voter of the leader is
//!   on probation and a second machine or the arbiter can check it; 1
//!   otherwise. An unsettled job gets another copy from an identity that
//!   has not reported it yet.
//! * **Probation.** Every untrusted identity starts on probation, after
//!   BOINC's adaptive replication: until [`PROBATION`] of its results were
//!   confirmed by another identity (the job settled with its copy in the
//!   leading class and a second, unsuspected voter there), each of its
//!   results needs a second vote, whatever the selection says. After that it
//!   is spot-checked at the selection's share like everyone else, and its
//!   results still waiting for a check only because it was on probation are
//!   judged again (they count on its vote). `--verify 0` turns probation off
//!   with every other check. Any two identities may confirm each other, two
//!   bare addresses included: two addresses that agree on a lie are two
//!   votes with or without probation, so refusing their confirmations would
//!   stop no lie, and would double every job of an honest cluster that
//!   shares one token. Credentials make a second voice cost what the
//!   operator makes it cost; addresses make it free, probation or not.
//! * **No wait for a voice that cannot come.** A check needs a second
//!   machine at work, and a machine is at work only while it delivers:
//!   heard from within a lease lifetime, with a copy delivered within its
//!   progress window (`Allowances::without_progress`). A hoarder, or a
//!   worker that has not delivered yet, is no second machine; a worker that
//!   drains leaves at once; the coordinator's threads and the operator's own
//!   workers (the [`LOCAL`] identity) are one machine. While only one
//!   machine delivers and no arbiter is available, a result that needs a
//!   check because the job was selected or its voters are on probation
//!   settles on its one vote, so that the run does not wait for a machine
//!   that may never come, and is marked *unchecked*: a run that ends with
//!   such jobs ends as `unchecked`, never as `complete`. When a second
//!   machine starts delivering, the unchecked jobs are judged again and get
//!   their check. Disputes and suspect voters still wait: the rules cannot
//!   settle them on one vote.
//! * **Reputation.** When a job with disagreeing copies settles, every
//!   identity in a losing class has lost a conflict. One loss makes an
//!   identity suspect: each of its results needs a second vote, so everything
//!   it computed alone is recomputed by others. [`Policy::ban_after`] losses
//!   ban it (its calls are refused and its copies no longer vote), but only
//!   when it lost against a trusted computation or against two distinct
//!   credentials ([`credentialed`]): addresses cost an attacker nothing, and
//!   two of them on one machine must not get an honest worker banned.
//!
//! The leader's tally is what counts toward the totals; a job that settles
//! on another class than the one counted so far swaps its contribution.

use std::collections::HashMap;

use nq_store::JobId;

/// The index of an identity in [`Identities`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdentityId(pub u32);

/// The default share of jobs computed twice once a remote worker takes part
/// (see [`Fraction::Auto`]).
pub const AUTO_FRACTION: f64 = 0.02;

/// The default number of lost conflicts after which a worker is refused.
pub const DEFAULT_BAN_AFTER: u32 = 3;

/// The kernel name a GPU copy reports (`nq_gpu::KERNEL_NAME`, which
/// `nq-worker --gpu` sends): such copies are what the CPU sample
/// ([`Policy::gpu_sample`]) checks. A name is compared, not parsed: a copy
/// stored before kernels were recorded names none, and is no GPU copy.
pub const GPU_KERNEL: &str = "cuda";

/// The default share of the jobs, among those whose every copy ran on a
/// GPU, that the trusted side recomputes on a CPU kernel
/// ([`Policy::gpu_sample`]): 0.5 %, one job in 200.
///
/// The rate trades two things. Its cost falls on the trusted side, which
/// is small: the coordinator's cores are worth about 1/50 of one GPU, so a
/// sample of a share R of one GPU's jobs keeps them busy R × 50 of the
/// time. At 0.5 % that is a quarter of the coordinator's cores per GPU,
/// half for two GPUs, which leaves room for the first copies, disputes and
/// probation checks they also compute; with G GPUs, keep R near 0.01 / G
/// (`--gpu-sample`) or add CPU machines under `--trust`, or the sampled
/// jobs wait in a queue that becomes the run's tail. What it buys: a GPU
/// kernel bug that makes a share f of the jobs wrong is caught at the
/// first sampled wrong job; after J GPU jobs it is still unseen with
/// probability (1 − R·f)^J ≈ e^(−R·f·J). At 0.5 %, a bug on 10 % of the
/// jobs (say, every job above some size) is caught within 10,000 jobs with
/// probability 1 − e^(−5) ≈ 99.3 %, and a bug on 1 % of them within
/// 100,000 jobs, the same; at N = 27 and about 10^7 jobs, a bug on 0.1 %
/// of the jobs is seen before the run is half done with probability
/// 1 − e^(−25). A bug on one job in a million is beyond any sample the
/// trusted side can afford: that needs a second run or `--verify 1` with
/// CPU workers (docs/record-runs.md).
pub const DEFAULT_GPU_SAMPLE: f64 = 0.005;

/// Results of a remote identity that another identity must confirm before
/// its results count on one vote.
///
/// Ten, as BOINC's adaptive replication (a host is not trusted while its
/// count of consecutive valid results is below 10). The number trades two
/// costs. Each result on probation is computed twice, so a run pays about
/// `PROBATION` extra jobs per machine, plus the jobs the machine leased before
/// its tenth confirmation came back, about two rounds of its threads
/// (BENCHMARKS.md §10: at 1,000 machines, 10,000 to 32,000 extra jobs against
/// the half million of a run at N = 27, where a cluster of that size is worth
/// having; a small run on a few machines pays much more). Against that,
/// a machine that lies on every result never leaves probation, so none of
/// its copies ever counts alone; a liar must compute ten jobs honestly before
/// it may lie, and then it is still spot-checked, and each lost check
/// makes it suspect again (every result then needs a second vote). A larger
/// number buys little against a patient liar and costs every honest machine
/// of every run; a smaller one lets a faulty machine (a bad DIMM that fails
/// now and then) through on a short lucky streak.
pub const PROBATION: u32 = 10;

/// How many jobs are computed twice.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Fraction {
    /// [`AUTO_FRACTION`] of the jobs once copies came from two machines (two
    /// workers, or a worker and the coordinator's own threads), none before:
    /// a lone machine cannot be checked by another one, and waiting for one
    /// that may never come would stall the run (one machine's kernels are
    /// checked against each other at start-up instead).
    Auto,
    /// This share, 0.0 to 1.0, whoever computes.
    Fixed(f64),
}

/// The verification settings of a run.
#[derive(Clone, Debug)]
pub struct Policy {
    /// Keys the choice of the jobs to compute twice.
    pub secret: [u8; 16],
    /// The share of jobs computed twice.
    pub fraction: Fraction,
    /// Lost conflicts after which an identity is banned (at least 1).
    pub ban_after: u32,
    /// The share of the jobs, 0.0 to 1.0, that a trusted computation
    /// recomputes on a CPU kernel when every copy ran on a GPU (the CPU
    /// sample, see the module doc; [`DEFAULT_GPU_SAMPLE`]).
    pub gpu_sample: f64,
}

/// What the keyed-hash samples of a [`Policy`] chose a job for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Selection {
    /// A second copy ([`Policy::selected`]).
    pub check: bool,
    /// A trusted copy on a CPU kernel, should every copy run on a GPU
    /// ([`Policy::cpu_sampled`]).
    pub cpu: bool,
}

impl Selection {
    /// Chosen for nothing.
    pub const NONE: Selection = Selection {
        check: false,
        cpu: false,
    };
    /// Chosen for a second copy, not for the CPU sample.
    pub const CHECK: Selection = Selection {
        check: true,
        cpu: false,
    };
}

/// A keyed 64-bit mix (two rounds of SplitMix64's finaliser around the key
/// halves). Not a cryptographic MAC: it keeps the selection unpredictable to
/// a worker that does not know the secret and sees only its own leases.
fn keyed(secret: &[u8; 16], job: JobId, salt: u64) -> u64 {
    fn mix(mut z: u64) -> u64 {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    let (a, b) = secret.split_at(8);
    let a = u64::from_le_bytes(a.try_into().expect("8 bytes"));
    let b = u64::from_le_bytes(b.try_into().expect("8 bytes"));
    mix(mix(job.0 ^ a ^ salt.wrapping_mul(0x9e37_79b9_7f4a_7c15)) ^ b)
}

impl Policy {
    /// The share of jobs computed twice, given whether copies came from a
    /// second machine in the run.
    pub fn share(&self, second_source: bool) -> f64 {
        match self.fraction {
            Fraction::Fixed(f) => f,
            Fraction::Auto if second_source => AUTO_FRACTION,
            Fraction::Auto => 0.0,
        }
    }

    /// True when `job` is chosen for a second copy.
    pub fn selected(&self, job: JobId, second_source: bool) -> bool {
        self.drawn(job, 0, self.share(second_source))
    }

    /// True when `job` is in the CPU sample ([`Policy::gpu_sample`]): should
    /// every copy of it run on a GPU, a trusted computation recomputes it on
    /// a CPU kernel before it settles. Drawn with another salt than the
    /// selection, so that the two samples are independent. Never under
    /// `--verify 0` (`Fraction::Fixed(0.0)`), which asks for no check.
    pub fn cpu_sampled(&self, job: JobId) -> bool {
        self.probation() > 0 && self.drawn(job, 1, self.gpu_sample)
    }

    /// What `job` is chosen for, given whether copies came from a second
    /// machine in the run.
    pub fn selection(&self, job: JobId, second_source: bool) -> Selection {
        Selection {
            check: self.selected(job, second_source),
            cpu: self.cpu_sampled(job),
        }
    }

    /// True when the keyed hash of `job` with `salt` falls in the first
    /// `share` of its range.
    fn drawn(&self, job: JobId, salt: u64, share: f64) -> bool {
        if share >= 1.0 {
            return true;
        }
        if share <= 0.0 {
            return false;
        }
        // share < 1, so the product is below 2^64.
        let threshold = (share * 18_446_744_073_709_551_616.0) as u64;
        keyed(&self.secret, job, salt) < threshold
    }

    /// Confirmed results a remote identity needs to leave probation:
    /// [`PROBATION`], or 0 under `--verify 0` (`Fraction::Fixed(0.0)`), which
    /// asks for no check at all.
    pub fn probation(&self) -> u32 {
        match self.fraction {
            Fraction::Fixed(f) if f <= 0.0 => 0,
            _ => PROBATION,
        }
    }
}

/// The verification identity of the coordinator's own threads: one voice,
/// whatever kernel they ran (see `Scheduler::register_local`).
pub const LOCAL: &str = "local";

/// True for the identity of the coordinator's own threads, which are
/// trusted from the start (see the module doc): `local`, or `local:KERNEL`
/// as stores written before the threads were one voice name them. A remote
/// identity always contains `@`, `:`-prefixed credentials (`token:`,
/// `cert:`) or is an address, so a worker cannot pass for one by its
/// registration name.
pub fn trusted_from_start(name: &str) -> bool {
    name == LOCAL
        || name
            .strip_prefix("local:")
            .is_some_and(|kernel| !kernel.is_empty() && !kernel.contains('@'))
}

/// True for an identity that a credential proves (a per-worker token or a
/// client certificate, see `crate::credentials`): making another one costs
/// the attacker a credential the operator issued, where another address
/// costs nothing.
pub fn credentialed(name: &str) -> bool {
    name.starts_with("token:") || name.starts_with("cert:")
}

/// Who beat the losers of a dispute: what a ban needs (see
/// [`Identities::is_banned`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Beaten {
    /// A trusted computation decided.
    pub by_trusted: bool,
    /// The credentialed identities among the winners.
    pub by_credentials: Vec<IdentityId>,
}

impl Beaten {
    /// Beaten by a trusted computation.
    pub fn trusted() -> Beaten {
        Beaten {
            by_trusted: true,
            by_credentials: Vec::new(),
        }
    }
}

/// Whom an identity lost its conflicts against, as far as a ban cares: a
/// trusted computation, and up to two distinct credentialed identities.
#[derive(Clone, Copy, Debug, Default)]
struct Against {
    trusted: bool,
    credentials: [Option<IdentityId>; 2],
}

impl Against {
    fn note(&mut self, beaten: &Beaten) {
        self.trusted |= beaten.by_trusted;
        for &c in &beaten.by_credentials {
            match self.credentials {
                [None, _] => self.credentials[0] = Some(c),
                [Some(a), None] if a != c => self.credentials[1] = Some(c),
                _ => {}
            }
        }
    }

    /// True when its losses may ban: a trusted computation beat it, or two
    /// distinct credentials did. Losses to address identities alone never
    /// ban, because addresses cost an attacker nothing: two of them on one
    /// machine would otherwise get any honest worker banned.
    fn may_ban(&self) -> bool {
        self.trusted || self.credentials[1].is_some()
    }
}

/// Every identity seen in the run, with its lost conflicts and its confirmed
/// results (its record for probation).
#[derive(Debug, Default)]
pub struct Identities {
    names: Vec<String>,
    lost: Vec<u32>,
    /// Whom each identity lost against.
    against: Vec<Against>,
    /// True for the identities the operator trusts (`--trust`) and the
    /// coordinator's own threads: their copies decide disputes.
    trusted: Vec<bool>,
    /// Results confirmed by another identity (saturating).
    confirmed: Vec<u32>,
    by_name: HashMap<String, IdentityId>,
    /// Names the operator trusts, whether seen yet or not.
    trusted_names: std::collections::HashSet<String>,
    /// The trusted identities seen so far (few: the threads and the
    /// operator's machines), so that asking for them costs nothing at
    /// 50,000 identities.
    trusted_seen: Vec<IdentityId>,
    /// Labels for people, where they differ from the name.
    labels: HashMap<IdentityId, String>,
}

impl Identities {
    /// The id of `name`, added if new.
    pub fn intern(&mut self, name: &str) -> IdentityId {
        if let Some(&id) = self.by_name.get(name) {
            return id;
        }
        let id = IdentityId(u32::try_from(self.names.len()).unwrap_or(u32::MAX));
        self.names.push(name.to_owned());
        self.lost.push(0);
        self.against.push(Against::default());
        let trusted = trusted_from_start(name) || self.trusted_names.contains(name);
        self.trusted.push(trusted);
        if trusted {
            self.trusted_seen.push(id);
        }
        self.confirmed.push(0);
        self.by_name.insert(name.to_owned(), id);
        id
    }

    /// Trusts `name` (an identity of the operator's own machines): its
    /// copies decide disputes and it needs no probation.
    pub fn trust(&mut self, name: &str) {
        self.trusted_names.insert(name.to_owned());
        if let Some(id) = self.get(name)
            && !self.trusted[id.0 as usize]
        {
            self.trusted[id.0 as usize] = true;
            self.trusted_seen.push(id);
        }
    }

    /// True for an identity whose copies decide disputes: the
    /// coordinator's own threads and the identities the operator trusts.
    pub fn is_trusted(&self, id: IdentityId) -> bool {
        self.trusted.get(id.0 as usize).copied().unwrap_or(false)
    }

    /// The ids of the trusted identities seen so far.
    pub fn trusted_ids(&self) -> impl Iterator<Item = IdentityId> + '_ {
        self.trusted_seen.iter().copied()
    }

    /// The id of `name`, if seen.
    pub fn get(&self, name: &str) -> Option<IdentityId> {
        self.by_name.get(name).copied()
    }

    /// The name of `id`.
    pub fn name(&self, id: IdentityId) -> &str {
        self.names.get(id.0 as usize).map_or("?", String::as_str)
    }

    /// The name of `id` for people: `name@address` as first registered,
    /// where the identity is an address alone.
    pub fn label(&self, id: IdentityId) -> &str {
        self.labels
            .get(&id)
            .map_or_else(|| self.name(id), String::as_str)
    }

    /// Gives `id` a label for people, unless it has one.
    pub fn set_label(&mut self, id: IdentityId, label: &str) {
        if self.name(id) != label {
            self.labels.entry(id).or_insert_with(|| label.to_owned());
        }
    }

    /// Conflicts `id` lost.
    pub fn lost(&self, id: IdentityId) -> u32 {
        self.lost.get(id.0 as usize).copied().unwrap_or(0)
    }

    /// Records a conflict lost against `beaten`'s winners; returns the new
    /// count. A trusted identity is never charged: its copies decide.
    pub fn add_loss(&mut self, id: IdentityId, beaten: &Beaten) -> u32 {
        if self.is_trusted(id) {
            return self.lost(id);
        }
        if let Some(a) = self.against.get_mut(id.0 as usize) {
            a.note(beaten);
        }
        match self.lost.get_mut(id.0 as usize) {
            Some(l) => {
                *l = l.saturating_add(1);
                *l
            }
            None => 0,
        }
    }

    /// True once `id` lost a conflict: its results need a second vote.
    pub fn is_suspect(&self, id: IdentityId) -> bool {
        self.lost(id) >= 1
    }

    /// Results of `id` that another identity confirmed.
    pub fn confirmed(&self, id: IdentityId) -> u32 {
        self.confirmed.get(id.0 as usize).copied().unwrap_or(0)
    }

    /// Records a result of `id` confirmed by another identity; returns the
    /// new count.
    pub fn add_confirmation(&mut self, id: IdentityId) -> u32 {
        match self.confirmed.get_mut(id.0 as usize) {
            Some(c) => {
                *c = c.saturating_add(1);
                *c
            }
            None => 0,
        }
    }

    /// True while `id` has fewer than `probation` confirmed results and is
    /// not the coordinator's own threads: each of its results needs a second
    /// vote (where a second machine can give one).
    pub fn on_probation(&self, id: IdentityId, probation: u32) -> bool {
        self.confirmed(id) < probation && !self.is_trusted(id)
    }

    /// Identities still on probation, with their labels and confirmed
    /// results (for logs and the status).
    pub fn probationers(&self, probation: u32) -> impl Iterator<Item = (&str, u32)> {
        (0..self.names.len())
            .map(|i| IdentityId(i as u32))
            .filter(move |&id| self.on_probation(id, probation))
            .map(|id| (self.label(id), self.confirmed(id)))
    }

    /// True once `id` lost `ban_after` conflicts, against a trusted
    /// computation or against two distinct credentialed identities: it is
    /// refused, and its copies do not vote. Losses to address identities
    /// alone make it suspect, never banned (see [`credentialed`]).
    pub fn is_banned(&self, id: IdentityId, ban_after: u32) -> bool {
        self.lost(id) >= ban_after.max(1)
            && self
                .against
                .get(id.0 as usize)
                .is_some_and(Against::may_ban)
    }

    /// Every identity that lost a conflict, with its label and losses.
    pub fn faulty(&self) -> impl Iterator<Item = (IdentityId, &str, u32)> {
        self.lost
            .iter()
            .enumerate()
            .filter(|(_, l)| **l > 0)
            .map(|(i, &l)| {
                let id = IdentityId(i as u32);
                (id, self.label(id), l)
            })
    }
}

/// One copy of a job's result as the rules see it: who made it, on which
/// kernel, and which class of equal results it is in (classes are numbered
/// in the order their first copy was received).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Vote {
    /// Who computed the copy.
    pub identity: IdentityId,
    /// Its class.
    pub class: usize,
    /// True when `identity` is trusted ([`Identities::is_trusted`]).
    pub trusted: bool,
    /// True when `identity` is a credential ([`credentialed`]).
    pub credentialed: bool,
    /// The kernel that computed it, where named: trusted copies are told
    /// apart by kernel, since the trusted machine checks itself only with
    /// another kernel.
    pub kernel: Option<nq_core::search::Kernel>,
    /// True when the copy ran on a GPU ([`GPU_KERNEL`]).
    pub gpu: bool,
}

/// The state of the run the rules depend on besides a job's copies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rules {
    /// Lost conflicts after which an identity's copies do not vote.
    pub ban_after: u32,
    /// Confirmed results an identity needs to leave probation (0: none).
    pub probation: u32,
    /// True while a second machine is at work, so that a check is possible.
    pub second_machine: bool,
    /// True while a trusted computation is available (the coordinator's
    /// threads, or a trusted identity at work): disputes wait for it instead
    /// of a majority.
    pub arbiter: bool,
}

/// What the rules say about a job's copies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// The class that counts, if any copy votes.
    pub leader: Option<usize>,
    /// True when the job needs no further copy.
    pub settled: bool,
    /// The leader's votes: its untrusted voters plus its trusted kernels.
    pub votes: u32,
    /// Identities in losing classes, set only when a job whose valid copies
    /// disagree settles.
    pub losers: Vec<IdentityId>,
    /// Who beat the losers.
    pub beaten: Beaten,
    /// Every identity that reported the job (none of them may compute it again,
    /// except a trusted one on another kernel).
    pub reporters: Vec<IdentityId>,
    /// True when the valid copies disagree.
    pub conflict: bool,
    /// True when the next copy must come from a trusted computation: a
    /// dispute while one is available, trusted copies that disagree, or GPU
    /// copies held for the CPU sample (on a CPU kernel, then).
    pub needs_trusted: bool,
    /// Identities whose copy another identity confirmed: the leader's
    /// untrusted voters, once the job settled on two votes or more, each of
    /// which has another voter in the leader that is not suspect.
    pub confirmed: Vec<IdentityId>,
    /// True when the job settled on one vote that needed a check no second
    /// machine could give (every voter of the leader is on probation, and
    /// only one machine is at work).
    pub unchecked: bool,
}

/// A class of equal results: its untrusted voters (one per identity, in
/// order) and its trusted copies (one per identity and kernel).
#[derive(Clone, Debug, Default)]
struct Class {
    voters: Vec<IdentityId>,
    credentialed: Vec<IdentityId>,
    trusted: Vec<(IdentityId, Option<nq_core::search::Kernel>)>,
}

impl Class {
    fn votes(&self) -> usize {
        self.voters.len() + self.trusted.len()
    }
}

/// The copies in classes: the valid ones (not banned, the first copy per
/// untrusted identity), and every identity that reported.
fn classify(
    copies: &[Vote],
    identities: &Identities,
    ban_after: u32,
) -> (Vec<Class>, Vec<IdentityId>) {
    let mut reporters: Vec<IdentityId> = Vec::new();
    let mut classes: Vec<Class> = Vec::new();
    for v in copies {
        let first = !reporters.contains(&v.identity);
        if first {
            reporters.push(v.identity);
        }
        if classes.len() <= v.class {
            classes.resize(v.class + 1, Class::default());
        }
        let class = &mut classes[v.class];
        if v.trusted {
            if !class.trusted.contains(&(v.identity, v.kernel)) {
                class.trusted.push((v.identity, v.kernel));
            }
        } else if first && !identities.is_banned(v.identity, ban_after) {
            // One identity, one vote.
            class.voters.push(v.identity);
            if v.credentialed {
                class.credentialed.push(v.identity);
            }
        }
    }
    (classes, reporters)
}

/// Applies the rules to a job's copies, in the order received. `selection`
/// says what the job was chosen for: a second copy, the CPU sample.
pub fn judge(
    copies: &[Vote],
    selection: Selection,
    identities: &Identities,
    rules: Rules,
) -> Verdict {
    let verdict = judge_votes(copies, selection.check, identities, rules);
    // The CPU sample: a job that would settle on GPU copies alone waits for
    // a trusted copy on a CPU kernel, while a trusted computation can give
    // one (no job waits for a voice that cannot come). Nothing was charged
    // or confirmed yet: both happen only when a job settles.
    let gpu_only = !copies.is_empty() && copies.iter().all(|v| v.gpu);
    if verdict.settled && selection.cpu && gpu_only && rules.arbiter {
        return Verdict {
            settled: false,
            needs_trusted: true,
            losers: vec![],
            beaten: Beaten::default(),
            confirmed: vec![],
            unchecked: false,
            ..verdict
        };
    }
    verdict
}

/// The rules but the CPU sample's ([`judge`]); `selected` says whether the
/// job was chosen for a second copy.
fn judge_votes(
    copies: &[Vote],
    selected: bool,
    identities: &Identities,
    rules: Rules,
) -> Verdict {
    let (classes, reporters) = classify(copies, identities, rules.ban_after);
    if classes.iter().any(|c| !c.trusted.is_empty()) {
        return judged_by_trusted(&classes, reporters, selected);
    }
    let mut leader: Option<usize> = None;
    for (c, class) in classes.iter().enumerate() {
        if class.votes() > 0 && leader.is_none_or(|l| class.votes() > classes[l].votes())
        {
            leader = Some(c);
        }
    }
    let Some(l) = leader else {
        return Verdict {
            leader: None,
            settled: false,
            votes: 0,
            losers: vec![],
            beaten: Beaten::default(),
            reporters,
            conflict: false,
            needs_trusted: false,
            confirmed: vec![],
            unchecked: false,
        };
    };
    let leaders = &classes[l].voters;
    let votes = leaders.len();
    let runner_up = others(&classes, l).map(Class::votes).max().unwrap_or(0);
    let conflict = classes.iter().filter(|c| c.votes() > 0).count() > 1;
    let all_suspect = leaders.iter().all(|&i| identities.is_suspect(i));
    let on_probation = leaders
        .iter()
        .all(|&i| identities.on_probation(i, rules.probation));
    // A check that only a second machine could give (the job was selected,
    // or its voters are on probation) is waited for only while one can give
    // it: a second machine delivering, or the arbiter.
    let check_possible = rules.second_machine || rules.arbiter;
    let wants_check = selected || on_probation;
    let needed = if conflict || all_suspect || (wants_check && check_possible) {
        2
    } else {
        1
    };
    // A dispute waits for the trusted computation where there is one: a
    // majority of untrusted identities may be one attacker's addresses.
    let needs_trusted = conflict && rules.arbiter;
    let settled = votes >= needed && votes > runner_up && !needs_trusted;
    // Without a second machine a probationer's copy, or a selected job's,
    // settles alone (the run must not wait for a machine that may never
    // come), and says so; the trusted computation, where there is one, can
    // always check it.
    let unchecked = settled && votes < 2 && wants_check;
    let confirmed = if settled && votes >= 2 {
        leaders
            .iter()
            .copied()
            .filter(|&i| leaders.iter().any(|&o| o != i && !identities.is_suspect(o)))
            .collect()
    } else {
        vec![]
    };
    let (losers, beaten) = if settled && conflict {
        let beaten = Beaten {
            by_trusted: false,
            by_credentials: classes[l].credentialed.clone(),
        };
        (losers_outside(&classes, l), beaten)
    } else {
        (vec![], Beaten::default())
    };
    Verdict {
        leader,
        settled,
        votes: votes as u32,
        losers,
        beaten,
        reporters,
        conflict,
        needs_trusted,
        confirmed,
        unchecked,
    }
}

/// The classes other than `l`.
fn others(classes: &[Class], l: usize) -> impl Iterator<Item = &Class> {
    classes
        .iter()
        .enumerate()
        .filter(move |&(c, _)| c != l)
        .map(|(_, class)| class)
}

/// The untrusted voters of the classes other than `l`.
fn losers_outside(classes: &[Class], l: usize) -> Vec<IdentityId> {
    others(classes, l)
        .flat_map(|c| c.voters.iter().copied())
        .collect()
}

/// The verdict on copies of which some are trusted: the trusted class
/// decides. The trusted machine's copies agree (else it checks itself on
/// another kernel until one class has two trusted kernels and more than any
/// other), and a job selected for a check that no untrusted copy disputes
/// needs a second copy, untrusted or on another trusted kernel. Untrusted
/// copies outside the trusted class lose, whatever their number: a trusted
/// computation is not outvoted.
fn judged_by_trusted(
    classes: &[Class],
    reporters: Vec<IdentityId>,
    selected: bool,
) -> Verdict {
    let mut l = 0;
    for (c, class) in classes.iter().enumerate() {
        if class.trusted.len() > classes[l].trusted.len() {
            l = c;
        }
    }
    let trusted = classes[l].trusted.len();
    let trusted_runner_up = others(classes, l)
        .map(|c| c.trusted.len())
        .max()
        .unwrap_or(0);
    let conflict = classes.iter().filter(|c| c.votes() > 0).count() > 1;
    let votes = classes[l].votes();
    let settled = if trusted_runner_up > 0 {
        trusted >= 2 && trusted > trusted_runner_up
    } else if conflict && classes[l].voters.is_empty() {
        // The trusted machine alone against every other copy: it checks
        // itself on another kernel before it bans anyone, so that one
        // fault of its own does not cost honest workers their standing.
        trusted >= 2
    } else {
        conflict || !selected || votes >= 2
    };
    // Every untrusted voter of a settled leader has a trusted copy beside it.
    let confirmed = if settled {
        classes[l].voters.clone()
    } else {
        vec![]
    };
    let losers = if settled && conflict {
        losers_outside(classes, l)
    } else {
        vec![]
    };
    Verdict {
        leader: Some(l),
        settled,
        votes: votes as u32,
        beaten: Beaten {
            by_trusted: !losers.is_empty(),
            by_credentials: classes[l].credentialed.clone(),
        },
        losers,
        reporters,
        conflict,
        needs_trusted: !settled && (trusted_runner_up > 0 || conflict),
        confirmed,
        unchecked: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(names: &[&str]) -> (Identities, Vec<IdentityId>) {
        let mut i = Identities::default();
        let v = names.iter().map(|n| i.intern(n)).collect();
        (i, v)
    }

    fn vote(identity: IdentityId, class: usize) -> Vote {
        Vote {
            identity,
            class,
            trusted: false,
            credentialed: false,
            kernel: None,
            gpu: false,
        }
    }

    /// The rules without probation, for the tests of the other rules (each
    /// of these was written before probation, for identities that would now
    /// have left it).
    const NO_PROBATION: Rules = Rules {
        ban_after: 3,
        probation: 0,
        second_machine: true,
        arbiter: false,
    };

    /// The default rules with `machines` at work.
    fn rules(second_machine: bool) -> Rules {
        Rules {
            ban_after: 3,
            probation: PROBATION,
            second_machine,
            arbiter: false,
        }
    }

    #[test]
    fn a_new_identity_needs_a_second_vote_until_others_confirmed_it_enough() {
        let (mut i, w) = ids(&["new@1", "old@2"]);
        let alone = judge(&[vote(w[0], 0)], Selection::NONE, &i, rules(true));
        assert!(!alone.settled, "a probationer's copy waits for a check");
        let checked = judge(
            &[vote(w[0], 0), vote(w[1], 0)],
            Selection::NONE,
            &i,
            rules(true),
        );
        assert!(checked.settled && checked.votes == 2 && !checked.unchecked);
        assert_eq!(
            checked.confirmed,
            vec![w[0], w[1]],
            "each confirms the other"
        );
        for _ in 0..PROBATION - 1 {
            i.add_confirmation(w[0]);
        }
        assert!(!judge(&[vote(w[0], 0)], Selection::NONE, &i, rules(true)).settled);
        i.add_confirmation(w[0]);
        assert!(!i.on_probation(w[0], PROBATION));
        let v = judge(&[vote(w[0], 0)], Selection::NONE, &i, rules(true));
        assert!(v.settled && !v.unchecked, "out of probation: one vote");
        assert!(v.confirmed.is_empty(), "one vote confirms nobody");
        // A selected job still needs its check.
        assert!(!judge(&[vote(w[0], 0)], Selection::CHECK, &i, rules(true)).settled);
    }

    #[test]
    fn a_suspect_confirms_nobody() {
        let (mut i, w) = ids(&["a@1", "suspect@2", "c@3"]);
        i.add_loss(w[1], &Beaten::trusted());
        let v = judge(
            &[vote(w[0], 0), vote(w[1], 0)],
            Selection::NONE,
            &i,
            rules(true),
        );
        assert!(v.settled);
        assert_eq!(v.confirmed, vec![w[1]], "the suspect is confirmed, not a");
        let v = judge(
            &[vote(w[0], 0), vote(w[1], 0), vote(w[2], 0)],
            Selection::NONE,
            &i,
            rules(true),
        );
        assert_eq!(v.confirmed, vec![w[0], w[1], w[2]]);
    }

    #[test]
    fn with_one_machine_at_work_a_probationer_settles_alone_as_unchecked() {
        let (i, w) = ids(&["lone@1"]);
        let v = judge(&[vote(w[0], 0)], Selection::NONE, &i, rules(false));
        assert!(v.settled && v.unchecked && v.votes == 1);
        // Suspects and disputes still wait: one machine cannot resolve them.
        let (mut i, w) = ids(&["lone@1", "gone@2"]);
        i.add_loss(w[0], &Beaten::trusted());
        assert!(!judge(&[vote(w[0], 0)], Selection::NONE, &i, rules(false)).settled);
        let v = judge(
            &[vote(w[0], 0), vote(w[1], 1)],
            Selection::NONE,
            &i,
            rules(false),
        );
        assert!(!v.settled && !v.unchecked);
    }

    #[test]
    fn with_one_machine_at_work_a_selected_job_settles_alone_as_unchecked() {
        // Out of probation: only the selection asks for the check (issue 26,
        // case 2: `--verify 1` with one identity used to wait forever).
        let (mut i, w) = ids(&["lone@1"]);
        for _ in 0..PROBATION {
            i.add_confirmation(w[0]);
        }
        let v = judge(&[vote(w[0], 0)], Selection::CHECK, &i, rules(false));
        assert!(v.settled && v.unchecked && v.votes == 1);
        // With a second machine at work, the check is waited for.
        let v = judge(&[vote(w[0], 0)], Selection::CHECK, &i, rules(true));
        assert!(!v.settled && !v.unchecked);
        // Not selected: one vote settles, checked by nothing it needed.
        let v = judge(&[vote(w[0], 0)], Selection::NONE, &i, rules(false));
        assert!(v.settled && !v.unchecked);
    }

    #[test]
    fn the_coordinators_threads_are_trusted_from_the_start_and_nobody_else() {
        let (i, w) = ids(&["local:avx2", "local:avx2@127.0.0.1", "10.0.0.7", "local:"]);
        let v = judge(&[vote(w[0], 0)], Selection::NONE, &i, rules(true));
        assert!(v.settled && !v.unchecked);
        for &other in &w[1..] {
            assert!(
                i.on_probation(other, PROBATION),
                "{} is on probation",
                i.name(other)
            );
        }
        let policy = |f| Policy {
            secret: [1; 16],
            fraction: f,
            ban_after: 3,
            gpu_sample: 0.0,
        };
        assert_eq!(policy(Fraction::Auto).probation(), PROBATION);
        assert_eq!(policy(Fraction::Fixed(0.5)).probation(), PROBATION);
        assert_eq!(policy(Fraction::Fixed(0.0)).probation(), 0, "--verify 0");
    }

    #[test]
    fn one_copy_settles_an_unselected_job_and_not_a_selected_one() {
        let (i, w) = ids(&["a@1"]);
        let v = judge(&[vote(w[0], 0)], Selection::NONE, &i, NO_PROBATION);
        assert!(v.settled && v.leader == Some(0) && v.votes == 1);
        let v = judge(&[vote(w[0], 0)], Selection::CHECK, &i, NO_PROBATION);
        assert!(!v.settled && v.leader == Some(0));
        assert_eq!(v.reporters, vec![w[0]]);
    }

    #[test]
    fn a_worker_cannot_confirm_itself() {
        let (i, w) = ids(&["a@1"]);
        let v = judge(
            &[vote(w[0], 0), vote(w[0], 0)],
            Selection::CHECK,
            &i,
            NO_PROBATION,
        );
        assert!(!v.settled);
        assert_eq!(v.votes, 1);
    }

    #[test]
    fn a_disagreement_needs_a_majority_and_charges_the_loser() {
        let (i, w) = ids(&["honest@1", "liar@2", "other@3"]);
        // The liar's copy came first.
        let two = [vote(w[1], 0), vote(w[0], 1)];
        let v = judge(&two, Selection::NONE, &i, NO_PROBATION);
        assert!(!v.settled, "one against one decides nothing");
        assert!(v.losers.is_empty());
        let three = [vote(w[1], 0), vote(w[0], 1), vote(w[2], 1)];
        let v = judge(&three, Selection::NONE, &i, NO_PROBATION);
        assert!(v.settled);
        assert_eq!(v.leader, Some(1));
        assert_eq!(v.losers, vec![w[1]]);
    }

    #[test]
    fn suspects_need_a_second_vote_and_banned_workers_do_not_vote() {
        let (mut i, w) = ids(&["liar@2", "honest@1"]);
        i.add_loss(w[0], &Beaten::trusted());
        assert!(!judge(&[vote(w[0], 0)], Selection::NONE, &i, NO_PROBATION).settled);
        i.add_loss(w[0], &Beaten::trusted());
        i.add_loss(w[0], &Beaten::trusted());
        assert!(i.is_banned(w[0], 3));
        let v = judge(&[vote(w[0], 0)], Selection::NONE, &i, NO_PROBATION);
        assert_eq!((v.leader, v.settled), (None, false));
        // An honest copy then settles it alone: the banned copy is no vote,
        // so there is no conflict to resolve.
        let v = judge(
            &[vote(w[0], 0), vote(w[1], 1)],
            Selection::NONE,
            &i,
            NO_PROBATION,
        );
        assert_eq!((v.leader, v.settled), (Some(1), true));
        assert!(v.losers.is_empty());
    }

    #[test]
    fn selection_follows_the_share_and_the_secret() {
        let policy = |f| Policy {
            secret: [7; 16],
            fraction: f,
            ban_after: 3,
            gpu_sample: 0.0,
        };
        let count = |p: &Policy, remote| {
            (0..10_000)
                .filter(|&j| p.selected(JobId(j), remote))
                .count()
        };
        assert_eq!(count(&policy(Fraction::Fixed(1.0)), false), 10_000);
        assert_eq!(count(&policy(Fraction::Fixed(0.0)), true), 0);
        assert_eq!(count(&policy(Fraction::Auto), false), 0);
        let auto = count(&policy(Fraction::Auto), true);
        assert!(
            (100..=300).contains(&auto),
            "2% of 10000 is about 200, got {auto}"
        );
        let half = count(&policy(Fraction::Fixed(0.5)), false);
        assert!((4_700..=5_300).contains(&half), "got {half}");
        let other = Policy {
            secret: [8; 16],
            ..policy(Fraction::Fixed(0.5))
        };
        let same = (0..1000)
            .filter(|&j| {
                other.selected(JobId(j), false)
                    == policy(Fraction::Fixed(0.5)).selected(JobId(j), false)
            })
            .count();
        assert!(
            same < 600,
            "another secret selects other jobs ({same} of 1000 agree)"
        );
    }

    /// A trusted copy of `identity`, in `class`, on `kernel`.
    fn trusted(identity: IdentityId, class: usize, kernel: Kernel) -> Vote {
        Vote {
            trusted: true,
            kernel: Some(kernel),
            ..vote(identity, class)
        }
    }

    /// The default rules with a trusted computation available.
    const ARBITER: Rules = Rules {
        ban_after: 3,
        probation: PROBATION,
        second_machine: true,
        arbiter: true,
    };

    use nq_core::search::Kernel;

    #[test]
    fn a_trusted_copy_decides_a_dispute_whatever_the_number_against_it() {
        let (i, w) = ids(&["10.0.0.2", "10.0.0.3", "honest@1", "local"]);
        let (l1, l2, h, local) = (w[0], w[1], w[2], w[3]);
        // Two liar addresses against one honest worker: no majority decides
        // while the arbiter can.
        let v = judge(
            &[vote(l1, 0), vote(l2, 0), vote(h, 1)],
            Selection::CHECK,
            &i,
            ARBITER,
        );
        assert!(!v.settled && v.needs_trusted && v.losers.is_empty());
        // The trusted copy agrees with the honest one: it decides, 2 to 2.
        let copies = [
            vote(l1, 0),
            vote(l2, 0),
            vote(h, 1),
            trusted(local, 1, Kernel::Avx2),
        ];
        let v = judge(&copies, Selection::CHECK, &i, ARBITER);
        assert!(v.settled && v.leader == Some(1));
        assert_eq!(v.losers, vec![l1, l2]);
        assert!(v.beaten.by_trusted);
        assert_eq!(v.confirmed, vec![h]);
        // Without the arbiter the same copies go to the majority: the two
        // addresses win 2 to 1 (the attack the arbiter stops), and their win
        // can never ban: neither is a credential.
        let majority = Rules {
            arbiter: false,
            ..ARBITER
        };
        let v = judge(
            &[vote(l1, 0), vote(l2, 0), vote(h, 1)],
            Selection::CHECK,
            &i,
            majority,
        );
        assert!(v.settled && v.leader == Some(0) && !v.needs_trusted);
        assert!(!v.beaten.by_trusted && v.beaten.by_credentials.is_empty());
    }

    #[test]
    fn a_lone_trusted_copy_checks_itself_on_another_kernel_before_it_overrules() {
        let (i, w) = ids(&["10.0.0.2", "10.0.0.3", "local"]);
        let (l1, l2, local) = (w[0], w[1], w[2]);
        let one = [vote(l1, 0), vote(l2, 0), trusted(local, 1, Kernel::Avx512)];
        let v = judge(&one, Selection::CHECK, &i, ARBITER);
        assert!(!v.settled && v.needs_trusted && v.losers.is_empty());
        // The same kernel again adds nothing.
        let same = [&one[..], &[trusted(local, 1, Kernel::Avx512)]].concat();
        assert!(!judge(&same, Selection::CHECK, &i, ARBITER).settled);
        let two = [&one[..], &[trusted(local, 1, Kernel::Avx2)]].concat();
        let v = judge(&two, Selection::CHECK, &i, ARBITER);
        assert!(v.settled && v.leader == Some(1) && v.votes == 2);
        assert_eq!(v.losers, vec![l1, l2]);
        // Trusted kernels that disagree wait for a third that breaks the tie.
        let split = [
            trusted(local, 0, Kernel::Avx512),
            trusted(local, 1, Kernel::Avx2),
        ];
        let v = judge(&split, Selection::NONE, &i, ARBITER);
        assert!(!v.settled && v.needs_trusted);
        let broken = [&split[..], &[trusted(local, 1, Kernel::Scalar)]].concat();
        let v = judge(&broken, Selection::NONE, &i, ARBITER);
        assert!(v.settled && v.leader == Some(1));
    }

    #[test]
    fn trusted_copies_settle_alone_unless_selected_and_never_lose() {
        let (mut i, w) = ids(&["local", "w@1"]);
        let local = w[0];
        let v = judge(
            &[trusted(local, 0, Kernel::Avx512)],
            Selection::NONE,
            &i,
            ARBITER,
        );
        assert!(v.settled && v.votes == 1 && !v.unchecked);
        let v = judge(
            &[trusted(local, 0, Kernel::Avx512)],
            Selection::CHECK,
            &i,
            ARBITER,
        );
        assert!(!v.settled, "a selected job needs its second copy");
        let v = judge(
            &[trusted(local, 0, Kernel::Avx512), vote(w[1], 0)],
            Selection::CHECK,
            &i,
            ARBITER,
        );
        assert!(v.settled && v.votes == 2 && v.confirmed == vec![w[1]]);
        // The coordinator's threads are never charged, and never on probation.
        assert_eq!(i.add_loss(local, &Beaten::trusted()), 0);
        assert!(!i.on_probation(local, PROBATION) && i.is_trusted(local));
        // An operator-trusted credential is trusted from when it is named.
        i.trust("token:mine");
        let mine = i.intern("token:mine");
        assert!(i.is_trusted(mine) && !i.is_trusted(w[1]));
        // Trusted after it was seen, too; each listed once.
        let seen = i.intern("token:seen-first");
        i.trust("token:seen-first");
        i.trust("token:seen-first");
        assert_eq!(i.trusted_ids().collect::<Vec<_>>(), vec![local, mine, seen]);
    }

    #[test]
    fn with_an_arbiter_a_probationers_copy_always_waits_for_its_check() {
        let (i, w) = ids(&["new@1"]);
        let alone = Rules {
            second_machine: false,
            ..ARBITER
        };
        let v = judge(&[vote(w[0], 0)], Selection::NONE, &i, alone);
        assert!(!v.settled && !v.unchecked, "the arbiter can check it");
        let v = judge(
            &[vote(w[0], 0)],
            Selection::NONE,
            &i,
            Rules {
                arbiter: false,
                ..alone
            },
        );
        assert!(v.settled && v.unchecked);
    }

    /// A copy of `identity`, in `class`, that ran on a GPU.
    fn gpu(identity: IdentityId, class: usize) -> Vote {
        Vote {
            gpu: true,
            ..vote(identity, class)
        }
    }

    /// A job chosen for a second copy and for the CPU sample.
    const SAMPLED: Selection = Selection {
        check: true,
        cpu: true,
    };

    /// See: issue 24, item 6.
    #[test]
    fn gpu_copies_in_the_cpu_sample_wait_for_a_trusted_cpu_copy_that_decides() {
        let (i, w) = ids(&["gpu-a@1", "gpu-b@2", "local"]);
        let (a, b, local) = (w[0], w[1], w[2]);
        let agree = [gpu(a, 0), gpu(b, 0)];
        assert!(
            judge(&agree, Selection::CHECK, &i, ARBITER).settled,
            "outside the sample two GPU votes settle"
        );
        let held = judge(&agree, SAMPLED, &i, ARBITER);
        assert!(!held.settled && held.needs_trusted && !held.conflict);
        assert!(held.confirmed.is_empty() && held.losers.is_empty());
        assert_eq!(held.leader, Some(0), "the GPU copies count meanwhile");
        // A trusted CPU copy that agrees settles it.
        let checked = [gpu(a, 0), gpu(b, 0), trusted(local, 0, Kernel::Avx2)];
        let v = judge(&checked, SAMPLED, &i, ARBITER);
        assert!(v.settled && v.votes == 3 && v.losers.is_empty());
        // One that disagrees checks itself on a second kernel, then wins:
        // the GPU workers lose, beaten by a trusted computation.
        let caught = [gpu(a, 0), gpu(b, 0), trusted(local, 1, Kernel::Avx2)];
        let v = judge(&caught, SAMPLED, &i, ARBITER);
        assert!(!v.settled && v.needs_trusted && v.leader == Some(1));
        let twice = [&caught[..], &[trusted(local, 1, Kernel::Scalar)]].concat();
        let v = judge(&twice, SAMPLED, &i, ARBITER);
        assert!(v.settled && v.leader == Some(1) && v.beaten.by_trusted);
        assert_eq!(v.losers, vec![a, b]);
    }

    #[test]
    fn the_cpu_sample_waits_only_on_gpu_copies_and_only_for_a_voice_that_can_come() {
        let (mut i, w) = ids(&["gpu-a@1", "cpu-b@2", "token:lab"]);
        let (a, b, lab) = (w[0], w[1], w[2]);
        let agree = [gpu(a, 0), gpu(b, 0)];
        // Without a trusted computation nobody could give the CPU copy.
        let no_arbiter = Rules {
            arbiter: false,
            ..ARBITER
        };
        let v = judge(&agree, SAMPLED, &i, no_arbiter);
        assert!(v.settled && !v.needs_trusted);
        // A copy on a CPU kernel is the diversity the sample asks for.
        let cpu_b = Vote {
            kernel: Some(Kernel::Avx2),
            ..vote(b, 0)
        };
        assert!(judge(&[gpu(a, 0), cpu_b], SAMPLED, &i, ARBITER).settled);
        // Copies that name no kernel (stored before kernels were) are no
        // GPU copies.
        assert!(judge(&[vote(a, 0), vote(b, 0)], SAMPLED, &i, ARBITER).settled);
        // A job that would not settle anyway is not held: its next copy
        // may come from anyone.
        let one = judge(&[gpu(a, 0)], SAMPLED, &i, ARBITER);
        assert!(!one.settled && !one.needs_trusted);
        // A trusted machine's GPU copy is no CPU copy either.
        i.trust("token:lab");
        let lab_gpu = Vote {
            trusted: true,
            gpu: true,
            ..vote(lab, 0)
        };
        let sample_only = Selection {
            check: false,
            cpu: true,
        };
        assert!(judge(&[lab_gpu], Selection::NONE, &i, ARBITER).settled);
        let v = judge(&[lab_gpu], sample_only, &i, ARBITER);
        assert!(!v.settled && v.needs_trusted);
    }

    #[test]
    fn the_cpu_sample_follows_its_share_apart_from_the_selection() {
        let policy = |fraction, gpu_sample| Policy {
            secret: [9; 16],
            fraction,
            ban_after: 3,
            gpu_sample,
        };
        let p = policy(Fraction::Fixed(0.5), 0.1);
        let sampled = (0..10_000).filter(|&j| p.cpu_sampled(JobId(j))).count();
        assert!(
            (800..=1_200).contains(&sampled),
            "10% of 10000 is about 1000, got {sampled}"
        );
        let both = (0..10_000)
            .filter(|&j| p.cpu_sampled(JobId(j)) && p.selected(JobId(j), true))
            .count();
        assert!(
            (350..=650).contains(&both),
            "independent of the selection: about 500, got {both}"
        );
        for j in 0..100 {
            let job = JobId(j);
            assert_eq!(
                p.selection(job, true),
                Selection {
                    check: p.selected(job, true),
                    cpu: p.cpu_sampled(job),
                }
            );
        }
        let none = policy(Fraction::Fixed(0.0), 1.0);
        assert!(
            (0..1_000).all(|j| !none.cpu_sampled(JobId(j))),
            "--verify 0 asks for no check"
        );
        let all = policy(Fraction::Auto, 1.0);
        assert!((0..1_000).all(|j| all.cpu_sampled(JobId(j))));
        let off = policy(Fraction::Auto, 0.0);
        assert!((0..1_000).all(|j| !off.cpu_sampled(JobId(j))));
    }

    #[test]
    fn credentials_and_the_local_threads_are_told_from_addresses() {
        for name in ["token:a", "cert:00ff"] {
            assert!(credentialed(name), "{name}");
        }
        for name in ["10.0.0.7", "w@127.0.0.1", "local", "tokenx"] {
            assert!(!credentialed(name), "{name}");
        }
        assert!(trusted_from_start("local") && trusted_from_start("local:avx2"));
        assert!(!trusted_from_start("local:") && !trusted_from_start("localhost"));
    }
}
