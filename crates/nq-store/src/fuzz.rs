//! Property tests over the decoding of every stored record (issue 7, item 8).
//!
//! These are proptest properties rather than cargo-fuzz targets: cargo-fuzz
//! needs a nightly toolchain, while these run under `cargo test` on stable,
//! so CI runs them on every change. Each format gets three properties:
//!
//! * (a) encode → decode round-trips arbitrary valid values (counts up to
//!   `u128::MAX`, arbitrary strings), and the unsealed version 1 is refused;
//! * (b) decoding arbitrary bytes never panics, returns a value or
//!   [`Error::Corrupt`], and allocates at most in proportion to its input (a
//!   counting allocator, below, measures it: a length field must not make a
//!   few bytes reserve megabytes);
//! * (c) every single-bit flip and every truncation of a sealed value is
//!   refused as corrupt, never decoded to another value.
//!
//! What they found is kept as plain regression tests at the bottom, each
//! named for its case.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::BTreeMap;

use nq_core::Board;
use nq_core::split::{SplitSpec, SubCounts, Tally};
use proptest::collection::vec;
use proptest::prelude::*;

use crate::codec::{Reader, put_str, put_varint};
use crate::error::{Corruption, Error};
use crate::job::{
    Chunk, JobRecord, JobState, NewJob, decode_record_chunk, encode_chunk,
    encode_record_chunk, update_record_chunk,
};
use crate::losses::StoredLoss;
use crate::manifest::{Manifest, RunKey};
use crate::result::{Duplicate, DuplicateKind, RunSummary, StoredResult};

// ----- a counting allocator ---------------------------------------------------

/// Counts the bytes each thread allocates, so that a property can bound what
/// one decode costs. Other tests of this binary run on other threads and are
/// not counted.
struct Counting;

thread_local! {
    /// Bytes allocated by this thread so far. `const`-initialised and without
    /// a destructor, so the allocator may touch it at any time.
    static ALLOCATED: Cell<usize> = const { Cell::new(0) };
}

fn note(bytes: usize) {
    // `try_with`: a thread being torn down has no counter left; its
    // allocations are not measured.
    let _ = ALLOCATED.try_with(|a| a.set(a.get().saturating_add(bytes)));
}

// SAFETY: every call is forwarded to `System` unchanged; the counter is a
// thread-local `Cell`, which needs no allocation and no lock.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller's contract is `System`'s.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// Runs `f` and returns what it returned and the bytes it allocated (in
/// total, which bounds its peak).
fn allocation_of<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = ALLOCATED.with(Cell::get);
    let out = f();
    (out, ALLOCATED.with(Cell::get) - before)
}

/// What decoding `len` bytes may allocate: every decoded byte becomes at most
/// a few dozen bytes of value (a 3-byte count entry is a 48-byte
/// `SubCounts`), doubled for `Vec` growth, plus a constant for fixed-size
/// reservations (a record chunk reserves its at most 255 entries up front).
fn allocation_bound(len: usize) -> usize {
    64 * len + 8192
}

/// Asserts that `decode` on `bytes` returns a value or a corruption error
/// within [`allocation_bound`]; returns the value.
fn decodes_sanely<T>(
    bytes: &[u8],
    decode: impl FnOnce(&[u8]) -> crate::Result<T>,
) -> Result<Option<T>, TestCaseError> {
    let (out, allocated) = allocation_of(|| decode(bytes));
    prop_assert!(
        allocated <= allocation_bound(bytes.len()),
        "decoding {} bytes allocated {allocated} bytes",
        bytes.len()
    );
    match out {
        Ok(v) => Ok(Some(v)),
        Err(Error::Corrupt { .. }) => Ok(None),
        Err(e) => Err(TestCaseError::fail(format!(
            "not a corruption error: {e:?}"
        ))),
    }
}

// ----- strategies -------------------------------------------------------------

/// Counts, with the edges (0, `u64::MAX + 1`, `u128::MAX`) well represented.
fn count() -> impl Strategy<Value = u128> {
    prop_oneof![
        any::<u128>(),
        Just(0u128),
        Just(u128::MAX),
        Just(u128::from(u64::MAX) + 1),
        0u128..1 << 20,
        any::<u64>().prop_map(u128::from),
    ]
}

