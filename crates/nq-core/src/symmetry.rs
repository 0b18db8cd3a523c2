//! The 8 symmetries of the square board (the dihedral group D4) and canonical
//! forms under them.
//!
//! Squares are `(col, row)` = `(x, y)` with the origin at the bottom-left
//! corner (see [`crate::board`]). With `m = N - 1` the maps are:
//!
//! | symmetry | `(x, y)` goes to |
//! |---|---|
//! | `Identity` | `(x, y)` |
//! | `Rot90` (quarter turn, anticlockwise) | `(m - y, x)` |
//! | `Rot180` (half turn) | `(m - x, m - y)` |
//! | `Rot270` (three quarter turns) | `(y, m - x)` |
//! | `MirrorLeftRight` (in the vertical axis) | `(m - x, y)` |
//! | `MirrorTopBottom` (in the horizontal axis) | `(x, m - y)` |
//! | `Diagonal` (in the line `y = x`) | `(y, x)` |
//! | `AntiDiagonal` (in the line `x + y = m`) | `(m - y, m - x)` |
//!
//! A set of queens is mapped square by square. Because every map sends rows,
//! columns and diagonals to rows, columns and diagonals, the image of a valid
//! placement is valid, and the image of a solution is a solution.
//!
//! The *canonical* member of a class is the least of its (up to 8) images in the
//! order of [`Prefix`]: lexicographic on `rows[col]`, empty columns last.

use crate::board::{Board, EMPTY, MAX_N, Prefix};

/// One of the 8 symmetries of the square.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Symmetry {
    /// Leaves every square where it is.
    Identity,
    /// Quarter turn anticlockwise: `(x, y) → (m − y, x)`.
    Rot90,
    /// Half turn: `(x, y) → (m − x, m − y)`.
    Rot180,
    /// Three quarter turns anticlockwise: `(x, y) → (y, m − x)`.
    Rot270,
    /// Reflection in the vertical axis: `(x, y) → (m − x, y)`.
    MirrorLeftRight,
    /// Reflection in the horizontal axis: `(x, y) → (x, m − y)`.
    MirrorTopBottom,
    /// Reflection in the main diagonal: `(x, y) → (y, x)`.
    Diagonal,
    /// Reflection in the anti-diagonal: `(x, y) → (m − y, m − x)`.
    AntiDiagonal,
}

impl Symmetry {
    /// All 8 symmetries, identity first.
    pub const ALL: [Symmetry; 8] = [
        Symmetry::Identity,
        Symmetry::Rot90,
        Symmetry::Rot180,
        Symmetry::Rot270,
        Symmetry::MirrorLeftRight,
        Symmetry::MirrorTopBottom,
        Symmetry::Diagonal,
        Symmetry::AntiDiagonal,
    ];

    /// Maps the square `(col, row)` on a board of side `n`.
    ///
    /// The caller MUST pass a square on the board (`col, row < n`).
    pub fn apply(self, n: u8, (x, y): (u8, u8)) -> (u8, u8) {
        let m = n - 1;
        match self {
            Symmetry::Identity => (x, y),
            Symmetry::Rot90 => (m - y, x),
            Symmetry::Rot180 => (m - x, m - y),
            Symmetry::Rot270 => (y, m - x),
            Symmetry::MirrorLeftRight => (m - x, y),
            Symmetry::MirrorTopBottom => (x, m - y),
            Symmetry::Diagonal => (y, x),
            Symmetry::AntiDiagonal => (m - y, m - x),
        }
    }

    /// `self ∘ other`: first `other`, then `self`.
    pub fn compose(self, other: Symmetry) -> Symmetry {
        // One probe square tells the 8 maps apart: on a 5×5 board the images of
        // (0, 1) are 8 different squares (see the test `probe_separates`).
        let probe = self.apply(5, other.apply(5, (0, 1)));
        *Symmetry::ALL
            .iter()
            .find(|g| g.apply(5, (0, 1)) == probe)
            .expect("D4 is closed under composition, so some map matches the probe")
    }

    /// The symmetry that undoes `self`.
    pub fn inverse(self) -> Symmetry {
        match self {
            Symmetry::Rot90 => Symmetry::Rot270,
            Symmetry::Rot270 => Symmetry::Rot90,
            // Every other element of D4 is its own inverse.
            other => other,
        }
    }

    /// True for the four rotations (including the identity).
    pub fn is_rotation(self) -> bool {
        matches!(
            self,
            Symmetry::Identity | Symmetry::Rot90 | Symmetry::Rot180 | Symmetry::Rot270
        )
    }

    /// The image of a whole placement.
    pub fn apply_prefix(self, p: &Prefix) -> Prefix {
        let board = p.board();
        let mut rows = [EMPTY; MAX_N as usize];
        for (c, r) in p.queens() {
            let (x, y) = self.apply(board.n(), (c, r));
            rows[usize::from(x)] = y;
        }
        // A symmetry maps a valid placement to a valid placement.
        Prefix::from_valid_rows(board, rows)
    }

