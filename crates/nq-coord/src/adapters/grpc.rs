//! The gRPC adapter: [`CoordinatorService`] implements
//! `pb::coordinator_server::Coordinator` by translating each call for the
//! `Engine`, and `start` serves it with the health and reflection
//! services.
//!
//! Errors become `tonic::Status` in ONE place, `impl From<Error> for Status`
//! below: bad input is `INVALID_ARGUMENT`, an unknown worker or a protocol
//! mismatch `FAILED_PRECONDITION` (register again), a report not bound to a
//! lease of this session or a banned worker `PERMISSION_DENIED` (drop it), a
//! busy job or a shutdown `UNAVAILABLE` (retryable), and everything else
//! `INTERNAL`, logged first.
//!
//! A report takes the engine's one pipeline: `Engine::admit` (bound to a
//! lease of this session, this worker, this job, this run), `receive`
//! here (the stream, with solutions checked and stored as they come), then
//! `Engine::accept` (checked, judged against the job's other copies, made
//! durable, acknowledged). A `ReportBatch` item takes the same pipeline
//! without the stream: each item alone, so that a refused item is answered
//! in its own ack and changes nothing, while the commits of one call overlap
//! and share a flush.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nq_proto::pb;
use nq_proto::pb::coordinator_server::CoordinatorServer;
use nq_store::JobId;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status, Streaming};
use tracing::{debug, error, info, instrument, warn};

use crate::adapters::in_flight::InFlight;
use crate::adapters::security::{self, Admission, CallerCheck};
use crate::core::allowance::StreamDeadlines;
use crate::core::lease::{LeaseId, WorkerId};
use crate::core::ledger::Verified;
use crate::core::scheduler::{Claim, Outcome};
use crate::core::tag::Caller;
use crate::engine::solutions::SolutionWriter;
use crate::engine::{Admitted, Engine, Submission, blocking};
use crate::error::{Error, ReportFault};

/// How long an idle worker waits before asking again, at most.
const RETRY_AFTER_MS: u64 = 500;

/// How often a report stream that holds a job's claim, while it waits for a
/// chunk, checks that its lease is still live.
const CLAIM_CHECK: Duration = Duration::from_millis(250);

/// The coordinator's gRPC service. Built by [`crate::run`].
#[derive(Debug, Clone)]
pub struct CoordinatorService {
    engine: Arc<Engine>,
}

impl CoordinatorService {
    pub(crate) fn new(engine: Arc<Engine>) -> CoordinatorService {
        CoordinatorService { engine }
    }

    fn ttl_ms(&self) -> u64 {
        u64::try_from(self.engine.ttl.as_millis()).unwrap_or(u64::MAX)
    }

    /// How long an idle worker waits before it asks again: a poll's time,
    /// well inside a heartbeat (a third of the lease lifetime).
    fn retry_after(&self) -> Duration {
        Duration::from_millis(RETRY_AFTER_MS.min(self.ttl_ms() / 3).max(1))
    }

    /// The stages of one `ReportBatch` item before its commit: admission
    /// under the call's worker and run ids, the job's definition, and the
    /// check of its counts ([`Engine::check`]).
    ///
    /// # Errors
    ///
    /// As [`Engine::admit`], [`Engine::definition`] and [`Engine::check`];
    /// the item is then refused alone.
    fn batch_item(
        &self,
        worker: &str,
        run: &str,
        item: pb::JobReport,
    ) -> crate::Result<(Admitted, Verified)> {
        let admitted = self.engine.admit(worker, item.job_id, item.lease_id, run)?;
        let result = item.result.ok_or(Error::BadReport {
            job: admitted.job,
            fault: ReportFault::ItemWithoutResult,
        })?;
        // The caller runs the whole batch off the async threads.
        let definition = self.engine.definition(admitted.job)?;
        let verified =
            self.engine
                .check(&admitted, &definition, submission(result, None)?)?;
        Ok((admitted, verified))
    }
}

