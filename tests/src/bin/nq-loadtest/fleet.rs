//! The simulated workers: each registers, leases, (thinks,) reports
//! all-zero results and retries as a real worker does, and the counters and
//! latency histograms they share ([`Stats`]).

use super::*;

/// A latency histogram in microseconds: log-linear buckets (16 per power of
/// two, so a quantile is within about 6% of the true value), lock-free, so
/// that tens of thousands of tasks can record into it.
#[derive(Debug)]
pub(super) struct Histogram {
    pub(super) buckets: Vec<AtomicU64>,
}

/// Sub-buckets per power of two, as a power of two.
pub(super) const SUB_BITS: u32 = 4;

impl Histogram {
    pub(super) fn new() -> Histogram {
        Histogram {
            buckets: (0..(64 << SUB_BITS)).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    pub(super) fn index(us: u64) -> usize {
        if us < (1 << SUB_BITS) {
            return us as usize;
        }
        let exp = 63 - us.leading_zeros();
        let sub = (us >> (exp - SUB_BITS)) & ((1 << SUB_BITS) - 1);
        (((exp - SUB_BITS + 1) << SUB_BITS) as u64 + sub) as usize
    }

    /// The largest value of bucket `i`.
    pub(super) fn upper(i: usize) -> u64 {
        let i = i as u64;
        if i < (1 << SUB_BITS) {
            return i;
        }
        let exp = (i >> SUB_BITS) + u64::from(SUB_BITS) - 1;
        let sub = i & ((1 << SUB_BITS) - 1);
        let low = (1u64 << exp) + (sub << (exp - u64::from(SUB_BITS)));
        low + (1 << (exp - u64::from(SUB_BITS))) - 1
    }

    pub(super) fn record(&self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.buckets[Histogram::index(us)].fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn count(&self) -> u64 {
        self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).sum()
    }

    /// The value below which a share `q` of the samples lie, in ms (the
    /// upper end of its bucket); `None` without samples.
    pub(super) fn quantile_ms(&self, q: f64) -> Option<f64> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (i, b) in self.buckets.iter().enumerate() {
            seen += b.load(Ordering::Relaxed);
            if seen >= rank {
                return Some(Histogram::upper(i) as f64 / 1000.0);
            }
        }
        None
    }

    pub(super) fn summary(&self) -> serde_json::Value {
        serde_json::json!({
            "count": self.count(),
            "p50_ms": self.quantile_ms(0.50),
            "p90_ms": self.quantile_ms(0.90),
            "p99_ms": self.quantile_ms(0.99),
            "max_ms": self.quantile_ms(1.0),
        })
    }
}

/// Counters shared by the simulated workers.
#[derive(Debug)]
pub(super) struct Stats {
    /// Durable acknowledgements.
    pub(super) completions: AtomicU64,
    pub(super) leases: AtomicU64,
    pub(super) empty_leases: AtomicU64,
    /// Calls that failed (network, coordinator down).
    pub(super) errors: AtomicU64,
    /// Report items the coordinator refused (PERMISSION_DENIED).
    pub(super) refused: AtomicU64,
    /// Leases held across a kill that could not be reported after it:
    /// refused, dropped, or done by another worker first (expired).
    pub(super) lost_to_restarts: AtomicU64,
    /// Jobs of leases held across a kill whose report was answered as a
    /// confirmation: lost, or retried after a durable first send (see the
    /// module doc), told apart by the audit after the run.
    pub(super) confirmed_after_kill: Mutex<Vec<u64>>,
    pub(super) conflicts: AtomicU64,
    /// Registrations after the first (a restarted coordinator forgot them).
    pub(super) registrations: AtomicU64,
    /// Workers that vanished, and the jobs they held.
    pub(super) vanished: AtomicU64,
    pub(super) abandoned: AtomicU64,
    /// ReportBatch calls (batch mode), and the items they carried.
    pub(super) batches: AtomicU64,
    pub(super) batch_items: AtomicU64,
    pub(super) lease_latency: Histogram,
    /// One sample per report call (a batch, or one job's stream).
    pub(super) report_latency: Histogram,
    /// Error lines printed so far (capped, so that 50,000 workers meeting a
    /// restart do not flood the terminal).
    pub(super) printed: AtomicU64,
}

/// Error lines printed at most.
pub(super) const MAX_PRINTED: u64 = 20;

impl Stats {
    pub(super) fn new() -> Stats {
        Stats {
            completions: AtomicU64::new(0),
            leases: AtomicU64::new(0),
            empty_leases: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            lost_to_restarts: AtomicU64::new(0),
            confirmed_after_kill: Mutex::new(Vec::new()),
            conflicts: AtomicU64::new(0),
            registrations: AtomicU64::new(0),
            vanished: AtomicU64::new(0),
            abandoned: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            batch_items: AtomicU64::new(0),
            lease_latency: Histogram::new(),
            report_latency: Histogram::new(),
            printed: AtomicU64::new(0),
        }
    }

