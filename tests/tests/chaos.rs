//! Fault injection into whole runs: a coordinator killed again and again,
//! workers killed and restarted, a worker frozen past its lease, a worker on
//! a flaky network, and garbage on the coordinator's port. Each test picks its
//! fault moments from a printed seed (`NQ_FAULT_SEED` replays it), waits only
//! on real signals (log lines, exits, sockets), and ends by checking the
//! run's `report.json` against the published totals. Each records a row for
//! `RELIABILITY.md` (see `nq_e2e::reliability`).

use std::collections::BTreeSet;

use anyhow::{Context, Result, ensure};
use nq_e2e::proxy::Proxy;
use nq_e2e::reliability::Trial;
use nq_e2e::{Coord, Proc, Report, log_field, within, worker};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::{LIMIT, data_dir};

/// The coordinator's log line for a job's result made durable and counted
/// (debug level; a later copy of the job "confirms the counted one").
const DONE: &str = "copy counts";
/// The coordinator's log line for an expired lease.
const EXPIRED: &str = "lease expired";

/// A run of 137 jobs of about 40 ms of one core each (N=16, one extra
/// column): long enough for every fault below to land mid-run, short
/// enough for the suite's budget.
const RUN: [&str; 8] = [
    "--n",
    "16",
    "--split",
    "0:1",
    "--jobs",
    "100",
    "--local-threads",
    "0",
];

/// The run's flags plus `extra`.
fn run_args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    RUN.iter().copied().chain(extra.iter().copied()).collect()
}

/// Waits for `k` more lines containing `needle` from `p`.
async fn lines(p: &mut Proc, needle: &str, k: u64) -> Result<()> {
    for _ in 0..k {
        p.line_containing(needle).await?;
    }
    Ok(())
}

/// Whether a coordinator log line is about the worker registered as `id`
/// under `name`: its `worker` field is the id, or (for coordinators that log
/// a worker's identity as `name@ip`) that identity.
fn about(line: &str, id: &str, name: &str) -> bool {
    log_field(line, "worker").is_some_and(|w| {
        w == id
            || w.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('@'))
    })
}

/// Coordinator flags for a progress line every tick: its `leased=0` tells a
/// test that waits for a lease to expire that there is none to expire.
const PROGRESS: [&str; 4] = ["--progress", "log", "--progress-interval", "100ms"];

/// Waits, while `worker` is silenced (stopped or stalled) and is the only
/// worker that may hold leases, for the coordinator to expire one of its
/// leases. Returns the expiry line, or `None` when the coordinator reports
/// that no job is leased at all: the worker held nothing when it was
/// silenced (it had just reported its last job), so nothing can expire.
async fn expiry_or_nothing_leased(
    coord: &mut Proc,
    id: &str,
    worker: &str,
) -> Result<Option<String>> {
    let line = coord
        .line(|_, l| {
            (l.contains(EXPIRED) && about(l, id, worker))
                || (l.contains("progress") && log_field(l, "leased") == Some("0"))
        })
        .await?;
    Ok(line.contains(EXPIRED).then_some(line))
}

/// The worker id a worker process got at its (last seen) registration.
async fn registered_id(w: &mut Proc) -> Result<String> {
    let line = w.line_containing("registered").await?;
    log_field(&line, "worker")
        .map(str::to_owned)
        .with_context(|| format!("no worker id in {line:?}"))
}

/// The coordinator is SIGKILLed five times at seeded random moments of one
/// run and restarted on the same data directory and port each time; the
/// workers stay attached throughout and the totals are exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_coordinator_sigkills_at_random_moments() -> Result<()> {
    let mut t = Trial::start("coordinator-sigkill")?;
    let r = within(LIMIT, "coordinator SIGKILLs", coordinator_sigkills(&mut t)).await;
    t.finish(r)
}

