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
//! order, and may leave out `n` (it is then the length of `rows`). Only
//! `rows`, and `n` where given, are checked against each other later, by
//! [`crate::verify`]: the reader accepts any rows it can represent, valid or
//! not, so that the verifier can say what is wrong with them. What it cannot
//! represent as `rows[col]` (a column with no queen, or with two, in a
//! `board`, `string` or `algebraic` solution) is a [`ParseError`].
//!
//! Reading is linear in the length of the text, so a `vector` of a million
//! columns reads in milliseconds. `board` and `string` are quadratic in N by
//! nature (they draw every square) and are meant for small boards.

use std::fmt;
use std::str::FromStr;

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
        Format::Vector => write_list(out, "[", " ", "]\n", rows),
        Format::Json => {
            write!(out, "{{\"n\":{n},\"rows\":")?;
            write_list(out, "[", ",", "]}\n", rows)
        }
        Format::Digits => {
            for r in rows {
                // r < n ≤ 9, so r + 1 is a single digit 1..=9.
                out.write_char(char::from(b'1' + r as u8))?;
            }
            out.write_char('\n')
        }
        Format::Algebraic => {
            for (col, row) in rows.enumerate() {
                if col > 0 {
                    out.write_char(' ')?;
                }
                write_square(out, col as u64, row)?;
            }
            out.write_char('\n')
        }
        Format::Board => write_diagram(out, rows, ['Q', '.'], true),
        Format::String => {
            write_diagram(out, rows, ['*', '-'], false)?;
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

fn write_list<W: fmt::Write + ?Sized>(
    out: &mut W,
    open: &str,
    sep: &str,
    close: &str,
    items: impl Iterator<Item = u64>,
) -> fmt::Result {
    out.write_str(open)?;
    for (i, x) in items.enumerate() {
        if i > 0 {
            out.write_str(sep)?;
        }
        write!(out, "{x}")?;
    }
    out.write_str(close)
}

/// Draws the board top rank first. `marks` is `[queen, empty]`; `newlines`
/// ends every rank with a line break (the `board` notation) or not (`string`).
fn write_diagram<W: fmt::Write + ?Sized>(
    out: &mut W,
    rows: impl ExactSizeIterator<Item = u64> + Clone,
    [queen, empty]: [char; 2],
    newlines: bool,
) -> fmt::Result {
    let n = rows.len() as u64;
    for rank in (0..n).rev() {
        // Quadratic, like the output itself: every square is one character.
        for r in rows.clone() {
            out.write_char(if r == rank { queen } else { empty })?;
        }
        if newlines {
            out.write_char('\n')?;
        }
    }
    Ok(())
}

/// Writes the name of file `col`: `a` … `z`, `aa` … `zz`, `aaa`, … (bijective
/// base 26, like spreadsheet columns).
pub fn write_file<W: fmt::Write + ?Sized>(out: &mut W, col: u64) -> fmt::Result {
    // 26^14 > 2^64, so 14 letters name every u64 column.
    let mut letters = [0u8; 14];
    let mut len = 0;
    // Bijective base 26 has digits 1..=26 instead of 0..=25: each step takes
    // one off before the division, which is why `x` runs one above `col`.
    let mut x = u128::from(col) + 1;
    while x > 0 {
        x -= 1;
        letters[len] = b'a' + (x % 26) as u8;
        len += 1;
        x /= 26;
    }
    for &l in letters[..len].iter().rev() {
        out.write_char(char::from(l))?;
    }
    Ok(())
}

/// The name of file `col`, as [`write_file`] writes it.
pub fn file_name(col: u64) -> String {
    let mut s = String::new();
    write_file(&mut s, col).expect("a String accepts every write");
    s
}

/// Writes the algebraic name of the square `(col, row)`: file and 1-based rank,
/// e.g. `(0, 0)` is `a1` and `(27, 9)` is `ab10`.
pub fn write_square<W: fmt::Write + ?Sized>(
    out: &mut W,
    col: u64,
    row: u64,
) -> fmt::Result {
    write_file(out, col)?;
    write!(out, "{}", u128::from(row) + 1)
}

/// The algebraic name of the square `(col, row)`, as [`write_square`] writes it.
pub fn square_name(col: u64, row: u64) -> String {
    let mut s = String::new();
    write_square(&mut s, col, row).expect("a String accepts every write");
    s
}

/// The column of a file name (`a` is 0, `aa` is 26), or `None` when the text is
/// not a run of lowercase letters or names a column beyond `u64`.
pub fn parse_file(letters: &str) -> Option<u64> {
    if letters.is_empty() {
        return None;
    }
    // u128, because the name of column u64::MAX is worth u64::MAX + 1 before
    // the final subtraction.
    let mut x: u128 = 0;
    for b in letters.bytes() {
        if !b.is_ascii_lowercase() {
            return None;
        }
        // The inverse of `write_file`: digits are 1..=26 (a = 1).
        x = x.checked_mul(26)?.checked_add(u128::from(b - b'a') + 1)?;
        if x > u128::from(u64::MAX) + 1 {
            return None;
        }
    }
    u64::try_from(x - 1).ok()
}

/// One solution read by [`parse`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The 1-based line where it starts.
    pub line: usize,
    /// The notation it was written in.
    pub format: Format,
    /// The board size it claims: the number of columns, or the `n` of a `json`
    /// object, which may disagree with `rows.len()` ([`crate::verify`] reports
    /// that).
    pub n: u64,
    /// `rows[col]`. Rows are not checked against `n`; that too is the
    /// verifier's job.
    pub rows: Vec<u32>,
}

