//! The symmetric split of a search into sub-problems, and the fold of their
//! counts into the total and unique counts.
//!
//! Two splits are implemented; [`SplitSpec::ring`] picks one. Both rest on
//! the same facts about the *border*: the four lines column 0, column N−1,
//! row 0 and row N−1. Every symmetry maps the border onto itself, and every
//! solution has exactly one queen on each border line.
//!
//! # The ring split (`ring = 1, 2, 3`)
//!
//! This is the Q27 project's design. Fix a depth `k`; the *ring* is the set of
//! lines within `k` of the edge. For a solution `S`, its *ring part* `R(S)` is
//! its queens on ring lines; it has a queen on every ring line (a *ring
//! placement*). The split enumerates ring placements, keeps the canonical
//! member `P` of each symmetry class (the least image, see
//! [`crate::symmetry`]), and gives it the weight `w(P) = 8 / |Stab(P)|`.
//!
//! 1. *Partition.* Every solution has exactly one ring part, so the sets
//!    `{S : R(S) = P}` partition the solutions.
//! 2. *Equivariance.* `R(g S) = g R(S)` since `g` maps the ring onto itself,
//!    so every member of the class of `P` has the same number of completions.
//! 3. *Classes.* The class of `P` has `8 / |Stab(P)|` members and exactly one
//!    canonical member. Hence `Q(N) = Σ_P w(P)·c(P)`.
//!
//! Pre-placing every ring queen makes each sub-problem repeat the top of the
//! search tree, which is why the ring split is the slower one; it is kept as an
//! independent second way to compute every count.
//!
//! # The border split (`ring = 0`, the default)
//!
//! Give each border queen its *corner distance* `m`: its distance, along its
//! border line, to the nearer end of that line (a queen in a corner has
//! `m = 0`). Let `k` be the largest corner distance of the four border queens
//! of a solution, and call the border queens with `m = k` its *tied set*. The
//! images of a solution in which the column-0 queen has the largest corner
//! distance and stands in the lower half, `rows[0] = k ≤ N−1−k`, are its
//! *T-images*; every class has at least one. (`k ≥ 1`: four queens cannot all
//! sit in corners, since corners on one line share it and opposite corners
//! share a diagonal.)
//!
//! Every class of solutions falls in exactly one of three cases, decided by
//! the stabilizer of its tied set, which is the same for every member:
//!
//! 1. *One farthest queen* (the tied set is the column-0 queen alone, off the
//!    middle row). One sub-problem per `k`: the queen at `(0, k)`, and on the
//!    three other border lines every square with `m ≥ k` forbidden. Each class
//!    has exactly one T-image, and no symmetry fixes its members (a symmetry
//!    fixing `S` fixes its only farthest queen, and none fixes a single
//!    border square off the middle). Weight 8.
//! 2. *Several farthest queens, in a set that no symmetry fixes.* The tied
//!    set is pre-placed and the border lines outside it are restricted to
//!    `m < k` as above. Of the T-images of a class, which correspond one to
//!    one with the T-images of its tied set, the split keeps the one whose
//!    tied set is the least; there is exactly one because the tied set has no
//!    symmetry. Its members have no symmetry either. Weight 8.
//!    *Case 1b, odd N:* when the column-0 queen alone is farthest and stands
//!    on the middle row, its tied set is fixed by the top-bottom mirror, and
//!    both `S` and its mirror image are T-images. The mirror swaps the queens
//!    of rows 0 and N−1 (keeping their columns), and those two columns differ,
//!    so exactly one of the two images has its row-0 queen left of its
//!    row-(N−1) queen. The split keeps that one: the row-0 queen is pre-placed
//!    at each column `c`, and row N−1 is forbidden left of `c`. No other border
//!    queen can tie with a middle one (each tie position shares a row or a
//!    diagonal with it), and no symmetry fixes the members. Weight 8.
//! 3. *A tied set with a symmetry* (rare). Here the whole border is
//!    pre-placed as in the ring split: the sub-problem is the least T-image
//!    `P` of the class of border placements, with weight `8 / |Stab(P)|`.
//!
//! Cases 1 and 2 merge thousands of ring placements into one search whose
//! masks prune as it goes, so the top of the tree is searched once.
//!
//! # Both splits: extensions, unique solutions, small boards
//!
//! *Extensions.* Each base sub-problem is extended in every valid way over
//! the next `extra` free columns (respecting its masks); each completion has
//! exactly one queen in each of those columns, so this partitions again.
//!
//! *Unique solutions.* By Burnside's lemma the number of classes is
//! `U = (1/8) Σ_g Fix(g)`. A sub-problem with weight 8 contributes its count
//! (no symmetry fixes its completions). For a ring placement `P`, only the
//! symmetries in `Stab(P)` can fix completions, and the classes meeting the
//! completions of `P` number `(1/|Stab(P)|) Σ_{g ∈ Stab(P)} Fix_g(P)`:
//! the identity fixes all `c(P)` completions, the half turn `fixed180`, each
//! quarter turn `fixed90`, and a reflection none for N > 1 (a mirror in an axis
//! would put two queens on one line; a mirror in a diagonal pairs queens
//! `(x, y)` and `(y, x)` on one anti-diagonal). [`Tally`] accumulates `8·U`
//! exactly and divides at the end; a remainder is reported as an error.
//!
//! *Small boards.* For N < 4 the border split falls back to the ring split
//! with `ring = 1`, whose ring is then the whole board (each sub-problem is a
//! solution, and for N = 1 every reflection fixes it). The tests check every
//! N from 1 against brute force.
//!
//! # Layout
//!
//! This file holds the spec and the sub-problem type. Around it: `enumerate`
//! lists the sub-problems ([`split`], [`split_each`], [`split_len`]);
//! `validate` rebuilds one from its prefix and bounds reported counts
//! ([`SubProblem::from_prefix`], [`SubProblem::check`]); `solve` counts and
//! lists completions ([`SubProblem::solve`], [`count_split`]); `tally` folds
//! counts into Q(N) and U(N) ([`Tally`]); `kernel_check` is the kernels'
//! startup self-test ([`check_kernel`]); `export` turns stored completions
//! into solutions ([`images_of_completion`]); `lines` has the geometry of
//! border lines and rings that they share.

