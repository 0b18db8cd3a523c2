//! Setting a session up: opening the data directory, creating the run (or
//! finishing its creation), and restoring the scheduler from the store; or,
//! for a run an earlier session finished, its report.
//!
//! The settings that decide what counts travel with the run: see
//! [`crate::settings`].

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant, SystemTime};

use nq_core::split::SPLIT_VERSION;
use nq_proto::convert::RunShape;
use nq_store::{
    Checkpoint, Creation, Manifest, NewRun, PlanParams, RunKey, RunSummary, SetAside,
    Store, StoreKey, StoreOptions,
};
use tracing::{info, warn};

use crate::config::{Config, default_split, default_target_jobs};
use crate::core::Core;
use crate::core::lease::WorkerId;
use crate::core::quorum::Policy;
use crate::core::scheduler::{Claim, EXACT_ORDER_UP_TO, HandOut, MAX_DEFERRED};
use crate::error::{Error, Result};
use crate::plan::{self, MAX_SUBS_PER_JOB, PLAN_FORMAT};
use crate::report::{REPORT_FILE, RunReport, Totals};
use crate::restore::{restore, restore_indexed, restore_leases};
use crate::settings::{self, Deciding};
use crate::wall::unix_ms;

/// What opening the data directory found ([`open`]).
pub(crate) enum Opened {
    /// The run was finished by an earlier session.
    Finished(Box<RunReport>),
    /// A run to serve, once [`setup`] has created or restored it.
    Accepted(Box<Accepted>),
}

/// A data directory accepted for this run: its store is open and holds
/// this run, part of it, or none yet. Everything that refuses a directory
/// (locked, damaged, another key, another run, a lost summary) has been
/// checked.
pub(crate) struct Accepted {
    store: Arc<Store>,
    key: RunKey,
    /// The stored run, when resuming.
    resumed: Option<Manifest>,
    /// A creation an earlier session began.
    creating: Option<(Creation, Checkpoint)>,
    /// The settings that decide what counts: the run's stored ones (with
    /// the changes the session may make), or the session's for a new run.
    deciding: Deciding,
    /// When opening began.
    opened: Instant,
}

pub(crate) struct Ready {
    pub(crate) store: Arc<Store>,
    pub(crate) manifest: Manifest,
    pub(crate) core: Core,
    pub(crate) elapsed_before: Duration,
}

/// Opens the store and checks that it may hold this run; for a run an
/// earlier session finished, its report. Blocking (sled I/O), and short:
/// the long part of a session's start is [`setup`]'s.
pub(crate) fn open(config: &Config) -> Result<Opened> {
    let opened = Instant::now();
    let options = StoreOptions {
        cache_capacity: config.cache_bytes,
        key: config.store_key.clone(),
    };
    let store = Arc::new(Store::open(&config.data_dir, &options)?);
    let stored = store.manifest()?;
    let creating = store.creation()?;
    let stored_board = (stored.as_ref().map(|m| m.key.board))
        .or_else(|| creating.as_ref().map(|(c, _)| c.run.key.board));
    if let Some(board) = stored_board
        && board != config.board
    {
        return Err(Error::BoardMismatch {
            dir: config.data_dir.clone(),
            stored: board.n().into(),
            given: config.board.n().into(),
        });
    }
    let spec = config
        .split
        .or(stored.as_ref().map(|m| m.key.spec))
        .or(creating.as_ref().map(|(c, _)| c.run.key.spec))
        .unwrap_or_else(|| default_split(config.board));
    let key = RunKey {
        board: config.board,
        split_version: SPLIT_VERSION,
        spec,
        solutions: config.solutions,
    };
    let resumed = store.resume(&key)?;
    if let Some(m) = &resumed
        && let Some(summary) = store.summary()?
    {
        return Ok(Opened::Finished(Box::new(finished_report(
            config, &store, m, &summary,
        )?)));
    }
    if config.data_dir.join(REPORT_FILE).exists() {
        return Err(Error::SummaryLost {
            dir: config.data_dir.clone(),
        });
    }
    // Checked here, before the session is announced: a resume under other
    // settings is refused without serving.
    let deciding = if resumed.is_some() || creating.is_some() {
        settings::resume(config, &store)?
    } else {
        Deciding::of_config(config)
    };
    Ok(Opened::Accepted(Box::new(Accepted {
        store,
        key,
        resumed,
        creating,
        deciding,
        opened,
    })))
}

