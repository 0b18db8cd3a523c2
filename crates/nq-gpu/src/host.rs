//! The kernel's own source, compiled as host C++ under UBSan by build.rs,
//! run on the buffers [`crate::pack`] builds against nq-core: thread by
//! thread (two OS threads sharing the task counter, as two GPU threads of
//! different blocks), and lock-step over warps of 32 lanes, which also
//! measures how busy a warp's lanes are.
//!
//! This is what can be checked without a GPU: the kernel's logic (task
//! decoding, the stack and its indexing, the table looked up by popcount, the
//! table's count words, the 32-bit counters and their flush, 64-bit sums, the
//! persistent-thread loop and its in-loop refill under a shared counter) and
//! the host's packing and folding. Not checked here: the driver path and
//! speed; SIMT behaviour only as far as the lock-step model goes (each lane's
//! lap is branch-free, so a warp step is one lap of each lane with a task).

use std::sync::atomic::AtomicBool;

use nq_core::board::Board;
use nq_core::search::CountStats;
use nq_core::split::{SplitSpec, SubProblem, Tally, split};

use crate::BLOCK;
use crate::pack::{
    Batch, MAX_TASK_COLUMNS, SPILL_HEAD, STACK_DEPTH, TABLE_WORDS, TASK_WORDS, pack,
    pack_at_depth,
};

/// What the lock-step run saw; `nq_host_simt_stats` in host.cpp.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct SimtStats {
    /// Warp steps in which some lane placed a queen.
    steps: u64,
    /// Lanes that placed a queen, summed over the steps.
    lane_laps: u64,
    /// The same two while the task counter still had tasks.
    steady_steps: u64,
    steady_lane_laps: u64,
    /// Steady steps in which some lane ran the refill branch for a new task,
    /// and the lanes that ran it.
    refill_steps: u64,
    refill_lanes: u64,
    /// Steady steps in which lanes only flushed their accumulator, and those
    /// lanes.
    flush_steps: u64,
    flush_lanes: u64,
    /// The same for the table copy inside the refill.
    copy_steps: u64,
    copy_lanes: u64,
    /// Table entries the lanes copied, and the longest copy of each steady
    /// step summed over the steps (the warp runs the copy loop that long).
    copy_entries: u64,
    copy_step_entries: u64,
}

unsafe extern "C" {
    fn nq_host_table_words() -> u32;
    fn nq_host_task_words() -> u32;
    fn nq_host_block() -> u32;
    fn nq_host_depth() -> u32;
    fn nq_host_count(
        kernel_n: u32,
        n: u32,
        block: u32,
        thread: u32,
        tables: *const u32,
        tasks: *const u32,
        task_count: u32,
        next_task: *mut u32,
        counts: *mut u64,
        nodes: *mut u64,
        spill: *mut u32,
    ) -> i32;
    fn nq_host_spill_head() -> u32;
    fn nq_host_count_counters(
        n: u32,
        block: u32,
        thread: u32,
        tables: *const u32,
        tasks: *const u32,
        task_count: u32,
        next_task: *mut u32,
        counts: *mut u64,
        nodes: *mut u64,
        counters: *mut u64,
    ) -> i32;
    fn nq_host_simt(
        kernel_n: u32,
        n: u32,
        warps: u32,
        tables: *const u32,
        tasks: *const u32,
        task_count: u32,
        counts: *mut u64,
        nodes: *mut u64,
        spill: *mut u32,
        stats: *mut SimtStats,
    ) -> i32;
}

/// Largest board sizes host.cpp compiles a copy of the kernel for, besides 32
/// (the embedded PTX's build, valid for every board).
const HOST_SIZES: std::ops::RangeInclusive<u8> = 1..=17;

/// Output pointers shared by the two simulated GPU threads. Each task index
/// is handed out once by the atomic counter, so each entry is written by one
/// thread only, as on the GPU.
struct Shared {
    next: *mut u32,
    counts: *mut u64,
    nodes: *mut u64,
}

// SAFETY: see the struct's doc: the kernel writes disjoint entries and reads
// the counter only through atomics; the buffers outlive the scoped threads.
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