impl From<Error> for Status {
    fn from(e: Error) -> Status {
        let msg = e.chain();
        match &e {
            Error::ProtocolVersion { .. } | Error::UnknownWorker { .. } => {
                Status::failed_precondition(msg)
            }
            // Logged by the handler, which knows the caller's address.
            Error::Refused(_) => Status::permission_denied(msg),
            Error::UnknownJob { .. }
            | Error::BadReport { .. }
            | Error::WorkerName { .. }
            | Error::EmptyReport
            | Error::BatchTooLarge { .. }
            | Error::BatchOfSolutionsRun
            | Error::Convert(_) => {
                warn!(error = %msg, "rejected a request");
                Status::invalid_argument(msg)
            }
            Error::Busy { .. } | Error::ShuttingDown => Status::unavailable(msg),
            // Retryable for an honest worker: it computes the job again
            // under a new lease.
            Error::ReportDeadline { .. } => {
                warn!(error = %msg, "ended a report stream");
                Status::deadline_exceeded(msg)
            }
            Error::ClaimOutlivedLease { .. } => {
                warn!(error = %msg, "ended a report stream");
                Status::aborted(msg)
            }
            _ => {
                error!(error = %msg, "internal error");
                Status::internal(msg)
            }
        }
    }
}

#[tonic::async_trait]
impl pb::coordinator_server::Coordinator for CoordinatorService {
    #[instrument(skip_all, fields(name = %request.get_ref().name))]
    async fn register(
        &self,
        request: Request<pb::RegisterRequest>,
    ) -> Result<Response<pb::RegisterResponse>, Status> {
        let peer = request.remote_addr();
        let credential = credential_of(&request);
        let req = request.into_inner();
        // Names are logged and kept for the session: bound them.
        if req.name.len() > crate::error::MAX_NAME {
            return Err(Error::WorkerName {
                len: req.name.len(),
            }
            .into());
        }
        if req.protocol_version != nq_proto::PROTOCOL_VERSION {
            return Err(Error::ProtocolVersion {
                worker: req.protocol_version,
                coordinator: nq_proto::PROTOCOL_VERSION,
            }
            .into());
        }
        // Every call gets a fresh id, even for a known name: a restarted worker
        // cannot prove it is the same one, and its old leases simply expire.
        let claim = Claim {
            threads: req.threads,
            gpu_jobs: req.gpu_jobs,
        };
        let registered = self.engine.core().register(
            &req.name,
            claim,
            peer.map(|p| p.ip()),
            credential.as_deref(),
            Instant::now(),
        );
        let worker = registered.inspect_err(|e| refused(e, peer))?;
        info!(
            worker = %worker,
            peer = ?peer,
            credential = credential.as_deref().unwrap_or("none (its address)"),
            threads = req.threads,
            gpu_jobs = req.gpu_jobs,
            version = %req.program_version,
            "worker registered"
        );
        Ok(Response::new(pb::RegisterResponse {
            worker_id: worker.0,
            run: Some(self.engine.shape.to_pb(&self.engine.run_id)),
            protocol_version: nq_proto::PROTOCOL_VERSION,
            lease_ttl_ms: self.ttl_ms(),
        }))
    }

