//! Property tests of everything a peer can send: prost decoding of arbitrary
//! bytes as every message, and every conversion from a wire message to an
//! nq-core value (`convert.rs`). Issue 7, item 8.
//!
//! proptest rather than cargo-fuzz, which needs a nightly toolchain: these run
//! in `cargo test` on stable, in CI.

use std::collections::HashSet;

use nq_core::Board;
use nq_core::split::{SPLIT_VERSION, SplitSpec, SubCounts, split};
use nq_proto::convert::{ConvertError, RunShape};
use nq_proto::pb;
use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;
use prost::Message;

/// Small numbers and the edges, for fields that a receiver range-checks.
fn small_u32() -> impl Strategy<Value = u32> {
    prop_oneof![0u32..40, Just(u32::MAX), Just(256), any::<u32>()]
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![any::<String>(), "[a-z0-9.@-]{0,12}"]
}

fn count() -> impl Strategy<Value = pb::Count> {
    (any::<u64>(), any::<u64>()).prop_map(|(hi, lo)| pb::Count { hi, lo })
}

fn sub_counts() -> impl Strategy<Value = pb::SubCounts> {
    (
        option::of(count()),
        option::of(count()),
        option::of(count()),
    )
        .prop_map(|(count, fixed180, fixed90)| pb::SubCounts {
            count,
            fixed180,
            fixed90,
        })
}

fn run_info() -> impl Strategy<Value = pb::RunInfo> {
    (
        small_u32(),
        prop_oneof![Just(SPLIT_VERSION), any::<u32>()],
        small_u32(),
        small_u32(),
        any::<bool>(),
        text(),
    )
        .prop_map(
            |(n, split_version, ring, extra, solutions, run_id)| pb::RunInfo {
                n,
                split_version,
                ring,
                extra,
                solutions,
                run_id,
            },
        )
}

fn rows() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        vec(prop_oneof![0u8..12, Just(u8::MAX)], 0..14),
        vec(any::<u8>(), 0..40),
    ]
}

fn report_chunk() -> impl Strategy<Value = pb::ReportChunk> {
    let body = prop_oneof![
        (any::<u32>(), rows()).prop_map(|(subproblem, rows)| {
            pb::report_chunk::Body::Solutions(pb::SolutionBatch { subproblem, rows })
        }),
        (vec(sub_counts(), 0..4), any::<u64>(), any::<u64>(), text()).prop_map(
            |(counts, nodes, solutions_sent, kernel)| {
                pb::report_chunk::Body::Result(pb::JobResult {
                    counts,
                    nodes,
                    solutions_sent,
                    kernel,
                })
            }
        ),
    ];
    (text(), any::<u64>(), any::<u64>(), option::of(body), text()).prop_map(
        |(worker_id, job_id, lease_id, body, run_id)| pb::ReportChunk {
            worker_id,
            job_id,
            lease_id,
            body,
            run_id,
        },
    )
}

/// The encodings of messages of every type, to mutate.
fn encodings() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        report_chunk().prop_map(|m| m.encode_to_vec()),
        run_info().prop_map(|m| m.encode_to_vec()),
        (text(), small_u32(), vec(any::<u64>(), 0..4)).prop_map(
            |(worker_id, want, held)| {
                pb::LeaseRequest {
                    worker_id,
                    want,
                    held,
                }
                .encode_to_vec()
            }
        ),
        (vec(rows(), 0..3), any::<u64>()).prop_map(|(subs, job_id)| {
            pb::LeaseResponse {
                jobs: vec![pb::Job {
                    job_id,
                    lease_id: 1,
                    subproblems: subs
                        .into_iter()
                        .map(|rows| pb::SubProblem { rows })
                        .collect(),
                    estimated_work: 3,
                    kernel: "scalar".into(),
                }],
                run_complete: false,
                revoked: vec![job_id],
                retry_after_ms: 5,
                lease_ttl_ms: 6,
            }
            .encode_to_vec()
        }),
    ]
}

/// Arbitrary bytes, and encodings of real messages with a few bytes changed
/// and cut at a random length.
fn wire_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        vec(any::<u8>(), 0..256),
        (
            encodings(),
            vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
            any::<prop::sample::Index>()
        )
            .prop_map(|(mut bytes, edits, cut)| {
                if !bytes.is_empty() {
                    for (at, b) in edits {
                        let i = at.index(bytes.len());
                        bytes[i] = b;
                    }
                    bytes.truncate(cut.index(bytes.len() + 1).max(bytes.len() / 2));
                }
                bytes
            }),
    ]
}

