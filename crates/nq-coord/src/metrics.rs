//! Prometheus metrics of a run, in the OpenMetrics text format, written by
//! the `prometheus-client` crate from a [`Snapshot`].
//!
//! The run's state lives in the scheduler, not in metric objects, so each
//! scrape builds a fresh registry from one snapshot: every series of a scrape
//! comes from the same instant, and nothing on the hot paths of the run
//! updates metrics. Counters that a restart resets (`lease_expiries`, the
//! per-worker counts) are per session, which Prometheus's `rate()` handles as
//! a counter reset.
//!
//! Series (all prefixed `nq_`):
//!
//! | name | type | labels |
//! |---|---|---|
//! | `nq_run_info` | info | `run_id`, `n`, `split` |
//! | `nq_run_complete` | gauge (0/1) | |
//! | `nq_jobs` | gauge | `state` = `pending`, `leased`, `in_check`, `done`, `disputed` |
//! | `nq_jobs_in_run` | gauge | |
//! | `nq_work_done`, `nq_work_total` | gauge | |
//! | `nq_progress_ratio` | gauge | |
//! | `nq_completion_jobs_per_second`, `nq_completion_work_per_second` | gauge | |
//! | `nq_eta_seconds` | gauge (absent when unknown) | |
//! | `nq_workers_connected` | gauge | |
//! | `nq_lease_expiries_total` | counter | |
//! | `nq_conflicts_total`, `nq_confirmations_total` | counter | |
//! | `nq_faulty_workers` | gauge | |
//! | `nq_solutions_counted` | gauge | |
//! | `nq_worker_jobs_total`, `nq_worker_work_total` | counter | `worker`, `address` |
//! | `nq_worker_jobs_per_second`, `nq_worker_work_per_second` | gauge | `worker`, `address` |
//! | `nq_worker_last_seen_seconds` | gauge | `worker`, `address` |
//! | `nq_worker_leases_taken_back_total` | counter | `worker`, `address` |
//! | `nq_worker_stalled` | gauge (0/1) | `worker`, `address` |

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::AtomicU64;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

use crate::core::status::{RunState, Snapshot};

/// The content type of [`render`]'s output.
pub const CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

type Labels = Vec<(String, String)>;
type FloatGauge = Gauge<f64, AtomicU64>;

/// One worker's series; workers that share a name and an address (a worker
/// that registered again) are added up.
#[derive(Debug, Default)]
struct WorkerSeries {
    jobs: u64,
    work: f64,
    jobs_per_second: f64,
    work_per_second: f64,
    last_seen: f64,
    taken_back: u64,
    stalled: bool,
}

/// A gauge holding `v`, registered as `name`.
fn gauge(registry: &mut Registry, name: &str, help: &str, v: f64) {
    let g = FloatGauge::default();
    g.set(v);
    registry.register(name, help, g);
}

/// A counter holding `v`, registered as `name` (exposed as `name_total`).
fn counter(registry: &mut Registry, name: &str, help: &str, v: u64) {
    let c: Counter = Counter::default();
    c.inc_by(v);
    registry.register(name, help, c);
}

/// The OpenMetrics text of `s` (ends with `# EOF`).
pub fn render(s: &Snapshot) -> String {
    let mut r = Registry::default();
    r.register(
        "nq_run",
        "The run this coordinator serves",
        Info::new(vec![
            ("run_id".to_owned(), s.run_id.clone()),
            ("n".to_owned(), s.n.to_string()),
            (
                "split".to_owned(),
                format!("{}:{}", s.split.ring, s.split.extra),
            ),
        ]),
    );
    gauge(
        &mut r,
        "nq_run_complete",
        "1 once every job is settled",
        f64::from(u8::from(s.state == RunState::Complete)),
    );
    let jobs = Family::<Labels, Gauge>::default();
    for (state, v) in [
        ("pending", s.jobs_pending),
        ("leased", s.jobs_leased),
        ("in_check", s.jobs_in_check),
        ("done", s.jobs_done),
        ("disputed", s.jobs_disputed),
    ] {
        jobs.get_or_create(&vec![("state".to_owned(), state.to_owned())])
            .set(i64::try_from(v).unwrap_or(i64::MAX));
    }
    r.register(
        "nq_jobs",
        "Jobs by state (in_check and disputed jobs are also pending or leased)",
        jobs,
    );
    gauge(&mut r, "nq_jobs_in_run", "Jobs in the run", s.jobs as f64);
    progress(&mut r, s);
    verdicts(&mut r, s);
    workers(&mut r, s);
    // About 70 bytes a line and seven lines a worker: one allocation, not a
    // doubling for every few hundred workers, each copying the text so far.
    let mut out = String::with_capacity(4096 + 512 * s.workers.len());
    encode(&mut out, &r).expect("writing to a String cannot fail");
    out
}

