//! The gRPC service: [`CoordinatorService`] implements
//! `pb::coordinator_server::Coordinator` on top of the session's scheduler,
//! store and committer.
//!
//! Errors become `tonic::Status` in ONE place, `impl From<Error> for Status`
//! below: bad input is `INVALID_ARGUMENT`, an unknown worker or a protocol
//! mismatch `FAILED_PRECONDITION` (register again), a report not bound to a
//! lease of this session or a banned worker `PERMISSION_DENIED` (drop it), a
//! busy job or a shutdown `UNAVAILABLE` (retryable), and everything else
//! `INTERNAL`, logged first.
//!
//! A report goes through stages, each a function of its own: [`admit`]
//! (bound to a lease of this session, this worker, this job, this run),
//! [`receive`] (the stream, with solutions checked and stored as they come),
//! [`check`] (the counts, by [`ledger::verify`]), [`Session::commit`] (judged
//! against the job's other copies and made durable), then [`acknowledge`].
//! A `ReportBatch` item takes the same stages without the stream: each item
//! alone, so that a refused item is answered in its own ack and changes
//! nothing, while the commits of one call overlap and share a flush.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use nq_core::split::SubProblem;
use nq_proto::pb;
use nq_store::{JobId, StoredJob};
use tokio::task::JoinSet;
use tonic::{Request, Response, Status, Streaming};
use tracing::{debug, error, info, instrument, warn};

use crate::error::{Error, ReportFault};
use crate::lease::{LeaseId, WorkerId};
use crate::ledger::{self, Report, SolutionWriter, Verified};
use crate::scheduler::{Issued, Outcome};
use crate::session::{Session, blocking};

/// How long an idle worker waits before asking again, at most.
const RETRY_AFTER_MS: u64 = 500;

/// The coordinator's gRPC service. Built by [`crate::run`].
#[derive(Debug, Clone)]
pub struct CoordinatorService {
    session: Arc<Session>,
}

impl CoordinatorService {
    pub(crate) fn new(session: Arc<Session>) -> CoordinatorService {
        CoordinatorService { session }
    }

    fn ttl_ms(&self) -> u64 {
        u64::try_from(self.session.ttl.as_millis()).unwrap_or(u64::MAX)
    }

