//! Fuzzing the coordinator's handling of incoming messages (issue 7, item 8):
//! a real coordinator (`nq_coord::run` on 127.0.0.1) is sent proptest-made
//! sequences of Register, Lease, Release and Report calls, from strangers,
//! confused workers and a lying one, interleaved with an honest worker's
//! copies. Every reply must be a value or a proper gRPC status, the
//! coordinator must keep serving, no report outside a lease of the run may be
//! acknowledged, and afterwards two honest workers must finish the run with
//! the exact published count.
//!
//! proptest rather than cargo-fuzz, which needs a nightly toolchain: this runs
//! in `cargo test` on stable, in CI. Each case starts a coordinator and runs a
//! whole N = 8 run, so the number of cases is kept small ([`CASES`]).

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use common::{Solved, Worker, solve};
use nq_coord::quorum::Fraction;
use nq_coord::report::RunStatus;
use nq_coord::{Config, RunReport};
use nq_proto::convert::RunShape;
use nq_proto::pb;
use nq_proto::pb::coordinator_client::CoordinatorClient;
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config as ProptestConfig, TestCaseError, TestRunner};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

/// Cases per run of the test: each is a whole coordinator session.
const CASES: u32 = 64;

/// The board: small enough that a run takes a fraction of a second, large
/// enough for a dozen jobs and sub-problems with many solutions.
const N: u64 = 8;
const Q: u128 = 92;
const U: u128 = 12;

/// Each case gets this long (it needs well under a second).
const LIMIT: Duration = Duration::from_secs(30);

/// A coordinator that checks every job twice (so that a lie is caught by the
/// honest workers afterwards) and uses no threads of its own (so that
/// everything it counts arrives as a message).
fn config(dir: &std::path::Path, solutions: bool) -> Config {
    let mut c = Config::new(N, dir.join("run.sled")).unwrap();
    c.local_threads = 0;
    // The registrations of a case are never told that the run is over, so
    // the coordinator lingers its whole linger after the end: long enough
    // for the slower honest worker to hear of it. The test stops it as soon
    // as both have.
    c.linger = Duration::from_secs(10);
    c.verify = Fraction::Fixed(1.0);
    c.target_jobs = Some(12);
    // An idle worker is told to ask again after a third of the lease
    // lifetime (at most 500 ms), and the honest workers are idle whenever
    // they wait for each other's copies: a short lifetime keeps each case
    // short. Leases of the fuzzed calls then also expire mid-case, which is
    // one more path exercised.
    c.lease_ttl = Duration::from_millis(300);
    c.solutions = solutions;
    c
}

// ----- what the fuzzer sends ----------------------------------------------------

/// Who a call claims to come from.
#[derive(Clone, Debug)]
enum Who {
    /// The case's one lying worker, registered as `fuzz`.
    Fuzz,
    /// A worker registered by an earlier `Register` of the case.
    Registered(Index),
    /// Any worker id, registered or not.
    Any(String),
}

/// A lease id: one that was granted in the case, or any number.
#[derive(Clone, Debug)]
enum LeasePick {
    Granted(Index),
    Any(u64),
}

/// The counts of a result chunk.
#[derive(Clone, Debug)]
enum Counts {
    /// The true counts of the lease's job.
    Truth,
    /// The true counts with one sub-problem's count moved by `delta` (away
    /// from the truth, whatever its sign): a lie that often passes every
    /// check.
    Lie { sub: Index, delta: i32 },
    /// Any counts, of any number, with fields missing or not.
    Wire(Vec<pb::SubCounts>),
}

/// The rows of a solution batch.
#[derive(Clone, Debug)]
enum Rows {
    /// `len` true completions of the sub-problem, from the `from`-th.
    True { from: Index, len: usize },
    /// Every true completion, in reverse (out of order when there are two).
    Reversed,
    /// Any bytes.
    Any(Vec<u8>),
}

/// One chunk of a report stream.
#[derive(Clone, Debug)]
enum Chunk {
    /// A solution batch of sub-problem `sub` (an index into the job, or any
    /// number).
    Solutions { sub: Result<Index, u32>, rows: Rows },
    /// The result.
    Result {
        counts: Counts,
        nodes: u64,
        /// `None`: the number of solutions in the report's batches.
        sent: Option<u64>,
        kernel: String,
    },
    /// A chunk with no body.
    Empty,
    /// A chunk naming another worker and job than the stream's first.
    Stray { worker_id: String, job_id: u64 },
}