/// What setup found in the data directory ([`setup`]).
#[cfg(test)]
pub(crate) enum Setup {
    /// The run was finished by an earlier session.
    Finished(
        #[expect(dead_code, reason = "the simulation only tells a finished run apart")]
        Box<RunReport>,
    ),
    /// Ready to serve.
    Ready(Box<Ready>),
}

/// [`open`] and [`build`] at once, for a caller that binds nothing between
/// them (the simulation).
#[cfg(test)]
pub(crate) fn setup(config: &Config, stop: &AtomicBool) -> Result<Setup> {
    Ok(match open(config)? {
        Opened::Finished(report) => Setup::Finished(report),
        Opened::Accepted(accepted) => {
            Setup::Ready(Box::new(build(config, *accepted, stop)?))
        }
    })
}

/// Creates or resumes the run of an [`Accepted`] directory and rebuilds
/// the scheduler. Blocking (sled I/O and, for a new run, the split); a
/// creation stops between two batches once `stop` is set.
pub(crate) fn build(
    config: &Config,
    accepted: Accepted,
    stop: &AtomicBool,
) -> Result<Ready> {
    let Accepted {
        store,
        key,
        resumed,
        creating,
        deciding,
        opened,
    } = accepted;
    // A run created by this session has no record yet: nothing to check.
    let created = resumed.is_none();
    let manifest = match resumed {
        Some(m) => {
            info!(dir = %config.data_dir.display(), run = %m.run_id, jobs = m.jobs, "resuming run");
            if config.target_jobs.is_some() || config.max_job_size != MAX_SUBS_PER_JOB {
                warn!(
                    "--jobs and --job-size apply to new runs only; the stored jobs are kept"
                );
            }
            m
        }
        None => create(config, &store, key, creating, &deciding, stop)?,
    };
    let session_no = store.next_boot()?;
    // This build stores every conflict it charges: carried on from the
    // sessions before, unless one of them did not (see `keep_losses`).
    // Flushed at once, so that a crash before this session's first commit
    // does not read as a session that kept none.
    if !store.keep_losses(session_no)? && !created {
        info!(
            "the run's conflicts lost were not all stored (a run created before they were kept, or a session of such a build): restores judge them again from the copies"
        );
    }
    store.flush()?;
    let mut core = scheduler(
        &store,
        &manifest,
        session_no,
        config.lease_ttl,
        deciding.policy(&store)?,
    )?;
    core.restorer()
        .expect_local_threads(config.local_threads > 0);
    core.restorer()
        .trust(deciding.trusted.iter().map(String::as_str));
    let leased = restore_results(&store, &manifest, &mut core, created)?;
    restore_previous_leases(&store, leased, &mut core, config.lease_ttl)?;
    log_restored(&core);
    let elapsed_before = Duration::from_millis(store.elapsed_ms()?);
    info!(
        setup_ms = opened.elapsed().as_millis() as u64,
        session = session_no,
        "data directory ready"
    );
    Ok(Ready {
        store,
        manifest,
        core,
        elapsed_before,
    })
}

/// Restores the stored results into `core` and returns the records of
/// the jobs leased when the last session ended. Totals are derived again
/// from the stored counts, never from a cached sum: before serving for a
/// store without a state index (and the index is built then), else in the
/// background while serving (see `restore_indexed`).
fn restore_results(
    store: &Store,
    manifest: &Manifest,
    core: &mut Core,
    created: bool,
) -> Result<Vec<(nq_store::JobId, nq_store::JobRecord)>> {
    if store.is_indexed()? {
        if !created {
            // Even with no job marked restoring: the index may have missed
            // a result (see `nq_store::states`).
            core.restorer().begin_store_check();
        }
        return restore_indexed(store, core, Instant::now());
    }
    restore(store, &shape_of(manifest), core, Instant::now())?;
    info!("building the state index of a store written before it existed");
    store.rebuild_indexes()?;
    Ok(store.leased_records()?)
}

