//! `tail`: how long a finished run waited for its last jobs.
//!
//! Reads a stopped run's data directory and, from each done job's counted
//! result, the nodes its worker searched and when the coordinator received
//! it. With the jobs in the order they arrived, it prints one line:
//!
//! * `tail_s`: seconds from the result that brought the run to 99 % of its
//!   nodes to the last result: the run's tail, in real work (the nodes
//!   searched), not in the plan's estimates, so two plans of one board
//!   compare;
//! * `span_s`: seconds from the first result to the last;
//! * `largest_job`: the most nodes of one job, as a multiple of the mean,
//!   and `largest_at`: the share of the run's nodes already in when it
//!   arrived (near 1: it was handed out late and was the tail).
//!
//! ```text
//! cargo run --release -p nq-store --example tail -- --data DIR
//! ```

use std::path::PathBuf;

use clap::Parser;
use nq_store::{JobState, Scan, Store, StoreOptions};

/// Measures the tail of a finished run from its store.
#[derive(Debug, Parser)]
struct Args {
    /// The data directory of a stopped run.
    #[arg(long)]
    data: PathBuf,
    /// The share of the nodes the tail starts at.
    #[arg(long, default_value_t = 0.99)]
    from: f64,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let store = Store::open(&args.data, &StoreOptions::default())?;
    // (received, nodes) of each done job's counted copy.
    let mut jobs: Vec<(u64, u64)> = Vec::new();
    for scanned in store.scan_jobs(Scan::Done) {
        if let JobState::Done(counted) = scanned?.record.state {
            jobs.push((counted.received_unix_ms, counted.nodes));
        }
    }
    if jobs.is_empty() {
        return Err(format!("{}: no job is done", args.data.display()).into());
    }
    jobs.sort_unstable();
    let total: u128 = jobs.iter().map(|j| u128::from(j.1)).sum();
    let mut so_far = 0u128;
    let mut from_ms = None;
    for &(at, nodes) in &jobs {
        so_far += u128::from(nodes);
        if from_ms.is_none() && so_far as f64 >= args.from * total as f64 {
            from_ms = Some(at);
        }
    }
    let (first, last) = (jobs[0].0, jobs[jobs.len() - 1].0);
    let from_ms = from_ms.unwrap_or(last);
    let mean = total as f64 / jobs.len() as f64;
    let (largest_index, &(_, largest)) = jobs
        .iter()
        .enumerate()
        .max_by_key(|(_, j)| j.1)
        .expect("not empty");
    let before: u128 = jobs[..largest_index].iter().map(|j| u128::from(j.1)).sum();
    println!(
        "jobs={} nodes={total} tail_s={:.3} span_s={:.3} largest_job={:.1} largest_at={:.3}",
        jobs.len(),
        (last - from_ms) as f64 / 1e3,
        (last - first) as f64 / 1e3,
        largest as f64 / mean,
        before as f64 / total as f64,
    );
    Ok(())
}
