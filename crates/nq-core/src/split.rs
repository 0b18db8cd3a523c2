//! The symmetric split of a search into sub-problems, and the fold of their
//! counts into the total and unique counts.
//!
//! # The split (version 1)
//!
//! Fix a ring depth `k ≥ 1`. The *ring* is the set of lines within distance
//! `k` of the border: columns `0..k` and `N-k..N`, and the rows with the same
//! numbers. Every symmetry of the board maps the ring onto itself (it maps the
//! border lines onto border lines at the same depth).
//!
//! For a solution `S`, its *ring part* `R(S)` is the set of its queens that
//! stand on a ring line. Because each line of a solution holds exactly one
//! queen, `R(S)` has a queen on every ring line; call such a valid placement a
//! *ring placement*. The split enumerates all ring placements, keeps the
//! canonical member `P` of each symmetry class (the least image, see
//! [`crate::symmetry`]), and gives it the weight `w(P) = 8 / |Stab(P)|`, the
//! size of its class. Each kept `P` is then extended in every valid way over
//! the next `extra` free columns, left to right; each extension is one
//! [`SubProblem`].
//!
//! The completions of a sub-problem are the solutions that contain its prefix
//! and have no other queen on a ring line. Since the ring placement of a
//! sub-problem covers every ring line, the search places its queens on inner
//! lines only, so "no other queen on a ring line" holds by construction.
//!
//! # Why the weighted sum is exactly Q(N)
//!
//! 1. *Partition.* Every solution `S` has exactly one ring part `R(S)`, so the
//!    sets `{S : R(S) = P}` over all ring placements `P` partition the solutions.
//! 2. *Equivariance.* For a symmetry `g`, `R(g S) = g R(S)`, because `g` maps
//!    the ring onto itself. So `S ↦ g S` is a bijection from `{S : R(S) = P}` to
//!    `{S : R(S) = g P}`: every member of the class of `P` has the same number
//!    of completions `c(P)`.
//! 3. *Classes.* The class of `P` has `8 / |Stab(P)|` members (orbit-stabilizer),
//!    and exactly one of them is canonical, since the order is total.
//! 4. *Extensions.* Fixing the next `extra` free columns in every valid way
//!    partitions the completions of `P` once more (each completion has exactly
//!    one queen in each of those columns).
//!
//! Hence `Q(N) = Σ_P w(P)·c(P) = Σ_sub-problems w·count`. The unit tests check
//! this coverage directly: for every N ≤ 11, every solution found by a plain
//! search maps to exactly one sub-problem per class member.
//!
//! # Unique solutions
//!
//! By Burnside's lemma the number of classes of solutions is
//! `U = (1/8) Σ_g Fix(g)`. Any `g` that fixes `S` fixes `R(S)`, so only the
//! symmetries in `Stab(P)` can fix completions of `P`, and summing class by
//! class gives `U = (1/8) Σ_P w(P) · Σ_{g ∈ Stab(P)} Fix_g(P)`, where
//! `Fix_g(P)` counts the completions of `P` that `g` maps to themselves:
//!
//! * the identity fixes all `c(P)` completions;
//! * the half turn and the quarter turns fix `fixed180` and `fixed90` of them
//!   (`Rot270` fixes the same ones as `Rot90`, its inverse);
//! * a reflection fixes no solution of N > 1: the mirror in an axis would put
//!   two queens on one line, and the mirror in a diagonal would pair queens
//!   `(x, y)` and `(y, x)` on one anti-diagonal, or put every queen on the
//!   diagonal. For N = 1 it fixes the single solution.
//!
//! [`Tally`] accumulates `w·count` and `w·Σ_g Fix_g` and divides by 8 at the
//! end; a remainder would prove a wrong input and is reported as an error.
//!
//! # Small boards
//!
//! When `2k ≥ N` the ring is the whole board and the "ring placements" are
//! the solutions themselves, each a sub-problem with one completion. Nothing in
//! the argument above assumes a large board, and the tests cover every N from 1.

