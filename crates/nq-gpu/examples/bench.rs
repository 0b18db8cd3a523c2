//! The kernel alone on one GPU, for the device benchmark
//! (`tests/bench/gpu-device.sh`): counts the border split of one board in
//! one launch and prints one JSON line.
//!
//! ```text
//! bench --n 20 [--device 0] [--every K] [--counters] [--min-tasks T]
//! ```
//!
//! * `--every K` counts every K-th sub-problem only (a slice short enough
//!   for Nsight Compute's replays); the total is then not checked.
//! * `--counters` runs the counters build of the kernel (lanes active per
//!   iteration, tail efficiency), for a machine without Nsight Compute.
//!
//! The whole board's total is checked against the published Q(N). Exits 1
//! with one line on a machine without a usable GPU.

use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use nq_core::board::Board;
use nq_core::split::{SplitSpec, SubProblem, Tally, split};
use serde_json::json;

const USAGE: &str =
    "usage: bench --n N [--device I] [--every K] [--counters] [--min-tasks T]";

fn main() -> ExitCode {
    match run(std::env::args().skip(1).collect()) {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Vec<String>) -> Result<String, String> {
    let (mut n, mut device, mut every, mut counters, mut min_tasks) =
        (None, 0usize, 1usize, false, 1usize << 19);
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(USAGE.to_owned());
        match flag.as_str() {
            "--n" => n = Some(value()?.parse::<u8>().map_err(|_| USAGE)?),
            "--device" => device = value()?.parse().map_err(|_| USAGE)?,
            "--every" => every = value()?.parse().map_err(|_| USAGE)?,
            "--min-tasks" => min_tasks = value()?.parse().map_err(|_| USAGE)?,
            "--counters" => counters = true,
            _ => return Err(USAGE.into()),
        }
    }
    let n = n.ok_or(USAGE)?;
    let board = Board::new(n.into()).map_err(|e| e.to_string())?;
    if every == 0 {
        return Err("--every takes 1 or more".into());
    }
    let started = Instant::now();
    let mut gpu = nq_gpu::Gpu::open(device).map_err(|e| e.to_string())?;
    gpu.self_test().map_err(|e| e.to_string())?;
    if counters {
        gpu = gpu.with_counters().map_err(|e| e.to_string())?;
    }
    let setup_ms = started.elapsed().as_secs_f64() * 1e3;
    let spec = SplitSpec::border(1).expect("a valid spec");
    let subs: Vec<SubProblem> = split(board, spec).into_iter().step_by(every).collect();
    let packed = Instant::now();
    let batch = nq_gpu::pack(&subs, min_tasks).map_err(|e| e.to_string())?;
    let pack_ms = packed.elapsed().as_secs_f64() * 1e3;
    // The launch, and follow-ups of what it spilled in its tail.
    let (stats, times) = gpu.count_all(batch).map_err(|e| e.to_string())?;
    let nodes: u64 = stats.iter().map(|s| s.nodes).sum();
    let mut tally = Tally::default();
    let never = AtomicBool::new(false);
    for (sub, s) in subs.iter().zip(&stats) {
        let c = nq_gpu::fixed_counts(sub, s.count, &never).expect("never stopped");
        sub.check(spec, &c).map_err(|e| e.to_string())?;
        tally.add(sub, &c).map_err(|e| e.to_string())?;
    }
    let published = nq_core::published::published(n).map(|(q, _)| q);
    let exact = (every == 1).then(|| Some(tally.total) == published);
    let mut out = json!({
        "n": n,
        "gpu": gpu.name(),
        "compiler": gpu.compiler(),
        "every": every,
        "subproblems": subs.len(),
        "tasks": times.tasks,
        "setup_ms": setup_ms,
        "pack_ms": pack_ms,
        "kernel_ms": times.kernel_ms,
        "spilled_tasks": times.spilled,
        "follow_up_launches": times.follow_ups,
        "wall_ms": times.wall_ms,
        "nodes": nodes,
        "nodes_per_s": nodes as f64 / (times.kernel_ms / 1e3),
        "total": tally.total.to_string(),
        "exact": exact,
    });
    if let Some(c) = times.counters {
        out["counters"] = json!({
            "laps": c.laps,
            "lane_iterations": c.lane_iterations,
            "warp_iterations": c.warp_iterations,
            "lanes_active": c.lanes_active(),
            "tail_efficiency": c.tail_efficiency(),
            "laps_per_node": c.laps as f64 / nodes.max(1) as f64,
        });
    }
    if exact == Some(false) {
        return Err(format!(
            "N = {n}: the GPU's total {} is not the published Q(N)",
            tally.total
        ));
    }
    Ok(out.to_string())
}
