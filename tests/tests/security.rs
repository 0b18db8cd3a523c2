//! Who may join a run: protected mode (loopback peers only without a token
//! or TLS, shown with a worker in a network namespace of its own), the shared
//! token, TLS and mutual TLS, with real processes and certificates made at
//! run time; and gRPC reflection, which stays open like the health service.

use anyhow::{Context, Result, ensure};
use nq_e2e::{Coord, LOG_ENV, Pki, Proc, binary, ip, within, worker};

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
        // A worker on the coordinator's machine with the run's token is the
        // operator's own, one voice with the coordinator's threads (issue 26,
        // item 2): the run ends `complete`, as the coordinator alone does.
        // (From issue 15 until then, a lone remote worker's run ended
        // `unchecked`, exit 6.)
        coord.finish().await?.check_published()?;
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
        w.success().await?;
        // Under mutual TLS the worker votes as its certificate (issue 18).
        let log = coord.proc.output();
        ensure!(
            log.lines()
                .any(|l| l.contains("worker registered") && l.contains("cert:")),
            "the registration does not name the client certificate:\n{log}"
        );
        Ok(())
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

/// Where a worker runs when it must not be on the coordinator's machine, as
/// far as the coordinator can tell: its calls come from a non-loopback
/// address.
///
/// As root, a network namespace made for the test, joined to this one by a
/// veth pair with addresses in 198.18.0.0/15 (the range RFC 2544 keeps for
/// such tests), chosen from the process id so that concurrent test runs do
/// not collide; dropping it deletes both. Without the rights to make one, a
/// non-loopback address of this machine, which the kernel then uses as the
/// worker's source address.
#[derive(Debug)]
enum Elsewhere {
    /// `ip netns exec NAME …` reaches the coordinator at `host`.
    Namespace {
        name: String,
        host: std::net::Ipv4Addr,
    },
    /// The worker connects to this address of this machine.
    Interface(std::net::IpAddr),
}

impl Elsewhere {
    /// A namespace (as root), else a second interface; `None` when neither
    /// can be had.
    fn make() -> Result<Option<Elsewhere>> {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let root = unsafe { libc::geteuid() } == 0;
        if root {
            match Elsewhere::namespace() {
                Ok(ns) => return Ok(Some(ns)),
                Err(e) => {
                    eprintln!("no network namespace ({e:#}); trying a second interface")
                }
            }
        }
        Ok(Elsewhere::interface().map(Elsewhere::Interface))
    }

