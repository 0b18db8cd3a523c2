//! Job results, repeated results, group commits and the final summary.

use nq_core::split::{SubCounts, Tally};

use crate::codec::{Reader, key_u64, open, put_str, put_varint, seal};
use crate::error::{Corruption, Result};
use crate::job::{JobId, JobRecord, JobState};

/// A job's copies as the store holds them (the Done record's first, then
/// the duplicates in the order stored) put back in the order they were
/// received, with the index of the Done record's copy.
///
/// Judging needs that order: each identity votes with the first copy it
/// sent, and the store's order is not the order received once verification
/// moved the Done record to a later copy (the old record is then kept
/// after the duplicates, and the new one may also be among them). A
/// self-contradicting identity's vote would move with the record, and a
/// job settled two votes to one could read two to two when judged again.
/// The sort is stable and copies of one job are stamped strictly apart
/// ([`StoredResult::stamp_after`]), so a tie only arises in stores written
/// before the stamp, where the store's order decides as it always did. A
/// duplicate equal to the record in every field is the record's own copy,
/// and is dropped.
pub fn in_received_order<T: std::borrow::Borrow<StoredResult>>(
    copies: Vec<T>,
) -> (Vec<T>, Option<usize>) {
    let mut tagged: Vec<(bool, T)> = copies
        .into_iter()
        .enumerate()
        .map(|(i, c)| (i == 0, c))
        .collect();
    if let Some((_, record)) = tagged.first() {
        let record: StoredResult = record.borrow().clone();
        tagged.retain(|(is_record, c)| *is_record || *c.borrow() != record);
    }
    tagged.sort_by_key(|(_, c)| c.borrow().received_unix_ms);
    let record = tagged.iter().position(|(is_record, _)| *is_record);
    (tagged.into_iter().map(|(_, c)| c).collect(), record)
}

/// The accepted result of one job.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoredResult {
    /// One entry per sub-problem, in the job's order.
    pub counts: Vec<SubCounts>,
    /// Solutions stored for the job (solutions mode; 0 otherwise).
    pub solutions: u64,
    /// The job's contribution to the run's totals, folded by the coordinator
    /// when it accepted the result (kept so that a restart sums the totals
    /// without rebuilding every sub-problem).
    pub tally: Tally,
    /// Search nodes the worker reported (throughput figures only).
    pub nodes: u64,
    /// The worker id (of its coordinator session) that sent it.
    pub worker: String,
    /// The lease it was sent under.
    pub lease: u64,
    /// Who computed it, as verification tells workers apart: a credential
    /// (`token:NAME`, `cert:HEX`), an address (`name@address` on loopback)
    /// for a remote worker, `local` for the coordinator's own threads
    /// (`local:KERNEL` in stores written before they were one voice). Two
    /// copies of a job from one untrusted identity are one vote.
    pub identity: String,
    /// The kernel that counted (`avx512`, `avx2`, `scalar`), as reported.
    pub kernel: String,
    /// When the coordinator received it, milliseconds since the Unix epoch,
    /// and at least one after the job's earlier copies
    /// ([`StoredResult::stamp_after`]); 0 in stores of format version 1.
    pub received_unix_ms: u64,
}

impl StoredResult {
    /// True when `other` reports the same outcome: the same counts for every
    /// sub-problem and the same number of solutions. Who sent it, under which
    /// lease and with how many nodes does not matter.
    pub fn agrees(&self, other: &StoredResult) -> bool {
        self.counts == other.counts && self.solutions == other.solutions
    }

