//! The `digits` notation, `2413`: the 1-based row of each column, one digit
//! each, for N ≤ 9.

use std::fmt;

use super::{DIGITS_MAX_N, ParseErrorKind};

/// Writes `rows` as digits; the caller has checked that N ≤ 9.
pub(super) fn write<W: fmt::Write + ?Sized>(
    out: &mut W,
    rows: impl Iterator<Item = u64>,
) -> fmt::Result {
    for r in rows {
        // r < n ≤ 9, so r + 1 is a single digit 1..=9.
        out.write_char(char::from(b'1' + r as u8))?;
    }
    out.write_char('\n')
}

/// `2413`: 1-based rows, one digit each.
pub(super) fn parse_digits(text: &str) -> Result<Vec<u32>, ParseErrorKind> {
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