async fn coordinator_sigkills(t: &mut Trial) -> Result<Report> {
    let mut rng = t.rng();
    let tmp = tempfile::tempdir()?;
    let dir = data_dir(&tmp);
    // The last coordinator may finish the run before a worker backing off
    // from the kill calls again: it lingers for the workers of earlier
    // sessions, and the linger must outlast a worker's back-off (5 s at
    // most), as the default does with the default lease TTL (11 s).
    let args = run_args(&["--lease-ttl", "2s", "--linger", "7s"]);
    let mut coord = Coord::ephemeral(&dir, &args).await?;
    t.watch(&coord.proc);
    let addr = coord.addr.to_string();
    let mut a = worker("a", &addr, &["--threads", "1"])?;
    t.watch(&a);
    let mut b = worker("b", &addr, &["--threads", "1"])?;
    t.watch(&b);
    let mut moments = Vec::new();
    for kill in 0..5 {
        // At most 5 × 8 = 40 of the 137 jobs are done before the last kill,
        // so every kill lands mid-run.
        let k = rng.range(1, 8);
        lines(&mut coord.proc, DONE, k).await?;
        coord.proc.kill().await?;
        t.injected("SIGKILL of the coordinator");
        moments.push(k);
        let before = coord.proc.output();
        ensure!(
            kill == 0 || before.contains("resuming run"),
            "a restarted coordinator did not resume:\n{before}"
        );
        coord = Coord::start(&dir, &addr, &args).await?;
        t.watch(&coord.proc);
    }
    let report = coord.finish().await?;
    report.check_published()?;
    ensure!(
        coord.proc.output().contains("resuming run"),
        "the last coordinator did not resume:\n{}",
        coord.proc.output()
    );
    a.success().await?;
    b.success().await?;
    // Each worker kept its id across every restart (issue 17): it exits 0
    // only once the last coordinator told it the run is over, and it
    // registered once, with the first.
    let regs: Vec<usize> = [&a, &b]
        .iter()
        .map(|w| w.lines_containing("registered").len())
        .collect();
    ensure!(
        regs.iter().all(|&r| r == 1),
        "a worker registered again after a kill instead of keeping its id: {regs:?}"
    );
    t.note(format!(
        "killed after {moments:?} new durable results; the workers registered \
         {regs:?} times; every restart resumed from the data directory"
    ));
    Ok(report)
}

/// Workers are SIGKILLed at seeded random moments and started again at once
/// under the same name; their leases expire, the jobs are reissued, and the
/// totals are exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_sigkilled_and_restarted_throughout() -> Result<()> {
    let mut t = Trial::start("worker-sigkill")?;
    let r = within(LIMIT, "worker SIGKILLs", worker_sigkills(&mut t)).await;
    t.finish(r)
}

async fn worker_sigkills(t: &mut Trial) -> Result<Report> {
    let mut rng = t.rng();
    let tmp = tempfile::tempdir()?;
    let mut coord =
        Coord::ephemeral(&data_dir(&tmp), &run_args(&["--lease-ttl", "1s"])).await?;
    t.watch(&coord.proc);
    let addr = coord.addr.to_string();
    let names = ["w0", "w1", "w2"];
    let mut workers = names
        .iter()
        .map(|n| worker(n, &addr, &["--threads", "1"]))
        .collect::<Result<Vec<_>>>()?;
    for w in &workers {
        t.watch(w);
    }
    let mut victims = Vec::new();
    for _ in 0..6 {
        // At most 6 × 6 = 36 of the 137 jobs are done before the last kill.
        let k = rng.range(1, 6);
        lines(&mut coord.proc, DONE, k).await?;
        let v = usize::try_from(rng.range(0, 2))?;
        workers[v].kill().await?;
        t.injected("SIGKILL of a worker, restarted at once");
        victims.push(names[v]);
        workers[v] = worker(names[v], &addr, &["--threads", "1"])?;
        t.watch(&workers[v]);
    }
    let report = coord.finish().await?;
    report.check_published()?;
    for w in &mut workers {
        w.success().await?;
    }
    let expired = coord.proc.lines_containing(EXPIRED).len();
    t.note(format!(
        "killed {victims:?} in that order; {expired} leases of killed workers expired \
         and their jobs were reissued"
    ));
    Ok(report)
}

/// A worker frozen (SIGSTOP) while it holds leases loses them to another
/// worker; thawed (SIGCONT), whatever it then reports of them is never
/// counted twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_stopped_past_its_lease_changes_nothing() -> Result<()> {
    let mut t = Trial::start("worker-sigstop")?;
    let r = within(LIMIT, "worker SIGSTOP", worker_sigstop(&mut t)).await;
    t.finish(r)
}

