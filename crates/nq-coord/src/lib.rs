//! `nq-coord`: the nq coordinator. It splits a board into prefix jobs, leases
//! them to workers over gRPC (and to its own cores), checks every result, and
//! keeps the run durable in sled so that it survives crashes and restarts.
//!
//! The entry point is [`run`]: give it a [`Config`], a bound listener and a
//! shutdown future, and it returns a [`RunReport`]. The `nq-coord` binary
//! (`src/main.rs`, behind the `build-binary` feature) only parses flags, sets
//! up logging and progress display, and calls it.
//!
//! # Layout
//!
//! * [`config`]: [`Config`] and the parsers and defaults behind the flags.
//! * [`scheduler`]: the pure state machine of jobs and leases, time passed in.
//! * [`lease`]: [`lease::LeaseId`], [`lease::WorkerId`] and the lease table.
//! * `plan` (private): the split, work estimates and grouping into jobs.
//! * `session` (private): the state shared by one session's tasks.
//! * `ledger` (private): the checked path of every result (verify, then
//!   group commit: many results, one flush, then their acks) and solution
//!   storage.
//! * [`service`]: [`service::CoordinatorService`], the gRPC service, and the
//!   one mapping of errors to `tonic::Status`.
//! * `security` (private): who may call (a token, TLS, or protected mode:
//!   loopback peers only) and what the coordinator says about its port.
//! * `in_flight` (private): counts the calls in flight, so that shutdown
//!   waits for calls and not for idle connections.
//! * `local` (private): the embedded worker on `nq_core::pool::Pool`.
//! * [`progress`]: progress snapshots for displays.
//! * [`report`]: [`RunReport`], its stdout line and `report.json`.
//! * [`http`]: the HTTP port (`--metrics`): [`metrics`] (Prometheus), the
//!   snapshot as JSON, and the status page (`src/status_page.html`).
//! * [`status`]: [`status::Snapshot`], where a run stands, for the `Status`
//!   rpc, `nq-coord status`, the status page and `/metrics`.
//! * [`export`]: streaming the stored solutions of a solutions run.
//! * `run` (private): [`run`] itself: setup, tasks, shutdown order.
//!
//! Data flows one way: `plan` → store → `scheduler` → (`service` | `local`)
//! → `ledger` → store and `scheduler`.

#![deny(missing_docs)]

pub mod audit;
pub mod config;
pub mod error;
pub mod export;
pub mod http;
mod in_flight;
pub mod lease;
mod ledger;
mod local;
pub mod metrics;
mod plan;
pub mod progress;
pub mod quorum;
pub mod report;
mod run;
pub mod scheduler;
mod security;
pub mod service;
mod session;
pub mod status;

pub use config::Config;
pub use error::{Error, Refusal, ReportFault, Result};
pub use nq_store::JobId;
pub use plan::MAX_SUBS_PER_JOB;
pub use progress::Progress;
pub use report::RunReport;
pub use run::run;
