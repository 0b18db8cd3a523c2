//! Solving a sub-problem: counting its completions on a kernel (pre-placing
//! the strict border lines when that is cheaper), listing them, estimating
//! the work, and the single-threaded count of a whole split.

use std::sync::atomic::AtomicBool;

use super::{
    Kind, LINE_BOTTOM, LINE_RIGHT, LINE_TOP, SplitSpec, SubCounts, SubProblem, Tally,
    split,
};
use crate::board::{Board, MAX_N, Prefix};
use crate::search::{self, CountStats, Kernel, Outcome, Sink};
use crate::symmetry::Symmetry;

impl SubProblem {
    /// Counts the completions, and the symmetric ones when the ring is
    /// symmetric. Returns `None` when `stop` was set.
    pub fn solve(&self, stop: &AtomicBool) -> Option<(SubCounts, CountStats)> {
        self.solve_with(Kernel::Auto, stop)
    }

    /// [`SubProblem::solve`] on the chosen count kernel.
    pub fn solve_with(
        &self,
        kernel: Kernel,
        stop: &AtomicBool,
    ) -> Option<(SubCounts, CountStats)> {
        let forbidden = self.forbidden();
        let stats = match self.kind {
            Kind::Border { k, strict, .. } if k <= PRE_PLACE_MAX_K => {
                count_by_lines(&self.prefix, &forbidden, strict, kernel, stop)?
            }
            _ => search::count_masked(&self.prefix, &forbidden, kernel, stop)?,
        };
        let stab = self.stabilizer();
        let fixed = |g: Symmetry| -> Option<u128> {
            if stab.contains(g) {
                search::count_fixed(&self.prefix, g, stop)
            } else {
                Some(0)
            }
        };
        let counts = SubCounts {
            count: stats.count,
            fixed180: fixed(Symmetry::Rot180)?,
            fixed90: fixed(Symmetry::Rot90)?,
        };
        Some((counts, stats))
    }

    /// Lists the completions in lexicographic order, passing each to `sink`
    /// until it returns `Break`.
    pub fn list<S: Sink + ?Sized>(&self, sink: &mut S) -> Outcome {
        search::search_masked(&self.prefix, &self.forbidden(), sink)
    }

    /// The prefixes whose masked counts [`SubProblem::solve`] adds up: the
    /// queens of the strict border lines pre-placed (see `count_by_lines`)
    /// when it does that, else the sub-problem's own prefix. Each avoids
    /// [`SubProblem::forbidden`]; their completions partition the
    /// sub-problem's, and their searches' nodes add up to the nodes
    /// `solve` reports. For an outside kernel (the GPU's) that is to visit
    /// the nodes the CPU kernels visit.
    pub fn solve_prefixes(&self) -> Vec<Prefix> {
        let mut out = vec![];
        match self.kind {
            Kind::Border { k, strict, .. } if k <= PRE_PLACE_MAX_K => {
                let forbidden = self.forbidden();
                for_each_line_prefix(&self.prefix, &forbidden, strict, &mut |p| {
                    out.push(*p)
                });
            }
            _ => out.push(self.prefix),
        }
        out
    }

    /// An estimate of the work of [`SubProblem::solve`], in arbitrary units that
    /// are comparable within one split. Used for progress, ETA and job sizes,
    /// never for counts.
    pub fn estimate(&self) -> u64 {
        search::estimate_work(&self.prefix, &self.forbidden())
    }
}

/// The largest corner distance `k` at which [`SubProblem::solve`] pre-places
/// the queens of a border sub-problem's strict lines (see [`count_by_lines`]).
///
/// With a small `k` each strict line allows only the `2k − 1` or so squares
/// near its corners, but the left-to-right search meets the demand that rows 0
/// and N−1 be filled only in its last columns, after searching the middle of
/// the board in vain. Pre-placing those queens costs a repeat of the top of
/// the search per placement, about `(2k)³` of them. Measured at N = 14..17
/// with the scalar kernel, 4 is the best bound at every size (one-thread
/// N = 16 is 5–8 % faster than without pre-placing; 3 and 5 are slower). With
/// the AVX-512 kernel any bound from 2 to 4 gives the same time, about 10 %
/// faster than none.
const PRE_PLACE_MAX_K: u8 = 4;

