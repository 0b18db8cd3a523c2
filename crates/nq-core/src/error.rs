//! The one error type of `nq-core`.
//!
//! `nq-core` has no dependencies, so instead of `thiserror` it uses an opaque
//! struct with a public kind and a hand-written `Display`, the way ripgrep's
//! `grep-regex` does. Every message names the problem *and* the accepted form.

use std::fmt;

/// An error from `nq-core`. Inspect it with [`Error::kind`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
}

/// What went wrong.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The board size is outside `1..=32` (the range the bitmask search supports).
    BoardSize(u64),
    /// A prefix (partial placement) is malformed: wrong length, a row out of
    /// range, or two queens that attack each other. `col` is the first column at
    /// fault.
    PrefixInvalid {
        /// The first column at fault.
        col: u8,
        /// Why it is at fault.
        reason: PrefixFault,
    },
    /// A split specification asks for something the split cannot do.
    SplitInvalid {
        /// Why.
        reason: String,
    },
    /// A sub-problem received over the wire does not belong to the split: its
    /// ring part is incomplete or not canonical.
    NotCanonical,
    /// The counts reported for a sub-problem break an invariant that every true
    /// result satisfies (see [`crate::split::SubProblem::check`]).
    CountsInvalid {
        /// The invariant that failed.
        reason: &'static str,
    },
    /// An exact total would not fit in 128 bits. Cannot happen for N ≤ 32, but
    /// it is checked rather than assumed.
    Overflow,
    /// A SIMD kernel counted a sub-problem differently from the portable
    /// scalar kernel (see [`crate::split::check_kernel`]): this CPU, or this
    /// build, cannot be trusted with it.
    KernelMismatch {
        /// The kernel's name.
        kernel: &'static str,
        /// The sub-problem's prefix, as `Prefix`'s `Debug` writes it
        /// (`Prefix[3 - - …]`, `-` for an empty column).
        subproblem: String,
        /// What the kernel counted.
        got: u128,
        /// What the scalar kernel counted.
        want: u128,
    },
    /// A thread count above [`crate::pool::MAX_THREADS`].
    Threads(usize),
}

/// Why a prefix is invalid.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrefixFault {
    /// The encoding has the wrong number of columns.
    Length {
        /// Columns expected (the board size).
        expected: u8,
        /// Columns found.
        found: usize,
    },
    /// The row is not on the board.
    RowOutOfRange(u8),
    /// The column is not on the board.
    ColOutOfRange,
    /// The column already holds a queen.
    ColTaken,
    /// Another queen attacks this one; the other queen's square.
    Attacked {
        /// Column of the attacking queen.
        col: u8,
        /// Row of the attacking queen.
        row: u8,
    },
}

impl Error {
    /// Makes an error of the given kind.
    pub(crate) fn new(kind: ErrorKind) -> Error {
        Error { kind }
    }

    /// What went wrong.
    pub fn kind(&self) -> &ErrorKind {
        &self.kind
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            ErrorKind::BoardSize(n) => write!(
                f,
                "board size {n} is not supported: N must be an integer from 1 to {}",
                crate::board::MAX_N
            ),
            ErrorKind::PrefixInvalid { col, reason } => {
                write!(f, "invalid partial placement at column {col}: ")?;
                match reason {
                    PrefixFault::Length { expected, found } => write!(
                        f,
                        "expected {expected} columns (one byte per column, 255 = empty), \
                         found {found}"
                    ),
                    PrefixFault::RowOutOfRange(r) => {
                        write!(f, "row {r} is off the board (rows are 0-based)")
                    }
                    PrefixFault::ColOutOfRange => write!(f, "column is off the board"),
                    PrefixFault::ColTaken => write!(f, "column already holds a queen"),
                    PrefixFault::Attacked { col: c, row: r } => {
                        write!(
                            f,
                            "the queen is attacked by the queen at column {c}, row {r}"
                        )
                    }
                }
            }
            ErrorKind::SplitInvalid { reason } => write!(f, "invalid split: {reason}"),
            ErrorKind::NotCanonical => write!(
                f,
                "sub-problem is not in the split: its ring is incomplete or not the \
                 canonical member of its symmetry class"
            ),
            ErrorKind::CountsInvalid { reason } => {
                write!(f, "reported counts are impossible: {reason}")
            }
            ErrorKind::Overflow => write!(f, "count exceeds 128 bits"),
            ErrorKind::Threads(threads) => write!(
                f,
                "{threads} threads are too many: a thread count must be from 1 to {}",
                crate::pool::MAX_THREADS
            ),
            ErrorKind::KernelMismatch {
                kernel,
                subproblem,
                got,
                want,
            } => write!(
                f,
                "the {kernel} kernel counted {got} completions of sub-problem {subproblem}, \
                 the scalar kernel {want}: this CPU or build cannot be trusted with it; \
                 count with `--kernel scalar`"
            ),
        }
    }
}

impl std::error::Error for Error {}

/// `Result` with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
