//! `nq-coord`: the nq coordinator. It splits a board into prefix jobs, leases
//! them to workers over gRPC (and to its own cores), checks every result, and
//! keeps the run durable in sled so that it survives crashes and restarts.
//!
//! The entry point is [`run`]: give it a [`Config`], a bound listener and a
//! shutdown future, and it returns a [`RunReport`]. [`run`] checks the
//! [`Config`] itself ([`Config::validate`]) and tunes the allocator
//! (`nq_process::alloc`), so that every caller gets the same checks and the
//! same bounded memory. The `nq-coord` binary (`src/bin/nq-coord/`, behind
//! the `build-binary` feature) only parses flags, sets up logging and
//! progress display, and calls it, or runs one of its subcommands.
//!
//! # Layout
//!
//! Three layers, and dependencies point down only:
//!
//! * [`core`]: the pure core. The state of one session
//!   (`core::scheduler`: jobs, leases, workers, identities; claims; the
//!   history behind the rates), what each identity may hold and when a
//!   lease is taken back (`core::allowance`), the rule book ([`core::quorum`]), the
//!   judging of a job's copies (`core::ledger`, decisions returned as data),
//!   and what a run looks like from outside ([`core::status`]: one fraction,
//!   one ETA). No tokio, tonic, sled-backed store or wall clock: time is
//!   passed in. `tests/layout.rs` enforces it.
//! * `engine` (private): the one place that orders I/O. Hand-out, the single
//!   admit → check → commit → acknowledge pipeline of every result, the
//!   group-commit loop (the one writer of results), re-judging, the tick and
//!   snapshots. Its module doc states the contract: nothing acknowledged
//!   before the flush that covers it, one writer, settle after durability,
//!   the lock order.
//! * [`adapters`]: thin translations into the engine. [`adapters::grpc`]
//!   (the service, its error mapping, the server), `adapters::local` (the
//!   coordinator's own threads, through the same pipeline as remote
//!   workers), `adapters::http` (`--metrics`: [`metrics`], `/status.json`,
//!   the status page), `adapters::security` (who may call: a token, TLS, or
//!   protected mode, loopback peers only) and `adapters::in_flight` (counts
//!   the calls in flight, so that shutdown waits for calls, not idle
//!   connections).
//!
//! Around them:
//!
//! * [`config`]: [`Config`] and the
//!   parsers and defaults behind the flags.
//! * [`credentials`]: who a worker is for verification (its client
//!   certificate, its per-machine token's name, or its address as the last
//!   fallback), so that one credential is one voice.
//! * `setup` (private): opening the data directory, creating or resuming the
//!   run (`plan`: the split, work estimates and grouping into jobs), and
//!   `restore`: the core rebuilt from the stored copies, nothing cached
//!   trusted.
//! * `settings` (private): the settings that decide what counts (verify,
//!   trust, ban-after, gpu-sample), stored with the run, held to on a resume, read by
//!   the audit.
//! * `run` (private): [`run`] itself, wiring and the shutdown order only.
//! * [`report`]: [`RunReport`] (built in one place), its stdout line and
//!   `report.json`.
//! * [`audit`] and [`export`]: offline tools over a data directory.
//! * [`backup`]: `nq-coord backup` and `restore` (a serving run writes its
//!   own backup: `engine::backup`, asked on `adapters::backup_socket`).
//! * [`error`]: the crate's one error type.
//! * `sim` (tests only): seeded simulations of the core and of the engine
//!   over a real store, with lying, late and vanishing workers and crashes,
//!   checked against the ledger's invariants after every step.
//!
//! Data flows one way: `plan` → store → `engine` (with `core` deciding) ←
//! `adapters`.

#![deny(missing_docs)]

pub mod adapters;
pub mod audit;
pub mod backup;
pub mod config;
pub mod core;
pub mod credentials;
mod engine;
pub mod error;
pub mod export;
mod ids;
pub mod metrics;
mod plan;
pub mod report;
mod restore;
mod run;
mod settings;
mod setup;
#[cfg(test)]
mod sim;
mod stall;
mod wall;

pub use crate::adapters::grpc as service;
pub use crate::core::status::Progress;
pub use crate::core::{lease, quorum, status};
pub use config::Config;
pub use error::{Error, Refusal, RegistrationLimit, ReportFault, Result};
pub use nq_store::JobId;
pub use plan::MAX_SUBS_PER_JOB;
pub use report::RunReport;
pub use run::{Listeners, run, run_binding};
pub use setup::stored_n;