/// Counts the completions of `prefix` that avoid `forbidden`, partitioned by
/// the queen of each border line in `lines` that `prefix` leaves empty.
///
/// Every completion has exactly one queen on each border line, so summing the
/// counts over every allowed square of one line is exact. Pre-placing a line
/// whose allowed squares are few turns a constraint that the column-by-column
/// search would only meet at its last columns into one it starts from.
fn count_by_lines(
    prefix: &Prefix,
    forbidden: &[u32; MAX_N as usize],
    lines: u8,
    kernel: Kernel,
    stop: &AtomicBool,
) -> Option<CountStats> {
    let Some(line) = next_line(prefix, lines) else {
        return search::count_masked(prefix, forbidden, kernel, stop);
    };
    let mut total = CountStats::default();
    for (c, r) in line {
        if forbidden[usize::from(c)] & (1 << r) == 0 && prefix.allows(c, r) {
            let mut p = *prefix;
            p.place(c, r).expect("an allowed square");
            let s = count_by_lines(&p, forbidden, lines, kernel, stop)?;
            total.count += s.count;
            total.nodes += s.nodes;
        }
    }
    Some(total)
}

/// The squares of the first line in `lines` that `prefix` leaves without a
/// queen (column N−1, then row 0, then row N−1), or `None` when it fills
/// them all: the line [`count_by_lines`] pre-places next.
fn next_line(prefix: &Prefix, lines: u8) -> Option<Vec<(u8, u8)>> {
    let n = prefix.board().n();
    let used = prefix.used_rows();
    if lines & LINE_RIGHT != 0 && prefix.get(n - 1).is_none() {
        Some((0..n).map(|r| (n - 1, r)).collect())
    } else if lines & LINE_BOTTOM != 0 && used & 1 == 0 {
        Some((0..n).map(|c| (c, 0)).collect())
    } else if lines & LINE_TOP != 0 && used & (1 << (n - 1)) == 0 {
        Some((0..n).map(|c| (c, n - 1)).collect())
    } else {
        None
    }
}

/// Calls `f` on each prefix whose masked count [`count_by_lines`] adds up,
/// in its order.
fn for_each_line_prefix(
    prefix: &Prefix,
    forbidden: &[u32; MAX_N as usize],
    lines: u8,
    f: &mut dyn FnMut(&Prefix),
) {
    let Some(line) = next_line(prefix, lines) else {
        return f(prefix);
    };
    for (c, r) in line {
        if forbidden[usize::from(c)] & (1 << r) == 0 && prefix.allows(c, r) {
            let mut p = *prefix;
            p.place(c, r).expect("an allowed square");
            for_each_line_prefix(&p, forbidden, lines, f);
        }
    }
}

/// Counts Q(N) and U(N) single-threaded through the split. The reference
/// implementation for tests; [`crate::pool`] runs the same work on threads.
///
/// Returns `None` when `stop` was set.
pub fn count_split(board: Board, spec: SplitSpec, stop: &AtomicBool) -> Option<Tally> {
    count_split_with(board, spec, Kernel::Auto, stop)
}

