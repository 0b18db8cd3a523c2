//! Lease allowances: how many jobs an identity may hold, and when a job it
//! holds is taken back. Pure: time is passed in.
//!
//! A worker's registration says how many threads it runs, but nothing
//! checks that, and one machine may register many times. So what an
//! identity (see [`crate::core::quorum`]) may hold is measured, not
//! claimed:
//!
//! * **Cap.** An identity holds at most [`START_CAP`] live leases over all
//!   its registrations until it has completed work; then twice the
//!   concurrency it was measured to sustain: the lease time of the copies it
//!   delivered in the last lease lifetime (or the one before), divided by
//!   the time that lease time lies in, a lease lifetime at most. That is
//!   Little's law: a worker that keeps 64 jobs of five minutes running
//!   delivers 64 × 5 minutes of lease time every five minutes. Within its
//!   first lease lifetime the time is shorter than a lifetime, so a fast
//!   worker (a GPU, a machine of many cores) earns its cap in seconds, not
//!   after a lifetime at [`START_CAP`]; since every lease counted lies in
//!   that time, the measure never exceeds the leases the identity held at
//!   once. The claim (threads and GPU jobs, `Claim::cap`) can only lower
//!   the cap.
//! * **Overdue.** A lease held (and renewed) for longer than
//!   [`OVERDUE_TTLS`] lease lifetimes plus [`OVERDUE_SLACK`] times the
//!   longest lease the identity ever needed for a copy (or, for an identity
//!   that never delivered one, the longest any identity needed) is taken
//!   back and its job reissued. Nothing measured yet, nothing is overdue:
//!   the first jobs of a run are its largest.
//! * **Fair share.** When an identity asks for work and gets none, because
//!   every job not done is leased, an identity holding more than its share
//!   of the leased jobs (their number over the identities holding or asking)
//!   gives back its excess, from the leases granted at least a lease
//!   lifetime ago (so that work just started is not thrown away). An
//!   identity without progress (nothing delivered for [`PROGRESS_TTLS`]
//!   lease lifetimes, or [`OVERDUE_SLACK`] times its expected time) has no
//!   share while others wait: it gives back all such leases.
//! * **No progress.** An identity whose lease is taken back and that made
//!   no progress is *stalled*: its cap is one job until it delivers a copy.
//!   The engine names it in a WARN line and in the metrics.
//!
//! The coordinator's own threads are trusted and exempt.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::core::quorum::IdentityId;

/// Live leases an identity may hold before it has delivered anything (the
/// floor of the old per-registration cap, now per identity).
pub(crate) const START_CAP: usize = 16;

/// The largest cap any measured throughput earns (a GPU worker's queue).
pub(crate) const MAX_CAP: usize = 4096;

/// Lease lifetimes a lease is always allowed, on top of its expected time.
pub(crate) const OVERDUE_TTLS: u32 = 3;

/// Times the longest lease an identity needed for a copy that a lease may
/// run before it is overdue.
pub(crate) const OVERDUE_SLACK: u32 = 8;

/// Lease lifetimes without a delivered copy after which an identity whose
/// lease was taken back is stalled.
pub(crate) const PROGRESS_TTLS: u32 = 2;

/// What one identity delivered, for its allowance.
#[derive(Clone, Debug, Default)]
struct Account {
    /// Start of the current measuring window (one lease lifetime long).
    window_start: Option<Instant>,
    /// Lease time of the copies delivered in the current window.
    this_window: Duration,
    /// The same for the window before (zero when that one was empty or is
    /// older than one window).
    last_window: Duration,
    /// When the earliest lease counted in the two windows began: every
    /// counted lease lies between it and now. `None` until a copy is
    /// counted, and again after two windows without one.
    since: Option<Instant>,
    /// When it last delivered a copy.
    last_progress: Option<Instant>,
    /// The longest lease it needed for a copy.
    longest: Duration,
    /// True once a lease was taken back while it made no progress; cleared
    /// by its next copy.
    stalled: bool,
    /// Leases taken back from it, this session.
    revoked: u64,
}

impl Account {
    /// The lease time delivered in the current and previous windows, as of
    /// `now` (windows that ended are rolled without mutation).
    fn recent(&self, now: Instant, ttl: Duration) -> Duration {
        let Some(start) = self.window_start else {
            return Duration::ZERO;
        };
        let age = now.saturating_duration_since(start);
        if age >= ttl * 2 {
            Duration::ZERO
        } else if age >= ttl {
            self.this_window
        } else {
            self.this_window.max(self.last_window)
        }
    }

