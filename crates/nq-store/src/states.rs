//! The state index: what each job's record is (none or pending, leased, or
//! done), two bits per job, kept beside the `records` tree so that a
//! restarted coordinator learns which jobs are done without reading a single
//! result.
//!
//! A restart that reads every result before it serves takes minutes at
//! 10^8 jobs. With this index the coordinator serves at once: the jobs the
//! index names done are not handed out, and their stored copies are checked
//! and counted in the background. The index is a hint, never a count:
//! nothing in it is added to a total, and the background check compares it
//! with every record, so an index that is wrong (damaged, written by an older
//! build, cut by a crash between the two trees) costs time, never exactness.
//!
//! It is maintained by the one function that writes records
//! ([`crate::Store`]'s `update_records`): after a records chunk is updated,
//! the states of its 16 jobs are written into the index chunk that covers
//! them. Both writes happen under the same flush.
//!
//! Format of a chunk (key: the chunk number, u64 big-endian; a chunk covers
//! [`STATES_PER_CHUNK`] jobs): version (1), then two bits per job, job `i`
//! of the chunk in bits `2(i%4)..2(i%4)+2` of byte `i/4`, then a CRC-32.

use crate::codec;
use crate::error::{Corruption, Result};
use crate::job::{JobId, RECORDS_PER_CHUNK};

/// Jobs per chunk of the index: 1 KiB of states, so that 10^8 jobs are
/// 24,415 entries.
pub const STATES_PER_CHUNK: u64 = 4096;

/// Bytes of states per chunk.
const CHUNK_BYTES: usize = (STATES_PER_CHUNK / 4) as usize;

/// Format of index chunks.
const STATES_VERSION: u8 = 1;

/// What a job's record is, as the index says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordKind {
    /// No record, or a pending one.
    Pending,
    /// A lease record.
    Leased,
    /// A result.
    Done,
}

impl RecordKind {
    fn bits(self) -> u8 {
        match self {
            RecordKind::Pending => 0,
            RecordKind::Leased => 1,
            RecordKind::Done => 2,
        }
    }

    fn from_bits(bits: u8) -> RecordKind {
        match bits & 0b11 {
            0 => RecordKind::Pending,
            1 => RecordKind::Leased,
            // 3 is never written; read as done, the background check finds
            // out what the record really is.
            _ => RecordKind::Done,
        }
    }

    /// The kind of an encoded job record, from its state tag (the byte
    /// after its version), without decoding it.
    pub(crate) fn of_encoding(bytes: &[u8]) -> RecordKind {
        match bytes.get(1) {
            Some(1 | 3) => RecordKind::Leased,
            Some(2) => RecordKind::Done,
            _ => RecordKind::Pending,
        }
    }
}

/// The states of one records chunk's 16 jobs, two bits each, job `i` of the
/// chunk in bits `2i..2i+2`: a records chunk covers exactly 4 bytes of an
/// index chunk.
pub(crate) type ChunkStates = u32;

/// Packs the kinds of a records chunk's stored records (`(index, encoded
/// record)`); jobs with no record are pending.
pub(crate) fn pack<'a>(records: impl IntoIterator<Item = (u8, &'a [u8])>) -> ChunkStates {
    records.into_iter().fold(0, |acc, (index, bytes)| {
        // Indexes past the chunk are refused when the chunk is read; they
        // never reach the index.
        let bits = u32::from(RecordKind::of_encoding(bytes).bits());
        acc | bits.checked_shl(2 * u32::from(index)).unwrap_or(0)
    })
}

/// The index chunk (key of the `states` tree) that covers records chunk
/// `records_chunk`, and the byte where its 4 bytes start.
pub(crate) fn chunk_of_records(records_chunk: u64) -> (u64, usize) {
    let first = records_chunk * RECORDS_PER_CHUNK;
    (
        first / STATES_PER_CHUNK,
        ((first % STATES_PER_CHUNK) / 4) as usize,
    )
}

