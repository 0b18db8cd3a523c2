//! The `algebraic` notation, `a2 b4 c1 d3`: the square of each queen, and the
//! names of files and squares that the verifier's messages use too.

use std::fmt;

use super::ParseErrorKind;
use super::read::{parse_row, shorten};

/// Writes `rows` as the squares of their queens, in file order.
pub(super) fn write<W: fmt::Write + ?Sized>(
    out: &mut W,
    rows: impl Iterator<Item = u64>,
) -> fmt::Result {
    for (col, row) in rows.enumerate() {
        if col > 0 {
            out.write_char(' ')?;
        }
        write_square(out, col as u64, row)?;
    }
    out.write_char('\n')
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

/// `a2 b4 c1 d3`, in any order; N is the number of squares.
pub(super) fn parse_algebraic(text: &str) -> Result<Vec<u32>, ParseErrorKind> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
