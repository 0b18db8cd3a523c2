//! The published counts of OEIS A000170 and A002562.
//!
//! These are used ONLY to check a finished count and to say so in reports;
//! nothing in nq ever uses them to produce or correct a result. They live in
//! the core so that every binary checks against the same table.

/// `(total, unique)` for N = 1..=27, index N − 1: totals from OEIS A000170 (all
/// solutions), unique counts from OEIS A002562 (solutions up to rotation and
/// reflection). Copied from `shared/data/oeis.tsv`. Q(26) was first computed by
/// Queens@TUD (2009) and Q(27) by the Q27 project (2016); no larger value has
/// been published.
const PUBLISHED: [(u128, u128); 27] = [
    (1, 1),
    (0, 0),
    (0, 0),
    (2, 1),
    (10, 2),
    (4, 1),
    (40, 6),
    (92, 12),
    (352, 46),
    (724, 92),
    (2680, 341),
    (14200, 1787),
    (73712, 9233),
    (365596, 45752),
    (2279184, 285053),
    (14772512, 1846955),
    (95815104, 11977939),
    (666090624, 83263591),
    (4968057848, 621012754),
    (39029188884, 4878666808),
    (314666222712, 39333324973),
    (2691008701644, 336376244042),
    (24233937684440, 3029242658210),
    (227514171973736, 28439272956934),
    (2207893435808352, 275986683743434),
    (22317699616364044, 2789712466510289),
    (234907967154122528, 29363495934315694),
];

/// The published `(total, unique)` for a board of side `n`, if there is one.
pub fn published(n: u8) -> Option<(u128, u128)> {
    let i = usize::from(n).checked_sub(1)?;
    PUBLISHED.get(i).copied()
}

/// The largest N with a published count.
pub const LARGEST: u8 = PUBLISHED.len() as u8;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_consistent() {
        assert_eq!(published(8), Some((92, 12)));
        assert_eq!(published(27), Some((234907967154122528, 29363495934315694)));
        assert_eq!(published(0), None);
        assert_eq!(published(28), None);
        for n in 1..=LARGEST {
            let (total, unique) = published(n).unwrap();
            // A class has 1 to 8 members, so U ≤ Q ≤ 8·U.
            assert!(unique <= total && total <= 8 * unique, "n={n}");
        }
    }
}