/// Arbitrary Unicode, and the ASCII that names and kernels really hold.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![any::<String>(), "[a-z0-9@.:-]{0,16}"]
}

fn sub_counts() -> impl Strategy<Value = SubCounts> {
    (count(), count(), count()).prop_map(|(count, fixed180, fixed90)| SubCounts {
        count,
        fixed180,
        fixed90,
    })
}

fn stored_result() -> impl Strategy<Value = StoredResult> {
    (
        vec(sub_counts(), 0..6),
        any::<u64>(),
        (count(), count()),
        any::<u64>(),
        text(),
        any::<u64>(),
        text(),
        text(),
        any::<u64>(),
    )
        .prop_map(
            |(
                counts,
                solutions,
                (total, burnside),
                nodes,
                worker,
                lease,
                identity,
                kernel,
                ms,
            )| {
                StoredResult {
                    counts,
                    solutions,
                    tally: Tally { total, burnside },
                    nodes,
                    worker,
                    lease,
                    identity,
                    kernel,
                    received_unix_ms: ms,
                }
            },
        )
}

fn job_state() -> impl Strategy<Value = JobState> {
    prop_oneof![
        Just(JobState::Pending),
        (text(), any::<u64>(), proptest::option::of(any::<u64>())).prop_map(
            |(worker, deadline_unix_ms, lease)| JobState::Leased {
                worker,
                deadline_unix_ms,
                lease,
            }
        ),
        stored_result().prop_map(|r| JobState::Done(Box::new(r))),
    ]
}

fn job_record() -> impl Strategy<Value = JobRecord> {
    (job_state(), any::<u32>())
        .prop_map(|(state, attempts)| JobRecord { state, attempts })
}

fn duplicate() -> impl Strategy<Value = Duplicate> {
    (any::<bool>(), stored_result(), any::<bool>()).prop_map(
        |(conflict, result, after_completion)| Duplicate {
            kind: if conflict {
                DuplicateKind::Conflict
            } else {
                DuplicateKind::Confirmation
            },
            result,
            after_completion,
        },
    )
}

fn loss() -> impl Strategy<Value = StoredLoss> {
    (text(), any::<bool>(), vec(text(), 0..3)).prop_map(
        |(identity, by_trusted, by_credentials)| StoredLoss {
            identity,
            by_trusted,
            by_credentials,
        },
    )
}

fn summary() -> impl Strategy<Value = RunSummary> {
    (count(), count(), any::<[u64; 5]>(), any::<Option<u64>>()).prop_map(
        |(total, unique, v, unchecked)| RunSummary {
            total,
            unique,
            elapsed_ms: v[0],
            jobs: v[1],
            confirmations: v[2],
            conflicts: v[3],
            finished_unix_ms: v[4],
            unchecked,
        },
    )
}

fn manifest() -> impl Strategy<Value = Manifest> {
    (
        1u64..=32,
        any::<u32>(),
        (0u8..=3, 0u8..=8),
        any::<bool>(),
        any::<u64>(),
        count(),
        any::<u64>(),
        text(),
        text(),
    )
        .prop_map(
            |(
                n,
                split_version,
                (ring, extra),
                solutions,
                jobs,
                total_work,
                created,
                pv,
                id,
            )| {
                Manifest {
                    key: RunKey {
                        board: Board::new(n).expect("1..=32"),
                        split_version,
                        spec: SplitSpec::new(ring, extra).expect("in range"),
                        solutions,
                    },
                    program_version: pv,
                    run_id: id,
                    jobs,
                    total_work,
                    created_unix_ms: created,
                }
            },
        )
}

/// A board and up to a chunk of jobs on it, each of 1 to 3 prefixes of
/// arbitrary bytes (the store does not interpret them).
fn job_chunk() -> impl Strategy<Value = (Board, Vec<NewJob>)> {
    (1u64..=32).prop_flat_map(|n| {
        let board = Board::new(n).expect("1..=32");
        let job = (1usize..=3)
            .prop_flat_map(move |k| vec(any::<u8>(), k * n as usize))
            .prop_flat_map(|rows| (Just(rows), any::<u64>()))
            .prop_map(|(rows, work)| NewJob { rows, work });
        (Just(board), vec(job, 1..=crate::JOBS_PER_CHUNK as usize))
    })
}

