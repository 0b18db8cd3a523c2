//! The coordinator and worker libraries run in one process, the way an
//! embedder would run them: `nq_coord::run` and `nq_worker::run` on a
//! `TaskTracker`, stopped by one `CancellationToken`.

use std::num::NonZeroUsize;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use nq_core::published::published;
use nq_e2e::within;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::{LIMIT, data_dir};

fn worker_config(addr: std::net::SocketAddr) -> nq_worker::Config {
    let mut c = nq_worker::Config::new(addr.into()).with_threads(NonZeroUsize::MIN);
    c.name = "in-process".into();
    c.backoff_max = Duration::from_millis(200);
    c
}

/// A run of board `n` with `workers` in-process single-thread workers and no
/// coordinator threads; returns the coordinator's report and each worker's
/// summary. Everything started is joined before this returns.
async fn run_in_process(
    n: u64,
    workers: usize,
) -> Result<(nq_coord::RunReport, Vec<nq_worker::Summary>)> {
    let tmp = tempfile::tempdir()?;
    let mut config = nq_coord::Config::new(n, data_dir(&tmp))?;
    config.local_threads = 0;
    config.lease_ttl = Duration::from_secs(2);
    // Bound is ready: workers may connect from now on.
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let token = CancellationToken::new();
    let tracker = TaskTracker::new();
    let coord = tracker.spawn(nq_coord::run(
        config,
        listener,
        token.clone().cancelled_owned(),
    ));
    let handles: Vec<_> = (0..workers)
        .map(|_| {
            tracker.spawn(nq_worker::run(
                worker_config(addr),
                token.clone().cancelled_owned(),
            ))
        })
        .collect();
    tracker.close();
    let report = coord.await?.context("coordinator failed");
    let mut summaries = vec![];
    for h in handles {
        summaries.push(h.await?.context("worker failed")?);
    }
    // Everything has ended by itself; the token only guards a failure path.
    token.cancel();
    tracker.wait().await;
    Ok((report?, summaries))
}

/// N = 8, 9, 10 with two in-process workers: exact published totals, and each
/// worker stops because the run is complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libraries_count_published_totals_in_process() -> Result<()> {
    within(LIMIT, "in-process n=8..=10", async {
        for n in 8..=10 {
            let (report, summaries) = run_in_process(n, 2).await?;
            let (q, u) = published(n as u8).context("published")?;
            ensure!(report.complete, "n={n}: incomplete {report:?}");
            ensure!((report.total, report.unique) == (q, u), "n={n}: {report:?}");
            ensure!(report.conflicts == 0, "n={n}: {report:?}");
            for s in &summaries {
                ensure!(s.exit == nq_worker::Exit::RunComplete, "n={n}: {s:?}");
                ensure!(s.conflicts == 0, "n={n}: {s:?}");
            }
        }
        Ok(())
    })
    .await
}

/// Cancelling the token stops a run in progress cleanly: the coordinator
/// returns an incomplete report and the worker drains.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_token_stops_a_run_in_progress() -> Result<()> {
    within(LIMIT, "in-process cancel", async {
        let tmp = tempfile::tempdir()?;
        let mut config = nq_coord::Config::new(18, data_dir(&tmp))?;
        config.local_threads = 0;
        let (progress, mut seen) =
            tokio::sync::watch::channel(nq_coord::Progress::default());
        config.progress = Some(progress);
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let token = CancellationToken::new();
        let tracker = TaskTracker::new();
        let coord = tracker.spawn(nq_coord::run(
            config,
            listener,
            token.clone().cancelled_owned(),
        ));
        let mut wc = worker_config(addr);
        wc.grace = Duration::from_millis(100);
        let worker = tracker.spawn(nq_worker::run(wc, token.clone().cancelled_owned()));
        tracker.close();
        // N = 18 on one thread takes 15 s (AVX-512) to two minutes (scalar):
        // stop it once a job is done.
        seen.wait_for(|p| p.counters.jobs_done >= 1).await?;
        token.cancel();
        tracker.wait().await;
        let report = coord.await??;
        ensure!(!report.complete, "{report:?}");
        let summary = worker.await??;
        ensure!(summary.exit == nq_worker::Exit::Drained, "{summary:?}");
        Ok(())
    })
    .await
}
