//! The workers that lost verification conflicts, as a run's report and
//! status name them.

use crate::core::scheduler::Scheduler;

/// A worker that lost at least one verification conflict: one of its results
/// disagreed with the majority of independent copies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaultyWorker {
    /// Its registration name (`local` for the coordinator's threads), or the
    /// credential it votes as (`token:NAME`, `cert:HEX`).
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
    /// address alone, a credential with the address it was first seen from,
    /// `token:NAME (name@address)`, or `local` for the coordinator's own
    /// threads).
    pub fn from_identity(identity: &str, lost: u32, banned: bool) -> FaultyWorker {
        if identity.parse::<std::net::IpAddr>().is_ok() {
            return FaultyWorker {
                name: String::new(),
                address: identity.to_owned(),
                lost,
                banned,
            };
        }
        if crate::core::quorum::credentialed(identity) {
            // `token:NAME (name@address)` as first registered, or the
            // credential alone.
            let (credential, seen) = identity
                .split_once(" (")
                .map_or((identity, ""), |(c, rest)| (c, rest.trim_end_matches(')')));
            let address = seen.rsplit_once('@').map_or(seen, |(_, a)| a);
            return FaultyWorker {
                name: credential.to_owned(),
                address: address.to_owned(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_split_into_name_and_address() {
        let split = |s| {
            let f = FaultyWorker::from_identity(s, 1, false);
            (f.name, f.address)
        };
        let pair = |n: &str, a: &str| (n.to_owned(), a.to_owned());
        assert_eq!(split("w1@127.0.0.1"), pair("w1", "127.0.0.1"));
        assert_eq!(split("10.0.0.7"), pair("", "10.0.0.7"));
        assert_eq!(split("local"), pair("local", ""));
        assert_eq!(
            split("token:liar (liar-a@198.18.0.2)"),
            pair("token:liar", "198.18.0.2")
        );
        assert_eq!(split("token:liar"), pair("token:liar", ""));
        assert_eq!(
            split("cert:0a1b (w@2001:db8::1)"),
            pair("cert:0a1b", "2001:db8::1")
        );
    }
}