/// Decodes `bytes` as `M`; when that succeeds, the message encodes and
/// decodes to itself.
fn decodes<M: Message + Default + PartialEq + std::fmt::Debug>(
    bytes: &[u8],
) -> Result<(), TestCaseError> {
    if let Ok(m) = M::decode(bytes) {
        prop_assert_eq!(M::decode(&m.encode_to_vec()[..]).ok(), Some(m));
    }
    Ok(())
}

proptest! {
    /// prost never panics on what a peer sends, whatever message it is read
    /// as.
    #[test]
    fn arbitrary_bytes_decode_as_every_message(bytes in wire_bytes()) {
        decodes::<pb::Count>(&bytes)?;
        decodes::<pb::RegisterRequest>(&bytes)?;
        decodes::<pb::RegisterResponse>(&bytes)?;
        decodes::<pb::RunInfo>(&bytes)?;
        decodes::<pb::LeaseRequest>(&bytes)?;
        decodes::<pb::LeaseResponse>(&bytes)?;
        decodes::<pb::Job>(&bytes)?;
        decodes::<pb::SubProblem>(&bytes)?;
        decodes::<pb::SubCounts>(&bytes)?;
        decodes::<pb::JobResult>(&bytes)?;
        decodes::<pb::SolutionBatch>(&bytes)?;
        decodes::<pb::ReportChunk>(&bytes)?;
        decodes::<pb::ReportAck>(&bytes)?;
        decodes::<pb::ReleaseRequest>(&bytes)?;
        decodes::<pb::ReleaseResponse>(&bytes)?;
    }

    /// A count survives the wire exactly, in both directions.
    #[test]
    fn counts_round_trip_through_u128(v in any::<u128>(), c in count()) {
        prop_assert_eq!(u128::from(pb::Count::from(v)), v);
        prop_assert_eq!(pb::Count::from(u128::from(c)), c);
    }

    /// Sub-counts convert exactly when every field is present, to the values
    /// sent; an absent field is named.
    #[test]
    fn sub_counts_convert_only_when_complete(c in sub_counts()) {
        match SubCounts::try_from(c) {
            Ok(s) => {
                prop_assert_eq!(Some(pb::Count::from(s.count)), c.count);
                prop_assert_eq!(Some(pb::Count::from(s.fixed180)), c.fixed180);
                prop_assert_eq!(Some(pb::Count::from(s.fixed90)), c.fixed90);
                prop_assert_eq!(pb::SubCounts::from(&s), c);
            }
            Err(e) => {
                prop_assert!(c.count.is_none() || c.fixed180.is_none() || c.fixed90.is_none());
                prop_assert!(matches!(e, ConvertError::Missing { .. }), "{e:?}");
                prop_assert!(e.to_string().contains("SubCounts."), "{e}");
            }
        }
    }

    /// A run description converts exactly when nq-core accepts its board and
    /// split and its split version is this build's; what converts describes
    /// the same run.
    #[test]
    fn run_info_converts_only_when_valid(info in run_info()) {
        let valid = info.split_version == SPLIT_VERSION
            && Board::new(info.n.into()).is_ok()
            && u8::try_from(info.ring).ok().zip(u8::try_from(info.extra).ok())
                .is_some_and(|(r, e)| SplitSpec::new(r, e).is_ok());
        match RunShape::try_from(&info) {
            Ok(shape) => {
                prop_assert!(valid, "{info:?} converted");
                prop_assert_eq!(shape.to_pb(&info.run_id), info);
            }
            Err(e) => {
                prop_assert!(!valid, "{info:?} refused: {e}");
                prop_assert!(!e.to_string().is_empty());
            }
        }
    }

    /// A sub-problem from the wire is accepted exactly when it is one of the
    /// run's, whatever its rows.
    #[test]
    fn subproblems_convert_only_when_in_the_split(
        n in 1u64..=10,
        (ring, extra) in (0u8..=2, 0u8..=1),
        rows in rows(),
    ) {
        let shape = RunShape {
            board: Board::new(n).expect("1..=10"),
            spec: SplitSpec::new(ring, extra).expect("valid"),
            solutions: false,
        };
        let ours: HashSet<Vec<u8>> = split(shape.board, shape.spec)
            .iter()
            .map(|s| s.prefix().rows().to_vec())
            .collect();
        let got = shape.subproblem(&pb::SubProblem { rows: rows.clone() });
        prop_assert_eq!(got.is_ok(), ours.contains(&rows), "{:?}", rows);
        if let Ok(sub) = got {
            prop_assert_eq!(sub.prefix().rows(), &rows[..]);
        }
    }
}