    /// Stamps this copy as received after every copy in `earlier` (a job's
    /// copies already stored or judged): one millisecond after the latest
    /// of them where its own `received_unix_ms` says otherwise (two copies
    /// in one millisecond, or a clock set back). A job's copies then sort
    /// by the time received into the order they were judged in, whatever
    /// the store moved since (see [`in_received_order`]).
    pub fn stamp_after<'a>(
        &mut self,
        earlier: impl IntoIterator<Item = &'a StoredResult>,
    ) {
        if let Some(latest) = earlier.into_iter().map(|c| c.received_unix_ms).max() {
            self.received_unix_ms = self.received_unix_ms.max(latest.saturating_add(1));
        }
    }

    #[cfg(test)]
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(24 + 3 * self.counts.len());
        out.push(RESULT_VERSION);
        self.encode_into(&mut out);
        seal(&mut out);
        out
    }

    pub(crate) fn encode_into(&self, out: &mut Vec<u8>) {
        put_varint(out, self.counts.len() as u128);
        for c in &self.counts {
            put_varint(out, c.count);
            put_varint(out, c.fixed180);
            put_varint(out, c.fixed90);
        }
        put_varint(out, self.solutions.into());
        put_varint(out, self.tally.total);
        put_varint(out, self.tally.burnside);
        put_varint(out, self.nodes.into());
        out.extend_from_slice(&self.lease.to_be_bytes());
        put_str(out, &self.worker);
        put_str(out, &self.identity);
        put_str(out, &self.kernel);
        out.extend_from_slice(&self.received_unix_ms.to_be_bytes());
    }

    #[cfg(test)]
    pub(crate) fn decode(bytes: &[u8]) -> Result<StoredResult> {
        // A result on its own exists in tests only, always sealed.
        let (version, mut r) = open("results", bytes, 2, RESULT_VERSION)?;
        let res = StoredResult::decode_from(&mut r, version)?;
        r.end()?;
        Ok(res)
    }

    /// Reads a result written in format `version` (1: before identities and
    /// checksums; its identity reads as its worker id).
    pub(crate) fn decode_from(r: &mut Reader<'_>, version: u8) -> Result<StoredResult> {
        let len = r.varint_u64()?;
        let len = usize::try_from(len).map_err(|_| r.corrupt(Corruption::Truncated))?;
        // Each entry takes at least 3 bytes: reserve no more entries than the
        // rest of the value can hold, so a damaged length cannot make a few
        // bytes reserve megabytes (found by the property tests in `fuzz`).
        let mut counts = Vec::with_capacity(len.min(r.remaining() / 3));
        for _ in 0..len {
            counts.push(SubCounts {
                count: r.varint()?,
                fixed180: r.varint()?,
                fixed90: r.varint()?,
            });
        }
        let solutions = r.varint_u64()?;
        let tally = Tally {
            total: r.varint()?,
            burnside: r.varint()?,
        };
        let nodes = r.varint_u64()?;
        let lease = r.u64()?;
        let worker = r.str()?;
        let (identity, kernel, received_unix_ms) = if version >= 2 {
            (r.str()?, r.str()?, r.u64()?)
        } else {
            (worker.clone(), String::new(), 0)
        };
        Ok(StoredResult {
            counts,
            solutions,
            tally,
            nodes,
            worker,
            lease,
            identity,
            kernel,
            received_unix_ms,
        })
    }
}

/// Format of results and duplicates. Version 2 added identities, kernels and
/// receipt times, and a CRC-32 after every value; version 1 (unsealed) is
/// refused.
pub(crate) const RESULT_VERSION: u8 = 2;

/// How a repeated result compared with the stored one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DuplicateKind {
    /// It agrees with the stored result.
    Confirmation,
    /// It disagrees. One of the two is wrong; the stored one still counts.
    Conflict,
}

/// A result received for a job that was already done. It never changes the
/// totals; it is kept as evidence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Duplicate {
    /// How it compared with the stored result.
    pub kind: DuplicateKind,
    /// What was received.
    pub result: StoredResult,
    /// Received once the run was complete. Its result was final by then, so
    /// this copy is evidence only: it is counted as a confirmation or a
    /// conflict, but never judged ([`judged_copies`]). Judging it again
    /// after a restart could unsettle a job of the finished run (two late
    /// liars that agree outvote the counted copy), and the finished run's
    /// directory would then be refused for a total it did reach.
    pub after_completion: bool,
}

/// Format of duplicates: version 3 adds a flags byte after the kind (bit 0:
/// [`Duplicate::after_completion`]). A duplicate without a flag is still
/// written as version 2, so that only a store holding copies kept after
/// its run completed needs this version to be read.
const DUPLICATE_VERSION: u8 = 3;

impl Duplicate {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let version = if self.after_completion {
            DUPLICATE_VERSION
        } else {
            RESULT_VERSION
        };
        let mut out = vec![version];
        out.push(match self.kind {
            DuplicateKind::Confirmation => 0,
            DuplicateKind::Conflict => 1,
        });
        if version >= 3 {
            out.push(u8::from(self.after_completion));
        }
        self.result.encode_into(&mut out);
        seal(&mut out);
        out
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<Duplicate> {
        let (version, mut r) = open("duplicates", bytes, 2, DUPLICATE_VERSION)?;
        let kind = match r.u8()? {
            0 => DuplicateKind::Confirmation,
            1 => DuplicateKind::Conflict,
            _ => {
                return Err(r.corrupt(Corruption::Field {
                    field: "duplicate.kind",
                }));
            }
        };
        let after_completion = version >= 3 && r.flag("duplicate.flags")?;
        // The result inside is of the results' format.
        let result = StoredResult::decode_from(&mut r, version.min(RESULT_VERSION))?;
        r.end()?;
        Ok(Duplicate {
            kind,
            result,
            after_completion,
        })
    }
}

