//! [`ProtocolWorker`]: a worker driven call by call over real gRPC, for tests
//! that must send what an honest `nq-worker` never would (a forged lease, a
//! report for another run, a wrong count) and for the `nq-liar` test double.
//!
//! It computes with `nq-core` exactly as `nq-worker` does, so a test can send
//! the right counts under the wrong ids, or wrong counts under the right ones.
//!
//! A [`Dial`] says how it reaches the coordinator: besides the address, the
//! token it presents (as `nq-worker` does, `authorization: Bearer <token>`)
//! and the source address it calls from, so that one machine can pose as
//! several (issue 18, attack 1).

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::AtomicBool;

use anyhow::{Context, Result};
use nq_core::search::Kernel;
use nq_core::split::SubCounts;
use nq_proto::auth::{Bearer, Token};
use nq_proto::convert::RunShape;
use nq_proto::pb;
use nq_proto::pb::coordinator_client::CoordinatorClient;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

/// How a [`ProtocolWorker`] reaches the coordinator.
#[derive(Debug, Clone)]
pub struct Dial {
    /// The coordinator.
    pub addr: SocketAddr,
    /// The local address to call from; `None` lets the kernel pick it.
    /// Binding a secondary address of the machine makes the coordinator see
    /// another peer address from the same machine.
    pub source: Option<IpAddr>,
    /// Sent on every call as `authorization: Bearer <token>`: the run's
    /// shared token or a per-worker one (`--worker-tokens`).
    pub token: Option<Token>,
}

impl From<SocketAddr> for Dial {
    /// The coordinator at `addr`, called from the address the kernel picks,
    /// with no token.
    fn from(addr: SocketAddr) -> Dial {
        Dial {
            addr,
            source: None,
            token: None,
        }
    }
}

/// The gRPC client of a [`ProtocolWorker`]: every call carries its token.
pub type Client = CoordinatorClient<InterceptedService<Channel, Bearer>>;

/// A registered worker that makes one protocol call per method.
#[derive(Debug, Clone)]
pub struct ProtocolWorker {
    /// The gRPC client (public so tests can make calls this type lacks).
    pub client: Client,
    /// The name it registered under.
    pub name: String,
    /// The worker id of its registration.
    pub id: String,
    /// The run id of its registration.
    pub run_id: String,
    /// The run's board and split.
    pub shape: RunShape,
}

impl ProtocolWorker {
    /// Connects to `addr` and registers as `name`.
    ///
    /// # Errors
    ///
    /// When the connection or the registration fails (the status is kept as
    /// the error's source, for [`status_of`]).
    pub async fn register(addr: SocketAddr, name: &str) -> Result<ProtocolWorker> {
        ProtocolWorker::register_via(&Dial::from(addr), name).await
    }

    /// Connects as `dial` says (source address, token) and registers as
    /// `name`.
    ///
    /// # Errors
    ///
    /// As [`ProtocolWorker::register`]; also when the source address cannot
    /// be bound (it is not an address of this machine).
    pub async fn register_via(dial: &Dial, name: &str) -> Result<ProtocolWorker> {
        let addr = dial.addr;
        let channel = Endpoint::from_shared(format!("http://{addr}"))
            .with_context(|| format!("{addr} is not a valid endpoint"))?
            .local_address(dial.source)
            .connect()
            .await
            .with_context(|| match dial.source {
                Some(source) => format!("cannot connect to {addr} from {source}"),
                None => format!("cannot connect to {addr}"),
            })?;
        let mut client =
            CoordinatorClient::with_interceptor(channel, Bearer(dial.token.clone()))
                .max_decoding_message_size(nq_proto::MAX_MESSAGE_BYTES)
                .max_encoding_message_size(nq_proto::MAX_MESSAGE_BYTES);
        let reg = client
            .register(pb::RegisterRequest {
                protocol_version: nq_proto::PROTOCOL_VERSION,
                name: name.to_owned(),
                threads: 1,
                program_version: concat!("nq-e2e ", env!("CARGO_PKG_VERSION")).into(),
                gpu_jobs: 0,
            })
            .await?
            .into_inner();
        let run = reg.run.context("RegisterResponse without a run")?;
        let shape = RunShape::try_from(&run).context("the run's shape is invalid")?;
        Ok(ProtocolWorker {
            client,
            name: name.to_owned(),
            id: reg.worker_id,
            run_id: run.run_id,
            shape,
        })
    }

    /// Asks for up to `want` jobs, renewing nothing.
    ///
    /// # Errors
    ///
    /// The call's status.
    pub async fn lease(&mut self, want: u32) -> Result<pb::LeaseResponse, tonic::Status> {
        let request = pb::LeaseRequest {
            worker_id: self.id.clone(),
            want,
            held: vec![],
        };
        Ok(self.client.lease(request).await?.into_inner())
    }

