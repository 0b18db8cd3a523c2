//! The diagram notations: `board`, one rank per line, and `string`, the same
//! squares without the line breaks.

use std::fmt;

use super::Format;
use super::algebraic::{file_name, square_name};
use super::read::{Entries, Entry, ParseError, ParseErrorKind};

/// Draws the board top rank first. `marks` is `[queen, empty]`; `newlines`
/// ends every rank with a line break (the `board` notation) or not (`string`).
pub(super) fn write_diagram<W: fmt::Write + ?Sized>(
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

impl Entries<'_> {
    /// Reads a diagram whose first line (`first`, line number `line`) has been
    /// taken: it runs on while lines start with `Q` or `.`.
    pub(super) fn diagram(
        &mut self,
        line: usize,
        first: &str,
    ) -> Result<Entry, ParseError> {
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

/// The squares of a diagram, top rank first, without line breaks: `marks` is
/// `[queen, empty]`. Serves `string` and, through [`Entries::diagram`],
/// `board`. On error also returns the 0-based character index at fault.
pub(super) fn parse_marks(
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

#[cfg(test)]
mod tests {
    use super::super::{parse, to_string};
    use super::*;

    fn error(text: &str) -> ParseError {
        let mut all: Vec<_> = parse(text, super::super::read::no_json).collect();
        assert_eq!(all.len(), 1, "{text:?} → {all:?}");
        all.remove(0).expect_err(text)
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
}
