//! The core's performance claims, measured as ratios within one process.
//!
//! Run with `cargo bench -p nq-core --bench count`. Environment:
//! `NQ_BENCH_N` (default `16,17`), `NQ_BENCH_REPS` (default 3),
//! `NQ_BENCH_THREADS_N` (default 17).
//!
//! Each figure is the minimum over `NQ_BENCH_REPS` runs, and the runs of the
//! compared programs are interleaved, so that load from other processes on a
//! shared machine hits both sides alike. The single-thread tables measure the
//! bench thread's on-CPU time where Linux reports it
//! (`/proc/thread-self/schedstat`), so that time spent waiting for a core
//! that another process holds counts for neither side; elsewhere, and for the
//! pool table, wall time. The printed ratios, not the seconds,
//! are what BENCHMARKS.md records. No result is asserted about time; every
//! count is checked against the published value.
//!
//! A second table gives each kernel's search nodes per second
//! (`CountStats::nodes`, the same count on every kernel), a figure that
//! compares one machine with another. The bench runs as it is on any CPU:
//! on aarch64 it measures the NEON and scalar kernels.

use std::sync::atomic::AtomicBool;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use nq_core::board::Board;
use nq_core::pool::{Job, JobOutcome, JobSink, Pool};
use nq_core::search::Kernel;
use nq_core::split::{SplitSpec, SubProblem, Tally, split};

/// Published Q(N) for the sizes benchmarked (OEIS A000170), to check results.
fn published(n: u32) -> u128 {
    match n {
        12 => 14_200,
        13 => 73_712,
        14 => 365_596,
        15 => 2_279_184,
        16 => 14_772_512,
        17 => 95_815_104,
        18 => 666_090_624,
        _ => panic!("no published value wired in for n={n}"),
    }
}

fn env_list(name: &str, default: &str) -> Vec<u32> {
    std::env::var(name)
        .unwrap_or_else(|_| default.to_owned())
        .split(',')
        .map(|s| {
            s.trim()
                .parse()
                .expect("a comma-separated list of integers")
        })
        .collect()
}

/// `count_split_with`, also summing the search nodes: one thread, the whole
/// split, each sub-problem's counts checked as the library checks them.
fn count_split_nodes(board: Board, spec: SplitSpec, kernel: Kernel) -> (Tally, u64) {
    let never = AtomicBool::new(false);
    let (mut tally, mut nodes) = (Tally::default(), 0u64);
    for sub in split(board, spec) {
        let (counts, stats) = sub.solve_with(kernel, &never).expect("not stopped");
        sub.check(spec, &counts).expect("valid counts");
        tally.add(&sub, &counts).expect("no overflow");
        nodes += stats.nodes;
    }
    (tally, nodes)
}

fn timed<T>(f: impl FnOnce() -> T) -> (T, f64) {
    let t = Instant::now();
    let out = f();
    (out, t.elapsed().as_secs_f64())
}

/// The calling thread's on-CPU time in seconds, from the scheduler's
/// statistics (Linux: nanoseconds, up to a scheduler tick stale), or `None`.
fn thread_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: u64 = stat.split_whitespace().next()?.parse().ok()?;
    Some(ns as f64 * 1e-9)
}

/// [`timed`] in on-CPU seconds of this thread where the OS reports them.
fn cpu_timed<T>(f: impl FnOnce() -> T) -> (T, f64) {
    let before = thread_cpu_seconds();
    let (out, wall) = timed(f);
    match (before, thread_cpu_seconds()) {
        (Some(a), Some(b)) => (out, b - a),
        _ => (out, wall),
    }
}

/// Sends each job's outcome, tagged with the job's index, to the collector.
struct Collect {
    index: usize,
    tx: Mutex<mpsc::Sender<(usize, JobOutcome)>>,
}

impl JobSink for Collect {
    fn done(&self, outcome: JobOutcome) {
        let _ = self
            .tx
            .lock()
            .expect("not poisoned")
            .send((self.index, outcome));
    }
}

