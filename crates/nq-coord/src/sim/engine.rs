//! The simulation of the engine over a real store.
//!
//! Each scenario creates a real run of the 8-queens board (8 to 24 jobs) in
//! a temporary directory (`setup`, real sled on disk), builds an
//! [`Engine`] and runs the real commit loop on a current-thread tokio
//! runtime. Simulated workers register, are granted jobs
//! ([`Engine::grant`]), and report through [`Engine::admit`] and
//! [`Engine::accept`], several at once so that the loop commits groups.
//! Honest workers report the true sub-problem counts (solved with nq-core:
//! the truth is Q(8) = 92), liars change a count (random liars, and
//! colluders whose lie is shared by their group), slow workers report after
//! their lease expired, duplicating ones twice, and workers of another run
//! or another session are refused.
//!
//! Invariants are checked whenever the engine is quiescent: the commit loop
//! is stopped by its token (it drains its queue and returns), the store is
//! read back, and the engine is rebuilt around the same core. An
//! acknowledged copy must already be in the store when its reporter hears
//! back. Crashes come in two kinds: a quiet one (stop, drop the engine and
//! the store, run `setup` again, which restores) after which the restored
//! scheduler must match the live one, and a hard one that aborts the commit
//! loop and the reporters mid-group, after which only the invariants are
//! checked (an aborted group may be half settled). sled flushes on drop, so
//! a crash here does not lose applied writes; the durability of an
//! acknowledgement is checked at the acknowledgement instead.
//!
//! Backups ([`Engine::backup`]) are taken now and then with reports in
//! flight, and some hard crashes lose the data directory: it is rebuilt
//! from the last backup (`nq_store::backup::restore`) before the new
//! session opens it, so the session resumes with the copies stored since
//! the backup gone, and the invariants and the final truth must hold all
//! the same.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use nq_core::split::SubCounts;
use nq_store::{JobId, JobState, Scan, Store, StoredResult};
use rand::Rng;
use rand::rngs::StdRng;
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;

use super::core::{Restored, check_ledger, compare, finished, judged};
use super::{Failure, Stats, ensure, mix, rng, run_all};
use crate::config::Config;
use crate::core::Core;
use crate::core::lease::{LeaseId, WorkerId};
use crate::core::quorum::Fraction;
use crate::core::scheduler::{Outcome, Scheduler};
use crate::engine::{Engine, Submission, commit};
use crate::error::Error;
use crate::setup::{Setup, setup, shape_of};

/// Steps of the chaotic phase.
const STEPS: u64 = 30;

/// Rounds of the honest drain, at most.
const DRAIN_ROUNDS: u64 = 20;

/// The lease lifetime (of the fake clock).
const TTL: Duration = Duration::from_secs(30);

/// The seeded scenarios of the engine (200 in CI).
#[test]
fn the_engine_keeps_its_invariants_over_a_real_store() {
    let stats = run_all(
        "the_engine_keeps_its_invariants",
        1_000_000,
        200,
        run_scenario,
    );
    if std::env::var("NQ_SIM_SEED").is_err() {
        assert!(
            stats.lies > 0 && stats.crashes > 0 && stats.refused > 0,
            "{stats:?}"
        );
        assert!(stats.completed > 0 && stats.truth_checked > 0, "{stats:?}");
        assert!(stats.backups > 0 && stats.disk_losses > 0, "{stats:?}");
        assert!(stats.tampered > 0, "{stats:?}");
        super::core::assert_rare_divergence(&stats);
    }
}

/// One scenario, from its seed.
pub(super) fn run_scenario(seed: u64) -> Result<Stats, Failure> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure {
            step: 0,
            what: format!("no runtime: {e}"),
        })?;
    rt.block_on(async move {
        let dir = tempfile::tempdir().map_err(|e| Failure {
            step: 0,
            what: format!("no temporary directory: {e}"),
        })?;
        let mut sim = Sim::new(seed, dir.path())
            .await
            .map_err(|what| Failure { step: 0, what })?;
        let mut step = 0;
        while step < STEPS {
            step += 1;
            sim.step().await.map_err(|what| Failure { step, what })?;
        }
        for _ in 0..DRAIN_ROUNDS {
            if sim.complete() {
                break;
            }
            step += 1;
            sim.drain_round()
                .await
                .map_err(|what| Failure { step, what })?;
        }
        step += 1;
        sim.finish().await.map_err(|what| Failure { step, what })?;
        sim.stats.steps = step;
        let stats = sim.stats.clone();
        sim.close().await;
        Ok(stats)
    })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Honesty {
    Honest,
    RandomLiar,
    Colluder(u64),
}

