//! A fake coordinator for the worker's own tests: an in-memory implementation
//! of the protocol, with knobs to fail, forget and revoke, so that the
//! worker's reactions can be tested without `nq-coord`.

use std::collections::{BTreeSet, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nq_core::board::Board;
use nq_core::split::{SplitSpec, SubCounts, SubProblem, Tally, split};
use nq_proto::convert::RunShape;
use nq_proto::pb::coordinator_server::{Coordinator, CoordinatorServer};
use nq_proto::pb::{self, report_ack::Outcome, report_chunk::Body};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

/// A job's state in the fake.
#[derive(Clone, Debug)]
pub(crate) enum Slot {
    Pending,
    Leased { lease: u64, deadline: Instant },
    Done,
}

/// Everything the fake knows. Tests inspect and change it through [`Fake::state`].
#[derive(Debug)]
pub(crate) struct State {
    pub(crate) shape: RunShape,
    pub(crate) run_id: String,
    pub(crate) protocol_version: u32,
    pub(crate) ttl: Duration,
    pub(crate) jobs: Vec<Vec<SubProblem>>,
    pub(crate) slots: Vec<Slot>,
    /// Known worker ids; clearing it simulates a restart.
    pub(crate) workers: HashSet<String>,
    next_worker: u64,
    next_lease: u64,
    pub(crate) tally: Tally,
    /// Every solution streamed in accepted reports.
    pub(crate) solutions: Vec<Vec<u8>>,
    pub(crate) accepted: u64,
    pub(crate) confirmed: u64,
    pub(crate) released: u64,
    /// The next this-many reports fail with UNAVAILABLE before being read.
    pub(crate) fail_reports: u32,
    /// Leases handed out so far.
    pub(crate) leased: u64,
    /// `want` and `held.len()` of the latest Lease call.
    pub(crate) last_want: u32,
    pub(crate) last_held: usize,
    /// Stop handing out jobs (workers then only heartbeat).
    pub(crate) hold_back: bool,
    /// Reports failed by `fail_reports` so far.
    pub(crate) failed: u64,
    /// Every result chunk from a known worker, as it arrived (before any
    /// check of its run or lease).
    pub(crate) reports: Vec<Seen>,
    /// The next this-many results are refused with PERMISSION_DENIED, as a
    /// coordinator refuses a report whose lease is not valid for it.
    pub(crate) deny_reports: u32,
    /// Results refused by `deny_reports` so far.
    pub(crate) denied: u64,
    /// Lease calls fail with this status when set (a refused worker, a
    /// refused token).
    pub(crate) refuse_lease: Option<Status>,
    /// `Job.kernel` of every job handed out.
    pub(crate) job_kernel: String,
    /// Answer ReportBatch with UNIMPLEMENTED, as a coordinator older than it.
    pub(crate) no_batch: bool,
    /// ReportBatch calls answered UNIMPLEMENTED.
    pub(crate) unimplemented: u64,
    /// ReportBatch calls read, and the items they carried.
    pub(crate) batch_calls: u64,
    pub(crate) batch_items: u64,
    /// Report streams that carried a result.
    pub(crate) report_calls: u64,
}

/// One result chunk as the fake received it.
#[derive(Clone, Debug)]
pub(crate) struct Seen {
    pub(crate) run_id: String,
    pub(crate) job: u64,
    pub(crate) lease: u64,
    /// `JobResult.kernel`.
    pub(crate) kernel: String,
}

impl State {
    fn expire(&mut self, now: Instant) {
        for slot in &mut self.slots {
            if matches!(slot, Slot::Leased { deadline, .. } if *deadline < now) {
                *slot = Slot::Pending;
            }
        }
    }

    /// Judges one result as the real coordinator would (the part the
    /// fake models): known worker, this run, denial knob, counts checked.
    /// Returns the outcome and whether the run is now complete.
    fn take(
        &mut self,
        worker: &str,
        job: u64,
        lease: u64,
        run_id: &str,
        result: pb::JobResult,
        rows: &[Vec<u8>],
    ) -> Result<(Outcome, bool), Status> {
        let s = self;
        s.known(worker)?;
        s.reports.push(Seen {
            run_id: run_id.to_owned(),
            job,
            lease,
            kernel: result.kernel.clone(),
        });
        // What nq-coord answers to a report of another run, or one whose
        // lease it does not honour.
        if run_id != s.run_id {
            return Err(Status::permission_denied(format!(
                "report of run {run_id:?}; this coordinator runs {:?}",
                s.run_id
            )));
        }
        if s.deny_reports > 0 {
            s.deny_reports -= 1;
            s.denied += 1;
            return Err(Status::permission_denied("lease not valid for this report"));
        }
        let job = usize::try_from(job).unwrap();
        let subs = s
            .jobs
            .get(job)
            .cloned()
            .ok_or_else(|| Status::invalid_argument("job"))?;
        if result.counts.len() != subs.len() {
            return Err(Status::invalid_argument("wrong number of counts"));
        }
        let n = s.shape.board.len();
        let listed: Vec<Vec<u8>> = rows.concat().chunks(n).map(<[u8]>::to_vec).collect();
        if listed.len() as u64 != result.solutions_sent {
            return Err(Status::invalid_argument("solutions_sent mismatch"));
        }
        let outcome = if matches!(s.slots[job], Slot::Done) {
            s.confirmed += 1;
            Outcome::Confirmed
        } else {
            for (sub, c) in subs.iter().zip(result.counts) {
                let c = SubCounts::try_from(c)
                    .map_err(|e| Status::invalid_argument(e.to_string()))?;
                sub.check(s.shape.spec, &c)
                    .map_err(|e| Status::invalid_argument(e.to_string()))?;
                s.tally.add(sub, &c).unwrap();
            }
            s.solutions.extend(listed);
            s.slots[job] = Slot::Done;
            s.accepted += 1;
            Outcome::Accepted
        };
        Ok((outcome, s.complete()))
    }

    fn complete(&self) -> bool {
        self.slots.iter().all(|s| matches!(s, Slot::Done))
    }

    fn known(&self, worker: &str) -> Result<(), Status> {
        if self.workers.contains(worker) {
            Ok(())
        } else {
            Err(Status::failed_precondition(format!(
                "unknown worker {worker}"
            )))
        }
    }
}

/// The fake service; clone it to keep a handle for assertions.
#[derive(Clone, Debug)]
pub(crate) struct Fake {
    state: Arc<Mutex<State>>,
}

impl Fake {
    /// A run of board `n` split by `spec`, `per_job` sub-problems per job.
    pub(crate) fn new(n: u64, spec: SplitSpec, per_job: usize, solutions: bool) -> Fake {
        let board = Board::new(n).unwrap();
        let jobs: Vec<Vec<SubProblem>> = split(board, spec)
            .chunks(per_job)
            .map(<[_]>::to_vec)
            .collect();
        let state = State {
            shape: RunShape {
                board,
                spec,
                solutions,
            },
            run_id: "fake-run".into(),
            protocol_version: nq_proto::PROTOCOL_VERSION,
            ttl: Duration::from_secs(30),
            slots: vec![Slot::Pending; jobs.len()],
            jobs,
            workers: HashSet::new(),
            next_worker: 0,
            next_lease: 0,
            tally: Tally::default(),
            solutions: vec![],
            accepted: 0,
            confirmed: 0,
            released: 0,
            fail_reports: 0,
            leased: 0,
            last_want: 0,
            last_held: 0,
            hold_back: false,
            failed: 0,
            reports: vec![],
            deny_reports: 0,
            denied: 0,
            refuse_lease: None,
            job_kernel: String::new(),
            no_batch: false,
            unimplemented: 0,
            batch_calls: 0,
            batch_items: 0,
            report_calls: 0,
        };
        Fake {
            state: Arc::new(Mutex::new(state)),
        }
    }

    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap()
    }

    /// Makes this fake serve `next`'s run from now on, as a coordinator
    /// replaced by another one on the same address; `next` gets the old run.
    /// Worker ids of the new run start at `first_worker` and lease ids at
    /// `first_lease`, so that they cannot be mistaken for the old run's.
    pub(crate) fn switch_run(&self, next: &Fake, first_worker: u64, first_lease: u64) {
        let mut new = next.state();
        new.next_worker = first_worker;
        new.next_lease = first_lease;
        std::mem::swap(&mut *self.state(), &mut *new);
    }

    /// Serves on `listener` until `token` is cancelled.
    pub(crate) async fn serve(self, listener: TcpListener, token: CancellationToken) {
        tonic::transport::Server::builder()
            .add_service(CoordinatorServer::new(self))
            .serve_with_incoming_shutdown(
                tonic::transport::server::TcpIncoming::from(listener),
                token.cancelled_owned(),
            )
            .await
            .unwrap();
    }
}

