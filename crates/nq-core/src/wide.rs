//! The SIMD count kernels: sixteen (AVX-512) or eight (AVX2) search nodes per
//! instruction.
//!
//! The scalar kernel in [`crate::search`] spends most of its time on branches
//! it cannot predict: whether a column still has a free row, whether a
//! placement leaves the next column empty. These kernels remove those branches
//! by expanding a vector of nodes of the same search level at once, one SIMD
//! lane each, and turning every such decision into a lane mask.
//!
//! # Traversal
//!
//! Each level `j` of the search (free column `j` of the plan) has a buffer of
//! nodes, stored as four arrays: the free rows left to try (`rem`), and the
//! `used`, `up` and `down` masks as seen from column `j` (the same state the
//! scalar kernel keeps, see its module docs). One *step* at level `j` takes up
//! to one vector of nodes off the end of its buffer and, in every lane at once,
//! places a queen on the lowest row of `rem`:
//!
//! * the node goes back to level `j` if it has rows left (compress-store);
//! * the child goes to level `j + 1` if its column has a free row;
//! * at the deepest searched level (`last`, three columns from the end) the
//!   child is not stored: its completions over the last two columns are
//!   counted in closed form (`pairs`, as in the scalar kernel) and added to
//!   the lane's running sum.
//!
//! Every node of the tree is taken exactly once and every placement is tried
//! exactly once, so the counts equal the scalar kernel's; only the order of
//! the walk differs. The walk is depth-first over levels: it moves down as
//! soon as the next level holds [`DESCEND`] nodes (enough for full vectors), or
//! when the current level is empty, and moves up when the current level is
//! empty. Hence the invariant the stores rely on: while the walk is at level
//! `j`, the levels deeper than `j + 1` are empty and level `j + 1` holds fewer
//! than `DESCEND` nodes (it moved down as soon as it reached that, and
//! returns only once the deeper level is empty). So each buffer holds fewer
//! than `DESCEND` plus one vector of nodes, and memory stays a few tens of
//! kilobytes, in L1/L2 cache.
//!
//! The walk is written once, in the `walk!` macro, and expanded inside each
//! kernel's module, whose functions (all compiled for that instruction set)
//! provide the vector operations. AVX2 has no compress-store and no vector
//! popcount: its module builds them from a permutation table and a nibble
//! lookup.
//!
//! # Exactness
//!
//! A lane's sum grows by at most `32 · 32` per step (the closed form counts
//! pairs of rows) and is moved into a `u128` every [`FLUSH`] steps, so lanes
//! stay below `2¹² · 2¹⁰`, far from `u32` overflow. Lanes outside a step's
//! vector are kept out of every sum and every store by the same masks.

use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::board::MAX_N;

/// The widest vector, in lanes.
const MAX_LANES: usize = 16;
/// The walk moves down a level once the next level holds this many nodes.
/// Larger values fill more vectors completely near the turns of the walk;
/// beyond a few vectors nothing more is gained (BENCHMARKS.md).
const DESCEND: usize = 128;
/// Capacity of a level's buffer: see the module docs for the bound. The AVX2
/// compress-store writes a whole vector, of which the lanes past the kept ones
/// are junk beyond the buffer's length; this capacity leaves room for it too.
const CAP: usize = DESCEND + MAX_LANES;
/// Steps between moves of the lane sums into the `u128` total, and checks of
/// the stop flag.
const FLUSH: u64 = 1 << 12;

/// A SIMD kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isa {
    /// Sixteen lanes: AVX-512 F and VPOPCNTDQ (and popcnt, which every such
    /// CPU has).
    Avx512,
    /// Eight lanes: AVX2 and popcnt.
    Avx2,
}

impl Isa {
    /// True when this CPU can run the kernel.
    pub(crate) fn available(self) -> bool {
        match self {
            Isa::Avx512 => {
                std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512vpopcntdq")
                    && std::arch::is_x86_feature_detected!("popcnt")
            }
            Isa::Avx2 => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("popcnt")
            }
        }
    }
}

/// The nodes waiting at one level, as structure-of-arrays.
#[repr(C, align(64))]
struct Level {
    rem: [i32; CAP],
    used: [i32; CAP],
    up: [i32; CAP],
    down: [i32; CAP],
}

/// What the kernels need of a plan (see `search::Plan`).
pub(crate) struct Problem<'a> {
    /// Rows the search may use.
    pub full: u32,
    /// Distance from the previous free column, per free column.
    pub shift: &'a [u32],
    /// Rows blocked by the prefix, per free column.
    pub blocked: &'a [u32],
}