#[derive(Clone, Debug)]
struct Task {
    job: JobId,
    lease: LeaseId,
    worker: WorkerId,
    due: Duration,
}

#[derive(Debug)]
struct SimWorker {
    name: String,
    ip: IpAddr,
    honesty: Honesty,
    slow: bool,
    duplicates: bool,
    id: Option<WorkerId>,
    tasks: Vec<Task>,
}

/// One coordinator session: the engine and its commit loop.
struct Session {
    engine: Arc<Engine>,
    committer: JoinHandle<crate::error::Result<()>>,
    token: CancellationToken,
}

impl Session {
    fn start(
        engine: Engine,
        rx: tokio::sync::mpsc::Receiver<commit::CommitRequest>,
    ) -> Session {
        let engine = Arc::new(engine);
        let token = CancellationToken::new();
        let committer =
            tokio::spawn(commit::commit_loop(Arc::clone(&engine), rx, token.clone()));
        Session {
            engine,
            committer,
            token,
        }
    }
}

struct Sim {
    seed: u64,
    rng: StdRng,
    config: Config,
    start: Instant,
    clock: Duration,
    session: Session,
    run_id: String,
    truth: Vec<Vec<SubCounts>>,
    workers: Vec<SimWorker>,
    granted: HashMap<LeaseId, (WorkerId, JobId)>,
    inflight: JoinSet<Result<Option<Outcome>, String>>,
    /// The last backup taken, if any.
    backup: Option<std::path::PathBuf>,
    /// Per job, the copies judged before the run completed.
    sealed: Option<Vec<usize>>,
    /// At the last check before completion: per job, its copies and
    /// whether it was settled.
    before: Option<(Vec<usize>, Vec<bool>)>,
    stats: Stats,
}

/// Opens the sled database in `dir` directly, as an attacker with write
/// access would. A store closed a moment ago keeps its lock until sled's
/// background threads let go (see `Store::open`), so a held lock is retried
/// for a while.
fn raw_open(dir: &std::path::Path) -> Result<sled::Db, String> {
    let give_up = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match sled::Config::new().path(dir).open() {
            Ok(db) => return Ok(db),
            Err(sled::Error::Io(ref e))
                if e.to_string().contains("could not acquire lock")
                    && std::time::Instant::now() < give_up =>
            {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(format!("raw sled: {e}")),
        }
    }
}

/// Opens the run in `config.data_dir` as a new session does (`setup`,
/// which restores), and starts its engine; returns once the stored copies
/// of earlier sessions are checked and counted (a restart serves before,
/// see `engine::restoring`), so that the restored scheduler can be compared
/// with the live one.
async fn open(config: &Config) -> Result<(Session, String), String> {
    let ready = match setup(config, &AtomicBool::new(false)) {
        Ok(Setup::Ready(ready)) => *ready,
        Ok(Setup::Finished(_)) => return Err("the run was finished unexpectedly".into()),
        Err(e) => return Err(format!("setup failed: {e}")),
    };
    let run_id = ready.manifest.run_id.clone();
    let (engine, rx) = Engine::new(
        ready.store,
        ready.core,
        shape_of(&ready.manifest),
        run_id.clone(),
    );
    let mut session = Session::start(engine, rx);
    tokio::select! {
        () = session.engine.checked.cancelled() => {}
        stopped = &mut session.committer => {
            return Err(match stopped {
                Ok(Err(e)) => format!("checking the stored copies failed: {}", e.chain()),
                other => format!("the commit loop stopped while checking the stored copies: {other:?}"),
            });
        }
    }
    Ok((session, run_id))
}

