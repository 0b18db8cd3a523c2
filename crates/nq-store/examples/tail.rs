//! `tail`: how long a finished run waited for its last jobs.
//!
//! Reads a stopped run's data directory and, for each done job, its
//! estimated work (the plan's), and from its counted result the nodes its
//! worker searched and when the coordinator received it. With the jobs in
//! the order they arrived, it prints one line:
//!
//! * `tail_s`: seconds from the result that brought the run's progress to
//!   99 % of its estimated work (the figure `nq-coord status` shows) to the
//!   last result: how long an operator watches "99 %";
//! * `tail_nodes_s`: the same in real work, the nodes searched (a heavy job
//!   adds all its nodes at once, when it ends, so a run that waits for one
//!   job shows a short tail here and a long one in `tail_s`);
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
    /// The share of the work the tail starts at.
    #[arg(long, default_value_t = 0.99)]
    from: f64,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let store = Store::open(&args.data, &StoreOptions::default())?;
    // (received, nodes, estimated work) of each done job's counted copy.
    let mut jobs: Vec<(u64, u64, u64)> = Vec::new();
    for scanned in store.scan_jobs(Scan::DoneWithDefinitions) {
        let scanned = scanned?;
        let work = scanned.definition.as_ref().map_or(0, |d| d.work());
        if let JobState::Done(counted) = scanned.record.state {
            jobs.push((counted.received_unix_ms, counted.nodes, work));
        }
    }
    if jobs.is_empty() {
        return Err(format!("{}: no job is done", args.data.display()).into());
    }
    jobs.sort_unstable();
    let (first, last) = (jobs[0].0, jobs[jobs.len() - 1].0);
    // When the share `from` of the measure was in.
    let reached = |measure: &dyn Fn(&(u64, u64, u64)) -> u64| -> u64 {
        let total: u128 = jobs.iter().map(|j| u128::from(measure(j))).sum();
        let mut so_far = 0u128;
        for j in &jobs {
            so_far += u128::from(measure(j));
            if so_far as f64 >= args.from * total as f64 {
                return j.0;
            }
        }
        last
    };
    let by_work = reached(&|j| j.2);
    let by_nodes = reached(&|j| j.1);
    let total: u128 = jobs.iter().map(|j| u128::from(j.1)).sum();
    let mean = total as f64 / jobs.len() as f64;
    let (largest_index, &(_, largest, _)) = jobs
        .iter()
        .enumerate()
        .max_by_key(|(_, j)| j.1)
        .expect("not empty");
    let before: u128 = jobs[..largest_index].iter().map(|j| u128::from(j.1)).sum();
    println!(
        "jobs={} nodes={total} tail_s={:.3} tail_nodes_s={:.3} span_s={:.3} \
         largest_job={:.1} largest_at={:.3}",
        jobs.len(),
        (last - by_work) as f64 / 1e3,
        (last - by_nodes) as f64 / 1e3,
        (last - first) as f64 / 1e3,
        largest as f64 / mean,
        before as f64 / total as f64,
    );
    Ok(())
}