/// Gives the leases of the previous session back to their workers, or
/// their jobs back to the pending ones.
fn restore_previous_leases(
    store: &Store,
    leased: Vec<(nq_store::JobId, nq_store::JobRecord)>,
    core: &mut Core,
    ttl: Duration,
) -> Result<()> {
    // Leases granted in the second before a crash have no record; their
    // jobs are set aside, so that their holders report them first (issue
    // 17). The recorded registrations bound how many there can be.
    let recorded = store.workers()?;
    // The previous session's own threads died with it: none of their leases
    // will be reported.
    let caps: u64 = recorded
        .iter()
        .filter(|(_, w)| !crate::restore::own_threads(w))
        .map(|(_, w)| Claim::from(w).cap())
        .sum();
    let set_aside =
        set_aside_at_restart(store.set_aside()?, caps, unix_ms(SystemTime::now()), ttl);
    core.restorer()
        .defer_unrecorded(set_aside.jobs, Instant::now());
    store.record_set_aside(set_aside)?;
    // A worker recognised by its id keeps its recorded name and identity.
    core.restorer()
        .expect_recorded(recorded.into_iter().map(|(id, w)| (WorkerId(id), w)));
    let kept = restore_leases(store, leased, core, SystemTime::now(), Instant::now())?;
    if kept.restored > 0 || kept.requeued > 0 {
        info!(
            restored = kept.restored,
            workers = kept.workers,
            requeued = kept.requeued,
            "leases of the previous session: kept with their workers, or their jobs pending again"
        );
    }
    Ok(())
}

/// The fresh jobs a restart sets aside, and until when: the recorded
/// workers' lease `caps`, plus the `last` restart's set-aside if its time
/// had not run out. A crash within a lease lifetime of the last restart
/// leaves that restart's set-aside jobs first in the hand-out order, never
/// handed out, with the unrecorded leases of the session between right
/// after them: setting aside `caps` jobs again would set aside the same
/// jobs and hand those leases' jobs to other workers before their holders
/// report them (two kills 25 s apart lost 718 leases in the record run's
/// dry run, BENCHMARKS.md §27).
fn set_aside_at_restart(
    last: Option<SetAside>,
    caps: u64,
    now_unix_ms: u64,
    ttl: Duration,
) -> SetAside {
    let carried = last
        .filter(|s| s.until_unix_ms > now_unix_ms)
        .map_or(0, |s| s.jobs);
    SetAside {
        jobs: caps.saturating_add(carried).min(MAX_DEFERRED),
        until_unix_ms: now_unix_ms
            .saturating_add(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX)),
    }
}

/// Logs what the restored core holds.
fn log_restored(core: &Core) {
    let standing = core.standing();
    if standing.jobs_done > 0 || standing.jobs_in_check > 0 {
        info!(
            done = standing.jobs_done,
            jobs = standing.jobs,
            in_check = standing.jobs_in_check,
            "restored finished jobs"
        );
    }
    if standing.jobs_restoring > 0 {
        info!(
            stored = standing.jobs_restoring,
            jobs = standing.jobs,
            "done jobs found in the state index: not handed out; their stored copies are checked and counted in the background"
        );
    }
}

/// The board size N of the run stored in `dir` (made, or being made,
/// there), opened with `key`; `None` when `dir` holds no run. Creates
/// nothing: a path without a data directory is not opened. For `nq-coord`
/// without `--n`, which resumes the run it finds.
///
/// # Errors
///
/// The store's: locked by a running coordinator, damaged, or keyed with
/// another key.
pub fn stored_n(dir: &Path, key: Option<&StoreKey>) -> Result<Option<u8>> {
    if !dir.join("db").is_file() && !dir.join(nq_store::MARKER_FILE).is_file() {
        return Ok(None);
    }
    let options = StoreOptions {
        key: key.cloned(),
        ..StoreOptions::default()
    };
    let store = Store::open(dir, &options)?;
    if let Some(m) = store.manifest()? {
        return Ok(Some(m.key.board.n()));
    }
    Ok(store.creation()?.map(|(c, _)| c.run.key.board.n()))
}