impl Sim {
    async fn new(seed: u64, dir: &std::path::Path) -> Result<Sim, String> {
        let mut rng = rng(seed);
        let mut config =
            Config::new(8, dir.join("run.sled")).map_err(|e| e.to_string())?;
        config.target_jobs = Some(rng.random_range(8..=24));
        config.verify = Fraction::Fixed([0.0, 0.3, 1.0][rng.random_range(0..3)]);
        config.ban_after = std::num::NonZeroU32::new(rng.random_range(1..=3))
            .expect("1 to 3 is not zero");
        config.lease_ttl = TTL;
        // Half the runs seal their store with a key, kept outside it.
        if rng.random_range(0..2) == 0 {
            let key: [u8; 32] = rng.random();
            config.store_key =
                Some(nq_store::StoreKey::from_bytes(&key).map_err(|e| e.to_string())?);
        }
        let (session, run_id) = open(&config).await?;
        let jobs = session.engine.core().sched().jobs();
        let never = AtomicBool::new(false);
        let mut truth = Vec::new();
        for j in 0..jobs {
            let def = session
                .engine
                .definition(JobId(j))
                .map_err(|e| format!("job {j}: {e}"))?;
            let counts = def
                .subs
                .iter()
                .map(|s| s.solve(&never).map(|(c, _)| c).ok_or("stopped"))
                .collect::<Result<Vec<_>, _>>()?;
            truth.push(counts);
        }
        let n = rng.random_range(2..=6usize);
        let workers = (0..n)
            .map(|i| SimWorker {
                name: format!("w{i}"),
                ip: IpAddr::V4(Ipv4Addr::new(10, 1, 0, i as u8 + 1)),
                honesty: match (i, rng.random_range(0..10)) {
                    (0, _) | (_, 0..5) => Honesty::Honest,
                    (_, 5..7) => Honesty::RandomLiar,
                    _ => Honesty::Colluder(rng.random_range(0..2)),
                },
                slow: rng.random_range(0..4) == 0,
                duplicates: rng.random_range(0..4) == 0,
                id: None,
                tasks: Vec::new(),
            })
            .collect();
        Ok(Sim {
            seed,
            rng,
            config,
            start: Instant::now(),
            clock: Duration::ZERO,
            session,
            run_id,
            truth,
            workers,
            granted: HashMap::new(),
            inflight: JoinSet::new(),
            backup: None,
            sealed: None,
            before: None,
            stats: Stats::default(),
        })
    }

    fn now(&self) -> Instant {
        self.start + self.clock
    }

    fn engine(&self) -> &Arc<Engine> {
        &self.session.engine
    }

    fn complete(&self) -> bool {
        self.engine().core().sched().is_complete()
    }

    async fn step(&mut self) -> Result<(), String> {
        match self.rng.random_range(0..100) {
            0..35 => self.lease(None),
            35..75 => self.report(None).await?,
            75..88 => self.advance(),
            88..92 => self.foreign_report(),
            92..96 => return self.crash(false).await,
            _ => return self.crash(true).await,
        }
        if self.rng.random_range(0..20) == 0 {
            self.take_backup().await?;
        }
        // Let some reports stay in flight across steps.
        if self.rng.random_range(0..3) > 0 {
            self.pause().await?;
        }
        Ok(())
    }

    /// A backup, with whatever reports are in flight going on beside it: the
    /// commit loop waits for the copy (the write gate).
    async fn take_backup(&mut self) -> Result<(), String> {
        let path = self.config.data_dir.with_file_name("last.nqbackup");
        let info = self
            .engine()
            .backup(path.clone())
            .await
            .map_err(|e| format!("backup failed: {}", e.chain()))?;
        let done = nq_store::backup::check(&path)
            .map_err(|e| format!("a fresh backup does not check: {e}"))?
            .jobs_done;
        ensure!(
            done == info.jobs_done,
            "backup says {done} done, wrote {info:?}"
        );
        self.stats.backups += 1;
        self.backup = Some(path);
        Ok(())
    }

    fn registered(&mut self, w: usize) -> WorkerId {
        if let Some(id) = &self.workers[w].id
            && self.engine().core().sched().worker(id).is_some()
        {
            return id.clone();
        }
        let now = self.now();
        let (name, ip) = (self.workers[w].name.clone(), self.workers[w].ip);
        let id = (self
            .engine()
            .core()
            .sched_mut()
            .register(&name, 1, Some(ip), now))
        .expect("the simulation registers within the limits");
        self.workers[w].id = Some(id.clone());
        id
    }