/// One call.
#[derive(Clone, Debug)]
enum Action {
    Register(pb::RegisterRequest),
    Lease {
        who: Who,
        want: u32,
        held: Vec<LeasePick>,
    },
    Release {
        who: Who,
        leases: Vec<LeasePick>,
    },
    /// An honest worker (`honest-a`, registered at the start) leases up to
    /// `want` jobs and reports them truthfully: copies for the fuzz worker's
    /// to agree or conflict with, while the fuzzing goes on.
    Honest {
        want: u32,
    },
    Report {
        who: Who,
        lease: LeasePick,
        /// `None`: the job of the lease.
        job: Option<u64>,
        /// `None`: this run's id.
        run: Option<String>,
        chunks: Vec<Chunk>,
    },
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![any::<String>(), "[a-z0-9.@-]{0,12}"]
}

/// Who makes a call: mostly the fuzz worker, `weight` to 2 against
/// registrations of the case and strangers.
fn who(weight: u32) -> impl Strategy<Value = Who> {
    prop_oneof![
        weight => Just(Who::Fuzz),
        2 => any::<Index>().prop_map(Who::Registered),
        1 => text().prop_map(Who::Any),
    ]
}

fn lease_pick() -> impl Strategy<Value = LeasePick> {
    prop_oneof![
        4 => any::<Index>().prop_map(LeasePick::Granted),
        1 => any::<u64>().prop_map(LeasePick::Any),
    ]
}

fn wire_count() -> impl Strategy<Value = Option<pb::Count>> {
    proptest::option::weighted(
        0.9,
        prop_oneof![
            (0u64..200).prop_map(|lo| pb::Count { hi: 0, lo }),
            (any::<u64>(), any::<u64>()).prop_map(|(hi, lo)| pb::Count { hi, lo }),
        ],
    )
}

fn counts() -> impl Strategy<Value = Counts> {
    prop_oneof![
        3 => Just(Counts::Truth),
        3 => (any::<Index>(), prop_oneof![3 => -2i32..=2, 1 => -20i32..=20])
            .prop_map(|(sub, delta)| Counts::Lie { sub, delta }),
        1 => vec(
            (wire_count(), wire_count(), wire_count()).prop_map(|(count, fixed180, fixed90)| {
                pb::SubCounts { count, fixed180, fixed90 }
            }),
            0..6,
        )
        .prop_map(Counts::Wire),
    ]
}

fn rows() -> impl Strategy<Value = Rows> {
    prop_oneof![
        3 => (any::<Index>(), 0usize..6).prop_map(|(from, len)| Rows::True { from, len }),
        1 => Just(Rows::Reversed),
        1 => vec(prop_oneof![0u8..8, any::<u8>()], 0..40).prop_map(Rows::Any),
    ]
}

fn result_chunk() -> impl Strategy<Value = Chunk> {
    (
        counts(),
        any::<u64>(),
        proptest::option::weighted(0.2, 0u64..100),
        prop_oneof![Just(String::new()), Just("scalar".to_owned()), text()],
    )
        .prop_map(|(counts, nodes, sent, kernel)| Chunk::Result {
            counts,
            nodes,
            sent,
            kernel,
        })
}

fn other_chunk() -> impl Strategy<Value = Chunk> {
    prop_oneof![
        6 => (
            prop_oneof![4 => any::<Index>().prop_map(Ok), 1 => any::<u32>().prop_map(Err)],
            rows(),
        )
            .prop_map(|(sub, rows)| Chunk::Solutions { sub, rows }),
        1 => Just(Chunk::Empty),
        1 => (text(), any::<u64>()).prop_map(|(worker_id, job_id)| Chunk::Stray {
            worker_id,
            job_id
        }),
    ]
}

/// A report stream: solution batches (in solutions mode; seldom
/// otherwise) then a result, sometimes no result, or chunks after it.
fn chunks(solutions: bool) -> impl Strategy<Value = Vec<Chunk>> {
    let before = if solutions { 0.9 } else { 0.15 };
    (
        proptest::option::weighted(before, vec(other_chunk(), 1..4))
            .prop_map(Option::unwrap_or_default),
        proptest::option::weighted(0.9, result_chunk()),
        vec(other_chunk(), 0..2),
        any::<bool>(),
    )
        .prop_map(|(mut before, result, after, trail)| {
            before.extend(result);
            if trail {
                before.extend(after);
            }
            before
        })
}