/// The copies of a done job that were judged, as the store holds them: the
/// Done record's `counted` copy first, then its `duplicates` but those kept
/// after the run completed ([`Duplicate::after_completion`]). Every reader
/// that judges a job's copies (the commit loop, restore, the audit) reads
/// them through this, so that a finished run judged again reaches the
/// result it finished with.
pub fn judged_copies(
    counted: StoredResult,
    duplicates: impl IntoIterator<Item = Duplicate>,
) -> Vec<StoredResult> {
    std::iter::once(counted)
        .chain(
            duplicates
                .into_iter()
                .filter(|d| !d.after_completion)
                .map(|d| d.result),
        )
        .collect()
}

impl crate::Store {
    /// The recorded duplicates of one job, in the order they were recorded.
    ///
    /// # Errors
    ///
    /// [`crate::Error::Corrupt`] (a damaged value), sled errors.
    pub fn job_duplicates(&self, job: JobId) -> Result<Vec<Duplicate>> {
        self.duplicates
            .scan_prefix(job.key())
            .map(|entry| Duplicate::decode(&entry?.1))
            .collect()
    }

    /// Every recorded duplicate, in job order.
    pub fn duplicates(
        &self,
    ) -> impl Iterator<Item = Result<(JobId, Duplicate)>> + 'static {
        self.duplicates.iter().map(|entry| {
            let (k, v) = entry?;
            let job = key_u64("duplicates", k.get(..8).unwrap_or(&[]))?;
            Ok((JobId(job), Duplicate::decode(&v)?))
        })
    }
}

/// Writes gathered for one group commit: [`crate::Store::apply`] them, then
/// flush ONCE, then acknowledge every result in the batch. This is what makes
/// thousands of durable results per second possible: one disk sync covers
/// them all.
///
/// The writes are applied chunk by chunk, not as one sled batch: each result
/// is valid on its own, so nothing needs them to land together, and large
/// sled batches hold on to memory until they end.
#[derive(Debug, Default)]
pub struct CommitBatch {
    /// Encoded records, each with whether it replaces a stored result.
    pub(crate) records: Vec<(JobId, Vec<u8>, bool)>,
    pub(crate) duplicates: Vec<(JobId, Vec<u8>)>,
    /// Encoded conflicts lost, by job.
    pub(crate) losses: Vec<(JobId, Vec<u8>)>,
    /// Encoded worker registrations, by worker id.
    pub(crate) workers: Vec<(String, Vec<u8>)>,
    /// The identities of the copies stored, for the voters index.
    pub(crate) voters: Vec<String>,
}

impl CommitBatch {
    /// An empty batch.
    pub fn new() -> CommitBatch {
        CommitBatch::default()
    }

    /// Stores the first result of `job` and marks the job done. `attempts` is
    /// kept in the job's record.
    ///
    /// The caller MUST have established that the job has no stored result
    /// yet: the store keeps the first result and silently drops later ones
    /// (which must be compared and recorded with [`CommitBatch::duplicate`]).
    pub fn result(&mut self, job: JobId, result: StoredResult, attempts: u32) {
        self.voters.push(result.identity.clone());
        let record = JobRecord {
            state: JobState::Done(Box::new(result)),
            attempts,
        };
        self.records.push((job, record.encode(), false));
    }

    /// Replaces the stored result of a done `job` with `result`: verification
    /// found that another copy than the stored one holds the majority. The
    /// caller records the replaced copy with [`CommitBatch::duplicate`].
    pub fn replace_result(&mut self, job: JobId, result: StoredResult, attempts: u32) {
        self.voters.push(result.identity.clone());
        let record = JobRecord {
            state: JobState::Done(Box::new(result)),
            attempts,
        };
        self.records.push((job, record.encode(), true));
    }

    /// Stores the registration of worker `id`, whose leases a restarted
    /// coordinator may restore.
    pub fn worker(&mut self, id: &str, worker: &crate::StoredWorker) {
        self.workers.push((id.to_owned(), worker.encode()));
    }

    /// Adds a record that is not a result (a lease, or a job back to pending),
    /// to be written with the batch. Dropped if the job is done by then.
    pub fn record(&mut self, job: JobId, record: &JobRecord) {
        self.records.push((job, record.encode(), false));
    }

