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
//! [`ledger::verify`] (the counts), [`Session::commit`] (judged against the
//! job's other copies and made durable), then the acknowledgement.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use nq_proto::pb;
use nq_store::JobId;
use tonic::{Request, Response, Status, Streaming};
use tracing::{error, info, instrument, warn};

use crate::error::{Error, ReportFault};
use crate::lease::{LeaseId, WorkerId};
use crate::ledger::{self, Report, SolutionWriter};
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
        let mut jobs = Vec::with_capacity(grant.jobs.len());
        for g in &grant.jobs {
            // Read outside the scheduler lock. Should it fail, the leases
            // granted here simply expire and are reissued.
            let stored =
                blocking(|| self.session.store.job(g.job)).map_err(Error::from)?;
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
        let worker = WorkerId(first.worker_id.clone());
        let job = JobId(first.job_id);
        let lease = LeaseId(first.lease_id);
        let issued = admit(&self.session, &first).inspect_err(|e| refused(e, peer))?;
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
        let counts = result
            .counts
            .into_iter()
            .map(TryFrom::try_from)
            .collect::<Result<Vec<_>, _>>()
            .map_err(Error::from)?;
        let report = Report {
            job,
            lease,
            worker: worker.0.clone(),
            counts,
            nodes: result.nodes,
            solutions_sent: result.solutions_sent,
            listed: writer.as_ref().map(SolutionWriter::listed),
            kernel: result.kernel,
            issued,
            stored_solutions: writer.as_ref().is_some_and(SolutionWriter::stores),
        };
        let verified = ledger::verify(&self.session, &subs, report)?;
        // Returns once the copy is judged and durable: the ack below is the
        // worker's permission to forget the job.
        let outcome = self.session.commit(verified).await?;
        // The claim on the job's solutions ends only now that the result is
        // durable.
        drop(writer);
        let run_complete = {
            let mut s = self.session.sched();
            s.note_copy(&worker, stored.work());
            let complete = s.is_complete();
            if complete {
                s.mark_told(&worker);
            }
            complete
        };
        let outcome = match outcome {
            Outcome::Accepted => pb::report_ack::Outcome::Accepted,
            Outcome::Confirmed => pb::report_ack::Outcome::Confirmed,
            Outcome::Conflict => pb::report_ack::Outcome::Conflict,
        };
        Ok(Response::new(pb::ReportAck {
            outcome: outcome.into(),
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

/// The admission stage: binds a report to what this coordinator issued.
/// The run must be this one, and the lease one this session issued to the
/// reporting worker for the reported job. Checked on the first chunk, before
/// the job is read or anything is stored.
///
/// # Errors
///
/// [`Error::Refused`] naming what does not match; [`Error::UnknownJob`].
fn admit(session: &Session, first: &pb::ReportChunk) -> Result<Issued, Error> {
    if first.run_id != session.run_id {
        return Err(Error::Refused(crate::error::Refusal::OtherRun {
            got: first.run_id.clone(),
            run: session.run_id.clone(),
        }));
    }
    session.sched().check_report(
        JobId(first.job_id),
        LeaseId(first.lease_id),
        &WorkerId(first.worker_id.clone()),
    )
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