/// Runs the host kernel built for boards up to `kernel_n` on `batch` with two
/// OS threads (as threads of two different blocks, at different lanes)
/// sharing one task counter, and folds the results.
fn run_host(batch: &Batch, kernel_n: u8) -> Vec<CountStats> {
    let tasks = batch.task_count();
    let mut next = 0u32;
    let mut counts = vec![u64::MAX; tasks as usize];
    let mut nodes = vec![u64::MAX; tasks as usize];
    let shared = Shared {
        next: &mut next,
        counts: counts.as_mut_ptr(),
        nodes: nodes.as_mut_ptr(),
    };
    let n = u32::from(batch.board().n());
    std::thread::scope(|s| {
        for (block, thread) in [(0, 0), (1, BLOCK - 1)] {
            let shared = &shared;
            s.spawn(move || {
                // SAFETY: the buffers have one entry per task and live until
                // the scope ends; the counter starts at 0.
                let rc = unsafe {
                    nq_host_count(
                        kernel_n.into(),
                        n,
                        block,
                        thread,
                        batch.tables().as_ptr(),
                        batch.tasks().as_ptr(),
                        tasks,
                        shared.next,
                        shared.counts,
                        shared.nodes,
                        std::ptr::null_mut(),
                    )
                };
                assert_eq!(rc, 0, "no host kernel for n={kernel_n}");
            });
        }
    });
    batch.fold(&counts, &nodes).unwrap()
}

/// Runs the host kernel built for boards up to `kernel_n` lock-step over
/// `warps` warps of 32 lanes, and folds the results.
fn run_simt(batch: &Batch, kernel_n: u8, warps: u32) -> (Vec<CountStats>, SimtStats) {
    let (stats, s, spilled) = run_simt_spilling(batch, kernel_n, warps, 0);
    assert!(spilled.is_empty());
    (stats, s)
}

/// [`run_simt`] with a spill queue of `cap` tasks (none when 0); also
/// returns the spilled tasks.
fn run_simt_spilling(
    batch: &Batch,
    kernel_n: u8,
    warps: u32,
    cap: u32,
) -> (Vec<CountStats>, SimtStats, Vec<u32>) {
    let tasks = batch.task_count();
    let head = SPILL_HEAD;
    let mut spill = vec![0u32; head + cap as usize * TASK_WORDS];
    spill[2] = cap;
    let spill_ptr = if cap == 0 {
        std::ptr::null_mut()
    } else {
        spill.as_mut_ptr()
    };
    let mut counts = vec![u64::MAX; tasks as usize];
    let mut nodes = vec![u64::MAX; tasks as usize];
    let mut stats = SimtStats::default();
    // SAFETY: the buffers have one entry per task; the call is synchronous.
    let rc = unsafe {
        nq_host_simt(
            kernel_n.into(),
            batch.board().n().into(),
            warps,
            batch.tables().as_ptr(),
            batch.tasks().as_ptr(),
            tasks,
            counts.as_mut_ptr(),
            nodes.as_mut_ptr(),
            spill_ptr,
            &mut stats,
        )
    };
    assert_eq!(rc, 0, "no lock-step host kernel for n={kernel_n}");
    let written = spill[1] as usize;
    let spilled = spill[head..head + written * TASK_WORDS].to_vec();
    (batch.fold(&counts, &nodes).unwrap(), stats, spilled)
}

use crate::pack::reference;

/// Counts `subs` on the host kernel of their own size and of size 32 (the
/// embedded PTX's build), at every expansion depth the host can make (from
/// one task per sub-problem to the deepest), and compares each sub-problem
/// with nq-core's depth-first reference: completions and nodes.
fn check_at_every_depth(subs: &[SubProblem], what: &str) {
    let n = subs[0].prefix().board().n();
    let want: Vec<CountStats> = subs.iter().map(reference).collect();
    let mut last_tasks = None;
    for depth in 0..=usize::from(n) {
        let batch = pack_at_depth(subs, depth).unwrap();
        // Past the deepest level the host expands, every depth packs the
        // same tasks: nothing new to check.
        if last_tasks == Some(batch.task_count()) && depth > 0 {
            continue;
        }
        last_tasks = Some(batch.task_count());
        for kernel_n in [n, 32] {
            let got = run_host(&batch, kernel_n);
            for ((sub, got), want) in subs.iter().zip(&got).zip(&want) {
                assert_eq!(
                    got,
                    want,
                    "{what} {:?} (kernel n={kernel_n}, depth {depth}, {} tasks)",
                    sub.prefix(),
                    batch.task_count()
                );
            }
        }
    }
}