/// A solution that could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    line: usize,
    format: Option<Format>,
    kind: ParseErrorKind,
}

/// Why a solution could not be read.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParseErrorKind {
    /// The line starts with a character that begins no notation.
    Unrecognized {
        /// The first character of the line.
        found: char,
    },
    /// The line looks like DIMACS (a SAT solver's model or a CNF), which is not
    /// a notation: read models with [`crate::verify::read_model`].
    LooksLikeDimacs,
    /// The solution has no columns (`[]`, `{"rows":[]}`).
    Empty,
    /// A character that does not belong to the notation.
    UnexpectedChar {
        /// The character.
        found: char,
        /// Its 1-based position in the line, in characters.
        position: usize,
    },
    /// The text ends, or a line ends, where more was expected.
    Missing {
        /// What was expected, e.g. `` `]` ``.
        expected: &'static str,
    },
    /// Text after the end of the solution on the same line.
    Trailing {
        /// Its 1-based position in the line, in characters.
        position: usize,
    },
    /// A row that is not a whole number from 0 to 4294967295.
    BadRow {
        /// The text of the row (shortened when long).
        token: String,
    },
    /// A `0` in `digits`, whose rows are 1-based.
    ZeroDigit {
        /// Its 1-based position in the line.
        position: usize,
    },
    /// More than [`DIGITS_MAX_N`] digits.
    TooManyDigits {
        /// The number of digits found.
        found: usize,
    },
    /// A token of `algebraic` that is not a square like `c5`.
    BadSquare {
        /// The token (shortened when long).
        token: String,
    },
    /// An algebraic square whose file is not on the board (N is the number of
    /// squares).
    FileOffBoard {
        /// The square.
        square: String,
        /// The board size.
        n: u64,
    },
    /// Two queens in one file, which `rows[col]` cannot hold.
    FileTwice {
        /// The square of the first queen.
        first: String,
        /// The square of the second queen.
        second: String,
    },
    /// A file of a diagram with no queen, which `rows[col]` cannot hold.
    FileEmpty {
        /// The file's name.
        file: String,
    },
    /// A diagram line of the wrong width: a diagram is N lines of N squares.
    Shape {
        /// Squares on the line.
        width: usize,
        /// Lines in the diagram.
        lines: usize,
    },
    /// A `string` whose length is not a square number.
    NotSquare {
        /// Its length in characters.
        len: usize,
    },
    /// A JSON key other than `n` and `rows`, or one given twice.
    JsonKey {
        /// The key.
        key: String,
        /// True when the key was given twice, false when it is unknown.
        duplicate: bool,
    },
}

impl ParseError {
    fn new(line: usize, format: Option<Format>, kind: ParseErrorKind) -> ParseError {
        ParseError { line, format, kind }
    }

    /// The 1-based line of the problem.
    pub fn line(&self) -> usize {
        self.line
    }

    /// The notation the text was read as, if the reader got that far.
    pub fn format(&self) -> Option<Format> {
        self.format
    }

    /// What went wrong.
    pub fn kind(&self) -> &ParseErrorKind {
        &self.kind
    }

    /// The message without the leading `line L: `, for callers that print the
    /// line their own way.
    pub fn problem(&self) -> impl fmt::Display + '_ {
        Problem(self)
    }
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.problem())
    }
}

/// The display of [`ParseError::problem`].
struct Problem<'a>(&'a ParseError);

