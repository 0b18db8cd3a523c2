//! `estimates`: how well `SubProblem::estimate` foresees the work of each
//! sub-problem of a split, and what it costs.
//!
//! Solves every sub-problem of the border split `0:EXTRA` of board N on one
//! thread (AVX-512 where the CPU has it), and compares the nodes searched
//! with the estimates:
//!
//! * `corr`: the correlation of their logarithms;
//! * `top1`: of the 1 % of sub-problems with the most nodes, how many are
//!   among the 1 % with the largest estimates (what a largest-first hand-out
//!   needs);
//! * grouped into jobs of equal estimated work as the coordinator groups
//!   them (about 8 sub-problems a job here), the largest job and the 99th
//!   percentile in nodes, as multiples of the mean job;
//! * `us`: microseconds of one thread per estimate.
//!
//! ```text
//! cargo run --release -p nq-core --example estimates -- 17 3
//! ```

use std::ops::ControlFlow::Continue;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use nq_core::Board;
use nq_core::search::Kernel;
use nq_core::split::{SplitSpec, split_each};

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("usage: estimates N EXTRA"))
        .collect();
    let [n, extra] = args[..] else {
        panic!("usage: estimates N EXTRA");
    };
    let board = Board::new(n).expect("N from 1 to 32");
    let spec = SplitSpec::new(0, u8::try_from(extra).expect("EXTRA 0..=8"))
        .expect("EXTRA 0..=8");
    let mut subs = Vec::new();
    let _ = split_each(board, spec, &mut |s| {
        subs.push(s);
        Continue(())
    });
    let started = Instant::now();
    let estimates: Vec<f64> = subs.iter().map(|s| s.estimate() as f64).collect();
    let us = started.elapsed().as_secs_f64() / subs.len() as f64 * 1e6;
    let stop = AtomicBool::new(false);
    let nodes: Vec<u64> = subs
        .iter()
        .map(|s| {
            s.solve_with(Kernel::Auto, &stop)
                .expect("never stopped")
                .1
                .nodes
        })
        .collect();

    let m = subs.len();
    let top = m.div_ceil(100);
    let mut by_nodes: Vec<(f64, u64)> = estimates
        .iter()
        .copied()
        .zip(nodes.iter().copied())
        .collect();
    by_nodes.sort_by_key(|r| std::cmp::Reverse(r.1));
    let mut sorted = estimates.clone();
    sorted.sort_by(|x, y| y.total_cmp(x));
    let hits = by_nodes[..top]
        .iter()
        .filter(|r| r.0 >= sorted[top - 1])
        .count();

    let lx: Vec<f64> = estimates.iter().map(|e| e.max(1.0).ln()).collect();
    let ly: Vec<f64> = nodes.iter().map(|&x| (x.max(1) as f64).ln()).collect();
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let (mx, my) = (mean(&lx), mean(&ly));
    let cov = |p: &[f64], a: f64, q: &[f64], b: f64| -> f64 {
        p.iter().zip(q).map(|(x, y)| (x - a) * (y - b)).sum()
    };
    let corr =
        cov(&lx, mx, &ly, my) / (cov(&lx, mx, &lx, mx) * cov(&ly, my, &ly, my)).sqrt();

    // Consecutive sub-problems grouped into jobs of about equal estimated
    // work, as `nq-coord`'s plan groups them.
    let per_job = estimates.iter().sum::<f64>() / (m / 8).max(1) as f64;
    let (mut jobs, mut work, mut job_nodes) = (Vec::new(), 0.0, 0u64);
    for (e, x) in estimates.iter().zip(&nodes) {
        work += e;
        job_nodes += x;
        if work >= per_job {
            jobs.push(job_nodes);
            (work, job_nodes) = (0.0, 0);
        }
    }
    if job_nodes > 0 {
        jobs.push(job_nodes);
    }
    jobs.sort_unstable_by(|x, y| y.cmp(x));
    let job_mean = jobs.iter().sum::<u64>() as f64 / jobs.len() as f64;
    println!(
        "n={n} split=0:{extra} subproblems={m} corr={corr:.3} top1={hits}/{top} jobs={} \
         largest_job={:.2} p99_job={:.2} us={us:.2}",
        jobs.len(),
        jobs[0] as f64 / job_mean,
        jobs[jobs.len() / 100] as f64 / job_mean,
    );
}
