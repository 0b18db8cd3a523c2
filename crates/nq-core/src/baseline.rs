//! The textbook bitmask counter, kept as the benchmark comparator.
//!
//! This is the classic program (Somers, 2002): three masks, the lowest-bit
//! loop, and the left-right mirror only: the first column's queen is placed
//! in the lower half and the count doubled, with the middle row of an odd board
//! handled separately. It has no look-ahead and no leaf shortcut. It is not
//! used to produce any result; benchmarks measure the real kernel against it.

/// Counts the solutions of the N×N board, `1 ≤ n ≤ 32`, the textbook way.
///
/// # Panics
///
/// If `n` is 0 or larger than 32.
pub fn count_mirror(n: u32) -> u128 {
    assert!((1..=32).contains(&n), "n must be 1..=32");
    let full = ((1u64 << n) - 1) as u32;
    let half = n / 2;
    let mut total = 0u128;
    // Lower half of the first column, doubled by the mirror in the horizontal axis.
    for r in 0..half {
        let bit = 1u32 << r;
        total += 2 * u128::from(place(full, bit, bit << 1, bit >> 1));
    }
    if n % 2 == 1 {
        // The middle row is its own mirror image: count it once.
        let bit = 1u32 << half;
        total += u128::from(place(full, bit, bit << 1, bit >> 1));
    }
    total
}

/// The recursive textbook step: `cols`, `up`, `down` are the attacked rows of
/// the next column.
fn place(full: u32, cols: u32, up: u32, down: u32) -> u64 {
    if cols == full {
        return 1;
    }
    let mut total = 0;
    let mut free = full & !(cols | up | down);
    while free != 0 {
        let bit = free & free.wrapping_neg();
        free ^= bit;
        total += place(full, cols | bit, (up | bit) << 1, (down | bit) >> 1);
    }
    total
}

#[cfg(test)]
mod tests {
    #[test]
    fn textbook_counts() {
        let known = [1u128, 0, 0, 2, 10, 4, 40, 92, 352, 724, 2680, 14200];
        for (i, &q) in known.iter().enumerate() {
            assert_eq!(super::count_mirror(i as u32 + 1), q, "n={}", i + 1);
        }
    }
}