/// [`count_split`] on the chosen count kernel.
pub fn count_split_with(
    board: Board,
    spec: SplitSpec,
    kernel: Kernel,
    stop: &AtomicBool,
) -> Option<Tally> {
    let mut tally = Tally::default();
    for sub in split(board, spec) {
        let (counts, _) = sub.solve_with(kernel, stop)?;
        sub.check(spec, &counts)
            .expect("the kernel's own counts satisfy the invariants");
        tally
            .add(&sub, &counts)
            .expect("Q(N) for N ≤ 32 fits in 128 bits");
    }
    Some(tally)
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{KNOWN, never};
    use super::*;

    #[test]
    fn weighted_counts_match_known_values_at_every_granularity() {
        for (n, q, u) in KNOWN {
            let board = Board::new(n.into()).unwrap();
            assert_eq!(
                search::count_board(board, &never()).unwrap(),
                q,
                "direct n={n}"
            );
            for ring in 0..=3 {
                for extra in 0..=3 {
                    if n >= 11 && (ring > 1 || extra > 2) {
                        continue; // keeps the test fast; covered for smaller n
                    }
                    let spec = SplitSpec::new(ring, extra).unwrap();
                    let t = count_split(board, spec, &never()).unwrap();
                    assert_eq!(t.total, q, "n={n} {spec:?}");
                    assert_eq!(t.unique().unwrap(), u, "unique n={n} {spec:?}");
                }
            }
        }
    }

    /// The prefixes `solve` counts partition each sub-problem: their masked
    /// reference counts add up to `solve`'s completions and nodes, and some
    /// sub-problems do have lines pre-placed.
    #[test]
    fn solve_prefixes_add_up_to_solve() {
        let mut split_up = 0;
        for n in 6..=12u64 {
            for extra in 0..=2 {
                let spec = SplitSpec::border(extra).unwrap();
                for sub in split(Board::new(n).unwrap(), spec) {
                    let forbidden = sub.forbidden();
                    let prefixes = sub.solve_prefixes();
                    split_up += usize::from(prefixes.len() > 1);
                    let mut sum = CountStats::default();
                    for p in &prefixes {
                        let s = search::count_masked_reference(p, &forbidden, &never())
                            .unwrap();
                        sum.count += s.count;
                        sum.nodes += s.nodes;
                    }
                    let (counts, stats) = sub.solve(&never()).unwrap();
                    assert_eq!(
                        (sum.count, sum.nodes),
                        (counts.count, stats.nodes),
                        "n={n} {sub:?}"
                    );
                }
            }
        }
        assert!(
            split_up > 100,
            "{split_up} sub-problems had lines pre-placed"
        );
    }

    /// N = 13 and 14 through both splits, against OEIS A000170 / A002562.
    #[test]
    fn larger_boards_match_published_values() {
        for (n, q, u) in [(13u64, 73_712u128, 9_233u128), (14, 365_596, 45_752)] {
            let board = Board::new(n).unwrap();
            for spec in [SplitSpec::BORDER, SplitSpec::border(2).unwrap()] {
                let t = count_split(board, spec, &never()).unwrap();
                assert_eq!((t.total, t.unique().unwrap()), (q, u), "n={n} {spec:?}");
            }
            let t = count_split(board, SplitSpec::new(1, 0).unwrap(), &never()).unwrap();
            assert_eq!((t.total, t.unique().unwrap()), (q, u), "n={n} ring split");
            // Every kernel this CPU runs, not only the default one.
            let spec = SplitSpec::BORDER;
            for kernel in Kernel::ALL.into_iter().filter(|k| k.is_available()) {
                let t = count_split_with(board, spec, kernel, &never()).unwrap();
                assert_eq!((t.total, t.unique().unwrap()), (q, u), "n={n} {kernel}");
            }
        }
    }

    /// The slow opt-in check of N = 15..=17 on every kernel this CPU runs
    /// (about a minute in release):
    /// `cargo test -p nq-core --release -- --ignored`.
    #[test]
    #[ignore = "slow: run with --ignored"]
    fn published_values_15_to_17() {
        let want = [
            (15u64, 2_279_184u128, 285_053u128),
            (16, 14_772_512, 1_846_955),
            (17, 95_815_104, 11_977_939),
        ];
        for (n, q, u) in want {
            let board = Board::new(n).unwrap();
            for kernel in Kernel::ALL.into_iter().filter(|k| k.is_available()) {
                let spec = SplitSpec::BORDER;
                let t = count_split_with(board, spec, kernel, &never()).unwrap();
                assert_eq!((t.total, t.unique().unwrap()), (q, u), "n={n} {kernel:?}");
            }
        }
    }
}