#[test]
fn layout_matches_the_kernel_source() {
    // SAFETY: constant getters.
    unsafe {
        assert_eq!(nq_host_table_words() as usize, TABLE_WORDS);
        assert_eq!(nq_host_task_words() as usize, TASK_WORDS);
        assert_eq!(nq_host_block(), BLOCK);
        assert_eq!(nq_host_depth() as usize, STACK_DEPTH);
        assert_eq!(nq_host_spill_head() as usize, SPILL_HEAD);
    }
    assert_eq!(MAX_TASK_COLUMNS, STACK_DEPTH);
}

/// Every sub-problem of N = 4..14, border split with 0, 1 and 2 extra
/// columns, at every expansion depth, against nq-core's reference.
#[test]
fn every_subproblem_of_n_4_to_14_at_every_depth_matches_the_cpu() {
    for n in 4..=14u64 {
        for extra in 0..=2 {
            let spec = SplitSpec::border(extra).unwrap();
            let subs = split(Board::new(n).unwrap(), spec);
            check_at_every_depth(&subs, &format!("n={n} extra={extra}"));
        }
    }
}

/// Whole counts: the host kernel's counts, checked and folded exactly as the
/// worker folds the GPU's (fixed counts from the CPU, `SubProblem::check`,
/// `Tally`), give the published Q(N) and U(N) for N = 1..15.
#[test]
fn whole_counts_of_n_1_to_15_match_the_published_values() {
    let never = AtomicBool::new(false);
    for n in HOST_SIZES.filter(|&n| n <= 15) {
        let board = Board::new(n.into()).unwrap();
        let spec = SplitSpec::border(1).unwrap();
        let subs = split(board, spec);
        let batch = pack(&subs, 1 << 12).unwrap();
        for kernel_n in [n, 32] {
            let got = run_host(&batch, kernel_n);
            let mut tally = Tally::default();
            for (sub, stats) in subs.iter().zip(&got) {
                let counts = crate::fixed_counts(sub, stats.count, &never).unwrap();
                sub.check(spec, &counts).unwrap();
                tally.add(sub, &counts).unwrap();
            }
            let (q, u) = nq_core::published::published(n).unwrap();
            assert_eq!(
                (tally.total, tally.unique().unwrap()),
                (q, u),
                "n={n} kernel n={kernel_n}"
            );
        }
    }
}

/// The lock-step run is the same kernel: its counts are exact too.
#[test]
fn the_lock_step_run_counts_exactly() {
    for n in [8u8, 12] {
        let subs = split(Board::new(n.into()).unwrap(), SplitSpec::border(1).unwrap());
        let batch = pack(&subs, 1 << 10).unwrap();
        for warps in [1, 3] {
            let (got, stats) = run_simt(&batch, 32, warps);
            for (sub, got) in subs.iter().zip(&got) {
                assert_eq!(*got, reference(sub), "n={n} {:?}", sub.prefix());
            }
            assert!(stats.steps > 0 && stats.lane_laps <= 32 * stats.steps);
        }
    }
}

/// Floors of the lane-utilisation check (issue 24, item 4): in steady state
/// (while tasks are left) at least 28 of 32 lanes active per issued warp
/// instruction, the refill branch priced in; at most 1.10 laps per node (a
/// lap is a node, a queen in the second-to-last column, or the completion
/// that takes the last column's free row).
const MIN_STEADY_LANES: f64 = 28.0;
const MAX_LAPS_PER_NODE: f64 = 1.10;

/// SASS instructions a warp issues per lap, per refill without a table copy,
/// per flush of the accumulator alone (the spill check's atomic included),
/// and per table entry copied, for N = 21 on sm_90 (the lap as
/// `.ci/sass-lap.py` counts it; the refill's and the flush's paths read from
/// the same disassembly beyond the lap's guard; the copy loop, unrolled four
/// times, at about 3.2 instructions per entry).
const LAP_INSNS: f64 = 29.0;
const REFILL_INSNS: f64 = 75.0;
const FLUSH_INSNS: f64 = 25.0;
const COPY_INSNS_PER_ENTRY: f64 = 3.2;

/// Warps of the lock-step run: an eighth of an H100's resident warps at this
/// kernel's occupancy (132 SMs × 16 warps), so that each lane gets about as
/// many tasks as in a launch of N = 20 on a whole H100 (8 to 60).
const WARPS: u32 = 256;

