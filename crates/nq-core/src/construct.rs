//! One solution for any N, built directly in O(N) time, without search.
//!
//! # The construction
//!
//! This is the classical explicit construction, by cases of N mod 6, of
//! Hoffman, Loessi and Moore ("Constructions for the solution of the m queens
//! problem", Mathematics Magazine 42(2), 1969) in the form Bernhardsson gives
//! ("Explicit solutions to the N-queens problem for all N", SIGART Bulletin
//! 2(2), 1991). It lists the 1-based row of the queen in each column, left to
//! right, as the even numbers up to N followed by the odd numbers up to N, with
//! two repairs:
//!
//! | N mod 6 | rows, column by column (1-based) | N = … |
//! |---|---|---|
//! | 0, 1, 4, 5 | `2 4 … ` then `1 3 5 …` | 6: `2 4 6 1 3 5` |
//! | 2 | `2 4 … N`, then `3 1 7 9 … N−1 5` (1 and 3 swapped, 5 moved last) | 8: `2 4 6 8 3 1 7 5` |
//! | 3 | `4 6 … N−1 2`, then `5 7 … N 1 3` (2 moved last; 1 and 3 moved last) | 9: `4 6 8 2 5 7 9 1 3` |
//!
//! Why it works, briefly: in the plain list the evens and the odds are each a
//! run of queens two rows apart per column, a knight's move, so no two queens
//! in the same run share a diagonal; queens of different runs could only clash
//! across the seam between the runs, and they do exactly when N ≡ 2 or 3 (mod
//! 6), which the two repairs undo. The cited papers hold the proof; the unit
//! tests check every N from 1 to 2000 and several very large N with
//! [`crate::verify::check`].
//!
//! N = 2 and N = 3 have no solution at all, and the construction refuses them.
//! The rows are `u32`, so N may go far beyond the 32 of [`crate::Board`]: up to
//! [`MAX_N`], memory allowing.

use std::fmt;

/// The largest N the construction accepts: rows are `u32`, so row N − 1 must
/// fit in one.
pub const MAX_N: u64 = 1 << 32;

/// Why no solution was built.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConstructError {
    /// N is 2 or 3: no placement of N non-attacking queens exists.
    NoSolution {
        /// The board size.
        n: u64,
    },
    /// N is 0 or larger than [`MAX_N`].
    BoardSize {
        /// The board size.
        n: u64,
    },
    /// The N rows (4 bytes each) do not fit in memory.
    OutOfMemory {
        /// The board size.
        n: u64,
    },
}

impl fmt::Display for ConstructError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConstructError::NoSolution { n } => write!(
                f,
                "the {n}×{n} board has no solution: N queens can be placed for N = 1 \
                 and every N ≥ 4, never for N = 2 or 3"
            ),
            ConstructError::BoardSize { n } => write!(
                f,
                "board size {n} is not supported: N must be an integer from 1 to {MAX_N}"
            ),
            ConstructError::OutOfMemory { n } => {
                write!(
                    f,
                    "not enough memory for the {n} rows of an {n}×{n} solution"
                )
            }
        }
    }
}

impl std::error::Error for ConstructError {}

/// A solution of the N×N board as `rows[col]` (0-based), built by the
/// construction in the [module docs](self) in O(N) time and memory.
///
/// # Errors
///
/// [`ConstructError::NoSolution`] for N = 2 and 3; [`ConstructError::BoardSize`]
/// for N = 0 and N above [`MAX_N`]; [`ConstructError::OutOfMemory`] when the
/// rows cannot be allocated (the allocation is tried, not assumed).
pub fn one(n: u64) -> Result<Vec<u32>, ConstructError> {
    if n == 0 || n > MAX_N {
        return Err(ConstructError::BoardSize { n });
    }
    if n == 2 || n == 3 {
        return Err(ConstructError::NoSolution { n });
    }
    let len = usize::try_from(n).map_err(|_| ConstructError::OutOfMemory { n })?;
    let mut rows: Vec<u32> = Vec::new();
    rows.try_reserve_exact(len)
        .map_err(|_| ConstructError::OutOfMemory { n })?;
    // `push` takes the 1-based row of the next column, as the module table
    // lists them. 1 ≤ row ≤ n ≤ 2^32, so row − 1 fits a u32.
    let mut push = |row: u64| rows.push((row - 1) as u32);
    match n % 6 {
        2 => {
            (2..=n).step_by(2).for_each(&mut push);
            // The odds 1 3 5 7 … with 1 and 3 swapped and 5 moved last. N ≥ 8
            // here (N = 2 was refused), so 1, 3, 5 and 7 all exist.
            [3, 1].into_iter().for_each(&mut push);
            (7..n).step_by(2).for_each(&mut push);
            push(5);
        }
        3 => {
            // N ≥ 9 here (N = 3 was refused), so 2, 4, 1, 3 and 5 all exist.
            (4..n).step_by(2).for_each(&mut push);
            push(2);
            (5..=n).step_by(2).for_each(&mut push);
            [1, 3].into_iter().for_each(&mut push);
        }
        _ => {
            (2..=n).step_by(2).for_each(&mut push);
            (1..=n).step_by(2).for_each(&mut push);
        }
    }
    debug_assert_eq!(rows.len(), len, "every column gets exactly one row");
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::check;

    #[test]
    fn the_table_examples() {
        let one_based = |n| one(n).unwrap().iter().map(|r| r + 1).collect::<Vec<_>>();
        assert_eq!(one_based(1), [1]);
        assert_eq!(one_based(4), [2, 4, 1, 3]);
        assert_eq!(one_based(6), [2, 4, 6, 1, 3, 5]);
        assert_eq!(one_based(8), [2, 4, 6, 8, 3, 1, 7, 5]);
        assert_eq!(one_based(9), [4, 6, 8, 2, 5, 7, 9, 1, 3]);
    }

    #[test]
    fn valid_for_every_n_up_to_2000() {
        for n in (1..=2000).filter(|&n| n != 2 && n != 3) {
            let rows = one(n).unwrap();
            assert_eq!(rows.len() as u64, n);
            check(n, &rows).unwrap_or_else(|e| panic!("n={n}: {e}"));
        }
    }

    #[test]
    fn valid_for_huge_n_of_every_residue() {
        // One N of each residue mod 6, around a million, plus 10^7.
        for n in (1_000_000..1_000_006).chain([10_000_000]) {
            let rows = one(n).unwrap();
            check(n, &rows).unwrap_or_else(|e| panic!("n={n}: {e}"));
        }
    }

    #[test]
    fn refuses_boards_without_solutions() {
        for n in [2, 3] {
            let e = one(n).unwrap_err();
            assert_eq!(e, ConstructError::NoSolution { n });
            assert!(e.to_string().contains("no solution"), "{e}");
        }
        assert_eq!(one(0), Err(ConstructError::BoardSize { n: 0 }));
        assert_eq!(
            one(MAX_N + 1),
            Err(ConstructError::BoardSize { n: MAX_N + 1 })
        );
    }
}
