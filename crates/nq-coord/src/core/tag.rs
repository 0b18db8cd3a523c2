//! Self-authenticating worker and lease ids: a restarted coordinator checks,
//! with no stored state, that an id was issued by this run.
//!
//! A lease granted a moment before a crash has no durable record (records
//! are written about once a second, never before a `Lease` answer: making
//! every answer wait for a flush cost a third of the throughput). Instead,
//! each id carries a MAC keyed by the run's stored verification secret
//! ([`crate::core::quorum::Policy::secret`]), so that the next session can
//! recognise the id and its binding from the id alone:
//!
//! * **Worker ids** read `w<session>.<n>-<tag>`, the tag 64 bits (16 hex
//!   digits) of HMAC-SHA-256 over (session, n, caller), where the caller is
//!   what the call itself proves: its credential, else its address
//!   ([`caller_key`]). A stranger who learns an id cannot use it from
//!   another address or credential after a restart.
//! * **Lease ids** are a 16-bit nonce (the top bits) and a 48-bit tag over
//!   (worker id, job, nonce). The nonce tells apart the grants of one job to
//!   one worker within a session; it is drawn at random so that it need not
//!   be remembered.
//!
//! **Forgery bound.** Without the secret, each guess of a lease id for a
//! given (worker, job) is right with probability 2^-48, and of a worker id
//! for a given caller with probability 2^-64. At a million forged reports a
//! second, one forged lease id succeeds once in about nine years of trying;
//! and a success only lets a registered worker report one job it was not
//! granted, a copy that is checked and judged like any other (one identity
//! is one vote). A tag is never accepted for fields other than those it was
//! made for: another worker, job, caller or run (another secret) fails.
//!
//! Keys are domain-separated: one key per purpose, derived from the secret
//! with a label, so that no tag of one kind is ever a valid tag of another
//! (nor of the verification selection, which also uses the secret).

use std::net::IpAddr;

use nq_store::JobId;
use sha2::{Digest, Sha256};

use crate::ids::{LeaseId, WorkerId};

/// Bits of a lease id that carry its nonce (the rest carry the tag).
const NONCE_BITS: u32 = 16;

/// The keys of one run, derived from its secret. Its `Debug` form shows
/// nothing of them.
#[derive(Clone)]
pub(crate) struct Tags {
    worker: [u8; 32],
    lease: [u8; 32],
}

impl std::fmt::Debug for Tags {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tags { .. }")
    }
}

impl Tags {
    /// The keys of the run whose verification secret is `secret`.
    pub(crate) fn new(secret: &[u8; 16]) -> Tags {
        let derive = |label: &[u8]| -> [u8; 32] {
            let mut h = Sha256::new();
            h.update(b"nq-coord id key v1\0");
            h.update(label);
            h.update([0]);
            h.update(secret);
            h.finalize().into()
        };
        Tags {
            worker: derive(b"worker id"),
            lease: derive(b"lease id"),
        }
    }

    /// The worker id of the `n`th registration of `session`, for `caller`
    /// ([`caller_key`]).
    pub(crate) fn worker_id(&self, session: u64, n: u64, caller: &str) -> WorkerId {
        WorkerId(format!(
            "w{session}.{n}-{:016x}",
            self.worker_tag(session, n, caller)
        ))
    }

    fn worker_tag(&self, session: u64, n: u64, caller: &str) -> u64 {
        let mac = hmac(
            &self.worker,
            &[&session.to_be_bytes(), &n.to_be_bytes(), caller.as_bytes()],
        );
        u64::from_be_bytes(mac[..8].try_into().expect("8 of 32 bytes"))
    }

    /// The session of `id` when its tag checks out for `caller`: the id was
    /// issued by this run, to that caller. `None` for anything else (another
    /// caller, another run, a made-up or malformed id).
    pub(crate) fn check_worker_id(&self, id: &WorkerId, caller: &str) -> Option<u64> {
        let (session, n, tag) = parse_worker_id(&id.0)?;
        // Compared as whole words: no early exit that would time the
        // matching prefix.
        (self.worker_tag(session, n, caller) == tag).then_some(session)
    }

    /// The lease id with nonce `nonce` for `job` granted to `worker`.
    /// Different nonces give different ids; the caller skips 0 (no lease).
    pub(crate) fn lease_id(&self, worker: &WorkerId, job: JobId, nonce: u16) -> LeaseId {
        LeaseId(
            u64::from(nonce) << (64 - NONCE_BITS) | self.lease_tag(worker, job, nonce),
        )
    }

    fn lease_tag(&self, worker: &WorkerId, job: JobId, nonce: u16) -> u64 {
        let mac = hmac(
            &self.lease,
            &[
                worker.0.as_bytes(),
                &job.0.to_be_bytes(),
                &nonce.to_be_bytes(),
            ],
        );
        u64::from_be_bytes(mac[..8].try_into().expect("8 of 32 bytes")) >> NONCE_BITS
    }

    /// True when `lease` was made by [`Tags::lease_id`] for `job` and
    /// `worker` (in any session of this run).
    pub(crate) fn check_lease_id(
        &self,
        lease: LeaseId,
        worker: &WorkerId,
        job: JobId,
    ) -> bool {
        let nonce = (lease.0 >> (64 - NONCE_BITS)) as u16;
        lease.0 != 0 && self.lease_id(worker, job, nonce) == lease
    }
}

