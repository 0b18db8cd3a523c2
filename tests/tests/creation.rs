//! A coordinator killed while it creates a run's jobs resumes the creation,
//! and the stored jobs are exactly the split: every sub-problem once, in
//! plan order, with the same total estimated work.

use std::ops::ControlFlow;

use anyhow::{Context, Result, ensure};
use nq_core::Board;
use nq_core::split::{SplitSpec, split_each};
use nq_e2e::{Coord, log_field, within};
use nq_store::{Store, StoreOptions};

use crate::{LIMIT, data_dir};

/// N = 16 with four extra columns: 321,702 sub-problems, one job each, so
/// the creation stores 64 batches of jobs, each one a checkpoint (about two
/// seconds in a debug build): the kill after the first lands midway.
const N: &str = "16";
const SPLIT: &str = "0:4";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_creation_killed_midway_resumes_without_losing_or_repeating_a_subproblem()
-> Result<()> {
    within(LIMIT, "creation kill", async {
        let tmp = tempfile::tempdir()?;
        let dir = data_dir(&tmp);
        // One job per sub-problem: the plan is as large as the split.
        let args = [
            "--n",
            N,
            "--split",
            SPLIT,
            "--jobs",
            "10000000",
            "--local-threads",
            "0",
        ];
        let mut first = Coord::ephemeral(&dir, &args).await?;
        // A batch's checkpoint is durable once the next batch is flushed:
        // after the second batch's line, at least one checkpoint is.
        first.proc.line_containing("job batch stored").await?;
        first.proc.line_containing("job batch stored").await?;
        first.proc.kill().await?;
        ensure!(
            first.proc.lines_containing("created run").is_empty(),
            "the creation finished before the kill: the test proves nothing"
        );

        let mut second = Coord::ephemeral(&dir, &args).await?;
        // The resume is logged when the directory is opened, before the
        // port is announced; `Coord::ephemeral` reads past it to the
        // `listening on` line, so it is looked for in the whole output first.
        const RESUMING: &str = "resuming the creation of the run's jobs";
        let resumed = match second.proc.lines_containing(RESUMING).into_iter().next() {
            Some(line) => line,
            None => second.proc.line_containing(RESUMING).await?,
        };
        let done: u64 = log_field(&resumed, "done")
            .context("no done= in the resume line")?
            .parse()?;
        let created = second.proc.line_containing("created run").await?;
        second.proc.terminate()?;
        second.proc.wait().await?;
        let total: u64 = log_field(&created, "subproblems")
            .context("no subproblems= in the created line")?
            .parse()?;
        ensure!(
            done > 0 && done < total,
            "resumed at {done} of {total}: not in the middle"
        );

        // The stored jobs, against the split itself.
        let store = Store::open(&dir, &StoreOptions::default())?;
        let manifest = store.manifest()?.context("no manifest")?;
        let (mut rows, mut work) = (Vec::new(), 0u128);
        for entry in store.stored_jobs() {
            let (_, job) = entry?;
            for prefix in job.prefixes() {
                rows.push(prefix.to_vec());
            }
            work += u128::from(job.work());
        }
        let board = Board::new(N.parse()?)?;
        let spec = SplitSpec::border(4)?;
        let (mut want, mut want_work) = (Vec::new(), 0u128);
        let _ = split_each(board, spec, &mut |sub| {
            want.push(sub.prefix().rows().to_vec());
            want_work += u128::from(sub.estimate());
            ControlFlow::Continue(())
        });
        ensure!(
            rows.len() == want.len(),
            "{} sub-problems stored, the split has {}",
            rows.len(),
            want.len()
        );
        ensure!(
            rows == want,
            "the stored sub-problems are not the split's, in order"
        );
        ensure!(
            manifest.jobs == want.len() as u64,
            "{} jobs for {} sub-problems",
            manifest.jobs,
            want.len()
        );
        ensure!(
            work == want_work && manifest.total_work == want_work,
            "estimated work: stored {work}, manifest {}, split {want_work}",
            manifest.total_work
        );
        Ok(())
    })
    .await
}