mod enumerate;
mod export;
#[cfg(test)]
mod fixtures;
mod kernel_check;
mod lines;
mod solve;
mod tally;
mod validate;

pub use enumerate::{split, split_each, split_len};
pub use export::{images_of_completion, is_canonical_solution, unique_of_completion};
pub use kernel_check::check_kernel;
pub use solve::{count_split, count_split_with};
pub use tally::Tally;

use crate::board::{Board, MAX_N, Prefix};
use crate::error::{Error, ErrorKind, Result};
use crate::symmetry::Stabilizer;

use lines::{bottom_col, strict_masks};

/// The version of the split algorithms. It changes whenever the list of
/// sub-problems for a given `(N, SplitSpec)` could change, so that stored runs
/// and workers can refuse a mismatch.
pub const SPLIT_VERSION: u32 = 1;

/// Which split, and how finely: see the module docs.
///
/// Build one with [`SplitSpec::border`] or [`SplitSpec::ring_split`], or with
/// [`SplitSpec::new`] from the stored `ring:extra` pair; ask which split it is
/// with [`SplitSpec::is_border`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SplitSpec {
    /// The split, as stored and sent on the wire: [`BORDER_RING`] (`0`) for
    /// the border split (fast, the default), `1..=3` for the ring split with
    /// that ring depth (`2` gives about N⁸/300 sub-problems and suits only
    /// very large runs).
    pub ring: u8,
    /// Free columns filled after the base placement, each multiplying the
    /// number of sub-problems by up to N (plain partition, no symmetry).
    pub extra: u8,
}

/// The value of [`SplitSpec::ring`] that stands for the border split. Kept at
/// 0 because stored runs and the wire encode the split this way.
pub const BORDER_RING: u8 = 0;

/// The largest ring depth of the ring split.
const MAX_RING: u8 = 3;

/// The most extra columns a spec may ask for.
const MAX_EXTRA: u8 = 8;

impl SplitSpec {
    /// The border split with no extra columns.
    pub const BORDER: SplitSpec = SplitSpec {
        ring: BORDER_RING,
        extra: 0,
    };

    /// Validates a spec given as its stored pair: `ring` is [`BORDER_RING`] for
    /// the border split or a ring depth.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::SplitInvalid`] when `ring` is not 0..=3 or `extra` exceeds 8.
    pub fn new(ring: u8, extra: u8) -> Result<SplitSpec> {
        if ring > MAX_RING {
            return Err(split_invalid(format!(
                "ring depth {ring} is not supported: use 0 (border split), 1, 2 or 3"
            )));
        }
        if extra > MAX_EXTRA {
            return Err(split_invalid(format!(
                "{extra} extra columns is too many: use 0 to 8"
            )));
        }
        Ok(SplitSpec { ring, extra })
    }

    /// The border split with `extra` extra columns.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::SplitInvalid`] when `extra` exceeds 8.
    pub fn border(extra: u8) -> Result<SplitSpec> {
        SplitSpec::new(BORDER_RING, extra)
    }

    /// The ring split of ring depth `depth` with `extra` extra columns.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::SplitInvalid`] when `depth` is not 1..=3 or `extra`
    /// exceeds 8.
    pub fn ring_split(depth: u8, extra: u8) -> Result<SplitSpec> {
        if depth == BORDER_RING {
            return Err(split_invalid(
                "ring depth 0 is not a ring split: use 1, 2 or 3, or the border split"
                    .to_string(),
            ));
        }
        SplitSpec::new(depth, extra)
    }

    /// True for the border split. (For N < 4 it runs as the ring split of
    /// depth 1; see the module docs. It is still the border split by name.)
    pub fn is_border(self) -> bool {
        self.ring == BORDER_RING
    }