/// What a call proves about who makes it: the credential it carries (see
/// [`crate::credentials`]), and the address it comes from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Caller {
    /// Its client certificate's or token's identity, if any.
    pub credential: Option<String>,
    /// Its address, if known.
    pub address: Option<IpAddr>,
}

/// What a call proves about its caller, which a worker id is bound to: its
/// credential (a client certificate or a per-machine token), else its
/// address. On one machine (loopback) every process has the same address:
/// there the id binds the machine, as the address binds its votes.
pub(crate) fn caller_key(credential: Option<&str>, address: Option<IpAddr>) -> String {
    match (credential, address) {
        (Some(c), _) => format!("credential:{c}"),
        (None, Some(ip)) => format!("address:{}", ip.to_canonical()),
        (None, None) => "unknown".to_owned(),
    }
}

/// `w<session>.<n>-<16 hex digits>`, or `None`.
fn parse_worker_id(id: &str) -> Option<(u64, u64, u64)> {
    let rest = id.strip_prefix('w')?;
    let (numbers, tag) = rest.split_once('-')?;
    let (session, n) = numbers.split_once('.')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(session) || !digits(n) || tag.len() != 16 {
        return None;
    }
    if !tag.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    Some((
        session.parse().ok()?,
        n.parse().ok()?,
        u64::from_str_radix(tag, 16).ok()?,
    ))
}

/// HMAC-SHA-256 (RFC 2104) of the length-prefixed `fields` under `key`:
/// the prefixes make the encoding of the fields unambiguous.
fn hmac(key: &[u8; 32], fields: &[&[u8]]) -> [u8; 32] {
    let mut ipad = [0x36u8; 64];
    let mut opad = [0x5cu8; 64];
    for (i, k) in key.iter().enumerate() {
        ipad[i] ^= k;
        opad[i] ^= k;
    }
    let mut inner = Sha256::new();
    inner.update(ipad);
    for f in fields {
        inner.update((f.len() as u64).to_be_bytes());
        inner.update(f);
    }
    let mut outer = Sha256::new();
    outer.update(opad);
    outer.update(inner.finalize());
    outer.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_id_checks_only_for_its_caller_and_run() {
        let tags = Tags::new(&[1; 16]);
        let caller = caller_key(None, Some("10.0.0.1".parse().unwrap()));
        let id = tags.worker_id(3, 17, &caller);
        assert!(id.0.starts_with("w3.17-"), "readable form: {id}");
        assert_eq!(tags.check_worker_id(&id, &caller), Some(3));
        let other = caller_key(None, Some("10.0.0.2".parse().unwrap()));
        assert_eq!(tags.check_worker_id(&id, &other), None, "another address");
        let token = caller_key(Some("token:rack1"), Some("10.0.0.1".parse().unwrap()));
        assert_eq!(
            tags.check_worker_id(&id, &token),
            None,
            "another credential"
        );
        assert_eq!(
            Tags::new(&[2; 16]).check_worker_id(&id, &caller),
            None,
            "another run's secret"
        );
        // The same tag on another session or number is made up.
        let tag = id.0.split_once('-').unwrap().1;
        for forged in [format!("w4.17-{tag}"), format!("w3.18-{tag}")] {
            assert_eq!(tags.check_worker_id(&WorkerId(forged), &caller), None);
        }
        for malformed in [
            "",
            "w",
            "w3.17",
            "w3.17-zz",
            "w3.-0000000000000000",
            "x3.1-0",
        ] {
            assert_eq!(
                tags.check_worker_id(&WorkerId(malformed.into()), &caller),
                None
            );
        }
    }

    #[test]
    fn a_lease_id_checks_only_for_its_worker_and_job() {
        let tags = Tags::new(&[1; 16]);
        let w = tags.worker_id(1, 1, "address:10.0.0.1");
        let v = tags.worker_id(1, 2, "address:10.0.0.1");
        let lease = tags.lease_id(&w, JobId(5), 0xbeef);
        assert_eq!(lease.0 >> 48, 0xbeef, "the nonce is in the top bits");
        assert!(tags.check_lease_id(lease, &w, JobId(5)));
        assert!(!tags.check_lease_id(lease, &w, JobId(6)), "another job");
        assert!(!tags.check_lease_id(lease, &v, JobId(5)), "another worker");
        assert!(
            !Tags::new(&[2; 16]).check_lease_id(lease, &w, JobId(5)),
            "another run"
        );
        for bit in 0..64 {
            let flipped = LeaseId(lease.0 ^ (1 << bit));
            assert!(!tags.check_lease_id(flipped, &w, JobId(5)), "bit {bit}");
        }
        assert!(!tags.check_lease_id(LeaseId(0), &w, JobId(5)));
        assert_ne!(lease, tags.lease_id(&w, JobId(5), 0xbeee), "nonces differ");
    }

    #[test]
    fn hmac_separates_fields_and_keys() {
        // Deterministic, and every field boundary and the key matter.
        let k = [9; 32];
        assert_eq!(hmac(&k, &[b"ab", b"c"]), hmac(&k, &[b"ab", b"c"]));
        assert_ne!(hmac(&k, &[b"ab", b"c"]), hmac(&k, &[b"a", b"bc"]));
        assert_ne!(hmac(&k, &[b"ab"]), hmac(&[8; 32], &[b"ab"]));
    }
}