/// Waits at most `limit` for the worker task to end, and asserts that it
/// gave up on a coordinator that had answered before and then went away
/// ([`crate::Silence::SinceLastAnswer`]).
pub(crate) async fn gave_up_after_the_coordinator_left(
    worker: tokio::task::JoinHandle<crate::Result<crate::Summary>>,
    limit: Duration,
) {
    let err = tokio::time::timeout(limit, worker)
        .await
        .expect("the worker gives up in time")
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(
            err,
            crate::Error::GaveUp {
                silence: crate::Silence::SinceLastAnswer,
                ..
            }
        ),
        "{err:?}"
    );
}

/// Binds an ephemeral loopback port.
pub(crate) async fn listener() -> (TcpListener, SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    (listener, addr)
}

#[tonic::async_trait]
impl Coordinator for Fake {
    async fn register(
        &self,
        request: Request<pb::RegisterRequest>,
    ) -> Result<Response<pb::RegisterResponse>, Status> {
        let mut s = self.state();
        let req = request.into_inner();
        if req.protocol_version != s.protocol_version {
            return Err(Status::failed_precondition(format!(
                "protocol version {} is not supported: this coordinator speaks version {}",
                req.protocol_version, s.protocol_version
            )));
        }
        s.next_worker += 1;
        let id = format!("w{}", s.next_worker);
        s.workers.insert(id.clone());
        Ok(Response::new(pb::RegisterResponse {
            worker_id: id,
            run: Some(s.shape.to_pb(&s.run_id)),
            protocol_version: s.protocol_version,
            lease_ttl_ms: s.ttl.as_millis() as u64,
        }))
    }