/// The lane-utilisation emulation: pack's own tasks (split and ordered as
/// for a launch) for N = 16 (every sub-problem) and N = 17 (every 4th, to
/// keep the test to seconds), run lock-step over an H100's warps. Prints the
/// figures; fails below the floors, on any count that differs from the
/// threaded run's, and on a total of N = 16 other than Q(16).
///
/// Tasks per launch: 2^16. The boards are tiny for a GPU (N = 17 is about a
/// millisecond on an H100), and 2^19 tasks would give each one 150 laps, a
/// tenth of what a task of N = 20 at depth 4 has, so the refill would weigh
/// ten times what it weighs where the time goes.
#[test]
fn lane_utilisation_emulation_meets_its_floors() {
    for (n, every) in [(16u8, 1), (17, 4)] {
        let spec = SplitSpec::border(1).unwrap();
        let subs: Vec<SubProblem> = split(Board::new(n.into()).unwrap(), spec)
            .into_iter()
            .step_by(every)
            .collect();
        let batch = pack(&subs, 1 << 16).unwrap();
        let (got, s) = run_simt(&batch, n, WARPS);
        // The lock-step run counts what the threaded run counts (checked
        // against nq-core elsewhere; nq-core's debug build would take a
        // minute here).
        assert_eq!(got, run_host(&batch, n), "n={n}");
        if every == 1 {
            let never = AtomicBool::new(false);
            let mut tally = Tally::default();
            for (sub, stats) in subs.iter().zip(&got) {
                let counts = crate::fixed_counts(sub, stats.count, &never).unwrap();
                tally.add(sub, &counts).unwrap();
            }
            let (q, _) = nq_core::published::published(n).unwrap();
            assert_eq!(tally.total, q, "n={n}");
        }
        // The nodes the kernel placed: all but the host's expansion, which
        // the fold adds back.
        let zeros = vec![0; batch.task_count() as usize];
        let host = batch.fold(&zeros, &zeros).unwrap();
        let kernel_nodes: u64 =
            got.iter().zip(&host).map(|(g, h)| g.nodes - h.nodes).sum();
        let f = |x: u64| x as f64;
        // Lanes active per issued warp instruction in steady state: lap
        // instructions run on every lane with a task, refill and copy
        // instructions on the lanes that refill while the others wait.
        let thread_insns = LAP_INSNS * f(s.steady_lane_laps)
            + REFILL_INSNS * f(s.refill_lanes)
            + FLUSH_INSNS * f(s.flush_lanes)
            + COPY_INSNS_PER_ENTRY * f(s.copy_entries);
        let warp_insns = LAP_INSNS * f(s.steady_steps)
            + REFILL_INSNS * f(s.refill_steps)
            + FLUSH_INSNS * f(s.flush_steps)
            + COPY_INSNS_PER_ENTRY * f(s.copy_step_entries);
        let steady = thread_insns / warp_insns;
        let per_lap = f(s.steady_lane_laps) / f(s.steady_steps);
        let tail = (f(s.lane_laps) / f(s.steps)) / per_lap;
        let laps_per_node = f(s.lane_laps) / f(kernel_nodes);
        println!(
            "lane emulation N={n} (border(1), 1 in {every} sub-problems, {} tasks, \
             {WARPS} warps): steady state {steady:.2} of 32 lanes active per issued \
             instruction ({per_lap:.2} per lap; refill in {:.2}% of steps, flush only in \
             {:.2}%, table copy in {:.2}%, {:.1} entries per copy), tail efficiency \
             {tail:.3}, {laps_per_node:.4} laps per node, {} lane laps, {} nodes",
            batch.task_count(),
            100.0 * f(s.refill_steps) / f(s.steady_steps),
            100.0 * f(s.flush_steps) / f(s.steady_steps),
            100.0 * f(s.copy_steps) / f(s.steady_steps),
            f(s.copy_entries) / f(s.copy_lanes),
            s.lane_laps,
            kernel_nodes,
        );
        assert!(
            steady >= MIN_STEADY_LANES,
            "N={n}: {steady:.2} lanes active in steady state, floor {MIN_STEADY_LANES}"
        );
        assert!(
            laps_per_node <= MAX_LAPS_PER_NODE,
            "N={n}: {laps_per_node:.4} laps per node, ceiling {MAX_LAPS_PER_NODE}"
        );
    }
}

