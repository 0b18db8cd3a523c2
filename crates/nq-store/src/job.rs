//! Jobs: their immutable definition and their mutable state.

use std::fmt;

use nq_core::Board;

use crate::codec::{Reader, put_str};
use crate::error::{Corruption, Result};
use crate::result::StoredResult;

/// Identifies a job within a run: jobs are numbered `0..jobs` in the order of
/// their sub-problems' prefixes.
///
/// A `JobId` is not a plain integer, so it cannot be confused with a count or
/// another kind of id:
///
/// ```compile_fail
/// use nq_store::JobId;
/// fn wants_job(_: JobId) {}
/// wants_job(7u64); // a bare u64 is not a JobId
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JobId(pub u64);

impl JobId {
    /// The big-endian key of this job in every tree keyed by job.
    pub fn key(self) -> [u8; 8] {
        self.0.to_be_bytes()
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A job as created: consecutive sub-problems of the split, solved and
/// reported together.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewJob {
    /// The sub-problems' prefixes (`Prefix::rows()`, N bytes each), concatenated.
    pub rows: Vec<u8>,
    /// Sum of the sub-problems' `SubProblem::estimate()`.
    pub work: u64,
}

/// A job as stored. Immutable once the run is created.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredJob {
    board: Board,
    rows: Vec<u8>,
    work: u64,
}

/// Jobs per value of the `jobs` tree. sled spends about 100 bytes of memory
/// per entry whatever its size, so a million one-entry jobs would cost
/// 100 MB; chunks of 64 cost 1.6 MB, and a chunk (a few KB) is still cheap to
/// read for one job.
pub const JOBS_PER_CHUNK: u64 = 64;

/// Format of job chunks. Version 2 seals each chunk with a CRC-32: a flipped
/// bit in a prefix can turn one valid sub-problem into another, which no
/// check of the prefix would notice, so the jobs of a run would silently
/// change. Version 1 (unsealed) is refused.
const CHUNK_VERSION: u8 = 2;

impl StoredJob {
    /// The board of the run.
    pub fn board(&self) -> Board {
        self.board
    }

    /// Estimated work of the job.
    pub fn work(&self) -> u64 {
        self.work
    }

    /// Number of sub-problems.
    pub fn len(&self) -> usize {
        self.rows.len() / self.board.len()
    }

    /// True when the job has no sub-problem (never the case in a stored run).
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The prefixes of the sub-problems, N bytes each (`Prefix::rows()`), in
    /// order. They still have to be validated with `Prefix::from_rows` and
    /// `SubProblem::from_prefix` before use.
    pub fn prefixes(&self) -> impl ExactSizeIterator<Item = &[u8]> + '_ {
        self.rows.chunks_exact(self.board.len())
    }
}

/// The chunk (key of the `jobs` tree) holding `job`, and the job's index in it.
pub(crate) fn chunk_of(job: JobId) -> (u64, usize) {
    (job.0 / JOBS_PER_CHUNK, (job.0 % JOBS_PER_CHUNK) as usize)
}

/// Encodes up to [`JOBS_PER_CHUNK`] consecutive jobs as one value:
/// version, job count (2), end offsets (4 each), then per job its work (8) and
/// prefixes, then the CRC-32 of all that.
pub(crate) fn encode_chunk(jobs: &[NewJob]) -> Vec<u8> {
    let body: usize = jobs.iter().map(|j| 8 + j.rows.len()).sum();
    let mut out = Vec::with_capacity(7 + 4 * jobs.len() + body);
    out.push(CHUNK_VERSION);
    out.extend_from_slice(&(jobs.len() as u16).to_be_bytes());
    let mut end = 0u32;
    for j in jobs {
        end += 8 + j.rows.len() as u32;
        out.extend_from_slice(&end.to_be_bytes());
    }
    for j in jobs {
        out.extend_from_slice(&j.work.to_be_bytes());
        out.extend_from_slice(&j.rows);
    }
    crate::codec::seal(&mut out);
    out
}

/// A decoded view of one chunk.
pub(crate) struct Chunk<'a> {
    ends: &'a [u8],
    body: &'a [u8],
}

