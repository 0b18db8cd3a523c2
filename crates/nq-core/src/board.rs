//! Board sizes and partial placements.
//!
//! # Orientation
//!
//! Throughout nq a square is `(col, row)`, both 0-based: column 0 is the
//! left-most file (`a` in algebraic notation) and row 0 is the bottom rank
//! (`1`). A placement is stored as `rows[col]`, the row of the queen in each
//! column, which is exactly the `vector` notation. The search fills columns from
//! left to right, so solutions come out in lexicographic order of that vector.

use std::fmt;

use crate::error::{Error, ErrorKind, PrefixFault, Result};

/// The largest supported board: the search keeps one bit per row in a `u32`.
pub const MAX_N: u32 = 32;

/// Marks an empty column in a [`Prefix`] and in its byte encoding.
pub const EMPTY: u8 = u8::MAX;

/// A validated board size, `1..=32`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Board {
    n: u8,
}

impl Board {
    /// Validates `n`.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::BoardSize`] when `n` is 0 or larger than [`MAX_N`].
    pub fn new(n: u64) -> Result<Board> {
        if n == 0 || n > u64::from(MAX_N) {
            return Err(Error::new(ErrorKind::BoardSize(n)));
        }
        Ok(Board { n: n as u8 })
    }

    /// The side length N.
    pub fn n(self) -> u8 {
        self.n
    }

    /// `N` as a `usize`, for indexing.
    pub fn len(self) -> usize {
        usize::from(self.n)
    }

    /// Always false: a board has at least one square. Present because clippy
    /// expects `is_empty` beside `len`.
    pub fn is_empty(self) -> bool {
        false
    }

    /// A mask with the low N bits set: every row of one column.
    pub fn full_mask(self) -> u32 {
        // Shifting a u64 avoids the overflow of `1u32 << 32` at N = 32.
        ((1u64 << self.n) - 1) as u32
    }
}

impl fmt::Display for Board {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}×{}", self.n, self.n)
    }
}

/// A partial placement of non-attacking queens: at most one per column, row and
/// diagonal. `rows[c]` is the row of the queen in column `c`, or [`EMPTY`].
///
/// Prefixes are ordered lexicographically by `rows`, with [`EMPTY`] sorting
/// after every row; that order picks the canonical member of a symmetry class.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Prefix {
    rows: [u8; MAX_N as usize],
    board: Board,
}

impl Prefix {
    /// The empty placement on `board`.
    pub fn empty(board: Board) -> Prefix {
        Prefix {
            rows: [EMPTY; MAX_N as usize],
            board,
        }
    }

    /// Builds a prefix from `rows[c]` (row of column `c`, or [`EMPTY`]).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::PrefixInvalid`] when `rows` does not have N entries, a row is
    /// off the board, or two queens attack each other.
    pub fn from_rows(board: Board, rows: &[u8]) -> Result<Prefix> {
        if rows.len() != board.len() {
            return Err(Error::new(ErrorKind::PrefixInvalid {
                col: 0,
                reason: PrefixFault::Length {
                    expected: board.n(),
                    found: rows.len(),
                },
            }));
        }
        // One pass with the attacked rows and diagonals as bit masks: every
        // stored job is rebuilt from its rows on resume, and checking each
        // queen against every earlier one was most of a restart's time
        // (BENCHMARKS §13). A fault goes through `place`, so that the error
        // names the same square and attacking queen as it always did.
        let mut p = Prefix::empty(board);
        let n = u32::from(board.n());
        let (mut used, mut diag, mut anti) = (0u64, 0u64, 0u64);
        for (c, &r) in rows.iter().enumerate() {
            if r == EMPTY {
                continue;
            }
            let (col, row) = (c as u32, u32::from(r));
            if row >= n {
                p.place(c as u8, r)?;
            }
            // col < n and row < n ≤ 32: every shift is below 64.
            let (rb, d, a) = (
                1u64 << row,
                1u64 << (col + row),
                1u64 << (col + n - 1 - row),
            );
            if used & rb != 0 || diag & d != 0 || anti & a != 0 {
                p.place(c as u8, r)?;
            }
            used |= rb;
            diag |= d;
            anti |= a;
            p.rows[c] = r;
        }
        Ok(p)
    }

    /// The prefix of `rows` (every column; [`EMPTY`] past the board), known
    /// to be a valid placement because it is the image of one under a
    /// symmetry: without [`Prefix::from_rows`]'s checks, which were most of
    /// the time of a stabilizer (eight images a job in every restore's,
    /// audit's and digest's check of the stored jobs).
    pub(crate) fn from_valid_rows(board: Board, rows: [u8; MAX_N as usize]) -> Prefix {
        debug_assert!(
            Prefix::from_rows(board, &rows[..board.len()]).is_ok()
                && rows[board.len()..].iter().all(|&r| r == EMPTY),
            "not a valid placement: {rows:?}"
        );
        Prefix { rows, board }
    }

    /// The board this prefix lives on.
    pub fn board(&self) -> Board {
        self.board
    }

    /// `rows[c]` for every column, [`EMPTY`] where there is no queen. This is
    /// also the wire encoding (one byte per column).
    pub fn rows(&self) -> &[u8] {
        &self.rows[..self.board.len()]
    }

