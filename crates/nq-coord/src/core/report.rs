//! The workers that lost verification conflicts, as a run's report and
//! status name them.

use crate::core::scheduler::Scheduler;

/// A worker that lost at least one verification conflict: one of its results
/// disagreed with the majority of independent copies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaultyWorker {
    /// Its registration name (`local` for the coordinator's threads).
    pub name: String,
    /// The address it called from (the kernel, for the local threads).
    pub address: String,
    /// Conflicts it lost.
    pub lost: u32,
    /// True when it was refused work for it.
    pub banned: bool,
}

impl FaultyWorker {
    /// Splits a verification identity or its label (`name@address`, an
    /// address alone, `local` for the coordinator's own threads).
    pub fn from_identity(identity: &str, lost: u32, banned: bool) -> FaultyWorker {
        if identity.parse::<std::net::IpAddr>().is_ok() {
            return FaultyWorker {
                name: String::new(),
                address: identity.to_owned(),
                lost,
                banned,
            };
        }
        let (name, address) = identity
            .rsplit_once('@')
            .or_else(|| identity.split_once(':'))
            .unwrap_or((identity, ""));
        FaultyWorker {
            name: name.to_owned(),
            address: address.to_owned(),
            lost,
            banned,
        }
    }
}

/// The workers that lost verification conflicts, from the scheduler's
/// identities.
pub fn faulty_workers(s: &Scheduler) -> Vec<FaultyWorker> {
    let ban_after = s.policy().ban_after;
    s.identities()
        .faulty()
        .map(|(id, name, lost)| {
            FaultyWorker::from_identity(
                name,
                lost,
                s.identities().is_banned(id, ban_after),
            )
        })
        .collect()
}