impl<'a> Chunk<'a> {
    pub(crate) fn decode(bytes: &'a [u8]) -> Result<Chunk<'a>> {
        let (_, mut r) = crate::codec::open("jobs", bytes, 2, CHUNK_VERSION)?;
        let count = u16::from_be_bytes(r.take(2)?.try_into().expect("took 2 bytes"));
        let ends = r.take(4 * usize::from(count))?;
        let body = r.rest();
        let chunk = Chunk { ends, body };
        if chunk.end(usize::from(count)) != Some(body.len()) {
            return Err(Reader::new("jobs", &[]).corrupt(Corruption::Field {
                field: "chunk offsets",
            }));
        }
        Ok(chunk)
    }

    pub(crate) fn len(&self) -> usize {
        self.ends.len() / 4
    }

    /// The end offset of job `i - 1`, i.e. the start of job `i`.
    fn end(&self, i: usize) -> Option<usize> {
        if i == 0 {
            return Some(0);
        }
        let b = self.ends.get(4 * (i - 1)..4 * i)?;
        Some(u32::from_be_bytes(b.try_into().expect("4 bytes")) as usize)
    }

    /// Job `i` of the chunk.
    pub(crate) fn job(&self, board: Board, i: usize) -> Result<StoredJob> {
        let corrupt =
            || Reader::new("jobs", &[]).corrupt(Corruption::Field { field: "job" });
        let (start, end) = (
            self.end(i).ok_or_else(corrupt)?,
            self.end(i + 1).ok_or_else(corrupt)?,
        );
        let bytes = self.body.get(start..end).ok_or_else(corrupt)?;
        let mut r = Reader::new("jobs", bytes);
        let work = r.u64()?;
        let rows = r.rest();
        if rows.is_empty() || !rows.len().is_multiple_of(board.len()) {
            return Err(corrupt());
        }
        Ok(StoredJob {
            board,
            rows: rows.to_vec(),
            work,
        })
    }

    /// The work of job `i` of the chunk.
    pub(crate) fn work(&self, i: usize) -> Result<u64> {
        let start = self.end(i).unwrap_or(usize::MAX);
        let mut r = Reader::new("jobs", self.body.get(start..).unwrap_or(&[]));
        r.u64()
    }
}

/// Where a job stands.
///
/// ```text
///              lease granted                 first valid result, durable
///   Pending ─────────────────► Leased{worker, ─────────────────────────► Done{result}
///      ▲                         deadline}
///      │  deadline passed, worker  │
///      └──released it, or the ─────┘
///         coordinator restarted
/// ```
///
/// * Every grant increments the job's attempt count ([`JobRecord::attempts`]).
/// * A result may arrive for a job in any state (a late report after its lease
///   expired is still a valid result): the first valid one makes the job
///   `Done`; later ones are compared with it and recorded as a confirmation or
///   a conflict. `Done` is final.
/// * sled holds the truth: on startup every `Leased` job goes back to
///   `Pending`, since no worker holds a lease of a previous session.
/// * The deadline is wall-clock time (milliseconds since the Unix epoch),
///   stored for inspection only; the coordinator enforces leases with its own
///   monotonic clock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobState {
    /// Waiting for a worker.
    Pending,
    /// Handed to a worker until the deadline.
    Leased {
        /// The worker's id.
        worker: String,
        /// Deadline, milliseconds since the Unix epoch.
        deadline_unix_ms: u64,
        /// The lease's id, so that a restarted coordinator can admit the
        /// report under it (none in records written before it was kept).
        lease: Option<u64>,
    },
    /// A valid result is stored: the first one received. Final.
    Done(Box<StoredResult>),
}

/// The mutable state of one job, stored under its id in the `records` tree.
/// A job with no record is `Pending` with no attempts, so creating a run
/// writes no records. The result lives in the record, so a finished run has
/// one entry per job (sled's memory grows with its number of entries).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobRecord {
    /// Where the job stands.
    pub state: JobState,
    /// How many times the job was leased.
    pub attempts: u32,
}

impl Default for JobRecord {
    fn default() -> JobRecord {
        JobRecord {
            state: JobState::Pending,
            attempts: 0,
        }
    }
}

/// Format of job records. Version 2 seals every record with a CRC-32 and
/// stores results in their version 2 form; version 1 (unsealed) is refused.
const RECORD_VERSION: u8 = 2;

/// Job records per value of the `records` tree. Like jobs, records are
/// chunked to keep sled's entries few; a chunk of 16 stays under a kilobyte,
/// so rewriting one for each update costs little.
pub const RECORDS_PER_CHUNK: u64 = 16;