    #[instrument(skip_all, fields(worker = %request.get_ref().worker_id))]
    async fn lease(
        &self,
        request: Request<pb::LeaseRequest>,
    ) -> Result<Response<pb::LeaseResponse>, Status> {
        // This call is the worker's only heartbeat: renewing `held` is as
        // important as granting new jobs, so it is done even when the
        // scheduler is closed or the run complete.
        let peer = request.remote_addr();
        let caller = caller_of(&request);
        let req = request.into_inner();
        let worker = WorkerId(req.worker_id);
        let held: Vec<LeaseId> = req.held.iter().map(|&l| LeaseId(l)).collect();
        self.engine
            .recognize(&worker, &caller, &[])
            .inspect_err(|e| refused(e, peer))?;
        let (mut grant, mut definitions) = self
            .engine
            .grant(&worker, req.want, &held, Instant::now())
            .inspect_err(|e| refused(e, peer))?;
        let idle = grant.starved && !grant.run_complete;
        if idle {
            // An idle worker's call (room for jobs, none to give) is held
            // until the run ends, for a poll's time at most: it hears of the
            // end at once, so the linger that waits for it to be told ends
            // with the last job instead of up to a poll later (a quarter of
            // a second in a two-second run). A worker at its cap is answered
            // at once: holding its heartbeat would gain nothing.
            self.engine.until_the_end_or(self.retry_after()).await;
            (grant, definitions) = self
                .engine
                .grant(&worker, req.want, &held, Instant::now())
                .inspect_err(|e| refused(e, peer))?;
        }
        let mut jobs = Vec::with_capacity(grant.jobs.len());
        for (g, stored) in grant.jobs.iter().zip(definitions) {
            jobs.push(pb::Job {
                job_id: g.job.0,
                lease_id: g.lease.0,
                subproblems: stored
                    .prefixes()
                    .map(|rows| pb::SubProblem {
                        rows: rows.to_vec(),
                    })
                    .collect(),
                estimated_work: stored.work(),
                kernel: g.kernel.wire().to_owned(),
            });
        }
        // Idle workers poll twice a second at most: often enough to pick up
        // expired jobs promptly, rarely enough that a thousand idle workers
        // cost nothing. A call already held for a poll's time asks again
        // at once.
        let retry_after_ms = if jobs.is_empty() && !grant.run_complete && !idle {
            u64::try_from(self.retry_after().as_millis()).unwrap_or(u64::MAX)
        } else if jobs.is_empty() && !grant.run_complete {
            1
        } else {
            0
        };
        Ok(Response::new(pb::LeaseResponse {
            jobs,
            run_complete: grant.run_complete,
            revoked: grant.revoked.iter().map(|l| l.0).collect(),
            retry_after_ms,
            lease_ttl_ms: self.ttl_ms(),
        }))
    }

    #[instrument(skip_all, fields(worker, job))]
    async fn report(
        &self,
        request: Request<Streaming<pb::ReportChunk>>,
    ) -> Result<Response<pb::ReportAck>, Status> {
        let peer = request.remote_addr();
        let caller = caller_of(&request);
        let mut stream = request.into_inner();
        let started = Instant::now();
        // Before the first chunk the job is unknown: the smallest deadlines.
        let opening = StreamDeadlines::for_job(self.engine.ttl, 1, Duration::ZERO);
        let opening = Limits {
            deadlines: opening,
            started,
            lease: LeaseId(0),
            claim: None,
        };
        let first = next_chunk(&mut stream, JobId(0), &opening)
            .await?
            .ok_or(Error::EmptyReport)?;
        let span = tracing::Span::current();
        span.record("worker", first.worker_id.as_str());
        span.record("job", first.job_id);
        let lease = (JobId(first.job_id), LeaseId(first.lease_id));
        self.engine
            .recognize(&WorkerId(first.worker_id.clone()), &caller, &[lease])
            .inspect_err(|e| refused(e, peer))?;
        let admitted = self
            .engine
            .admit(
                &first.worker_id,
                first.job_id,
                first.lease_id,
                &first.run_id,
            )
            .inspect_err(|e| refused(e, peer))?;
        let job = admitted.job;
        let engine = Arc::clone(&self.engine);
        let definition = tokio::task::spawn_blocking(move || engine.definition(job))
            .await
            .map_err(Error::from)??;
        let writer = if self.engine.shape.solutions {
            Some(blocking(|| {
                SolutionWriter::open(&self.engine, job, &definition.subs)
            })?)
        } else {
            None
        };
        let deadlines = StreamDeadlines::for_job(
            self.engine.ttl,
            definition.subs.len(),
            self.engine
                .core()
                .workers()
                .expected(admitted.issued.identity),
        );
        // A stream that holds the job's claim ends with its lease, so that
        // the job's next holder is never refused as busy past the lease.
        let lease = admitted.lease;
        let engine = Arc::clone(&self.engine);
        let live = move || engine.core().leases().is_live(lease);
        let claim = writer
            .as_ref()
            .is_some_and(SolutionWriter::stores)
            .then_some(&live as &(dyn Fn() -> bool + Send + Sync));
        let limits = Limits {
            deadlines,
            started,
            lease,
            claim,
        };
        let result = receive(first, &mut stream, writer.as_ref(), &limits).await?;
        let submission = submission(result, writer.as_ref())?;
        // Returns once the copy is judged and durable: the ack is the
        // worker's permission to forget the job.
        let accepted = self
            .engine
            .accept(&admitted, &definition, submission)
            .await?;
        // The claim on the job's solutions ends only now that the result is
        // durable.
        drop(writer);
        Ok(Response::new(pb::ReportAck {
            outcome: outcome_pb(accepted.outcome).into(),
            run_complete: accepted.run_complete,
        }))
    }