async fn worker_sigstop(t: &mut Trial) -> Result<Report> {
    const THAWED_EMPTY: &str = "SIGSTOP while it held no lease (thawed at once, retried)";
    let mut rng = t.rng();
    let tmp = tempfile::tempdir()?;
    let mut coord = Coord::ephemeral(
        &data_dir(&tmp),
        &run_args(&[&["--lease-ttl", "1s"], &PROGRESS[..]].concat()),
    )
    .await?;
    t.watch(&coord.proc);
    let addr = coord.addr.to_string();
    let mut frozen = worker("frozen", &addr, &["--threads", "2"])?;
    t.watch(&frozen);
    let id = registered_id(&mut frozen).await?;
    // A random moment once it is in its stride, right after it took a new
    // job, so that it almost surely holds a lease when it stops. Should it
    // have reported everything before the signal landed, it is thawed and
    // stopped again later.
    let line = loop {
        ensure!(
            t.count(THAWED_EMPTY) < 5,
            "the worker never held a lease when stopped"
        );
        lines(&mut frozen, "job reported", rng.range(1, 4)).await?;
        frozen.skip_backlog();
        frozen.line_containing("job leased").await?;
        coord.proc.skip_backlog();
        frozen.signal(libc::SIGSTOP)?;
        // Its leases expire only now that it is silent.
        match expiry_or_nothing_leased(&mut coord.proc, &id, "frozen").await? {
            Some(line) => break line,
            None => {
                frozen.signal(libc::SIGCONT)?;
                t.injected(THAWED_EMPTY);
            }
        }
    };
    t.injected("SIGSTOP of a worker holding leases, past its lease");
    // Their jobs go to another worker. Wait for it to finish one of them: by
    // then every lease the stopped worker held is past its TTL.
    let mut other = worker("other", &addr, &["--threads", "1"])?;
    t.watch(&other);
    let job = log_field(&line, "job")
        .map(str::to_owned)
        .with_context(|| format!("no job in {line:?}"))?;
    coord
        .proc
        .line(|_, l| l.contains(DONE) && log_field(l, "job") == Some(job.as_str()))
        .await?;
    // The jobs whose leases expired under it, and the ids of those leases
    // as the worker knows them (its own log of the leases it took before
    // the stop; the coordinator may print lease ids in another form).
    let expired: BTreeSet<String> = coord
        .proc
        .lines_containing(EXPIRED)
        .iter()
        .filter(|l| about(l, &id, "frozen"))
        .filter_map(|l| log_field(l, "job").map(str::to_owned))
        .collect();
    let held: BTreeSet<String> = frozen
        .lines_containing("job leased")
        .iter()
        .filter(|l| log_field(l, "job").is_some_and(|j| expired.contains(j)))
        .filter_map(|l| log_field(l, "lease").map(str::to_owned))
        .collect();
    frozen.signal(libc::SIGCONT)?;
    let report = coord.finish().await?;
    report.check_published()?;
    frozen.success().await?;
    other.success().await?;
    ensure!(
        !expired.is_empty() && !held.is_empty(),
        "no lease of the stopped worker expired:\n{}",
        coord.proc.output()
    );
    // What the thawed worker did with the leases that expired under it.
    let late = |needle: &str| {
        frozen
            .lines_containing(needle)
            .iter()
            .filter(|l| log_field(l, "lease").is_some_and(|x| held.contains(x)))
            .count()
    };
    let (reported, revoked, refused) = (
        late("job reported"),
        late("lease revoked"),
        late("report of a dropped lease refused") + late("rejected this job's report"),
    );
    t.note(format!(
        "{} of its leases expired while it was stopped; after SIGCONT it reported \
         {reported} of them late, was told {revoked} were revoked, and had {refused} \
         reports refused; the coordinator recorded {} confirmations and no conflict",
        held.len(),
        report.json["confirmations"]
    ));
    Ok(report)
}

/// The only worker talks to the coordinator through a proxy that closes its
/// connections or holds its bytes past its lease; it recovers every time and
/// the totals are exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_behind_a_flaky_proxy_counts_exactly() -> Result<()> {
    let mut t = Trial::start("flaky-network")?;
    let r = within(LIMIT, "flaky proxy", flaky_network(&mut t)).await;
    t.finish(r)
}