    fn namespace() -> Result<Elsewhere> {
        let id = std::process::id();
        let base = (id % 32768) * 4;
        let net = |last: u32| {
            std::net::Ipv4Addr::new(
                198,
                18 + (base >> 16) as u8,
                (base >> 8) as u8,
                (base as u8) + last as u8,
            )
        };
        let (host, inner) = (net(1), net(2));
        let name = format!("nq-e2e-{id}");
        let (host_if, inner_if) = (format!("nqh{id}"), format!("nqn{id}"));
        ip(&["netns", "add", &name])?;
        // From here, dropping it cleans up.
        let ns = Elsewhere::Namespace {
            name: name.clone(),
            host,
        };
        ip(&[
            "link", "add", &host_if, "type", "veth", "peer", "name", &inner_if, "netns",
            &name,
        ])?;
        ip(&["addr", "add", &format!("{host}/30"), "dev", &host_if])?;
        ip(&["link", "set", &host_if, "up"])?;
        ip(&[
            "-n",
            &name,
            "addr",
            "add",
            &format!("{inner}/30"),
            "dev",
            &inner_if,
        ])?;
        ip(&["-n", &name, "link", "set", &inner_if, "up"])?;
        ip(&["-n", &name, "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// The address this machine would send from on its default route: a UDP
    /// "connection" picks it without sending anything.
    fn interface() -> Option<std::net::IpAddr> {
        let socket = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
        socket.connect("198.51.100.1:9").ok()?;
        let ip = socket.local_addr().ok()?.ip();
        (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
    }

    /// The address of a coordinator listening on every interface at `port`,
    /// as the worker must write it.
    fn coordinator(&self, port: u16) -> String {
        match self {
            Elsewhere::Namespace { host, .. } => format!("{host}:{port}"),
            Elsewhere::Interface(ip) => std::net::SocketAddr::new(*ip, port).to_string(),
        }
    }

    /// Starts `nq-worker --connect ADDR --name NAME ARGS…` there, with `env`
    /// added to [`LOG_ENV`].
    fn worker(
        &self,
        name: &str,
        connect: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Proc> {
        let worker = binary("nq-worker")?;
        let mut all: Vec<String> = Vec::new();
        let program = match self {
            Elsewhere::Namespace { name: ns, .. } => {
                // `ip netns exec` execs the worker: the process is the worker.
                all.extend(["netns", "exec", ns.as_str()].map(str::to_owned));
                all.push(path(&worker).to_owned());
                std::path::PathBuf::from("ip")
            }
            Elsewhere::Interface(_) => worker,
        };
        all.extend(["--connect", connect, "--name", name].map(str::to_owned));
        all.extend(args.iter().map(|a| (*a).to_owned()));
        let env: Vec<(&str, &str)> =
            LOG_ENV.iter().copied().chain(env.iter().copied()).collect();
        Proc::spawn(name, &program, &all, &env)
    }
}

impl Drop for Elsewhere {
    fn drop(&mut self) {
        if let Elsewhere::Namespace { name, .. } = self {
            // Deleting the namespace deletes the veth end in it, and so the
            // pair.
            let _ = std::process::Command::new("ip")
                .args(["netns", "del", name.as_str()])
                .status();
        }
    }
}

/// Protected by default: a coordinator with neither a token nor TLS,
/// listening on every interface as the README's main job does, refuses a
/// worker on another machine. The worker exits 1 with the coordinator's
/// message, which names the three ways to open the run, and the coordinator
/// logs the caller's address; a worker on the coordinator's machine still
/// completes the run. With a token on both sides, the same remote worker
/// completes a run exactly; so does it with `--insecure-open-port`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protected_mode_refuses_other_machines_until_a_token_opens_the_run() -> Result<()>
{
    let Some(elsewhere) = Elsewhere::make()? else {
        // SAFETY: geteuid has no preconditions and cannot fail.
        ensure!(
            unsafe { libc::geteuid() } != 0,
            "as root, neither a network namespace nor a second interface could be had"
        );
        eprintln!(
            "\n*** SKIPPED protected_mode_refuses_other_machines_until_a_token_opens_the_run: \
             not root (no network namespace) and no non-loopback interface ***\n"
        );
        return Ok(());
    };
    eprintln!("the remote worker runs from {elsewhere:?}");
    within(LIMIT, "protected mode", async {
        let tmp = tempfile::tempdir()?;
        let run = |name: &str| tmp.path().join(name);
        let mut coord = Coord::start(
            &run("protected"),
            "0.0.0.0:0",
            &["--n", "10", "--local-threads", "0"],
        )
        .await?;
        coord.proc.line_containing("protected mode").await?;
        let remote_addr = elsewhere.coordinator(coord.addr.port());
        let mut refused = elsewhere.worker("refused", &remote_addr, &[], &[])?;
        let status = refused.wait().await?;
        let out = refused.output();
        ensure!(status.code() == Some(1), "refused: exit {status}\n{out}");
        for needle in [
            "refused this worker",
            "protected mode",
            "NQ_TOKEN",
            "--insecure-open-port",
        ] {
            ensure!(out.contains(needle), "refused: no {needle:?} in:\n{out}");
        }
        let line = coord
            .proc
            .line_containing("refused a call from another machine")
            .await?;
        let peer = nq_e2e::log_field(&line, "peer").context("no peer")?;
        ensure!(!peer.starts_with("127."), "the peer looks local: {line}");
        let local = format!("127.0.0.1:{}", coord.addr.port());
        let mut here = worker("here", &local, &["--threads", "2"])?;
        // One worker and no local threads: no second machine could check
        // its results on probation, so the run ends unchecked (exit 6).
        coord.finish_unchecked().await?;
        here.success().await?;
        let log = coord.proc.output();
        ensure!(!log.contains(" ERROR "), "an ERROR line:\n{log}");

        for (name, flags, env) in [
            (
                "token",
                &["--token", "s3cret"][..],
                &[("NQ_TOKEN", "s3cret")][..],
            ),
            ("opened", &["--insecure-open-port"][..], &[][..]),
        ] {
            let mut args = vec!["--n", "10", "--local-threads", "0"];
            args.extend(flags);
            let mut coord = Coord::start(&run(name), "0.0.0.0:0", &args).await?;
            let remote_addr = elsewhere.coordinator(coord.addr.port());
            let mut w = elsewhere.worker(name, &remote_addr, &["--threads", "2"], env)?;
            coord.finish_unchecked().await?;
            w.success().await?;
        }
        Ok(())
    })
    .await
}

/// A worker that speaks plain text to a coordinator that serves TLS stops at
/// once, saying that the coordinator speaks TLS and how to connect
/// (`https://`, `--ca`), instead of retrying until its `--give-up` (here an
/// hour: only the test's deadline would end it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_text_worker_is_told_that_the_coordinator_speaks_tls() -> Result<()> {
    within(LIMIT, "plain text to tls", async {
        let tmp = tempfile::tempdir()?;
        let pki = Pki::create(tmp.path())?;
        let mut coord = Coord::ephemeral(
            &data_dir(&tmp),
            &[
                "--n",
                "10",
                "--local-threads",
                "0",
                "--tls-cert",
                path(&pki.server_cert),
                "--tls-key",
                path(&pki.server_key),
            ],
        )
        .await?;
        let mut w = worker("plain", &coord.addr.to_string(), &["--give-up", "1h"])?;
        let status = w.wait().await?;
        let out = w.output();
        ensure!(status.code() == Some(1), "plain: exit {status}\n{out}");
        let https = format!("https://{}", coord.addr);
        for needle in ["speaks TLS", https.as_str(), "--ca"] {
            ensure!(out.contains(needle), "plain: no {needle:?} in:\n{out}");
        }
        coord.proc.terminate()?;
        coord.proc.wait().await?;
        Ok(())
    })
    .await
}

/// Per-machine tokens (`--worker-tokens`): a worker is admitted by its own
/// token and votes as the token's name. Two processes that share one token
/// are one voice, whatever their names, so with no other machine nobody
/// checks them and the run ends `unchecked` (exit 6); the same two
/// processes with a token each check each other and the run ends
/// `complete`. A token not in the file is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_worker_token_is_one_voice_whatever_the_processes_behind_it() -> Result<()> {
    within(LIMIT, "worker tokens", async {
        let tmp = tempfile::tempdir()?;
        let tokens = tmp.path().join("worker-tokens");
        std::fs::write(
            &tokens,
            "# one line per machine\nrack1-a tok-a-0123\nrack1-b tok-b-4567\n",
        )?;
        let run = |dir: &str| {
            let tokens = path(&tokens).to_owned();
            let dir = tmp.path().join(dir);
            async move {
                let args = [
                    "--n",
                    "14",
                    "--jobs",
                    "60",
                    "--local-threads",
                    "0",
                    "--worker-tokens",
                    &tokens,
                ];
                Coord::ephemeral(&dir, &args).await
            }
        };
        // One token behind two processes: one voice.
        let mut shared = run("shared").await?;
        let addr = shared.addr.to_string();
        let mut stranger = worker("stranger", &addr, &["--token", "tok-c-8901"])?;
        let status = stranger.wait().await?;
        ensure!(
            status.code() == Some(1) && stranger.output().contains("refused the token"),
            "a token not in the file: exit {status}\n{}",
            stranger.output()
        );
        let mut p1 = worker("p1", &addr, &["--token", "tok-a-0123", "--threads", "1"])?;
        let mut p2 = worker("p2", &addr, &["--token", "tok-a-0123", "--threads", "1"])?;
        let report = shared.finish_unchecked().await?;
        p1.success().await?;
        p2.success().await?;
        ensure!(
            report.json["confirmations"] == 0,
            "two processes of one token confirmed each other: {}",
            report.json
        );
        let log = shared.proc.output();
        let registrations: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("worker registered"))
            .collect();
        ensure!(
            registrations.len() >= 2
                && registrations.iter().all(|l| l.contains("token:rack1-a")),
            "the registrations do not name the token:\n{log}"
        );
        ensure!(!log.contains("tok-a-0123"), "the coordinator logs a token");
        // A token each: two voices, every job checked.
        let mut two = run("two").await?;
        let addr = two.addr.to_string();
        let mut a = worker("p1", &addr, &["--token", "tok-a-0123", "--threads", "1"])?;
        let mut b = worker("p2", &addr, &["--token", "tok-b-4567", "--threads", "1"])?;
        let report = two.finish().await?;
        report.check_published()?;
        a.success().await?;
        b.success().await?;
        ensure!(
            report.json["confirmations"].as_u64().is_some_and(|c| c > 0),
            "two tokens, yet nothing confirmed: {}",
            report.json
        );
        Ok(())
    })
    .await
}