use std::sync::atomic::AtomicBool;

use crate::board::{Board, EMPTY, Prefix};
use crate::error::{Error, ErrorKind, Result};
use crate::search::{self, CountStats};
use crate::symmetry::{Stabilizer, Symmetry, canonical};

/// The version of the split algorithm. It changes whenever the list of
/// sub-problems for a given `(N, SplitSpec)` could change, so that stored runs
/// and workers can refuse a mismatch.
pub const SPLIT_VERSION: u32 = 1;

/// How finely to split: the depth of the symmetric ring and the number of
/// extra columns pre-placed after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SplitSpec {
    /// Ring depth `k ≥ 1`: lines within `k` of the border are pre-placed and
    /// reduced by symmetry. `1` gives about N⁴/16 sub-problems; `2` about
    /// N⁸/300 and suits only very large runs.
    pub ring: u8,
    /// Free columns filled after the ring, each multiplying the number of
    /// sub-problems by up to N (plain partition, no symmetry).
    pub extra: u8,
}

impl SplitSpec {
    /// Validates a spec.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::SplitInvalid`] when `ring` is not 1..=3 or `extra` exceeds 8.
    pub fn new(ring: u8, extra: u8) -> Result<SplitSpec> {
        if !(1..=3).contains(&ring) {
            return Err(split_invalid(format!(
                "ring depth {ring} is not supported: use 1, 2 or 3"
            )));
        }
        if extra > 8 {
            return Err(split_invalid(format!(
                "{extra} extra columns is too many: use 0 to 8"
            )));
        }
        Ok(SplitSpec { ring, extra })
    }

    /// The spec used for counting on one machine: a one-deep ring, with extra
    /// columns added until there are at least `min_subproblems` sub-problems
    /// (estimated as `N⁴/16 · (N/2)^extra`), so that threads stay busy to the end.
    pub fn for_count(board: Board, min_subproblems: u64) -> SplitSpec {
        let n = u64::from(board.n());
        let mut estimate = (n.pow(4) / 16).max(1);
        let mut extra = 0;
        while estimate < min_subproblems && extra < 4 && u64::from(extra) + 6 < n {
            estimate *= (n / 2).max(1);
            extra += 1;
        }
        SplitSpec { ring: 1, extra }
    }

    /// True when square line `i` (a column or a row index) is on the ring.
    fn on_ring(self, n: u8, i: u8) -> bool {
        i < self.ring || i + self.ring >= n
    }
}

fn split_invalid(reason: String) -> Error {
    Error::new(ErrorKind::SplitInvalid { reason })
}

/// One unit of work: a prefix to complete, with the symmetry data of its ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SubProblem {
    prefix: Prefix,
    stabilizer: Stabilizer,
}

/// The counts a worker reports for one sub-problem.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SubCounts {
    /// Completions of the sub-problem's prefix.
    pub count: u128,
    /// Completions that the half turn maps to themselves; 0 unless the ring is
    /// symmetric under the half turn.
    pub fixed180: u128,
    /// Completions that the quarter turn maps to themselves; 0 unless the ring
    /// is symmetric under the quarter turn.
    pub fixed90: u128,
}

impl SubProblem {
    /// Rebuilds a sub-problem from its prefix (as received from a coordinator)
    /// and checks that it belongs to the split `spec` of its board.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::NotCanonical`] when the ring part is incomplete or not
    /// canonical, or the extra queens are not in the first free columns.
    pub fn from_prefix(spec: SplitSpec, prefix: Prefix) -> Result<SubProblem> {
        let n = prefix.board().n();
        let mut ring = Prefix::empty(prefix.board());
        for (c, r) in prefix.queens() {
            if spec.on_ring(n, c) || spec.on_ring(n, r) {
                ring.place(c, r)
                    .expect("a subset of a valid placement is valid");
            }
        }
        let complete = (0..n)
            .filter(|&i| spec.on_ring(n, i))
            .all(|i| ring.get(i).is_some() && ring.used_rows() & (1 << i) != 0);
        if !complete || canonical(&ring).0 != ring {
            return Err(Error::new(ErrorKind::NotCanonical));
        }
        // The extra queens must fill exactly the first free columns of the ring.
        let extras = prefix.len() - ring.len();
        let expected: Vec<u8> = (0..n)
            .filter(|&c| ring.get(c).is_none())
            .take(usize::from(spec.extra))
            .collect();
        let actual: Vec<u8> = (0..n)
            .filter(|&c| ring.get(c).is_none() && prefix.get(c).is_some())
            .collect();
        if extras != expected.len() || actual != expected {
            return Err(Error::new(ErrorKind::NotCanonical));
        }
        Ok(SubProblem {
            prefix,
            stabilizer: Stabilizer::of(&ring),
        })
    }

