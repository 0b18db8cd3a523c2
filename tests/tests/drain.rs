//! Graceful shutdown of a worker process on SIGTERM.

use anyhow::{Result, ensure};
use nq_e2e::{Coord, within, worker};

use crate::{LIMIT, data_dir};

/// SIGTERM makes a worker stop leasing and hand back what it cannot finish
/// within `--grace` (here 0 s, so everything it holds), and exit 0; the
/// coordinator reissues those jobs at once, and the run still completes
/// exactly with another worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_a_worker_and_hands_its_leases_back() -> Result<()> {
    within(LIMIT, "drain", async {
        let tmp = tempfile::tempdir()?;
        // Eight jobs of a fraction of a second each: at the signal the worker
        // is computing one and holds another.
        let args = ["--n", "17", "--local-threads", "0", "--jobs", "8"];
        let mut coord = Coord::ephemeral(&data_dir(&tmp), &args).await?;
        let addr = coord.addr.to_string();
        let mut w = worker("drained", &addr, &["--threads", "1", "--grace", "0s"])?;
        w.line_containing("job leased").await?;
        w.terminate()?;
        w.line_containing("draining").await?;
        w.line_containing("leases handed back").await?;
        w.success().await?;
        coord.proc.line_containing("worker released leases").await?;
        let mut rest = worker("rest", &addr, &["--threads", "2"])?;
        // One worker after the other, never two computing together: as
        // for a lone worker, the run ends `unchecked` (issue 15, item 7).
        coord.finish_unchecked().await?;
        rest.success().await
    })
    .await
}

/// A second signal ends a draining worker at once, whatever its grace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_exits_at_once() -> Result<()> {
    within(LIMIT, "second signal", async {
        let tmp = tempfile::tempdir()?;
        let mut coord =
            Coord::ephemeral(&data_dir(&tmp), &["--n", "17", "--local-threads", "0"])
                .await?;
        let mut w = worker(
            "w",
            &coord.addr.to_string(),
            &["--threads", "1", "--grace", "10m"],
        )?;
        w.line_containing("job leased").await?;
        w.terminate()?;
        w.line_containing("draining").await?;
        w.terminate()?;
        let status = w.wait().await?;
        ensure!(status.code() == Some(130), "exit status {status}");
        coord.proc.kill().await
    })
    .await
}