/// The records of one chunk: distinct indexes below `RECORDS_PER_CHUNK`,
/// in order, each with a record.
fn record_chunk() -> impl Strategy<Value = BTreeMap<u8, JobRecord>> {
    proptest::collection::btree_map(
        0u8..crate::RECORDS_PER_CHUNK as u8,
        job_record(),
        1..5,
    )
}

/// Arbitrary bytes, and valid encodings with a few bytes overwritten and a
/// random length (which reach deeper into a decoder than noise does), either
/// as they are (so a sealed value fails its checksum) or sealed again after
/// the damage (what a faulty program could write, which reaches the fields
/// behind the checksum).
fn mangled(valid: impl Strategy<Value = Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    let damage = vec((any::<prop::sample::Index>(), any::<u8>()), 0..4);
    prop_oneof![
        vec(any::<u8>(), 0..256),
        (valid, damage, any::<prop::sample::Index>(), any::<bool>()).prop_map(
            |(mut bytes, edits, cut, reseal)| {
                if reseal {
                    bytes.truncate(bytes.len().saturating_sub(4));
                }
                if !bytes.is_empty() {
                    for (at, b) in edits {
                        let i = at.index(bytes.len());
                        bytes[i] = b;
                    }
                    let keep = cut.index(bytes.len() + 1);
                    if keep > bytes.len() / 2 {
                        bytes.truncate(keep);
                    }
                }
                if reseal {
                    crate::codec::seal(&mut bytes);
                }
                bytes
            }
        ),
    ]
}

// ----- the version-1 formats, now refused -----------------------------------------

/// A result as version 1 wrote it: no identity, kernel or receipt time.
fn put_result_v1(out: &mut Vec<u8>, r: &StoredResult) {
    put_varint(out, r.counts.len() as u128);
    for c in &r.counts {
        put_varint(out, c.count);
        put_varint(out, c.fixed180);
        put_varint(out, c.fixed90);
    }
    put_varint(out, r.solutions.into());
    put_varint(out, r.tally.total);
    put_varint(out, r.tally.burnside);
    put_varint(out, r.nodes.into());
    out.extend_from_slice(&r.lease.to_be_bytes());
    put_str(out, &r.worker);
}

fn encode_record_v1(rec: &JobRecord) -> Vec<u8> {
    let tag = match rec.state {
        JobState::Pending => 0,
        JobState::Leased { .. } => 1,
        JobState::Done(_) => 2,
    };
    let mut out = vec![1, tag];
    out.extend_from_slice(&rec.attempts.to_be_bytes());
    match &rec.state {
        JobState::Pending => {}
        // Version 1 kept no lease id.
        JobState::Leased {
            worker,
            deadline_unix_ms,
            ..
        } => {
            out.extend_from_slice(&deadline_unix_ms.to_be_bytes());
            put_str(&mut out, worker);
        }
        JobState::Done(r) => put_result_v1(&mut out, r),
    }
    out
}

fn encode_duplicate_v1(d: &Duplicate) -> Vec<u8> {
    let mut out = vec![1, u8::from(d.kind == DuplicateKind::Conflict)];
    put_result_v1(&mut out, &d.result);
    out
}

// ----- decoders of whole stored values ------------------------------------------

/// A job chunk and every job in it, as `Store::job` reads them.
fn decode_jobs(board: Board, bytes: &[u8]) -> crate::Result<Vec<(u64, Vec<u8>)>> {
    let chunk = Chunk::decode(bytes)?;
    (0..chunk.len())
        .map(|i| {
            let job = chunk.job(board, i)?;
            // `Store::job_works` reads the work alone; it must agree.
            assert_eq!(chunk.work(i)?, job.work(), "job {i}");
            Ok((job.work(), job.prefixes().flatten().copied().collect()))
        })
        .collect()
}