    fn roll(&mut self, now: Instant, ttl: Duration) {
        let start = *self.window_start.get_or_insert(now);
        let age = now.saturating_duration_since(start);
        if age >= ttl {
            self.last_window = if age < ttl * 2 {
                self.this_window
            } else {
                Duration::ZERO
            };
            self.this_window = Duration::ZERO;
            self.window_start = Some(now);
        }
    }
}

/// The allowances of a session's identities.
#[derive(Debug)]
pub struct Allowances {
    accounts: HashMap<IdentityId, Account>,
    /// The longest lease any identity needed for a copy.
    longest: Duration,
    /// The lease lifetime.
    ttl: Duration,
}

impl Allowances {
    /// Allowances under leases of lifetime `ttl`.
    pub fn new(ttl: Duration) -> Allowances {
        Allowances {
            accounts: HashMap::new(),
            longest: Duration::ZERO,
            ttl,
        }
    }

    /// Live leases `identity` may hold at `now`.
    pub fn cap(&self, identity: IdentityId, now: Instant) -> usize {
        let Some(a) = self.accounts.get(&identity) else {
            return START_CAP;
        };
        if a.stalled {
            return 1;
        }
        // Concurrency sustained, rounded up: lease time over the time it lies
        // in, a lease lifetime at most.
        let covered = a
            .since
            .map_or(self.ttl, |since| now.saturating_duration_since(since))
            .min(self.ttl);
        if covered.is_zero() {
            return START_CAP;
        }
        let busy = a.recent(now, self.ttl).as_secs_f64() / covered.as_secs_f64();
        let earned = (2.0 * busy.ceil()).min(MAX_CAP as f64) as usize;
        earned.max(START_CAP)
    }

    /// Counts a copy that `identity` delivered at `now` under a lease it had
    /// held for `held`.
    pub fn note_copy(&mut self, identity: IdentityId, held: Duration, now: Instant) {
        let ttl = self.ttl;
        let a = self.accounts.entry(identity).or_default();
        a.roll(now, ttl);
        if a.this_window.is_zero() && a.last_window.is_zero() {
            // Nothing counted any more: a fresh measure.
            a.since = None;
        }
        // A lease held longer than a lifetime counts as begun a lifetime ago:
        // the measure covers a lifetime at most. Where the clock cannot go
        // back that far, `None` falls back to a whole lifetime.
        let began = now.checked_sub(held.min(ttl));
        a.since = began.map(|began| a.since.map_or(began, |since| since.min(began)));
        a.this_window += held;
        a.last_progress = Some(now);
        a.longest = a.longest.max(held);
        a.stalled = false;
        self.longest = self.longest.max(held);
    }

    /// True when a lease of `identity` held for `age` is overdue (see the
    /// module doc). Never true before any copy was delivered in the session.
    pub fn is_overdue(&self, identity: IdentityId, age: Duration) -> bool {
        self.overdue_after(identity)
            .is_some_and(|limit| age > limit)
    }

    /// How long a lease of `identity` may be held before it is overdue, or
    /// `None` while nothing was measured (see the module doc). It changes
    /// only with a delivered copy ([`Allowances::note_copy`]), and it gets
    /// shorter only at the identity's first copy, or at the session's
    /// first (from `None`).
    pub fn overdue_after(&self, identity: IdentityId) -> Option<Duration> {
        let expected = self.expected(identity);
        (!expected.is_zero()).then(|| self.ttl * OVERDUE_TTLS + expected * OVERDUE_SLACK)
    }

    /// The longest lease any identity needed for a copy (zero before the
    /// first copy).
    pub fn longest(&self) -> Duration {
        self.longest
    }

    /// The lease time a job of `identity` is expected to need: the longest
    /// it needed for a copy, or for an identity never measured the longest
    /// any identity needed; zero when nothing was measured.
    pub fn expected(&self, identity: IdentityId) -> Duration {
        let own = self
            .accounts
            .get(&identity)
            .map_or(Duration::ZERO, |a| a.longest);
        if own.is_zero() { self.longest } else { own }
    }

    /// True when `identity` delivered nothing in the last
    /// [`PROGRESS_TTLS`] lease lifetimes, or in [`OVERDUE_SLACK`] times its
    /// expected time if that is longer (a worker of long jobs delivers
    /// rarely and is not idle for that).
    pub fn without_progress(&self, identity: IdentityId, now: Instant) -> bool {
        let window =
            (self.ttl * PROGRESS_TTLS).max(self.expected(identity) * OVERDUE_SLACK);
        self.accounts
            .get(&identity)
            .and_then(|a| a.last_progress)
            .is_none_or(|t| now.saturating_duration_since(t) > window)
    }

