//! Bad input is refused with a clear message.

use anyhow::{Result, ensure};
use nq_e2e::{Coord, Proc, binary, within, worker};

use crate::{LIMIT, data_dir};

/// A data directory made for N = 8 is refused by a coordinator asked for
/// N = 9, with a message naming both, and a non-zero exit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_directory_of_another_board_is_refused() -> Result<()> {
    within(LIMIT, "other N", async {
        let tmp = tempfile::tempdir()?;
        let dir = data_dir(&tmp);
        Coord::ephemeral(&dir, &["--n", "8"])
            .await?
            .finish()
            .await?;
        let args: Vec<String> = [
            "--data",
            &dir.display().to_string(),
            "--listen",
            "127.0.0.1:0",
            "--n",
            "9",
        ]
        .map(str::to_owned)
        .to_vec();
        let mut p =
            Proc::spawn("nq-coord", &binary("nq-coord")?, &args, nq_e2e::LOG_ENV)?;
        let status = p.wait().await?;
        let out = p.output();
        ensure!(!status.success(), "accepted another N:\n{out}");
        // The error line names the stored board and the requested one.
        let error = out
            .lines()
            .find(|l| l.starts_with("nq-coord: error:"))
            .unwrap_or_default();
        ensure!(
            error.contains("N=8") && error.contains("N=9"),
            "unclear message:\n{out}"
        );
        Ok(())
    })
    .await
}

/// A worker given an unusable `--connect` exits non-zero at once, naming the
/// accepted forms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_with_a_bad_address_names_the_accepted_forms() -> Result<()> {
    within(LIMIT, "bad --connect", async {
        for bad in ["grpc://coord:50051", "coord:notaport", "coord:1/path", ""] {
            let mut w = worker("bad", bad, &[])?;
            let status = w.wait().await?;
            let out = w.output();
            ensure!(status.code() == Some(1), "{bad:?}: exit {status}\n{out}");
            ensure!(
                out.contains("HOST, HOST:PORT, http://HOST:PORT or https://HOST:PORT"),
                "{bad:?}:\n{out}"
            );
        }
        Ok(())
    })
    .await
}

/// `nq-worker --gpu` on a machine without a usable GPU (no driver, no
/// device, no compiler) prints one line naming what is missing and exits 1,
/// before it logs or leases anything; never a panic. On a GPU machine it
/// passes its startup check instead and then gives up on the closed port.
/// See: issue 16.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_worker_without_a_gpu_says_what_is_missing() -> Result<()> {
    within(LIMIT, "--gpu without a GPU", async {
        let mut w = worker("gpu", "127.0.0.1:1", &["--gpu", "--give-up", "1s"])?;
        let status = w.wait().await?;
        let out = w.output();
        ensure!(status.code() == Some(1), "exit {status}\n{out}");
        ensure!(!out.contains("panicked"), "a panic:\n{out}");
        if out.contains("GPU ready") {
            return Ok(()); // a machine with a GPU: nothing is missing
        }
        let lines: Vec<&str> = out.lines().filter(|l| !l.trim().is_empty()).collect();
        ensure!(lines.len() == 1, "more than one line:\n{out}");
        ensure!(
            lines[0].starts_with("nq-worker: error:")
                && ["libcuda.so.1", "no NVIDIA GPU", "NVRTC"]
                    .iter()
                    .any(|what| lines[0].contains(what)),
            "the line does not say what is missing:\n{out}"
        );
        Ok(())
    })
    .await
}

/// A client speaking another protocol version is refused by the coordinator
/// with FAILED_PRECONDITION and a message naming both versions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_protocol_version_is_refused_by_the_coordinator() -> Result<()> {
    use nq_proto::pb::{RegisterRequest, coordinator_client::CoordinatorClient};
    within(LIMIT, "protocol version", async {
        let tmp = tempfile::tempdir()?;
        let mut coord =
            Coord::ephemeral(&data_dir(&tmp), &["--n", "12", "--local-threads", "0"])
                .await?;
        let mut client =
            CoordinatorClient::connect(format!("http://{}", coord.addr)).await?;
        let theirs = nq_proto::PROTOCOL_VERSION + 41;
        let status = client
            .register(RegisterRequest {
                protocol_version: theirs,
                name: "from-the-future".into(),
                threads: 1,
                program_version: "9.9.9".into(),
                gpu_jobs: 0,
            })
            .await
            .expect_err("a foreign protocol version must be refused");
        ensure!(
            status.code() == tonic::Code::FailedPrecondition,
            "{status:?}"
        );
        let msg = status.message();
        ensure!(
            msg.contains(&theirs.to_string())
                && msg.contains(&nq_proto::PROTOCOL_VERSION.to_string()),
            "message does not name both versions: {msg}"
        );
        coord.proc.kill().await
    })
    .await
}

/// `nq-coord health` exits 0 against a coordinator that serves workers, and
/// non-zero, naming the address, once the coordinator is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_health_check_tells_serving_from_gone() -> Result<()> {
    within(LIMIT, "health", async {
        let tmp = tempfile::tempdir()?;
        // No local threads: the run waits for a worker, so it stays up.
        let mut coord =
            Coord::ephemeral(&data_dir(&tmp), &["--n", "10", "--local-threads", "0"])
                .await?;
        coord.proc.line_containing("serving workers").await?;
        let addr = coord.addr.to_string();
        let health = |addr: &str| {
            let args = ["health", "--connect", addr].map(str::to_owned);
            Proc::spawn("health", &binary("nq-coord")?, &args, nq_e2e::LOG_ENV)
        };
        let mut serving = health(&addr)?;
        let status = serving.wait().await?;
        let out = serving.output();
        ensure!(
            status.success() && out.contains("SERVING"),
            "not healthy:\n{out}"
        );

        let mut w = worker("w", &addr, &["--threads", "1"])?;
        // Its only machine is one remote worker (`--local-threads 0`): since probation
        // (issue 15, item 7) nobody checks it, so the run ends `unchecked` (exit 6)
        // with the published totals, where it ended `complete` unchecked before.
        coord.finish_unchecked().await?;
        w.success().await?;
        let mut gone = health(&addr)?;
        let status = gone.wait().await?;
        let out = gone.output();
        ensure!(!status.success(), "healthy without a coordinator:\n{out}");
        ensure!(
            out.contains(&addr),
            "the error does not name {addr}:\n{out}"
        );
        Ok(())
    })
    .await
}
