//! Enumeration: the base placements of each split, their extensions over the
//! next free columns, and the sub-problems in sorted or in plan order.

use std::ops::ControlFlow;

use super::lines::{corner, least_t_image};
use super::{Kind, LINE_BOTTOM, LINE_RIGHT, LINE_TOP, SplitSpec, Strategy, SubProblem};
use crate::board::{Board, Prefix};
use crate::symmetry::{Stabilizer, canonical};

/// Enumerates the sub-problems of `board` under `spec`, in increasing order of
/// their prefixes. Deterministic: the same inputs give the same list on every
/// machine (the basis of job ids in stored runs).
pub fn split(board: Board, spec: SplitSpec) -> Vec<SubProblem> {
    let mut out = vec![];
    let _ = split_each(board, spec, &mut |sub| {
        out.push(sub);
        ControlFlow::Continue(())
    });
    out.sort_by_key(|s| s.prefix);
    out
}

/// Calls `f` on every sub-problem of `board` under `spec`, in *plan order*:
/// base placement by base placement in increasing order of prefix, and each
/// base's extensions in increasing order of prefix. The same set as
/// [`split`], which sorts it; this order needs no sort, so a split of 10^8
/// sub-problems streams through a constant amount of memory (the base
/// placements, a few thousand for the border split, are listed first).
///
/// Deterministic: the same inputs give the same sequence on every machine,
/// which is what lets an interrupted creation of a run skip what it stored.
/// Stops as soon as `f` breaks, and returns what `f` returned last.
pub fn split_each(
    board: Board,
    spec: SplitSpec,
    f: &mut dyn FnMut(SubProblem) -> ControlFlow<()>,
) -> ControlFlow<()> {
    let mut bases = match spec.strategy(board.n()) {
        Strategy::Ring(depth) => ring_bases(board, depth),
        Strategy::Border => border_bases(board),
    };
    bases.sort_by_key(|(p, _)| *p);
    for (base, kind) in bases {
        let sub = SubProblem { prefix: base, kind };
        let forbidden = sub.forbidden();
        extend(base, spec.extra, &forbidden, &mut |prefix| {
            f(SubProblem { prefix, kind })
        })?;
    }
    ControlFlow::Continue(())
}

/// The number of sub-problems of `board` under `spec`, counted without
/// holding them.
pub fn split_len(board: Board, spec: SplitSpec) -> u64 {
    let mut n = 0u64;
    let _ = split_each(board, spec, &mut |_| {
        n += 1;
        ControlFlow::Continue(())
    });
    n
}

/// The canonical ring placements of the ring split.
fn ring_bases(board: Board, depth: u8) -> Vec<(Prefix, Kind)> {
    let n = board.n();
    let on = |i: u8| i < depth || i + depth >= n;
    let ring_cols: Vec<u8> = (0..n).filter(|&i| on(i)).collect();
    let mut rings = vec![];
    // Step 1: a row for every ring column. Step 2: a queen on an inner column
    // for every ring row still empty.
    fill_cols(&ring_cols, Prefix::empty(board), &mut |p| {
        fill_rows(p, &on, &mut |ring| {
            if canonical(&ring).0 == ring {
                rings.push(ring);
            }
        });
    });
    rings
        .into_iter()
        .map(|r| {
            (
                r,
                Kind::Ring {
                    stabilizer: Stabilizer::of(&r),
                },
            )
        })
        .collect()
}

/// Every valid way to put a queen in each of `cols`.
fn fill_cols(cols: &[u8], p: Prefix, emit: &mut dyn FnMut(Prefix)) {
    let Some((&c, rest)) = cols.split_first() else {
        return emit(p);
    };
    for r in 0..p.board().n() {
        if p.allows(c, r) {
            let mut q = p;
            q.place(c, r).expect("allowed square");
            fill_cols(rest, q, emit);
        }
    }
}

