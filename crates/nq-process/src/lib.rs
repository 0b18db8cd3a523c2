//! `nq-process`: what every nq program does at the edges of its process.
//!
//! `nq-coord` and `nq-worker` are thin binaries over their libraries; what is
//! left in their `main` is the same for both: turn signals into a graceful
//! shutdown, set up logging, print to stdout and stderr, and take the flags
//! that reach a coordinator. Two copies of that glue drift (the
//! coordinator's once lost a second SIGTERM that the worker's caught), so it
//! lives here, once.
//!
//! # Layout
//!
//! * [`alloc`]: glibc allocator tuning (an arena cap, a fixed mmap
//!   threshold) and a periodic `malloc_trim`, which keep a long run's memory
//!   bounded. The nq-coord library starts them in `nq_coord::run`, so it
//!   depends on this crate without the `cli` feature.
//! * [`shutdown`]: [`Signals`] (SIGTERM and SIGINT, both listened to from
//!   the start) and [`shutdown_signal`], the future a binary hands to its
//!   library's `run`: the first signal starts a graceful drain, a second one
//!   exits at once with status 130.
//!
//! With the `cli` feature (the default; binaries only):
//!
//! * [`logging`]: `LogArgs` (`--log-format text|json`, `NQ_LOG_FORMAT`),
//!   `logging::init` (`RUST_LOG` filter, colours only on a terminal) and
//!   `logging::fatal`, the last words of a failed program.
//! * [`output`]: lines on stdout and stderr that never panic on a closed
//!   pipe; a program whose reader went away (`| head -1`, a restarted log
//!   collector) keeps working, and its exit status says how its run went, not
//!   what became of the pipe.
//! * [`dial`]: `DialArgs` (`--token`, `--ca`, `--tls-cert`, `--tls-key`),
//!   the flags of every client of a coordinator, and the `Dial` they make
//!   with its address.
//!
//! Libraries emit `tracing` events and take a shutdown future, and never
//! read argv, the environment or signals.

#![deny(missing_docs)]

pub mod alloc;
#[cfg(feature = "cli")]
pub mod dial;
#[cfg(feature = "cli")]
pub mod logging;
#[cfg(feature = "cli")]
pub mod output;
pub mod shutdown;

#[cfg(feature = "cli")]
pub use dial::{Dial, DialArgs};
#[cfg(feature = "cli")]
pub use logging::{LogArgs, LogFormat};
pub use shutdown::{SECOND_SIGNAL_EXIT, Signals, shutdown_signal};