    /// The border split with the fewest extra columns that gives at least
    /// `min_subproblems` sub-problems (at most 6 extra columns), so that
    /// threads stay busy to the end.
    pub fn for_count(board: Board, min_subproblems: u64) -> SplitSpec {
        let mut spec = SplitSpec::BORDER;
        while spec.extra < 6
            && split_len(board, spec) < min_subproblems
            && usize::from(spec.extra) + 4 < board.len()
        {
            spec.extra += 1;
        }
        spec
    }

    fn strategy(self, n: u8) -> Strategy {
        if !self.is_border() {
            Strategy::Ring(self.ring)
        } else if n >= 4 {
            Strategy::Border
        } else {
            Strategy::Ring(1)
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Strategy {
    Border,
    Ring(u8),
}

fn split_invalid(reason: String) -> Error {
    Error::new(ErrorKind::SplitInvalid { reason })
}

/// Border lines, as bits of [`Kind::Border::strict`].
const LINE_RIGHT: u8 = 1; // column N−1
const LINE_BOTTOM: u8 = 2; // row 0
const LINE_TOP: u8 = 4; // row N−1

/// How a sub-problem's completions are constrained and weighted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Border split, cases 1, 1b and 2: the column-0 queen is at row `k`, the
    /// border lines in `strict` must hold their queen at corner distance < k,
    /// and no symmetry fixes a completion.
    Border {
        k: u8,
        strict: u8,
        /// Case 1b: row N−1 is forbidden left of the row-0 queen.
        top_after_bottom: bool,
    },
    /// A complete ring (or border) placement and its stabilizer.
    Ring { stabilizer: Stabilizer },
}

/// One unit of work: a prefix to complete, with the constraints and symmetry
/// data of its class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SubProblem {
    prefix: Prefix,
    kind: Kind,
}

/// The counts a worker reports for one sub-problem.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SubCounts {
    /// Completions of the sub-problem's prefix.
    pub count: u128,
    /// Completions that the half turn maps to themselves; 0 unless the
    /// sub-problem's ring placement is symmetric under the half turn.
    pub fixed180: u128,
    /// Completions that the quarter turn maps to themselves; 0 unless the
    /// ring placement is symmetric under the quarter turn.
    pub fixed90: u128,
}

impl SubProblem {
    /// The partial placement to complete.
    pub fn prefix(&self) -> &Prefix {
        &self.prefix
    }

    /// The symmetries that can fix a completion: those of the ring placement
    /// for ring sub-problems, the identity alone otherwise.
    pub fn stabilizer(&self) -> Stabilizer {
        match self.kind {
            Kind::Border { .. } => Stabilizer::trivial(),
            Kind::Ring { stabilizer } => stabilizer,
        }
    }

    /// How many solutions each completion stands for: 8, 4, 2 or (N = 1
    /// only) 1.
    pub fn weight(&self) -> u32 {
        self.stabilizer().orbit_size()
    }

    /// Squares the completions must avoid, as a row mask per column (the
    /// border split's strict lines). Counting the completions of
    /// [`SubProblem::prefix`] that avoid them gives `SubCounts::count`: what
    /// an outside kernel (the GPU's) must compute.
    pub fn forbidden(&self) -> [u32; MAX_N as usize] {
        match self.kind {
            Kind::Border {
                k,
                strict,
                top_after_bottom,
            } => {
                let n = self.prefix.board().n();
                let bottom = top_after_bottom.then(|| bottom_col(&self.prefix));
                strict_masks(n, k, strict, bottom)
            }
            Kind::Ring { .. } => [0; MAX_N as usize],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_validation_names_the_range() {
        let e = SplitSpec::new(4, 0).unwrap_err().to_string();
        assert!(e.contains("0 (border split), 1, 2 or 3"), "{e}");
    }

    #[test]
    fn named_constructors_keep_the_stored_encoding() {
        assert_eq!(SplitSpec::border(2).unwrap(), SplitSpec::new(0, 2).unwrap());
        assert_eq!(SplitSpec::BORDER, SplitSpec::border(0).unwrap());
        assert_eq!(
            SplitSpec::ring_split(2, 1).unwrap(),
            SplitSpec::new(2, 1).unwrap()
        );
        assert!(SplitSpec::BORDER.is_border());
        assert!(SplitSpec::new(0, 3).unwrap().is_border());
        assert!(!SplitSpec::ring_split(1, 0).unwrap().is_border());
        // They validate as `new` does, and a ring depth of 0 is refused by name.
        assert!(SplitSpec::border(9).is_err());
        assert!(SplitSpec::ring_split(4, 0).is_err());
        assert!(SplitSpec::ring_split(1, 9).is_err());
        let e = SplitSpec::ring_split(0, 0).unwrap_err().to_string();
        assert!(e.contains("1, 2 or 3") && e.contains("border split"), "{e}");
    }
}
