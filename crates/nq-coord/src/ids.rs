//! The coordinator's id newtypes, in a module of their own: errors, the pure
//! core and the adapters all name them, and none of those should depend on
//! each other for it.

use std::fmt;

/// Identifies one grant of one job. Distinct from [`JobId`](crate::JobId), so the two cannot
/// be mixed up:
///
/// ```compile_fail
/// use nq_coord::lease::LeaseId;
/// use nq_coord::JobId;
/// fn revoke(_: LeaseId) {}
/// revoke(JobId(3)); // a job id is not a lease id
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseId(pub u64);

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// Identifies a registered worker for one coordinator session:
/// `w<session>.<n>-<tag>`, the tag a MAC of the rest and its caller
/// (`crate::core::tag`).
///
/// ```compile_fail
/// use nq_coord::lease::WorkerId;
/// fn forget(_: WorkerId) {}
/// forget("w1.1".to_string()); // a string is not a worker id
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkerId(pub String);

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