/// Every valid way to give each empty row `r` with `on(r)` a queen on a
/// column with `!on(c)`.
fn fill_rows(p: Prefix, on: &dyn Fn(u8) -> bool, emit: &mut dyn FnMut(Prefix)) {
    let n = p.board().n();
    let used = p.used_rows();
    let Some(r) = (0..n).find(|&r| on(r) && used & (1 << r) == 0) else {
        return emit(p);
    };
    for c in (0..n).filter(|&c| !on(c)) {
        if p.allows(c, r) {
            let mut q = p;
            q.place(c, r).expect("allowed square");
            fill_rows(q, on, emit);
        }
    }
}

/// The base sub-problems of the border split (module docs, cases 1 to 3).
fn border_bases(board: Board) -> Vec<(Prefix, Kind)> {
    let n = board.n();
    let mut out = vec![];
    for k in (1..n).take_while(|&k| k <= n - 1 - k) {
        // Each line other than column 0 is either strict (None) or tied at
        // one of the (one or two) positions with corner distance k.
        let mut options = vec![None, Some(k)];
        if n - 1 - k != k {
            options.push(Some(n - 1 - k));
        }
        for &right in &options {
            for &bottom in &options {
                for &top in &options {
                    let mut x = Prefix::empty(board);
                    x.place(0, k).expect("first queen");
                    let tied_ok = right.is_none_or(|r| x.place(n - 1, r).is_ok())
                        && bottom.is_none_or(|c| x.place(c, 0).is_ok())
                        && top.is_none_or(|c| x.place(c, n - 1).is_ok());
                    if !tied_ok {
                        continue;
                    }
                    let strict =
                        [(right, LINE_RIGHT), (bottom, LINE_BOTTOM), (top, LINE_TOP)]
                            .iter()
                            .filter(|(o, _)| o.is_none())
                            .fold(0, |s, &(_, bit)| s | bit);
                    if k == n - 1 - k && x.len() == 1 {
                        // Case 1b: the row-0 queen left of the row-(N−1) queen.
                        for c in 1..n - 1 {
                            let mut y = x;
                            if c != k && y.place(c, 0).is_ok() {
                                let strict = LINE_RIGHT | LINE_TOP;
                                out.push((
                                    y,
                                    Kind::Border {
                                        k,
                                        strict,
                                        top_after_bottom: true,
                                    },
                                ));
                            }
                        }
                    } else if Stabilizer::of(&x).order() == 1 {
                        if least_t_image(&x, k) {
                            out.push((
                                x,
                                Kind::Border {
                                    k,
                                    strict,
                                    top_after_bottom: false,
                                },
                            ));
                        }
                    } else {
                        // Case 3: complete the border on the strict lines.
                        complete_border(x, k, strict, &mut |ring| {
                            if least_t_image(&ring, k) {
                                let stabilizer = Stabilizer::of(&ring);
                                out.push((ring, Kind::Ring { stabilizer }));
                            }
                        });
                    }
                }
            }
        }
    }
    out
}

/// Every valid way to give each strict border line a queen with corner
/// distance below `k`. The right column goes first, so that a corner queen
/// there also fills row 0 or row N−1.
fn complete_border(x: Prefix, k: u8, strict: u8, emit: &mut dyn FnMut(Prefix)) {
    let n = x.board().n();
    let near = move |p: u8| corner(n, p) < k;
    let used = x.used_rows();
    if strict & LINE_RIGHT != 0 && x.get(n - 1).is_none() {
        for r in (0..n).filter(|&r| near(r) && x.allows(n - 1, r)) {
            let mut q = x;
            q.place(n - 1, r).expect("allowed square");
            complete_border(q, k, strict, emit);
        }
        return;
    }
    for (bit, row) in [(LINE_BOTTOM, 0), (LINE_TOP, n - 1)] {
        if strict & bit != 0 && used & (1 << row) == 0 {
            for c in (0..n).filter(|&c| near(c) && x.allows(c, row)) {
                let mut q = x;
                q.place(c, row).expect("allowed square");
                complete_border(q, k, strict, emit);
            }
            return;
        }
    }
    emit(x);
}