    /// Each item takes the path of a one-job `report` (admit, check, commit,
    /// acknowledge) on its own; only the commits overlap, so that the
    /// items join the same group commit and the call costs one flush.
    #[instrument(
        skip_all,
        fields(worker = %request.get_ref().worker_id, items = request.get_ref().reports.len())
    )]
    async fn report_batch(
        &self,
        request: Request<pb::ReportBatchRequest>,
    ) -> Result<Response<pb::ReportBatchResponse>, Status> {
        let peer = request.remote_addr();
        let caller = caller_of(&request);
        let req = request.into_inner();
        if req.reports.len() > nq_proto::MAX_REPORT_BATCH {
            return Err(Error::BatchTooLarge {
                items: req.reports.len(),
                max: nq_proto::MAX_REPORT_BATCH,
            }
            .into());
        }
        // Solutions travel only on the Report stream.
        if self.engine.shape.solutions {
            return Err(Error::BatchOfSolutionsRun.into());
        }
        let leases: Vec<(JobId, LeaseId)> = (req.reports.iter())
            .map(|r| (JobId(r.job_id), LeaseId(r.lease_id)))
            .collect();
        self.engine
            .recognize(&WorkerId(req.worker_id.clone()), &caller, &leases)
            .inspect_err(|e| refused(e, peer))?;
        let mut acks: Vec<pb::JobReportAck> = req
            .reports
            .iter()
            .map(|r| pb::JobReportAck {
                job_id: r.job_id,
                lease_id: r.lease_id,
                ..pb::JobReportAck::default()
            })
            .collect();
        // Every item's job is read and checked in one step off the async
        // threads (one hand-off per call, not per item).
        let checked: Vec<_> = blocking(|| {
            req.reports
                .into_iter()
                .map(|item| self.batch_item(&req.worker_id, &req.run_id, item))
                .collect()
        });
        let mut committing = Vec::with_capacity(checked.len());
        let mut copies = Vec::with_capacity(checked.len());
        for (i, item) in checked.into_iter().enumerate() {
            match item {
                Ok((_, verified)) => {
                    committing.push(i);
                    copies.push(verified);
                }
                Err(e) => {
                    refused(&e, peer);
                    refuse(&mut acks[i], e);
                }
            }
        }
        // The checked items go to the commit loop as one request; dropping
        // this call (the caller hung up) drops the wait, not the commit
        // already queued, as for a dropped Report.
        let worker = WorkerId(req.worker_id);
        let items = copies.len();
        let accepted = match self.engine.commit_all(&worker, copies).await {
            Ok(accepted) => accepted,
            // The commit loop stopped: each item is refused as a one-job
            // Report of it would be, and the worker sends it again later.
            Err(_) => (0..items).map(|_| Err(Error::ShuttingDown)).collect(),
        };
        let mut run_complete = false;
        let mut stored = 0usize;
        for (i, accepted) in committing.into_iter().zip(accepted) {
            match accepted {
                Ok(a) => {
                    stored += 1;
                    acks[i].outcome = outcome_pb(a.outcome).into();
                    run_complete |= a.run_complete;
                }
                Err(e) => refuse(&mut acks[i], e),
            }
        }
        debug!(items = acks.len(), stored, run_complete, "report batch");
        Ok(Response::new(pb::ReportBatchResponse {
            acks,
            run_complete,
        }))
    }

    #[instrument(skip_all, fields(worker = %request.get_ref().worker_id))]
    async fn release(
        &self,
        request: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::ReleaseResponse>, Status> {
        let peer = request.remote_addr();
        let caller = caller_of(&request);
        let req = request.into_inner();
        let worker = WorkerId(req.worker_id);
        let leases: Vec<LeaseId> = req.leases.iter().map(|&l| LeaseId(l)).collect();
        self.engine
            .recognize(&worker, &caller, &[])
            .inspect_err(|e| refused(e, peer))?;
        let released = if req.leaving {
            info!(worker = %worker.0, "worker drained and leaves the run");
            self.engine.leave(&worker)
        } else {
            self.engine.release(&worker, &leases)
        };
        if !released.is_empty() {
            info!(jobs = released.len(), "worker released leases");
        }
        Ok(Response::new(pb::ReleaseResponse {
            released: released.len() as u32,
        }))
    }

    /// Open to anyone who can reach the port (no registration): it reveals
    /// the run's progress and the workers' names and addresses, nothing
    /// that lets a caller change the run. The HTTP port (`--metrics`)
    /// routes this call, and only this one, here too.
    async fn status(
        &self,
        _request: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        Ok(Response::new(self.engine.snapshot().to_pb()))
    }
}