async fn flaky_network(t: &mut Trial) -> Result<Report> {
    const DROP: &str = "drop of every connection of the worker";
    const STALL: &str = "stall of the worker's traffic past its lease";
    let mut rng = t.rng();
    let tmp = tempfile::tempdir()?;
    let mut coord = Coord::ephemeral(
        &data_dir(&tmp),
        &run_args(&[&["--lease-ttl", "1s"], &PROGRESS[..]].concat()),
    )
    .await?;
    t.watch(&coord.proc);
    let proxy = Proxy::start(coord.addr).await?;
    // The only worker: the run advances only through the proxy, so every
    // fault lands mid-run and the worker must survive each one.
    let mut w = worker("flaky", &proxy.addr.to_string(), &["--threads", "2"])?;
    t.watch(&w);
    let id = registered_id(&mut w).await?;
    // Six faults, at least one of each kind: the first is random, then the
    // missing kind, then random.
    let first_drop = rng.chance(0.5);
    let mut attempts = 0;
    while t.count(DROP) + t.count(STALL) < 6 {
        // At most 12 × 3 = 36 of the 137 jobs are done before the last fault.
        attempts += 1;
        ensure!(
            attempts <= 12,
            "too many stalls found the worker without a lease"
        );
        lines(&mut coord.proc, DONE, rng.range(1, 3)).await?;
        let drop = match (t.count(DROP), t.count(STALL)) {
            (0, 0) => first_drop,
            (0, _) => true,
            (_, 0) => false,
            _ => rng.chance(0.5),
        };
        if drop {
            let accepted = proxy.accepted();
            proxy.drop_connections();
            t.injected(DROP);
            // Recovery: the worker connects again.
            proxy.wait_accepted(accepted + 1).await;
        } else {
            // Right after the worker took a new job, so that it almost surely
            // holds a lease for the coordinator to expire during the stall.
            w.skip_backlog();
            w.line_containing("job leased").await?;
            coord.proc.skip_backlog();
            proxy.stall();
            let expired = expiry_or_nothing_leased(&mut coord.proc, &id, "flaky").await?;
            proxy.resume();
            t.injected(if expired.is_some() {
                STALL
            } else {
                "stall while the worker held no lease (not counted)"
            });
        }
    }
    // Its only machine is one remote worker (`--local-threads 0`): since probation
    // (issue 15, item 7) nobody checks it, so the run ends `unchecked` (exit 6) with
    // the published totals, where it ended `complete` unchecked before.
    let report = coord.finish_unchecked().await?;
    w.success().await?;
    ensure!(
        t.count(DROP) >= 1 && t.count(STALL) >= 1,
        "both faults must have been injected"
    );
    t.note(format!(
        "{} connections in all through the proxy; the coordinator expired {} of the \
         worker's leases and recorded {} confirmations (verification copies, and \
         reports repeated after a lost ack or late) and no conflict; the worker retried {} calls",
        proxy.accepted(),
        coord.proc.lines_containing(EXPIRED).len(),
        report.json["confirmations"],
        w.lines_containing("retrying").len(),
    ));
    Ok(report)
}

/// The HTTP/2 client connection preface (RFC 9113, section 3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Random bytes, broken and half-open HTTP/2 connections and messages over
/// the size limit hit the coordinator's port mid-run; it goes on serving and
/// the totals are exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_and_oversized_messages_on_the_port_change_nothing() -> Result<()> {
    let mut t = Trial::start("garbage-traffic")?;
    let r = within(LIMIT, "garbage traffic", garbage_traffic(&mut t)).await;
    t.finish(r)
}

