//! How long `nq count` will take on this machine, told before it starts.
//!
//! The split's work estimates (`SubProblem::estimate`) compare sub-problems of
//! one board, not boards: they scale by 3 per free column, while the search
//! tree of N-Queens grows much faster with N. So the forecast measures:
//!
//! 1. **A calibration count** of [`REFERENCE`] on one thread, with the
//!    kernel the count will use, the faster of [`CALIBRATIONS`] runs: this
//!    machine's speed on a real count (about 12 ms each with a vector
//!    kernel). Only for a count that could take long: one whose tree would
//!    take under a minute even at [`SLOWEST_NODE_SECONDS`] is not measured.
//! 2. **The ratio of the two search trees**, N's to the reference's, by
//!    Knuth's estimator ("Estimating the efficiency of backtrack programs",
//!    1975): a random path from the root multiplies the number of choices at
//!    each column, and the sum of those products over the path is an
//!    unbiased estimate of the number of nodes. The mean of [`PROBES`] paths
//!    is cheap (a few milliseconds) and good to a few per cent from N = 15
//!    to 32.
//!
//! The forecast is then the calibration's time, times the ratio, divided by
//! the threads. It assumes that the work of a count is in proportion to the
//! size of its search tree, which holds for the split's symmetry reduction
//! and the kernels' cost per node from one N to the next.

use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use nq_core::Board;
use nq_core::search::{Kernel, nth_set_bit};
use nq_core::split::{SplitSpec, count_split_with};

/// The board of the calibration count: long enough to time (about 12 ms
/// with a vector kernel; N = 14 takes 2 ms, which a busy machine's
/// scheduling blurs).
pub(crate) const REFERENCE: u8 = 15;

/// Calibration counts; the fastest is kept, the one least slowed by the
/// machine's other work (with two, a forecast on a loaded 2-core machine was
/// twice the time the count took). About 60 ms in all, spent only on counts
/// that may take minutes.
const CALIBRATIONS: u32 = 5;

/// Seconds per node of the search tree on the slowest machine a count is
/// expected on: 17 times the AVX-512 kernel's 1.2·10⁻¹⁰ on the 2-core Xeon
/// VM this was measured on (N = 18 on one thread: a tree of 5.9·10¹⁰ nodes,
/// 6.9 s), and 3 times its scalar kernel's, which is 6 times slower. A count
/// that would not take long even at this speed skips the calibration, so
/// that short counts are not slowed by their forecast.
const SLOWEST_NODE_SECONDS: f64 = 2e-9;

/// Random paths per tree estimate: eight seeds agree to about 1 % with
/// 50,000 paths at N = 15, 18, 20 and 32, so to about 2 % with these; one
/// estimate takes a few milliseconds.
const PROBES: u32 = 10_000;

/// The fixed seed of the paths: the same forecast for the same measurement.
const SEED: u64 = 0x6e71_2d66_6f72_6563;

/// How long a count is expected to take.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Forecast {
    /// Wall-clock seconds on all the count's threads.
    pub(crate) seconds: f64,
    /// Core-seconds: the same work on one thread.
    pub(crate) core_seconds: f64,
}

/// Forecasts a count of `board` on `threads` threads with `kernel`, by a
/// calibration count of [`REFERENCE`] and the ratio of the search trees.
/// `None`, without a calibration, when the count would take less than
/// `worth` even at [`SLOWEST_NODE_SECONDS`]: there is nothing to warn about.
pub(crate) fn forecast(
    board: Board,
    threads: usize,
    kernel: Kernel,
    worth: Duration,
) -> Option<Forecast> {
    let tree = tree_size(board, PROBES, SEED);
    if tree * SLOWEST_NODE_SECONDS / (threads.max(1) as f64) < worth.as_secs_f64() {
        return None;
    }
    let reference = Board::new(REFERENCE.into()).expect("the reference board is valid");
    let calibration = (0..CALIBRATIONS)
        .map(|_| {
            let start = Instant::now();
            count_split_with(
                reference,
                SplitSpec::BORDER,
                kernel,
                &AtomicBool::new(false),
            )
            .expect("nothing stops the calibration count");
            start.elapsed()
        })
        .min()
        .expect("at least one calibration")
        // A clock too coarse to time it still gives a forecast, an optimistic
        // one.
        .max(Duration::from_micros(1));
    Some(scale(
        calibration,
        tree / tree_size(reference, PROBES, SEED),
        threads,
    ))
}

/// The forecast for a count whose tree is `ratio` times the calibration's,
/// which took `calibration` on one thread, run on `threads` threads.
fn scale(calibration: Duration, ratio: f64, threads: usize) -> Forecast {
    let core_seconds = calibration.as_secs_f64() * ratio;
    Forecast {
        seconds: core_seconds / threads.max(1) as f64,
        core_seconds,
    }
}

/// Knuth's estimate of the number of nodes of the whole N-Queens search tree
/// of `board` (every partial placement of columns 0, 1, … that no two queens
/// attack, the empty one included): the mean over `probes` random paths of
/// `1 + d₀ + d₀d₁ + …`, where `dᵢ` is the number of free rows in column `i`
/// after the path's queens in the columns before it.
pub(crate) fn tree_size(board: Board, probes: u32, seed: u64) -> f64 {
    let full = board.full_mask();
    let mut rng = SplitMix64(seed);
    let mut sum = 0.0;
    for _ in 0..probes {
        let (mut rows, mut up, mut down) = (0u32, 0u32, 0u32);
        let (mut weight, mut nodes) = (1.0f64, 1.0f64);
        for _ in 0..board.n() {
            let free = full & !(rows | up | down);
            if free == 0 {
                break;
            }
            let choices = free.count_ones();
            weight *= f64::from(choices);
            nodes += weight;
            let bit = nth_set_bit(free, (rng.next() % u64::from(choices)) as u32);
            rows |= bit;
            up = ((up | bit) << 1) & full;
            down = (down | bit) >> 1;
        }
        sum += nodes;
    }
    sum / f64::from(probes.max(1))
}