    fn lease(&mut self, w: Option<usize>) {
        let w = w.unwrap_or_else(|| self.rng.random_range(0..self.workers.len()));
        let id = self.registered(w);
        let held: Vec<LeaseId> = self.workers[w]
            .tasks
            .iter()
            .filter(|t| t.worker == id)
            .map(|t| t.lease)
            .collect();
        let want = self.rng.random_range(1..=3);
        let now = self.now();
        let Ok((grant, _)) = self.engine().grant(&id, want, &held, now) else {
            return; // banned
        };
        for g in grant.jobs {
            self.granted.insert(g.lease, (id.clone(), g.job));
            let delay = if self.workers[w].slow {
                self.rng.random_range(0..2 * TTL.as_millis() as u64)
            } else {
                self.rng.random_range(0..TTL.as_millis() as u64 / 2)
            };
            let due = self.clock + Duration::from_millis(delay);
            self.workers[w].tasks.push(Task {
                job: g.job,
                lease: g.lease,
                worker: id.clone(),
                due,
            });
        }
    }

    fn counts_of(&mut self, w: usize, job: JobId) -> Vec<SubCounts> {
        let mut counts = self.truth[job.0 as usize].clone();
        let subs = counts.len();
        match self.workers[w].honesty {
            Honesty::Honest => {}
            Honesty::RandomLiar => {
                if self.rng.random_range(0..3) > 0 {
                    // Even, so that it passes the symmetry checks.
                    counts[self.rng.random_range(0..subs)].count +=
                        2 * self.rng.random_range(1..=2);
                }
            }
            Honesty::Colluder(group) => {
                let h = mix(mix(self.seed ^ 0xc011, group), job.0);
                counts[h as usize % subs].count += 2 + 2 * u128::from(h % 2);
            }
        }
        counts
    }

    /// Some due reports of worker `only` (or of anyone), sent at once.
    async fn report(&mut self, only: Option<usize>) -> Result<(), String> {
        let k = self.rng.random_range(1..=4);
        for _ in 0..k {
            let due: Vec<(usize, usize)> = self
                .workers
                .iter()
                .enumerate()
                .filter(|(w, _)| only.is_none_or(|o| o == *w))
                .flat_map(|(w, x)| {
                    x.tasks
                        .iter()
                        .enumerate()
                        .filter(|(_, t)| only.is_some() || t.due <= self.clock)
                        .map(move |(i, _)| (w, i))
                })
                .collect();
            if due.is_empty() {
                break;
            }
            let (w, i) = due[self.rng.random_range(0..due.len())];
            let task = if self.workers[w].duplicates && self.rng.random_range(0..2) == 0 {
                self.workers[w].tasks[i].clone()
            } else {
                self.workers[w].tasks.swap_remove(i)
            };
            self.send(w, task, self.run_id.clone())?;
        }
        Ok(())
    }

    /// Admits one report and sends it down the pipeline, in flight.
    fn send(&mut self, w: usize, task: Task, run: String) -> Result<(), String> {
        let engine = Arc::clone(self.engine());
        let ours = run == self.run_id
            && self.granted.get(&task.lease) == Some(&(task.worker.clone(), task.job));
        let admitted = match engine.admit(&task.worker.0, task.job.0, task.lease.0, &run)
        {
            Ok(a) => a,
            Err(_) => {
                self.stats.refused += 1;
                return Ok(());
            }
        };
        ensure!(
            ours,
            "admitted a report for job {} under a lease this session did not grant to {} in this run",
            task.job,
            task.worker
        );
        let counts = self.counts_of(w, task.job);
        if counts != self.truth[task.job.0 as usize] {
            self.stats.lies += 1;
        }
        if !engine.core().sched().is_live(task.lease) {
            self.stats.late += 1;
        }
        self.stats.reports += 1;
        let definition = engine
            .definition(task.job)
            .map_err(|e| format!("job {}: {e}", task.job))?;
        self.inflight.spawn(async move {
            let submission = Submission {
                counts,
                nodes: 1,
                solutions_sent: 0,
                kernel: "scalar".to_owned(),
                writer: None,
            };
            match engine.accept(&admitted, &definition, submission).await {
                Ok(accepted) => {
                    // Nothing is acknowledged before it is stored.
                    ensure!(
                        stored(&engine.store, task.job, task.lease.0)?,
                        "a copy of job {} was acknowledged before it was stored",
                        task.job
                    );
                    Ok(Some(accepted.outcome))
                }
                // A late copy of a job with no other copy is refused.
                Err(
                    Error::BadReport { .. }
                    | Error::ShuttingDown
                    | Error::Refused(crate::Refusal::LateCopy { .. }),
                ) => Ok(None),
                Err(e) => Err(format!("accept failed: {e}")),
            }
        });
        Ok(())
    }

