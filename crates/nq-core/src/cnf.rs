//! The N-Queens problem as a SAT instance in DIMACS CNF, for checking nq
//! against an independent solver.
//!
//! # Variables
//!
//! Variable `col·N + row + 1` is true when a queen stands on `(col, row)`
//! (0-based, row 0 = rank 1, as everywhere in nq; see [`var`] and [`square`]).
//! So variables `1..=N` are column `a` from the bottom up, `N+1..=2N` column
//! `b`, and so on. [`crate::verify::read_model`] reads a solver's model back
//! with the same numbering.
//!
//! # Clauses
//!
//! In this order, each group line by line:
//!
//! 1. every column: at least one queen (one clause of N literals), then at most
//!    one (a clause `¬x ∨ ¬y` for every pair of its squares);
//! 2. every row: the same;
//! 3. every rising diagonal (`row − col` constant) of two or more squares: at
//!    most one queen, pairwise; diagonals from the bottom-right corner to the
//!    top-left;
//! 4. every falling diagonal (`row + col` constant): the same, from the
//!    bottom-left corner to the top-right.
//!
//! "At least one per row" follows from the rest (N queens in N columns, at
//! most one per row), but stating it helps solvers and costs N clauses. The
//! pairwise encoding needs no auxiliary variables, so the models are exactly
//! the solutions, and the variable count is exactly N². The clause count is
//! `2N + 2N·C(N,2) + 2·(2·C(N,3) + C(N,2))`, where the last term counts the
//! pairs on the diagonals of each direction ([`Cnf::clauses`]).

use std::fmt;
use std::ops::ControlFlow;

/// The largest N whose variables fit in a DIMACS literal: solvers read
/// literals as 32-bit signed integers, and 46340² < 2³¹ − 1 < 46341².
pub const MAX_N: u64 = 46_340;

/// The variable of the square `(col, row)` on a board of side `n`:
/// `col·n + row + 1`. The caller MUST pass a square on the board.
pub fn var(n: u64, col: u64, row: u64) -> u64 {
    col * n + row + 1
}

/// The square `(col, row)` of variable `v`, the inverse of [`var`]. The caller
/// MUST pass a variable of the board, `1 ≤ v ≤ n²`.
pub fn square(n: u64, v: u64) -> (u64, u64) {
    ((v - 1) / n, (v - 1) % n)
}

/// A board size that has no CNF here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BoardSizeError {
    /// The board size asked for.
    pub n: u64,
}

impl fmt::Display for BoardSizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "board size {} has no CNF: N must be an integer from 1 to {MAX_N}, so that \
             the N² variables fit in a 32-bit DIMACS literal",
            self.n
        )
    }
}

impl std::error::Error for BoardSizeError {}

/// The CNF of one board size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cnf {
    n: u64,
}

/// `C(k, 2)`, the number of pairs among `k` squares.
fn pairs(k: u64) -> u64 {
    k * k.saturating_sub(1) / 2
}

impl Cnf {
    /// The CNF of the `n`×`n` board.
    ///
    /// # Errors
    ///
    /// [`BoardSizeError`] when `n` is 0 or above [`MAX_N`].
    pub fn new(n: u64) -> Result<Cnf, BoardSizeError> {
        if n == 0 || n > MAX_N {
            return Err(BoardSizeError { n });
        }
        Ok(Cnf { n })
    }

    /// The board size.
    pub fn n(&self) -> u64 {
        self.n
    }

    /// The number of variables, N².
    pub fn vars(&self) -> u64 {
        self.n * self.n
    }

    /// The exact number of clauses [`Cnf::for_each_clause`] produces (the
    /// formula of the module docs).
    pub fn clauses(&self) -> u64 {
        let n = self.n;
        // C(N, 3), the pairs on one direction's diagonals being
        // Σ_{k<N} 2·C(k, 2) + C(N, 2) = 2·C(N, 3) + C(N, 2).
        let triples = n * n.saturating_sub(1) * n.saturating_sub(2) / 6;
        let lines = 2 * (n + n * pairs(n));
        let diagonals = 2 * (2 * triples + pairs(n));
        lines + diagonals
    }

