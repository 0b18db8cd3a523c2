//! A minimal gRPC worker for the in-process coordinator tests: registers,
//! leases, solves with nq-core, lists solutions in solutions mode, reports.
//! Shared by `run.rs` and `fuzz_messages.rs`.

// Each test binary includes this module and uses only part of it.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::ops::ControlFlow;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use nq_core::search::{Kernel, Sink};
use nq_core::split::{SubCounts, SubProblem};
use nq_proto::convert::RunShape;
use nq_proto::pb;
use nq_proto::pb::coordinator_client::CoordinatorClient;
use tonic::transport::Channel;

/// A registered worker of one coordinator session.
pub(crate) struct Worker {
    pub(crate) client: CoordinatorClient<Channel>,
    pub(crate) id: String,
    pub(crate) run_id: String,
    pub(crate) shape: RunShape,
}

/// Collects the completions of one sub-problem, concatenated.
struct Rows(Vec<u8>);

impl Sink for Rows {
    fn solution(&mut self, rows: &[u8]) -> ControlFlow<()> {
        self.0.extend_from_slice(rows);
        ControlFlow::Continue(())
    }
}

/// What an honest worker computes for a job: per sub-problem its counts and
/// (in solutions mode) its completions in listing order, and the kernel
/// that counted.
pub(crate) struct Solved {
    pub(crate) counts: Vec<SubCounts>,
    pub(crate) solutions: Vec<Vec<u8>>,
    pub(crate) kernel: &'static str,
}

/// Solves a job's sub-problems, on the scalar kernel when the lease asks
/// for it (as the real worker does), listing completions when `list`.
pub(crate) fn solve(shape: &RunShape, job: &pb::Job, list: bool) -> Solved {
    let kernel = if job.kernel == "scalar" {
        Kernel::Scalar
    } else {
        Kernel::Auto.resolved()
    };
    let subs: Vec<SubProblem> = job
        .subproblems
        .iter()
        .map(|s| {
            shape
                .subproblem(s)
                .expect("the coordinator sends valid sub-problems")
        })
        .collect();
    let counts = subs
        .iter()
        .map(|s| {
            s.solve_with(kernel, &AtomicBool::new(false))
                .expect("never stopped")
                .0
        })
        .collect();
    let solutions = subs
        .iter()
        .map(|s| {
            let mut rows = Rows(Vec::new());
            if list {
                let _ = s.list(&mut rows);
            }
            rows.0
        })
        .collect();
    Solved {
        counts,
        solutions,
        kernel: kernel.name(),
    }
}

impl Worker {
    /// Registers as `test`.
    pub(crate) async fn connect(addr: SocketAddr) -> Worker {
        Worker::connect_as(addr, "test").await
    }

    /// Registers under `name`: workers of different names are different
    /// identities to verification.
    pub(crate) async fn connect_as(addr: SocketAddr, name: &str) -> Worker {
        Worker::register(addr, name, 1).await
    }

    /// Registers under `name` with `threads` threads (the coordinator lets a
    /// worker hold up to four leases per thread).
    pub(crate) async fn register(addr: SocketAddr, name: &str, threads: u32) -> Worker {
        let mut client = CoordinatorClient::connect(format!("http://{addr}"))
            .await
            .unwrap();
        let reg = client
            .register(pb::RegisterRequest {
                protocol_version: nq_proto::PROTOCOL_VERSION,
                name: name.into(),
                threads,
                program_version: "test".into(),
                gpu_jobs: 0,
            })
            .await
            .unwrap()
            .into_inner();
        let run = reg.run.unwrap();
        let shape = RunShape::try_from(&run).unwrap();
        Worker {
            client,
            id: reg.worker_id,
            run_id: run.run_id,
            shape,
        }
    }

    /// The counts of a job, on the kernel it asks for.
    pub(crate) fn solve(&self, job: &pb::Job) -> Vec<SubCounts> {
        solve(&self.shape, job, false).counts
    }

    /// Reports `counts` for `job`, with no solutions.
    pub(crate) async fn report(
        &mut self,
        job: &pb::Job,
        counts: &[SubCounts],
    ) -> Result<pb::ReportAck, tonic::Status> {
        let solved = Solved {
            counts: counts.to_vec(),
            solutions: vec![],
            kernel: "",
        };
        self.report_solved(job, &solved).await
    }

    /// Reports what [`solve`] found: a batch of solutions per sub-problem
    /// that has any, then the result.
    pub(crate) async fn report_solved(
        &mut self,
        job: &pb::Job,
        solved: &Solved,
    ) -> Result<pb::ReportAck, tonic::Status> {
        let n = self.shape.board.len();
        let chunk = |body| pb::ReportChunk {
            worker_id: self.id.clone(),
            job_id: job.job_id,
            lease_id: job.lease_id,
            body: Some(body),
            run_id: self.run_id.clone(),
        };
        let mut chunks = vec![];
        let mut sent = 0;
        for (i, rows) in solved.solutions.iter().enumerate() {
            if !rows.is_empty() {
                sent += (rows.len() / n) as u64;
                chunks.push(chunk(pb::report_chunk::Body::Solutions(
                    pb::SolutionBatch {
                        subproblem: i as u32,
                        rows: rows.clone(),
                    },
                )));
            }
        }
        chunks.push(chunk(pb::report_chunk::Body::Result(pb::JobResult {
            counts: solved.counts.iter().map(pb::SubCounts::from).collect(),
            nodes: 0,
            solutions_sent: sent,
            kernel: solved.kernel.into(),
        })));
        self.client
            .report(tokio_stream::iter(chunks))
            .await
            .map(tonic::Response::into_inner)
    }

    /// Works honestly until the coordinator says the run is complete: leases,
    /// solves (listing solutions in solutions mode) and reports. Waits as
    /// long as the coordinator's `retry_after_ms` says when it has no job to
    /// give; retries a report that gets UNAVAILABLE (another report of the
    /// job is storing its solutions).
    pub(crate) async fn finish(mut self) {
        loop {
            let resp = self
                .client
                .lease(pb::LeaseRequest {
                    worker_id: self.id.clone(),
                    want: 4,
                    held: vec![],
                })
                .await
                .expect("an honest worker is never refused work")
                .into_inner();
            if resp.run_complete {
                return;
            }
            if resp.jobs.is_empty() {
                tokio::time::sleep(Duration::from_millis(resp.retry_after_ms)).await;
                continue;
            }
            for job in &resp.jobs {
                let solved = solve(&self.shape, job, self.shape.solutions);
                let ack = loop {
                    match self.report_solved(job, &solved).await {
                        Err(e) if e.code() == tonic::Code::Unavailable => {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        other => break other.expect("an honest report is accepted"),
                    }
                };
                if ack.run_complete {
                    return;
                }
            }
        }
    }
}