/// Format of record chunks. Version 2 seals each chunk with a CRC-32 and
/// refuses indexes out of order or beyond the chunk: each record is sealed
/// on its own, but its index is not part of it, so in version 1 a flipped bit
/// in an index moved a result to another job (found by the property tests in
/// `fuzz`). Version 1 (unsealed) is refused.
const RECORD_CHUNK_VERSION: u8 = 2;

/// The chunk (key of the `records` tree) holding `job`'s record, and the
/// job's index in it.
pub(crate) fn record_chunk_of(job: JobId) -> (u64, u8) {
    (job.0 / RECORDS_PER_CHUNK, (job.0 % RECORDS_PER_CHUNK) as u8)
}

/// The records of one chunk that are stored: `(index, encoded record)`,
/// in index order.
pub(crate) fn decode_record_chunk(bytes: &[u8]) -> Result<Vec<(u8, &[u8])>> {
    let (_, mut r) = crate::codec::open("records", bytes, 2, RECORD_CHUNK_VERSION)?;
    let count = r.u8()?;
    let mut out: Vec<(u8, &[u8])> = Vec::with_capacity(usize::from(count));
    for _ in 0..count {
        let index = r.u8()?;
        // Indexes are distinct, ascending, and name jobs of this chunk: an
        // index of 16 or more would be read as a job of the next chunk.
        if u64::from(index) >= RECORDS_PER_CHUNK
            || out.last().is_some_and(|l| l.0 >= index)
        {
            return Err(r.corrupt(Corruption::Field {
                field: "record index",
            }));
        }
        let len =
            usize::try_from(r.varint()?).map_err(|_| r.corrupt(Corruption::Truncated))?;
        out.push((index, r.take(len)?));
    }
    r.end()?;
    Ok(out)
}

/// Encodes the records of one chunk, `(index, encoded record)` in index
/// order: version, count, then per record its index, length and bytes, then
/// the CRC-32 of all that.
pub(crate) fn encode_record_chunk(records: &[(u8, &[u8])]) -> Vec<u8> {
    let body: usize = records.iter().map(|(_, b)| b.len() + 3).sum();
    let mut out = Vec::with_capacity(6 + body);
    out.push(RECORD_CHUNK_VERSION);
    out.push(records.len() as u8);
    for (index, bytes) in records {
        out.push(*index);
        crate::codec::put_varint(&mut out, bytes.len() as u128);
        out.extend_from_slice(bytes);
    }
    crate::codec::seal(&mut out);
    out
}

/// Applies `updates` (`(index, encoded record, replaces_result)`, in order)
/// to a chunk value. A `Done` record is replaced only by an update marked
/// `replaces_result` (verification chose another copy of the job's result);
/// any other update of a done job is dropped, so that a late lease record can
/// never undo a result. Returns the new value and the states of its jobs
/// (for the state index, see [`crate::states`]), or the decoding error of
/// the old one.
pub(crate) fn update_record_chunk(
    old: Option<&[u8]>,
    updates: &[(u8, Vec<u8>, bool)],
) -> Result<(Vec<u8>, crate::states::ChunkStates)> {
    let mut records: Vec<(u8, &[u8])> = match old {
        Some(bytes) => decode_record_chunk(bytes)?,
        None => Vec::new(),
    };
    for (index, bytes, replaces_result) in updates {
        match records.binary_search_by_key(index, |&(i, _)| i) {
            Ok(at) if !replaces_result && JobRecord::is_done_encoding(records[at].1) => {}
            Ok(at) => records[at].1 = bytes,
            Err(at) => records.insert(at, (*index, bytes)),
        }
    }
    Ok((
        encode_record_chunk(&records),
        crate::states::pack(records.iter().copied()),
    ))
}