fn action(solutions: bool) -> impl Strategy<Value = Action> {
    prop_oneof![
        2 => (1u32..4).prop_map(|want| Action::Honest { want }),
        1 => (
            prop_oneof![4 => Just(nq_proto::PROTOCOL_VERSION), 1 => any::<u32>()],
            text(),
            prop_oneof![0u32..64, any::<u32>()],
            text(),
            prop_oneof![Just(0u32), any::<u32>()],
        )
            .prop_map(
                |(protocol_version, name, threads, program_version, gpu_jobs)| {
                    Action::Register(pb::RegisterRequest {
                        protocol_version,
                        name,
                        threads,
                        program_version,
                        gpu_jobs,
                    })
                },
            ),
        3 => (who(4), prop_oneof![0u32..8, any::<u32>()], vec(lease_pick(), 0..4))
            .prop_map(|(who, want, held)| Action::Lease { who, want, held }),
        1 => (who(4), vec(lease_pick(), 0..3))
            .prop_map(|(who, leases)| Action::Release { who, leases }),
        5 => (
            who(12),
            lease_pick(),
            proptest::option::weighted(0.1, prop_oneof![0u64..16, any::<u64>()]),
            proptest::option::weighted(0.1, text()),
            chunks(solutions),
        )
            .prop_map(|(who, lease, job, run, chunks)| Action::Report {
                who,
                lease,
                job,
                run,
                chunks,
            }),
    ]
}

/// One case: solutions mode or not, and the calls to make. The first call
/// leases jobs to the fuzz worker, so that most reports have a lease of its
/// own to be bound to, and reach the stages after admission.
fn case() -> impl Strategy<Value = (bool, Vec<Action>)> {
    proptest::bool::weighted(0.3)
        .prop_flat_map(|solutions| {
            (Just(solutions), 1u32..12, vec(action(solutions), 1..16))
        })
        .prop_map(|(solutions, want, actions)| {
            let first = Action::Lease {
                who: Who::Fuzz,
                want,
                held: vec![],
            };
            (solutions, std::iter::once(first).chain(actions).collect())
        })
}

// ----- sending it -----------------------------------------------------------------

/// What the fuzzed reports got, over every case: the generators must keep
/// reaching past admission, or the test would pass without testing much.
#[derive(Debug, Default)]
struct Seen {
    accepted: u32,
    refused: HashMap<tonic::Code, u32>,
    /// Honest copies that disagreed with a lie stored before them.
    honest_conflicts: u32,
}

impl Seen {
    fn note(&mut self, reply: &Result<tonic::Response<pb::ReportAck>, tonic::Status>) {
        match reply {
            Ok(_) => self.accepted += 1,
            Err(s) => *self.refused.entry(s.code()).or_default() += 1,
        }
    }
}

/// A lease granted during the case.
struct Granted {
    lease: u64,
    worker: String,
    job: pb::Job,
}

/// The fuzzer's view of one coordinator session.
struct Fuzzer {
    honest: Worker,
    client: CoordinatorClient<Channel>,
    fuzz_id: String,
    run_id: String,
    shape: RunShape,
    registered: Vec<String>,
    granted: Vec<Granted>,
    /// The true counts and solutions of each job seen, by job id.
    truth: HashMap<u64, Solved>,
    seen: Seen,
}

/// The status codes a refused call may get: bad input, register again, not
/// yours (or banned), busy, and a report stream whose lease ended while it
/// streamed (expired or taken back: with the cases' 300 ms lifetime this
/// happens). Anything else (INTERNAL, UNKNOWN from a panic or a dropped
/// connection) is a failure.
const REFUSALS: [tonic::Code; 5] = [
    tonic::Code::InvalidArgument,
    tonic::Code::FailedPrecondition,
    tonic::Code::PermissionDenied,
    tonic::Code::Unavailable,
    tonic::Code::Aborted,
];

/// Checks that a reply is a value or a proper refusal, with a message.
fn proper<T>(
    what: &str,
    reply: &Result<tonic::Response<T>, tonic::Status>,
) -> Result<(), TestCaseError> {
    if let Err(s) = reply {
        prop_assert!(
            REFUSALS.contains(&s.code()) && !s.message().is_empty(),
            "{what}: improper status {:?}: {:?}",
            s.code(),
            s.message()
        );
    }
    Ok(())
}