impl fmt::Display for Problem<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ParseError { format, kind, .. } = self.0;
        if let Some(format) = format {
            write!(f, "{format}: ")?;
        }
        match kind {
            ParseErrorKind::Unrecognized { found } => {
                write!(f, "`{found}` starts no known notation; expected one of:")?;
                for format in Format::ALL {
                    write!(f, "\n  {format}: {}", format.form())?;
                }
                return Ok(());
            }
            ParseErrorKind::LooksLikeDimacs => {
                return write!(
                    f,
                    "this looks like DIMACS (a SAT solver's model or a CNF), not a \
                     solution notation; a model must be read with its board size"
                );
            }
            ParseErrorKind::Empty => write!(f, "no columns"),
            ParseErrorKind::UnexpectedChar { found, position } => {
                write!(f, "unexpected `{found}` at character {position}")
            }
            ParseErrorKind::Missing { expected } => write!(f, "missing {expected}"),
            ParseErrorKind::Trailing { position } => {
                write!(
                    f,
                    "unexpected text after the solution at character {position}"
                )
            }
            ParseErrorKind::BadRow { token } => write!(
                f,
                "`{token}` is not a row: rows are whole numbers from 0 to {}",
                u32::MAX
            ),
            ParseErrorKind::ZeroDigit { position } => write!(
                f,
                "digit {position} is 0, but digits are 1-based rows from 1 to \
                 {DIGITS_MAX_N}"
            ),
            ParseErrorKind::TooManyDigits { found } => write!(
                f,
                "{found} digits, but digits hold at most {DIGITS_MAX_N} columns \
                 (N ≤ {DIGITS_MAX_N}); write larger boards as a vector"
            ),
            ParseErrorKind::BadSquare { token } => write!(
                f,
                "`{token}` is not a square: a square is a file (lowercase letters) and \
                 a rank from 1, like `c5` or `ab12`"
            ),
            ParseErrorKind::FileOffBoard { square, n } => write!(
                f,
                "square {square} is off the board: {n} squares make a board of side \
                 {n}, files a to {}",
                file_name(n - 1)
            ),
            ParseErrorKind::FileTwice { first, second } => {
                write!(f, "two queens in one file, on {first} and {second}")
            }
            ParseErrorKind::FileEmpty { file } => write!(f, "file {file} has no queen"),
            ParseErrorKind::Shape { width, lines } => write!(
                f,
                "a line of {width} squares in a diagram of {lines} lines; a diagram is \
                 N lines of N squares"
            ),
            ParseErrorKind::NotSquare { len } => {
                write!(f, "{len} squares is not N² for any N")
            }
            ParseErrorKind::JsonKey { key, duplicate } => {
                if *duplicate {
                    write!(f, "key \"{key}\" is given twice")
                } else {
                    write!(f, "unknown key \"{key}\": the keys are \"n\" and \"rows\"")
                }
            }
        }?;
        if let Some(format) = format {
            write!(f, "; expected {}", format.form())?;
        }
        Ok(())
    }
}

impl std::error::Error for ParseError {}

/// Reads every solution in `text`, each in any notation (see the
/// [module docs](self)). Yields solutions and errors in the order of the text;
/// after an error, reading resumes on the next line (or after the diagram).
pub fn parse(text: &str) -> Entries<'_> {
    Entries {
        lines: text.lines().enumerate().peekable(),
    }
}

/// The iterator of [`parse`].
#[derive(Debug)]
pub struct Entries<'a> {
    /// `(0-based index, line)`, peekable so that a diagram can stop before the
    /// first line that is not part of it.
    lines: std::iter::Peekable<std::iter::Enumerate<std::str::Lines<'a>>>,
}

impl Iterator for Entries<'_> {
    type Item = Result<Entry, ParseError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let (index, raw) = self.lines.next()?;
            let text = raw.trim();
            let line = index + 1;
            let Some(first) = text.chars().next() else {
                continue;
            };
            // Every notation but `json` implies N by its number of columns.
            let implied = |rows: Vec<u32>| (None, rows);
            let (format, result) = match first {
                '#' => continue,
                'Q' | '.' => return Some(self.diagram(line, text)),
                '[' => (Format::Vector, parse_vector(text).map(implied)),
                '{' => (Format::Json, parse_json(text)),
                _ if looks_like_dimacs(text) => {
                    let kind = ParseErrorKind::LooksLikeDimacs;
                    return Some(Err(ParseError::new(line, None, kind)));
                }
                '0'..='9' => (Format::Digits, parse_digits(text).map(implied)),
                'a'..='z' => (Format::Algebraic, parse_algebraic(text).map(implied)),
                '*' | '-' => {
                    let rows = parse_marks(text, ['*', '-']).map_err(|(_, kind)| kind);
                    (Format::String, rows.map(implied))
                }
                found => {
                    let kind = ParseErrorKind::Unrecognized { found };
                    return Some(Err(ParseError::new(line, None, kind)));
                }
            };
            return Some(
                result
                    .map(|(n, rows)| Entry {
                        line,
                        format,
                        n: n.unwrap_or(rows.len() as u64),
                        rows,
                    })
                    .map_err(|kind| ParseError::new(line, Some(format), kind)),
            );
        }
    }
}

