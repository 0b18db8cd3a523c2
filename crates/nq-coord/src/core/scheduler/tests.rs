//! The scheduler's unit tests, in sentences, with a fake clock.

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
        gpu_sample: share,
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
        lease: Some(lease),
        ..Settlement::one_copy(job, Some(tally(total)))
    };
    s.settle(&settlement, true).unwrap()
}

/// `worker` delivers every job of `g` at `now`, each a first copy.
fn deliver_all(s: &mut Scheduler, worker: &WorkerId, g: &Grant, now: Instant) {
    for j in &g.jobs {
        first_copy(s, j.job, j.lease, 1);
        s.note_copy(worker, j.lease, 1, now);
    }
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
    let (job, lease, first_kernel) = (g.jobs[0].job, g.jobs[0].lease, g.jobs[0].kernel);
    let ia = s.worker(&a).unwrap().identity;
    let one_vote = Settlement {
        lease: Some(lease),
        settled: false,
        reporters: vec![ia],
        kernels: vec!["avx512".to_owned()],
        ..Settlement::one_copy(job, Some(tally(5)))
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
        lease: Some(g.jobs[0].lease),
        settled: false,
        reporters: vec![ia],
        ..Settlement::one_copy(g.jobs[0].job, Some(tally(1)))
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
    s.restorer().expect_back(["a@127.0.0.1", "b@127.0.0.1"]);
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
    s.restorer().restore_two_machines(true, clock.now());
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
    one.restorer().restore_two_machines(false, clock.now());
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
        gpu_sample: 0.0,
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
        reporters: vec![ia],
        unchecked: true,
        ..Settlement::one_copy(JobId(0), Some(tally(3)))
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
        votes: 2,
        kernels: vec!["scalar".into()],
        losers: vec![il],
        beaten: crate::core::quorum::Beaten::trusted(),
        ..Settlement::one_copy(JobId(job), Some(tally(1)))
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
        votes: 2,
        losers: vec![iv],
        beaten: Beaten {
            by_trusted: false,
            by_credentials,
        },
        disputed: true,
        ..Settlement::one_copy(JobId(job), Some(tally(1)))
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
        lease: Some(lease),
        attempts: 2,
        settled: false,
        reporters: vec![ia, ib],
        kernels: vec!["avx512".into()],
        needs_trusted: true,
        disputed: true,
        ..Settlement::one_copy(JobId(0), Some(tally(5)))
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

/// See: issue 24, item 6: the CPU sample holds many jobs at once for the
/// trusted side, and untrusted workers stopped finding the checks queued
/// behind them.
#[test]
fn jobs_held_for_a_trusted_copy_do_not_hide_the_checks_queued_behind_them() {
    let held = CHECK_SCAN + 8;
    let mut s = Scheduler::new(vec![1; held + 1], 1, TTL, policy(1.0));
    let now = Instant::now();
    let ip = |d| Some(IpAddr::from([10, 0, 0, d]));
    let a = s.register("a", 1, ip(1), now).unwrap();
    let b = s.register("b", 1, ip(2), now).unwrap();
    s.register_local(1, now);
    let (ia, ib) = (
        s.worker(&a).unwrap().identity,
        s.worker(&b).unwrap().identity,
    );
    for j in 0..held {
        let waiting = Settlement {
            settled: false,
            reporters: vec![ia, ib],
            kernels: vec![crate::core::quorum::GPU_KERNEL.into()],
            needs_trusted: true,
            ..Settlement::one_copy(JobId(j as u64), Some(tally(5)))
        };
        assert!(waiting.held_for_cpu_sample());
        s.settle(&waiting, true).unwrap();
    }
    let open = Settlement {
        settled: false,
        reporters: vec![ia],
        ..Settlement::one_copy(JobId(held as u64), Some(tally(5)))
    };
    s.settle(&open, true).unwrap();
    // Each grant sets aside the held jobs it looks at (CHECK_SCAN of them
    // at most): within two grants b reaches the check it may give.
    let mut got = s.lease(&b, 1, &[], now).unwrap();
    if got.jobs.is_empty() {
        got = s.lease(&b, 1, &[], now).unwrap();
    }
    assert_eq!(jobs_of(&got), vec![held as u64]);
    // The held jobs still wait for the trusted side.
    let holding = [got.jobs[0].lease];
    assert!(s.lease(&b, 1, &holding, now).unwrap().jobs.is_empty());
}

/// Settles jobs `jobs` unsettled, each waiting for a trusted copy after
/// GPU copies of `reporters` (the CPU sample's hold, see
/// [`Settlement::held_for_cpu_sample`]).
fn hold_for_trusted(
    s: &mut Scheduler,
    jobs: std::ops::Range<u64>,
    reporters: &[IdentityId],
) {
    for j in jobs {
        let waiting = Settlement {
            settled: false,
            reporters: reporters.to_vec(),
            kernels: vec![crate::core::quorum::GPU_KERNEL.into()],
            needs_trusted: true,
            ..Settlement::one_copy(JobId(j), Some(tally(5)))
        };
        s.settle(&waiting, true).unwrap();
    }
}

/// Settles jobs `jobs` unsettled, each waiting for an ordinary check
/// after one copy of `reporter`.
fn hold_for_check(s: &mut Scheduler, jobs: std::ops::Range<u64>, reporter: IdentityId) {
    for j in jobs {
        let open = Settlement {
            settled: false,
            reporters: vec![reporter],
            ..Settlement::one_copy(JobId(j), Some(tally(5)))
        };
        s.settle(&open, true).unwrap();
    }
}

/// The jobs an untrusted grant sets aside for the trusted side do not
/// wait behind the ordinary checks: the trusted side looks at them first,
/// in the order they were queued, each once (a short queue is not turned
/// round by a scan of 64).
#[test]
fn the_trusted_side_takes_the_jobs_set_aside_for_it_before_other_checks() {
    let mut s = Scheduler::new(vec![1; 6], 1, TTL, policy(1.0));
    let now = Instant::now();
    let ip = |d| Some(IpAddr::from([10, 0, 0, d]));
    let a = s.register("a", 1, ip(1), now).unwrap();
    let b = s.register("b", 1, ip(2), now).unwrap();
    let c = s.register("c", 1, ip(3), now).unwrap();
    let local = s.register_local(1, now);
    let (ia, ib) = (
        s.worker(&a).unwrap().identity,
        s.worker(&b).unwrap().identity,
    );
    // Queued: three jobs for the trusted side, then three ordinary checks.
    hold_for_trusted(&mut s, 0..3, &[ia, ib]);
    hold_for_check(&mut s, 3..6, ia);
    // c sets the first three aside and takes the first check it may give.
    assert_eq!(jobs_of(&s.lease(&c, 1, &[], now).unwrap()), vec![3]);
    // The threads take the set-aside jobs first, in order, then the rest.
    let taken: Vec<u64> = (0..5)
        .flat_map(|_| jobs_of(&s.lease(&local, 1, &[], now).unwrap()))
        .collect();
    assert_eq!(taken, vec![0, 1, 2, 4, 5]);
}

/// Jobs set aside for a trusted copy are open to every worker again once
/// no trusted computation is at work, as the rules then let anyone give
/// the copy ([`crate::core::quorum`], "No wait for a voice that cannot
/// come").
#[test]
fn set_aside_jobs_go_to_any_worker_once_no_trusted_computation_is_at_work() {
    let mut s = Scheduler::new(vec![1; 2], 1, TTL, policy(1.0));
    let now = Instant::now();
    let ip = |d| Some(IpAddr::from([10, 0, 0, d]));
    s.restorer().trust(["token:lab"]);
    let lab = s
        .register_as("lab", 1, ip(9), Some("token:lab"), now)
        .unwrap();
    let a = s.register("a", 1, ip(1), now).unwrap();
    let b = s.register("b", 1, ip(2), now).unwrap();
    let c = s.register("c", 1, ip(3), now).unwrap();
    assert!(s.rules().arbiter, "the trusted machine is at work");
    let (ia, ib) = (
        s.worker(&a).unwrap().identity,
        s.worker(&b).unwrap().identity,
    );
    hold_for_trusted(&mut s, 0..2, &[ia, ib]);
    // Reserved: c only sets them aside.
    assert!(s.lease(&c, 1, &[], now).unwrap().jobs.is_empty());
    s.leave(&lab, now);
    assert!(!s.rules().arbiter);
    assert_eq!(jobs_of(&s.lease(&c, 2, &[], now).unwrap()), vec![0, 1]);
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
    s.restorer()
        .restore_worker(a.clone(), "a", "10.0.0.1", ip, 4, later);
    s.restorer()
        .restore_worker(b.clone(), "b", "10.0.0.2", None, 4, later);
    for g in held.iter().chain([&other]) {
        let w = if g.job == other.job { &b } else { &a };
        assert!(
            s.restorer()
                .restore_lease(g.job, g.lease, w, g.attempts, later)
        );
    }
    assert!(
        !s.restorer()
            .restore_lease(held[0].job, LeaseId(7), &a, 1, later),
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
    s.restorer().defer_unrecorded(3, clock.now());
    let g = s.lease(&a, 5, &[], clock.now()).unwrap();
    assert_eq!(jobs_of(&g), [3, 4, 5, 6, 7], "the first three set aside");
    let g = s.lease(&a, 3, &[], clock.now()).unwrap();
    assert_eq!(jobs_of(&g), [0, 1, 2], "no other job left: they go now");

    // Or they go first once a lease lifetime has passed.
    let (mut s, mut clock) = setup(&[1; 8]);
    let a = s.register("a", 4, None, clock.now()).unwrap();
    s.restorer().defer_unrecorded(2, clock.now());
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
        gpu_jobs: 512,
    };
    s.restorer().expect_recorded([(a.clone(), recorded)]);
    let from = caller([127, 0, 0, 1], None);
    assert!(s.recognize(&a, &from, now).unwrap());
    assert!(s.recognize(&b, &from, now).unwrap());
    let w = s.worker(&a).unwrap();
    assert_eq!(w.name.as_str(), "a");
    assert_eq!(
        w.claim(),
        Claim {
            threads: 8,
            gpu_jobs: 512
        },
        "its GPUs' claim too"
    );
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
        s.restorer()
            .restore_loss(identity, &crate::core::quorum::Beaten::trusted());
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
    assert_eq!(s.leases.table.held_by_identity(ident), granted);
}

#[test]
fn the_cap_grows_with_the_identitys_delivered_work() {
    let (mut s, mut clock) = setup(&[1; 400]);
    let host = Some(IpAddr::from([10, 0, 0, 7]));
    let w = s.register("gpu", 1, host, clock.now()).unwrap();
    let g = s.lease(&w, 1024, &[], clock.now()).unwrap();
    assert_eq!(g.jobs.len(), 16, "claimed threads do not raise the start");
    // All 16 delivered after 20 s each, within one lease lifetime: 16 × 20 s
    // of lease time in the 20 s it lies in, 16 at once, earns a cap of 32
    // (the claim of one thread, `max(16, 4)`, lowers it back to 16).
    clock.advance(20);
    deliver_all(&mut s, &w, &g, clock.now());
    assert_eq!(
        s.allowances()
            .cap(s.worker(&w).unwrap().identity, clock.now()),
        32
    );
    assert_eq!(s.lease(&w, 1024, &[], clock.now()).unwrap().jobs.len(), 16);
    // A worker whose claim does not bind gets the measured cap.
    let big = s.register("gpu", 64, host, clock.now()).unwrap();
    assert_eq!(
        s.lease(&big, 1024, &[], clock.now()).unwrap().jobs.len(),
        32 - 16
    );
}

/// See: issue 24, item 3. A GPU worker started with `--threads 1` claimed
/// 16 jobs for all its GPUs, so however fast its GPUs delivered it held 16;
/// its GPUs' jobs now raise the claim, and only what it delivered earns
/// the leases.
#[test]
fn a_gpu_workers_claim_lets_its_measured_throughput_earn_more_than_its_threads() {
    let (mut s, mut clock) = setup(&[1; 400]);
    let host = Some(IpAddr::from([10, 0, 0, 7]));
    let gpus = Claim {
        threads: 1,
        gpu_jobs: 2 * 256,
    };
    assert_eq!(gpus.cap(), 16 + 512);
    let w = s.register("gpu", gpus, host, clock.now()).unwrap();
    let g = s.lease(&w, 1024, &[], clock.now()).unwrap();
    assert_eq!(g.jobs.len(), 16, "a claim never raises the start");
    // The same delivery as above earns 32, and now the claim lets it hold
    // them; a second round at 32 at once earns 64.
    clock.advance(20);
    deliver_all(&mut s, &w, &g, clock.now());
    let g = s.lease(&w, 1024, &[], clock.now()).unwrap();
    assert_eq!(g.jobs.len(), 32);
    clock.advance(20);
    deliver_all(&mut s, &w, &g, clock.now());
    assert_eq!(s.lease(&w, 1024, &[], clock.now()).unwrap().jobs.len(), 64);
    // No claim reaches past what any allowance grants.
    let huge = Claim {
        threads: u32::MAX,
        gpu_jobs: u32::MAX,
    };
    assert_eq!(huge.cap(), crate::core::allowance::MAX_CAP as u64);
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
        taken
            .iter()
            .all(|r| r.reason == TakenBack::OverShare && r.name == "busy" && !r.stalled)
    );
    let ident = s.worker(&busy).unwrap().identity;
    assert_eq!(s.leases.table.held_by_identity(ident), 10);
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
    let capacity = s.workers.by_id.capacity();
    // Silent for three lease lifetimes: forgotten, with everything kept
    // for them; the local threads stay.
    s.expire(clock.advance(91));
    s.prune_workers(clock.now());
    assert_eq!(s.worker_entries(), [1, 0, 0, 0]);
    assert!(
        s.workers.by_id.capacity() < capacity / 4,
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
        work: 5,
        ..Settlement::one_copy(JobId(0), Some(tally(10)))
    };
    s.settle(&restored, false).unwrap();
    s.restorer().restore_attempts(JobId(1), 3);
    s.restorer().restore_duplicates(2, 1);
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
