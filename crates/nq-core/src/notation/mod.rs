//! Text notations for solutions: writing them, and reading them back from any
//! mix of notations.
//!
//! # The notations
//!
//! A solution is `rows[col]`, the row of the queen in each column, with the
//! orientation of [`crate::board`]: column 0 is file `a`, row 0 is rank `1`
//! (the bottom). The examples below all show the N = 4 solution `[1 3 0 2]`.
//!
//! | name | example | definition |
//! |---|---|---|
//! | `vector` | `[1 3 0 2]` | the 0-based row of each column, left to right, separated by single spaces, in brackets |
//! | `digits` | `2413` | the 1-based row of each column, concatenated; only for N ≤ 9 |
//! | `algebraic` | `a2 b4 c1 d3` | the square of each queen, file letter(s) and 1-based rank, in file order, separated by single spaces |
//! | `json` | `{"n":4,"rows":[1,3,0,2]}` | an object with the board size `n` and the `vector` as `rows`, on one line, no spaces |
//! | `string` | `-*-----**-----*-` | the `board` diagram with the line breaks removed: N² characters, `*` queen, `-` empty |
//! | `board` | see below | a diagram, one rank per line, `Q` queen, `.` empty |
//!
//! The `board` diagram is drawn like a chess diagram: the TOP line is the
//! highest rank (row N − 1) and the bottom line is rank 1 (row 0); file `a` is
//! the left-most character of every line.
//!
//! ```text
//! .Q..
//! ...Q
//! Q...
//! ..Q.
//! ```
//!
//! Files are named like spreadsheet columns, so that boards wider than 26 have
//! names too: `a` … `z`, then `aa`, `ab`, … `az`, `ba`, … `zz`, then `aaa`, and
//! so on (bijective base 26: column 26 is `aa`, column 701 is `zz`, column 702
//! is `aaa`).
//!
//! Every written solution ends with a newline. Solutions in a list are one per
//! line, except `board` diagrams, which are separated by one blank line
//! ([`Format::separator`]).
//!
//! # Reading
//!
//! [`parse`] reads a whole text and yields each solution in it, recognising the
//! notation of each one by its first character, so notations can be mixed:
//!
//! * `[` starts a `vector`, `{` a `json` object, a digit a `digits` line, a
//!   lowercase letter an `algebraic` line, `*` or `-` a `string`;
//! * `Q` or `.` starts a `board` diagram, which runs over the following lines
//!   up to a blank line, the end of the text, or a line that starts otherwise;
//! * blank lines and lines starting with `#` are skipped.
//!
//! The reader is more liberal than the writer: in `vector` and `algebraic`,
//! commas may stand in for spaces and spacing is free; `algebraic` squares may
//! come in any order; `json` may have spaces between tokens, its keys in any
//! order, and may leave out `n` (it is then the length of `rows`); it refuses
//! other keys, a key given twice, and rows or an `n` that are not whole
//! numbers. Only
//! `rows`, and `n` where given, are checked against each other later, by
//! [`crate::verify`]: the reader accepts any rows it can represent, valid or
//! not, so that the verifier can say what is wrong with them. What it cannot
//! represent as `rows[col]` (a column with no queen, or with two, in a
//! `board`, `string` or `algebraic` solution) is a [`ParseError`].
//!
//! Reading is linear in the length of the text, so a `vector` of a million
//! columns reads in milliseconds. `board` and `string` are quadratic in N by
//! nature (they draw every square) and are meant for small boards.
//!
//! nq-core depends on std only, so it reads no JSON itself: [`parse`] takes the
//! reader of `json` lines from its caller ([`JsonReader`]), and the `nq` CLI
//! passes one built on serde_json. Everything else is read here.
//!
//! # Layout
//!
//! This file holds [`Format`] and the writer. `read` recognises each
//! solution's notation and holds the errors ([`parse`], [`ParseError`]);
//! `vector`, `digits`, `algebraic` (with the names of files and squares) and
//! `diagram` (`board` and `string`) each write and read their notations.

mod algebraic;
mod diagram;
mod digits;
mod read;
mod vector;

use std::fmt;
use std::str::FromStr;

pub use algebraic::{file_name, parse_file, square_name, write_file, write_square};
pub use read::{Entries, Entry, JsonReader, ParseError, ParseErrorKind, parse};

/// The largest board the `digits` notation can write: one decimal digit per
/// column, 1-based.
pub const DIGITS_MAX_N: u64 = 9;

/// A notation for solutions. See the [module docs](self) for the definitions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    /// A diagram, one rank per line, top rank first: `Q` queen, `.` empty.
    Board,
    /// `[1 3 0 2]`: the 0-based row of each column.
    Vector,
    /// `2413`: the 1-based row of each column, concatenated; N ≤ 9 only.
    Digits,
    /// `a2 b4 c1 d3`: the square of each queen.
    Algebraic,
    /// `-*-----**-----*-`: the diagram without line breaks, `*` queen, `-`
    /// empty.
    String,
    /// `{"n":4,"rows":[1,3,0,2]}`: one JSON object per line.
    Json,
}

