//! The `vector` notation, `[1 3 0 2]`: the 0-based row of each column. Its
//! list writer also serves the `rows` of `json`.

use std::fmt;

use super::ParseErrorKind;
use super::read::{parse_row, position};

/// Writes `items` between `open` and `close`, separated by `sep`.
pub(super) fn write_list<W: fmt::Write + ?Sized>(
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

/// `[r0 r1 …]`, spaces or commas between rows.
pub(super) fn parse_vector(text: &str) -> Result<Vec<u32>, ParseErrorKind> {
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