    /// Counts a lease taken back from `identity` at `now`; returns true when
    /// that made it stalled (it made no progress).
    pub fn note_revoked(&mut self, identity: IdentityId, now: Instant) -> bool {
        let stalls = self.without_progress(identity, now);
        let a = self.accounts.entry(identity).or_default();
        a.revoked += 1;
        if stalls {
            a.stalled = true;
        }
        stalls
    }

    /// True while `identity` is stalled (its cap is one job).
    pub fn is_stalled(&self, identity: IdentityId) -> bool {
        self.accounts.get(&identity).is_some_and(|a| a.stalled)
    }

    /// Leases taken back from `identity` in this session.
    pub fn revoked(&self, identity: IdentityId) -> u64 {
        self.accounts.get(&identity).map_or(0, |a| a.revoked)
    }

    /// Forgets every identity for which `keep` is false (their workers were
    /// forgotten), so that churn does not grow memory.
    pub fn retain(&mut self, mut keep: impl FnMut(IdentityId) -> bool) {
        self.accounts.retain(|&id, _| keep(id));
        if self.accounts.capacity() > 4 * self.accounts.len().max(16) {
            self.accounts.shrink_to_fit();
        }
    }

    /// Identities with an account.
    pub fn len(&self) -> usize {
        self.accounts.len()
    }

    /// True when no identity has an account.
    pub fn is_empty(&self) -> bool {
        self.accounts.is_empty()
    }
}

/// Lease lifetimes a report stream may stay silent, on top of its job's
/// expected time.
pub(crate) const STREAM_IDLE_TTLS: u32 = 4;

/// Lease lifetimes a report stream may last, on top of one per sub-problem
/// and [`OVERDUE_SLACK`] times its job's expected time.
pub(crate) const STREAM_TOTAL_TTLS: u32 = 10;

/// The deadlines of one report stream, scaled with its job's size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StreamDeadlines {
    /// The longest wait for the next chunk.
    pub idle: Duration,
    /// The longest the whole stream may last.
    pub total: Duration,
}

impl StreamDeadlines {
    /// The deadlines of a report of a job of `subs` sub-problems whose
    /// reporter is expected to need `expected` for it
    /// ([`Allowances::expected`]), under leases of lifetime `ttl`.
    pub(crate) fn for_job(
        ttl: Duration,
        subs: usize,
        expected: Duration,
    ) -> StreamDeadlines {
        let subs = u32::try_from(subs).unwrap_or(u32::MAX);
        StreamDeadlines {
            idle: ttl * STREAM_IDLE_TTLS + expected,
            total: ttl.saturating_mul(STREAM_TOTAL_TTLS.saturating_add(subs))
                + expected * OVERDUE_SLACK,
        }
    }
}