    async fn lease(
        &self,
        request: Request<pb::LeaseRequest>,
    ) -> Result<Response<pb::LeaseResponse>, Status> {
        let mut s = self.state();
        let req = request.into_inner();
        if let Some(status) = &s.refuse_lease {
            return Err(status.clone());
        }
        s.known(&req.worker_id)?;
        let now = Instant::now();
        s.expire(now);
        let ttl = s.ttl;
        let held: BTreeSet<u64> = req.held.iter().copied().collect();
        let mut renewed = BTreeSet::new();
        for slot in &mut s.slots {
            if let Slot::Leased { lease, deadline } = slot
                && held.contains(lease)
            {
                *deadline = now + ttl;
                renewed.insert(*lease);
            }
        }
        s.last_want = req.want;
        s.last_held = req.held.len();
        let revoked = held.difference(&renewed).copied().collect();
        let mut jobs = vec![];
        if !s.hold_back {
            for i in 0..s.slots.len() {
                if jobs.len() as u32 >= req.want {
                    break;
                }
                if matches!(s.slots[i], Slot::Pending) {
                    s.next_lease += 1;
                    let lease = s.next_lease;
                    s.slots[i] = Slot::Leased {
                        lease,
                        deadline: now + ttl,
                    };
                    s.leased += 1;
                    jobs.push(pb::Job {
                        job_id: i as u64,
                        lease_id: lease,
                        subproblems: s.jobs[i].iter().map(pb::SubProblem::from).collect(),
                        estimated_work: 1,
                        kernel: s.job_kernel.clone(),
                    });
                }
            }
        }
        Ok(Response::new(pb::LeaseResponse {
            jobs,
            run_complete: s.complete(),
            revoked,
            retry_after_ms: 20,
            lease_ttl_ms: ttl.as_millis() as u64,
        }))
    }

