//! Who may join a run: the shared token, TLS and mutual TLS, with real
//! processes and certificates made at run time; and gRPC reflection, which
//! stays open like the health service.

use anyhow::{Context, Result, ensure};
use nq_e2e::{Coord, LOG_ENV, Pki, Proc, binary, within, worker};

use crate::{LIMIT, data_dir};

/// `nq-coord health ARGS…`, to its exit.
async fn health(args: &[&str]) -> Result<Proc> {
    let args: Vec<String> = ["health"]
        .iter()
        .chain(args)
        .map(|a| (*a).to_owned())
        .collect();
    let mut proc = Proc::spawn("health", &binary("nq-coord")?, &args, LOG_ENV)?;
    proc.wait().await?;
    Ok(proc)
}

fn path(p: &std::path::Path) -> &str {
    p.to_str().expect("temporary paths are UTF-8")
}

/// A wrong token and a missing token are refused: the worker exits non-zero
/// saying that the coordinator refused the token, and the coordinator logs
/// the caller's address. The health check needs no token. A worker with the
/// right token (from `NQ_TOKEN`) then completes the run exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_token_is_refused_and_the_right_one_completes_the_run() -> Result<()> {
    within(LIMIT, "token", async {
        let tmp = tempfile::tempdir()?;
        let mut coord = Coord::ephemeral(
            &data_dir(&tmp),
            &[
                "--n",
                "10",
                "--local-threads",
                "0",
                "--token",
                "right-token",
            ],
        )
        .await?;
        let addr = coord.addr.to_string();
        for (name, args) in [
            ("wrong", &["--token", "wrong-token"][..]),
            ("none", &[][..]),
        ] {
            let mut w = worker(name, &addr, args)?;
            let status = w.wait().await?;
            let out = w.output();
            ensure!(status.code() == Some(1), "{name}: exit {status}\n{out}");
            ensure!(
                out.contains("the coordinator refused the token"),
                "{name}: unclear message:\n{out}"
            );
            ensure!(
                !out.contains("right-token"),
                "{name} shows the token:\n{out}"
            );
        }
        let line = coord.proc.line_containing("refused a call").await?;
        ensure!(line.contains("peer=127.0.0.1:"), "no peer address: {line}");
        let h = health(&["--connect", &addr]).await?;
        ensure!(h.output().contains("SERVING"), "health:\n{}", h.output());
        let env: Vec<(&str, &str)> = LOG_ENV
            .iter()
            .copied()
            .chain([("NQ_TOKEN", "right-token")])
            .collect();
        let args: Vec<String> = ["--connect", &addr, "--name", "right", "--threads", "2"]
            .iter()
            .map(|a| (*a).to_owned())
            .collect();
        let mut right = Proc::spawn("right", &binary("nq-worker")?, &args, &env)?;
        // Its only machine is one remote worker (`--local-threads 0`): since probation
        // (issue 15, item 7) nobody checks it, so the run ends `unchecked` (exit 6)
        // with the published totals, where it ended `complete` unchecked before.
        coord.finish_unchecked().await?;
        right.success().await?;
        let log = coord.proc.output();
        ensure!(
            !log.contains("right-token"),
            "the coordinator logs the token"
        );
        Ok(())
    })
    .await
}

/// A TLS run: the worker trusts the test CA (`--ca`), speaks `https://`, and
/// the count is exact; `nq-coord health --ca` checks the TLS port. A worker
/// that does not trust the CA stops with a message about TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_run_completes_exactly() -> Result<()> {
    within(LIMIT, "tls", async {
        let tmp = tempfile::tempdir()?;
        let pki = Pki::create(tmp.path())?;
        let mut coord = Coord::ephemeral(
            &data_dir(&tmp),
            &[
                "--n",
                "11",
                "--local-threads",
                "0",
                "--tls-cert",
                path(&pki.server_cert),
                "--tls-key",
                path(&pki.server_key),
            ],
        )
        .await?;
        let https = format!("https://{}", coord.addr);
        // Trusting its own client certificate as CA: the server's is unknown.
        let mut distrust = worker("distrust", &https, &["--ca", path(&pki.client_cert)])?;
        let status = distrust.wait().await?;
        let out = distrust.output();
        ensure!(status.code() == Some(1), "distrust: exit {status}\n{out}");
        ensure!(out.contains("TLS with the coordinator failed"), "{out}");
        let h = health(&["--connect", &coord.addr.to_string(), "--ca", path(&pki.ca)])
            .await?;
        ensure!(h.output().contains("SERVING"), "health:\n{}", h.output());
        let mut w = worker("tls", &https, &["--ca", path(&pki.ca), "--threads", "2"])?;
        // Its only machine is one remote worker (`--local-threads 0`): since probation
        // (issue 15, item 7) nobody checks it, so the run ends `unchecked` (exit 6)
        // with the published totals, where it ended `complete` unchecked before.
        coord.finish_unchecked().await?;
        w.success().await
    })
    .await
}