/// The credential a caller votes as (see [`crate::credentials`]): its client
/// certificate under mutual TLS, else the name of the per-machine token its
/// calls carry, else none (its address is its identity).
fn credential_of<T>(request: &Request<T>) -> Option<String> {
    if let Some(certs) = request.peer_certs()
        && let Some(leaf) = certs.first()
    {
        return Some(crate::credentials::certificate_identity(leaf.as_ref()));
    }
    request
        .extensions()
        .get::<security::Credential>()
        .map(|c| c.0.clone())
}

/// What a call proves about its caller: its credential (as
/// [`credential_of`]) and its address, as registration resolves them, so
/// that a worker id is checked against the same caller it was issued to
/// ([`Engine::recognize`]).
fn caller_of<T>(request: &Request<T>) -> Caller {
    Caller {
        credential: credential_of(request),
        address: request.remote_addr().map(|p| p.ip()),
    }
}

/// Logs a refused call with the caller's address (a stranger, a confused
/// worker, or a banned one); other errors are logged where they are mapped.
fn refused(e: &Error, peer: Option<SocketAddr>) {
    if let Error::Refused(r) = e {
        warn!(peer = ?peer, reason = %r, "refused a call");
    }
}

/// A result chunk as the engine takes it: its counts converted from the
/// wire, with the writer that received its solutions (solutions mode).
///
/// # Errors
///
/// [`Error::Convert`] for a count that is not one.
fn submission(
    result: pb::JobResult,
    writer: Option<&SolutionWriter>,
) -> crate::Result<Submission<'_>> {
    let counts = result
        .counts
        .into_iter()
        .map(TryFrom::try_from)
        .collect::<Result<Vec<_>, _>>()
        .map_err(Error::from)?;
    Ok(Submission {
        counts,
        nodes: result.nodes,
        solutions_sent: result.solutions_sent,
        kernel: result.kernel,
        writer,
    })
}

/// The wire form of a copy's outcome.
fn outcome_pb(outcome: Outcome) -> pb::report_ack::Outcome {
    match outcome {
        Outcome::Accepted => pb::report_ack::Outcome::Accepted,
        Outcome::Confirmed => pb::report_ack::Outcome::Confirmed,
        Outcome::Conflict => pb::report_ack::Outcome::Conflict,
    }
}

/// Answers a refused `ReportBatch` item with the status a one-job `Report`
/// of it would have got (mapped, and logged, as every error is).
fn refuse(ack: &mut pb::JobReportAck, e: Error) {
    let status = Status::from(e);
    ack.code = status.code() as i32;
    ack.message = status.message().to_owned();
    ack.outcome = pb::report_ack::Outcome::Unspecified.into();
}

