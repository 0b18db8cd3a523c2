//! Counts Q(N) through the border split on one kernel, single-threaded, and
//! prints the count, the nodes and the time: a small, deterministic driver for
//! profilers (`valgrind --tool=callgrind`, `perf stat`), where the bench's
//! repetitions and comparator would only add noise.
//!
//! `cargo run --release -p nq-core --example kernel_count -- N [KERNEL]`

use std::sync::atomic::AtomicBool;
use std::time::Instant;

use nq_core::board::Board;
use nq_core::search::Kernel;
use nq_core::split::{SplitSpec, Tally, split};

fn main() {
    let mut args = std::env::args().skip(1);
    let usage = "usage: kernel_count N [auto|avx512|avx2|neon|scalar]";
    let n: u64 = args.next().and_then(|a| a.parse().ok()).expect(usage);
    let kernel: Kernel = args
        .next()
        .map_or(Ok(Kernel::Auto), |a| a.parse())
        .expect(usage);
    let kernel = kernel.require().expect("a kernel this CPU runs");
    let board = Board::new(n).expect("N from 1 to 32");
    let spec = SplitSpec::BORDER;
    let never = AtomicBool::new(false);
    let start = Instant::now();
    let (mut tally, mut nodes) = (Tally::default(), 0u64);
    for sub in split(board, spec) {
        let (counts, stats) = sub.solve_with(kernel, &never).expect("never stopped");
        tally.add(&sub, &counts).expect("no overflow");
        nodes += stats.nodes;
    }
    let seconds = start.elapsed().as_secs_f64();
    println!(
        "N={n} kernel={} total={} unique={} nodes={nodes} seconds={seconds:.3} \
         nodes/s={:.3e}",
        kernel.resolved_name(),
        tally.total,
        tally.unique().expect("whole classes"),
        nodes as f64 / seconds
    );
}