/// Mutual TLS: a worker without a client certificate is refused and stops,
/// naming TLS; one with a certificate signed by the client CA completes the
/// run exactly, with the token checked too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mutual_tls_run_completes_and_refuses_clients_without_certificate() -> Result<()>
{
    within(LIMIT, "mutual tls", async {
        let tmp = tempfile::tempdir()?;
        let pki = Pki::create(tmp.path())?;
        let mut coord = Coord::ephemeral(
            &data_dir(&tmp),
            &[
                "--n",
                "11",
                "--local-threads",
                "0",
                "--tls-cert",
                path(&pki.server_cert),
                "--tls-key",
                path(&pki.server_key),
                "--tls-client-ca",
                path(&pki.ca),
                "--token",
                "mtls-token",
            ],
        )
        .await?;
        let addr = coord.addr.to_string();
        // Any address form speaks TLS once --ca is given.
        let mut anonymous = worker(
            "anonymous",
            &addr,
            &["--ca", path(&pki.ca), "--token", "mtls-token"],
        )?;
        let status = anonymous.wait().await?;
        let out = anonymous.output();
        ensure!(status.code() == Some(1), "anonymous: exit {status}\n{out}");
        ensure!(out.contains("TLS with the coordinator failed"), "{out}");
        let h = health(&[
            "--connect",
            &addr,
            "--ca",
            path(&pki.ca),
            "--tls-cert",
            path(&pki.client_cert),
            "--tls-key",
            path(&pki.client_key),
        ])
        .await?;
        ensure!(h.output().contains("SERVING"), "health:\n{}", h.output());
        let mut w = worker(
            "mtls",
            &addr,
            &[
                "--ca",
                path(&pki.ca),
                "--tls-cert",
                path(&pki.client_cert),
                "--tls-key",
                path(&pki.client_key),
                "--token",
                "mtls-token",
                "--threads",
                "2",
            ],
        )?;
        // Its only machine is one remote worker (`--local-threads 0`): since probation
        // (issue 15, item 7) nobody checks it, so the run ends `unchecked` (exit 6)
        // with the published totals, where it ended `complete` unchecked before.
        coord.finish_unchecked().await?;
        w.success().await
    })
    .await
}

/// Unusable TLS files stop both programs at start with the file's name and
/// the expected format.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unusable_tls_files_are_named_with_the_expected_format() -> Result<()> {
    within(LIMIT, "bad pem", async {
        let tmp = tempfile::tempdir()?;
        let pki = Pki::create(tmp.path())?;
        let garbage = tmp.path().join("garbage.pem");
        std::fs::write(&garbage, "not a certificate\n")?;
        let missing = tmp.path().join("missing.pem");
        let dir = data_dir(&tmp);
        let cases: [(&[&str], &str); 3] = [
            (
                &[
                    "--tls-cert",
                    path(&garbage),
                    "--tls-key",
                    path(&pki.server_key),
                ],
                "BEGIN CERTIFICATE",
            ),
            (
                &[
                    "--tls-cert",
                    path(&pki.server_cert),
                    "--tls-key",
                    path(&pki.ca),
                ],
                "BEGIN PRIVATE KEY",
            ),
            (
                &[
                    "--tls-cert",
                    path(&missing),
                    "--tls-key",
                    path(&pki.server_key),
                ],
                "cannot read --tls-cert",
            ),
        ];
        for (flags, expected) in cases {
            let mut args: Vec<String> = ["--n", "8", "--listen", "127.0.0.1:0", "--data"]
                .iter()
                .map(|a| (*a).to_owned())
                .collect();
            args.push(path(&dir).to_owned());
            args.extend(flags.iter().map(|a| (*a).to_owned()));
            let mut c = Proc::spawn("nq-coord", &binary("nq-coord")?, &args, LOG_ENV)?;
            let status = c.wait().await?;
            let out = c.output();
            ensure!(!status.success(), "{flags:?} accepted:\n{out}");
            ensure!(out.contains(expected), "{flags:?}: unclear message:\n{out}");
            ensure!(
                out.contains(".pem") || out.contains(".key"),
                "no file named:\n{out}"
            );
        }
        let mut w = worker("bad-ca", "127.0.0.1:1", &["--ca", path(&garbage)])?;
        let status = w.wait().await?;
        let out = w.output();
        ensure!(status.code() == Some(1), "exit {status}\n{out}");
        ensure!(
            out.contains("garbage.pem") && out.contains("BEGIN CERTIFICATE"),
            "{out}"
        );
        Ok(())
    })
    .await
}

/// gRPC reflection lists the coordinator's service (what `grpcurl list`
/// asks), without a token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_lists_the_coordinator_service() -> Result<()> {
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

    within(LIMIT, "reflection", async {
        let tmp = tempfile::tempdir()?;
        // No worker: the run waits while reflection is asked.
        let mut coord = Coord::ephemeral(
            &data_dir(&tmp),
            &["--n", "10", "--local-threads", "0", "--token", "t"],
        )
        .await?;
        let channel =
            tonic::transport::Endpoint::from_shared(format!("http://{}", coord.addr))?
                .connect()
                .await
                .context("connect")?;
        let mut client = ServerReflectionClient::new(channel);
        let request = ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        };
        let mut answers = client
            .server_reflection_info(tokio_stream::once(request))
            .await?
            .into_inner();
        let answer = answers.message().await?.context("no answer")?;
        let Some(MessageResponse::ListServicesResponse(list)) = answer.message_response
        else {
            anyhow::bail!("not a service list: {answer:?}");
        };
        let names: Vec<&str> = list.service.iter().map(|s| s.name.as_str()).collect();
        ensure!(names.contains(&"nqueens.v1.Coordinator"), "{names:?}");
        ensure!(names.contains(&"grpc.health.v1.Health"), "{names:?}");
        coord.proc.terminate()?;
        coord.proc.wait().await?;
        Ok(())
    })
    .await
}