    /// Records a repeated result of `job`. One kept after the run completed
    /// is no voter: it is never judged.
    pub fn duplicate(&mut self, job: JobId, duplicate: &Duplicate) {
        if !duplicate.after_completion {
            self.voters.push(duplicate.result.identity.clone());
        }
        self.duplicates.push((job, duplicate.encode()));
    }

    /// Records a conflict lost in `job`, charged as the job settled.
    pub fn loss(&mut self, job: JobId, loss: &crate::StoredLoss) {
        self.losses.push((job, loss.encode()));
    }

    /// Number of records, duplicates, losses and registrations in the batch.
    pub fn len(&self) -> usize {
        self.records.len()
            + self.duplicates.len()
            + self.losses.len()
            + self.workers.len()
    }

    /// True when the batch holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The outcome of a finished run, written once when its last job is done, so
/// that a finished directory answers at once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunSummary {
    /// Q(N), the number of solutions.
    pub total: u128,
    /// U(N), the number of solutions up to symmetry.
    pub unique: u128,
    /// Time the coordinator spent on the run, over every session, in ms.
    pub elapsed_ms: u64,
    /// Number of jobs.
    pub jobs: u64,
    /// Repeated results that agreed with the stored ones.
    pub confirmations: u64,
    /// Repeated results that disagreed.
    pub conflicts: u64,
    /// When the last job was done, milliseconds since the Unix epoch.
    pub finished_unix_ms: u64,
    /// Jobs that counted one copy where a check was needed that no second
    /// machine gave, as the run ended (its status `unchecked` when above
    /// 0); `None` in summaries of format 2, written before it was kept.
    /// Judging the stored copies again cannot tell it: copies kept after
    /// the run completed were never judged, and a late lie among them
    /// would read as a job still waiting for a check.
    pub unchecked: Option<u64>,
}

/// Format of the summary. Version 2 seals it with a CRC-32: a finished run
/// answers from it alone, so a damaged total must be refused, not printed.
/// Version 1 (unsealed) is refused. Version 3 adds `unchecked`; a summary
/// without it is still written as version 2.
const SUMMARY_VERSION: u8 = 3;

