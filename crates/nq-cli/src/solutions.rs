//! `nq solutions` and `nq one`: solutions written to stdout in a notation.

use std::ops::ControlFlow;

use anyhow::Context;
use nq_core::notation::{self, Format};
use nq_core::search::{self, Sink};
use nq_core::split::is_canonical_solution;
use nq_core::{Board, Prefix, construct};

use crate::output::{self, Output};

/// Streams the solutions of `board` in lexicographic order, the canonical ones
/// only when `unique`, at most `limit` of them.
///
/// # Errors
///
/// When `format` cannot write this board size (checked before the search
/// starts), or stdout fails.
pub(crate) fn list(
    board: Board,
    unique: bool,
    format: Format,
    limit: Option<u64>,
) -> anyhow::Result<()> {
    format.check_size(board.n().into())?;
    let mut lister = Lister {
        out: output::stdout(),
        format,
        unique,
        left: limit.unwrap_or(u64::MAX),
        written: 0,
        error: None,
    };
    if lister.left > 0 {
        search::search(&Prefix::empty(board), &mut lister);
    }
    // The I/O error first: a `FormatError::Write` is only its shadow.
    lister.out.finish().context("writing solutions")?;
    match lister.error {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}

/// The search's sink: filters, writes, and stops at the limit or on a write
/// error.
struct Lister {
    out: Output,
    format: Format,
    unique: bool,
    /// Solutions still to write before the limit.
    left: u64,
    written: u64,
    /// Why writing stopped, if it did.
    error: Option<notation::FormatError>,
}

impl Sink for Lister {
    fn solution(&mut self, rows: &[u8]) -> ControlFlow<()> {
        if self.unique && !is_canonical_solution(rows) {
            return ControlFlow::Continue(());
        }
        let separator = if self.written > 0 {
            self.format.separator()
        } else {
            ""
        };
        let written = fmt_write(&mut self.out, separator)
            .and_then(|()| notation::write_solution(&mut self.out, self.format, rows));
        // The rows come from the search and the size was checked in `list`, so
        // in practice only the output fails here (a closed pipe).
        if let Err(e) = written {
            self.error = Some(e);
            return ControlFlow::Break(());
        }
        self.written += 1;
        self.left -= 1;
        if self.left == 0 {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    }
}

fn fmt_write(out: &mut Output, s: &str) -> Result<(), notation::FormatError> {
    std::fmt::Write::write_str(out, s).map_err(notation::FormatError::Write)
}

/// Writes the constructed solution of the `n`×`n` board.
///
/// # Errors
///
/// When the board has no solution (N = 2, 3) or is out of range, when
/// `format` cannot write it, or stdout fails.
pub(crate) fn one(n: u64, format: Format) -> anyhow::Result<()> {
    // The construction first: its message for N = 0 names the range.
    let rows = construct::one(n)?;
    format.check_size(n)?;
    let mut out = output::stdout();
    let written = notation::write_solution(&mut out, format, &rows);
    out.finish().context("writing the solution")?;
    Ok(written?)
}