    pub(super) fn error(&self, what: &str, status: &tonic::Status, stop: &AtomicBool) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        if !stop.load(Ordering::Relaxed)
            && self.printed.fetch_add(1, Ordering::Relaxed) < MAX_PRINTED
        {
            eprintln!("{what}: {:?}: {}", status.code(), status.message());
        }
    }
}

/// What every simulated worker shares.
#[derive(Debug)]
pub(super) struct Fleet {
    pub(super) stats: Stats,
    /// Set when the measurement ends.
    pub(super) stop: AtomicBool,
    /// Set at `--vanish-at`.
    pub(super) vanish_now: AtomicBool,
    pub(super) want: u32,
    pub(super) mode: ReportMode,
    /// Kills of the coordinator so far: a lease taken before a kill that
    /// was not reported by the time this moved on crossed it.
    pub(super) kills: AtomicU64,
    /// `--think`.
    pub(super) think: Duration,
    /// `--workers`, to spread the first leases over one think time.
    pub(super) workers: usize,
    /// `--name-bytes`: each name padded to this length (0: as short as it
    /// comes), to see what long worker names cost the status answer.
    pub(super) name_bytes: usize,
}

/// A registration request of simulated worker `i`, its name padded with `x`
/// to `name_bytes` bytes.
pub(super) fn register_request(
    i: usize,
    want: u32,
    name_bytes: usize,
) -> pb::RegisterRequest {
    pb::RegisterRequest {
        protocol_version: nq_proto::PROTOCOL_VERSION,
        name: if name_bytes == 0 {
            format!("sim-{i}")
        } else {
            format!("{:x<name_bytes$}", format!("sim-{i}-"))
        },
        threads: want,
        program_version: "loadtest".into(),
        gpu_jobs: 0,
    }
}

/// A wait of 100 ms to 1 s, spread by worker, so that a fleet that meets a
/// restart does not come back in lockstep.
pub(super) fn pause(i: usize, attempt: u32) -> Duration {
    let spread = (i as u64).wrapping_mul(2_654_435_761) % 400;
    Duration::from_millis((100 + spread) * u64::from(attempt.clamp(1, 2)))
}

/// Registers, retrying while the coordinator is down.
pub(super) async fn register(
    i: usize,
    client: &mut CoordinatorClient<Channel>,
    fleet: &Fleet,
) -> Result<Option<(String, String)>> {
    let mut attempt = 0;
    loop {
        match client
            .register(register_request(i, fleet.want, fleet.name_bytes))
            .await
        {
            Ok(r) => {
                let r = r.into_inner();
                let run = r.run.map(|r| r.run_id).unwrap_or_default();
                return Ok(Some((r.worker_id, run)));
            }
            Err(s)
                if matches!(
                    s.code(),
                    Code::FailedPrecondition | Code::InvalidArgument
                ) =>
            {
                bail!("register refused: {s}")
            }
            Err(s) => {
                fleet.stats.error("register", &s, &fleet.stop);
                if fleet.stop.load(Ordering::Relaxed) {
                    return Ok(None);
                }
                attempt += 1;
                tokio::time::sleep(pause(i, attempt)).await;
            }
        }
    }
}