    /// The partial placement to complete.
    pub fn prefix(&self) -> &Prefix {
        &self.prefix
    }

    /// The symmetries that fix the sub-problem's ring placement.
    pub fn stabilizer(&self) -> Stabilizer {
        self.stabilizer
    }

    /// How many solutions each completion stands for: the size of the ring's
    /// symmetry class, 8, 4, 2 or (N = 1 only) 1.
    pub fn weight(&self) -> u32 {
        self.stabilizer.orbit_size()
    }

    /// Counts the completions, and the symmetric ones when the ring is
    /// symmetric. Returns `None` when `stop` was set.
    pub fn solve(&self, stop: &AtomicBool) -> Option<(SubCounts, CountStats)> {
        let stats = search::count_stats(&self.prefix, stop)?;
        let fixed = |g: Symmetry| -> Option<u128> {
            if self.stabilizer.contains(g) {
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

    /// An estimate of the work of [`SubProblem::solve`], in arbitrary units that
    /// are comparable within one split. Used for progress, ETA and job sizes,
    /// never for counts.
    pub fn estimate(&self) -> u64 {
        search::estimate_work(&self.prefix)
    }

    /// Checks reported counts against invariants that every true result
    /// satisfies, so that a corrupted or forged result is rejected before it
    /// counts.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::CountsInvalid`] naming the broken invariant.
    pub fn check(&self, spec: SplitSpec, c: &SubCounts) -> Result<()> {
        let bad = |reason| Err(Error::new(ErrorKind::CountsInvalid { reason }));
        let stab = self.stabilizer;
        if !stab.contains(Symmetry::Rot180) && c.fixed180 != 0 {
            return bad("fixed180 is not 0 although the half turn does not fix the ring");
        }
        if !stab.contains(Symmetry::Rot90) && c.fixed90 != 0 {
            return bad(
                "fixed90 is not 0 although the quarter turn does not fix the ring",
            );
        }
        if c.fixed180 > c.count || c.fixed90 > c.fixed180 {
            return bad(
                "symmetric completions exceed completions (need fixed90 ≤ fixed180 ≤ count)",
            );
        }
        if self.prefix.is_complete() && c.count != 1 {
            return bad("a complete placement has exactly one completion");
        }
        // With no extra columns the stabilizer acts on this sub-problem's own
        // completions, so its orbits give exact divisibility conditions.
        if spec.extra == 0 || self.prefix.is_complete() {
            if stab.contains(Symmetry::Rot180) && (c.count - c.fixed180) % 2 != 0 {
                return bad("completions not fixed by the half turn must come in pairs");
            }
            if stab.contains(Symmetry::Rot90) && (c.fixed180 - c.fixed90) % 2 != 0 {
                return bad("completions fixed by the half turn only must come in pairs");
            }
            if self.orbit_sum(c)? % u128::from(stab.order()) != 0 {
                return bad("completions do not split into whole symmetry classes");
            }
        }
        Ok(())
    }

    /// `Σ_{g ∈ Stab} Fix_g` for this sub-problem (see the module docs).
    fn orbit_sum(&self, c: &SubCounts) -> Result<u128> {
        let n = self.prefix.board().n();
        let mut sum = 0u128;
        for g in Symmetry::ALL {
            if !self.stabilizer.contains(g) {
                continue;
            }
            let fixed = match g {
                Symmetry::Identity => c.count,
                Symmetry::Rot180 => c.fixed180,
                Symmetry::Rot90 | Symmetry::Rot270 => c.fixed90,
                // No reflection fixes a solution of N > 1 (module docs).
                _ if n == 1 => c.count,
                _ => 0,
            };
            sum = sum
                .checked_add(fixed)
                .ok_or(Error::new(ErrorKind::Overflow))?;
        }
        Ok(sum)
    }
}

/// The running totals of a split: folds sub-problem counts into Q(N) and U(N).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// `Σ w·count`: the number of solutions so far.
    pub total: u128,
    /// `Σ w·Σ_{g∈Stab} Fix_g`: eight times the number of classes so far.
    pub burnside: u128,
}

impl Tally {
    /// Adds one sub-problem's counts. The caller should [`SubProblem::check`]
    /// them first.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Overflow`] if a sum would exceed 128 bits.
    pub fn add(&mut self, sub: &SubProblem, c: &SubCounts) -> Result<()> {
        let overflow = || Error::new(ErrorKind::Overflow);
        let w = u128::from(sub.weight());
        let total = c.count.checked_mul(w).ok_or_else(overflow)?;
        let burnside = sub.orbit_sum(c)?.checked_mul(w).ok_or_else(overflow)?;
        self.total = self.total.checked_add(total).ok_or_else(overflow)?;
        self.burnside = self.burnside.checked_add(burnside).ok_or_else(overflow)?;
        Ok(())
    }

    /// Adds another tally.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Overflow`] if a sum would exceed 128 bits.
    pub fn merge(&mut self, other: &Tally) -> Result<()> {
        let overflow = || Error::new(ErrorKind::Overflow);
        self.total = self.total.checked_add(other.total).ok_or_else(overflow)?;
        self.burnside = self
            .burnside
            .checked_add(other.burnside)
            .ok_or_else(overflow)?;
        Ok(())
    }

    /// The number of solutions up to symmetry: `burnside / 8`.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::CountsInvalid`] when `burnside` is not a multiple of 8,
    /// which no complete and correct set of counts can produce.
    pub fn unique(&self) -> Result<u128> {
        if self.burnside % 8 != 0 {
            return Err(Error::new(ErrorKind::CountsInvalid {
                reason: "the symmetry fold is not a multiple of 8: a count is wrong",
            }));
        }
        Ok(self.burnside / 8)
    }
}

/// Enumerates the sub-problems of `board` under `spec`, in increasing order of
/// their prefixes. Deterministic: the same inputs give the same list on every
/// machine (the basis of job ids in stored runs).
pub fn split(board: Board, spec: SplitSpec) -> Vec<SubProblem> {
    let n = board.n();
    let ring_cols: Vec<u8> = (0..n).filter(|&i| spec.on_ring(n, i)).collect();
    let mut rings = vec![];
    place_ring_cols(&ring_cols, 0, Prefix::empty(board), spec, &mut rings);
    let mut out = vec![];
    for ring in rings {
        let stabilizer = Stabilizer::of(&ring);
        extend(ring, spec.extra, &mut |prefix| {
            out.push(SubProblem { prefix, stabilizer })
        });
    }
    out.sort_by(|a, b| a.prefix.cmp(&b.prefix));
    out
}

/// Step 1: a row for every ring column.
fn place_ring_cols(
    cols: &[u8],
    i: usize,
    p: Prefix,
    spec: SplitSpec,
    out: &mut Vec<Prefix>,
) {
    let n = p.board().n();
    let Some(&c) = cols.get(i) else {
        place_ring_rows(0, p, spec, out);
        return;
    };
    for r in 0..n {
        if p.allows(c, r) {
            let mut q = p;
            q.place(c, r).expect("allowed square");
            place_ring_cols(cols, i + 1, q, spec, out);
        }
    }
}

/// Step 2: a queen on an inner column for every ring row still empty. Keeps the
/// canonical complete ring placements.
fn place_ring_rows(from: u8, p: Prefix, spec: SplitSpec, out: &mut Vec<Prefix>) {
    let n = p.board().n();
    let used = p.used_rows();
    let Some(r) = (from..n).find(|&r| spec.on_ring(n, r) && used & (1 << r) == 0) else {
        if canonical(&p).0 == p {
            out.push(p);
        }
        return;
    };
    for c in (0..n).filter(|&c| !spec.on_ring(n, c)) {
        if p.allows(c, r) {
            let mut q = p;
            q.place(c, r).expect("allowed square");
            place_ring_rows(r + 1, q, spec, out);
        }
    }
}

/// Step 3: fill the next `extra` free columns in every valid way.
fn extend(p: Prefix, extra: u8, emit: &mut dyn FnMut(Prefix)) {
    let n = p.board().n();
    let Some(c) = (0..n).find(|&c| p.get(c).is_none()).filter(|_| extra > 0) else {
        emit(p);
        return;
    };
    for r in 0..n {
        if p.allows(c, r) {
            let mut q = p;
            q.place(c, r).expect("allowed square");
            extend(q, extra - 1, emit);
        }
    }
}

/// Counts Q(N) and U(N) single-threaded through the split. The reference
/// implementation for tests; [`crate::pool`] runs the same work on threads.
///
/// Returns `None` when `stop` was set.
pub fn count_split(board: Board, spec: SplitSpec, stop: &AtomicBool) -> Option<Tally> {
    let mut tally = Tally::default();
    for sub in split(board, spec) {
        let (counts, _) = sub.solve(stop)?;
        sub.check(spec, &counts)
            .expect("the kernel's own counts satisfy the invariants");
        tally
            .add(&sub, &counts)
            .expect("Q(N) for N ≤ 32 fits in 128 bits");
    }
    Some(tally)
}

/// The ring part of a complete solution under `spec` (its queens on ring lines).
fn ring_of(spec: SplitSpec, s: &Prefix) -> Prefix {
    let n = s.board().n();
    let mut ring = Prefix::empty(s.board());
    for (c, r) in s.queens() {
        if spec.on_ring(n, c) || spec.on_ring(n, r) {
            ring.place(c, r)
                .expect("a subset of a valid placement is valid");
        }
    }
    ring
}

/// Every solution that a stored completion stands for.
///
/// `rows` is a completion of a sub-problem of `spec` (its ring part canonical).
/// The result holds one image of it per member of the ring's class, `weight`
/// solutions in all, identity first. Over all completions of all sub-problems
/// this lists every solution of the board exactly once (module docs, steps 2
/// and 3), so an export can stream them without remembering what it wrote.
///
/// # Errors
///
/// [`ErrorKind::PrefixInvalid`] when `rows` is not a solution of its length, and
/// [`ErrorKind::NotCanonical`] when its ring part is not canonical.
pub fn images_of_completion(spec: SplitSpec, rows: &[u8]) -> Result<Vec<Vec<u8>>> {
    let (s, ring) = completion(spec, rows)?;
    let mut seen_rings: Vec<Prefix> = Vec::with_capacity(8);
    let mut out = Vec::with_capacity(8);
    for g in Symmetry::ALL {
        let image_ring = g.apply_prefix(&ring);
        if !seen_rings.contains(&image_ring) {
            seen_rings.push(image_ring);
            out.push(g.apply_prefix(&s).rows().to_vec());
        }
    }
    Ok(out)
}

/// The class representative to list for a stored completion, if this
/// completion is the one that represents its class.
///
/// Each class of solutions meets the completions of its canonical ring in one
/// orbit of the ring's stabilizer; the least member of that orbit answers
/// `Some(canonical form of the class)` and the others `None`. Over all stored
/// completions this yields every class exactly once.
///
/// # Errors
///
/// As [`images_of_completion`].
pub fn unique_of_completion(spec: SplitSpec, rows: &[u8]) -> Result<Option<Vec<u8>>> {
    let (s, ring) = completion(spec, rows)?;
    let stab = Stabilizer::of(&ring);
    let least = Symmetry::ALL
        .iter()
        .filter(|&&g| stab.contains(g))
        .all(|&g| s <= g.apply_prefix(&s));
    Ok(least.then(|| crate::symmetry::canonical_rows(rows)))
}

/// Validates a stored completion and splits off its ring part.
fn completion(spec: SplitSpec, rows: &[u8]) -> Result<(Prefix, Prefix)> {
    let n = u64::try_from(rows.len()).expect("a slice length fits in u64");
    let s = Prefix::from_rows(Board::new(n)?, rows)?;
    if !s.is_complete() {
        return Err(Error::new(ErrorKind::NotCanonical));
    }
    let ring = ring_of(spec, &s);
    if canonical(&ring).0 != ring {
        return Err(Error::new(ErrorKind::NotCanonical));
    }
    Ok((s, ring))
}

/// Used by tests and by the CLI's `solutions --unique`: true when `rows` (a
/// complete solution) is the canonical member of its class.
pub fn is_canonical_solution(rows: &[u8]) -> bool {
    debug_assert!(rows.iter().all(|&r| r != EMPTY));
    crate::symmetry::canonical_rows(rows) == rows
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::ops::ControlFlow;

    use super::*;

    fn never() -> AtomicBool {
        AtomicBool::new(false)
    }

    /// n, Q(n), U(n) from OEIS A000170 / A002562, for N ≤ 12.
    const KNOWN: [(u8, u128, u128); 12] = [
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

    #[test]
    fn weighted_counts_match_known_values_at_every_granularity() {
        for (n, q, u) in KNOWN {
            let board = Board::new(n.into()).unwrap();
            let direct = search::count_board(board, &never()).unwrap();
            assert_eq!(direct, q, "direct n={n}");
            for ring in 1..=3 {
                for extra in 0..=2 {
                    if n >= 12 && (ring > 2 || extra > 1) {
                        continue; // keeps the test fast; covered for smaller n
                    }
                    let spec = SplitSpec::new(ring, extra).unwrap();
                    let t = count_split(board, spec, &never()).unwrap();
                    assert_eq!(t.total, direct, "n={n} {spec:?}");
                    assert_eq!(t.unique().unwrap(), u, "unique n={n} {spec:?}");
                }
            }
        }
    }

    /// Every solution maps to exactly one sub-problem per member of its ring's
    /// class: the coverage argument of the module docs, checked by enumeration.
    #[test]
    fn every_solution_is_covered_exactly_once_per_class() {
        for n in 1..=11u8 {
            let board = Board::new(n.into()).unwrap();
            for spec in [
                SplitSpec::new(1, 0).unwrap(),
                SplitSpec::new(1, 2).unwrap(),
                SplitSpec::new(2, 1).unwrap(),
            ] {
                let subs = split(board, spec);
                let by_prefix: HashMap<Prefix, &SubProblem> =
                    subs.iter().map(|s| (s.prefix, s)).collect();
                assert_eq!(by_prefix.len(), subs.len(), "sub-problems are distinct");
                let mut solutions = 0u128;
                let mut weighted_hits = 0u128;
                search::search(&Prefix::empty(board), &mut |rows: &[u8]| {
                    solutions += 1;
                    let s = Prefix::from_rows(board, rows).unwrap();
                    // Which (image, sub-problem) pairs cover S? For each symmetry
                    // g, g(S) restricted to the sub-problem's columns must be one
                    // sub-problem's prefix.
                    let mut hits = 0;
                    for g in Symmetry::ALL {
                        let img = g.apply_prefix(&s);
                        let covering = subs
                            .iter()
                            .filter(|sub| {
                                sub.prefix.queens().all(|(c, r)| img.get(c) == Some(r))
                            })
                            .filter(|sub| {
                                // No other queen of img on a ring line.
                                img.queens()
                                    .filter(|&(c, r)| {
                                        spec.on_ring(n, c) || spec.on_ring(n, r)
                                    })
                                    .all(|(c, r)| sub.prefix.get(c) == Some(r))
                            })
                            .count();
                        assert!(covering <= 1, "n={n}: an image is covered twice");
                        hits += covering;
                    }
                    // The images of S hit canonical sub-problems exactly
                    // |Stab(ring)| times, so hits·w = 8 for every solution.
                    let sub_weight = subs
                        .iter()
                        .find(|sub| {
                            Symmetry::ALL.iter().any(|g| {
                                let img = g.apply_prefix(&s);
                                sub.prefix.queens().all(|(c, r)| img.get(c) == Some(r))
                            })
                        })
                        .map(|sub| sub.weight())
                        .expect("every solution is covered");
                    assert_eq!(hits as u32 * sub_weight, 8, "n={n} {rows:?}");
                    weighted_hits += 1;
                    ControlFlow::Continue(())
                });
                assert_eq!(weighted_hits, solutions);
            }
        }
    }

    #[test]
    fn split_is_deterministic_and_round_trips() {
        let board = Board::new(10).unwrap();
        let spec = SplitSpec::new(1, 1).unwrap();
        let a = split(board, spec);
        assert_eq!(a, split(board, spec));
        for sub in &a {
            let back = SubProblem::from_prefix(spec, sub.prefix).unwrap();
            assert_eq!(&back, sub);
        }
        // A non-canonical ring is refused.
        let sub = a.iter().find(|s| s.weight() == 8).unwrap();
        let img = Symmetry::Rot90.apply_prefix(&sub.prefix);
        assert!(SubProblem::from_prefix(SplitSpec::new(1, 0).unwrap(), img).is_err());
    }

    #[test]
    fn check_rejects_impossible_counts() {
        let board = Board::new(10).unwrap();
        let spec = SplitSpec::new(1, 0).unwrap();
        let subs = split(board, spec);
        let plain = subs.iter().find(|s| s.weight() == 8).unwrap();
        let ok = plain.solve(&never()).unwrap().0;
        assert!(plain.check(spec, &ok).is_ok());
        let forged = SubCounts { fixed180: 1, ..ok };
        assert!(plain.check(spec, &forged).is_err());
        if let Some(sym) = subs.iter().find(|s| s.weight() < 8) {
            let ok = sym.solve(&never()).unwrap().0;
            assert!(sym.check(spec, &ok).is_ok());
            let odd = SubCounts {
                count: ok.count + 1,
                ..ok
            };
            assert!(sym.check(spec, &odd).is_err());
        }
    }

    #[test]
    fn stored_completions_expand_to_every_solution_once() {
        for n in 1..=9u8 {
            let board = Board::new(n.into()).unwrap();
            let spec = SplitSpec::new(1, 1).unwrap();
            let mut all = vec![];
            let mut unique = vec![];
            for sub in split(board, spec) {
                search::search(sub.prefix(), &mut |rows: &[u8]| {
                    all.extend(images_of_completion(spec, rows).unwrap());
                    unique.extend(unique_of_completion(spec, rows).unwrap());
                    ControlFlow::Continue(())
                });
            }
            let mut direct = vec![];
            search::search(&Prefix::empty(board), &mut |rows: &[u8]| {
                direct.push(rows.to_vec());
                ControlFlow::Continue(())
            });
            all.sort();
            assert_eq!(all, direct, "n={n}");
            let mut want: Vec<_> = direct
                .iter()
                .filter(|r| is_canonical_solution(r))
                .cloned()
                .collect();
            unique.sort();
            want.sort();
            assert_eq!(unique, want, "unique n={n}");
        }
    }

    #[test]
    fn unique_requires_whole_classes() {
        let t = Tally {
            total: 8,
            burnside: 12,
        };
        assert!(t.unique().is_err());
    }

    #[test]
    fn spec_validation_names_the_range() {
        let e = SplitSpec::new(0, 0).unwrap_err().to_string();
        assert!(e.contains("1, 2 or 3"), "{e}");
    }
}