impl Entries<'_> {
    /// Reads a diagram whose first line (`first`, line number `line`) has been
    /// taken: it runs on while lines start with `Q` or `.`.
    fn diagram(&mut self, line: usize, first: &str) -> Result<Entry, ParseError> {
        let mut ranks = vec![first];
        while let Some(&(_, next)) = self.lines.peek() {
            let next = next.trim();
            if !next.starts_with(['Q', '.']) {
                break;
            }
            ranks.push(next);
            self.lines.next();
        }
        let err = |offset: usize, kind| {
            ParseError::new(line + offset, Some(Format::Board), kind)
        };
        let n = ranks.len();
        let mut text = String::with_capacity(n * n);
        for (offset, rank) in ranks.iter().enumerate() {
            let width = rank.chars().count();
            if width != n {
                return Err(err(offset, ParseErrorKind::Shape { width, lines: n }));
            }
            text.push_str(rank);
        }
        // The joined ranks are exactly a `string` with other marks, so one
        // reader serves both; its error offset is a character index, and
        // index / n is the rank's line within the diagram.
        let rows = parse_marks(&text, ['Q', '.']).map_err(|(at, kind)| {
            let kind = match kind {
                ParseErrorKind::UnexpectedChar { found, position } => {
                    ParseErrorKind::UnexpectedChar {
                        found,
                        position: (position - 1) % n + 1,
                    }
                }
                other => other,
            };
            err(at / n, kind)
        })?;
        Ok(Entry {
            line,
            format: Format::Board,
            n: n as u64,
            rows,
        })
    }
}

/// True for lines that a SAT solver writes (`s SATISFIABLE`, `v 1 -2 … 0`,
/// `SAT`, `UNSAT`), that a CNF holds (`p cnf …`, `c …`), or that are bare
/// literal lists (`-1 2 0`, `1 -2 0`): none of them a notation. Checked before
/// `digits` and `string`, which a literal list would otherwise start.
fn looks_like_dimacs(text: &str) -> bool {
    let literal = |t: &str| {
        let digits = t.strip_prefix('-').unwrap_or(t);
        !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
    };
    let mut tokens = text.split_ascii_whitespace();
    let first = tokens.next().unwrap_or("");
    matches!(first, "v" | "s" | "c" | "p" | "SAT" | "UNSAT")
        || (literal(first)
            && (first.starts_with('-') || tokens.clone().next().is_some())
            && tokens.all(literal))
}

/// Parses a row: ASCII digits only (no sign), fitting a `u32`.
fn parse_row(token: &str) -> Result<u32, ParseErrorKind> {
    // `u32::from_str` also takes a leading `+`. No notation writes one, and
    // accepting it would give one solution two spellings in the same notation.
    if !token.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ParseErrorKind::BadRow {
            token: shorten(token),
        });
    }
    token.parse().map_err(|_| ParseErrorKind::BadRow {
        token: shorten(token),
    })
}

/// A token for an error message, cut to a readable length.
fn shorten(token: &str) -> String {
    const MAX: usize = 24;
    match token.char_indices().nth(MAX) {
        Some((i, _)) => format!("{}…", &token[..i]),
        None => token.to_string(),
    }
}

/// 1-based character position of byte offset `at` in `text`.
fn position(text: &str, at: usize) -> usize {
    text[..at].chars().count() + 1
}

/// `[r0 r1 …]`, spaces or commas between rows.
fn parse_vector(text: &str) -> Result<Vec<u32>, ParseErrorKind> {
    let body = &text[1..]; // after the `[` the caller matched
    // Rows never contain `]`, so the first one ends the vector, and anything
    // after it is an error: one solution per line, never two.
    let Some(end) = body.find(']') else {
        return Err(ParseErrorKind::Missing {
            expected: "the closing `]`",
        });
    };
    if end + 1 < body.len() {
        return Err(ParseErrorKind::Trailing {
            position: position(text, end + 2),
        });
    }
    let rows = body[..end]
        .split(|c: char| c.is_ascii_whitespace() || c == ',')
        .filter(|t| !t.is_empty())
        .map(parse_row)
        .collect::<Result<Vec<u32>, _>>()?;
    if rows.is_empty() {
        return Err(ParseErrorKind::Empty);
    }
    Ok(rows)
}

