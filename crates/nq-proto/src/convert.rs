//! Conversions between wire messages and `nq-core` types.
//!
//! Everything that arrives from the network is untrusted: each conversion from
//! a `pb` message validates it and fails with a [`ConvertError`] that names the
//! field and the accepted form. Conversions to the wire cannot fail.

use nq_core::board::{Board, Prefix};
use nq_core::split::{SPLIT_VERSION, SplitSpec, SubCounts, SubProblem};

use crate::pb;

/// A wire message that does not describe a valid value.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    /// A required message field was absent.
    #[error("field `{field}` is missing")]
    Missing {
        /// The field's name in the proto.
        field: &'static str,
    },
    /// A value is outside what nq-core accepts (board size, prefix, split).
    #[error("field `{field}` is invalid")]
    Core {
        /// The field's name in the proto.
        field: &'static str,
        /// What nq-core said.
        #[source]
        source: nq_core::Error,
    },
    /// The run uses a split version this build does not implement.
    #[error(
        "split version {got} is not supported by this build (it implements version \
         {SPLIT_VERSION}); upgrade the older of the worker and the coordinator"
    )]
    SplitVersion {
        /// The version on the wire.
        got: u32,
    },
    /// A numeric field does not fit the domain type.
    #[error("field `{field}` is out of range: {value}")]
    Range {
        /// The field's name in the proto.
        field: &'static str,
        /// The value received.
        value: u64,
    },
}

impl From<u128> for pb::Count {
    fn from(v: u128) -> pb::Count {
        pb::Count {
            hi: (v >> 64) as u64,
            lo: v as u64,
        }
    }
}

impl From<pb::Count> for u128 {
    fn from(c: pb::Count) -> u128 {
        (u128::from(c.hi) << 64) | u128::from(c.lo)
    }
}

/// An absent `Count` reads as the field missing, not as zero: a zero is always
/// sent explicitly, so absence means a broken or foreign sender.
fn count(c: Option<pb::Count>, field: &'static str) -> Result<u128, ConvertError> {
    c.map(u128::from).ok_or(ConvertError::Missing { field })
}

impl From<&SubCounts> for pb::SubCounts {
    fn from(c: &SubCounts) -> pb::SubCounts {
        pb::SubCounts {
            count: Some(c.count.into()),
            fixed180: Some(c.fixed180.into()),
            fixed90: Some(c.fixed90.into()),
        }
    }
}

impl TryFrom<pb::SubCounts> for SubCounts {
    type Error = ConvertError;

    fn try_from(c: pb::SubCounts) -> Result<SubCounts, ConvertError> {
        Ok(SubCounts {
            count: count(c.count, "SubCounts.count")?,
            fixed180: count(c.fixed180, "SubCounts.fixed180")?,
            fixed90: count(c.fixed90, "SubCounts.fixed90")?,
        })
    }
}

impl From<&SubProblem> for pb::SubProblem {
    fn from(s: &SubProblem) -> pb::SubProblem {
        pb::SubProblem {
            rows: s.prefix().rows().to_vec(),
        }
    }
}

/// The facts of a run that a worker needs to rebuild and check sub-problems.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunShape {
    /// The board.
    pub board: Board,
    /// The split the run uses (its version is [`SPLIT_VERSION`]).
    pub spec: SplitSpec,
    /// Whether workers list solutions.
    pub solutions: bool,
}

impl RunShape {
    /// The wire form, with the given run id.
    pub fn to_pb(&self, run_id: &str) -> pb::RunInfo {
        pb::RunInfo {
            n: self.board.n().into(),
            split_version: SPLIT_VERSION,
            ring: self.spec.ring.into(),
            extra: self.spec.extra.into(),
            solutions: self.solutions,
            run_id: run_id.to_owned(),
        }
    }

    /// Rebuilds and validates one sub-problem of this run from the wire: the
    /// prefix must be a valid placement on the board, and the sub-problem must
    /// belong to the split.
    ///
    /// # Errors
    ///
    /// [`ConvertError::Core`] naming `SubProblem.rows`.
    pub fn subproblem(&self, s: &pb::SubProblem) -> Result<SubProblem, ConvertError> {
        let field = "SubProblem.rows";
        let prefix = Prefix::from_rows(self.board, &s.rows)
            .map_err(|source| ConvertError::Core { field, source })?;
        SubProblem::from_prefix(self.spec, prefix)
            .map_err(|source| ConvertError::Core { field, source })
    }
}

impl TryFrom<&pb::RunInfo> for RunShape {
    type Error = ConvertError;

    fn try_from(r: &pb::RunInfo) -> Result<RunShape, ConvertError> {
        if r.split_version != SPLIT_VERSION {
            return Err(ConvertError::SplitVersion {
                got: r.split_version,
            });
        }
        let board = Board::new(r.n.into()).map_err(|source| ConvertError::Core {
            field: "RunInfo.n",
            source,
        })?;
        let small = |v: u32, field| {
            u8::try_from(v).map_err(|_| ConvertError::Range {
                field,
                value: v.into(),
            })
        };
        let spec = SplitSpec::new(
            small(r.ring, "RunInfo.ring")?,
            small(r.extra, "RunInfo.extra")?,
        )
        .map_err(|source| ConvertError::Core {
            field: "RunInfo.ring",
            source,
        })?;
        Ok(RunShape {
            board,
            spec,
            solutions: r.solutions,
        })
    }
}

#[cfg(test)]
mod tests {
    use nq_core::split::split;

    use super::*;

    #[test]
    fn count_round_trips_128_bits() {
        for v in [
            0u128,
            1,
            u64::MAX.into(),
            u128::from(u64::MAX) + 1,
            u128::MAX,
        ] {
            assert_eq!(u128::from(pb::Count::from(v)), v);
        }
    }

    #[test]
    fn run_shape_round_trips_and_checks_subproblems() {
        let shape = RunShape {
            board: Board::new(9).unwrap(),
            spec: SplitSpec::new(1, 1).unwrap(),
            solutions: false,
        };
        let back = RunShape::try_from(&shape.to_pb("r")).unwrap();
        assert_eq!(back, shape);
        for sub in split(shape.board, shape.spec) {
            assert_eq!(back.subproblem(&pb::SubProblem::from(&sub)).unwrap(), sub);
        }
        let bad = pb::SubProblem { rows: vec![0, 1] };
        let msg = back.subproblem(&bad).unwrap_err().to_string();
        assert!(msg.contains("SubProblem.rows"), "{msg}");
    }

    #[test]
    fn foreign_split_version_is_refused() {
        let mut info = RunShape {
            board: Board::new(8).unwrap(),
            spec: SplitSpec::new(1, 0).unwrap(),
            solutions: false,
        }
        .to_pb("r");
        info.split_version += 1;
        let msg = RunShape::try_from(&info).unwrap_err().to_string();
        assert!(msg.contains("split version"), "{msg}");
    }
}