    /// A report of a worker of another run, and one under a made-up lease:
    /// both refused.
    fn foreign_report(&mut self) {
        let w = self.rng.random_range(0..self.workers.len());
        let id = self.registered(w);
        let job = JobId(self.rng.random_range(0..self.truth.len() as u64));
        let task = Task {
            job,
            lease: LeaseId(self.rng.random_range(1..u64::MAX)),
            worker: id,
            due: self.clock,
        };
        let other = format!("{}-other", self.run_id);
        let held = self.workers[w].tasks.first().cloned();
        // Errors are refusals here; `send` fails the step if one is admitted.
        let _ = self.send(w, task, other);
        if let Some(t) = held {
            let run = format!("8-{:x}-0", self.rng.random::<u32>());
            let _ = self.send(w, t, run);
        }
    }

    fn advance(&mut self) {
        let ms = if self.rng.random_range(0..4) == 0 {
            TTL.as_millis() as u64 + self.rng.random_range(1..1000)
        } else {
            self.rng.random_range(1..TTL.as_millis() as u64 / 2)
        };
        self.clock += Duration::from_millis(ms);
        let now = self.now();
        let prune = self.rng.random_range(0..2) == 0;
        self.engine().tick(now, prune);
        if prune {
            let engine = Arc::clone(self.engine());
            let core = engine.core();
            self.granted
                .retain(|_, (_, job)| !core.sched().is_done(*job));
        }
    }

    /// Waits for the reports in flight, stops the commit loop (it drains its
    /// queue), checks the invariants against the store, and starts the
    /// engine again around the same core.
    async fn pause(&mut self) -> Result<(), String> {
        while let Some(r) = self.inflight.join_next().await {
            let outcome = r.map_err(|e| format!("a reporter panicked: {e}"))??;
            if outcome == Some(Outcome::Conflict) {
                self.stats.conflicts += 1;
            }
        }
        self.session.token.cancel();
        let ended = (&mut self.session.committer)
            .await
            .map_err(|e| format!("the commit loop panicked: {e}"))?;
        ended.map_err(|e| format!("the commit loop failed: {e}"))?;
        self.check()?;
        let core = Core::new(self.take_sched(), Instant::now());
        let engine = self.engine();
        let (engine, rx) = Engine::new(
            Arc::clone(&engine.store),
            core,
            engine.shape,
            self.run_id.clone(),
        );
        self.session = Session::start(engine, rx);
        Ok(())
    }

    /// The scheduler, taken out of the stopped engine.
    fn take_sched(&self) -> Scheduler {
        let policy = self.engine().core().verification().policy().clone();
        let empty = Core::with_works(Vec::new(), 0, TTL, policy, Instant::now());
        std::mem::replace(&mut *self.engine().core(), empty).into_sched()
    }

    /// The invariants, against what the store holds.
    fn check(&mut self) -> Result<(), String> {
        let copies = stored_copies(&self.engine().store)?;
        let engine = Arc::clone(self.engine());
        let core = engine.core();
        if core.sched().is_complete() && self.sealed.is_none() {
            // The copies judged: those of jobs settled (and checked) before
            // the window in which the run completed, as they were then, and
            // every copy of the others (copies that came after the
            // completing group in the same window are counted as judged: a
            // rare false alarm, never a missed one).
            let sealed = match &self.before {
                Some((counts, settled)) => copies
                    .iter()
                    .enumerate()
                    .map(|(j, c)| if settled[j] { counts[j] } else { received(c) })
                    .collect(),
                None => copies.iter().map(|c| received(c)).collect(),
            };
            self.sealed = Some(sealed);
        }
        if !core.sched().is_complete() {
            // A job settled unchecked is still open to its check: the copy
            // that checks it may come in the window that completes the run
            // (seed 1002717), so its copies are not sealed yet.
            let settled = (0..core.sched().jobs())
                .map(JobId)
                .map(|j| core.sched().is_done(j) && !core.sched().is_unchecked(j))
                .collect();
            self.before = Some((copies.iter().map(|c| received(c)).collect(), settled));
        }
        let sealed = self.sealed.clone();
        check_ledger(core.sched(), |job| {
            let n = sealed.as_ref().map(|s| s[job.0 as usize]);
            judged(copies[job.0 as usize].iter().collect(), n)
        })
    }

