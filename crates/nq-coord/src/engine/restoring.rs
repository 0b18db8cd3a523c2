//! The second half of a restart that serves first (see
//! [`crate::restore::restore_indexed`]): every stored job read again and
//! every stored copy checked against its job's definition, in the
//! background, while the coordinator serves.
//!
//! A reader on a blocking thread scans the store in job order, checks each
//! done job's copies ([`crate::restore::check`]: every tally derived again
//! from its counts) and sends them in blocks to the commit loop, which
//! judges and settles them ([`crate::restore::restore_job`]) between its
//! groups: the commit loop stays the one writer of results, and the
//! judging sees the same scheduler as every live copy.
//!
//! A job waiting for this check is never handed out and counts nothing.
//! Should a copy of it arrive first (a late report), or a discredit need it
//! judged again, the commit loop checks and settles that job at once
//! ([`restore_now`]) before it judges anything else of it. The run cannot
//! complete, so no total is published, before the reader has read every job
//! (`Restorer::stored_checked` in `core::scheduler`).

use std::sync::Arc;

use nq_store::{CommitBatch, JobId, Scan, ScannedJob};
use tokio::sync::mpsc;
use tracing::{info, warn};

use super::{Engine, blocking};
use crate::core::ledger;
use crate::error::Result;
use crate::restore::{Checked, check, restore_job};

/// Jobs per block sent to the commit loop: judging a block holds the core's
/// lock, so it stays small (a fraction of a millisecond).
const BLOCK: usize = 256;

/// Blocks read ahead of the commit loop, at most.
const AHEAD: usize = 4;

/// Stored jobs, each with its check if it is done.
pub(crate) type Block = Vec<(ScannedJob, Option<Checked>)>;

/// Starts the reader: every stored job, in job order, done ones checked, in
/// blocks. A damaged copy ends the scan with its error, which stops the
/// coordinator (as it stops a restart that checks before serving). The
/// reader stops when the receiver is dropped.
pub(crate) fn start_reader(engine: &Engine) -> mpsc::Receiver<Result<Block>> {
    let (tx, rx) = mpsc::channel(AHEAD);
    let (store, shape) = (Arc::clone(&engine.store), engine.shape);
    tokio::task::spawn_blocking(move || {
        let started = std::time::Instant::now();
        let mut block = Vec::with_capacity(BLOCK);
        let mut read = 0u64;
        for entry in store.scan_jobs(Scan::Every) {
            let checked = entry.map_err(Into::into).and_then(|e| {
                let c = if e.is_done() {
                    Some(check(&store, &shape, &e)?)
                } else {
                    None
                };
                Ok((e, c))
            });
            match checked {
                Ok(item) => block.push(item),
                Err(e) => {
                    let _ = tx.blocking_send(Err(e));
                    return;
                }
            }
            read += 1;
            if block.len() == BLOCK
                && tx
                    .blocking_send(Ok(std::mem::replace(
                        &mut block,
                        Vec::with_capacity(BLOCK),
                    )))
                    .is_err()
            {
                return; // the session ended
            }
        }
        if !block.is_empty() {
            let _ = tx.blocking_send(Ok(block));
        }
        info!(
            jobs = read,
            ms = started.elapsed().as_millis() as u64,
            "every stored job read again and every stored copy checked"
        );
    });
    rx
}

/// Judges and settles a block of checked stored jobs (see
/// [`restore_job`]), and makes durable the writes that move a Done record
/// to the copy that counts now.
///
/// # Errors
///
/// [`crate::Error::Inconsistent`] if the totals overflow; store errors.
pub(crate) async fn settle_block(engine: &Engine, block: Block) -> Result<()> {
    let mut writes = Vec::new();
    let mut not_stored = Vec::new();
    {
        let mut core = engine.core();
        for (entry, checked) in block {
            let job = entry.job;
            let restored =
                restore_job(&mut core, entry, checked, engine.shape.solutions)?;
            writes.extend(restored.writes);
            match restored.judged {
                Some(true) => core.restored.0 += 1,
                Some(false) => core.restored.1 += 1,
                None => {}
            }
            if restored.not_stored {
                not_stored.push(job);
            }
        }
    }
    for job in not_stored {
        warn!(%job, "the state index named this job done, but the store holds no result for it: it is computed again");
    }
    if !writes.is_empty() {
        let mut batch = CommitBatch::new();
        ledger::add_writes(&mut batch, writes);
        engine.apply_and_flush(batch).await?;
    }
    Ok(())
}

/// Checks and settles now those of `jobs` that wait for the background
/// check: a copy of one is about to be judged, or a discredit judges it
/// again, and both need its stored copies counted first.
///
/// # Errors
///
/// [`crate::Error::DamagedResult`] for a damaged stored copy; what
/// [`settle_block`] returns.
pub(crate) async fn restore_now(engine: &Engine, jobs: Vec<JobId>) -> Result<()> {
    let mut waiting: Vec<JobId> = {
        let core = engine.core();
        if core.standing().jobs_restoring == 0 {
            return Ok(());
        }
        jobs.into_iter()
            .filter(|&j| core.job(j).is_restoring())
            .collect()
    };
    if waiting.is_empty() {
        return Ok(());
    }
    waiting.sort_unstable();
    waiting.dedup();
    let block = blocking(|| -> Result<Block> {
        waiting
            .iter()
            .map(|&job| {
                let entry = engine.store.scanned_job(job)?;
                let checked = if entry.is_done() {
                    Some(check(&engine.store, &engine.shape, &entry)?)
                } else {
                    None
                };
                Ok((entry, checked))
            })
            .collect()
    })?;
    settle_block(engine, block).await
}

/// The reader has sent every stored job: the run may complete once every
/// job is settled.
pub(crate) fn finish(engine: &Engine) {
    let mut core = engine.core();
    core.restorer().stored_checked();
    // As a restart that checks before serving logs it: when it found any.
    if core.restored != (0, 0) {
        info!(
            done = core.restored.0,
            jobs = core.standing().jobs,
            in_check = core.restored.1,
            "restored finished jobs"
        );
    }
    if core.is_complete() {
        engine.complete.cancel();
    }
    drop(core);
    engine.checked.cancel();
}