/// A record chunk and every record in it, as `Store::job_records` reads them.
fn decode_records(bytes: &[u8]) -> crate::Result<Vec<(u8, JobRecord)>> {
    decode_record_chunk(bytes)?
        .into_iter()
        .map(|(i, b)| Ok((i, JobRecord::decode(b)?)))
        .collect()
}

fn encode_records(records: &BTreeMap<u8, JobRecord>) -> Vec<u8> {
    let encoded: Vec<(u8, Vec<u8>)> =
        records.iter().map(|(&i, r)| (i, r.encode())).collect();
    let refs: Vec<(u8, &[u8])> = encoded.iter().map(|(i, b)| (*i, &b[..])).collect();
    encode_record_chunk(&refs)
}

/// Asserts that every single-bit flip and every truncation of `bytes` is
/// refused by `decode` as corrupt.
fn refuses_damage<T: std::fmt::Debug>(
    bytes: &[u8],
    decode: impl Fn(&[u8]) -> crate::Result<T>,
) -> Result<(), TestCaseError> {
    let mut bad = bytes.to_vec();
    for bit in 0..bytes.len() * 8 {
        bad[bit / 8] ^= 1 << (bit % 8);
        match decode(&bad) {
            Err(Error::Corrupt { .. }) => {}
            other => {
                return Err(TestCaseError::fail(format!(
                    "flipping bit {bit} of {} bytes gave {other:?}",
                    bytes.len()
                )));
            }
        }
        bad[bit / 8] ^= 1 << (bit % 8);
    }
    for len in 0..bytes.len() {
        match decode(&bytes[..len]) {
            Err(Error::Corrupt { .. }) => {}
            other => {
                return Err(TestCaseError::fail(format!(
                    "truncating {} bytes to {len} gave {other:?}",
                    bytes.len()
                )));
            }
        }
    }
    Ok(())
}

// ----- (a) round trips ------------------------------------------------------------

proptest! {
    // The decoders are pure and fast: proptest's default 256 cases.

    #[test]
    fn varints_and_strings_round_trip(v in count(), s in text()) {
        let mut out = vec![];
        put_varint(&mut out, v);
        put_str(&mut out, &s);
        let mut r = Reader::new("t", &out);
        prop_assert_eq!(r.varint()?, v);
        prop_assert_eq!(r.str()?, s);
        r.end()?;
    }

    #[test]
    fn results_round_trip(r in stored_result()) {
        prop_assert_eq!(StoredResult::decode(&r.encode())?, r);
    }

    #[test]
    fn records_round_trip_and_unsealed_ones_are_refused(rec in job_record()) {
        prop_assert_eq!(&JobRecord::decode(&rec.encode())?, &rec);
        let err = JobRecord::decode(&encode_record_v1(&rec)).unwrap_err();
        prop_assert!(is_unsealed(&err), "{:?}", err);
    }

    #[test]
    fn losses_round_trip(l in loss()) {
        prop_assert_eq!(StoredLoss::decode(&l.encode())?, l);
    }

    #[test]
    fn duplicates_round_trip_and_unsealed_ones_are_refused(d in duplicate()) {
        prop_assert_eq!(&Duplicate::decode(&d.encode())?, &d);
        let err = Duplicate::decode(&encode_duplicate_v1(&d)).unwrap_err();
        prop_assert!(is_unsealed(&err), "{:?}", err);
    }

    #[test]
    fn summaries_round_trip(s in summary()) {
        prop_assert_eq!(RunSummary::decode(&s.encode())?, s);
    }

    #[test]
    fn manifests_round_trip(m in manifest()) {
        prop_assert_eq!(Manifest::decode(&m.encode())?, m);
    }

    #[test]
    fn job_chunks_round_trip((board, jobs) in job_chunk()) {
        let decoded = decode_jobs(board, &encode_chunk(&jobs))?;
        let want: Vec<(u64, Vec<u8>)> = jobs.iter().map(|j| (j.work, j.rows.clone())).collect();
        prop_assert_eq!(decoded, want);
    }

    #[test]
    fn record_chunks_round_trip_and_keep_done_records(
        old in record_chunk(),
        updates in vec((0u8..crate::RECORDS_PER_CHUNK as u8, job_record(), any::<bool>()), 0..6),
    ) {
        let bytes = encode_records(&old);
        let decoded = decode_records(&bytes)?;
        prop_assert_eq!(&decoded, &old.clone().into_iter().collect::<Vec<_>>());
        // Updates follow the rule of `update_record_chunk`: a done record is
        // replaced only by an update that says so.
        let mut want = old;
        let encoded: Vec<(u8, Vec<u8>, bool)> =
            updates.iter().map(|(i, r, replace)| (*i, r.encode(), *replace)).collect();
        for (i, rec, replace) in updates {
            let done = matches!(want.get(&i), Some(JobRecord { state: JobState::Done(_), .. }));
            if replace || !done {
                want.insert(i, rec);
            }
        }
        let (updated, states) = update_record_chunk(Some(&bytes), &encoded)?;
        // The states given for the index are the records' kinds.
        let kinds: crate::states::ChunkStates = want.iter().fold(0, |acc, (&i, r)| {
            let bits = match r.state {
                JobState::Pending => 0,
                JobState::Leased { .. } => 1,
                JobState::Done(_) => 2,
            };
            acc | (bits << (2 * u32::from(i)))
        });
        prop_assert_eq!(states, kinds);
        prop_assert_eq!(decode_records(&updated)?, want.into_iter().collect::<Vec<_>>());
    }

    #[test]
    fn solution_keys_round_trip(job in any::<u64>(), sub in any::<u32>(), seq in any::<u32>(),
                                rows in vec(any::<u8>(), 0..64)) {
        let key = crate::solution_key(crate::JobId(job), sub, seq);
        let batch = crate::decode_solution(Ok((key[..].into(), rows[..].into())))?;
        prop_assert_eq!(
            batch,
            crate::SolutionBatch { job: crate::JobId(job), sub, seq, rows }
        );
    }
}

