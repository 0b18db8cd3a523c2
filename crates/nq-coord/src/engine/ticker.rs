//! The engine's clock: every [`TICK`] it advances the core (lease expiry,
//! the machines at work, the rate samples), and on slower beats it writes
//! lease records, records the time spent, logs and publishes progress.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::{Engine, blocking};
use crate::core::scheduler::{Reclaimed, TakenBack};
use crate::core::status::Progress;

/// How often leases are checked for expiry and progress is published.
const TICK: Duration = Duration::from_millis(250);

/// How often lease records are written (see [`Engine::write_records`]).
const RECORDS_EVERY: Duration = Duration::from_secs(1);

/// How often issued leases of settled jobs are forgotten. Often: at 10,000
/// completions a second, every second of delay holds about a megabyte of
/// leases nothing can use any more.
const PRUNE_EVERY: Duration = Duration::from_secs(1);

/// How often the time spent on the run is recorded.
const ELAPSED_EVERY: Duration = Duration::from_secs(5);

/// Where the ticker publishes and logs progress.
#[derive(Debug)]
pub(crate) struct Publish {
    /// Receives a [`Progress`] every tick.
    pub(crate) progress: Option<watch::Sender<Progress>>,
    /// Logs a progress line this often.
    pub(crate) log_every: Option<Duration>,
    /// Time spent on the run by earlier sessions, and when this one started.
    pub(crate) elapsed_before: Duration,
    pub(crate) started: Instant,
}

/// Runs the clock until `token` is cancelled.
pub(crate) async fn ticker(
    engine: Arc<Engine>,
    publish: Publish,
    token: CancellationToken,
) {
    let mut interval = tokio::time::interval(TICK);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_log = Instant::now();
    let mut last_elapsed = Instant::now();
    let mut last_records = Instant::now();
    let mut last_prune = Instant::now();
    loop {
        tokio::select! {
            () = token.cancelled() => {
                // The last word on how far the run got: a run shorter than
                // the interval logs its progress this once.
                if publish.log_every.is_some() {
                    log_progress(&engine.progress());
                }
                return;
            }
            _ = interval.tick() => {}
        }
        let now = Instant::now();
        let prune = now.duration_since(last_prune) >= PRUNE_EVERY;
        if prune {
            last_prune = now;
        }
        let (expired, reclaimed) = engine.tick(now, prune);
        for lease in expired {
            warn!(job = %lease.job, lease = %lease.id, worker = %lease.worker, "lease expired; job is pending again");
        }
        for r in reclaimed {
            log_reclaimed(&r);
        }
        if last_records.elapsed() >= RECORDS_EVERY {
            last_records = now;
            if let Err(e) = blocking(|| engine.write_records()) {
                error!(error = %e.chain(), "cannot record leases");
            }
        }
        if last_elapsed.elapsed() >= ELAPSED_EVERY {
            last_elapsed = now;
            let ms = (publish.elapsed_before + publish.started.elapsed()).as_millis();
            // Durable with the next flush; losing it costs a few seconds of
            // accounting, nothing else.
            if let Err(e) = engine
                .store
                .set_elapsed_ms(u64::try_from(ms).unwrap_or(u64::MAX))
            {
                error!(error = %e, "cannot record the time spent");
            }
        }
        let progress = engine.core().progress(now);
        if let Some(every) = publish.log_every
            && last_log.elapsed() >= every
        {
            last_log = now;
            log_progress(&progress);
        }
        if let Some(tx) = &publish.progress {
            tx.send_replace(progress);
        }
    }
}

/// Names the holder of a lease taken back: a worker that holds leases
/// without progress is a hoarder, or stuck.
fn log_reclaimed(r: &Reclaimed) {
    let reason = match r.reason {
        TakenBack::Overdue => "held far past its measured time",
        TakenBack::OverShare => "held over its fair share while others waited",
    };
    if r.stalled {
        warn!(
            job = %r.lease.job,
            lease = %r.lease.id,
            worker = %r.lease.worker,
            name = %r.name,
            identity = %r.identity,
            reason,
            "LEASES WITHOUT PROGRESS: lease taken back and job reissued; the worker delivered nothing lately and may hold one job until it does"
        );
    } else {
        warn!(
            job = %r.lease.job,
            lease = %r.lease.id,
            worker = %r.lease.worker,
            name = %r.name,
            identity = %r.identity,
            reason,
            "lease taken back; job reissued"
        );
    }
}

/// One progress line: settled work, then the work computed and awaiting a
/// check (so that a run whose copies wait for checks does not read as
/// stalled), and who is at work (`workers` counts remote workers;
/// `local_threads` the coordinator's own).
fn log_progress(p: &Progress) {
    let c = &p.counters;
    let (in_check, _) = p.awaiting_check;
    info!(
        jobs_done = c.jobs_done,
        jobs = c.jobs,
        percent = (p.fraction() * 1000.0).round() / 10.0,
        // Jobs computed, waiting for a check copy by another machine, and
        // their share of the work.
        in_check,
        awaiting_check_percent = (p.fraction_awaiting_check() * 1000.0).round() / 10.0,
        jobs_per_s = (p.jobs_per_second() * 10.0).round() / 10.0,
        eta_s = p.eta().map(|d| d.as_secs()),
        workers = c.workers,
        local_threads = p.local_threads,
        leased = c.jobs_leased,
        "progress"
    );
}