impl JobRecord {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = vec![RECORD_VERSION];
        let tag = match self.state {
            JobState::Pending => 0,
            JobState::Leased { lease: None, .. } => 1,
            JobState::Done(_) => 2,
            JobState::Leased { lease: Some(_), .. } => 3,
        };
        out.push(tag);
        out.extend_from_slice(&self.attempts.to_be_bytes());
        match &self.state {
            JobState::Pending => {}
            JobState::Leased {
                worker,
                deadline_unix_ms,
                lease,
            } => {
                out.extend_from_slice(&deadline_unix_ms.to_be_bytes());
                put_str(&mut out, worker);
                if let Some(lease) = lease {
                    out.extend_from_slice(&lease.to_be_bytes());
                }
            }
            JobState::Done(result) => result.encode_into(&mut out),
        }
        crate::codec::seal(&mut out);
        out
    }

    /// True when `bytes` encodes a `Done` record (read without decoding it).
    pub(crate) fn is_done_encoding(bytes: &[u8]) -> bool {
        bytes.get(1) == Some(&2)
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<JobRecord> {
        let (version, mut r) = crate::codec::open("records", bytes, 2, RECORD_VERSION)?;
        let tag = r.u8()?;
        let attempts = r.u32()?;
        let state = match tag {
            0 => JobState::Pending,
            1 | 3 => {
                let deadline_unix_ms = r.u64()?;
                let worker = r.str()?;
                let lease = if tag == 3 { Some(r.u64()?) } else { None };
                JobState::Leased {
                    worker,
                    deadline_unix_ms,
                    lease,
                }
            }
            // Record version 1 held result version 1, and 2 holds 2.
            2 => JobState::Done(Box::new(StoredResult::decode_from(&mut r, version)?)),
            _ => return Err(r.corrupt(Corruption::Field { field: "job.state" })),
        };
        r.end()?;
        Ok(JobRecord { state, attempts })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip() {
        let result = StoredResult {
            counts: vec![nq_core::split::SubCounts::default(); 3],
            solutions: 0,
            tally: nq_core::split::Tally::default(),
            nodes: 1,
            worker: "w".into(),
            lease: 2,
            ..StoredResult::default()
        };
        for state in [
            JobState::Pending,
            JobState::Done(Box::new(result)),
            JobState::Leased {
                worker: "w1.3".into(),
                deadline_unix_ms: 12345,
                lease: None,
            },
            JobState::Leased {
                worker: "w1.3-00ff00ff".into(),
                deadline_unix_ms: 12345,
                lease: Some(u64::MAX - 7),
            },
        ] {
            let rec = JobRecord { state, attempts: 7 };
            assert_eq!(JobRecord::decode(&rec.encode()).unwrap(), rec);
        }
    }

    #[test]
    fn record_chunks_keep_done_records_final() {
        let leased = JobRecord {
            state: JobState::Leased {
                worker: "w".into(),
                deadline_unix_ms: 1,
                lease: None,
            },
            attempts: 1,
        };
        let done = JobRecord {
            state: JobState::Done(Box::new(StoredResult {
                counts: vec![],
                solutions: 0,
                tally: nq_core::split::Tally::default(),
                nodes: 0,
                worker: "w".into(),
                lease: 1,
                ..StoredResult::default()
            })),
            attempts: 1,
        };
        let (v, _) = update_record_chunk(
            None,
            &[(5, leased.encode(), false), (2, leased.encode(), false)],
        )
        .unwrap();
        let (v, states) = update_record_chunk(
            Some(&v),
            &[(5, done.encode(), false), (5, leased.encode(), false)],
        )
        .unwrap();
        // Job 2 leased, job 5 done (the later lease record was dropped).
        assert_eq!(states, (1 << 4) | (2 << 10));
        let records = decode_record_chunk(&v).unwrap();
        assert_eq!(records.iter().map(|r| r.0).collect::<Vec<_>>(), vec![2, 5]);
        assert_eq!(JobRecord::decode(records[1].1).unwrap(), done);
        assert_eq!(JobRecord::decode(records[0].1).unwrap(), leased);
        assert!(decode_record_chunk(&v[..v.len() - 1]).is_err());
    }

    #[test]
    fn chunks_hold_whole_prefixes() {
        let board = Board::new(4).unwrap();
        let jobs = [
            NewJob {
                rows: vec![1, 3, 0, 2, 2, 0, 3, 1],
                work: 9,
            },
            NewJob {
                rows: vec![0, 255, 255, 255],
                work: 4,
            },
        ];
        let bytes = encode_chunk(&jobs);
        let chunk = Chunk::decode(&bytes).unwrap();
        assert_eq!(chunk.len(), 2);
        let j = chunk.job(board, 0).unwrap();
        assert_eq!((j.len(), j.work()), (2, 9));
        assert_eq!(j.prefixes().nth(1).unwrap(), &[2, 0, 3, 1]);
        assert_eq!(chunk.work(1).unwrap(), 4);
        assert_eq!(chunk.job(board, 1).unwrap().len(), 1);
        assert!(chunk.job(board, 2).is_err());
        // A prefix of the wrong length is corrupt.
        let five = Board::new(5).unwrap();
        assert!(chunk.job(five, 0).is_err());
        assert!(Chunk::decode(&bytes[..bytes.len() - 1]).is_err());
    }
}
