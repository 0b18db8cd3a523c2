//! The clock's questions, asked of indexes ([`Presence`], the lease table's
//! review and deadline indexes), answer as full scans of the workers and
//! leases would, over random sequences of events.

use proptest::prelude::*;

use super::*;

const TTL: Duration = Duration::from_secs(30);

fn scheduler() -> Scheduler {
    let policy = Policy {
        secret: [3; 16],
        fraction: crate::core::quorum::Fraction::Fixed(0.0),
        ban_after: 2,
        gpu_sample: 0.0,
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
        .filter(|(_, w)| !w.local && now.saturating_duration_since(w.last_seen) > horizon)
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
        lease,
        settled,
        ..Settlement::one_copy(job, None)
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
                4 if s.workers.locals == 0 && who == 0 => {
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
            let mut kept: Vec<LeaseId> = (s.leases.issued.iter())
                .filter(|(_, i)| s.jobs.table.phase(i.job) != Phase::Done)
                .map(|(&id, _)| id)
                .collect();
            kept.sort();
            s.prune_issued();
            let mut issued: Vec<LeaseId> = s.leases.issued.keys().copied().collect();
            issued.sort();
            prop_assert_eq!(issued, kept);
        }
    }
}
