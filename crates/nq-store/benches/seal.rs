//! What a store key costs: group commits and a full read-back of results,
//! in an unkeyed store and in one sealed with a [`StoreKey`], measured as a
//! ratio within one process.
//!
//! Run with `cargo bench -p nq-store --bench seal`. Environment:
//! `NQ_BENCH_JOBS` (default 32768), `NQ_BENCH_REPS` (default 5).
//!
//! Each rep makes a fresh on-disk store of `NQ_BENCH_JOBS` jobs of a 16×16
//! board for each side, then commits one result per job in groups of 256
//! (`CommitBatch` → `apply` → `flush`, as the coordinator commits), then
//! reads every result back (`Store::results`, as resume and audit do). The
//! two sides alternate within each rep, so that load from other processes
//! on a shared machine hits both alike, and each figure is the minimum over
//! the reps. Times are the bench thread's on-CPU time where Linux reports it
//! (`/proc/thread-self/schedstat`), so that waiting for a core another
//! process holds counts for neither side (sled's background threads are not
//! counted: sealing runs on the caller's thread); wall time elsewhere.
//! Nothing about time is asserted. Every read-back is checked against what
//! was written.

use std::time::{Duration, Instant};

use nq_core::Board;
use nq_core::split::{SPLIT_VERSION, SplitSpec, SubCounts, Tally};
use nq_store::{
    CommitBatch, JobId, NewJob, NewRun, RunKey, Store, StoreKey, StoreOptions,
    StoredResult,
};

/// Results per group commit, about what the coordinator gathers under load.
const GROUP: u64 = 256;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A result like a real job's: a few sub-problems with real-sized counts.
fn result(job: u64) -> StoredResult {
    let counts: Vec<SubCounts> = (0..4)
        .map(|i| SubCounts {
            count: 10_000 + u128::from(job % 97) * 8 + i,
            fixed180: 8,
            fixed90: 0,
        })
        .collect();
    StoredResult {
        tally: Tally {
            total: counts.iter().map(|c| c.count * 8).sum(),
            burnside: counts.iter().map(|c| c.count * 8 + 16).sum(),
        },
        counts,
        nodes: 1_000_000 + job,
        worker: "w1.1".into(),
        lease: job + 1,
        identity: "bench@127.0.0.1".into(),
        kernel: "avx2".into(),
        received_unix_ms: 1_764_000_000_000 + job,
        ..StoredResult::default()
    }
}

/// A clock of the calling thread's on-CPU time (wall time where Linux does
/// not report it).
struct Clock {
    start_ns: Option<u64>,
    wall: Instant,
}

fn on_cpu_ns() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    text.split_whitespace().next()?.parse().ok()
}

impl Clock {
    fn start() -> Clock {
        Clock {
            start_ns: on_cpu_ns(),
            wall: Instant::now(),
        }
    }

    fn elapsed(&self) -> Duration {
        match (self.start_ns, on_cpu_ns()) {
            (Some(a), Some(b)) => Duration::from_nanos(b.saturating_sub(a)),
            _ => self.wall.elapsed(),
        }
    }
}

/// One side of one rep: (commit time, read-back time).
fn measure(jobs: u64, key: Option<StoreKey>) -> (Duration, Duration) {
    let tmp = tempfile::tempdir().expect("a temporary directory");
    let options = StoreOptions {
        key,
        ..StoreOptions::default()
    };
    let store = Store::open(&tmp.path().join("bench.sled"), &options).expect("open");
    let board = Board::new(16).expect("N = 16");
    let run = NewRun {
        key: RunKey {
            board,
            split_version: SPLIT_VERSION,
            spec: SplitSpec::border(1).expect("split"),
            solutions: false,
        },
        run_id: "bench".into(),
        program_version: "0".into(),
        created_unix_ms: 1,
    };
    let defs = (0..jobs).map(|i| NewJob {
        rows: [vec![(i % 16) as u8, ((i / 16) % 16) as u8], vec![255; 14]].concat(),
        work: 1000 + i,
    });
    store.create_run(run, defs).expect("create");
    let t = Clock::start();
    for first in (0..jobs).step_by(GROUP as usize) {
        let mut batch = CommitBatch::new();
        for j in first..(first + GROUP).min(jobs) {
            batch.result(JobId(j), result(j), 1);
        }
        store.apply(batch).expect("apply");
        store.flush().expect("flush");
    }
    let commit = t.elapsed();
    let t = Clock::start();
    let mut read = 0u64;
    for entry in store.results() {
        let (job, r) = entry.expect("read back");
        assert_eq!(r, result(job.0), "job {job} reads back as written");
        read += 1;
    }
    let scan = t.elapsed();
    assert_eq!(read, jobs, "every result reads back");
    (commit, scan)
}

fn main() {
    let jobs = env_or("NQ_BENCH_JOBS", 32_768);
    let reps = env_or("NQ_BENCH_REPS", 5).max(1);
    let key = StoreKey::from_bytes(&[0x5a; 32]).expect("a 32-byte key");
    let mut best = [(Duration::MAX, Duration::MAX); 2];
    for _ in 0..reps {
        for (side, key) in [None, Some(key.clone())].into_iter().enumerate() {
            let (c, s) = measure(jobs, key);
            best[side].0 = best[side].0.min(c);
            best[side].1 = best[side].1.min(s);
        }
    }
    let rate = |d: Duration| jobs as f64 / d.as_secs_f64();
    println!("store key cost: {jobs} results, groups of {GROUP}, best of {reps}");
    println!("| | unkeyed | keyed | keyed / unkeyed time |");
    println!("|---|---:|---:|---:|");
    println!(
        "| commit (apply + flush), results/s | {:.0} | {:.0} | {:.3} |",
        rate(best[0].0),
        rate(best[1].0),
        best[1].0.as_secs_f64() / best[0].0.as_secs_f64()
    );
    println!(
        "| read back (results scan), results/s | {:.0} | {:.0} | {:.3} |",
        rate(best[0].1),
        rate(best[1].1),
        best[1].1.as_secs_f64() / best[0].1.as_secs_f64()
    );
}
