//! Checking a claimed solution of any size, and reading a SAT solver's model.
//!
//! [`check`] takes `rows[col]` and either accepts it or names the first fault:
//! a wrong number of columns, a row off the board, or two queens that attack
//! each other, with both squares. It runs in O(N) time and memory: instead of
//! comparing queens pairwise it marks each row and each of the 2N − 1 rising
//! and 2N − 1 falling diagonals as it goes, so a solution of a million columns
//! checks in milliseconds. Columns need no check, because `rows[col]` holds
//! exactly one queen per column by construction.
//!
//! [`read_model`] turns the output of a SAT solver run on the CNF of
//! [`crate::cnf`] back into `rows[col]`, with the same variable numbering, so
//! that the solver's answer goes through the same [`check`].

use std::collections::HashMap;
use std::fmt;

use crate::cnf;
use crate::notation::{square_name, write_square};

/// A square `(col, row)`, 0-based, row 0 = rank 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Square {
    /// The column (file); 0 is `a`.
    pub col: u64,
    /// The row; 0 is rank `1`.
    pub row: u64,
}

impl fmt::Display for Square {
    /// `b4 (col 1, row 3)`: algebraic, then the 0-based coordinates.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_square(f, self.col, self.row)?;
        write!(f, " (col {}, row {})", self.col, self.row)
    }
}

/// A line of the board along which two queens attack each other. (Two queens
/// never share a column in `rows[col]`.)
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Line {
    /// The same row (rank).
    Row,
    /// The same rising diagonal, where `row − col` is constant (like a1–h8).
    RisingDiagonal,
    /// The same falling diagonal, where `row + col` is constant (like a8–h1).
    FallingDiagonal,
}

impl fmt::Display for Line {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Line::Row => "row",
            Line::RisingDiagonal => "rising diagonal",
            Line::FallingDiagonal => "falling diagonal",
        })
    }
}

/// Why a placement is not a solution.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The placement does not have N columns.
    Length {
        /// N, the board size claimed.
        expected: u64,
        /// The number of columns given.
        found: u64,
    },
    /// A queen is not on the board.
    RowOffBoard {
        /// The column of the queen.
        col: u64,
        /// Its row, `≥ n`.
        row: u64,
        /// The board size.
        n: u64,
    },
    /// Two queens attack each other. `first` is the one further left.
    Attack {
        /// The queen further left.
        first: Square,
        /// The queen further right.
        second: Square,
        /// The line they share.
        line: Line,
    },
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::Length { expected, found } => write!(
                f,
                "wrong length: a solution of the {expected}×{expected} board has \
                 {expected} columns, this one has {found}"
            ),
            Fault::RowOffBoard { col, row, n } => write!(
                f,
                "the queen in column {col} ({}) is on row {row}, off the {n}×{n} board \
                 (rows are 0 to {})",
                square_name(*col, *row),
                n - 1
            ),
            Fault::Attack {
                first,
                second,
                line,
            } => write!(
                f,
                "the queens on {first} and {second} attack each other along a {line}"
            ),
        }
    }
}

impl std::error::Error for Fault {}

