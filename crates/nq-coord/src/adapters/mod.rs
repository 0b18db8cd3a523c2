//! The thin adapters over the engine (`crate::engine`): each translates one way in
//! (gRPC calls, the coordinator's own threads, HTTP requests, backup
//! requests on the data directory's socket) into the
//! engine's calls, and owns no judgement of its own.

pub(crate) mod backup_socket;
pub mod grpc;
pub(crate) mod http;
pub(crate) mod in_flight;
pub(crate) mod local;
pub(crate) mod security;