    /// Calls `f` with every clause in the order of the module docs, as its
    /// literals (positive: the variable is true; negative: false), until `f`
    /// breaks.
    pub fn for_each_clause<B>(
        &self,
        mut f: impl FnMut(&[i64]) -> ControlFlow<B>,
    ) -> ControlFlow<B> {
        let n = self.n as i64;
        // `MAX_N` keeps every variable below 2^31, so the casts are exact.
        let v = |col: i64, row: i64| var(self.n, col as u64, row as u64) as i64;
        // The squares of the line at hand, reused from line to line.
        let mut line = Vec::with_capacity(self.n as usize);
        for col in 0..n {
            line.clear();
            line.extend((0..n).map(|row| v(col, row)));
            exactly_one(&mut f, &line)?;
        }
        for row in 0..n {
            line.clear();
            line.extend((0..n).map(|col| v(col, row)));
            exactly_one(&mut f, &line)?;
        }
        // Rising diagonals: row − col = d for d from −(n−1) to n−1, starting at
        // the square (max(0, −d), max(0, d)).
        for d in -(n - 1)..n {
            let (col0, row0) = (0.max(-d), 0.max(d));
            line.clear();
            line.extend((0..n - d.abs()).map(|i| v(col0 + i, row0 + i)));
            at_most_one(&mut f, &line)?;
        }
        // Falling diagonals: row + col = s for s from 0 to 2n−2, starting at the
        // square with the least column, (max(0, s−(n−1)), s − that column).
        for s in 0..2 * n - 1 {
            let col0 = 0.max(s - (n - 1));
            let len = s.min(2 * (n - 1) - s) + 1;
            line.clear();
            line.extend((0..len).map(|i| v(col0 + i, s - col0 - i)));
            at_most_one(&mut f, &line)?;
        }
        ControlFlow::Continue(())
    }

    /// Writes the whole DIMACS text: comment lines naming the numbering, the
    /// header `p cnf V C` with exact counts, and one clause per line ending in
    /// `0`.
    ///
    /// # Errors
    ///
    /// The first error of `out`; the text is then incomplete.
    pub fn write_dimacs<W: fmt::Write + ?Sized>(&self, out: &mut W) -> fmt::Result {
        let n = self.n;
        writeln!(out, "c nq: the {n}-queens problem")?;
        writeln!(
            out,
            "c variable col*{n} + row + 1 is a queen on (col, row), 0-based, row 0 = rank 1"
        )?;
        writeln!(out, "p cnf {} {}", self.vars(), self.clauses())?;
        let written = self.for_each_clause(|lits| {
            for &lit in lits {
                if let Err(e) = write!(out, "{lit} ") {
                    return ControlFlow::Break(e);
                }
            }
            match out.write_str("0\n") {
                Ok(()) => ControlFlow::Continue(()),
                Err(e) => ControlFlow::Break(e),
            }
        });
        match written {
            ControlFlow::Continue(()) => Ok(()),
            ControlFlow::Break(e) => Err(e),
        }
    }
}

/// Exactly one of `vars`: one clause for "at least one", then [`at_most_one`].
fn exactly_one<B>(
    f: &mut dyn FnMut(&[i64]) -> ControlFlow<B>,
    vars: &[i64],
) -> ControlFlow<B> {
    f(vars)?;
    at_most_one(f, vars)
}

