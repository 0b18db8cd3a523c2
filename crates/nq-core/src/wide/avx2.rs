use std::arch::x86_64::{
    __m128i, __m256i, _mm_cvtsi32_si128, _mm256_add_epi8, _mm256_add_epi32,
    _mm256_and_si256, _mm256_andnot_si256, _mm256_castsi256_ps, _mm256_cmpeq_epi32,
    _mm256_cmpgt_epi32, _mm256_loadu_si256, _mm256_madd_epi16, _mm256_maddubs_epi16,
    _mm256_maskload_epi32, _mm256_movemask_ps, _mm256_mullo_epi32, _mm256_or_si256,
    _mm256_permutevar8x32_epi32, _mm256_set1_epi8, _mm256_set1_epi16, _mm256_set1_epi32,
    _mm256_setr_epi8, _mm256_setr_epi32, _mm256_setzero_si256, _mm256_shuffle_epi8,
    _mm256_sll_epi32, _mm256_srl_epi32, _mm256_srli_epi16, _mm256_storeu_si256,
    _mm256_sub_epi32, _mm256_xor_si256,
};

use super::*;

const LANES: usize = 8;

/// `COMPRESS[m]`: the lanes set in `m`, in order, then zeros: the
/// permutation that packs those lanes at the front of a vector.
static COMPRESS: [[i32; 8]; 256] = {
    let mut table = [[0i32; 8]; 256];
    let mut m = 0;
    while m < 256 {
        let (mut lane, mut out) = (0usize, 0usize);
        while lane < 8 {
            if m & (1 << lane) != 0 {
                table[m][out] = lane as i32;
                out += 1;
            }
            lane += 1;
        }
        m += 1;
    }
    table
};

/// Counts on this kernel; see [`super::count`].
#[target_feature(enable = "avx2,popcnt")]
pub(super) fn count(p: &Problem<'_>, stop: &AtomicBool) -> Option<(u128, u64)> {
    walk!(p, stop)
}

#[target_feature(enable = "avx2")]
fn splat(x: u32) -> __m256i {
    _mm256_set1_epi32(x as i32)
}

/// The first `take` lanes, as a vector mask (all ones in those lanes).
#[target_feature(enable = "avx2")]
fn valid(take: usize) -> __m256i {
    _mm256_cmpgt_epi32(
        _mm256_set1_epi32(take as i32),
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
    )
}

#[target_feature(enable = "avx2")]
unsafe fn load(p: *const i32, lanes: __m256i) -> __m256i {
    // SAFETY: the caller's; lanes outside `lanes` are not read.
    unsafe { _mm256_maskload_epi32(p, lanes) }
}

/// The lanes of `lanes` where `v` is not zero, as bits.
#[target_feature(enable = "avx2")]
fn nonzero(v: __m256i, lanes: __m256i) -> u32 {
    let zero = _mm256_cmpeq_epi32(v, _mm256_setzero_si256());
    _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_andnot_si256(zero, lanes))) as u32
}

/// How many lanes `sel` keeps.
#[target_feature(enable = "avx2,popcnt")]
fn kept(sel: u32) -> usize {
    sel.count_ones() as usize
}

/// Stores the lanes of `sel`, contiguously, from `p`, followed by junk up
/// to a whole vector (eight values are always written).
#[target_feature(enable = "avx2")]
unsafe fn compress(p: *mut i32, sel: u32, v: __m256i) {
    let perm = &COMPRESS[(sel & 0xff) as usize];
    // SAFETY: `perm` is 32 bytes; the caller guarantees room for eight
    // values at `p`.
    unsafe {
        let idx = _mm256_loadu_si256(perm.as_ptr().cast());
        _mm256_storeu_si256(p.cast(), _mm256_permutevar8x32_epi32(v, idx));
    }
}