impl Format {
    /// Every format, in the order help texts list them.
    pub const ALL: [Format; 6] = [
        Format::Board,
        Format::Vector,
        Format::Digits,
        Format::Algebraic,
        Format::String,
        Format::Json,
    ];

    /// The name that [`Format::from_str`] accepts and [`fmt::Display`] prints.
    pub fn name(self) -> &'static str {
        match self {
            Format::Board => "board",
            Format::Vector => "vector",
            Format::Digits => "digits",
            Format::Algebraic => "algebraic",
            Format::String => "string",
            Format::Json => "json",
        }
    }

    /// What a solution in this notation looks like, for error messages.
    pub fn form(self) -> &'static str {
        match self {
            Format::Board => {
                "a board diagram: N lines of N squares, `Q` for a queen and `.` for an \
                 empty square, top rank first"
            }
            Format::Vector => {
                "a vector like `[1 3 0 2]`: the 0-based row of the queen in each column"
            }
            Format::Digits => {
                "digits like `2413`: the 1-based row of the queen in each column, \
                 for N ≤ 9"
            }
            Format::Algebraic => {
                "squares like `a2 b4 c1 d3`: one queen per file, files named a … z, \
                 aa, ab, …"
            }
            Format::String => {
                "a string like `-*-----**-----*-`: N² squares, `*` for a queen and `-` \
                 for an empty square, top rank first"
            }
            Format::Json => {
                "a JSON object on one line like `{\"n\":4,\"rows\":[1,3,0,2]}` (rows \
                 0-based)"
            }
        }
    }

    /// What goes between two solutions in a list: a blank line between
    /// diagrams, nothing otherwise (every solution already ends with a newline).
    pub fn separator(self) -> &'static str {
        match self {
            Format::Board => "\n",
            _ => "",
        }
    }

    /// Checks that this notation can write solutions of a board of side `n`, so
    /// that a caller can refuse before it starts a search.
    ///
    /// # Errors
    ///
    /// [`FormatError::Empty`] for `n = 0`; [`FormatError::DigitsTooLarge`] for
    /// `digits` with `n` above [`DIGITS_MAX_N`].
    pub fn check_size(self, n: u64) -> Result<(), FormatError> {
        if n == 0 {
            return Err(FormatError::Empty);
        }
        if self == Format::Digits && n > DIGITS_MAX_N {
            return Err(FormatError::DigitsTooLarge { n });
        }
        Ok(())
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Format {
    type Err = UnknownFormat;

    /// Parses a format name, ignoring ASCII case and surrounding spaces.
    fn from_str(s: &str) -> Result<Format, UnknownFormat> {
        let name = s.trim();
        Format::ALL
            .into_iter()
            .find(|f| f.name().eq_ignore_ascii_case(name))
            .ok_or_else(|| UnknownFormat {
                name: name.to_string(),
            })
    }
}

/// A format name that [`Format::from_str`] does not know.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownFormat {
    /// The name given.
    pub name: String,
}

impl fmt::Display for UnknownFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown format `{}`: expected one of ", self.name)?;
        for (i, format) in Format::ALL.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            f.write_str(format.name())?;
        }
        Ok(())
    }
}

impl std::error::Error for UnknownFormat {}

/// Why a solution could not be written.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FormatError {
    /// The solution has no columns.
    Empty,
    /// `digits` was asked to write a board larger than [`DIGITS_MAX_N`].
    DigitsTooLarge {
        /// The board size.
        n: u64,
    },
    /// A row is not on the board, so no notation can draw it faithfully.
    RowOffBoard {
        /// The column of the queen.
        col: u64,
        /// Its row, `≥ n`.
        row: u64,
        /// The board size.
        n: u64,
    },
    /// The output refused the text.
    Write(fmt::Error),
}

impl fmt::Display for FormatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FormatError::Empty => write!(f, "a solution has at least one column"),
            FormatError::DigitsTooLarge { n } => write!(
                f,
                "the digits format holds one digit per column and works only for N ≤ \
                 {DIGITS_MAX_N}, not N = {n}; use vector, algebraic or json instead"
            ),
            FormatError::RowOffBoard { col, row, n } => write!(
                f,
                "the queen in column {col} is on row {row}, off the {n}×{n} board \
                 (rows are 0 to {})",
                n - 1
            ),
            FormatError::Write(_) => write!(f, "could not write the solution"),
        }
    }
}

impl std::error::Error for FormatError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            FormatError::Write(e) => Some(e),
            _ => None,
        }
    }
}

