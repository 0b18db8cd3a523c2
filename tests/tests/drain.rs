//! Graceful shutdown on SIGTERM: of a worker process, and of a coordinator
//! that a half-open connection must not hold.

use anyhow::{Result, ensure};
use nq_e2e::{Coord, within, worker};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

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

/// A client that opens an HTTP/2 connection and then never answers again (a
/// half-open connection: it ignores the GOAWAY and the PING that ask it to
/// close) does not hold the coordinator's exit. With no call in flight, the
/// coordinator closes the connections left instead of waiting out its drain
/// timeout, and does not claim that in-flight requests were dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_open_connection_does_not_hold_the_coordinators_exit() -> Result<()> {
    /// The HTTP/2 client preface (RFC 9113, section 3.4) and an empty
    /// SETTINGS frame.
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0";
    within(LIMIT, "half-open", async {
        let tmp = tempfile::tempdir()?;
        let args = ["--n", "12", "--local-threads", "0"];
        let mut coord = Coord::ephemeral(&data_dir(&tmp), &args).await?;
        let mut raw = tokio::net::TcpStream::connect(coord.addr).await?;
        raw.write_all(PREFACE).await?;
        // The server's SETTINGS frame: the HTTP/2 connection is up.
        let mut head = [0u8; 9];
        raw.read_exact(&mut head).await?;
        ensure!(head[3] == 0x4, "not a SETTINGS frame: {head:?}");
        coord.proc.terminate()?;
        coord.proc.wait().await?;
        let log = coord.proc.output();
        ensure!(log.contains("run interrupted"), "no clean stop:\n{log}");
        ensure!(
            log.contains("no call in flight"),
            "the drain did not end on idle:\n{log}"
        );
        ensure!(
            !log.contains("did not finish in time"),
            "a misleading drain:\n{log}"
        );
        // Held open, unanswered, until the coordinator had exited.
        drop(raw);
        Ok(())
    })
    .await
}