/// The receiving stage: reads the report stream to its result chunk. Every
/// chunk must name the first chunk's worker, job, lease and run; solution
/// batches go to `writer` (checked and stored as they arrive, under the job's
/// claim, so memory does not grow with a job's solutions). The stream must end
/// after the result.
///
/// # Errors
///
/// [`Error::BadReport`] naming the fault; transport errors.
async fn receive(
    first: pb::ReportChunk,
    stream: &mut Streaming<pb::ReportChunk>,
    writer: Option<&SolutionWriter>,
    limits: &Limits<'_>,
) -> Result<pb::JobResult, Status> {
    let job = JobId(first.job_id);
    let bad = |fault| Error::BadReport { job, fault };
    let ids = (
        first.worker_id.clone(),
        first.job_id,
        first.lease_id,
        first.run_id.clone(),
    );
    let mut chunk = Some(first);
    let result = loop {
        let c = match chunk.take() {
            Some(c) => c,
            None => next_chunk(stream, job, limits)
                .await?
                .ok_or(bad(ReportFault::MissingResult))?,
        };
        if (&c.worker_id, c.job_id, c.lease_id, &c.run_id)
            != (&ids.0, ids.1, ids.2, &ids.3)
        {
            return Err(bad(ReportFault::MixedIds).into());
        }
        match c.body {
            Some(pb::report_chunk::Body::Solutions(batch)) => match writer {
                Some(w) => blocking(|| w.batch(batch.subproblem, &batch.rows))?,
                None => return Err(bad(ReportFault::SolutionsNotWanted).into()),
            },
            Some(pb::report_chunk::Body::Result(r)) => break r,
            None => return Err(bad(ReportFault::EmptyChunk).into()),
        }
    };
    // The contract says the stream ends after the result; a sender that goes
    // on is confused, and nothing of its report is kept.
    let unclaimed = Limits {
        claim: None,
        ..*limits
    };
    if next_chunk(stream, job, &unclaimed).await?.is_some() {
        return Err(bad(ReportFault::ChunkAfterResult).into());
    }
    Ok(result)
}

/// What bounds one report stream.
#[derive(Clone, Copy)]
struct Limits<'a> {
    deadlines: StreamDeadlines,
    /// When the call began.
    started: Instant,
    /// The lease the stream reports under.
    lease: LeaseId,
    /// Solutions mode, when the stream holds the job's claim: true while its
    /// lease is live.
    claim: Option<&'a (dyn Fn() -> bool + Send + Sync)>,
}

/// The next chunk of a report stream of `job`, within the deadlines of
/// `limits` counted from its start (total) and from now (idle); with a
/// claim, the stream also ends as soon as its lease is no longer live
/// (checked every [`CLAIM_CHECK`] while it waits).
///
/// # Errors
///
/// [`Error::ReportDeadline`], [`Error::ClaimOutlivedLease`], or the
/// transport's error.
async fn next_chunk(
    stream: &mut Streaming<pb::ReportChunk>,
    job: JobId,
    limits: &Limits<'_>,
) -> Result<Option<pb::ReportChunk>, Status> {
    let Limits {
        deadlines,
        started,
        lease,
        claim,
    } = *limits;
    let waiting = Instant::now();
    let idle_end = waiting + deadlines.idle;
    let total_end = started + deadlines.total;
    loop {
        if let Some(live) = claim
            && !live()
        {
            return Err(Error::ClaimOutlivedLease { job, lease }.into());
        }
        let now = Instant::now();
        let (end, which, limit) = if total_end <= idle_end {
            (total_end, "total", deadlines.total)
        } else {
            (idle_end, "idle", deadlines.idle)
        };
        if now >= end {
            return Err(Error::ReportDeadline { job, which, limit }.into());
        }
        let mut wait = end - now;
        if claim.is_some() {
            wait = wait.min(CLAIM_CHECK);
        }
        if let Ok(next) = tokio::time::timeout(wait, stream.message()).await {
            return next;
        }
    }
}