    /// The coordinator crashes and a new session restores from the store.
    /// `hard`: mid-group, with reports in flight and the commit loop
    /// aborted; else once the engine is quiet, and the restored scheduler
    /// must reach the live one's settled state.
    async fn crash(&mut self, hard: bool) -> Result<(), String> {
        self.stats.crashes += 1;
        let live = if hard {
            for _ in 0..self.rng.random_range(0..12) {
                tokio::task::yield_now().await;
            }
            self.inflight.shutdown().await;
            self.session.committer.abort();
            let _ = (&mut self.session.committer).await;
            None
        } else {
            // A tick first, so that the live run acts on what it noted (a
            // second machine noted at registration is acted on at a tick).
            let now = self.now();
            self.engine().tick(now, false);
            self.pause().await?;
            self.session.token.cancel();
            let _ = (&mut self.session.committer).await;
            Some(self.take_sched())
        };
        // Close the store: wait until the last user lets go (a write the
        // aborted loop handed to a blocking thread may still hold it).
        let store: Weak<Store> = Arc::downgrade(&self.session.engine.store);
        let placeholder = {
            let (engine, rx) = Engine::new(
                Arc::new(Store::temporary().map_err(|e| e.to_string())?),
                Core::with_works(
                    Vec::new(),
                    0,
                    TTL,
                    self.config_policy(),
                    Instant::now(),
                ),
                self.session.engine.shape,
                String::new(),
            );
            Session::start(engine, rx)
        };
        let old = std::mem::replace(&mut self.session, placeholder);
        drop(old);
        while store.strong_count() > 0 {
            tokio::task::yield_now().await;
            std::thread::yield_now();
        }
        self.session.token.cancel();
        let _ = (&mut self.session.committer).await;
        if hard && self.backup.is_some() && self.rng.random_range(0..2) == 0 {
            self.lose_disk()?;
        }
        if !hard && self.config.store_key.is_some() && self.rng.random_range(0..3) == 0 {
            self.tampered_store_is_refused().await?;
        }
        let (session, _) = open(&self.config).await?;
        self.session = session;
        // The seal is the completed run's: a restore that does not find the
        // run complete judges every stored copy again, and so do the checks.
        // (Seed 1000620: a run completed with 10 jobs settled restored with
        // 5, at the same tally, which `finished` takes for the same run.)
        if !self.complete() {
            self.sealed = None;
        }
        self.granted.clear();
        for w in &mut self.workers {
            w.id = None;
        }
        if let Some(live) = live {
            let r = {
                let engine = Arc::clone(self.engine());
                let core = engine.core();
                // The engine's stores are new: they keep their losses.
                if live.is_complete() {
                    finished(&live, core.sched(), true)?
                } else {
                    compare(&live, core.sched(), true)?
                }
            };
            match r {
                Restored::Same => {}
                Restored::StandingDiverged(what) => {
                    return Err(format!("not a known divergence here: {what}"));
                }
                Restored::ProbationDiverged(what) => {
                    if std::env::var("NQ_SIM_STRICT_RESTORE").is_ok() {
                        return Err(what);
                    }
                    self.stats.probation_divergences += 1;
                }
            }
        }
        self.check()
    }

    /// Someone who can write the data directory but cannot read the store
    /// key edits one stored record while the coordinator is down: the next
    /// session must refuse the store, naming the record, before it counts
    /// anything. The edit is then undone, and the run goes on.
    async fn tampered_store_is_refused(&mut self) -> Result<(), String> {
        let dir = self.config.data_dir.clone();
        let err = |e: sled::Error| format!("raw sled: {e}");
        let (key, real) = {
            let db = raw_open(&dir)?;
            let records = db.open_tree("records").map_err(err)?;
            let Some((key, real)) = records.first().map_err(err)? else {
                return Ok(()); // nothing stored yet
            };
            let mut forged = real.to_vec();
            let at = self.rng.random_range(0..forged.len());
            forged[at] ^= 1 << self.rng.random_range(0..8);
            records.insert(&key, forged).map_err(err)?;
            db.flush().map_err(err)?;
            (key, real)
        };
        match open(&self.config).await {
            Ok(_) => return Err("a session opened a store with a forged record".into()),
            Err(e) if e.contains("record") => {}
            Err(e) => {
                return Err(format!(
                    "a forged record was refused without naming it: {e}"
                ));
            }
        }
        self.stats.tampered += 1;
        let db = raw_open(&dir)?;
        db.open_tree("records")
            .and_then(|r| r.insert(&key, real))
            .map_err(err)?;
        db.flush().map_err(err)?;
        Ok(())
    }

