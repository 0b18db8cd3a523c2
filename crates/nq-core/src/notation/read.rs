//! Reading: recognising each solution's notation by its first character, and
//! what goes wrong.

use std::fmt;

use super::algebraic::parse_algebraic;
use super::diagram::parse_marks;
use super::digits::parse_digits;
use super::vector::parse_vector;
use super::{DIGITS_MAX_N, Format, file_name};

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
    /// Malformed JSON on a `json` line, as the caller's [`JsonReader`]
    /// describes it.
    JsonSyntax {
        /// What is wrong, e.g. `trailing comma`.
        problem: String,
        /// Its 1-based position in the line, in characters.
        position: usize,
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
    pub(super) fn new(
        line: usize,
        format: Option<Format>,
        kind: ParseErrorKind,
    ) -> ParseError {
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
            ParseErrorKind::JsonSyntax { problem, position } => {
                write!(f, "{problem} at character {position}")
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

/// Reads the object on one `json` line (trimmed, starting with `{`): the `n`
/// it gives, if any, and its rows.
///
/// nq-core depends on std only and reads no JSON itself, so the caller of
/// [`parse`] supplies this reader (the `nq` CLI's is built on serde_json). It
/// should accept what the [module docs](super) describe, and refuse, with a
/// [`ParseErrorKind`] that names the problem: unknown or repeated keys
/// ([`ParseErrorKind::JsonKey`]), a missing `rows`
/// ([`ParseErrorKind::Missing`]), empty `rows` ([`ParseErrorKind::Empty`]), a
/// row or `n` that is not a whole number in range
/// ([`ParseErrorKind::BadRow`]), text after the object
/// ([`ParseErrorKind::Trailing`]) and malformed JSON
/// ([`ParseErrorKind::JsonSyntax`]). [`parse`] adds the line and the
/// notation's form to the message.
pub type JsonReader = fn(&str) -> Result<(Option<u64>, Vec<u32>), ParseErrorKind>;

/// Reads every solution in `text`, each in any notation (see the
/// [module docs](super)), with `json` reading the `json` lines. Yields
/// solutions and errors in the order of the text; after an error, reading
/// resumes on the next line (or after the diagram).
pub fn parse(text: &str, json: JsonReader) -> Entries<'_> {
    Entries {
        lines: text.lines().enumerate().peekable(),
        json,
    }
}

/// The iterator of [`parse`].
#[derive(Debug)]
pub struct Entries<'a> {
    /// `(0-based index, line)`, peekable so that a diagram can stop before the
    /// first line that is not part of it.
    pub(super) lines: std::iter::Peekable<std::iter::Enumerate<std::str::Lines<'a>>>,
    /// The reader of `json` lines.
    json: JsonReader,
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
                '{' => (Format::Json, (self.json)(text)),
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
pub(super) fn parse_row(token: &str) -> Result<u32, ParseErrorKind> {
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
pub(super) fn shorten(token: &str) -> String {
    const MAX: usize = 24;
    match token.char_indices().nth(MAX) {
        Some((i, _)) => format!("{}…", &token[..i]),
        None => token.to_string(),
    }
}

/// 1-based character position of byte offset `at` in `text`.
pub(super) fn position(text: &str, at: usize) -> usize {
    text[..at].chars().count() + 1
}

/// The [`JsonReader`] of tests whose texts hold no `json` line.
#[cfg(test)]
pub(super) fn no_json(line: &str) -> Result<(Option<u64>, Vec<u32>), ParseErrorKind> {
    panic!("this test reads no json, but got {line:?}")
}

#[cfg(test)]
mod tests {
    use std::ops::ControlFlow;

    use super::super::{to_string, write_solution};
    use super::*;
    use crate::board::{Board, Prefix};
    use crate::search;

    const FOUR: [u32; 4] = [1, 3, 0, 2];

    fn only(text: &str) -> Entry {
        let mut all: Vec<_> = parse(text, no_json).collect();
        assert_eq!(all.len(), 1, "{text:?} → {all:?}");
        all.remove(0).unwrap_or_else(|e| panic!("{text:?}: {e}"))
    }

    fn error(text: &str) -> ParseError {
        let mut all: Vec<_> = parse(text, no_json).collect();
        assert_eq!(all.len(), 1, "{text:?} → {all:?}");
        all.remove(0).expect_err(text)
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
            // `json` is read by the caller's reader: the CLI's tests round-trip
            // it with the reader it passes.
            for format in Format::ALL.into_iter().filter(|&f| f != Format::Json) {
                // One text holding every solution, as `nq solutions` writes it.
                let mut text = String::new();
                for (i, rows) in solutions.iter().enumerate() {
                    if i > 0 {
                        text.push_str(format.separator());
                    }
                    write_solution(&mut text, format, rows).unwrap();
                }
                let back: Vec<Entry> = parse(&text, no_json)
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
                    a2 b4 c1 d3\n-*-----**-----*-\n";
        let entries: Vec<Entry> = parse(text, no_json).collect::<Result<_, _>>().unwrap();
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
        // The reader keeps what the verifier must judge.
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

    /// A `json` line goes to the caller's reader, whose answer gets the line,
    /// the notation, the default `n` and the notation's form in messages.
    #[test]
    fn json_lines_go_to_the_callers_reader() {
        fn reader(line: &str) -> Result<(Option<u64>, Vec<u32>), ParseErrorKind> {
            match line {
                "{\"rows\":[1,3,0,2]}" => Ok((None, FOUR.to_vec())),
                "{\"n\":5,\"rows\":[1,3,0,2]}" => Ok((Some(5), FOUR.to_vec())),
                _ => Err(ParseErrorKind::Missing {
                    expected: "the key \"rows\"",
                }),
            }
        }
        let text = "[0]\n  {\"rows\":[1,3,0,2]}  \n{\"n\":5,\"rows\":[1,3,0,2]}\n{}\n";
        let got: Vec<_> = parse(text, reader).collect();
        let ok: Vec<(usize, Format, u64)> = got
            .iter()
            .filter_map(|r| r.as_ref().ok())
            .map(|e| (e.line, e.format, e.n))
            .collect();
        assert_eq!(
            ok,
            [
                (1, Format::Vector, 1),
                (2, Format::Json, 4),
                (3, Format::Json, 5)
            ]
        );
        let e = got[3].as_ref().unwrap_err();
        assert_eq!((e.line(), e.format()), (4, Some(Format::Json)));
        let msg = e.to_string();
        assert!(msg.contains("missing the key \"rows\""), "{msg}");
        assert!(msg.contains(Format::Json.form()), "{msg}");
    }

    #[test]
    fn reading_goes_on_after_an_error() {
        let results: Vec<_> =
            parse("[1 3 0 2]\n[1 x]\n.Q..\n...\n\n2413\n", no_json).collect();
        let ok: Vec<bool> = results.iter().map(Result::is_ok).collect();
        assert_eq!(ok, [true, false, false, true]);
    }

    #[test]
    fn a_million_columns_read_and_write_in_linear_time() {
        // A permutation (valid or not is irrelevant here) of a million rows.
        let n = 1_000_000u32;
        let rows: Vec<u32> = (0..n).map(|c| (c * 7 + 3) % n).collect();
        for format in [Format::Vector, Format::Algebraic] {
            let text = to_string(format, &rows).unwrap();
            let entry = only(&text);
            assert_eq!(entry.rows, rows, "{format}");
        }
    }
}