/// Counts Q(N) through the pool with `threads` threads, the way `nq count`
/// does: many small jobs, largest first, folded with the split's weights.
fn pool_count(board: Board, threads: usize) -> u128 {
    let spec = SplitSpec::for_count(board, 64 * threads as u64);
    let mut subs: Vec<SubProblem> = split(board, spec);
    subs.sort_by_key(|s| std::cmp::Reverse(s.estimate()));
    let jobs: Vec<Vec<SubProblem>> = subs.chunks(4).map(<[_]>::to_vec).collect();
    let pool = Pool::new(threads, "bench").expect("threads");
    let (tx, rx) = mpsc::channel();
    for (index, chunk) in jobs.iter().enumerate() {
        pool.submit(Job {
            subproblems: chunk.clone(),
            list_solutions: false,
            kernel: Kernel::Auto,
            stop: Arc::new(AtomicBool::new(false)),
            sink: Arc::new(Collect {
                index,
                tx: Mutex::new(tx.clone()),
            }),
        });
    }
    let mut tally = Tally::default();
    for _ in 0..jobs.len() {
        let (index, outcome) = rx.recv().expect("every job reports");
        let JobOutcome::Done { counts, .. } = outcome else {
            panic!("cancelled")
        };
        for (sub, c) in jobs[index].iter().zip(&counts) {
            tally.add(sub, c).expect("no overflow");
        }
    }
    tally.total
}

fn main() {
    let reps = env_list("NQ_BENCH_REPS", "3")[0] as usize;
    // Every kernel this CPU runs, slowest first; `Auto` is one of them.
    let kernels: Vec<Kernel> =
        [Kernel::Scalar, Kernel::Neon, Kernel::Avx2, Kernel::Avx512]
            .into_iter()
            .filter(|k| k.is_available())
            .collect();
    let clock = if thread_cpu_seconds().is_some() {
        "on-CPU seconds of the bench thread"
    } else {
        "wall-clock seconds"
    };
    println!(
        "Architecture {}. Kernels on this CPU: {}; the default (`auto`) is {}. \
         Single-thread times are {clock}.",
        std::env::consts::ARCH,
        kernels
            .iter()
            .map(|k| k.name())
            .collect::<Vec<_>>()
            .join(", "),
        Kernel::Auto.resolved_name()
    );
    println!();
    let mut header = "| N | textbook mirror (s) |".to_string();
    let mut rule = "|---|---|".to_string();
    for k in &kernels {
        header += &format!(" nq-core {k} (s) | speed-up |");
        rule += "---|---|";
    }
    println!("{header}\n{rule}");
    // (N, nodes, best seconds per kernel) for the node-rate table.
    let mut rates: Vec<(u32, u64, Vec<f64>)> = vec![];
    for n in env_list("NQ_BENCH_N", "16,17") {
        let board = Board::new(n.into()).expect("valid N");
        let spec = SplitSpec::BORDER;
        let mut best_base = f64::MAX;
        let mut best = vec![f64::MAX; kernels.len()];
        let mut nodes = None;
        for _ in 0..reps {
            let (q, t) = cpu_timed(|| nq_core::baseline::count_mirror(n));
            assert_eq!(q, published(n), "textbook count n={n}");
            best_base = best_base.min(t);
            for (&kernel, best) in kernels.iter().zip(&mut best) {
                let ((tally, k_nodes), t) =
                    cpu_timed(|| count_split_nodes(board, spec, kernel));
                assert_eq!(tally.total, published(n), "nq-core count n={n} {kernel}");
                assert_eq!(
                    *nodes.get_or_insert(k_nodes),
                    k_nodes,
                    "every kernel counts the same nodes, n={n} {kernel}"
                );
                *best = best.min(t);
            }
        }
        rates.push((n, nodes.unwrap_or(0), best.clone()));
        let mut row = format!("| {n} | {best_base:.2} |");
        for t in &best {
            row += &format!(" {t:.2} | {:.2}× |", best_base / t);
        }
        println!("{row}");
    }

    println!();
    let mut header = "| N | nodes |".to_string();
    let mut rule = "|---|---|".to_string();
    for k in &kernels {
        header += &format!(" {k} (Mnodes/s) |");
        rule += "---|";
    }
    println!("{header}\n{rule}");
    for (n, nodes, best) in rates {
        let mut row = format!("| {n} | {nodes} |");
        for t in best {
            row += &format!(" {:.0} |", nodes as f64 / t / 1e6);
        }
        println!("{row}");
    }

    let n = env_list("NQ_BENCH_THREADS_N", "17")[0];
    let board = Board::new(n.into()).expect("valid N");
    let (mut one, mut two) = (f64::MAX, f64::MAX);
    for _ in 0..reps {
        let (q, t) = timed(|| pool_count(board, 1));
        assert_eq!(q, published(n));
        one = one.min(t);
        let (q, t) = timed(|| pool_count(board, 2));
        assert_eq!(q, published(n));
        two = two.min(t);
    }
    println!();
    println!("| N | pool, 1 thread (s) | pool, 2 threads (s) | speed-up |");
    println!("|---|---|---|---|");
    println!("| {n} | {one:.2} | {two:.2} | {:.2}× |", one / two);
}