    /// Leases until it gets a job (waiting as the coordinator says between
    /// empty answers), or `None` when the run is complete.
    ///
    /// # Errors
    ///
    /// The first failed call's status.
    pub async fn lease_one(&mut self) -> Result<Option<pb::Job>, tonic::Status> {
        loop {
            let resp = self.lease(1).await?;
            if let Some(job) = resp.jobs.into_iter().next() {
                return Ok(Some(job));
            }
            if resp.run_complete {
                return Ok(None);
            }
            // The protocol's own pacing: the coordinator names the wait.
            tokio::time::sleep(std::time::Duration::from_millis(
                resp.retry_after_ms.max(10),
            ))
            .await;
        }
    }

    /// The true counts of `job`'s sub-problems, on the kernel the job asks
    /// for (`"scalar"`) or the fastest one, and that kernel's name.
    ///
    /// # Errors
    ///
    /// When a sub-problem is invalid for the run.
    pub fn solve(&self, job: &pb::Job) -> Result<(Vec<SubCounts>, &'static str)> {
        let kernel = if job.kernel == "scalar" {
            Kernel::Scalar
        } else {
            Kernel::Auto
        };
        let never = AtomicBool::new(false);
        let counts =
            job.subproblems
                .iter()
                .map(|s| {
                    let sub = self.shape.subproblem(s).with_context(|| {
                        format!("job {}: bad sub-problem", job.job_id)
                    })?;
                    let (counts, _) = sub
                        .solve_with(kernel, &never)
                        .context("a search that is never stopped stopped")?;
                    Ok(counts)
                })
                .collect::<Result<Vec<_>>>()?;
        Ok((counts, kernel.resolved_name()))
    }

    /// The one chunk of a count report of `job` under its own lease, this
    /// worker's id and run id. Tests alter fields before sending it.
    pub fn result_chunk(
        &self,
        job: &pb::Job,
        counts: &[SubCounts],
        kernel: &str,
    ) -> pb::ReportChunk {
        pb::ReportChunk {
            worker_id: self.id.clone(),
            job_id: job.job_id,
            lease_id: job.lease_id,
            body: Some(pb::report_chunk::Body::Result(pb::JobResult {
                counts: counts.iter().map(pb::SubCounts::from).collect(),
                nodes: 0,
                solutions_sent: 0,
                kernel: kernel.to_owned(),
            })),
            run_id: self.run_id.clone(),
        }
    }

    /// Sends a one-chunk report.
    ///
    /// # Errors
    ///
    /// The call's status.
    pub async fn send(
        &mut self,
        chunk: pb::ReportChunk,
    ) -> Result<pb::ReportAck, tonic::Status> {
        Ok(self
            .client
            .report(tokio_stream::iter([chunk]))
            .await?
            .into_inner())
    }
}

impl ProtocolWorker {
    /// One `ReportBatch` item: the result of `job` under its own lease.
    /// Tests alter fields before sending it.
    pub fn batch_item(
        &self,
        job: &pb::Job,
        counts: &[SubCounts],
        kernel: &str,
    ) -> pb::JobReport {
        pb::JobReport {
            job_id: job.job_id,
            lease_id: job.lease_id,
            result: Some(pb::JobResult {
                counts: counts.iter().map(pb::SubCounts::from).collect(),
                nodes: 0,
                solutions_sent: 0,
                kernel: kernel.to_owned(),
            }),
        }
    }

    /// Sends one `ReportBatch` call with `items`, under this worker's id and
    /// run id.
    ///
    /// # Errors
    ///
    /// The call's status (a refused item is not an error: it is answered in
    /// its ack).
    pub async fn send_batch(
        &mut self,
        items: Vec<pb::JobReport>,
    ) -> Result<pb::ReportBatchResponse, tonic::Status> {
        let request = pb::ReportBatchRequest {
            worker_id: self.id.clone(),
            run_id: self.run_id.clone(),
            reports: items,
        };
        Ok(self.client.report_batch(request).await?.into_inner())
    }
}

/// Changes `counts` into a wrong but plausible result: 8 fewer completions on
/// the first sub-problem that has at least 8 completions beyond its
/// symmetric ones (8 more on the first one when none has). A change of 8 to
/// `count` alone keeps every invariant `SubProblem::check` tests (fixed ≤
/// count, completions in pairs, whole symmetry classes of up to 8), and a
/// smaller count stays under any upper bound, so only a second computation
/// can tell the lie from the truth. Returns the index of the altered
/// sub-problem.
///
/// # Panics
///
/// When `counts` is empty (a job has at least one sub-problem).
pub fn lie(counts: &mut [SubCounts]) -> usize {
    match counts.iter().position(|c| c.count >= c.fixed180 + 8) {
        Some(i) => {
            counts[i].count -= 8;
            i
        }
        None => {
            counts[0].count += 8;
            0
        }
    }
}

/// The gRPC status inside an error from this module, if it carries one.
pub fn status_of(e: &anyhow::Error) -> Option<&tonic::Status> {
    e.chain().find_map(|c| c.downcast_ref::<tonic::Status>())
}