async fn garbage_traffic(t: &mut Trial) -> Result<Report> {
    let mut rng = t.rng();
    let tmp = tempfile::tempdir()?;
    let mut coord = Coord::ephemeral(&data_dir(&tmp), &run_args(&[])).await?;
    t.watch(&coord.proc);
    let addr = coord.addr;
    let mut w = worker("w", &addr.to_string(), &["--threads", "1"])?;
    t.watch(&w);
    lines(&mut coord.proc, DONE, 1).await?;
    // The worker is frozen while the traffic goes in: the run (about a
    // second on a fast core) cannot end before it, so every fault below
    // lands mid-run (a CI run once saw the coordinator gone, its run over,
    // halfway through the random bytes).
    w.signal(libc::SIGSTOP)?;

    // Random bytes: the server must close each connection (it reads no valid
    // preface), which the read to end-of-stream observes.
    let mut sizes = Vec::new();
    for _ in 0..10 {
        let len = usize::try_from(rng.range(1, 64 * 1024))?;
        let mut s = TcpStream::connect(addr).await?;
        // The server may close before reading it all; a reset is fine.
        let _ = s.write_all(&rng.bytes(len)).await;
        let mut sink = Vec::new();
        let _ = s.read_to_end(&mut sink).await;
        t.injected("connection sending random bytes");
        sizes.push(len);
    }
    // A valid preface, then random bytes where HTTP/2 frames should be: the
    // server must end the connection (a protocol error), not the run.
    for _ in 0..5 {
        let len = usize::try_from(rng.range(1, 16 * 1024))?;
        let mut s = TcpStream::connect(addr).await?;
        s.write_all(PREFACE).await?;
        let _ = s.write_all(&rng.bytes(len)).await;
        let mut sink = Vec::new();
        let _ = s.read_to_end(&mut sink).await;
        t.injected("HTTP/2 preface followed by random frames");
    }
    // Half-open HTTP/2: a valid preface, then silence, held open until the
    // run is over; the coordinator must neither wait for them nor hang on
    // them at shutdown.
    let mut half_open = Vec::new();
    for _ in 0..3 {
        let mut s = TcpStream::connect(addr).await?;
        s.write_all(PREFACE).await?;
        half_open.push(s);
        t.injected("half-open HTTP/2 connection (preface, then silence)");
    }
    // Messages over the limit, sent by a client that allows itself more.
    let over = nq_proto::MAX_MESSAGE_BYTES + 1;
    let mut big = nq_proto::pb::coordinator_client::CoordinatorClient::connect(format!(
        "http://{addr}"
    ))
    .await?
    .max_encoding_message_size(usize::MAX);
    let err = big
        .register(nq_proto::pb::RegisterRequest {
            protocol_version: nq_proto::PROTOCOL_VERSION,
            name: "x".repeat(over),
            threads: 1,
            program_version: String::new(),
            gpu_jobs: 0,
        })
        .await
        .err()
        .context("a Register message over MAX_MESSAGE_BYTES was accepted")?;
    t.injected("gRPC Register message over MAX_MESSAGE_BYTES");
    let chunk = nq_proto::pb::ReportChunk {
        worker_id: "nobody".into(),
        job_id: 0,
        lease_id: 0,
        body: Some(nq_proto::pb::report_chunk::Body::Solutions(
            nq_proto::pb::SolutionBatch {
                subproblem: 0,
                rows: vec![0; over],
            },
        )),
        run_id: String::new(),
    };
    let err2 = big
        .report(tokio_stream::iter([chunk]))
        .await
        .err()
        .context("a Report chunk over MAX_MESSAGE_BYTES was accepted")?;
    t.injected("gRPC Report chunk over MAX_MESSAGE_BYTES");

    // Still serving: more results become durable after all of it.
    w.signal(libc::SIGCONT)?;
    lines(&mut coord.proc, DONE, 1).await?;
    // Its only machine is one remote worker (`--local-threads 0`): since probation
    // (issue 15, item 7) nobody checks it, so the run ends `unchecked` (exit 6) with
    // the published totals, where it ended `complete` unchecked before.
    let report = coord.finish_unchecked().await?;
    w.success().await?;
    drop(half_open);
    t.note(format!(
        "random-byte connections of {sizes:?} bytes, each closed by the coordinator; \
         the oversized messages got {:?} and {:?}",
        err.code(),
        err2.code()
    ));
    // An observation, not a requirement: silent connections can hold the
    // coordinator's exit until its shutdown grace runs out.
    let held = "in-flight requests did not finish in time";
    if !coord.proc.lines_containing(held).is_empty() {
        t.note(format!(
            "the half-open connections held the coordinator's exit until its \
             shutdown grace ran out (it logged \"{held}\")"
        ));
    }
    Ok(report)
}
