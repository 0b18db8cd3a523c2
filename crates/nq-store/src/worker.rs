//! The registrations of workers that held leases, so that a restarted
//! coordinator knows the workers its restored leases were issued to.

use crate::codec::{open, put_str, seal};
use crate::error::Result;

/// The `workers` tree's value format. Version 2 added `gpu_jobs`.
const WORKER_VERSION: u8 = 2;

/// A worker's registration as a coordinator session made it: what a later
/// session needs to bind a report under a restored lease to the same
/// worker, and to count its vote as the same identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredWorker {
    /// Its self-chosen name, for logs.
    pub name: String,
    /// Its verification identity (a credential, an address, or
    /// `name@address` on loopback).
    pub identity: String,
    /// The address it called from, if known.
    pub address: Option<String>,
    /// The threads it registered with.
    pub threads: u32,
    /// The jobs its GPUs may hold, as it registered (0 without a GPU, and
    /// in registrations of version 1).
    pub gpu_jobs: u32,
}

impl StoredWorker {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = vec![WORKER_VERSION];
        put_str(&mut out, &self.name);
        put_str(&mut out, &self.identity);
        put_str(&mut out, self.address.as_deref().unwrap_or(""));
        out.extend_from_slice(&self.threads.to_be_bytes());
        out.extend_from_slice(&self.gpu_jobs.to_be_bytes());
        seal(&mut out);
        out
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<StoredWorker> {
        let (version, mut r) = open("workers", bytes, 1, WORKER_VERSION)?;
        let name = r.str()?;
        let identity = r.str()?;
        let address = r.str()?;
        let threads = r.u32()?;
        let gpu_jobs = if version >= 2 { r.u32()? } else { 0 };
        r.end()?;
        Ok(StoredWorker {
            name,
            identity,
            address: (!address.is_empty()).then_some(address),
            threads,
            gpu_jobs,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_round_trip_and_damage_is_refused() {
        for w in [
            StoredWorker {
                name: "node-7".into(),
                identity: "token:node-7".into(),
                address: Some("10.0.0.7".into()),
                threads: 64,
                gpu_jobs: 2048,
            },
            StoredWorker {
                name: String::new(),
                identity: "w@127.0.0.1".into(),
                address: None,
                threads: 0,
                gpu_jobs: 0,
            },
        ] {
            let bytes = w.encode();
            assert_eq!(StoredWorker::decode(&bytes).unwrap(), w);
            let mut bad = bytes.clone();
            bad[3] ^= 1;
            assert!(StoredWorker::decode(&bad).is_err());
        }
    }

    #[test]
    fn a_registration_stored_before_gpu_jobs_reads_as_none() {
        let w = StoredWorker {
            name: "old".into(),
            identity: "token:old".into(),
            address: None,
            threads: 8,
            gpu_jobs: 0,
        };
        // Version 1: the same fields, without `gpu_jobs`.
        let mut v1 = vec![1];
        put_str(&mut v1, &w.name);
        put_str(&mut v1, &w.identity);
        put_str(&mut v1, "");
        v1.extend_from_slice(&w.threads.to_be_bytes());
        seal(&mut v1);
        assert_eq!(StoredWorker::decode(&v1).unwrap(), w);
    }
}