/// Checks that `rows[col]` is a solution of the `n`×`n` board: `n` columns,
/// every row below `n`, and no two queens on one row or diagonal.
///
/// `rows` may hold any unsigned integer type (`u8` from the search, `u32`
/// from [`crate::notation`] and [`crate::construct`]). O(N) time and memory.
///
/// # Errors
///
/// The first [`Fault`] met scanning the columns from left to right: for an
/// attack, the queen further right is the one that meets an occupied line, and
/// the other queen on that line is named with it.
pub fn check<R: Copy + Into<u64>>(n: u64, rows: &[R]) -> Result<(), Fault> {
    let len = rows.len();
    if len as u64 != n {
        return Err(Fault::Length {
            expected: n,
            found: len as u64,
        });
    }
    // One flag per row and per diagonal. A queen at (c, r) is on rising
    // diagonal r − c + (n − 1) and falling diagonal r + c, both in 0..2n−1.
    let mut row_taken = vec![false; len];
    let mut rising = vec![false; (2 * len).saturating_sub(1)];
    let mut falling = vec![false; (2 * len).saturating_sub(1)];
    for (col, r) in rows.iter().enumerate() {
        let row = (*r).into();
        // Checked before any flag is touched: it keeps the diagonal indexes
        // below inside their arrays.
        if row >= n {
            return Err(Fault::RowOffBoard {
                col: col as u64,
                row,
                n,
            });
        }
        // row < n = len, so it is a valid index.
        let row = row as usize;
        let lines = [
            (Line::Row, &mut row_taken[row]),
            (Line::RisingDiagonal, &mut rising[row + len - 1 - col]),
            (Line::FallingDiagonal, &mut falling[row + col]),
        ];
        // Rows first, then diagonals: when a queen meets several taken lines,
        // the row, the plainest attack, is the one reported.
        for (line, taken) in lines {
            if *taken {
                return Err(attack(rows, col, line));
            }
            *taken = true;
        }
    }
    Ok(())
}

/// The fault for the queen in `col` meeting an occupied `line`: finds the
/// queen to its left on that line. A second pass, but only on failure, so the
/// check stays O(N) without storing a column per line.
fn attack<R: Copy + Into<u64>>(rows: &[R], col: usize, line: Line) -> Fault {
    let row = rows[col].into();
    let same = |c: usize, r: u64| match line {
        Line::Row => r == row,
        // row − col equal, written without negative numbers.
        Line::RisingDiagonal => r + col as u64 == row + c as u64,
        Line::FallingDiagonal => r + c as u64 == row + col as u64,
    };
    let other = rows[..col]
        .iter()
        .enumerate()
        .position(|(c, &r)| same(c, r.into()))
        .expect("a line is only taken by a queen further left");
    Fault::Attack {
        first: Square {
            col: other as u64,
            row: rows[other].into(),
        },
        second: Square {
            col: col as u64,
            row,
        },
        line,
    }
}

/// Why a SAT solver's output is not a placement of one queen per column.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelError {
    /// The board size has no CNF (see [`cnf::MAX_N`]).
    BoardSize {
        /// The board size given.
        n: u64,
    },
    /// The solver reports that no model exists.
    Unsatisfiable {
        /// The line of the status.
        line: usize,
    },
    /// The solver reports a status other than satisfiable (e.g. `UNKNOWN`).
    Status {
        /// The line of the status.
        line: usize,
        /// The status text.
        status: String,
    },
    /// A token that is not a literal (a nonzero integer) where literals go.
    BadLiteral {
        /// The line of the token.
        line: usize,
        /// The token.
        token: String,
    },
    /// A literal whose variable is not one of the N² of the board: the model
    /// belongs to another N.
    VarOutOfRange {
        /// The line of the literal.
        line: usize,
        /// The variable.
        var: u64,
        /// The number of variables of the board, N².
        vars: u64,
    },
    /// A variable given both true and false.
    Contradiction {
        /// The line of the second literal.
        line: usize,
        /// The variable.
        var: u64,
    },
    /// Literals after the `0` that ends the model.
    AfterEnd {
        /// The line of the first of them.
        line: usize,
    },
    /// No literal at all.
    NoModel,
    /// Two true variables in one column, which `rows[col]` cannot hold.
    ColumnTwice {
        /// The lower queen.
        first: Square,
        /// The higher queen.
        second: Square,
    },
    /// A column with no true variable.
    ColumnEmpty {
        /// The column.
        col: u64,
    },
}