// ----- (b) arbitrary bytes --------------------------------------------------------

proptest! {
    #[test]
    fn arbitrary_results_and_duplicates_decode_sanely(
        bytes in mangled(prop_oneof![
            stored_result().prop_map(|r| r.encode()),
            duplicate().prop_map(|d| d.encode()),
            duplicate().prop_map(|d| encode_duplicate_v1(&d)),
        ])
    ) {
        decodes_sanely(&bytes, StoredResult::decode)?;
        decodes_sanely(&bytes, Duplicate::decode)?;
    }

    #[test]
    fn arbitrary_losses_decode_sanely(
        bytes in mangled(loss().prop_map(|l| l.encode()))
    ) {
        decodes_sanely(&bytes, StoredLoss::decode)?;
    }

    #[test]
    fn arbitrary_records_decode_sanely(
        bytes in mangled(prop_oneof![
            job_record().prop_map(|r| r.encode()),
            job_record().prop_map(|r| encode_record_v1(&r)),
        ])
    ) {
        decodes_sanely(&bytes, JobRecord::decode)?;
    }

    #[test]
    fn arbitrary_record_chunks_decode_and_update_sanely(
        bytes in mangled(record_chunk().prop_map(|r| encode_records(&r))),
        updates in vec((any::<u8>(), vec(any::<u8>(), 0..8), any::<bool>()), 0..4),
    ) {
        let indexes = |b: &[u8]| {
            decode_record_chunk(b).map(|r| r.iter().map(|r| r.0).collect::<Vec<u8>>())
        };
        if let Some(indexes) = decodes_sanely(&bytes, indexes)? {
            // Every index that decodes names a job of the chunk, once.
            prop_assert!(
                indexes.windows(2).all(|w| w[0] < w[1])
                    && indexes.iter().all(|&i| u64::from(i) < crate::RECORDS_PER_CHUNK),
                "indexes {:?}", indexes
            );
        }
        decodes_sanely(&bytes, decode_records)?;
        decodes_sanely(&bytes, |b| update_record_chunk(Some(b), &updates).map(|(v, _)| v))?;
    }

    #[test]
    fn arbitrary_job_chunks_decode_sanely(
        n in 1u64..=32,
        bytes in mangled(job_chunk().prop_map(|(_, jobs)| encode_chunk(&jobs))),
    ) {
        let board = Board::new(n).expect("1..=32");
        decodes_sanely(&bytes, |b| decode_jobs(board, b))?;
        // `work` alone, as `Store::job_works` reads it, for every index.
        if let Ok(chunk) = Chunk::decode(&bytes) {
            for i in 0..=chunk.len() {
                let _ = chunk.work(i);
            }
        }
    }

    #[test]
    fn arbitrary_summaries_and_manifests_decode_sanely(
        bytes in mangled(prop_oneof![
            summary().prop_map(|s| s.encode()),
            manifest().prop_map(|m| m.encode()),
        ])
    ) {
        decodes_sanely(&bytes, RunSummary::decode)?;
        decodes_sanely(&bytes, Manifest::decode)?;
        decodes_sanely(&bytes, |b| crate::codec::key_u64("t", b))?;
    }

    #[test]
    fn arbitrary_solution_keys_decode_only_at_their_length(key in vec(any::<u8>(), 0..24)) {
        let got = crate::decode_solution(Ok((key[..].into(), [1u8, 2][..].into())));
        match got {
            Ok(b) => {
                prop_assert_eq!(key.len(), 16);
                prop_assert_eq!(crate::solution_key(b.job, b.sub, b.seq), &key[..]);
            }
            Err(e) => {
                prop_assert!(key.len() != 16);
                prop_assert!(matches!(e, Error::Corrupt { tree: "solutions", .. }), "{e:?}");
            }
        }
    }
}