/// Who may call the coordinator's service: see
/// [`Config::token`](crate::Config::token) and
/// [`Config::tls`](crate::Config::tls).
#[derive(Debug)]
pub(crate) struct Guard {
    pub(crate) token: Option<nq_proto::auth::Token>,
    /// See [`Config::worker_tokens`](crate::Config::worker_tokens).
    pub(crate) worker_tokens: Option<Arc<crate::credentials::WorkerTokens>>,
    pub(crate) tls: Option<nq_proto::tls::ServerTls>,
    /// See [`Config::insecure_open_port`](crate::Config::insecure_open_port).
    pub(crate) insecure_open_port: bool,
}

/// Starts serving `engine` on `listener` (see [`serve`]) and says SERVING on
/// the health service; returns the health reporter (for the shutdown) and
/// the server's task. `in_flight` counts the calls in flight.
pub(crate) async fn start(
    engine: Arc<Engine>,
    listener: TcpListener,
    guard: Guard,
    in_flight: InFlight,
    token: CancellationToken,
) -> (
    tonic_health::server::HealthReporter,
    JoinHandle<crate::Result<()>>,
) {
    let (health, health_service) = tonic_health::server::health_reporter();
    let server = tokio::spawn(serve(
        engine,
        listener,
        health_service,
        guard,
        in_flight,
        token,
    ));
    health
        .set_serving::<CoordinatorServer<CoordinatorService>>()
        .await;
    (health, server)
}

/// Says NOT_SERVING on the health service: the first step of the shutdown.
pub(crate) async fn not_serving(health: &mut tonic_health::server::HealthReporter) {
    health
        .set_not_serving::<CoordinatorServer<CoordinatorService>>()
        .await;
}

/// Serves the coordinator, health and reflection services until `token` is
/// cancelled, then lets in-flight RPCs finish; `in_flight` counts them.
///
/// `guard` decides who may call the coordinator's service
/// ([`security::Admission`]: the token, or TLS, or loopback peers only unless
/// the port was opened by hand); health and reflection stay open, for probes
/// and `grpcurl list`. With `guard.tls`, the port speaks TLS only.
async fn serve(
    engine: Arc<Engine>,
    listener: TcpListener,
    health: tonic_health::pb::health_server::HealthServer<
        impl tonic_health::pb::health_server::Health,
    >,
    guard: Guard,
    in_flight: InFlight,
    token: CancellationToken,
) -> crate::Result<()> {
    let admission =
        Admission::new(guard.token, guard.tls.is_some(), guard.insecure_open_port);
    if let Ok(addr) = listener.local_addr() {
        security::announce_exposure(
            addr,
            &admission,
            guard.tls.is_some(),
            guard.worker_tokens.is_some(),
        );
    }
    if let Some(tls) = &guard.tls {
        info!(mutual = tls.mutual(), "serving TLS");
    }
    let service = CoordinatorServer::new(CoordinatorService::new(engine))
        .max_decoding_message_size(nq_proto::MAX_MESSAGE_BYTES)
        .max_encoding_message_size(nq_proto::MAX_MESSAGE_BYTES);
    let check = CallerCheck::new(admission).with_worker_tokens(guard.worker_tokens);
    let service = InterceptedService::new(service, check);
    // The descriptor set is compiled from our own proto at build time, and a
    // test lists the services through it: decoding it cannot fail at run time.
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(nq_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 = reflection()
        .build_v1()
        .expect("the built-in descriptor sets decode");
    // grpcurl and older tools still ask the v1alpha service.
    let reflection_v1alpha = reflection()
        .build_v1alpha()
        .expect("the built-in descriptor sets decode");
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let mut builder = Server::builder();
    if let Some(tls) = &guard.tls {
        builder = builder.tls_config(tls.config())?;
    }
    builder
        // Detects dead connections, so that a report stuck on a vanished
        // worker does not hold its job's claim forever.
        .http2_keepalive_interval(Some(Duration::from_secs(20)))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        .layer(in_flight)
        .add_service(health)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(service)
        .serve_with_incoming_shutdown(incoming, token.cancelled_owned())
        .await?;
    Ok(())
}