impl Fuzzer {
    async fn new(addr: SocketAddr) -> Fuzzer {
        let w = Worker::connect_as(addr, "fuzz").await;
        Fuzzer {
            honest: Worker::connect_as(addr, "honest-a").await,
            client: w.client,
            fuzz_id: w.id,
            run_id: w.run_id,
            shape: w.shape,
            registered: vec![],
            granted: vec![],
            truth: HashMap::new(),
            seen: Seen::default(),
        }
    }

    fn worker(&self, who: &Who) -> String {
        match who {
            Who::Fuzz => self.fuzz_id.clone(),
            Who::Registered(i) if !self.registered.is_empty() => {
                i.get(&self.registered).clone()
            }
            Who::Registered(_) => self.fuzz_id.clone(),
            Who::Any(s) => s.clone(),
        }
    }

    fn granted(&self, pick: &LeasePick) -> Option<&Granted> {
        match pick {
            LeasePick::Granted(i) if !self.granted.is_empty() => {
                Some(i.get(&self.granted))
            }
            _ => None,
        }
    }

    fn lease_id(&self, pick: &LeasePick) -> u64 {
        match (pick, self.granted(pick)) {
            (_, Some(g)) => g.lease,
            (LeasePick::Any(l), None) => *l,
            (LeasePick::Granted(_), None) => 1,
        }
    }

    async fn act(&mut self, action: &Action) -> Result<(), TestCaseError> {
        match action {
            Action::Register(req) => {
                let reply = self.client.register(req.clone()).await;
                proper("register", &reply)?;
                if let Ok(r) = reply {
                    let r = r.into_inner();
                    prop_assert_eq!(r.run.map(|r| r.run_id), Some(self.run_id.clone()));
                    self.registered.push(r.worker_id);
                }
            }
            Action::Lease { who, want, held } => {
                let worker_id = self.worker(who);
                let held = held.iter().map(|p| self.lease_id(p)).collect();
                let reply = self
                    .client
                    .lease(pb::LeaseRequest {
                        worker_id: worker_id.clone(),
                        want: *want,
                        held,
                    })
                    .await;
                proper("lease", &reply)?;
                if let Ok(r) = reply {
                    // `run_complete` may be either: the fuzz worker's true
                    // copies and `honest-a`'s can settle every job.
                    for job in r.into_inner().jobs {
                        prop_assert!(!job.subproblems.is_empty());
                        prop_assert!(job.lease_id != 0);
                        self.truth.entry(job.job_id).or_insert_with(|| {
                            solve(&self.shape, &job, self.shape.solutions)
                        });
                        self.granted.push(Granted {
                            lease: job.lease_id,
                            worker: worker_id.clone(),
                            job,
                        });
                    }
                }
            }
            Action::Honest { want } => {
                let reply = self
                    .honest
                    .client
                    .lease(pb::LeaseRequest {
                        worker_id: self.honest.id.clone(),
                        want: *want,
                        held: vec![],
                    })
                    .await;
                proper("honest lease", &reply)?;
                let Ok(reply) = reply else { return Ok(()) };
                for job in reply.into_inner().jobs {
                    let solved = solve(&self.shape, &job, self.shape.solutions);
                    let ack = self.honest.report_solved(&job, &solved).await;
                    // Busy: the fuzz worker's report of the job holds its
                    // solutions; the lease simply expires.
                    if !matches!(&ack, Err(s) if s.code() == tonic::Code::Unavailable) {
                        let ack = ack.map_err(|s| {
                            TestCaseError::fail(format!(
                                "an honest report was refused: {s:?}"
                            ))
                        })?;
                        if ack.outcome() == pb::report_ack::Outcome::Conflict {
                            self.seen.honest_conflicts += 1;
                        }
                    }
                }
            }
            Action::Release { who, leases } => {
                let worker_id = self.worker(who);
                let leases = leases.iter().map(|p| self.lease_id(p)).collect();
                let reply = self
                    .client
                    .release(pb::ReleaseRequest {
                        worker_id,
                        leases,
                        leaving: false,
                    })
                    .await;
                proper("release", &reply)?;
            }
            Action::Report {
                who,
                lease,
                job,
                run,
                chunks,
            } => {
                // Bound when it names a granted lease, and the job and run
                // that lease was granted for (a generated job or run id may
                // happen to be the right one).
                let bound = self.granted(lease).is_some_and(|g| {
                    job.is_none_or(|j| j == g.job.job_id)
                        && run.as_deref().is_none_or(|r| r == self.run_id)
                });
                let stream = self.report_stream(who, lease, *job, run.as_deref(), chunks);
                let reply = self.client.report(tokio_stream::iter(stream)).await;
                proper("report", &reply)?;
                self.seen.note(&reply);
                if let Ok(ack) = &reply {
                    prop_assert!(
                        bound,
                        "a report not bound to a lease of this run counted"
                    );
                    let outcome = ack.get_ref().outcome();
                    prop_assert!(
                        outcome != pb::report_ack::Outcome::Unspecified,
                        "an ack without an outcome"
                    );
                }
            }
        }
        Ok(())
    }