impl fmt::Display for ModelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let form = "expected a DIMACS model: `s SATISFIABLE`, then `v` lines of literals \
                    ending in 0 (a bare list of literals also works)";
        match self {
            ModelError::BoardSize { n } => {
                write!(f, "{}", cnf::BoardSizeError { n: *n })
            }
            ModelError::Unsatisfiable { line } => write!(
                f,
                "line {line}: the solver found the CNF unsatisfiable, so there is no \
                 model to check"
            ),
            ModelError::Status { line, status } => {
                write!(f, "line {line}: the solver's status is `{status}`; {form}")
            }
            ModelError::BadLiteral { line, token } => {
                write!(f, "line {line}: `{token}` is not a literal; {form}")
            }
            ModelError::VarOutOfRange { line, var, vars } => write!(
                f,
                "line {line}: variable {var} is not one of the {vars} variables of this \
                 board (1 to {vars}); is the model for another N?"
            ),
            ModelError::Contradiction { line, var } => {
                write!(
                    f,
                    "line {line}: variable {var} is given both true and false"
                )
            }
            ModelError::AfterEnd { line } => write!(
                f,
                "line {line}: literals after the 0 that ends the model; {form}"
            ),
            ModelError::NoModel => write!(f, "no literals found; {form}"),
            ModelError::ColumnTwice { first, second } => write!(
                f,
                "the model puts two queens in one column, on {first} and {second}"
            ),
            ModelError::ColumnEmpty { col } => write!(
                f,
                "the model puts no queen in column {col} (file {})",
                crate::notation::file_name(*col)
            ),
        }
    }
}

impl std::error::Error for ModelError {}

/// Reads a SAT solver's model of the CNF of the `n`×`n` board ([`crate::cnf`])
/// and returns the placement as `rows[col]`, for [`check`].
///
/// Accepted input, line by line: `s SATISFIABLE` (or minisat's `SAT`); `v`
/// lines of literals; bare lines of literals; comment lines starting with `c`;
/// blank lines. The model may be split over any number of lines and ends at a
/// literal `0`, or at the end of the text. Variables not mentioned are false.
///
/// # Errors
///
/// [`ModelError`] when the solver reports no model, a token is not a literal,
/// a variable is not one of the board's N², a variable is both true and false,
/// or the true variables do not put exactly one queen in every column. Two
/// queens in one *row* or diagonal are not an error here: they are what
/// [`check`] reports.
pub fn read_model(n: u64, text: &str) -> Result<Vec<u32>, ModelError> {
    let vars = cnf::Cnf::new(n)
        .map_err(|e| ModelError::BoardSize { n: e.n })?
        .vars();
    // The value of every variable mentioned; the rest are false. A map, so
    // that memory follows the input and not N², which may be 2·10⁹.
    let mut truth: HashMap<u64, bool> = HashMap::new();
    let mut ended = false;
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        let mut tokens = raw.split_ascii_whitespace().peekable();
        match tokens.peek().copied() {
            None | Some("c") => continue,
            Some("s") => {
                let status = tokens.skip(1).collect::<Vec<_>>().join(" ");
                check_status(line, &status)?;
                continue;
            }
            Some(status @ ("SAT" | "UNSAT" | "INDET" | "UNKNOWN")) => {
                check_status(line, status)?;
                continue;
            }
            Some("v") => {
                tokens.next();
            }
            Some(_) => {}
        }
        for token in tokens {
            let lit: i64 = token.parse().map_err(|_| ModelError::BadLiteral {
                line,
                token: token.to_string(),
            })?;
            if ended {
                return Err(ModelError::AfterEnd { line });
            }
            if lit == 0 {
                ended = true;
                continue;
            }
            let var = lit.unsigned_abs();
            if var > vars {
                return Err(ModelError::VarOutOfRange { line, var, vars });
            }
            if *truth.entry(var).or_insert(lit > 0) != (lit > 0) {
                return Err(ModelError::Contradiction { line, var });
            }
        }
    }
    if truth.is_empty() {
        return Err(ModelError::NoModel);
    }
    let mut queens: Vec<u64> = truth
        .into_iter()
        .filter(|&(_, b)| b)
        .map(|(v, _)| v)
        .collect();
    // In variable order, columns come one after the other, each bottom up.
    queens.sort_unstable();
    let mut rows: Vec<Option<u32>> = vec![None; n as usize];
    for var in queens {
        let (col, row) = cnf::square(n, var);
        // Variables run up each column, so a second queen is the higher one.
        let slot = &mut rows[col as usize];
        if let Some(first) = *slot {
            return Err(ModelError::ColumnTwice {
                first: Square {
                    col,
                    row: first.into(),
                },
                second: Square { col, row },
            });
        }
        // row < n ≤ cnf::MAX_N, far below u32::MAX.
        *slot = Some(row as u32);
    }
    rows.into_iter()
        .enumerate()
        .map(|(col, r)| r.ok_or(ModelError::ColumnEmpty { col: col as u64 }))
        .collect()
}