impl RunSummary {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let version = if self.unchecked.is_some() { 3 } else { 2 };
        let mut out = vec![version];
        put_varint(&mut out, self.total);
        put_varint(&mut out, self.unique);
        for v in [
            self.elapsed_ms,
            self.jobs,
            self.confirmations,
            self.conflicts,
            self.finished_unix_ms,
        ] {
            put_varint(&mut out, v.into());
        }
        if let Some(unchecked) = self.unchecked {
            put_varint(&mut out, unchecked.into());
        }
        seal(&mut out);
        out
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<RunSummary> {
        let (version, mut r) = open("meta", bytes, 2, SUMMARY_VERSION)?;
        let s = RunSummary {
            total: r.varint()?,
            unique: r.varint()?,
            elapsed_ms: r.varint_u64()?,
            jobs: r.varint_u64()?,
            confirmations: r.varint_u64()?,
            conflicts: r.varint_u64()?,
            finished_unix_ms: r.varint_u64()?,
            unchecked: if version >= 3 {
                Some(r.varint_u64()?)
            } else {
                None
            },
        };
        r.end()?;
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> StoredResult {
        StoredResult {
            counts: vec![
                SubCounts::default(),
                SubCounts {
                    count: u128::MAX,
                    fixed180: 4,
                    fixed90: 2,
                },
            ],
            solutions: 3,
            tally: Tally {
                total: 10,
                burnside: 16,
            },
            nodes: 99,
            worker: "w".into(),
            lease: 5,
            identity: "w@127.0.0.1".into(),
            kernel: "avx2".into(),
            received_unix_ms: 17,
        }
    }

    #[test]
    fn results_and_duplicates_round_trip() {
        let r = sample();
        assert_eq!(StoredResult::decode(&r.encode()).unwrap(), r);
        let d = Duplicate {
            kind: DuplicateKind::Conflict,
            result: r,
            after_completion: false,
        };
        assert_eq!(Duplicate::decode(&d.encode()).unwrap(), d);
        // Only a copy kept after completion needs format 3: an older binary
        // still reads every other duplicate.
        assert_eq!(d.encode()[0], 2);
        let late = Duplicate {
            after_completion: true,
            ..d.clone()
        };
        assert_eq!(late.encode()[0], 3);
        assert_eq!(Duplicate::decode(&late.encode()).unwrap(), late);
        let s = RunSummary {
            total: 1 << 100,
            unique: 3,
            elapsed_ms: 4,
            jobs: 5,
            confirmations: 6,
            conflicts: 7,
            finished_unix_ms: 8,
            unchecked: Some(9),
        };
        assert_eq!(RunSummary::decode(&s.encode()).unwrap(), s);
        // Written before `unchecked` was kept: format 2, read as unknown.
        let v2 = RunSummary {
            unchecked: None,
            ..s.clone()
        };
        assert_eq!(v2.encode()[0], 2);
        assert_eq!(RunSummary::decode(&v2.encode()).unwrap(), v2);
    }

    #[test]
    fn a_damaged_value_is_refused() {
        for after_completion in [false, true] {
            let d = Duplicate {
                kind: DuplicateKind::Confirmation,
                result: sample(),
                after_completion,
            };
            let bytes = d.encode();
            for i in 0..bytes.len() {
                let mut bad = bytes.clone();
                bad[i] ^= 0x10;
                assert!(
                    Duplicate::decode(&bad).is_err(),
                    "flip at byte {i} went unseen"
                );
            }
        }
        assert!(StoredResult::decode(&sample().encode()).is_ok());
    }

    #[test]
    fn copies_kept_after_completion_are_not_judged() {
        let copy = |identity: &str, after_completion| Duplicate {
            kind: DuplicateKind::Conflict,
            result: StoredResult {
                identity: identity.into(),
                ..sample()
            },
            after_completion,
        };
        let judged = judged_copies(
            sample(),
            [
                copy("before", false),
                copy("late", true),
                copy("also", false),
            ],
        );
        let who: Vec<&str> = judged.iter().map(|c| c.identity.as_str()).collect();
        assert_eq!(who, [sample().identity.as_str(), "before", "also"]);
    }

    #[test]
    fn agreement_ignores_who_and_how() {
        let a = sample();
        let mut b = sample();
        b.worker = "other".into();
        b.nodes = 1;
        b.lease = 77;
        assert!(a.agrees(&b));
        b.counts[0].count = 1;
        assert!(!a.agrees(&b));
    }

    /// A copy of `sample()` from `identity` under `lease`, stamped after
    /// `earlier`.
    fn copy(identity: &str, lease: u64, earlier: &[StoredResult]) -> StoredResult {
        let mut c = sample();
        c.identity = identity.into();
        c.lease = lease;
        // One millisecond for all: the stamp alone sets them apart.
        c.received_unix_ms = 1_000;
        c.stamp_after(earlier);
        c
    }

    #[test]
    fn copies_stamped_in_one_millisecond_come_back_in_the_order_received() {
        let mut received: Vec<StoredResult> = Vec::new();
        for (identity, lease) in [("liar", 1), ("liar", 2), ("x", 3), ("y", 4)] {
            let c = copy(identity, lease, &received);
            received.push(c);
        }
        let stamps: Vec<u64> = received.iter().map(|c| c.received_unix_ms).collect();
        assert_eq!(stamps, [1_000, 1_001, 1_002, 1_003]);
        // The store after verification moved the record from the first copy
        // to the fourth, and then the fourth to the third (kept earlier as a
        // duplicate): the record first, the duplicates in the order stored.
        let [a, b, c, d] = [0, 1, 2, 3].map(|i| received[i].clone());
        let stored = vec![c.clone(), b.clone(), c.clone(), a.clone(), d.clone()];
        let (ordered, record) = in_received_order(stored);
        assert_eq!(ordered, received, "the record's own duplicate is dropped");
        assert_eq!(record, Some(2));
        // References sort the same way, and an empty job has no record.
        let (refs, record) = in_received_order(vec![&d, &a]);
        assert_eq!((refs, record), (vec![&a, &d], Some(1)));
        assert_eq!(in_received_order(Vec::<StoredResult>::new()).1, None);
    }

    #[test]
    fn copies_of_a_store_without_stamps_keep_the_stored_order() {
        // Version 1 results read as received at 0: the store decides.
        let v1 = |identity: &str| {
            let mut c = sample();
            c.identity = identity.into();
            c.received_unix_ms = 0;
            c
        };
        let stored = vec![v1("b"), v1("a"), v1("c")];
        let (ordered, record) = in_received_order(stored.clone());
        assert_eq!((ordered, record), (stored, Some(0)));
        // A clock set back still stamps after the latest copy.
        let mut late = sample();
        late.received_unix_ms = 5;
        late.stamp_after(&[sample()]);
        assert_eq!(late.received_unix_ms, sample().received_unix_ms + 1);
    }
}