    /// The chunks of a report as `chunks` describes them, under the ids that
    /// `who`, `lease`, `job` and `run` pick.
    fn report_stream(
        &self,
        who: &Who,
        lease: &LeasePick,
        job: Option<u64>,
        run: Option<&str>,
        chunks: &[Chunk],
    ) -> Vec<pb::ReportChunk> {
        let worker_id = self.worker(who);
        let granted = self.granted(lease);
        let mut lease_id = self.lease_id(lease);
        // Only the fuzz worker may report under a lease of its own. Another
        // registration of this test is another identity to verification
        // (`name@address`), and two identities of one sender that agree on a
        // lie outvote one honest worker; that is a limit of identities, not
        // of message handling, so it is left out here (see the report on
        // issue 7).
        if let Some(g) = granted
            && g.worker == worker_id
            && worker_id != self.fuzz_id
        {
            lease_id = lease_id.wrapping_add(1);
        }
        let job_id = job.or(granted.map(|g| g.job.job_id)).unwrap_or(0);
        let truth = granted.and_then(|g| self.truth.get(&g.job.job_id));
        let n = self.shape.board.len();
        let run_id = run.unwrap_or(&self.run_id).to_owned();
        let chunk = |worker_id: &str, job_id, body| pb::ReportChunk {
            worker_id: worker_id.to_owned(),
            job_id,
            lease_id,
            body,
            run_id: run_id.clone(),
        };
        let mut out = vec![];
        let mut listed = 0u64;
        for c in chunks {
            match c {
                Chunk::Solutions { sub, rows } => {
                    let subs = truth.map_or(0, |t| t.solutions.len());
                    let (index, all) = match (sub, truth) {
                        (Ok(i), Some(t)) if subs > 0 => {
                            let i = i.index(subs);
                            (i as u32, &t.solutions[i][..])
                        }
                        (Ok(i), _) => (i.index(4) as u32, &[][..]),
                        (Err(i), _) => (*i, &[][..]),
                    };
                    let rows = match rows {
                        Rows::True { from, len } => {
                            let count = all.len() / n;
                            let from = from.index(count + 1);
                            let to = (from + len).min(count);
                            all[from * n..to * n].to_vec()
                        }
                        Rows::Reversed => {
                            all.chunks(n).rev().flatten().copied().collect()
                        }
                        Rows::Any(b) => b.clone(),
                    };
                    listed += (rows.len() / n) as u64;
                    out.push(chunk(
                        &worker_id,
                        job_id,
                        Some(pb::report_chunk::Body::Solutions(pb::SolutionBatch {
                            subproblem: index,
                            rows,
                        })),
                    ));
                }
                Chunk::Result {
                    counts,
                    nodes,
                    sent,
                    kernel,
                } => {
                    let true_counts = truth.map_or(vec![], |t| t.counts.clone());
                    let counts = match counts {
                        Counts::Truth => {
                            true_counts.iter().map(pb::SubCounts::from).collect()
                        }
                        Counts::Lie { sub, delta } => {
                            let mut c = true_counts;
                            if !c.is_empty() {
                                // Off by `delta`, never equal to the truth.
                                let i = sub.index(c.len());
                                let d = u128::from(delta.unsigned_abs().max(1));
                                c[i].count = match c[i].count.checked_sub(d) {
                                    Some(less) if *delta < 0 => less,
                                    _ => c[i].count.saturating_add(d),
                                };
                            }
                            c.iter().map(pb::SubCounts::from).collect()
                        }
                        Counts::Wire(w) => w.clone(),
                    };
                    out.push(chunk(
                        &worker_id,
                        job_id,
                        Some(pb::report_chunk::Body::Result(pb::JobResult {
                            counts,
                            nodes: *nodes,
                            solutions_sent: sent.unwrap_or(listed),
                            kernel: kernel.clone(),
                        })),
                    ));
                }
                Chunk::Empty => out.push(chunk(&worker_id, job_id, None)),
                Chunk::Stray {
                    worker_id: other,
                    job_id: other_job,
                } => out.push(chunk(other, *other_job, None)),
            }
        }
        out
    }

