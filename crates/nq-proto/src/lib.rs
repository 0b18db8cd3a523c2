//! `nq-proto`: the gRPC protocol between the nq coordinator and its workers.
//!
//! The contract itself, with the retry and idempotency rules of every rpc, is
//! `proto/nqueens/v1/nqueens.proto` at the top of the repository. This crate
//! compiles it at build time (no system `protoc` needed) and adds conversions
//! between wire messages and `nq-core` types.
//!
//! # Layout
//!
//! * [`pb`]: the generated messages, client and server. Always reach generated
//!   code through `pb::`.
//! * [`convert`]: `From`/`TryFrom` between `pb` messages and `nq-core` types,
//!   where every value from the wire is validated.
//! * [`PROTOCOL_VERSION`], [`MAX_MESSAGE_BYTES`], [`MAX_REPORT_BATCH`]: limits
//!   both ends agree on.
//! * [`duration`]: the duration syntax of both command lines.
//! * [`address`]: [`address::CoordinatorAddress`], a coordinator's address
//!   as every client takes it (`host`, `host:port`, `http://host:port`,
//!   `https://host:port`; port 50051 by default).
//! * [`auth`]: the shared token, sent as `authorization: Bearer <token>`,
//!   and its constant-time check.
//! * [`tls`]: certificates and keys from PEM files, checked when loaded.

#![deny(missing_docs)]

pub mod address;
pub mod auth;
pub mod convert;
pub mod duration;
pub mod tls;

/// The generated protocol code (package `nqueens.v1`).
#[allow(missing_docs, unreachable_pub, missing_debug_implementations)]
#[allow(clippy::all, clippy::pedantic)]
pub mod pb {
    tonic::include_proto!("nqueens.v1");
}

/// The encoded file descriptor set of the protocol, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/nqueens_descriptor.bin"));

/// Version of the protocol. A worker sends it in `Register`, and the
/// coordinator refuses any other value. Bump it on every incompatible change.
pub const PROTOCOL_VERSION: u32 = 2;

/// The largest message either side sends or accepts (encoded), 16 MiB. Set on
/// both the client and the server, so an oversized message fails loudly
/// instead of being cut. Jobs and solution batches are sized well below it.
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// The most items one `ReportBatch` call may carry. A coordinator refuses a
/// larger batch whole (INVALID_ARGUMENT); a worker sends at most this many,
/// and fewer when their encoding would pass [`MAX_MESSAGE_BYTES`]. Below the
/// coordinator's commit queue, so that one call's items can all join the
/// same group commit.
pub const MAX_REPORT_BATCH: usize = 1024;

pub use convert::ConvertError;
