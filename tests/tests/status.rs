//! A run watched from outside: `nq-coord status`, and the `--metrics` port's
//! `/metrics`, `/status.json` and status page, against a live run.

use std::net::SocketAddr;

use anyhow::{Context, Result, bail, ensure};
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use nq_e2e::{Coord, Pipe, binary, within, worker};

use crate::{LIMIT, data_dir};

/// `GET path` on `addr` over HTTP/1.1: the status, content type and body.
async fn get(addr: SocketAddr, path: &str) -> Result<(u16, String, String)> {
    let stream = tokio::net::TcpStream::connect(addr).await?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await?;
    let conn = tokio::spawn(conn);
    let request = hyper::Request::get(path)
        .header(hyper::header::HOST, addr.to_string())
        .body(Empty::<Bytes>::new())?;
    let response = sender.send_request(request).await?;
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body = response.into_body().collect().await?.to_bytes();
    drop(sender);
    conn.await??;
    Ok((status, content_type, String::from_utf8(body.to_vec())?))
}

/// Runs `nq-coord status --connect ADDR ARGS…` and returns its stdout.
async fn status(addr: SocketAddr, args: &[&str]) -> Result<String> {
    let out = tokio::process::Command::new(binary("nq-coord")?)
        .args(["status", "--connect", &addr.to_string()])
        .args(args)
        .output()
        .await?;
    ensure!(
        out.status.success(),
        "nq-coord status exited with {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

/// A long run (N = 17 on one worker thread, about a minute) is watched
/// while it goes: once the worker's first report is acknowledged, the
/// status command, the JSON, the metrics and the page all show the run, its
/// progress and the worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_run_is_visible_from_outside() -> Result<()> {
    within(LIMIT, "status", async {
        let tmp = tempfile::tempdir()?;
        let args = [
            "--n",
            "17",
            "--local-threads",
            "0",
            "--metrics",
            "127.0.0.1:0",
        ];
        let mut coord = Coord::ephemeral(&data_dir(&tmp), &args).await?;
        let line = coord
            .proc
            .line(|pipe, l| pipe == Pipe::Stdout && l.starts_with("metrics on "))
            .await?;
        let metrics: SocketAddr = line["metrics on ".len()..].trim().parse()?;
        let mut w = worker("watched", &coord.addr.to_string(), &["--threads", "1"])?;
        // Acknowledged, hence counted for the worker.
        w.line_containing("job reported").await?;

        let text = status(coord.addr, &[]).await?;
        ensure!(text.contains("(N=17, split "), "{text}");
        ensure!(text.contains("state      running"), "{text}");
        ensure!(text.contains("% of the estimated work"), "{text}");
        let row = text
            .lines()
            .find(|l| l.starts_with("watched "))
            .with_context(|| format!("no worker row in\n{text}"))?;
        ensure!(row.contains("127.0.0.1"), "{row}");

        let json: serde_json::Value =
            serde_json::from_str(&status(coord.addr, &["--json"]).await?)?;
        ensure!(json["n"] == 17 && json["state"] == "running", "{json}");
        let work_done: u128 = json["progress"]["work_done"]
            .as_str()
            .context("work_done is a string")?
            .parse()?;
        ensure!(work_done > 0, "{json}");
        let fraction = json["progress"]["fraction"].as_f64().context("fraction")?;
        ensure!(fraction > 0.0 && fraction < 1.0, "{json}");
        ensure!(json["jobs"]["done"].as_u64() >= Some(1), "{json}");
        let workers = json["workers"].as_array().context("workers")?;
        let watched = workers
            .iter()
            .find(|w| w["name"] == "watched")
            .with_context(|| format!("no worker in {json}"))?;
        ensure!(watched["address"] == "127.0.0.1", "{watched}");
        ensure!(watched["threads"] == 1, "{watched}");
        ensure!(watched["jobs_done"].as_u64() >= Some(1), "{watched}");
        ensure!(json["result"].is_null(), "{json}");

        let (code, content_type, body) = get(metrics, "/metrics").await?;
        ensure!(code == 200, "GET /metrics: {code}");
        ensure!(
            content_type.starts_with("application/openmetrics-text"),
            "{content_type}"
        );
        for series in [
            "nq_jobs{state=\"pending\"}",
            "nq_jobs{state=\"leased\"}",
            "nq_jobs{state=\"in_check\"}",
            "nq_jobs{state=\"done\"}",
            "nq_work_done ",
            "nq_work_total ",
            "nq_progress_ratio ",
            "nq_completion_jobs_per_second ",
            "nq_completion_work_per_second ",
            "nq_workers_connected 1",
            "nq_lease_expiries_total ",
            "nq_conflicts_total ",
            "nq_confirmations_total ",
            "nq_worker_jobs_total{worker=\"watched\",address=\"127.0.0.1\"}",
            "nq_worker_work_total{worker=\"watched\",address=\"127.0.0.1\"}",
            "nq_worker_jobs_per_second{worker=\"watched\",address=\"127.0.0.1\"}",
            "nq_worker_work_per_second{worker=\"watched\",address=\"127.0.0.1\"}",
            "nq_run_info{run_id=",
        ] {
            ensure!(body.contains(series), "no {series:?} in\n{body}");
        }
        ensure!(body.ends_with("# EOF\n"), "{body}");

        let (code, content_type, body) = get(metrics, "/status.json").await?;
        ensure!(
            code == 200 && content_type == "application/json",
            "{code} {content_type}"
        );
        let page_json: serde_json::Value = serde_json::from_str(&body)?;
        ensure!(page_json["run_id"] == json["run_id"], "{page_json}");
        // The page's form: the workers past the cap are counted, not listed.
        let all = page_json["workers"].as_array().map_or(0, Vec::len);
        ensure!(all >= 1, "{page_json}");
        let (code, _, body) = get(metrics, "/status.json?workers=0").await?;
        let capped: serde_json::Value = serde_json::from_str(&body)?;
        ensure!(
            code == 200
                && capped["workers"].as_array().is_some_and(Vec::is_empty)
                && capped["workers_unlisted"].as_u64() == Some(all as u64),
            "{code} {capped}"
        );
        for (query, names) in [
            ("workers=many", "workers=K"),
            ("limit=5", "unknown parameter \"limit\""),
        ] {
            let (code, _, body) = get(metrics, &format!("/status.json?{query}")).await?;
            ensure!(
                code == 400 && body.contains(names),
                "?{query}: {code} {body}"
            );
        }

        let (code, content_type, body) = get(metrics, "/").await?;
        ensure!(
            code == 200 && content_type.starts_with("text/html"),
            "{code} {content_type}"
        );
        ensure!(
            body.contains("fetch(`status.json?workers=${PAGE_WORKERS}`"),
            "the page polls status.json, capped"
        );
        // Self-contained: no script, style, image or font from another host.
        for remote in [
            "src=\"http",
            "href=\"http",
            "url(http",
            "@import",
            "fetch(\"http",
        ] {
            ensure!(!body.contains(remote), "the page loads {remote:?}…");
        }
        let (code, _, _) = get(metrics, "/nothing").await?;
        if code != 404 {
            bail!("GET /nothing: {code}, expected 404");
        }

        // The HTTP port answers the operators' gRPC calls too, on its own
        // thread: the same status, and the health check ...
        let via_http: serde_json::Value =
            serde_json::from_str(&status(metrics, &["--json"]).await?)?;
        ensure!(via_http["run_id"] == json["run_id"], "{via_http}");
        ensure!(
            (via_http["workers"].as_array().into_iter().flatten())
                .any(|w| w["name"] == "watched"),
            "{via_http}"
        );
        let health = tokio::process::Command::new(binary("nq-coord")?)
            .args(["health", "--connect", &metrics.to_string()])
            .output()
            .await?;
        ensure!(
            health.status.success()
                && String::from_utf8_lossy(&health.stdout) == "SERVING\n",
            "nq-coord health at the HTTP port: {health:?}"
        );
        // ... but no worker's call: the port has neither the workers' token
        // nor their TLS.
        let mut client = nq_proto::pb::coordinator_client::CoordinatorClient::connect(
            format!("http://{metrics}"),
        )
        .await?;
        let refused = client
            .register(nq_proto::pb::RegisterRequest {
                protocol_version: nq_proto::PROTOCOL_VERSION,
                name: "lost".into(),
                threads: 1,
                program_version: "test".into(),
                gpu_jobs: 0,
            })
            .await
            .err()
            .context("a worker registered at the HTTP port")?;
        ensure!(
            refused.code() == tonic::Code::Unimplemented
                && refused
                    .message()
                    .contains("workers connect to its --listen port"),
            "{refused:?}"
        );
        w.kill().await?;

        // A client that never finishes its request does not hold up the
        // coordinator's shutdown.
        let mut silent = tokio::net::TcpStream::connect(metrics).await?;
        tokio::io::AsyncWriteExt::write_all(&mut silent, b"GET / HTTP/1.1\r\n").await?;
        coord.proc.terminate()?;
        let exit = coord.proc.wait().await?;
        // 3: interrupted, resume to finish.
        ensure!(exit.code() == Some(3), "nq-coord exited with {exit}");
        drop(silent);
        Ok(())
    })
    .await
}