/// Steele, Lea and Flood's SplitMix64: a small, fast generator, good enough
/// to choose paths (and std has none).
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// A duration for a person: `45 s`, `12 min`, `3.5 h`, `9 days`, `40 years`,
/// `3.1 thousand years`, `2.4 million years`, then powers of ten.
pub(crate) fn human(seconds: f64) -> String {
    const MINUTE: f64 = 60.0;
    const HOUR: f64 = 60.0 * MINUTE;
    const DAY: f64 = 24.0 * HOUR;
    const YEAR: f64 = 365.25 * DAY;
    if !seconds.is_finite() {
        return "forever".to_owned();
    }
    let seconds = seconds.max(0.0);
    if seconds < 90.0 {
        return format!("{seconds:.0} s");
    }
    if seconds < 90.0 * MINUTE {
        return format!("{:.0} min", seconds / MINUTE);
    }
    if seconds < 48.0 * HOUR {
        return format!("{:.1} h", seconds / HOUR);
    }
    if seconds < 2.0 * YEAR {
        return format!("{:.0} days", seconds / DAY);
    }
    let years = seconds / YEAR;
    match years {
        y if y < 1e3 => format!("{y:.0} years"),
        y if y < 1e6 => format!("{:.1} thousand years", y / 1e3),
        y if y < 1e9 => format!("{:.1} million years", y / 1e6),
        y if y < 1e12 => format!("{:.1} billion years", y / 1e9),
        y => format!("{y:.1e} years"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The number of nodes of the whole tree, by walking it.
    fn exact_tree_size(board: Board) -> u64 {
        fn walk(full: u32, rows: u32, up: u32, down: u32) -> u64 {
            let mut free = full & !(rows | up | down);
            let mut nodes = 1;
            while free != 0 {
                let bit = free & free.wrapping_neg();
                free ^= bit;
                nodes += walk(
                    full,
                    rows | bit,
                    ((up | bit) << 1) & full,
                    (down | bit) >> 1,
                );
            }
            nodes
        }
        let full = board.full_mask();
        walk(full, 0, 0, 0)
    }

    #[test]
    fn the_tree_estimate_is_close_to_the_walked_tree() {
        for n in [1, 4, 8, 10, 12] {
            let board = Board::new(n).unwrap();
            let exact = exact_tree_size(board) as f64;
            let estimate = tree_size(board, PROBES, SEED);
            let error = (estimate / exact - 1.0).abs();
            // Knuth's estimator is unbiased; with 10,000 paths its error is
            // about a per cent at these sizes.
            assert!(error < 0.05, "n={n}: estimate {estimate}, walked {exact}");
        }
    }

    #[test]
    fn larger_boards_have_larger_trees() {
        let sizes: Vec<f64> = (14..=32)
            .map(|n| tree_size(Board::new(n).unwrap(), 20_000, SEED))
            .collect();
        for pair in sizes.windows(2) {
            // Each column more multiplies the tree by at least the ~5 of N = 14.
            assert!(pair[1] > 4.0 * pair[0], "{sizes:?}");
        }
        // Q(32) is about 10^21 and the tree a good deal larger: a count of
        // N = 32 is never forecast as anything short.
        assert!(sizes.last().unwrap() > &1e21, "{sizes:?}");
    }

    #[test]
    fn scale_divides_the_core_time_among_threads() {
        let f = scale(Duration::from_millis(50), 1000.0, 4);
        assert!((f.core_seconds - 50.0).abs() < 1e-9, "{f:?}");
        assert!((f.seconds - 12.5).abs() < 1e-9, "{f:?}");
        assert_eq!(scale(Duration::from_millis(50), 1000.0, 0).seconds, 50.0);
    }

    #[test]
    fn no_forecast_for_counts_that_cannot_take_long() {
        let minute = Duration::from_secs(60);
        // A tree of 8·10⁹ nodes: 16 s on one thread at the slowest speed.
        let board = Board::new(17).unwrap();
        assert_eq!(forecast(board, 1, Kernel::Auto, minute), None);
        // 5.9·10¹⁰ nodes: 2 minutes on one thread at the slowest speed, so
        // it is measured; 15 s on 8 threads, so it is not.
        let board = Board::new(18).unwrap();
        assert!(forecast(board, 1, Kernel::Auto, minute).is_some());
        assert_eq!(forecast(board, 8, Kernel::Auto, minute), None);
    }

    #[test]
    fn durations_read_as_a_person_would_say_them() {
        assert_eq!(human(42.4), "42 s");
        assert_eq!(human(600.0), "10 min");
        assert_eq!(human(3.5 * 3600.0), "3.5 h");
        assert_eq!(human(9.0 * 86400.0), "9 days");
        let year = 365.25 * 86400.0;
        assert_eq!(human(40.0 * year), "40 years");
        assert_eq!(human(3.14e3 * year), "3.1 thousand years");
        assert_eq!(human(2.4e6 * year), "2.4 million years");
        assert_eq!(human(7.0e9 * year), "7.0 billion years");
        assert_eq!(human(5.0e13 * year), "5.0e13 years");
        assert_eq!(human(f64::INFINITY), "forever");
    }
}