/// `acc + x` in the lanes of `lanes`, `acc` elsewhere.
#[target_feature(enable = "avx2")]
fn add_in(acc: __m256i, lanes: __m256i, x: __m256i) -> __m256i {
    _mm256_add_epi32(acc, _mm256_and_si256(x, lanes))
}

#[target_feature(enable = "avx2")]
fn and(a: __m256i, b: __m256i) -> __m256i {
    _mm256_and_si256(a, b)
}

#[target_feature(enable = "avx2")]
fn or(a: __m256i, b: __m256i) -> __m256i {
    _mm256_or_si256(a, b)
}

#[target_feature(enable = "avx2")]
fn xor(a: __m256i, b: __m256i) -> __m256i {
    _mm256_xor_si256(a, b)
}

/// `!a & b`.
#[target_feature(enable = "avx2")]
fn andnot(a: __m256i, b: __m256i) -> __m256i {
    _mm256_andnot_si256(a, b)
}

#[target_feature(enable = "avx2")]
fn neg(a: __m256i) -> __m256i {
    _mm256_sub_epi32(_mm256_setzero_si256(), a)
}

#[target_feature(enable = "avx2")]
fn sub(a: __m256i, b: __m256i) -> __m256i {
    _mm256_sub_epi32(a, b)
}

#[target_feature(enable = "avx2")]
fn mul(a: __m256i, b: __m256i) -> __m256i {
    _mm256_mullo_epi32(a, b)
}

/// A shift distance as the shift instructions take it.
#[target_feature(enable = "avx2")]
fn count_of(s: u32) -> __m128i {
    _mm_cvtsi32_si128(s as i32)
}

/// Shift left by `count_of(s)` bits (0 for `s ≥ 32`).
#[target_feature(enable = "avx2")]
fn shl(a: __m256i, s: __m128i) -> __m256i {
    _mm256_sll_epi32(a, s)
}

/// Shift right by `count_of(s)` bits (0 for `s ≥ 32`).
#[target_feature(enable = "avx2")]
fn shr(a: __m256i, s: __m128i) -> __m256i {
    _mm256_srl_epi32(a, s)
}

/// Bits set in each byte: a 4-bit lookup per nibble.
#[target_feature(enable = "avx2")]
fn byte_counts(a: __m256i) -> __m256i {
    let table = _mm256_setr_epi8(
        0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4, //
        0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4,
    );
    let nibble = _mm256_set1_epi8(0x0f);
    let low = _mm256_shuffle_epi8(table, _mm256_and_si256(a, nibble));
    let high =
        _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(a, 4), nibble));
    _mm256_add_epi8(low, high)
}

/// The four bytes of each lane added (each at most 127), by two
/// multiply-adds.
#[target_feature(enable = "avx2")]
fn widen(bytes: __m256i) -> __m256i {
    let pairs = _mm256_maddubs_epi16(bytes, _mm256_set1_epi8(1));
    _mm256_madd_epi16(pairs, _mm256_set1_epi16(1))
}

/// Bits set in each lane.
#[target_feature(enable = "avx2")]
fn popcnt(a: __m256i) -> __m256i {
    widen(byte_counts(a))
}

/// `popcnt(a) + popcnt(b) + popcnt(c)`, added as bytes (at most 24 each)
/// and widened once.
#[target_feature(enable = "avx2")]
fn popcnt3(a: __m256i, b: __m256i, c: __m256i) -> __m256i {
    let bytes = _mm256_add_epi8(
        _mm256_add_epi8(byte_counts(a), byte_counts(b)),
        byte_counts(c),
    );
    widen(bytes)
}

/// The sum of the lanes, each an unsigned count.
#[target_feature(enable = "avx2")]
fn lane_sum(v: __m256i) -> u128 {
    let mut lanes = [0u32; LANES];
    // SAFETY: `lanes` is 32 bytes long; the store is unaligned.
    unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), v) };
    lanes.iter().map(|&x| u128::from(x)).sum()
}