/// Tail control on the device: in the launch's tail, lanes give their
/// pending stacks back as tasks; counting those in follow-up launches (until
/// none spills) gives nq-core's counts and nodes exactly, and the spills did
/// happen. A queue too small for a stack spills nothing of it.
#[test]
fn spilled_work_counted_in_follow_ups_is_exact() {
    let subs = split(Board::new(14).unwrap(), SplitSpec::border(1).unwrap());
    let want: Vec<CountStats> = subs.iter().map(reference).collect();
    for cap in [1, 1 << 16] {
        // Few tasks for the 2,048 lanes, so that many are still busy, more
        // than a flush (2^12 nodes) from their end, when the queue empties.
        let mut batch = pack(&subs, 1 << 9).unwrap();
        let mut total = vec![CountStats::default(); subs.len()];
        let mut spilled_tasks = 0;
        let mut launches = 0;
        loop {
            let (got, _, spilled) = run_simt_spilling(&batch, 32, 64, cap);
            for (t, g) in total.iter_mut().zip(&got) {
                t.count += g.count;
                t.nodes += g.nodes;
            }
            launches += 1;
            if spilled.is_empty() {
                break;
            }
            spilled_tasks += spilled.len() / TASK_WORDS;
            batch = batch.follow_up(&spilled).unwrap();
        }
        assert_eq!(total, want, "cap {cap}");
        if cap == 1 {
            // Every stack has at least one entry, and a one-task queue
            // takes only a one-entry stack.
            assert!(spilled_tasks <= launches, "cap 1: {spilled_tasks} tasks");
        } else {
            assert!(spilled_tasks > 0 && launches > 1, "nothing spilled");
        }
    }
    let batch = pack(&subs, 1 << 12).unwrap();
    assert!(batch.follow_up(&[0; TASK_WORDS + 1]).is_err());
    assert!(batch.follow_up(&[u32::MAX, 0, 0, 0, 1]).is_err());
}

/// The counters build (for GPU machines without Nsight Compute) counts
/// exactly too, and its counters add up: its laps are the lock-step run's
/// (the laps of a task do not depend on who runs it), and with one lane per
/// warp the warps' iterations are the lanes'.
#[test]
fn the_counters_build_counts_exactly_and_its_counters_add_up() {
    let subs = split(Board::new(12).unwrap(), SplitSpec::border(1).unwrap());
    let batch = pack(&subs, 1 << 10).unwrap();
    let tasks = batch.task_count();
    let mut next = 0u32;
    let mut counts = vec![u64::MAX; tasks as usize];
    let mut nodes = vec![u64::MAX; tasks as usize];
    // Blocks 0 and 1, threads 0 and BLOCK - 1: warps 0 and 3 of the grid.
    let mut words = vec![0u64; 4 + 4];
    for (block, thread) in [(0, 0), (1, BLOCK - 1)] {
        // SAFETY: one entry per task, 8 counter words for a 4-warp grid;
        // the lanes run one after the other, sharing the counter.
        let rc = unsafe {
            nq_host_count_counters(
                12,
                block,
                thread,
                batch.tables().as_ptr(),
                batch.tasks().as_ptr(),
                tasks,
                &mut next,
                counts.as_mut_ptr(),
                nodes.as_mut_ptr(),
                words.as_mut_ptr(),
            )
        };
        assert_eq!(rc, 0);
    }
    let got = batch.fold(&counts, &nodes).unwrap();
    for (sub, got) in subs.iter().zip(&got) {
        assert_eq!(*got, reference(sub), "{:?}", sub.prefix());
    }
    let (_, simt) = run_simt(&batch, 32, 2);
    assert_eq!(words[0], simt.lane_laps, "laps");
    // Each lane's iterations: its laps and its last, failed, refill.
    assert_eq!(words[1], words[0] + 2, "iterations");
    assert_eq!(words[4] + words[7], words[1], "warp iterations");
    assert_eq!((words[5], words[6]), (0, 0), "warps with no lane");
    assert!(words[2] >= words[3] && words[3] > 0, "cycles");
}

/// A board size with no host copy is refused, not run with a wrong stack.
#[test]
fn unknown_sizes_and_lanes_are_refused() {
    let mut next = 0u32;
    for (kernel_n, n, thread) in [(20, 20, 0), (8, 8, BLOCK)] {
        // SAFETY: no task is read: the call returns before the kernel runs.
        let rc = unsafe {
            nq_host_count(
                kernel_n,
                n,
                0,
                thread,
                std::ptr::null(),
                std::ptr::null(),
                0,
                &mut next,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        assert_eq!(rc, -1);
    }
    let mut stats = SimtStats::default();
    // SAFETY: as above: refused before any buffer is read.
    let rc = unsafe {
        nq_host_simt(
            16,
            17,
            1,
            std::ptr::null(),
            std::ptr::null(),
            0,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            &mut stats,
        )
    };
    assert_eq!(rc, -1);
}