/// `2413`: 1-based rows, one digit each.
fn parse_digits(text: &str) -> Result<Vec<u32>, ParseErrorKind> {
    let mut rows = Vec::with_capacity(text.len().min(DIGITS_MAX_N as usize));
    for (i, c) in text.chars().enumerate() {
        match c {
            '1'..='9' => rows.push(u32::from(c) - u32::from('1')),
            '0' => return Err(ParseErrorKind::ZeroDigit { position: i + 1 }),
            found => {
                return Err(ParseErrorKind::UnexpectedChar {
                    found,
                    position: i + 1,
                });
            }
        }
    }
    // The length is judged after the characters, so that a stray character
    // in a long line is reported where it stands.
    if rows.len() as u64 > DIGITS_MAX_N {
        return Err(ParseErrorKind::TooManyDigits { found: rows.len() });
    }
    Ok(rows)
}

/// `a2 b4 c1 d3`, in any order; N is the number of squares.
fn parse_algebraic(text: &str) -> Result<Vec<u32>, ParseErrorKind> {
    let squares = text
        .split(|c: char| c.is_ascii_whitespace() || c == ',')
        .filter(|t| !t.is_empty())
        .map(|token| {
            let bad = || ParseErrorKind::BadSquare {
                token: shorten(token),
            };
            let split = token
                .find(|c: char| !c.is_ascii_lowercase())
                .ok_or_else(bad)?;
            let (file, rank) = token.split_at(split);
            let col = parse_file(file).ok_or_else(bad)?;
            let rank: u64 = match parse_row(rank) {
                Ok(r) if r > 0 => u64::from(r),
                _ => return Err(bad()),
            };
            Ok((col, rank - 1))
        })
        .collect::<Result<Vec<(u64, u64)>, _>>()?;
    // The notation does not state N, but a solution has one queen per file, so
    // the number of squares is N, and a file at or beyond it is off the board.
    let n = squares.len() as u64;
    // `None` marks a file not seen yet; a second queen in a file is an error
    // because `rows[col]` has room for one.
    let mut rows: Vec<Option<u32>> = vec![None; squares.len()];
    for &(col, row) in &squares {
        let row32 = u32::try_from(row).expect("parse_row gives a u32, and rank ≥ 1");
        let slot = usize::try_from(col)
            .ok()
            .and_then(|c| rows.get_mut(c))
            .ok_or_else(|| ParseErrorKind::FileOffBoard {
                square: square_name(col, row),
                n,
            })?;
        if let Some(first) = *slot {
            return Err(ParseErrorKind::FileTwice {
                first: square_name(col, first.into()),
                second: square_name(col, row),
            });
        }
        *slot = Some(row32);
    }
    // N squares in N distinct files below N fill every file.
    Ok(rows
        .into_iter()
        .map(|r| r.expect("every file is filled"))
        .collect())
}

/// The squares of a diagram, top rank first, without line breaks: `marks` is
/// `[queen, empty]`. Serves `string` and, through [`Entries::diagram`],
/// `board`. On error also returns the 0-based character index at fault.
fn parse_marks(
    text: &str,
    [queen, empty]: [char; 2],
) -> Result<Vec<u32>, (usize, ParseErrorKind)> {
    let len = text.chars().count();
    let n = len.isqrt();
    if n * n != len {
        return Err((0, ParseErrorKind::NotSquare { len }));
    }
    let mut rows: Vec<Option<u32>> = vec![None; n];
    for (i, c) in text.chars().enumerate() {
        let col = i % n;
        // Character i is on display line i / n, and the top line is row n - 1.
        let row = (n - 1 - i / n) as u64;
        if c == empty {
            continue;
        }
        if c != queen {
            return Err((
                i,
                ParseErrorKind::UnexpectedChar {
                    found: c,
                    position: i + 1,
                },
            ));
        }
        if let Some(higher) = rows[col] {
            // Lines go down the board, so the queen seen first is the higher
            // one; name the lower one first, in rank order.
            return Err((
                i,
                ParseErrorKind::FileTwice {
                    first: square_name(col as u64, row),
                    second: square_name(col as u64, higher.into()),
                },
            ));
        }
        // n² characters fit in memory, so n < 2³² and every row fits a u32.
        rows[col] = Some(u32::try_from(row).expect("n < 2^32"));
    }
    rows.into_iter()
        .enumerate()
        .map(|(col, r)| {
            // Point at the bottom line, where the file's column ends.
            r.ok_or_else(|| {
                let file = file_name(col as u64);
                (len - n + col, ParseErrorKind::FileEmpty { file })
            })
        })
        .collect()
}