    /// The data directory is lost and rebuilt from the last backup. What
    /// the checks remember of the lost copies is forgotten with them.
    fn lose_disk(&mut self) -> Result<(), String> {
        let backup = self.backup.as_ref().expect("checked by the caller");
        nq_store::backup::restore(
            backup,
            &self.config.data_dir,
            true,
            &nq_store::StoreOptions {
                key: self.config.store_key.clone(),
                ..nq_store::StoreOptions::default()
            },
        )
        .map_err(|e| format!("restore failed: {e}"))?;
        self.stats.disk_losses += 1;
        self.sealed = None;
        self.before = None;
        Ok(())
    }

    fn config_policy(&self) -> crate::core::quorum::Policy {
        crate::core::quorum::Policy {
            secret: [0; 16],
            fraction: self.config.verify,
            ban_after: self.config.ban_after.get(),
            gpu_sample: self.config.gpu_sample,
        }
    }

    /// The honest workers lease and report everything they hold, and the
    /// clock moves past a lease lifetime.
    async fn drain_round(&mut self) -> Result<(), String> {
        for w in 0..self.workers.len() {
            if self.workers[w].honesty != Honesty::Honest {
                continue;
            }
            self.lease(Some(w));
            let id = self.registered(w);
            self.workers[w].tasks.retain(|t| t.worker == id);
            while !self.workers[w].tasks.is_empty() {
                let t = self.workers[w].tasks.swap_remove(0);
                self.send(w, t, self.run_id.clone())?;
            }
            self.pause().await?;
        }
        self.clock += TTL + Duration::from_millis(1);
        let now = self.now();
        self.engine().tick(now, true);
        self.pause().await
    }

    /// The end: a quiet crash compares once more, and a completed run whose
    /// honest identities outnumbered the liars on every job a lie reached
    /// totals the truth, Q(8) = 92.
    async fn finish(&mut self) -> Result<(), String> {
        self.crash(false).await?;
        if !self.complete() {
            return Ok(());
        }
        self.stats.completed += 1;
        let copies = stored_copies(&self.engine().store)?;
        let mut outnumbered = true;
        for (j, all) in copies.iter().enumerate() {
            let n = self.sealed.as_ref().map(|s| s[j]);
            let (mut honest, mut liars): (Vec<&str>, Vec<&str>) = (vec![], vec![]);
            for c in judged(all.iter().collect(), n).0 {
                if honest.contains(&c.identity.as_str())
                    || liars.contains(&c.identity.as_str())
                {
                    continue;
                }
                if c.counts == self.truth[j] {
                    honest.push(&c.identity);
                } else {
                    liars.push(&c.identity);
                }
            }
            if !liars.is_empty() && honest.len() <= liars.len() {
                outnumbered = false;
            }
        }
        if outnumbered {
            self.stats.truth_checked += 1;
            let total = self.engine().core().sched().tally().total;
            ensure!(
                total == 92,
                "the run completed with {total} instead of Q(8) = 92, although the honest identities outnumbered the liars on every job a lie reached"
            );
        }
        Ok(())
    }

    async fn close(mut self) {
        self.inflight.shutdown().await;
        self.session.token.cancel();
        let _ = (&mut self.session.committer).await;
    }
}

/// True when the store holds a copy of `job` sent under `lease`.
fn stored(store: &Store, job: JobId, lease: u64) -> Result<bool, String> {
    let record = store.job_record(job).map_err(|e| e.to_string())?;
    if let JobState::Done(r) = record.state
        && r.lease == lease
    {
        return Ok(true);
    }
    let dups = store.job_duplicates(job).map_err(|e| e.to_string())?;
    Ok(dups.iter().any(|d| d.result.lease == lease))
}

/// How many copies of a job the store holds, `copies` as it gives them:
/// the number received, which seals those judged (see `core::judged`).
fn received(copies: &[StoredResult]) -> usize {
    judged(copies.iter().collect(), None).0.len()
}

/// Every job's copies as the store holds them (the Done record's first).
fn stored_copies(store: &Store) -> Result<Vec<Vec<StoredResult>>, String> {
    let mut out = Vec::new();
    for entry in store.scan_jobs(Scan::Every) {
        let entry = entry.map_err(|e| e.to_string())?;
        let j = entry.job.0 as usize;
        if out.len() <= j {
            out.resize(j + 1, Vec::new());
        }
        out[j] = entry.into_copies();
    }
    Ok(out)
}