/// Accepts a satisfiable status and refuses every other.
fn check_status(line: usize, status: &str) -> Result<(), ModelError> {
    match status {
        "SATISFIABLE" | "SAT" => Ok(()),
        "UNSATISFIABLE" | "UNSAT" => Err(ModelError::Unsatisfiable { line }),
        other => Err(ModelError::Status {
            line,
            status: other.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::ops::ControlFlow;

    use super::*;
    use crate::board::{Board, Prefix};
    use crate::search;

    fn sq(col: u64, row: u64) -> Square {
        Square { col, row }
    }

    #[test]
    fn accepts_every_solution_up_to_10() {
        for n in 1..=10u64 {
            let mut count = 0;
            search::search(
                &Prefix::empty(Board::new(n).unwrap()),
                &mut |rows: &[u8]| {
                    assert_eq!(check(n, rows), Ok(()), "{rows:?}");
                    count += 1;
                    ControlFlow::Continue(())
                },
            );
            assert!(count > 0 || n == 2 || n == 3);
        }
    }

    /// Every placement of N ≤ 6 that is not a solution is refused, and every
    /// one that is, accepted: `check` agrees with the pairwise definition.
    #[test]
    fn agrees_with_the_pairwise_definition() {
        for n in 1..=6u64 {
            let total = n.pow(n as u32);
            for code in 0..total {
                let rows: Vec<u64> = (0..n).map(|c| code / n.pow(c as u32) % n).collect();
                let pairwise_ok = (0..n as usize).all(|a| {
                    (a + 1..n as usize).all(|b| {
                        let (dc, dr) = ((b - a) as u64, rows[a].abs_diff(rows[b]));
                        dr != 0 && dr != dc
                    })
                });
                let result = check(n, &rows);
                assert_eq!(result.is_ok(), pairwise_ok, "{rows:?}: {result:?}");
                if let Err(Fault::Attack { first, second, .. }) = result {
                    // The two named queens really attack each other.
                    assert_eq!(rows[first.col as usize], first.row);
                    assert_eq!(rows[second.col as usize], second.row);
                    assert!(first.col < second.col);
                    let (dc, dr) =
                        (second.col - first.col, first.row.abs_diff(second.row));
                    assert!(dr == 0 || dr == dc);
                }
            }
        }
    }

    #[test]
    fn names_the_two_queens_and_the_line() {
        let eight = [0u32, 4, 7, 5, 2, 6, 1, 3];
        assert_eq!(check(8, &eight), Ok(()));
        let mut row = eight;
        row[7] = 4; // h5 shares row 4 with b5
        assert_eq!(
            check(8, &row),
            Err(Fault::Attack {
                first: sq(1, 4),
                second: sq(7, 4),
                line: Line::Row
            })
        );
        let msg = check(8, &row).unwrap_err().to_string();
        assert_eq!(
            msg,
            "the queens on b5 (col 1, row 4) and h5 (col 7, row 4) attack each other \
             along a row"
        );
        assert_eq!(
            check(4, &[0u8, 1, 3, 2]).unwrap_err(),
            Fault::Attack {
                first: sq(0, 0),
                second: sq(1, 1),
                line: Line::RisingDiagonal
            }
        );
        assert_eq!(
            check(4, &[1u8, 3, 2, 0]).unwrap_err(),
            Fault::Attack {
                first: sq(1, 3),
                second: sq(2, 2),
                line: Line::FallingDiagonal
            }
        );
    }

    #[test]
    fn length_and_range_faults() {
        assert_eq!(
            check(5, &[1u32, 3, 0, 2]),
            Err(Fault::Length {
                expected: 5,
                found: 4
            })
        );
        assert_eq!(
            check(0, &[] as &[u32]),
            Ok(()),
            "the empty board, if ever asked"
        );
        let e = check(4, &[1u32, 3, 0, 4]).unwrap_err();
        assert_eq!(
            e,
            Fault::RowOffBoard {
                col: 3,
                row: 4,
                n: 4
            }
        );
        assert!(e.to_string().contains("d5"), "{e}");
    }

    #[test]
    fn a_million_columns_check_quickly() {
        let rows = crate::construct::one(1_000_000).unwrap();
        assert_eq!(check(1_000_000, &rows), Ok(()));
        // The first and the last queen on one row: the fault is found on the
        // last column, and the second pass runs over the whole board.
        let mut bad = rows.clone();
        bad[999_999] = bad[0];
        assert_eq!(
            check(1_000_000, &bad),
            Err(Fault::Attack {
                first: sq(0, bad[0].into()),
                second: sq(999_999, bad[0].into()),
                line: Line::Row
            })
        );
    }

    #[test]
    fn reads_picosat_and_minisat_models() {
        // [1 3 0 2]: variables col·4 + row + 1 = 2, 8, 9, 15.
        let picosat =
            "s SATISFIABLE\nv -1 2 -3 -4 -5 -6 -7 8 9 -10 -11 -12 -13\nv -14 15 -16 0\n";
        assert_eq!(read_model(4, picosat), Ok(vec![1, 3, 0, 2]));
        let minisat = "SAT\n-1 2 -3 -4 -5 -6 -7 8 9 -10 -11 -12 -13 -14 15 -16 0\n";
        assert_eq!(read_model(4, minisat), Ok(vec![1, 3, 0, 2]));
        assert_eq!(read_model(4, "c hi\n2 8 9 15"), Ok(vec![1, 3, 0, 2]));
    }

    #[test]
    fn model_errors_say_what_is_wrong() {
        assert_eq!(
            read_model(2, "s UNSATISFIABLE\n"),
            Err(ModelError::Unsatisfiable { line: 1 })
        );
        assert_eq!(
            read_model(4, "UNSAT\n"),
            Err(ModelError::Unsatisfiable { line: 1 })
        );
        assert!(matches!(
            read_model(4, "s UNKNOWN\n"),
            Err(ModelError::Status { .. })
        ));
        assert_eq!(
            read_model(4, "v 2 x 0"),
            Err(ModelError::BadLiteral {
                line: 1,
                token: "x".into()
            })
        );
        let e = read_model(4, "\nv 2 17 0").unwrap_err();
        assert_eq!(
            e,
            ModelError::VarOutOfRange {
                line: 2,
                var: 17,
                vars: 16
            }
        );
        assert!(e.to_string().contains("another N"), "{e}");
        assert_eq!(
            read_model(4, "v 2 -2 0"),
            Err(ModelError::Contradiction { line: 1, var: 2 })
        );
        assert_eq!(
            read_model(4, "v 2 0\nv 8 0"),
            Err(ModelError::AfterEnd { line: 2 })
        );
        assert_eq!(read_model(4, "s SATISFIABLE\n"), Err(ModelError::NoModel));
        assert_eq!(
            read_model(4, "v 1 2 8 9 15 0"),
            Err(ModelError::ColumnTwice {
                first: sq(0, 0),
                second: sq(0, 1)
            })
        );
        assert_eq!(
            read_model(4, "v 8 9 15 0"),
            Err(ModelError::ColumnEmpty { col: 0 })
        );
        assert_eq!(read_model(0, "1"), Err(ModelError::BoardSize { n: 0 }));
        // A model with two queens on one row reads fine; `check` refuses it.
        let rows = read_model(4, "v 1 5 12 14 0").unwrap();
        assert_eq!(rows, [0, 0, 3, 1]);
        assert!(matches!(
            check(4, &rows),
            Err(Fault::Attack {
                line: Line::Row,
                ..
            })
        ));
    }
}