/// `{"n":4,"rows":[1,3,0,2]}` with free spacing and either key order; returns
/// `n` if given and the rows.
fn parse_json(text: &str) -> Result<(Option<u64>, Vec<u32>), ParseErrorKind> {
    // Hand-written, not serde_json: nq-core depends on std only, and the
    // notation is one fixed object. Unknown keys are refused rather than
    // skipped, so that, say, the output of `nq count --json` fed to a verifier
    // by mistake is named for what it is instead of misread.
    let mut c = Cursor { text, at: 0 };
    c.expect(b'{', "`{`")?;
    let mut n = None;
    let mut rows = None;
    if !c.eat(b'}') {
        loop {
            let key = c.string()?;
            c.expect(b':', "`:` after the key")?;
            let duplicate = match key {
                "n" => n.replace(c.number()?).is_some(),
                "rows" => rows.replace(c.array()?).is_some(),
                _ => {
                    return Err(ParseErrorKind::JsonKey {
                        key: shorten(key),
                        duplicate: false,
                    });
                }
            };
            if duplicate {
                return Err(ParseErrorKind::JsonKey {
                    key: key.to_string(),
                    duplicate: true,
                });
            }
            if c.eat(b'}') {
                break;
            }
            c.expect(b',', "`,` or `}`")?;
        }
    }
    c.skip_ws();
    if c.at < text.len() {
        return Err(ParseErrorKind::Trailing {
            position: position(text, c.at),
        });
    }
    let rows = rows.ok_or(ParseErrorKind::Missing {
        expected: "the key \"rows\"",
    })?;
    if rows.is_empty() {
        return Err(ParseErrorKind::Empty);
    }
    Ok((n, rows))
}

/// A position in a one-line JSON text. Only what the `json` notation needs:
/// objects with string keys, unsigned integers and arrays of them.
struct Cursor<'a> {
    text: &'a str,
    /// Byte offset; always on a character boundary, because the cursor only
    /// steps over ASCII bytes and whole strings.
    at: usize,
}

impl<'a> Cursor<'a> {
    fn skip_ws(&mut self) {
        let rest = &self.text.as_bytes()[self.at..];
        self.at += rest.iter().take_while(|b| b.is_ascii_whitespace()).count();
    }

    /// Skips spaces and takes `b` if it comes next.
    fn eat(&mut self, b: u8) -> bool {
        self.skip_ws();
        if self.text.as_bytes().get(self.at) == Some(&b) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    /// Like [`Cursor::eat`], but anything else is an error naming `what`.
    fn expect(&mut self, b: u8, what: &'static str) -> Result<(), ParseErrorKind> {
        if self.eat(b) {
            return Ok(());
        }
        Err(match self.text[self.at..].chars().next() {
            None => ParseErrorKind::Missing { expected: what },
            Some(found) => ParseErrorKind::UnexpectedChar {
                found,
                position: position(self.text, self.at),
            },
        })
    }

    /// A key. Escapes are not decoded: no key of the notation needs one, so a
    /// key with a backslash is simply unknown.
    fn string(&mut self) -> Result<&'a str, ParseErrorKind> {
        self.expect(b'"', "a key in double quotes")?;
        let rest = &self.text[self.at..];
        let end = rest.find('"').ok_or(ParseErrorKind::Missing {
            expected: "the closing `\"` of the key",
        })?;
        self.at += end + 1;
        Ok(&rest[..end])
    }