/// One simulated worker: register, then lease and report until stopped (or,
/// for a vanishing one, until it vanishes holding its last lease).
pub(super) async fn simulate(
    i: usize,
    channel: Channel,
    fleet: &Fleet,
    registered: &tokio::sync::Barrier,
    vanishes: bool,
) -> Result<()> {
    let stats = &fleet.stats;
    let mut client = CoordinatorClient::new(channel)
        .max_decoding_message_size(nq_proto::MAX_MESSAGE_BYTES)
        .max_encoding_message_size(nq_proto::MAX_MESSAGE_BYTES);
    let first = register(i, &mut client, fleet).await;
    registered.wait().await;
    let Some((mut worker_id, mut run_id)) = first? else {
        return Ok(());
    };
    // The first leases spread over one think time.
    if !fleet.think.is_zero() {
        let offset = fleet.think.mul_f64(i as f64 / fleet.workers.max(1) as f64);
        if !think_for(fleet, offset).await {
            return Ok(());
        }
    }
    let mut failures = 0;
    while !fleet.stop.load(Ordering::Relaxed) {
        let sent = Instant::now();
        let lease = client
            .lease(pb::LeaseRequest {
                worker_id: worker_id.clone(),
                want: fleet.want,
                held: vec![],
            })
            .await;
        let lease = match lease {
            Ok(r) => {
                stats.lease_latency.record(sent.elapsed());
                failures = 0;
                r.into_inner()
            }
            Err(s) if s.code() == Code::FailedPrecondition => {
                // A restarted coordinator knows no worker.
                let Some((id, run)) = register(i, &mut client, fleet).await? else {
                    break;
                };
                stats.registrations.fetch_add(1, Ordering::Relaxed);
                (worker_id, run_id) = (id, run);
                continue;
            }
            Err(s) => {
                stats.error("lease", &s, &fleet.stop);
                failures += 1;
                tokio::time::sleep(pause(i, failures)).await;
                continue;
            }
        };
        stats.leases.fetch_add(1, Ordering::Relaxed);
        if lease.run_complete {
            break;
        }
        if lease.jobs.is_empty() {
            stats.empty_leases.fetch_add(1, Ordering::Relaxed);
            let wait = lease.retry_after_ms.clamp(10, 1000);
            tokio::time::sleep(Duration::from_millis(wait)).await;
            continue;
        }
        if vanishes && fleet.vanish_now.load(Ordering::Relaxed) {
            // Gone without a word: the leases run out at their deadline.
            stats.vanished.fetch_add(1, Ordering::Relaxed);
            stats
                .abandoned
                .fetch_add(lease.jobs.len() as u64, Ordering::Relaxed);
            return Ok(());
        }
        let held = Held {
            worker: i,
            kills: fleet.kills.load(Ordering::Relaxed),
        };
        if !think_for(fleet, fleet.think).await {
            break;
        }
        match fleet.mode {
            ReportMode::Batch => {
                report_batch(&mut client, fleet, &worker_id, &run_id, lease.jobs, held)
                    .await
            }
            ReportMode::Stream => {
                for job in lease.jobs {
                    report_stream(&mut client, fleet, &worker_id, &run_id, job, held)
                        .await;
                }
            }
        }
    }
    Ok(())
}

/// Waits `d` (the think time), in steps, so that the end of the measurement
/// is not kept waiting. False when the measurement ended meanwhile.
pub(super) async fn think_for(fleet: &Fleet, d: Duration) -> bool {
    let end = Instant::now() + d;
    loop {
        if fleet.stop.load(Ordering::Relaxed) {
            return false;
        }
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return true;
        }
        tokio::time::sleep(left.min(Duration::from_millis(500))).await;
    }
}

/// Who holds a leased batch, and the kills counted when it was leased.
#[derive(Clone, Copy, Debug)]
pub(super) struct Held {
    /// The simulated worker (for its retry pause).
    pub(super) worker: usize,
    pub(super) kills: u64,
}

impl Held {
    /// Counts `items` of this batch as lost to a restart, if a kill came
    /// after they were leased.
    pub(super) fn lost(self, fleet: &Fleet, items: u64) {
        if items > 0 && fleet.kills.load(Ordering::Relaxed) > self.kills {
            fleet
                .stats
                .lost_to_restarts
                .fetch_add(items, Ordering::Relaxed);
        }
    }

    /// Notes `job` of this batch, answered as a confirmation, for the audit
    /// after the run, if a kill came after it was leased.
    pub(super) fn confirmed(self, fleet: &Fleet, job: u64) {
        if fleet.kills.load(Ordering::Relaxed) > self.kills {
            (fleet.stats.confirmed_after_kill.lock())
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(job);
        }
    }
}

/// True for a failed call that a worker retries: the coordinator is down,
/// restarting or busy. Anything else is its answer.
pub(super) fn retryable(s: &tonic::Status) -> bool {
    !matches!(
        s.code(),
        Code::PermissionDenied
            | Code::InvalidArgument
            | Code::FailedPrecondition
            | Code::Unauthenticated
    )
}

/// All-zero counts for `job`: valid for an incomplete prefix (see the module
/// documentation on `--verify 0`).
pub(super) fn zero_result(job: &pb::Job) -> pb::JobResult {
    let zero = pb::SubCounts {
        count: Some(0u128.into()),
        fixed180: Some(0u128.into()),
        fixed90: Some(0u128.into()),
    };
    pb::JobResult {
        counts: vec![zero; job.subproblems.len()],
        nodes: 0,
        solutions_sent: 0,
        kernel: String::new(),
    }
}