/// The series of the run's progress: work done and left, the rates, the
/// ETA and the workers at work.
fn progress(r: &mut Registry, s: &Snapshot) {
    gauge(
        r,
        "nq_work_done",
        "Estimated work of the settled jobs (split estimate units)",
        s.work_done as f64,
    );
    gauge(
        r,
        "nq_work_total",
        "Estimated work of the whole run (split estimate units)",
        s.work_total as f64,
    );
    gauge(
        r,
        "nq_progress_ratio",
        "Share of the estimated work done, 0 to 1",
        s.fraction(),
    );
    gauge(
        r,
        "nq_completion_jobs_per_second",
        "Jobs settled per second over the recent window",
        s.jobs_per_second,
    );
    gauge(
        r,
        "nq_completion_work_per_second",
        "Estimated work settled per second over the recent window",
        s.work_per_second,
    );
    if let Some(eta) = s.eta_seconds {
        gauge(
            r,
            "nq_eta_seconds",
            "Estimated seconds to completion at the recent rate",
            eta,
        );
    }
    gauge(
        r,
        "nq_workers_connected",
        "Remote workers heard from within one lease lifetime",
        f64::from(s.workers_connected),
    );
}

/// The series of verification: expiries, conflicts, confirmations, faulty
/// workers, and the solutions counted so far.
fn verdicts(r: &mut Registry, s: &Snapshot) {
    counter(
        r,
        "nq_lease_expiries",
        "Leases that expired in this session (their jobs were handed out again)",
        s.lease_expiries,
    );
    counter(
        r,
        "nq_conflicts",
        "Copies of jobs that disagreed with the counted result",
        s.conflicts,
    );
    counter(
        r,
        "nq_confirmations",
        "Copies of jobs that agreed with the counted result",
        s.confirmations,
    );
    gauge(
        r,
        "nq_faulty_workers",
        "Worker identities that lost verification conflicts",
        s.faulty_workers.len() as f64,
    );
    gauge(
        r,
        "nq_solutions_counted",
        "Solutions counted so far (Q(N) once complete)",
        s.total_so_far as f64,
    );
}

/// The per-worker series.
fn workers(r: &mut Registry, s: &Snapshot) {
    let mut by_label: BTreeMap<(String, String), WorkerSeries> = BTreeMap::new();
    for w in &s.workers {
        let address = if w.local {
            "local".to_owned()
        } else {
            w.address.clone()
        };
        let e = by_label
            .entry((w.name.clone(), address))
            .or_insert(WorkerSeries {
                last_seen: f64::INFINITY,
                ..WorkerSeries::default()
            });
        e.jobs += w.jobs_done;
        e.work += w.work_done as f64;
        e.jobs_per_second += w.jobs_per_second;
        e.work_per_second += w.work_per_second;
        e.last_seen = e.last_seen.min(w.last_seen_seconds);
        e.taken_back += w.leases_taken_back;
        e.stalled |= w.stalled;
    }
    r.register_collector(Box::new(Workers(by_label.into_iter().collect())));
}

/// The per-worker series of one scrape, by `(worker, address)` label, encoded
/// straight from these rows.
///
/// Not a [`Family`] per series: a family hashes every worker's labels into a
/// map of its own, seven times a worker, and with 1,000 workers that hashing
/// and its allocations were most of a scrape's time (BENCHMARKS.md §28).
#[derive(Debug)]
struct Workers(Vec<((String, String), WorkerSeries)>);

impl Workers {
    /// Encodes the series `name` of every worker, `value` giving each one's.
    /// `help` ends with its full stop: a registry adds one to the help of
    /// what is registered in it, but not to a collector's.
    fn series(
        &self,
        encoder: &mut DescriptorEncoder<'_>,
        name: &str,
        help: &str,
        metric_type: MetricType,
        value: impl Fn(&WorkerSeries, MetricEncoder<'_>) -> fmt::Result,
    ) -> fmt::Result {
        let mut family = encoder.encode_descriptor(name, help, None, metric_type)?;
        for ((worker, address), w) in &self.0 {
            let labels = [("worker", worker.as_str()), ("address", address.as_str())];
            value(w, family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

impl Collector for Workers {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> fmt::Result {
        let e = &mut encoder;
        self.series(
            e,
            "nq_worker_jobs",
            "Copies of jobs a worker reported that were stored, this session.",
            MetricType::Counter,
            |w, m| ConstCounter::new(w.jobs).encode(m),
        )?;
        self.series(
            e,
            "nq_worker_work",
            "Estimated work of the copies a worker reported, this session.",
            MetricType::Counter,
            |w, m| ConstCounter::new(w.work).encode(m),
        )?;
        self.series(
            e,
            "nq_worker_jobs_per_second",
            "A worker's jobs per second over the recent window.",
            MetricType::Gauge,
            |w, m| ConstGauge::new(w.jobs_per_second).encode(m),
        )?;
        self.series(
            e,
            "nq_worker_work_per_second",
            "A worker's estimated work per second over the recent window.",
            MetricType::Gauge,
            |w, m| ConstGauge::new(w.work_per_second).encode(m),
        )?;
        self.series(
            e,
            "nq_worker_last_seen_seconds",
            "Seconds since a worker last called.",
            MetricType::Gauge,
            |w, m| ConstGauge::new(w.last_seen).encode(m),
        )?;
        self.series(
            e,
            "nq_worker_leases_taken_back",
            "Leases taken back from a worker: held far past its measured time, or over its fair share while others waited.",
            MetricType::Counter,
            |w, m| ConstCounter::new(w.taken_back).encode(m),
        )?;
        self.series(
            e,
            "nq_worker_stalled",
            "1 while a worker holds leases without progress (it may hold one job until it delivers).",
            MetricType::Gauge,
            |w, m| ConstGauge::new(i64::from(w.stalled)).encode(m),
        )
    }
}