    /// The stages of one `ReportBatch` item before its commit: admission
    /// under the call's worker and run ids, the job's sub-problems, the
    /// check of its counts.
    ///
    /// # Errors
    ///
    /// As [`admit`], [`Session::subproblems`] and [`check`]; the item is then
    /// refused alone.
    fn batch_item(
        &self,
        worker: &str,
        run: &str,
        item: pb::JobReport,
    ) -> Result<(Admitted, Verified), Error> {
        let admitted = admit(&self.session, worker, item.job_id, item.lease_id, run)?;
        let result = item.result.ok_or(Error::BadReport {
            job: admitted.job,
            fault: ReportFault::ItemWithoutResult,
        })?;
        // The caller runs the whole batch off the async threads.
        let (stored, subs) = self.session.subproblems(admitted.job)?;
        let verified = check(&self.session, &admitted, &stored, &subs, result, None)?;
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
        let worker = self.session.sched().register(
            &req.name,
            req.threads,
            peer.map(|p| p.ip()),
            Instant::now(),
        );
        info!(
            worker = %worker,
            peer = ?peer,
            threads = req.threads,
            version = %req.program_version,
            "worker registered"
        );
        Ok(Response::new(pb::RegisterResponse {
            worker_id: worker.0,
            run: Some(self.session.shape.to_pb(&self.session.run_id)),
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
        let req = request.into_inner();
        let worker = WorkerId(req.worker_id);
        let held: Vec<LeaseId> = req.held.iter().map(|&l| LeaseId(l)).collect();
        let grant = self
            .session
            .sched()
            .lease(&worker, req.want, &held, Instant::now())
            .inspect_err(|e| refused(e, peer))?;
        // Read outside the scheduler lock, in one step off the async threads
        // (one hand-off per call, not per job). Should it fail, the leases
        // granted here simply expire and are reissued.
        let definitions = if grant.jobs.is_empty() {
            Vec::new()
        } else {
            blocking(|| {
                grant
                    .jobs
                    .iter()
                    .map(|g| self.session.store.job(g.job))
                    .collect::<Result<Vec<_>, _>>()
            })
            .map_err(Error::from)?
        };
        let mut jobs = Vec::with_capacity(grant.jobs.len());
        for (g, stored) in grant.jobs.iter().zip(definitions) {
            self.session.persist_lease(g, &worker);
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
        // expired jobs promptly and to hear of the end within the linger,
        // rarely enough that a thousand idle workers cost nothing.
        let retry_after_ms = if jobs.is_empty() && !grant.run_complete {
            RETRY_AFTER_MS.min(self.ttl_ms() / 3).max(1)
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
        let mut stream = request.into_inner();
        let first = stream.message().await?.ok_or(Error::EmptyReport)?;
        let span = tracing::Span::current();
        span.record("worker", first.worker_id.as_str());
        span.record("job", first.job_id);
        let admitted = admit(
            &self.session,
            &first.worker_id,
            first.job_id,
            first.lease_id,
            &first.run_id,
        )
        .inspect_err(|e| refused(e, peer))?;
        let job = admitted.job;
        let session = Arc::clone(&self.session);
        let (stored, subs) =
            tokio::task::spawn_blocking(move || session.subproblems(job))
                .await
                .map_err(Error::from)??;
        let writer = if self.session.shape.solutions {
            Some(blocking(|| {
                SolutionWriter::open(&self.session, job, &subs)
            })?)
        } else {
            None
        };
        let result = receive(first, &mut stream, writer.as_ref()).await?;
        let verified = check(
            &self.session,
            &admitted,
            &stored,
            &subs,
            result,
            writer.as_ref(),
        )?;
        let work = verified.work;
        // Returns once the copy is judged and durable: the ack below is the
        // worker's permission to forget the job.
        let outcome = self.session.commit(verified).await?;
        // The claim on the job's solutions ends only now that the result is
        // durable.
        drop(writer);
        let run_complete = acknowledge(&self.session, &admitted.worker, work);
        Ok(Response::new(pb::ReportAck {
            outcome: outcome_pb(outcome).into(),
            run_complete,
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
        let req = request.into_inner();
        if req.reports.len() > nq_proto::MAX_REPORT_BATCH {
            return Err(Error::BatchTooLarge {
                items: req.reports.len(),
                max: nq_proto::MAX_REPORT_BATCH,
            }
            .into());
        }
        // Solutions travel only on the Report stream.
        if self.session.shape.solutions {
            return Err(Error::BatchOfSolutionsRun.into());
        }
        let mut acks: Vec<pb::JobReportAck> = req
            .reports
            .iter()
            .map(|r| pb::JobReportAck {
                job_id: r.job_id,
                lease_id: r.lease_id,
                ..pb::JobReportAck::default()
            })
            .collect();
        // Each task ends when its item is durable (or refused by the
        // committer); dropping the set (the caller hung up) aborts the
        // waits, not the commits already queued, as for a dropped Report.
        let mut commits = JoinSet::new();
        // Every item's job is read and checked in one step off the async
        // threads (one hand-off per call, not per item).
        let checked: Vec<_> = blocking(|| {
            req.reports
                .into_iter()
                .map(|item| self.batch_item(&req.worker_id, &req.run_id, item))
                .collect()
        });
        for (i, item) in checked.into_iter().enumerate() {
            match item {
                Ok((admitted, verified)) => {
                    let work = verified.work;
                    let session = Arc::clone(&self.session);
                    commits.spawn(async move {
                        (i, admitted, work, session.commit(verified).await)
                    });
                }
                Err(e) => {
                    refused(&e, peer);
                    refuse(&mut acks[i], e);
                }
            }
        }
        let mut run_complete = false;
        let mut stored = 0usize;
        while let Some(joined) = commits.join_next().await {
            let (i, admitted, work, committed) = joined.map_err(Error::from)?;
            match committed {
                Ok(outcome) => {
                    stored += 1;
                    acks[i].outcome = outcome_pb(outcome).into();
                    run_complete |= acknowledge(&self.session, &admitted.worker, work);
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
        let req = request.into_inner();
        let worker = WorkerId(req.worker_id);
        let leases: Vec<LeaseId> = req.leases.iter().map(|&l| LeaseId(l)).collect();
        let released = self
            .session
            .sched()
            .release(&worker, &leases, Instant::now());
        self.session.persist_pending(&released);
        if !released.is_empty() {
            info!(jobs = released.len(), "worker released leases");
        }
        Ok(Response::new(pb::ReleaseResponse {
            released: released.len() as u32,
        }))
    }

    /// Open to anyone who can reach the port (no registration): it reveals
    /// the run's progress and the workers' names and addresses, nothing
    /// that lets a caller change the run.
    async fn status(
        &self,
        _request: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        Ok(Response::new(self.session.snapshot().to_pb()))
    }
}

/// Logs a refused call with the caller's address (a stranger, a confused
/// worker, or a banned one); other errors are logged where they are mapped.
fn refused(e: &Error, peer: Option<SocketAddr>) {
    if let Error::Refused(r) = e {
        warn!(peer = ?peer, reason = %r, "refused a call");
    }
}

/// A report admitted under its lease: what it is for, and the lease as
/// issued.
#[derive(Debug)]
struct Admitted {
    worker: WorkerId,
    job: JobId,
    lease: LeaseId,
    issued: Issued,
}

/// The admission stage: binds a report to what this coordinator issued.
/// The run must be this one, and the lease one this session issued to the
/// reporting worker for the reported job. Checked before the job is read or
/// anything is stored (on a `Report`'s first chunk; on each `ReportBatch`
/// item).
///
/// # Errors
///
/// [`Error::Refused`] naming what does not match; [`Error::UnknownJob`].
fn admit(
    session: &Session,
    worker: &str,
    job: u64,
    lease: u64,
    run: &str,
) -> Result<Admitted, Error> {
    if run != session.run_id {
        return Err(Error::Refused(crate::error::Refusal::OtherRun {
            got: run.to_owned(),
            run: session.run_id.clone(),
        }));
    }
    let (worker, job, lease) = (WorkerId(worker.to_owned()), JobId(job), LeaseId(lease));
    let issued = session.sched().check_report(job, lease, &worker)?;
    Ok(Admitted {
        worker,
        job,
        lease,
        issued,
    })
}

/// The checking stage: the result's counts, converted from the wire and
/// verified against the job `stored` and its sub-problems `subs` by [`ledger::verify`]
/// (with the solutions `writer` received, in solutions mode).
///
/// # Errors
///
/// [`Error::Convert`] for a count that is not one; the errors of
/// [`ledger::verify`].
fn check(
    session: &Session,
    admitted: &Admitted,
    stored: &StoredJob,
    subs: &[SubProblem],
    result: pb::JobResult,
    writer: Option<&SolutionWriter>,
) -> Result<Verified, Error> {
    let counts = result
        .counts
        .into_iter()
        .map(TryFrom::try_from)
        .collect::<Result<Vec<_>, _>>()
        .map_err(Error::from)?;
    let report = Report {
        job: admitted.job,
        lease: admitted.lease,
        worker: admitted.worker.0.clone(),
        counts,
        nodes: result.nodes,
        work: stored.work(),
        solutions_sent: result.solutions_sent,
        listed: writer.map(SolutionWriter::listed),
        kernel: result.kernel,
        issued: admitted.issued.clone(),
        stored_solutions: writer.is_some_and(SolutionWriter::stores),
    };
    ledger::verify(session, subs, report)
}

/// The acknowledging stage, once a copy of a job of estimated `work` is
/// durable: counts it towards `worker`'s throughput, and returns whether the run is complete
/// (the worker is then told, which the linger waits for).
fn acknowledge(session: &Session, worker: &WorkerId, work: u64) -> bool {
    let mut s = session.sched();
    s.note_copy(worker, work);
    let complete = s.is_complete();
    if complete {
        s.mark_told(worker);
    }
    complete
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
            None => stream
                .message()
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
    if stream.message().await?.is_some() {
        return Err(bad(ReportFault::ChunkAfterResult).into());
    }
    Ok(result)
}