/// An identity's fair share of `leased` live leases among `identities`
/// identities that hold or ask for work: the quotient rounded up, so that
/// shares always cover every lease.
pub(crate) fn fair_share(leased: usize, identities: usize) -> usize {
    leased.div_ceil(identities.max(1)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(10);

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn the_cap_starts_small_and_grows_with_delivered_lease_time() {
        let t0 = Instant::now();
        let mut a = Allowances::new(TTL);
        let w = IdentityId(1);
        assert_eq!(a.cap(w, t0), START_CAP);
        // 40 jobs of 5 s each delivered within one lifetime: 20 running at
        // once on average, so 40 may be held.
        for i in 0..40 {
            a.note_copy(w, secs(5), t0 + Duration::from_millis(i * 200));
        }
        assert_eq!(a.cap(w, t0 + secs(9)), 40);
        // Still earned in the next window, forgotten after two idle ones.
        assert_eq!(a.cap(w, t0 + secs(15)), 40);
        assert_eq!(a.cap(w, t0 + secs(25)), START_CAP);
        // Another identity earns nothing from it.
        assert_eq!(a.cap(IdentityId(2), t0 + secs(9)), START_CAP);
    }

    /// Within its first lease lifetime an identity's lease time is divided
    /// by the time it lies in, not by a whole lifetime: a fast worker earns
    /// its cap in seconds.
    #[test]
    fn a_fast_identity_earns_its_cap_within_its_first_lease_lifetime() {
        let t0 = Instant::now();
        let mut a = Allowances::new(TTL);
        let w = IdentityId(1);
        let ms = Duration::from_millis;
        // Its first 16 leases, granted at t0, all delivered 100 ms later: 16
        // at once, so 32 may be held (a lifetime's measure gave 16).
        for _ in 0..16 {
            a.note_copy(w, ms(100), t0 + ms(100));
        }
        assert_eq!(a.cap(w, t0 + ms(100)), 32);
        // 32 more, each held 100 ms, over the next 100 ms: 48 jobs' lease
        // time over 200 ms, 24 at once on average.
        for i in 0..32 {
            a.note_copy(w, ms(100), t0 + ms(100) + ms(100) * i / 32);
        }
        assert_eq!(a.cap(w, t0 + ms(200)), 48);
    }

    /// However its copies arrive, lease time cannot earn more than twice the
    /// leases held at once: a worker that held 16 for most of a lifetime and
    /// delivers them together earns 32, not more.
    #[test]
    fn lease_time_earns_at_most_twice_the_leases_held_at_once() {
        let t0 = Instant::now();
        let mut a = Allowances::new(TTL);
        let w = IdentityId(1);
        for _ in 0..16 {
            a.note_copy(w, secs(9), t0 + secs(9));
        }
        assert_eq!(a.cap(w, t0 + secs(9)), 32);
        // After two idle lifetimes the measure starts afresh.
        assert_eq!(a.cap(w, t0 + secs(30)), START_CAP);
        for _ in 0..16 {
            a.note_copy(w, Duration::from_millis(50), t0 + secs(30));
        }
        assert_eq!(a.cap(w, t0 + secs(30)), 32);
    }

    #[test]
    fn nothing_is_overdue_before_anything_was_measured() {
        let a = Allowances::new(TTL);
        assert!(!a.is_overdue(IdentityId(1), secs(100_000)));
    }

    #[test]
    fn a_lease_is_overdue_far_past_the_identitys_measured_time() {
        let t0 = Instant::now();
        let mut a = Allowances::new(TTL);
        let (fast, hoarder) = (IdentityId(1), IdentityId(2));
        a.note_copy(fast, secs(2), t0);
        // 3 lifetimes + 8 × 2 s = 46 s.
        assert!(!a.is_overdue(fast, secs(46)));
        assert!(a.is_overdue(fast, secs(47)));
        // An identity that never delivered is measured by the run's longest.
        assert!(a.is_overdue(hoarder, secs(47)));
        // A slow identity is measured by its own time.
        let slow = IdentityId(3);
        a.note_copy(slow, secs(20), t0);
        assert!(!a.is_overdue(slow, secs(100)));
        assert!(a.is_overdue(slow, secs(191)));
    }

    #[test]
    fn an_identity_without_progress_is_stalled_until_it_delivers() {
        let t0 = Instant::now();
        let mut a = Allowances::new(TTL);
        let (w, idle) = (IdentityId(1), IdentityId(2));
        a.note_copy(w, secs(1), t0);
        assert!(!a.note_revoked(w, t0 + secs(5)), "it delivered recently");
        assert_eq!(a.cap(w, t0 + secs(5)), START_CAP);
        assert!(a.note_revoked(idle, t0 + secs(5)), "never delivered");
        assert!(a.is_stalled(idle));
        assert_eq!(a.cap(idle, t0 + secs(5)), 1);
        assert_eq!(a.revoked(idle), 1);
        a.note_copy(idle, secs(1), t0 + secs(6));
        assert!(!a.is_stalled(idle));
        assert_eq!(a.cap(idle, t0 + secs(6)), START_CAP);
        // Silent for longer than the progress window: stalled again.
        assert!(a.note_revoked(w, t0 + secs(21)));
    }

    #[test]
    fn stream_deadlines_grow_with_the_job_and_the_measured_time() {
        let small = StreamDeadlines::for_job(TTL, 1, Duration::ZERO);
        assert_eq!(small.idle, secs(40));
        assert_eq!(small.total, secs(110));
        let big = StreamDeadlines::for_job(TTL, 100, secs(60));
        assert_eq!(big.idle, secs(100));
        assert_eq!(big.total, secs(1100 + 480));
    }

    #[test]
    fn fair_shares_cover_every_lease() {
        assert_eq!(fair_share(16, 2), 8);
        assert_eq!(fair_share(17, 2), 9);
        assert_eq!(fair_share(1, 3), 1);
        assert_eq!(fair_share(0, 0), 1);
    }

    #[test]
    fn forgotten_identities_free_their_accounts() {
        let t0 = Instant::now();
        let mut a = Allowances::new(TTL);
        for i in 0..1000 {
            a.note_copy(IdentityId(i), secs(1), t0);
        }
        assert_eq!(a.len(), 1000);
        a.retain(|id| id.0 < 3);
        assert_eq!(a.len(), 3);
    }
}