/// Counts the completions of `p`, which must have at least four free columns,
/// on kernel `isa`. Returns the count and the number of nodes expanded, or
/// `None` when `stop` was set.
///
/// # Panics
///
/// When this CPU cannot run `isa` ([`Isa::available`]), or `p` has fewer than
/// four free columns.
pub(crate) fn count(isa: Isa, p: &Problem<'_>, stop: &AtomicBool) -> Option<(u128, u64)> {
    assert!(isa.available(), "this CPU cannot run the {isa:?} kernel");
    // SAFETY: the instruction sets each kernel is compiled for were just
    // checked on the running CPU.
    unsafe {
        match isa {
            Isa::Avx512 => avx512::count(p, stop),
            Isa::Avx2 => avx2::count(p, stop),
        }
    }
}

/// The walk of the module docs, expanded inside a kernel's module: `LANES`,
/// the vector functions (`splat`, `valid`, `load`, `nonzero`, `compress`, …)
/// and `lane_sum` come from there.
macro_rules! walk {
    ($p:ident, $stop:ident) => {{
        let p: &Problem<'_> = $p;
        let free = p.shift.len();
        assert!(
            (4..=MAX_N as usize).contains(&free) && p.blocked.len() == free,
            "the SIMD kernels need 4 to 32 free columns"
        );
        // The deepest level that is stored; its children are counted in
        // closed form together with the last two columns.
        let last = free - 3;
        let (s1, s2) = (p.shift[free - 2], p.shift[free - 1]);
        let (c1, c12, c2) = (count_of(s1), count_of(s1 + s2), count_of(s2));
        let full = splat(p.full);
        let (b1, b2) = (splat(p.blocked[free - 2]), splat(p.blocked[free - 1]));

        // The buffers are not initialised: every value is written before it
        // is read (a level's values below its `len`), and masked loads read no
        // lane outside their mask, so a search of any size starts at no cost.
        let mut store = MaybeUninit::<[Level; MAX_N as usize]>::uninit();
        let levels: *mut Level = store.as_mut_ptr().cast();
        // The four arrays of level `j`: rem, used, up, down.
        let arrays = |j: usize| -> [*mut i32; 4] {
            assert!(j < MAX_N as usize);
            // SAFETY: `j < MAX_N`, so the level is inside `store`; only
            // addresses are taken here.
            unsafe {
                let l = levels.add(j);
                [
                    (&raw mut (*l).rem).cast(),
                    (&raw mut (*l).used).cast(),
                    (&raw mut (*l).up).cast(),
                    (&raw mut (*l).down).cast(),
                ]
            }
        };
        let mut len = [0usize; MAX_N as usize];
        let root = p.full & !p.blocked[0];
        // SAFETY: index 0 of level 0's arrays.
        unsafe {
            let [rem, used, up, down] = arrays(0);
            rem.write(root as i32);
            used.write(0);
            up.write(0);
            down.write(0);
        }
        len[0] = usize::from(root != 0);

        let mut sums = splat(0);
        let mut total = 0u128;
        let mut steps = 0u64;
        let mut nodes = 0u64;
        let mut j = 0usize;
        loop {
            if len[j] == 0 {
                // Everything below `j` is done (see the module docs): go up.
                if j == 0 {
                    break;
                }
                j -= 1;
                continue;
            }
            let take = len[j].min(LANES);
            let start = len[j] - take;
            nodes += take as u64;
            let lanes = valid(take);
            let [h_rem, h_used, h_up, h_down] = arrays(j);
            // SAFETY: `start + take <= len[j] <= CAP`, so the loads read
            // written values inside the arrays; the compress-stores write at
            // most one vector from `start`, and `start + LANES <= CAP` (either
            // `take == LANES` and `start + LANES == len[j]`, or `start == 0`).
            let (rem, used, up, down) = unsafe {
                (
                    load(h_rem.add(start), lanes),
                    load(h_used.add(start), lanes),
                    load(h_up.add(start), lanes),
                    load(h_down.add(start), lanes),
                )
            };
            let bit = and(rem, neg(rem));
            let rest = xor(rem, bit);
            // Nodes with rows left go back where they were taken from.
            let back = nonzero(rest, lanes);
            // SAFETY: see the loads above; the values just loaded are in
            // registers, so overwriting their slots is fine.
            unsafe {
                compress(h_rem.add(start), back, rest);
                compress(h_used.add(start), back, used);
                compress(h_up.add(start), back, up);
                compress(h_down.add(start), back, down);
            }
            len[j] = start + kept(back);

            let u = or(used, bit);
            let a = or(up, bit);
            let b = or(down, bit);
            if j == last {
                let f1 = andnot(or(or(u, b1), or(shl(a, c1), shr(b, c1))), full);
                let f2 = andnot(or(or(u, b2), or(shl(a, c12), shr(b, c12))), full);
                let both = mul(popcnt(f1), popcnt(f2));
                let same = popcnt(and(f1, f2));
                let lower = popcnt(and(f1, shr(f2, c2)));
                let upper = popcnt(and(f1, shl(f2, c2)));
                let pairs = sub(both, add(add(same, lower), upper));
                sums = add_in(sums, lanes, pairs);
            } else {
                let next = j + 1;
                let s = count_of(p.shift[next]);
                let a = shl(a, s);
                let b = shr(b, s);
                let f = andnot(or(or(u, splat(p.blocked[next])), or(a, b)), full);
                let live = nonzero(f, lanes);
                let at = len[next];
                // The walk is at `j` only while `len[next] < DESCEND` (module
                // docs), so the vector written from `at` stays below `CAP`.
                // Checked anyway: memory safety rests on it, and the branch
                // is never taken.
                assert!(at < DESCEND, "the walk's level invariant broke");
                let [c_rem, c_used, c_up, c_down] = arrays(next);
                // SAFETY: as the line above explains, the stores stay inside.
                unsafe {
                    compress(c_rem.add(at), live, f);
                    compress(c_used.add(at), live, u);
                    compress(c_up.add(at), live, a);
                    compress(c_down.add(at), live, b);
                }
                len[next] = at + kept(live);
                if len[next] >= DESCEND || len[j] == 0 {
                    j = next;
                }
            }
            steps += 1;
            if steps.is_multiple_of(FLUSH) {
                total += lane_sum(sums);
                sums = splat(0);
                if $stop.load(Ordering::Relaxed) {
                    return None;
                }
            }
        }
        total += lane_sum(sums);
        Some((total, nodes))
    }};
}

