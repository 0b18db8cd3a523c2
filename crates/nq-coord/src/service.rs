//! The gRPC service: [`CoordinatorService`] implements
//! `pb::coordinator_server::Coordinator` on top of the session's scheduler,
//! store and committer.
//!
//! Errors become `tonic::Status` in ONE place, `impl From<Error> for Status`
//! below: bad input is `INVALID_ARGUMENT`, an unknown worker, lease or a
//! protocol mismatch `FAILED_PRECONDITION`, a busy job or a shutdown
//! `UNAVAILABLE` (retryable), and everything else `INTERNAL`, logged first.

use std::sync::Arc;
use std::time::Instant;

use nq_proto::pb;
use nq_store::JobId;
use tonic::{Request, Response, Status, Streaming};
use tracing::{error, info, instrument, warn};

use crate::error::{Error, ReportFault};
use crate::lease::{LeaseId, WorkerId};
use crate::ledger::{self, Report, SolutionWriter};
use crate::scheduler::Outcome;
use crate::session::Session;

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
            Error::ProtocolVersion { .. }
            | Error::UnknownWorker { .. }
            | Error::UnknownLease { .. } => Status::failed_precondition(msg),
            Error::UnknownJob { .. }
            | Error::LeaseMismatch { .. }
            | Error::BadReport { .. }
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
        let req = request.into_inner();
        if req.protocol_version != nq_proto::PROTOCOL_VERSION {
            return Err(Error::ProtocolVersion {
                worker: req.protocol_version,
                coordinator: nq_proto::PROTOCOL_VERSION,
            }
            .into());
        }
        // Every call gets a fresh id, even for a known name: a restarted worker
        // cannot prove it is the same one, and its old leases simply expire.
        let worker =
            self.session
                .sched()
                .register(&req.name, req.threads, Instant::now());
        info!(
            worker = %worker,
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
        let req = request.into_inner();
        let worker = WorkerId(req.worker_id);
        let held: Vec<LeaseId> = req.held.iter().map(|&l| LeaseId(l)).collect();
        let grant =
            self.session
                .sched()
                .lease(&worker, req.want, &held, Instant::now())?;
        let mut jobs = Vec::with_capacity(grant.jobs.len());
        for g in &grant.jobs {
            // Read outside the scheduler lock. Should it fail, the leases
            // granted here simply expire and are reissued.
            let stored = self.session.store.job(g.job).map_err(Error::from)?;
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
                kernel: String::new(),
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
        // The worker id is not checked against the registered workers: a
        // worker retrying a report after a coordinator restart still holds an
        // id of the previous session, and its result is just as valid. What
        // protects the totals is the job's state and the checks on the counts.
        let mut stream = request.into_inner();
        let first = stream.message().await?.ok_or(Error::EmptyReport)?;
        let (worker, job, lease) = (
            first.worker_id.clone(),
            JobId(first.job_id),
            LeaseId(first.lease_id),
        );
        let span = tracing::Span::current();
        span.record("worker", worker.as_str());
        span.record("job", job.0);
        let bad = |fault| Error::BadReport { job, fault };
        // Cheap checks first, before reading the job or taking a claim.
        self.session.sched().check_report(job, lease)?;
        let (_, subs) = self.session.subproblems(job)?;
        let writer = if self.session.shape.solutions {
            Some(SolutionWriter::open(&self.session, job, &subs)?)
        } else {
            None
        };
        // Solution batches are checked and stored as they arrive (under the
        // job's claim), so memory does not grow with a job's solutions; the
        // counts wait for the result chunk, which comes last.
        let mut chunk = Some(first);
        let result = loop {
            let c = match chunk.take() {
                Some(c) => c,
                None => stream
                    .message()
                    .await?
                    .ok_or(bad(ReportFault::MissingResult))?,
            };
            if c.worker_id != worker || c.job_id != job.0 || c.lease_id != lease.0 {
                return Err(bad(ReportFault::MixedIds).into());
            }
            match c.body {
                Some(pb::report_chunk::Body::Solutions(batch)) => match &writer {
                    Some(w) => w.batch(batch.subproblem, &batch.rows)?,
                    None => return Err(bad(ReportFault::SolutionsNotWanted).into()),
                },
                Some(pb::report_chunk::Body::Result(r)) => break r,
                None => return Err(bad(ReportFault::EmptyChunk).into()),
            }
        };
        // The contract says the stream ends after the result; a sender that
        // goes on is confused, and nothing of its report is kept.
        if stream.message().await?.is_some() {
            return Err(bad(ReportFault::ChunkAfterResult).into());
        }
        let counts = result
            .counts
            .into_iter()
            .map(TryFrom::try_from)
            .collect::<Result<Vec<_>, _>>()
            .map_err(Error::from)?;
        let report = Report {
            job,
            lease,
            worker: worker.clone(),
            counts,
            nodes: result.nodes,
            solutions_sent: result.solutions_sent,
            listed: writer.as_ref().map(SolutionWriter::listed),
        };
        let verified = ledger::verify(&self.session, &subs, report)?;
        // Returns once the result is durable (or, for a repeat, recorded):
        // the ack below is the worker's permission to forget the job.
        let outcome = self.session.commit(verified).await?;
        // The claim on the job's solutions ends only now that the result is
        // durable.
        drop(writer);
        let run_complete = {
            let mut s = self.session.sched();
            let complete = s.is_complete();
            if complete {
                s.mark_told(&WorkerId(worker));
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
}
