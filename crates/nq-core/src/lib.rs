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
//!
//! A count on one machine is `split` → `pool` → `Tally`; a distributed run is
//! the same with the coordinator between `split` and `pool`.

#![deny(missing_docs)]

pub mod baseline;
pub mod board;
pub mod error;
pub mod pool;
pub mod search;
pub mod split;
pub mod symmetry;

pub use board::{Board, MAX_N, Prefix};
pub use error::{Error, ErrorKind, Result};
