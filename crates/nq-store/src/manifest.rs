//! The run manifest: what a data directory was made for.

use std::fmt;

use nq_core::Board;
use nq_core::split::SplitSpec;

use crate::codec::{open, put_str, put_varint, seal};
use crate::error::{Corruption, Result};

/// The parameters that define a run: two runs with equal keys compute the same
/// jobs, so one may resume the other. Anything else (program version, job
/// count target, lease TTL) may change between sessions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunKey {
    /// The board.
    pub board: Board,
    /// `nq_core::split::SPLIT_VERSION` of the program that made the jobs.
    pub split_version: u32,
    /// The split of the board into sub-problems.
    pub spec: SplitSpec,
    /// Whether the run stores solutions.
    pub solutions: bool,
}

impl fmt::Display for RunKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "N={} with split v{} {}:{} and solutions {}",
            self.board.n(),
            self.split_version,
            self.spec.ring,
            self.spec.extra,
            if self.solutions { "on" } else { "off" }
        )
    }
}

/// Everything the store knows about its run, written once when the run is
/// created. Its presence marks a complete creation: jobs are written first and
/// the manifest last, so a crash during creation leaves no manifest and the
/// next start creates the run again from scratch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    /// The parameters that identify the run.
    pub key: RunKey,
    /// Version of the program that created the run (for the record only).
    pub program_version: String,
    /// Identifies the run across restarts (sent to workers).
    pub run_id: String,
    /// Number of jobs; job ids are `0..jobs`.
    pub jobs: u64,
    /// Sum of the estimated work of every job (`SubProblem::estimate` units).
    pub total_work: u128,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_unix_ms: u64,
}

/// Format of the manifest. Version 2 seals it with a CRC-32, so that a
/// damaged manifest is refused as damaged rather than read as another run.
/// Version 1 (unsealed) is refused.
const VERSION: u8 = 2;

impl Manifest {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = vec![VERSION, self.key.board.n()];
        out.extend_from_slice(&self.key.split_version.to_be_bytes());
        out.extend_from_slice(&[
            self.key.spec.ring,
            self.key.spec.extra,
            u8::from(self.key.solutions),
        ]);
        out.extend_from_slice(&self.jobs.to_be_bytes());
        put_varint(&mut out, self.total_work);
        out.extend_from_slice(&self.created_unix_ms.to_be_bytes());
        put_str(&mut out, &self.program_version);
        put_str(&mut out, &self.run_id);
        seal(&mut out);
        out
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<Manifest> {
        let (_, mut r) = open("meta", bytes, 2, VERSION)?;
        let n = r.u8()?;
        let board = Board::new(n.into()).map_err(|e| r.corrupt(Corruption::Core(e)))?;
        let split_version = r.u32()?;
        let (ring, extra) = (r.u8()?, r.u8()?);
        let spec =
            SplitSpec::new(ring, extra).map_err(|e| r.corrupt(Corruption::Core(e)))?;
        let solutions = r.flag("solutions")?;
        let jobs = r.u64()?;
        let total_work = r.varint()?;
        let created_unix_ms = r.u64()?;
        let program_version = r.str()?;
        let run_id = r.str()?;
        r.end()?;
        Ok(Manifest {
            key: RunKey {
                board,
                split_version,
                spec,
                solutions,
            },
            program_version,
            run_id,
            jobs,
            total_work,
            created_unix_ms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifest_round_trips() {
        let m = Manifest {
            key: RunKey {
                board: Board::new(22).unwrap(),
                split_version: 1,
                spec: SplitSpec::new(1, 2).unwrap(),
                solutions: true,
            },
            program_version: "0.1.0".into(),
            run_id: "22-abc".into(),
            jobs: 1_000_000,
            total_work: u128::from(u64::MAX) * 3,
            created_unix_ms: 1_700_000_000_000,
        };
        assert_eq!(Manifest::decode(&m.encode()).unwrap(), m);
        // A board the program cannot build is refused, even under a valid
        // checksum.
        let mut bad = m.encode();
        bad.truncate(bad.len() - 4);
        bad[1] = 40;
        seal(&mut bad);
        assert!(
            matches!(
                Manifest::decode(&bad),
                Err(crate::Error::Corrupt {
                    what: Corruption::Core(_),
                    ..
                })
            ),
            "board 40 is refused"
        );
    }
}