/// Fills the next `extra` free columns in every valid way that avoids
/// `forbidden`, in increasing order; stops when `emit` breaks.
fn extend(
    p: Prefix,
    extra: u8,
    forbidden: &[u32],
    emit: &mut dyn FnMut(Prefix) -> ControlFlow<()>,
) -> ControlFlow<()> {
    let n = p.board().n();
    let Some(c) = (0..n).find(|&c| p.get(c).is_none()).filter(|_| extra > 0) else {
        return emit(p);
    };
    for r in 0..n {
        if forbidden[usize::from(c)] & (1 << r) == 0 && p.allows(c, r) {
            let mut q = p;
            q.place(c, r).expect("allowed square");
            extend(q, extra - 1, forbidden, emit)?;
        }
    }
    ControlFlow::Continue(())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::super::fixtures::{all_solutions, completions};
    use super::*;
    use crate::symmetry::Symmetry;

    #[test]
    fn split_each_streams_the_same_set_in_plan_order() {
        for (n, ring, extra) in [(8, 0, 0), (10, 0, 2), (11, 1, 1), (12, 0, 3), (9, 2, 0)]
        {
            let board = Board::new(n).unwrap();
            let spec = SplitSpec::new(ring, extra).unwrap();
            let mut streamed = vec![];
            let _ = split_each(board, spec, &mut |s| {
                streamed.push(s);
                ControlFlow::Continue(())
            });
            assert_eq!(split_len(board, spec), streamed.len() as u64);
            let mut sorted = streamed.clone();
            sorted.sort_by_key(|s| s.prefix);
            assert_eq!(sorted, split(board, spec), "N={n} {ring}:{extra}");
            // Breaking stops at once.
            let mut seen = 0;
            let stopped = split_each(board, spec, &mut |_| {
                seen += 1;
                if seen == 3 {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            });
            assert_eq!(
                (stopped, seen),
                (ControlFlow::Break(()), 3.min(streamed.len()))
            );
        }
    }

    /// The coverage argument of the module docs, checked by enumeration: for
    /// every class of solutions, the weighted number of times its members
    /// appear as completions of sub-problems equals the size of the class.
    #[test]
    fn every_class_is_covered_exactly_once() {
        for n in 1..=10u8 {
            let board = Board::new(n.into()).unwrap();
            for (ring, extra) in [(0, 0), (0, 2), (1, 0), (1, 2), (2, 1)] {
                let spec = SplitSpec::new(ring, extra).unwrap();
                let subs = split(board, spec);
                let mut seen = std::collections::HashSet::new();
                for sub in &subs {
                    assert!(seen.insert(sub.prefix), "n={n}: sub-problems are distinct");
                    // Every sub-problem is accepted back from its prefix.
                    assert_eq!(SubProblem::from_prefix(spec, sub.prefix).unwrap(), *sub);
                }
                // Which sub-problems each solution completes, with weights.
                let mut hits: HashMap<Vec<u8>, u32> = HashMap::new();
                completions(&subs, &mut |sub, rows| {
                    assert!(sub.is_completion(rows));
                    *hits.entry(rows.to_vec()).or_default() += sub.weight();
                });
                for s in all_solutions(board) {
                    let p = Prefix::from_rows(board, &s).unwrap();
                    let mut orbit: Vec<Prefix> =
                        Symmetry::ALL.iter().map(|g| g.apply_prefix(&p)).collect();
                    orbit.sort();
                    orbit.dedup();
                    let weighted: u32 = orbit
                        .iter()
                        .map(|y| hits.get(y.rows()).copied().unwrap_or(0))
                        .sum();
                    assert_eq!(
                        weighted,
                        orbit.len() as u32,
                        "n={n} {spec:?}: class of {s:?} covered {weighted} times"
                    );
                }
            }
        }
    }
}