/// Reports the jobs of one lease in one ReportBatch call, sent again until
/// it is answered (or the measurement ends).
pub(super) async fn report_batch(
    client: &mut CoordinatorClient<Channel>,
    fleet: &Fleet,
    worker_id: &str,
    run_id: &str,
    jobs: Vec<pb::Job>,
    held: Held,
) {
    let stats = &fleet.stats;
    let request = pb::ReportBatchRequest {
        worker_id: worker_id.to_owned(),
        run_id: run_id.to_owned(),
        reports: jobs
            .iter()
            .map(|job| pb::JobReport {
                job_id: job.job_id,
                lease_id: job.lease_id,
                result: Some(zero_result(job)),
            })
            .collect(),
    };
    let mut failures = 0;
    loop {
        let sent = Instant::now();
        match client.report_batch(request.clone()).await {
            Ok(answer) => {
                stats.report_latency.record(sent.elapsed());
                let acks = answer.into_inner().acks;
                stats.batches.fetch_add(1, Ordering::Relaxed);
                stats
                    .batch_items
                    .fetch_add(acks.len() as u64, Ordering::Relaxed);
                let mut lost = 0;
                for ack in acks {
                    let job = ack.job_id;
                    if ack.code != Code::Ok as i32 {
                        stats.refused.fetch_add(1, Ordering::Relaxed);
                        lost += 1;
                        continue;
                    }
                    match ack.outcome() {
                        pb::report_ack::Outcome::Conflict => {
                            stats.conflicts.fetch_add(1, Ordering::Relaxed);
                        }
                        // Another worker did the job first, or this is the
                        // retry of a report made durable before a kill: the
                        // audit after the run tells.
                        pb::report_ack::Outcome::Confirmed => held.confirmed(fleet, job),
                        _ => {}
                    }
                    stats.completions.fetch_add(1, Ordering::Relaxed);
                }
                held.lost(fleet, lost);
                return;
            }
            Err(s) => {
                stats.error("report batch", &s, &fleet.stop);
                if !retryable(&s) {
                    let items = request.reports.len() as u64;
                    stats.refused.fetch_add(items, Ordering::Relaxed);
                    held.lost(fleet, items);
                    return;
                }
                if fleet.stop.load(Ordering::Relaxed) {
                    return;
                }
                failures += 1;
                tokio::time::sleep(pause(held.worker, failures)).await;
            }
        }
    }
}

/// Reports one job in one Report stream, sent again until it is answered
/// (or the measurement ends).
pub(super) async fn report_stream(
    client: &mut CoordinatorClient<Channel>,
    fleet: &Fleet,
    worker_id: &str,
    run_id: &str,
    job: pb::Job,
    held: Held,
) {
    let stats = &fleet.stats;
    let chunk = pb::ReportChunk {
        worker_id: worker_id.to_owned(),
        job_id: job.job_id,
        lease_id: job.lease_id,
        body: Some(Body::Result(zero_result(&job))),
        run_id: run_id.to_owned(),
    };
    let mut failures = 0;
    loop {
        let sent = Instant::now();
        match client.report(tokio_stream::once(chunk.clone())).await {
            Ok(ack) => {
                stats.report_latency.record(sent.elapsed());
                match ack.get_ref().outcome() {
                    pb::report_ack::Outcome::Conflict => {
                        stats.conflicts.fetch_add(1, Ordering::Relaxed);
                    }
                    pb::report_ack::Outcome::Confirmed => {
                        held.confirmed(fleet, job.job_id)
                    }
                    _ => {}
                }
                stats.completions.fetch_add(1, Ordering::Relaxed);
                return;
            }
            Err(s) if !retryable(&s) => {
                stats.refused.fetch_add(1, Ordering::Relaxed);
                held.lost(fleet, 1);
                return;
            }
            Err(s) => {
                stats.error("report", &s, &fleet.stop);
                if fleet.stop.load(Ordering::Relaxed) {
                    return;
                }
                failures += 1;
                tokio::time::sleep(pause(held.worker, failures)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn histogram_quantiles_are_within_a_bucket() {
        let h = Histogram::new();
        for us in 1..=10_000u64 {
            h.record(Duration::from_micros(us));
        }
        for (q, exact) in [(0.5, 5.0), (0.99, 9.9), (1.0, 10.0)] {
            let got = h.quantile_ms(q).unwrap();
            assert!(
                got >= exact && got <= exact * 1.07,
                "q={q}: {got} vs {exact}"
            );
        }
        for us in [0u64, 1, 15, 16, 17, 1000, 123_456_789] {
            let i = Histogram::index(us);
            assert!(Histogram::upper(i) >= us, "{us}");
            assert!(i == 0 || Histogram::upper(i - 1) < us, "{us}");
        }
    }
}