// ----- (c) damage to sealed values ------------------------------------------------

proptest! {
    // Each case decodes every bit flip and every truncation of its value: a
    // few thousand decodes, so fewer cases than the default.
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn damaged_records_are_refused(rec in job_record()) {
        refuses_damage(&rec.encode(), JobRecord::decode)?;
    }

    #[test]
    fn damaged_duplicates_are_refused(d in duplicate()) {
        refuses_damage(&d.encode(), Duplicate::decode)?;
    }

    #[test]
    fn damaged_losses_are_refused(l in loss()) {
        refuses_damage(&l.encode(), StoredLoss::decode)?;
    }

    #[test]
    fn damaged_record_chunks_are_refused(records in record_chunk()) {
        refuses_damage(&encode_records(&records), decode_records)?;
    }

    #[test]
    fn damaged_job_chunks_are_refused((board, jobs) in job_chunk()) {
        let bytes = encode_chunk(&jobs[..jobs.len().min(4)]);
        refuses_damage(&bytes, |b| decode_jobs(board, b))?;
    }

    #[test]
    fn damaged_summaries_are_refused(s in summary()) {
        refuses_damage(&s.encode(), RunSummary::decode)?;
    }

    #[test]
    fn damaged_manifests_are_refused(m in manifest()) {
        refuses_damage(&m.encode(), Manifest::decode)?;
    }
}

/// A value damaged in its checksummed body reports exactly that: a checksum
/// mismatch, which says "damaged on disk", not a misleading field error.
#[test]
fn a_damaged_body_reads_as_a_checksum_mismatch() {
    let rec = JobRecord {
        state: JobState::Done(Box::default()),
        attempts: 3,
    };
    let mut bytes = rec.encode();
    bytes[3] ^= 4;
    assert!(
        matches!(
            JobRecord::decode(&bytes),
            Err(Error::Corrupt {
                what: Corruption::Checksum,
                ..
            })
        ),
        "{:?}",
        JobRecord::decode(&bytes)
    );
}

// ----- regressions: what the properties found -------------------------------------

/// `bytes` with its checksum removed and its version byte set to 1: the
/// same value as version 1 wrote it (version 2 of these formats only added
/// the checksum).
fn as_version_1(bytes: &[u8]) -> Vec<u8> {
    let mut v1 = bytes[..bytes.len() - 4].to_vec();
    v1[0] = 1;
    v1
}

/// A done record whose result is worth something.
fn done_record() -> JobRecord {
    JobRecord {
        state: JobState::Done(Box::new(StoredResult {
            counts: vec![SubCounts {
                count: 92,
                ..SubCounts::default()
            }],
            tally: Tally {
                total: 92,
                burnside: 96,
            },
            worker: "w1.1".into(),
            identity: "w@127.0.0.1".into(),
            ..StoredResult::default()
        })),
        attempts: 1,
    }
}