    /// The text of an unsigned integer, which ends at a space, `,`, `]` or `}`.
    fn token(&mut self) -> &'a str {
        self.skip_ws();
        let rest = &self.text[self.at..];
        let len = rest
            .find(|c: char| c.is_ascii_whitespace() || matches!(c, ',' | ']' | '}'))
            .unwrap_or(rest.len());
        self.at += len;
        &rest[..len]
    }

    fn number(&mut self) -> Result<u64, ParseErrorKind> {
        // JSON numbers may be negative or fractional; no board size or row
        // is, so only plain digits are accepted.
        let token = self.token();
        if token.is_empty() {
            return Err(ParseErrorKind::Missing {
                expected: "a number",
            });
        }
        match token.bytes().all(|b| b.is_ascii_digit()) {
            true => token.parse().ok(),
            false => None,
        }
        .ok_or(ParseErrorKind::BadRow {
            token: shorten(token),
        })
    }

    fn array(&mut self) -> Result<Vec<u32>, ParseErrorKind> {
        self.expect(b'[', "`[` to open \"rows\"")?;
        let mut rows = vec![];
        if self.eat(b']') {
            return Ok(rows);
        }
        loop {
            let token = self.token();
            if token.is_empty() {
                return Err(ParseErrorKind::Missing { expected: "a row" });
            }
            rows.push(parse_row(token)?);
            if self.eat(b']') {
                return Ok(rows);
            }
            self.expect(b',', "`,` or `]` in \"rows\"")?;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::ops::ControlFlow;

    use super::*;
    use crate::board::{Board, Prefix};
    use crate::search;

    const FOUR: [u32; 4] = [1, 3, 0, 2];

    fn only(text: &str) -> Entry {
        let mut all: Vec<_> = parse(text).collect();
        assert_eq!(all.len(), 1, "{text:?} → {all:?}");
        all.remove(0).unwrap_or_else(|e| panic!("{text:?}: {e}"))
    }

    fn error(text: &str) -> ParseError {
        let mut all: Vec<_> = parse(text).collect();
        assert_eq!(all.len(), 1, "{text:?} → {all:?}");
        all.remove(0).expect_err(text)
    }

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
    fn board_is_drawn_top_rank_first() {
        // N = 1 and a queen in the corner a1, which must be bottom-left.
        assert_eq!(to_string(Format::Board, &[0u8]).unwrap(), "Q\n");
        let b = to_string(Format::Board, &[0u8, 4, 7, 5, 2, 6, 1, 3]).unwrap();
        let lines: Vec<&str> = b.lines().collect();
        assert_eq!(lines[7], "Q.......", "a1 is bottom-left");
        assert_eq!(lines[0], "..Q.....", "c8 is on the top line");
    }

    #[test]
    fn file_names_are_bijective_base_26() {
        let name = |c| {
            let mut s = String::new();
            write_file(&mut s, c).unwrap();
            s
        };
        for (col, want) in [(0, "a"), (25, "z"), (26, "aa"), (27, "ab"), (51, "az")] {
            assert_eq!(name(col), want);
        }
        assert_eq!(name(52), "ba");
        assert_eq!(name(701), "zz");
        assert_eq!(name(702), "aaa");
        assert_eq!(name(999_999), "bdwgn");
        for col in (0..20_000).chain([u64::MAX - 1, u64::MAX]) {
            assert_eq!(parse_file(&name(col)), Some(col), "{col}");
        }
        assert_eq!(parse_file(""), None);
        assert_eq!(parse_file("aB"), None);
        assert_eq!(parse_file("zzzzzzzzzzzzzzz"), None, "beyond u64");
        assert_eq!(square_name(27, 9), "ab10");
    }

    #[test]
    fn every_solution_round_trips_in_every_format() {
        for n in 1..=8u64 {
            let board = Board::new(n).unwrap();
            let mut solutions: Vec<Vec<u8>> = vec![];
            search::search(&Prefix::empty(board), &mut |rows: &[u8]| {
                solutions.push(rows.to_vec());
                ControlFlow::Continue(())
            });
            for format in Format::ALL {
                // One text holding every solution, as `nq solutions` writes it.
                let mut text = String::new();
                for (i, rows) in solutions.iter().enumerate() {
                    if i > 0 {
                        text.push_str(format.separator());
                    }
                    write_solution(&mut text, format, rows).unwrap();
                }
                let back: Vec<Entry> = parse(&text)
                    .collect::<Result<_, _>>()
                    .unwrap_or_else(|e| panic!("n={n} {format}: {e}\n{text}"));
                assert_eq!(back.len(), solutions.len(), "n={n} {format}");
                for (entry, rows) in back.iter().zip(&solutions) {
                    assert_eq!(entry.format, format);
                    assert_eq!(entry.n, n);
                    let want: Vec<u32> = rows.iter().map(|&r| r.into()).collect();
                    assert_eq!(entry.rows, want, "n={n} {format}");
                }
            }
        }
    }

    #[test]
    fn formats_mix_in_one_text_and_lines_are_counted() {
        let text = "# a comment\n\n[1 3 0 2]\n2413\n\n.Q..\n...Q\nQ...\n..Q.\n\
                    a2 b4 c1 d3\n-*-----**-----*-\n  {\"rows\": [1, 3, 0, 2], \"n\": 4}  \n";
        let entries: Vec<Entry> = parse(text).collect::<Result<_, _>>().unwrap();
        let got: Vec<(usize, Format)> =
            entries.iter().map(|e| (e.line, e.format)).collect();
        assert_eq!(
            got,
            [
                (3, Format::Vector),
                (4, Format::Digits),
                (6, Format::Board),
                (10, Format::Algebraic),
                (11, Format::String),
                (12, Format::Json),
            ]
        );
        assert!(entries.iter().all(|e| e.rows == FOUR && e.n == 4));
    }

    #[test]
    fn the_reader_is_liberal_where_documented() {
        assert_eq!(only("[1,3, 0 ,2]").rows, FOUR);
        assert_eq!(only("[ 1 3 0 2 ]").rows, FOUR);
        assert_eq!(only("d3 a2 c1 b4").rows, FOUR, "any order");
        assert_eq!(only("a2,b4,c1,d3").rows, FOUR);
        let j = only("{\"rows\":[1,3,0,2]}");
        assert_eq!(
            (j.n, j.rows),
            (4, FOUR.to_vec()),
            "n defaults to the length"
        );
        // The reader keeps what the verifier must judge.
        let j = only("{\"n\":5,\"rows\":[1,3,0,2]}");
        assert_eq!(j.n, 5);
        assert_eq!(only("[0 0 9]").rows, [0, 0, 9]);
        assert_eq!(only("a9 b1").rows, [8, 0]);
        assert_eq!(only("\r\n[0]\r\n").rows, [0]);
    }

    #[test]
    fn errors_name_the_line_and_the_expected_form() {
        let e = error("\n\n[1 3 0 2");
        assert_eq!((e.line(), e.format()), (3, Some(Format::Vector)));
        let msg = e.to_string();
        assert!(
            msg.starts_with("line 3: vector: missing the closing `]`"),
            "{msg}"
        );
        assert!(msg.contains("[1 3 0 2]"), "{msg}");

        let cases: &[(&str, &str)] = &[
            ("[1 -3 0]", "`-3` is not a row"),
            ("[1 3] x", "after the solution"),
            ("[]", "no columns"),
            ("[99999999999]", "0 to 4294967295"),
            ("2403", "digit 3 is 0"),
            ("1234567891", "at most 9 columns"),
            ("24a3", "unexpected `a` at character 3"),
            ("a2 b4 zz", "`zz` is not a square"),
            ("a0", "`a0` is not a square"),
            ("a2 e1", "square e1 is off the board"),
            ("a2 a4", "two queens in one file, on a2 and a4"),
            ("-*-", "3 squares is not N²"),
            ("-*--", "file a has no queen"),
            ("*-*-", "two queens in one file, on a1 and a2"),
            ("{\"n\":4}", "missing the key \"rows\""),
            ("{\"rows\":[1],\"x\":2}", "unknown key \"x\""),
            ("{\"rows\":[1],\"rows\":[1]}", "given twice"),
            ("{\"rows\":[1,]}", "missing a row"),
            ("{\"rows\":[1.5]}", "`1.5` is not a row"),
            ("{\"rows\":[1] x", "unexpected `x`"),
            ("{\"rows\":[1]", "missing `,` or `}`"),
        ];
        for (text, want) in cases {
            let msg = error(text).to_string();
            assert!(msg.contains(want), "{text:?}: {msg}");
            assert!(msg.contains("expected"), "{text:?} names the form: {msg}");
        }
        let msg = error("Z").to_string();
        for format in Format::ALL {
            assert!(msg.contains(format.form()), "{msg}");
        }
        for dimacs in [
            "s SATISFIABLE",
            "v 1 -2 0",
            "SAT",
            "-1 2 0",
            "1 -2 0",
            "p cnf 4 4",
        ] {
            assert_eq!(error(dimacs).kind(), &ParseErrorKind::LooksLikeDimacs);
        }
    }

    #[test]
    fn diagram_errors_point_at_their_line() {
        let e = error("\n.Q..\n...\nQ...\n..Q.\n");
        assert_eq!(e.line(), 3);
        assert!(matches!(
            e.kind(),
            ParseErrorKind::Shape { width: 3, lines: 4 }
        ));
        let e = error(".Q..\n...Q\nQ.x.\n..Q.\n");
        assert_eq!(e.line(), 3);
        assert_eq!(
            e.kind(),
            &ParseErrorKind::UnexpectedChar {
                found: 'x',
                position: 3
            }
        );
        let e = error(".Q..\n...Q\nQ..Q\n....\n");
        assert_eq!(e.line(), 3, "{e}");
        assert!(e.to_string().contains("on d2 and d3"), "{e}");
        let e = error(".Q..\n...Q\nQ...\n....\n");
        assert!(e.to_string().contains("file c has no queen"), "{e}");
    }

    #[test]
    fn reading_goes_on_after_an_error() {
        let results: Vec<_> = parse("[1 3 0 2]\n[1 x]\n.Q..\n...\n\n2413\n").collect();
        let ok: Vec<bool> = results.iter().map(Result::is_ok).collect();
        assert_eq!(ok, [true, false, false, true]);
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

    #[test]
    fn a_million_columns_read_and_write_in_linear_time() {
        // A permutation (valid or not is irrelevant here) of a million rows.
        let n = 1_000_000u32;
        let rows: Vec<u32> = (0..n).map(|c| (c * 7 + 3) % n).collect();
        for format in [Format::Vector, Format::Json, Format::Algebraic] {
            let text = to_string(format, &rows).unwrap();
            let entry = only(&text);
            assert_eq!(entry.rows, rows, "{format}");
        }
    }
}
