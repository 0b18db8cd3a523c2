//! Published N-Queens counts, used ONLY to check a finished run, never to
//! produce a result.
//!
//! Copied from OEIS A000170 (all solutions) and A002562 (solutions up to
//! rotation and reflection) for N = 1 to 27, the largest published. Q(26) was
//! first computed by Queens@TUD (2009), Q(27) by the Q27 project (2016).

/// `(N, Q(N), U(N))` for N = 1 to 27.
pub const PUBLISHED: [(u8, u128, u128); 27] = [
    (1, 1, 1),
    (2, 0, 0),
    (3, 0, 0),
    (4, 2, 1),
    (5, 10, 2),
    (6, 4, 1),
    (7, 40, 6),
    (8, 92, 12),
    (9, 352, 46),
    (10, 724, 92),
    (11, 2680, 341),
    (12, 14200, 1787),
    (13, 73712, 9233),
    (14, 365596, 45752),
    (15, 2279184, 285053),
    (16, 14772512, 1846955),
    (17, 95815104, 11977939),
    (18, 666090624, 83263591),
    (19, 4968057848, 621012754),
    (20, 39029188884, 4878666808),
    (21, 314666222712, 39333324973),
    (22, 2691008701644, 336376244042),
    (23, 24233937684440, 3029242658210),
    (24, 227514171973736, 28439272956934),
    (25, 2207893435808352, 275986683743434),
    (26, 22317699616364044, 2789712466510289),
    (27, 234907967154122528, 29363495934315694),
];

/// The published `(total, unique)` for `n`, if any.
pub fn published(n: u8) -> Option<(u128, u128)> {
    PUBLISHED
        .iter()
        .find(|&&(m, _, _)| m == n)
        .map(|&(_, q, u)| (q, u))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_complete_and_ordered() {
        for (i, &(n, q, u)) in PUBLISHED.iter().enumerate() {
            assert_eq!(usize::from(n), i + 1);
            assert!(u <= q && (q == 0 || q <= 8 * u), "n={n}");
        }
        assert_eq!(published(8), Some((92, 12)));
        assert_eq!(published(27), Some((234907967154122528, 29363495934315694)));
        assert_eq!(published(28), None);
    }
}