    /// The image of a placement given as `rows[col]` ([`EMPTY`] allowed), written
    /// into `out`. `out` MUST have the same length as `rows`.
    pub fn apply_rows(self, rows: &[u8], out: &mut [u8]) {
        let n = rows.len() as u8;
        out.fill(EMPTY);
        for (c, &r) in rows.iter().enumerate() {
            if r != EMPTY {
                let (x, y) = self.apply(n, (c as u8, r));
                out[usize::from(x)] = y;
            }
        }
    }
}

/// The symmetries that map `p` to itself, as a set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Stabilizer {
    /// Bit `i` is set when `Symmetry::ALL[i]` fixes the placement.
    bits: u8,
}

impl Stabilizer {
    /// The stabilizer of `p`.
    pub fn of(p: &Prefix) -> Stabilizer {
        let mut bits = 0;
        for (i, g) in Symmetry::ALL.iter().enumerate() {
            if g.apply_prefix(p) == *p {
                bits |= 1 << i;
            }
        }
        Stabilizer { bits }
    }

    /// The stabilizer of a placement that no symmetry but the identity fixes.
    pub fn trivial() -> Stabilizer {
        Stabilizer { bits: 1 }
    }

    /// True when `g` fixes the placement.
    pub fn contains(self, g: Symmetry) -> bool {
        let i = Symmetry::ALL
            .iter()
            .position(|&h| h == g)
            .expect("g is one of ALL");
        self.bits & (1 << i) != 0
    }

    /// The number of symmetries that fix the placement: 1, 2, 4 or 8.
    pub fn order(self) -> u32 {
        self.bits.count_ones()
    }

    /// The size of the placement's class: `8 / order`.
    pub fn orbit_size(self) -> u32 {
        8 / self.order()
    }
}

/// The canonical member of the class of `p` and a symmetry that maps `p` to it.
pub fn canonical(p: &Prefix) -> (Prefix, Symmetry) {
    Symmetry::ALL
        .iter()
        .map(|&g| (g.apply_prefix(p), g))
        .min()
        .expect("ALL is not empty")
}

/// The canonical member of the class of a complete solution given as
/// `rows[col]`: the lexicographically least of its images.
pub fn canonical_rows(rows: &[u8]) -> Vec<u8> {
    let mut best = rows.to_vec();
    let mut image = vec![0; rows.len()];
    for g in &Symmetry::ALL[1..] {
        g.apply_rows(rows, &mut image);
        if image < best {
            best.copy_from_slice(&image);
        }
    }
    best
}

/// True when the board of side `n` is fixed, as a set of squares, by `g`;
/// always true (every map of D4 maps the board onto itself). Present so that
/// property tests can state it.
pub fn maps_board_onto_itself(board: Board, g: Symmetry) -> bool {
    let n = board.n();
    (0..n).all(|x| {
        (0..n).all(|y| {
            let (a, b) = g.apply(n, (x, y));
            a < n && b < n
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_separates() {
        let mut images: Vec<_> =
            Symmetry::ALL.iter().map(|g| g.apply(5, (0, 1))).collect();
        images.sort();
        images.dedup();
        assert_eq!(images.len(), 8);
    }

    #[test]
    fn the_eight_maps_form_a_group() {
        // Check the group axioms on real squares of several boards, not on the
        // probe alone: closure, identity, inverses and associativity.
        for n in [1u8, 2, 5, 8, 9] {
            let squares: Vec<(u8, u8)> =
                (0..n).flat_map(|x| (0..n).map(move |y| (x, y))).collect();
            for &a in &Symmetry::ALL {
                assert!(maps_board_onto_itself(Board::new(n.into()).unwrap(), a));
                for &s in &squares {
                    assert_eq!(a.inverse().apply(n, a.apply(n, s)), s, "{a:?} inverse");
                    assert_eq!(Symmetry::Identity.apply(n, s), s);
                }
                for &b in &Symmetry::ALL {
                    let ab = a.compose(b);
                    assert!(Symmetry::ALL.contains(&ab), "closure");
                    for &s in &squares {
                        assert_eq!(
                            ab.apply(n, s),
                            a.apply(n, b.apply(n, s)),
                            "{a:?}∘{b:?}"
                        );
                    }
                    for &c in &Symmetry::ALL {
                        assert_eq!(a.compose(b).compose(c), a.compose(b.compose(c)));
                    }
                }
            }
        }
        // The map is a bijection on squares, and distinct elements differ.
        for (i, a) in Symmetry::ALL.iter().enumerate() {
            for b in &Symmetry::ALL[i + 1..] {
                assert_ne!(a.apply(5, (0, 1)), b.apply(5, (0, 1)));
            }
        }
    }

    #[test]
    fn canonical_is_idempotent_and_minimal() {
        let b = Board::new(8).unwrap();
        let p = Prefix::from_rows(b, &[3, EMPTY, EMPTY, EMPTY, EMPTY, EMPTY, 1, EMPTY])
            .unwrap();
        let (c, g) = canonical(&p);
        assert_eq!(g.apply_prefix(&p), c);
        assert_eq!(canonical(&c).0, c);
        for h in Symmetry::ALL {
            assert!(c <= h.apply_prefix(&p));
            assert_eq!(canonical(&h.apply_prefix(&p)).0, c);
        }
    }
}