/// The shape of a stored run.
pub(crate) fn shape_of(manifest: &Manifest) -> RunShape {
    RunShape {
        board: manifest.key.board,
        spec: manifest.key.spec,
        solutions: manifest.key.solutions,
    }
}

/// The scheduler of a stored run: small runs hand their jobs out in exact
/// order of work, from a list in memory; large ones read the order stored
/// with the jobs, a chunk at a time (built first for runs created before
/// it existed).
fn scheduler(
    store: &Arc<Store>,
    manifest: &Manifest,
    session: u64,
    ttl: Duration,
    policy: Policy,
) -> Result<Core> {
    let corrupt = || -> Error {
        nq_store::Error::Corrupt {
            tree: "jobs",
            what: nq_store::Corruption::Field { field: "job count" },
        }
        .into()
    };
    if manifest.jobs <= EXACT_ORDER_UP_TO as u64 {
        let works = store.job_works()?;
        let total: u128 = works.iter().map(|&w| u128::from(w)).sum();
        if works.len() as u64 != manifest.jobs || total != manifest.total_work {
            return Err(corrupt());
        }
        return Ok(Core::with_works(
            works,
            session,
            ttl,
            policy,
            Instant::now(),
        ));
    }
    if store.ensure_order()? {
        info!(jobs = manifest.jobs, "built the stored hand-out order");
    }
    Ok(Core::with_order(
        (manifest.jobs, manifest.total_work),
        Box::new(StoredOrder::new(Arc::clone(store))),
        session,
        ttl,
        policy,
        Instant::now(),
    ))
}

/// Creates the run, or finishes the creation an earlier session began:
/// splits the board and streams the jobs into the store (see
/// [`crate::plan`]). A new run stores `deciding` with it.
fn create(
    config: &Config,
    store: &Store,
    key: RunKey,
    creating: Option<(Creation, Checkpoint)>,
    deciding: &Deciding,
    stop: &AtomicBool,
) -> Result<Manifest> {
    let t = Instant::now();
    let (params, at) = match creating {
        Some(creation) => go_on_creating(config, key, creation)?,
        None => {
            store.set_run_settings(&deciding.to_stored(Vec::new()))?;
            begin_creating(config, store, key)?
        }
    };
    let manifest = plan::build(store, config.board, key.spec, params, at, stop)?;
    info!(
        n = config.board.n(),
        ring = key.spec.ring,
        extra = key.spec.extra,
        subproblems = params.subproblems,
        jobs = manifest.jobs,
        ms = t.elapsed().as_millis() as u64,
        run = %manifest.run_id,
        "created run"
    );
    Ok(manifest)
}

/// The plan and checkpoint of the creation an earlier session began, once
/// it is known to make the run asked for.
fn go_on_creating(
    config: &Config,
    key: RunKey,
    (c, at): (Creation, Checkpoint),
) -> Result<(PlanParams, Checkpoint)> {
    if c.run.key != key || c.plan.format != PLAN_FORMAT {
        return Err(Error::CreationMismatch {
            dir: config.data_dir.clone(),
            stored: format!("{} (plan format {})", c.run.key, c.plan.format),
            requested: format!("{key} (plan format {PLAN_FORMAT})"),
        });
    }
    if config.target_jobs.is_some() || config.max_job_size != MAX_SUBS_PER_JOB {
        warn!(
            "--jobs and --job-size apply to new runs only; the creation goes on with its own"
        );
    }
    info!(
        run = %c.run.run_id,
        done = at.subproblems,
        subproblems = c.plan.subproblems,
        jobs = at.jobs,
        "resuming the creation of the run's jobs"
    );
    Ok((c.plan, at))
}