    /// Hands back every lease granted in the case, as a worker that stops
    /// would, so that the honest workers need not wait for them to expire.
    async fn release_all(&mut self) -> Result<(), TestCaseError> {
        let mut by_worker: HashMap<&str, Vec<u64>> = HashMap::new();
        for g in &self.granted {
            by_worker.entry(&g.worker).or_default().push(g.lease);
        }
        for (worker_id, leases) in by_worker {
            let reply = self
                .client
                .release(pb::ReleaseRequest {
                    worker_id: worker_id.to_owned(),
                    leases,
                    leaving: false,
                })
                .await;
            proper("release", &reply)?;
        }
        Ok(())
    }
}

/// Runs one case: a coordinator, the fuzzer's calls, then two honest workers
/// to the end of the run. Returns the run's report.
async fn run_case(
    solutions: bool,
    actions: &[Action],
) -> Result<(RunReport, Seen), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    let coord: JoinHandle<nq_coord::Result<RunReport>> = tokio::spawn(nq_coord::run(
        config(dir.path(), solutions),
        listener,
        stop.clone().cancelled_owned(),
    ));
    let mut fuzzer = Fuzzer::new(addr).await;
    for (i, action) in actions.iter().enumerate() {
        fuzzer.act(action).await?;
        prop_assert!(
            !coord.is_finished(),
            "the coordinator stopped after call {i}"
        );
    }
    fuzzer.release_all().await?;
    let honest = (
        Worker::connect_as(addr, "honest-a").await,
        Worker::connect_as(addr, "honest-b").await,
    );
    tokio::join!(honest.0.finish(), honest.1.finish());
    stop.cancel();
    let report = coord
        .await
        .map_err(|e| TestCaseError::fail(format!("the coordinator panicked: {e}")))?
        .map_err(|e| {
            TestCaseError::fail(format!("the coordinator failed: {}", e.chain()))
        })?;
    Ok((report, fuzzer.seen))
}

#[test]
fn arbitrary_messages_never_change_the_count() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut runner = TestRunner::new(ProptestConfig {
        cases: CASES,
        // Every shrinking step is a whole run: keep a failure's report prompt.
        max_shrink_iters: 64,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let seen = std::cell::RefCell::new(Seen::default());
    runner
        .run(&case(), |(solutions, actions)| {
            let (report, s) = rt
                .block_on(async {
                    tokio::time::timeout(LIMIT, run_case(solutions, &actions)).await
                })
                .map_err(|_| TestCaseError::fail("the case did not finish in time"))??;
            prop_assert!(report.complete, "{}", report.summary_line());
            prop_assert_eq!(
                (report.total, report.unique),
                (Q, U),
                "{}",
                report.summary_line()
            );
            // Every job counts the true result. A check, though, needs a
            // second machine that delivers (issue 26): one honest worker
            // whose leases were taken back before its first copy (a 300 ms
            // lifetime against a debug build's jobs) is not at work, and if
            // the other settles every job meanwhile, the run ends
            // `unchecked` with the same count. Any other status is a failure.
            prop_assert!(
                matches!(report.status(), RunStatus::Complete | RunStatus::Unchecked),
                "{:?}: {}",
                report.status(),
                report.why()
            );
            let mut seen = seen.borrow_mut();
            seen.accepted += s.accepted;
            seen.honest_conflicts += s.honest_conflicts;
            for (code, n) in s.refused {
                *seen.refused.entry(code).or_default() += n;
            }
            Ok(())
        })
        .unwrap();
    let seen = seen.into_inner();
    eprintln!("fuzzed reports: {seen:?}");
    assert!(
        seen.accepted > 0
            && seen.refused.contains_key(&tonic::Code::PermissionDenied)
            && seen.refused.contains_key(&tonic::Code::InvalidArgument),
        "the generated reports no longer reach every stage: {seen:?}"
    );
}