    async fn report(
        &self,
        request: Request<Streaming<pb::ReportChunk>>,
    ) -> Result<Response<pb::ReportAck>, Status> {
        {
            let mut s = self.state();
            if s.fail_reports > 0 {
                s.fail_reports -= 1;
                s.failed += 1;
                return Err(Status::unavailable("injected failure"));
            }
        }
        let mut stream = request.into_inner();
        let mut rows = vec![];
        let mut result = None;
        let mut header = None;
        while let Some(chunk) = stream.message().await? {
            header = Some((
                chunk.worker_id.clone(),
                chunk.job_id,
                chunk.run_id.clone(),
                chunk.lease_id,
            ));
            match chunk.body {
                Some(Body::Solutions(b)) => rows.push(b.rows),
                Some(Body::Result(r)) => result = Some(r),
                None => return Err(Status::invalid_argument("empty chunk")),
            }
        }
        let (Some((worker, job, run_id, lease)), Some(result)) = (header, result) else {
            return Ok(Response::new(pb::ReportAck::default()));
        };
        let mut s = self.state();
        s.report_calls += 1;
        let (outcome, run_complete) =
            s.take(&worker, job, lease, &run_id, result, &rows)?;
        Ok(Response::new(pb::ReportAck {
            outcome: outcome.into(),
            run_complete,
        }))
    }

    async fn report_batch(
        &self,
        request: Request<pb::ReportBatchRequest>,
    ) -> Result<Response<pb::ReportBatchResponse>, Status> {
        let mut s = self.state();
        if s.no_batch {
            s.unimplemented += 1;
            return Err(Status::unimplemented("no ReportBatch in this coordinator"));
        }
        if s.fail_reports > 0 {
            s.fail_reports -= 1;
            s.failed += 1;
            return Err(Status::unavailable("injected failure"));
        }
        let req = request.into_inner();
        s.batch_calls += 1;
        s.batch_items += req.reports.len() as u64;
        let mut acks = vec![];
        for item in req.reports {
            let mut ack = pb::JobReportAck {
                job_id: item.job_id,
                lease_id: item.lease_id,
                ..pb::JobReportAck::default()
            };
            let result = item.result.unwrap_or_default();
            match s.take(
                &req.worker_id,
                item.job_id,
                item.lease_id,
                &req.run_id,
                result,
                &[],
            ) {
                Ok((outcome, _)) => ack.outcome = outcome.into(),
                Err(status) => {
                    ack.code = status.code() as i32;
                    ack.message = status.message().to_owned();
                }
            }
            acks.push(ack);
        }
        Ok(Response::new(pb::ReportBatchResponse {
            acks,
            run_complete: s.complete(),
        }))
    }

    async fn release(
        &self,
        request: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::ReleaseResponse>, Status> {
        let mut s = self.state();
        let req = request.into_inner();
        let mut released = 0;
        for slot in &mut s.slots {
            if let Slot::Leased { lease, .. } = slot
                && req.leases.contains(lease)
            {
                *slot = Slot::Pending;
                released += 1;
            }
        }
        s.released += u64::from(released);
        Ok(Response::new(pb::ReleaseResponse { released }))
    }

    async fn status(
        &self,
        _request: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        // Workers never ask for the run's status.
        Err(Status::unimplemented("the fake coordinator has no status"))
    }
}