    /// The row of the queen in `col`, if any.
    pub fn get(&self, col: u8) -> Option<u8> {
        match self.rows.get(usize::from(col)) {
            Some(&r) if r != EMPTY => Some(r),
            _ => None,
        }
    }

    /// Every queen as `(col, row)`, left to right.
    pub fn queens(&self) -> impl Iterator<Item = (u8, u8)> + '_ {
        self.rows()
            .iter()
            .enumerate()
            .filter(|&(_, &r)| r != EMPTY)
            .map(|(c, &r)| (c as u8, r))
    }

    /// How many queens are placed.
    pub fn len(&self) -> usize {
        self.rows().iter().filter(|&&r| r != EMPTY).count()
    }

    /// True when no queen is placed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True when every column holds a queen: the prefix is a solution.
    pub fn is_complete(&self) -> bool {
        self.rows().iter().all(|&r| r != EMPTY)
    }

    /// A mask of the rows that hold a queen.
    pub fn used_rows(&self) -> u32 {
        self.queens().fold(0, |m, (_, r)| m | 1 << r)
    }

    /// Places a queen at `(col, row)`.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::PrefixInvalid`] when the square is off the board, the column
    /// is taken, or another queen attacks the square. The prefix is unchanged.
    pub fn place(&mut self, col: u8, row: u8) -> Result<()> {
        let fault = |reason| Error::new(ErrorKind::PrefixInvalid { col, reason });
        let n = self.board.n();
        if col >= n {
            return Err(fault(PrefixFault::ColOutOfRange));
        }
        if row >= n {
            return Err(fault(PrefixFault::RowOutOfRange(row)));
        }
        if self.rows[usize::from(col)] != EMPTY {
            return Err(fault(PrefixFault::ColTaken));
        }
        if let Some((c, r)) = self.queens().find(|&(c, r)| attacks((c, r), (col, row))) {
            return Err(fault(PrefixFault::Attacked { col: c, row: r }));
        }
        self.rows[usize::from(col)] = row;
        Ok(())
    }

    /// True when a queen may stand at `(col, row)`: the column is empty and no
    /// queen attacks the square.
    pub fn allows(&self, col: u8, row: u8) -> bool {
        col < self.board.n()
            && row < self.board.n()
            && self.rows[usize::from(col)] == EMPTY
            && !self.queens().any(|q| attacks(q, (col, row)))
    }
}

impl fmt::Debug for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Prefix[")?;
        for (i, &r) in self.rows().iter().enumerate() {
            if i > 0 {
                write!(f, " ")?;
            }
            if r == EMPTY {
                write!(f, "-")?
            } else {
                write!(f, "{r}")?
            }
        }
        write!(f, "]")
    }
}

/// True when queens on squares `a` and `b` (each `(col, row)`) attack each
/// other: same square, column, row or diagonal.
pub fn attacks(a: (u8, u8), b: (u8, u8)) -> bool {
    let dc = a.0.abs_diff(b.0);
    let dr = a.1.abs_diff(b.1);
    dc == 0 || dr == 0 || dc == dr
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn board_range() {
        assert!(Board::new(0).is_err());
        assert!(Board::new(33).is_err());
        assert_eq!(Board::new(32).unwrap().full_mask(), u32::MAX);
        assert_eq!(Board::new(4).unwrap().full_mask(), 0b1111);
        let msg = Board::new(40).unwrap_err().to_string();
        assert!(msg.contains("40") && msg.contains("1 to 32"), "{msg}");
    }

    #[test]
    fn prefix_rejects_attacks() {
        let b = Board::new(8).unwrap();
        let mut p = Prefix::empty(b);
        p.place(0, 0).unwrap();
        assert!(p.place(1, 1).is_err(), "diagonal");
        assert!(p.place(3, 0).is_err(), "row");
        assert!(p.place(0, 4).is_err(), "column");
        p.place(1, 2).unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(p.rows()[..3], [0, 2, EMPTY]);
        assert!(Prefix::from_rows(b, &[0, 1]).is_err(), "length");
    }

    #[test]
    fn from_rows_agrees_with_placing_queen_by_queen() {
        // SplitMix64, so that the cases are many, varied and repeatable.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        for case in 0..20_000 {
            let n = 1 + (next() % u64::from(MAX_N)) as u8;
            let b = Board::new(u64::from(n)).unwrap();
            let rows: Vec<u8> = (0..n)
                .map(|_| match next() % 8 {
                    0..=3 => EMPTY,
                    // Now and then off the board, to reach that fault too.
                    4 if case % 7 == 0 => n + (next() % 3) as u8,
                    _ => (next() % u64::from(n)) as u8,
                })
                .collect();
            let mut slow = Prefix::empty(b);
            let expected = rows
                .iter()
                .enumerate()
                .filter(|&(_, &r)| r != EMPTY)
                .try_for_each(|(c, &r)| slow.place(c as u8, r))
                .map(|()| slow);
            let got = Prefix::from_rows(b, &rows);
            assert_eq!(
                got.as_ref().map(Prefix::rows).map_err(ToString::to_string),
                expected
                    .as_ref()
                    .map(Prefix::rows)
                    .map_err(ToString::to_string),
                "{rows:?}"
            );
        }
    }
}
