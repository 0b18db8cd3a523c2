//! Property tests of what nq-core accepts from outside: counts reported for a
//! sub-problem ([`SubProblem::check`]), placements read from the wire or a
//! store ([`Prefix::from_rows`]) and sub-problems rebuilt from them
//! ([`SubProblem::from_prefix`]). Issue 7, item 8.
//!
//! proptest rather than cargo-fuzz, which needs a nightly toolchain: these run
//! in `cargo test` on stable, in CI. proptest is a dev-dependency only;
//! nq-core itself still has none.

use std::collections::HashSet;
use std::sync::OnceLock;
use std::sync::atomic::AtomicBool;

use nq_core::board::{Board, EMPTY, Prefix};
use nq_core::published::published;
use nq_core::split::{SplitSpec, SubCounts, SubProblem, Tally, split};
use proptest::collection::vec;
use proptest::prelude::*;

/// The splits tried: the border split and the ring split, each with and
/// without an extra column.
const SPECS: [(u8, u8); 4] = [(0, 0), (0, 1), (1, 0), (1, 1)];

/// The largest board tried: every sub-problem of it solves in microseconds.
const MAX_TRIED_N: u64 = 10;

/// Every sub-problem of one board and split, with its true counts.
struct Solved {
    spec: SplitSpec,
    subs: Vec<(SubProblem, SubCounts)>,
    /// The prefixes of `subs`, for membership.
    prefixes: HashSet<Vec<u8>>,
}

/// The sub-problems of board `n` under `SPECS[spec]`, solved once per test
/// binary.
fn solved(n: u64, spec: usize) -> &'static Solved {
    static ALL: OnceLock<Vec<Solved>> = OnceLock::new();
    let all = ALL.get_or_init(|| {
        let mut all = Vec::new();
        for n in 1..=MAX_TRIED_N {
            for (ring, extra) in SPECS {
                let spec = SplitSpec::new(ring, extra).expect("valid spec");
                let subs: Vec<(SubProblem, SubCounts)> =
                    split(Board::new(n).expect("1..=10"), spec)
                        .into_iter()
                        .map(|s| {
                            let counts =
                                s.solve(&AtomicBool::new(false)).expect("not stopped").0;
                            (s, counts)
                        })
                        .collect();
                let prefixes = subs
                    .iter()
                    .map(|(s, _)| s.prefix().rows().to_vec())
                    .collect();
                all.push(Solved {
                    spec,
                    subs,
                    prefixes,
                });
            }
        }
        all
    });
    &all[(n as usize - 1) * SPECS.len() + spec]
}

/// Counts near the truth (off by a little, scaled, or swapped between the
/// fields) and arbitrary ones, up to `u128::MAX`.
fn counts_near(truth: SubCounts) -> impl Strategy<Value = SubCounts> {
    let field = move |t: u128| {
        prop_oneof![
            Just(t),
            (-3i64..=3).prop_map(move |d| t.saturating_add_signed(d.into())),
            (0u128..4).prop_map(move |k| t.saturating_mul(k)),
            any::<u128>(),
            Just(u128::MAX),
            any::<u64>().prop_map(u128::from),
        ]
    };
    (
        field(truth.count),
        field(truth.fixed180),
        field(truth.fixed90),
    )
        .prop_map(|(count, fixed180, fixed90)| SubCounts {
            count,
            fixed180,
            fixed90,
        })
}

/// A real sub-problem of a small board (its N, the index of its split in
/// `SPECS` and its index in the split) and counts to report for it.
fn reported() -> impl Strategy<Value = (u64, usize, usize, SubCounts)> {
    (1..=MAX_TRIED_N, 0..SPECS.len())
        .prop_filter("a split with sub-problems", |&(n, spec)| {
            !solved(n, spec).subs.is_empty()
        })
        .prop_flat_map(|(n, spec)| (Just(n), Just(spec), 0..solved(n, spec).subs.len()))
        .prop_flat_map(|(n, spec, i)| {
            (
                Just(n),
                Just(spec),
                Just(i),
                counts_near(solved(n, spec).subs[i].1),
            )
        })
}

/// Rows for a board of `n`: mostly rows and `EMPTY`, sometimes any byte, and
/// sometimes the wrong length.
fn rows_for(n: usize) -> impl Strategy<Value = Vec<u8>> {
    let byte = prop_oneof![
        4 => 0..n as u8,
        3 => Just(EMPTY),
        1 => any::<u8>(),
    ];
    prop_oneof![
        8 => vec(byte.clone(), n),
        1 => vec(byte, 0..n + 3),
    ]
}