/// The AVX-512 kernel: sixteen lanes, native masks, compress-stores and
/// popcounts.
mod avx512 {
    use std::arch::x86_64::{
        __m128i, __m512i, _mm_cvtsi32_si128, _mm512_add_epi32, _mm512_and_si512,
        _mm512_andnot_si512, _mm512_mask_add_epi32, _mm512_mask_compressstoreu_epi32,
        _mm512_mask_test_epi32_mask, _mm512_maskz_loadu_epi32, _mm512_mullo_epi32,
        _mm512_or_si512, _mm512_popcnt_epi32, _mm512_set1_epi32, _mm512_setzero_si512,
        _mm512_sll_epi32, _mm512_srl_epi32, _mm512_storeu_si512, _mm512_sub_epi32,
        _mm512_xor_si512,
    };

    use super::*;

    const LANES: usize = 16;

    /// Counts on this kernel; see [`super::count`].
    #[target_feature(enable = "avx512f,avx512vpopcntdq,popcnt")]
    pub(super) fn count(p: &Problem<'_>, stop: &AtomicBool) -> Option<(u128, u64)> {
        walk!(p, stop)
    }

    #[target_feature(enable = "avx512f")]
    fn splat(x: u32) -> __m512i {
        _mm512_set1_epi32(x as i32)
    }

