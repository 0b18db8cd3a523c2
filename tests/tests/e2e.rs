//! End-to-end tests of nq: real `nq-coord` and `nq-worker` processes on
//! loopback (and, for the attacks from other machines, in network
//! namespaces: `security`, `sybil`), and the libraries in-process. One test
//! binary; each module is a theme.
//!
//! Every test binds ephemeral ports (127.0.0.1, or 0.0.0.0 where workers
//! call from namespaces), waits on real readiness
//! signals (the coordinator's `listening on` line, log lines, exits), runs
//! under a deadline, and stops everything it started (dropping a `Proc` kills
//! its process).
//!
//! The harness builds `nq-coord` and `nq-worker` with the test's own profile
//! before the first test that needs them (see `nq_e2e::binary`).

mod backup;
mod batch;
mod chaos;
mod config_file;
mod creation;
mod diversity;
mod drain;
mod faults;
mod first_hour;
mod hoarding;
mod inprocess;
mod input;
mod liar;
mod process;
mod reliability;
mod security;
mod solutions;
mod status;
mod sybil;
mod tamper;
mod totals;
mod voices;

use std::time::Duration;

/// The deadline of one test. The whole suite stays within a few minutes on two
/// cores; a test that reaches this is hung, not slow.
const LIMIT: Duration = Duration::from_secs(120);

/// A fresh data directory path inside a temporary directory (the coordinator
/// creates it).
fn data_dir(tmp: &tempfile::TempDir) -> std::path::PathBuf {
    tmp.path().join("run")
}