/// Found by `damaged_record_chunks_are_refused`: each record is sealed, but
/// its index in the chunk was not, so one flipped bit moved a job's result to
/// another job (index 5 became 4) and the run counted it for the wrong
/// sub-problem.
#[test]
fn a_flipped_bit_in_a_record_index_is_refused() {
    let records = BTreeMap::from([(5u8, done_record())]);
    let bytes = encode_records(&records);
    assert_eq!(decode_records(&bytes).unwrap(), vec![(5, done_record())]);
    let mut moved = bytes.clone();
    assert_eq!(moved[2], 5, "the index byte");
    moved[2] ^= 1;
    assert!(matches!(
        decode_records(&moved),
        Err(Error::Corrupt {
            tree: "records",
            what: Corruption::Checksum
        })
    ));
}

/// Found by `arbitrary_record_chunks_decode_and_update_sanely`: a chunk could
/// hold an index of 16 or more, which `Store::job_records` reads as a record
/// of the next chunk's job, or the same index twice. Refused even where the
/// checksum holds (a chunk written by a faulty program).
#[test]
fn a_record_index_outside_its_chunk_or_repeated_is_refused() {
    let record = done_record().encode();
    for indexes in [&[16u8][..], &[255], &[3, 3], &[4, 2]] {
        let entries: Vec<(u8, &[u8])> =
            indexes.iter().map(|&i| (i, &record[..])).collect();
        let bytes = encode_record_chunk(&entries);
        let err = decode_record_chunk(&bytes).unwrap_err();
        assert!(
            matches!(
                err,
                Error::Corrupt {
                    what: Corruption::Field {
                        field: "record index"
                    },
                    ..
                }
            ),
            "{indexes:?}: {err:?}"
        );
        // Version 1 chunks, which have no checksum, are held to the same rule.
        assert!(
            decode_record_chunk(&as_version_1(&bytes)).is_err(),
            "{indexes:?}"
        );
    }
}

/// Found by `arbitrary_results_and_duplicates_decode_sanely`: a result's
/// count of entries reserved up to 65536 entries (3 MiB) before reading
/// them, so a damaged length of a few bytes reserved megabytes. Now it
/// reserves no more than the rest of the value can hold.
#[test]
fn a_damaged_count_length_reserves_no_memory() {
    // A duplicate whose result claims 2^20 entries, in 30 bytes.
    let mut bytes = vec![2, 0];
    put_varint(&mut bytes, 1 << 20);
    bytes.extend_from_slice(&[0; 24]);
    crate::codec::seal(&mut bytes);
    let (got, allocated) = allocation_of(|| Duplicate::decode(&bytes));
    assert!(matches!(got, Err(Error::Corrupt { .. })), "{got:?}");
    assert!(
        allocated <= allocation_bound(bytes.len()),
        "{allocated} bytes"
    );
}

/// Found by `damaged_job_chunks_are_refused`: job chunks had no checksum, and
/// a flipped bit in a prefix can turn one valid sub-problem into another, so
/// the run silently counted one sub-problem twice and another not at all.
#[test]
fn a_flipped_bit_in_a_job_prefix_is_refused() {
    let board = Board::new(8).unwrap();
    let spec = SplitSpec::border(1).unwrap();
    let prefixes: Vec<Vec<u8>> = nq_core::split::split(board, spec)
        .iter()
        .map(|s| s.prefix().rows().to_vec())
        .collect();
    // A sub-problem that one flipped bit turns into another one of the split.
    let (rows, byte, bit) = prefixes
        .iter()
        .find_map(|p| {
            (0..p.len() * 8).find_map(|b| {
                let mut q = p.clone();
                q[b / 8] ^= 1 << (b % 8);
                (q != *p && prefixes.contains(&q)).then(|| (p.clone(), b / 8, b % 8))
            })
        })
        .expect("N = 8 has sub-problems one bit apart");
    let jobs = [NewJob { rows, work: 10 }];
    let bytes = encode_chunk(&jobs);
    assert_eq!(decode_jobs(board, &bytes).unwrap()[0].1, jobs[0].rows);
    // version (1), count (2), one end offset (4), work (8), then the rows.
    let mut other = bytes.clone();
    other[1 + 2 + 4 + 8 + byte] ^= 1 << bit;
    assert!(matches!(
        decode_jobs(board, &other),
        Err(Error::Corrupt {
            tree: "jobs",
            what: Corruption::Checksum
        })
    ));
}