    /// The first `take` lanes.
    #[target_feature(enable = "avx512f")]
    fn valid(take: usize) -> u16 {
        ((1u32 << take) - 1) as u16
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn load(p: *const i32, lanes: u16) -> __m512i {
        // SAFETY: the caller's; lanes outside `lanes` are not read.
        unsafe { _mm512_maskz_loadu_epi32(lanes, p) }
    }

    /// The lanes of `lanes` where `v` is not zero.
    #[target_feature(enable = "avx512f")]
    fn nonzero(v: __m512i, lanes: u16) -> u16 {
        _mm512_mask_test_epi32_mask(lanes, v, v)
    }

    /// How many lanes `sel` keeps.
    #[target_feature(enable = "avx512f,popcnt")]
    fn kept(sel: u16) -> usize {
        sel.count_ones() as usize
    }

    /// Stores the lanes of `sel`, contiguously, from `p`.
    #[target_feature(enable = "avx512f")]
    unsafe fn compress(p: *mut i32, sel: u16, v: __m512i) {
        // SAFETY: the caller's; at most 16 values are written.
        unsafe { _mm512_mask_compressstoreu_epi32(p, sel, v) }
    }

    /// `acc + x` in the lanes of `lanes`, `acc` elsewhere.
    #[target_feature(enable = "avx512f")]
    fn add_in(acc: __m512i, lanes: u16, x: __m512i) -> __m512i {
        _mm512_mask_add_epi32(acc, lanes, acc, x)
    }

    #[target_feature(enable = "avx512f")]
    fn and(a: __m512i, b: __m512i) -> __m512i {
        _mm512_and_si512(a, b)
    }

    #[target_feature(enable = "avx512f")]
    fn or(a: __m512i, b: __m512i) -> __m512i {
        _mm512_or_si512(a, b)
    }

    #[target_feature(enable = "avx512f")]
    fn xor(a: __m512i, b: __m512i) -> __m512i {
        _mm512_xor_si512(a, b)
    }

    /// `!a & b`.
    #[target_feature(enable = "avx512f")]
    fn andnot(a: __m512i, b: __m512i) -> __m512i {
        _mm512_andnot_si512(a, b)
    }

    #[target_feature(enable = "avx512f")]
    fn neg(a: __m512i) -> __m512i {
        _mm512_sub_epi32(_mm512_setzero_si512(), a)
    }

    #[target_feature(enable = "avx512f")]
    fn add(a: __m512i, b: __m512i) -> __m512i {
        _mm512_add_epi32(a, b)
    }

    #[target_feature(enable = "avx512f")]
    fn sub(a: __m512i, b: __m512i) -> __m512i {
        _mm512_sub_epi32(a, b)
    }

    #[target_feature(enable = "avx512f")]
    fn mul(a: __m512i, b: __m512i) -> __m512i {
        _mm512_mullo_epi32(a, b)
    }

    /// A shift distance as the shift instructions take it.
    #[target_feature(enable = "avx512f")]
    fn count_of(s: u32) -> __m128i {
        _mm_cvtsi32_si128(s as i32)
    }

    /// Shift left by `count_of(s)` bits (0 for `s ≥ 32`).
    #[target_feature(enable = "avx512f")]
    fn shl(a: __m512i, s: __m128i) -> __m512i {
        _mm512_sll_epi32(a, s)
    }

    /// Shift right by `count_of(s)` bits (0 for `s ≥ 32`).
    #[target_feature(enable = "avx512f")]
    fn shr(a: __m512i, s: __m128i) -> __m512i {
        _mm512_srl_epi32(a, s)
    }

    #[target_feature(enable = "avx512f,avx512vpopcntdq")]
    fn popcnt(a: __m512i) -> __m512i {
        _mm512_popcnt_epi32(a)
    }

    /// The sum of the lanes, each an unsigned count.
    #[target_feature(enable = "avx512f")]
    fn lane_sum(v: __m512i) -> u128 {
        let mut lanes = [0u32; LANES];
        // SAFETY: `lanes` is 64 bytes long; the store is unaligned.
        unsafe { _mm512_storeu_si512(lanes.as_mut_ptr().cast(), v) };
        lanes.iter().map(|&x| u128::from(x)).sum()
    }
}

/// The AVX2 kernel: eight lanes; masks are vectors, compress-stores are
/// permutations from a table, popcounts are nibble lookups.
mod avx2 {
    use std::arch::x86_64::{
        __m128i, __m256i, _mm_cvtsi32_si128, _mm256_add_epi8, _mm256_add_epi32,
        _mm256_and_si256, _mm256_andnot_si256, _mm256_castsi256_ps, _mm256_cmpeq_epi32,
        _mm256_cmpgt_epi32, _mm256_loadu_si256, _mm256_madd_epi16, _mm256_maddubs_epi16,
        _mm256_maskload_epi32, _mm256_movemask_ps, _mm256_mullo_epi32, _mm256_or_si256,
        _mm256_permutevar8x32_epi32, _mm256_set1_epi8, _mm256_set1_epi16,
        _mm256_set1_epi32, _mm256_setr_epi8, _mm256_setr_epi32, _mm256_setzero_si256,
        _mm256_shuffle_epi8, _mm256_sll_epi32, _mm256_srl_epi32, _mm256_srli_epi16,
        _mm256_storeu_si256, _mm256_sub_epi32, _mm256_xor_si256,
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
    fn add(a: __m256i, b: __m256i) -> __m256i {
        _mm256_add_epi32(a, b)
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

    /// Bits set in each lane: a 4-bit lookup per nibble, then the four byte
    /// counts of each lane added by two multiply-adds.
    #[target_feature(enable = "avx2")]
    fn popcnt(a: __m256i) -> __m256i {
        let table = _mm256_setr_epi8(
            0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4, //
            0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4,
        );
        let nibble = _mm256_set1_epi8(0x0f);
        let low = _mm256_shuffle_epi8(table, _mm256_and_si256(a, nibble));
        let high =
            _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(a, 4), nibble));
        let bytes = _mm256_add_epi8(low, high);
        let pairs = _mm256_maddubs_epi16(bytes, _mm256_set1_epi8(1));
        _mm256_madd_epi16(pairs, _mm256_set1_epi16(1))
    }

    /// The sum of the lanes, each an unsigned count.
    #[target_feature(enable = "avx2")]
    fn lane_sum(v: __m256i) -> u128 {
        let mut lanes = [0u32; LANES];
        // SAFETY: `lanes` is 32 bytes long; the store is unaligned.
        unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), v) };
        lanes.iter().map(|&x| u128::from(x)).sum()
    }
}