/// Pairwise at-most-one: `¬x ∨ ¬y` for every pair of `vars`, in order.
fn at_most_one<B>(
    f: &mut dyn FnMut(&[i64]) -> ControlFlow<B>,
    vars: &[i64],
) -> ControlFlow<B> {
    for (i, &x) in vars.iter().enumerate() {
        for &y in &vars[i + 1..] {
            f(&[-x, -y])?;
        }
    }
    ControlFlow::Continue(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::board::{Board, Prefix};
    use crate::search;

    fn clauses(n: u64) -> Vec<Vec<i64>> {
        let mut all = vec![];
        let _ = Cnf::new(n).unwrap().for_each_clause(|c| {
            all.push(c.to_vec());
            ControlFlow::<()>::Continue(())
        });
        all
    }

    /// The variables that are true for a placement `rows[col]`.
    fn model(rows: &[u64]) -> Vec<bool> {
        let n = rows.len() as u64;
        let mut truth = vec![false; (n * n + 1) as usize];
        for (col, &row) in rows.iter().enumerate() {
            truth[var(n, col as u64, row) as usize] = true;
        }
        truth
    }

    fn satisfies(truth: &[bool], clauses: &[Vec<i64>]) -> bool {
        clauses.iter().all(|c| {
            c.iter()
                .any(|&lit| truth[lit.unsigned_abs() as usize] == (lit > 0))
        })
    }

    #[test]
    fn numbering_round_trips() {
        for n in 1..=9 {
            for v in 1..=n * n {
                let (c, r) = square(n, v);
                assert!(c < n && r < n);
                assert_eq!(var(n, c, r), v);
            }
        }
        assert_eq!(var(8, 0, 0), 1);
        assert_eq!(var(8, 1, 0), 9, "column b starts at N + 1");
    }

    #[test]
    fn the_header_counts_are_exact() {
        for n in 1..=20 {
            let cnf = Cnf::new(n).unwrap();
            let all = clauses(n);
            assert_eq!(all.len() as u64, cnf.clauses(), "n={n}");
            let max = all
                .iter()
                .flatten()
                .map(|l| l.unsigned_abs())
                .max()
                .unwrap();
            assert_eq!(max, cnf.vars(), "every variable is used, n={n}");
        }
        assert_eq!(Cnf::new(1).unwrap().clauses(), 2);
        assert_eq!(Cnf::new(2).unwrap().clauses(), 10);
    }

    #[test]
    fn dimacs_text_has_the_header_and_one_clause_per_line() {
        let mut text = String::new();
        Cnf::new(4).unwrap().write_dimacs(&mut text).unwrap();
        let mut lines = text.lines().filter(|l| !l.starts_with('c'));
        assert_eq!(lines.next(), Some("p cnf 16 84"));
        assert_eq!(lines.next(), Some("1 2 3 4 0"), "column a: at least one");
        assert_eq!(lines.next(), Some("-1 -2 0"));
        assert_eq!(lines.count(), 82, "84 clauses in all");
    }

    /// For N ≤ 4 every one of the 2^(N²) assignments is tried: the models are
    /// exactly the solutions the search lists.
    #[test]
    fn models_are_exactly_the_solutions_up_to_4() {
        for n in 1..=4u64 {
            let all = clauses(n);
            let vars = (n * n) as usize;
            let mut models = vec![];
            for bits in 0u32..1 << vars {
                let truth: Vec<bool> = std::iter::once(false)
                    .chain((0..vars).map(|i| bits >> i & 1 == 1))
                    .collect();
                if satisfies(&truth, &all) {
                    // A model has one queen per column (clauses of group 1).
                    let rows: Vec<u64> = (0..n)
                        .map(|c| (0..n).find(|&r| truth[var(n, c, r) as usize]).unwrap())
                        .collect();
                    models.push(rows);
                }
            }
            models.sort();
            let mut solutions = vec![];
            let board = Board::new(n).unwrap();
            search::search(&Prefix::empty(board), &mut |rows: &[u8]| {
                solutions.push(rows.iter().map(|&r| u64::from(r)).collect::<Vec<_>>());
                ControlFlow::Continue(())
            });
            assert_eq!(models, solutions, "n={n}");
        }
    }

    /// For N = 5..=8: every solution satisfies every clause, and every
    /// placement that breaks one rule, or has a queen too few, violates some
    /// clause.
    #[test]
    fn solutions_satisfy_and_near_misses_do_not() {
        for n in 5..=8u64 {
            let all = clauses(n);
            let board = Board::new(n).unwrap();
            let mut solutions: Vec<Vec<u64>> = vec![];
            search::search(&Prefix::empty(board), &mut |rows: &[u8]| {
                solutions.push(rows.iter().map(|&r| u64::from(r)).collect());
                ControlFlow::Continue(())
            });
            for s in &solutions {
                assert!(satisfies(&model(s), &all), "n={n} {s:?}");
                // Move each queen to every other row of its column: the result
                // has two queens on one row or a diagonal and must be refused.
                for col in 0..s.len() {
                    for row in (0..n).filter(|&r| r != s[col]) {
                        let mut t = s.clone();
                        t[col] = row;
                        assert!(!satisfies(&model(&t), &all), "n={n} {t:?}");
                    }
                    // A queen removed: at least one per column fails.
                    let mut truth = model(s);
                    truth[var(n, col as u64, s[col]) as usize] = false;
                    assert!(!satisfies(&truth, &all));
                    // A queen added beside another in a column.
                    let mut truth = model(s);
                    truth[var(n, col as u64, (s[col] + 1) % n) as usize] = true;
                    assert!(!satisfies(&truth, &all));
                }
            }
        }
    }

    #[test]
    fn sizes_outside_the_range_are_refused() {
        assert_eq!(Cnf::new(0), Err(BoardSizeError { n: 0 }));
        assert!(Cnf::new(MAX_N).is_ok());
        let msg = Cnf::new(MAX_N + 1).unwrap_err().to_string();
        assert!(msg.contains("from 1 to 46340"), "{msg}");
        assert!((MAX_N * MAX_N) < i32::MAX as u64);
        assert!(((MAX_N + 1) * (MAX_N + 1)) > i32::MAX as u64);
    }
}
