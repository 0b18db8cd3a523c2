//! `nq-core`: the exact N-Queens search that every part of nq runs.
//!
//! Pure and synchronous, with no dependency beyond `std` and no I/O. The
//! caller drives it: it passes in prefixes and stop flags and receives counts
//! or solutions through a [`search::Sink`] or a [`pool::JobSink`].
//!
//! # Layout
//!
//! * [`board`]: board sizes, partial placements ([`board::Prefix`]) and the
//!   orientation used everywhere (`rows[col]`, row 0 at the bottom).
//! * [`symmetry`]: the 8 symmetries of the square and canonical forms.
//! * [`search`]: the bitmask kernels: count, list, and count the solutions a
//!   rotation fixes.
//! * [`split`]: the versioned symmetric split into sub-problems, the proof
//!   that it covers every solution exactly once per class, and [`split::Tally`],
//!   which folds counts into Q(N) and U(N).
//! * [`pool`]: the fixed pool of OS threads that runs jobs of sub-problems.
//! * [`baseline`]: the textbook mirror-only counter, kept as the comparator for
//!   benchmarks.
//! * [`notation`]: the text notations of a solution (board diagram, vector,
//!   digits, algebraic, string, JSON): writing them and reading any mix back
//!   (JSON lines through a reader that the caller supplies).
//! * [`construct`]: one solution for N = 1 and any N ≥ 4 in O(N), by the
//!   classical construction, for boards far beyond the search's 32.
//! * [`verify`]: the O(N) checker of a claimed solution of any size, and the
//!   reader of a SAT solver's model.
//! * [`cnf`]: the problem as DIMACS CNF, for cross-checking with a SAT solver.
//! * [`published`]: the OEIS values for N ≤ 27, used only to check results.
//!
//! A count on one machine is `split` → `pool` → `Tally`; a distributed run is
//! the same with the coordinator between `split` and `pool`. The last four
//! modules work on `rows[col]` of any length (`u32` rows), never on a
//! [`Board`], and involve no search: `construct` builds a solution, `notation`
//! writes and reads solutions, `verify` judges them, and `cnf` hands the
//! problem to a SAT solver whose answer `verify` then reads.

#![deny(missing_docs)]

pub mod baseline;
pub mod board;
pub mod cnf;
pub mod construct;
pub mod error;
pub mod notation;
pub mod pool;
pub mod published;
pub mod search;
pub mod split;
pub mod symmetry;
pub mod verify;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod wide;

pub use board::{Board, MAX_N, Prefix};
pub use error::{Error, ErrorKind, Result};