/// Writes `states` (records chunk by records chunk: `(byte offset, states)`)
/// into an index chunk value, `old` if there is one.
pub(crate) fn update_chunk(
    old: Option<&[u8]>,
    states: &[(usize, ChunkStates)],
) -> Result<Vec<u8>> {
    let mut bytes = match old {
        Some(old) => decode_chunk(old)?.to_vec(),
        None => vec![0; CHUNK_BYTES],
    };
    for &(at, s) in states {
        bytes[at..at + 4].copy_from_slice(&s.to_le_bytes());
    }
    let mut out = Vec::with_capacity(CHUNK_BYTES + 5);
    out.push(STATES_VERSION);
    out.extend_from_slice(&bytes);
    codec::seal(&mut out);
    Ok(out)
}

/// The states of an index chunk value, checked.
pub(crate) fn decode_chunk(bytes: &[u8]) -> Result<&[u8]> {
    let (_, mut r) = codec::open("states", bytes, 1, STATES_VERSION)?;
    let states = r.take(CHUNK_BYTES)?;
    r.end()?;
    Ok(states)
}

/// Calls `f` with every job of index chunk `chunk` whose state is not
/// pending, in job order.
pub(crate) fn visit(chunk: u64, states: &[u8], mut f: impl FnMut(JobId, RecordKind)) {
    let first = chunk * STATES_PER_CHUNK;
    for (i, &byte) in states.iter().enumerate() {
        if byte == 0 {
            continue;
        }
        for slot in 0..4 {
            let kind = RecordKind::from_bits(byte >> (2 * slot));
            if kind != RecordKind::Pending {
                f(JobId(first + 4 * i as u64 + slot), kind);
            }
        }
    }
}

/// Refuses a chunk key that is not 8 bytes.
pub(crate) fn chunk_key(key: &[u8]) -> Result<u64> {
    let bytes: [u8; 8] = key.try_into().map_err(|_| crate::Error::Corrupt {
        tree: "states",
        what: Corruption::Field { field: "key" },
    })?;
    Ok(u64::from_be_bytes(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_records_chunk_lands_on_its_own_four_bytes() {
        assert_eq!(chunk_of_records(0), (0, 0));
        assert_eq!(chunk_of_records(1), (0, 4));
        assert_eq!(chunk_of_records(255), (0, 1020));
        assert_eq!(chunk_of_records(256), (1, 0));
    }

    #[test]
    fn states_round_trip_through_a_chunk() {
        // Tag bytes as JobRecord::encode writes them: version, then state.
        let (pending, leased, done, leased_id) = ([2u8, 0], [2u8, 1], [2u8, 2], [2u8, 3]);
        let s = pack([
            (0, &pending[..]),
            (3, &leased[..]),
            (7, &done[..]),
            (15, &leased_id[..]),
        ]);
        let v = update_chunk(None, &[(4, s)]).unwrap();
        let mut seen = Vec::new();
        visit(2, decode_chunk(&v).unwrap(), |j, k| seen.push((j.0, k)));
        let base = 2 * STATES_PER_CHUNK + 16;
        assert_eq!(
            seen,
            vec![
                (base + 3, RecordKind::Leased),
                (base + 7, RecordKind::Done),
                (base + 15, RecordKind::Leased),
            ]
        );
        // Rewriting the same records chunk replaces its states.
        let v = update_chunk(Some(&v), &[(4, pack([(3, &done[..])]))]).unwrap();
        let mut seen = Vec::new();
        visit(2, decode_chunk(&v).unwrap(), |j, k| seen.push((j.0, k)));
        assert_eq!(seen, vec![(base + 3, RecordKind::Done)]);
        // A damaged chunk is refused.
        let mut bad = v.clone();
        bad[10] ^= 1;
        assert!(decode_chunk(&bad).is_err());
    }
}