/// Found by `damaged_summaries_are_refused`: a finished run answers from its
/// summary alone, and the summary had no checksum, so a flipped bit in the
/// stored total was printed as the run's result.
#[test]
fn a_flipped_bit_in_the_summary_total_is_refused() {
    let s = RunSummary {
        total: 14_772_512,
        unique: 1_846_955,
        elapsed_ms: 1,
        jobs: 2,
        confirmations: 0,
        conflicts: 0,
        finished_unix_ms: 3,
        unchecked: Some(0),
    };
    let mut bytes = s.encode();
    bytes[1] ^= 1;
    assert!(matches!(
        RunSummary::decode(&bytes),
        Err(Error::Corrupt {
            tree: "meta",
            what: Corruption::Checksum
        })
    ));
}

/// Found by `damaged_manifests_are_refused`: a flipped bit in the manifest was
/// read as another run (here N = 9 instead of 8), and the directory was then
/// refused as "a run of N=9", which sends its owner looking for the wrong
/// problem.
#[test]
fn a_flipped_bit_in_the_manifest_is_refused() {
    let m = Manifest {
        key: RunKey {
            board: Board::new(8).unwrap(),
            split_version: 1,
            spec: SplitSpec::border(1).unwrap(),
            solutions: false,
        },
        program_version: "0.1.0".into(),
        run_id: "8-abc".into(),
        jobs: 40,
        total_work: 1234,
        created_unix_ms: 5,
    };
    let mut bytes = m.encode();
    bytes[1] ^= 1;
    assert!(matches!(
        Manifest::decode(&bytes),
        Err(Error::Corrupt {
            tree: "meta",
            what: Corruption::Checksum
        })
    ));
}

/// True for the refusal of a value from before values were sealed.
fn is_unsealed(err: &Error) -> bool {
    matches!(
        err,
        Error::Corrupt {
            what: Corruption::Unsealed { found: 1 },
            ..
        }
    )
}

/// What version 1 wrote had no checksum, so nothing can tell an intact
/// value from a damaged or edited one: every format refuses it, naming the
/// problem (see issue 18: such values skipped the check altogether).
#[test]
fn version_1_values_are_refused() {
    let board = Board::new(4).unwrap();
    let jobs = [NewJob {
        rows: vec![1, 3, 0, 2],
        work: 9,
    }];
    let v1 = as_version_1(&encode_chunk(&jobs));
    assert!(is_unsealed(&decode_jobs(board, &v1).unwrap_err()));

    let records = BTreeMap::from([(2u8, done_record()), (7, JobRecord::default())]);
    let v1 = as_version_1(&encode_records(&records));
    assert!(is_unsealed(&decode_records(&v1).unwrap_err()));

    let s = RunSummary {
        total: 92,
        unique: 12,
        elapsed_ms: 1,
        jobs: 2,
        confirmations: 3,
        conflicts: 4,
        finished_unix_ms: 5,
        unchecked: Some(0),
    };
    let err = RunSummary::decode(&as_version_1(&s.encode())).unwrap_err();
    assert!(is_unsealed(&err), "{err:?}");
    assert!(
        err.to_string().contains("before values were sealed"),
        "{err}"
    );

    let m = Manifest {
        key: RunKey {
            board,
            split_version: 1,
            spec: SplitSpec::new(1, 0).unwrap(),
            solutions: true,
        },
        program_version: "0.1.0".into(),
        run_id: "4-x".into(),
        jobs: 1,
        total_work: 9,
        created_unix_ms: 6,
    };
    assert!(is_unsealed(
        &Manifest::decode(&as_version_1(&m.encode())).unwrap_err()
    ));
}