/// Writes one solution `rows[col]` in `format`, ending with a newline.
///
/// `rows` may hold any unsigned integer type: the search produces `u8` rows and
/// [`crate::construct`] `u32` rows. The board size is `rows.len()`.
///
/// # Errors
///
/// [`FormatError::Empty`] and [`FormatError::DigitsTooLarge`] as in
/// [`Format::check_size`]; [`FormatError::RowOffBoard`] when a row is not
/// below N (nothing is written then); [`FormatError::Write`] when `out` fails.
pub fn write_solution<W, R>(
    out: &mut W,
    format: Format,
    rows: &[R],
) -> Result<(), FormatError>
where
    W: fmt::Write + ?Sized,
    R: Copy + Into<u64>,
{
    let n = rows.len() as u64;
    format.check_size(n)?;
    // Checked up front for every notation, so that no notation writes a
    // solution it could not read back.
    if let Some((col, row)) = rows
        .iter()
        .map(|&r| r.into())
        .enumerate()
        .find(|&(_, r)| r >= n)
    {
        return Err(FormatError::RowOffBoard {
            col: col as u64,
            row,
            n,
        });
    }
    write_valid(out, format, rows.iter().map(|&r| r.into())).map_err(FormatError::Write)
}

/// The body of [`write_solution`], once the rows are known to be on the board.
fn write_valid<W: fmt::Write + ?Sized>(
    out: &mut W,
    format: Format,
    rows: impl ExactSizeIterator<Item = u64> + Clone,
) -> fmt::Result {
    let n = rows.len();
    match format {
        Format::Vector => vector::write_list(out, "[", " ", "]\n", rows),
        // Written here, read by the caller's reader ([`JsonReader`]).
        Format::Json => {
            write!(out, "{{\"n\":{n},\"rows\":")?;
            vector::write_list(out, "[", ",", "]}\n", rows)
        }
        Format::Digits => digits::write(out, rows),
        Format::Algebraic => algebraic::write(out, rows),
        Format::Board => diagram::write_diagram(out, rows, ['Q', '.'], true),
        Format::String => {
            diagram::write_diagram(out, rows, ['*', '-'], false)?;
            out.write_char('\n')
        }
    }
}

/// [`write_solution`] into a new `String`.
///
/// # Errors
///
/// As [`write_solution`], except that a `String` never refuses text.
pub fn to_string<R: Copy + Into<u64>>(
    format: Format,
    rows: &[R],
) -> Result<String, FormatError> {
    let mut s = String::new();
    write_solution(&mut s, format, rows)?;
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FOUR: [u32; 4] = [1, 3, 0, 2];

    #[test]
    fn the_documented_examples() {
        let w = |f| to_string(f, &FOUR).unwrap();
        assert_eq!(w(Format::Vector), "[1 3 0 2]\n");
        assert_eq!(w(Format::Digits), "2413\n");
        assert_eq!(w(Format::Algebraic), "a2 b4 c1 d3\n");
        assert_eq!(w(Format::Json), "{\"n\":4,\"rows\":[1,3,0,2]}\n");
        assert_eq!(w(Format::String), "-*-----**-----*-\n");
        assert_eq!(w(Format::Board), ".Q..\n...Q\nQ...\n..Q.\n");
        // The classic first solution of N = 8 in the orientation of the brief.
        let eight = [0u8, 4, 7, 5, 2, 6, 1, 3];
        assert_eq!(
            to_string(Format::Algebraic, &eight).unwrap(),
            "a1 b5 c8 d6 e3 f7 g2 h4\n"
        );
        assert_eq!(to_string(Format::Digits, &eight).unwrap(), "15863724\n");
    }

    #[test]
    fn formatting_refuses_what_it_cannot_write() {
        assert_eq!(
            to_string(Format::Digits, &[0u8; 10]),
            Err(FormatError::DigitsTooLarge { n: 10 })
        );
        let msg = Format::Digits.check_size(12).unwrap_err().to_string();
        assert!(msg.contains("N ≤ 9") && msg.contains("12"), "{msg}");
        assert_eq!(
            to_string::<u8>(Format::Vector, &[]),
            Err(FormatError::Empty)
        );
        assert_eq!(
            to_string(Format::Board, &[0u8, 2]),
            Err(FormatError::RowOffBoard {
                col: 1,
                row: 2,
                n: 2
            })
        );
    }

    #[test]
    fn format_names_parse() {
        for format in Format::ALL {
            assert_eq!(format.name().parse(), Ok(format));
            assert_eq!(format.to_string().to_uppercase().parse(), Ok(format));
        }
        let msg = "fen".parse::<Format>().unwrap_err().to_string();
        assert_eq!(
            msg,
            "unknown format `fen`: expected one of board, vector, digits, algebraic, \
             string, json"
        );
    }
}
