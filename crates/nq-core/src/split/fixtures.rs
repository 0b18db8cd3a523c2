//! What the tests of the split share: known counts, every solution by direct
//! search, and every completion of a list of sub-problems.

use std::ops::ControlFlow;
use std::sync::atomic::AtomicBool;

use super::SubProblem;
use crate::board::{Board, Prefix};
use crate::search;

pub(super) fn never() -> AtomicBool {
    AtomicBool::new(false)
}

/// n, Q(n), U(n) from OEIS A000170 / A002562, for N ≤ 12.
pub(super) const KNOWN: [(u8, u128, u128); 12] = [
    (1, 1, 1),
    (2, 0, 0),
    (3, 0, 0),
    (4, 2, 1),
    (5, 10, 2),
    (6, 4, 1),
    (7, 40, 6),
    (8, 92, 12),
    (9, 352, 46),
    (10, 724, 92),
    (11, 2680, 341),
    (12, 14200, 1787),
];

/// Every solution of `board`, by direct search, in lexicographic order.
pub(super) fn all_solutions(board: Board) -> Vec<Vec<u8>> {
    let mut out = vec![];
    search::search(&Prefix::empty(board), &mut |rows: &[u8]| {
        out.push(rows.to_vec());
        ControlFlow::Continue(())
    });
    out
}

/// Lists every completion of every sub-problem to `sink`.
pub(super) fn completions(subs: &[SubProblem], sink: &mut dyn FnMut(&SubProblem, &[u8])) {
    for sub in subs {
        sub.list(&mut |rows: &[u8]| {
            sink(sub, rows);
            ControlFlow::Continue(())
        });
    }
}
