//! The kernel's own source, compiled as host C++ under UBSan by build.rs,
//! run on the buffers [`crate::pack`] builds, with two OS threads sharing the
//! task counter, against nq-core.
//!
//! This is what can be checked without a GPU: the kernel's logic (task
//! decoding, the stack and its indexing, the closed forms, 64-bit sums, the
//! persistent-thread loop under a shared counter) and the host's packing and
//! folding. Not checked here: SIMT behaviour, the driver path, speed.

use std::sync::atomic::AtomicBool;

use nq_core::board::Board;
use nq_core::search::{self, CountStats};
use nq_core::split::{SplitSpec, SubProblem, Tally, split};

use crate::BLOCK;
use crate::pack::{Batch, TABLE_WORDS, TASK_WORDS, pack};

unsafe extern "C" {
    fn nq_host_table_words() -> u32;
    fn nq_host_task_words() -> u32;
    fn nq_host_block() -> u32;
    fn nq_host_count(
        n: u32,
        block: u32,
        thread: u32,
        tables: *const u32,
        tasks: *const u32,
        task_count: u32,
        next_task: *mut u32,
        counts: *mut u64,
        nodes: *mut u64,
    ) -> i32;
}

/// Board sizes host.cpp compiles a copy of the kernel for (besides 32).
const HOST_SIZES: std::ops::RangeInclusive<u8> = 1..=16;

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

/// Runs the host kernel of size `kernel_n` on `batch` with two OS threads
/// (as threads of two different blocks, at different lanes) sharing one task
/// counter, and folds the results.
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
    std::thread::scope(|s| {
        for (block, thread) in [(0, 0), (1, BLOCK - 1)] {
            let shared = &shared;
            s.spawn(move || {
                // SAFETY: the buffers have one entry per task and live until
                // the scope ends; the counter starts at 0.
                let rc = unsafe {
                    nq_host_count(
                        kernel_n.into(),
                        block,
                        thread,
                        batch.tables().as_ptr(),
                        batch.tasks().as_ptr(),
                        tasks,
                        shared.next,
                        shared.counts,
                        shared.nodes,
                    )
                };
                assert_eq!(rc, 0, "no host kernel for n={kernel_n}");
            });
        }
    });
    batch.fold(&counts, &nodes).unwrap()
}

fn reference(sub: &SubProblem) -> CountStats {
    let never = AtomicBool::new(false);
    search::count_masked_reference(sub.prefix(), &sub.forbidden(), &never).unwrap()
}

/// Counts `subs` on the host kernel of their own size and of size 32 (the
/// embedded PTX's build), at a few expansion depths, and compares each
/// sub-problem with nq-core's depth-first reference.
fn check_against_reference(subs: &[SubProblem], what: &str) {
    let n = subs[0].prefix().board().n();
    let want: Vec<CountStats> = subs.iter().map(reference).collect();
    for min_tasks in [0, 1 << 10, 1 << 16] {
        let batch = pack(subs, min_tasks).unwrap();
        for kernel_n in [n, 32] {
            let got = run_host(&batch, kernel_n);
            for ((sub, got), want) in subs.iter().zip(&got).zip(&want) {
                assert_eq!(
                    got,
                    want,
                    "{what} {:?} (kernel n={kernel_n}, {} tasks)",
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
    }
}

/// Every sub-problem of N = 4..12, border split with 0, 1 and 2 extra
/// columns, against nq-core's reference: completions and nodes.
#[test]
fn every_subproblem_of_n_4_to_12_matches_the_cpu() {
    for n in 4..=12u64 {
        for extra in 0..=2 {
            let spec = SplitSpec::border(extra).unwrap();
            let subs = split(Board::new(n).unwrap(), spec);
            check_against_reference(&subs, &format!("n={n} extra={extra}"));
        }
    }
}

/// A sample of N = 13..15: every 7th sub-problem of the border split with
/// one extra column, plus the first and last.
#[test]
fn a_sample_of_n_13_to_15_matches_the_cpu() {
    for n in 13..=15u64 {
        let subs = split(Board::new(n).unwrap(), SplitSpec::border(1).unwrap());
        let mut sample: Vec<SubProblem> = subs.iter().step_by(7).copied().collect();
        sample.push(*subs.last().unwrap());
        check_against_reference(&sample, &format!("n={n}"));
    }
}

/// Whole counts: the host kernel's counts, checked and folded exactly as the
/// worker folds the GPU's (fixed counts from the CPU, `SubProblem::check`,
/// `Tally`), give the published Q(N) and U(N).
#[test]
fn whole_counts_match_the_published_values() {
    let never = AtomicBool::new(false);
    for n in HOST_SIZES.filter(|&n| n <= 14) {
        let board = Board::new(n.into()).unwrap();
        let spec = SplitSpec::border(1).unwrap();
        let subs = split(board, spec);
        let batch = pack(&subs, 1 << 12).unwrap();
        let got = run_host(&batch, n);
        let mut tally = Tally::default();
        for (sub, stats) in subs.iter().zip(&got) {
            let counts = crate::fixed_counts(sub, stats.count, &never).unwrap();
            sub.check(spec, &counts).unwrap();
            tally.add(sub, &counts).unwrap();
        }
        let (q, u) = nq_core::published::published(n).unwrap();
        assert_eq!((tally.total, tally.unique().unwrap()), (q, u), "n={n}");
    }
}

/// A board size with no host copy is refused, not run with a wrong stack.
#[test]
fn unknown_sizes_and_lanes_are_refused() {
    let mut next = 0u32;
    // SAFETY: no task is read: the call returns before the kernel runs.
    let rc = unsafe {
        nq_host_count(
            20,
            0,
            0,
            std::ptr::null(),
            std::ptr::null(),
            0,
            &mut next,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    assert_eq!(rc, -1);
    // SAFETY: as above.
    let rc = unsafe {
        nq_host_count(
            8,
            0,
            BLOCK,
            std::ptr::null(),
            std::ptr::null(),
            0,
            &mut next,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    assert_eq!(rc, -1);
}