/// Plans a new run and records the beginning of its creation; returns the
/// plan and the first checkpoint.
fn begin_creating(
    config: &Config,
    store: &Store,
    key: RunKey,
) -> Result<(PlanParams, Checkpoint)> {
    let target = config
        .target_jobs
        .unwrap_or_else(|| default_target_jobs(config.board));
    let params = plan::params(config.board, key.spec, target, config.max_job_size);
    let now = SystemTime::now();
    let run = NewRun {
        key,
        run_id: format!(
            "{}-{:x}-{:x}",
            config.board.n(),
            unix_ms(now),
            std::process::id()
        ),
        program_version: env!("CARGO_PKG_VERSION").to_owned(),
        created_unix_ms: unix_ms(now),
    };
    info!(
        run = %run.run_id,
        subproblems = params.subproblems,
        target_jobs = target,
        "creating the run's jobs"
    );
    store.begin_creation(&Creation { run, plan: params })?;
    Ok((params, Checkpoint::default()))
}

/// The report of a run an earlier session finished, from one reading of
/// the store: the audit's, whose digest the report prints, and whose
/// judging of the stored copies finds again the workers that lost
/// conflicts (and, for a summary of format 2, what settled unchecked). At
/// 10^8 jobs each reading is minutes; the report used to judge the store
/// once for itself and once more for the digest.
fn finished_report(
    config: &Config,
    store: &Store,
    m: &Manifest,
    s: &RunSummary,
) -> Result<RunReport> {
    // Read only: a finished run's records are final. The audit's judging
    // is not the run's verdict (restore judges confirmations again, without
    // the moments each job settled), and it moves no record; the summary
    // is checked against the records, which are what the run counted.
    let (audit, core) = crate::audit::judged(
        store,
        &mut std::io::sink(),
        crate::core::quorum::Fraction::Auto,
    )?;
    // The stored summary is a cached sum too: it must equal the results.
    if audit.rows_total != s.total {
        return Err(Error::SummaryMismatch {
            dir: config.data_dir.clone(),
            stored: s.total,
            derived: audit.rows_total,
        });
    }
    let standing = core.standing();
    let mut report = RunReport::new(
        m,
        &config.data_dir,
        // Every job settled in the finished run. Its summary says how many
        // settled unchecked; one written before it did is judged again:
        // those left waiting for a check settled without one too.
        Totals::of_summary(s, 0, standing.jobs_unchecked + standing.jobs_in_check),
        core.verification().faulty_workers(),
    );
    report.audit_digest = Some(audit.digest);
    report.setting_changes = settings::changes(store)?;
    Ok(report)
}

/// The hand-out order stored with a large run's jobs, read a chunk at a
/// time: the scheduler's memory holds one chunk of ids, not a queue of
/// every job.
#[derive(Debug)]
struct StoredOrder {
    store: Arc<Store>,
    /// The key of the last chunk read.
    cursor: Option<Vec<u8>>,
}

impl StoredOrder {
    fn new(store: Arc<Store>) -> StoredOrder {
        StoredOrder {
            store,
            cursor: None,
        }
    }
}

impl HandOut for StoredOrder {
    fn next_batch(&mut self) -> Result<Vec<nq_store::JobId>> {
        match self.store.order_after(self.cursor.as_deref())? {
            Some((key, ids)) => {
                self.cursor = Some(key);
                Ok(ids)
            }
            None => Ok(Vec::new()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(30);

    #[test]
    fn a_crash_within_a_lease_lifetime_of_a_restart_sets_aside_both_sessions_jobs() {
        let first = set_aside_at_restart(None, 16, 1_000, TTL);
        assert_eq!(
            first,
            SetAside {
                jobs: 16,
                until_unix_ms: 31_000
            }
        );
        // 25 s later the first set-aside still holds its jobs back: they
        // come first in the order, then the leases of the session between.
        assert_eq!(set_aside_at_restart(Some(first), 16, 26_000, TTL).jobs, 32);
        // Once its time ran out, its jobs were handed out again.
        assert_eq!(set_aside_at_restart(Some(first), 16, 31_000, TTL).jobs, 16);
        // A crash loop cannot grow it past the cap.
        let mut last = first;
        for t in 0..200_000u64 {
            last = set_aside_at_restart(Some(last), 64, 1_000 + t, TTL);
        }
        assert_eq!(last.jobs, MAX_DEFERRED);
    }
}
