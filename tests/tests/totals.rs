//! Exact totals against the published values, in the basic configurations.

use anyhow::Result;
use nq_e2e::{Coord, within, worker};

use crate::{LIMIT, data_dir};

/// A coordinator with no local threads and one worker process count N = 8 to
/// 11 exactly: total AND unique equal OEIS A000170 / A002562, and both
/// processes exit 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_worker_counts_published_totals() -> Result<()> {
    within(LIMIT, "n = 8..=11", async {
        for n in 8..=11 {
            let tmp = tempfile::tempdir()?;
            let n = n.to_string();
            let mut coord =
                Coord::ephemeral(&data_dir(&tmp), &["--n", &n, "--local-threads", "0"])
                    .await?;
            let mut w = worker("w1", &coord.addr.to_string(), &["--threads", "1"])?;
            // Its only machine is one remote worker (`--local-threads 0`): since
            // probation (issue 15, item 7) nobody checks it, so the run ends
            // `unchecked` (exit 6) with the published totals, where it ended `complete`
            // unchecked before.
            coord.finish_unchecked().await?;
            w.success().await?;
        }
        Ok(())
    })
    .await
}

/// The coordinator alone, with its embedded default threads, counts N = 10.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinator_alone_counts_with_its_own_threads() -> Result<()> {
    within(LIMIT, "embedded n=10", async {
        let tmp = tempfile::tempdir()?;
        let mut coord = Coord::ephemeral(&data_dir(&tmp), &["--n", "10"]).await?;
        coord.finish().await?.check_published()
    })
    .await
}

/// `--local-threads 0` with two single-thread worker processes: the work is
/// shared and counted once (N = 12). One runs the portable kernel, the other
/// the default one (AVX-512 where the CPU has it), so a run mixing them adds
/// up too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_single_thread_workers_share_a_run() -> Result<()> {
    within(LIMIT, "two workers n=12", async {
        let tmp = tempfile::tempdir()?;
        let mut coord =
            Coord::ephemeral(&data_dir(&tmp), &["--n", "12", "--local-threads", "0"])
                .await?;
        let addr = coord.addr.to_string();
        let mut a = worker("a", &addr, &["--threads", "1"])?;
        let mut b = worker("b", &addr, &["--threads", "1", "--kernel", "scalar"])?;
        coord.finish().await?.check_published()?;
        a.success().await?;
        b.success().await
    })
    .await
}