/// True when `rows` is a placement of non-attacking queens on a board of
/// `n`, written independently of nq-core.
fn is_placement(n: usize, rows: &[u8]) -> bool {
    let queens: Vec<(i32, i32)> = rows
        .iter()
        .enumerate()
        .filter(|&(_, &r)| r != EMPTY)
        .map(|(c, &r)| (c as i32, i32::from(r)))
        .collect();
    rows.len() == n
        && queens.iter().all(|&(_, r)| r < n as i32)
        && queens.iter().enumerate().all(|(i, a)| {
            queens[i + 1..]
                .iter()
                .all(|b| a.1 != b.1 && (a.0 - b.0).abs() != (a.1 - b.1).abs())
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// `check` never panics, and what it accepts is within every bound: the
    /// empty columns' free squares, the published total, and the order of
    /// the symmetric counts.
    #[test]
    fn check_accepts_only_bounded_counts((n, spec, i, c) in reported()) {
        let solved = solved(n, spec);
        let (sub, truth) = &solved.subs[i];
        let n = sub.prefix().board().n();
        match sub.check(solved.spec, &c) {
            Ok(()) => {
                prop_assert!(c.count <= sub.max_completions(), "{c:?} above the free squares");
                let (total, _) = published(n).expect("published for N <= 10");
                prop_assert!(c.count <= total, "{c:?} above Q({n}) = {total}");
                prop_assert!(c.fixed90 <= c.fixed180 && c.fixed180 <= c.count, "{c:?}");
                // Accepted counts fold into a tally or report an overflow.
                let _ = Tally::default().add(sub, &c);
            }
            Err(e) => {
                prop_assert!(c != *truth, "the true counts {c:?} were refused: {e}");
            }
        }
        if c.count > sub.max_completions() || c.count > published(n).expect("known").0 {
            prop_assert!(sub.check(solved.spec, &c).is_err(), "{c:?} accepted");
        }
    }

    /// `Prefix::from_rows` never panics and accepts exactly the placements
    /// of non-attacking queens, keeping their rows as given.
    #[test]
    fn from_rows_accepts_exactly_the_placements(
        (n, rows) in (1usize..=32).prop_flat_map(|n| (Just(n), rows_for(n)))
    ) {
        let board = Board::new(n as u64).expect("1..=32");
        match Prefix::from_rows(board, &rows) {
            Ok(p) => {
                prop_assert!(is_placement(n, &rows), "{rows:?} accepted");
                prop_assert_eq!(p.rows(), &rows[..]);
                prop_assert_eq!(p.len(), rows.iter().filter(|&&r| r != EMPTY).count());
            }
            Err(_) => prop_assert!(!is_placement(n, &rows), "{rows:?} refused"),
        }
    }

    /// A prefix read from the wire becomes a sub-problem exactly when it is
    /// one of the split's, so a coordinator or worker never works on a
    /// placement the split does not contain; `is_completion` never panics on
    /// arbitrary rows.
    #[test]
    fn from_prefix_accepts_exactly_the_split(
        (n, spec, rows) in (1..=MAX_TRIED_N, 0..SPECS.len())
            .prop_flat_map(|(n, spec)| (Just(n), Just(spec), rows_for(n as usize)))
    ) {
        let solved = solved(n, spec);
        let board = Board::new(n).expect("1..=10");
        let Ok(prefix) = Prefix::from_rows(board, &rows) else {
            return Ok(());
        };
        let sub = SubProblem::from_prefix(solved.spec, prefix);
        prop_assert_eq!(sub.is_ok(), solved.prefixes.contains(&rows), "{:?}", rows);
        if let Some((any_sub, _)) = solved.subs.first() {
            let _ = any_sub.is_completion(&rows);
        }
    }
}

/// Every true count is accepted, for every sub-problem of every tried split.
#[test]
fn check_accepts_every_true_count() {
    for n in 1..=MAX_TRIED_N {
        for spec in 0..SPECS.len() {
            let s = solved(n, spec);
            for (sub, truth) in &s.subs {
                if let Err(e) = sub.check(s.spec, truth) {
                    panic!(
                        "N={n} {:?} {:?}: {truth:?} refused: {e}",
                        s.spec,
                        sub.prefix()
                    );
                }
            }
        }
    }
}
