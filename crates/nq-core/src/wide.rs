//! The AVX-512 count kernel: sixteen search nodes per instruction.
//!
//! The scalar kernel in [`crate::search`] spends most of its time on branches
//! it cannot predict: whether a column still has a free row, whether a
//! placement leaves the next column empty. This kernel removes those branches
//! by expanding sixteen nodes of the same search level at once, one SIMD lane
//! each, and turning every such decision into a lane mask.
//!
//! # Traversal
//!
//! Each level `j` of the search (free column `j` of the plan) has a buffer of
//! nodes, stored as four arrays: the free rows left to try (`rem`), and the
//! `used`, `up` and `down` masks as seen from column `j` (the same state the
//! scalar kernel keeps, see its module docs). One *step* at level `j` takes up
//! to sixteen nodes off the end of its buffer and, in every lane at once,
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
//! empty. So at most one level is being filled at a time, each buffer holds
//! fewer than `DESCEND + 16` nodes, and memory stays a few tens of kilobytes,
//! in L1/L2 cache.
//!
//! # Exactness
//!
//! A lane's sum grows by at most `32 · 32` per step (the closed form counts
//! pairs of rows) and is moved into a `u128` every [`FLUSH`] steps, so lanes
//! stay below `2²⁰ · 2¹⁰`, far from `u32` overflow. Lanes outside the step's
//! mask are kept out of every sum and store by the same masks.

use std::arch::x86_64::{
    __m512i, __mmask16, _mm_cvtsi32_si128, _mm512_add_epi32, _mm512_and_si512,
    _mm512_andnot_si512, _mm512_mask_add_epi32, _mm512_mask_compressstoreu_epi32,
    _mm512_mask_test_epi32_mask, _mm512_maskz_loadu_epi32, _mm512_mullo_epi32,
    _mm512_or_si512, _mm512_popcnt_epi32, _mm512_set1_epi32, _mm512_setzero_si512,
    _mm512_sll_epi32, _mm512_srl_epi32, _mm512_storeu_si512, _mm512_sub_epi32,
    _mm512_xor_si512,
};
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::board::MAX_N;

/// Nodes per vector.
const LANES: usize = 16;
/// The walk moves down a level once the next level holds this many nodes.
/// Larger values fill more vectors completely near the turns of the walk;
/// beyond a few vectors nothing more is gained.
const DESCEND: usize = 128;
/// Capacity of a level's buffer: see the module docs for the bound.
const CAP: usize = DESCEND + LANES;
/// Steps between moves of the lane sums into the `u128` total, and checks of
/// the stop flag.
const FLUSH: u64 = 1 << 12;

/// True when this CPU can run the kernel.
pub(crate) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512vpopcntdq")
}

/// The nodes waiting at one level, as structure-of-arrays.
#[repr(C, align(64))]
struct Level {
    rem: [i32; CAP],
    used: [i32; CAP],
    up: [i32; CAP],
    down: [i32; CAP],
}

/// What the kernel needs of a plan (see `search::Plan`).
pub(crate) struct Problem<'a> {
    /// Rows the search may use.
    pub full: u32,
    /// Distance from the previous free column, per free column.
    pub shift: &'a [u32],
    /// Rows blocked by the prefix, per free column.
    pub blocked: &'a [u32],
}

/// Counts the completions of `p`, which must have at least four free columns.
/// Returns the count and the number of nodes expanded, or `None` when `stop`
/// was set.
///
/// Callers must check [`available`] first (the call is `unsafe` outside code
/// compiled for these features).
#[target_feature(enable = "avx512f,avx512vpopcntdq,popcnt")]
pub(crate) fn count(p: &Problem<'_>, stop: &AtomicBool) -> Option<(u128, u64)> {
    let free = p.shift.len();
    assert!(
        (4..=MAX_N as usize).contains(&free) && p.blocked.len() == free,
        "the wide kernel needs 4 to 32 free columns"
    );
    // The deepest level that is stored; its children are counted in closed
    // form together with the last two columns.
    let last = free - 3;
    let s1 = p.shift[free - 2];
    let s2 = p.shift[free - 1];
    let vfull = _mm512_set1_epi32(p.full as i32);
    let vb1 = _mm512_set1_epi32(p.blocked[free - 2] as i32);
    let vb2 = _mm512_set1_epi32(p.blocked[free - 1] as i32);
    let sh1 = _mm_cvtsi32_si128(s1 as i32);
    let sh12 = _mm_cvtsi32_si128((s1 + s2) as i32);
    let sh2 = _mm_cvtsi32_si128(s2 as i32);

    // The buffers are not initialised: every value is written before it is
    // read (a level's values below its `len`), and masked loads read no lane
    // outside their mask, so a search of any size starts at no cost.
    let mut store = MaybeUninit::<[Level; MAX_N as usize]>::uninit();
    let levels: *mut Level = store.as_mut_ptr().cast();
    // The four arrays of level `j`: rem, used, up, down.
    let arrays = |j: usize| -> [*mut i32; 4] {
        assert!(j < MAX_N as usize);
        // SAFETY: `j < MAX_N`, so the level is inside `store`; only addresses
        // are taken here.
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
    let root = (p.full & !p.blocked[0]) as i32;
    // SAFETY: index 0 of level 0's arrays.
    unsafe {
        let [rem, used, up, down] = arrays(0);
        rem.write(root);
        used.write(0);
        up.write(0);
        down.write(0);
    }
    len[0] = usize::from(root != 0);

    let mut sums = _mm512_setzero_si512();
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
        let k: __mmask16 = (((1u32 << take) - 1) & 0xffff) as u16;
        nodes += take as u64;
        let [h_rem, h_used, h_up, h_down] = arrays(j);
        // SAFETY: `start + take <= len[j] <= CAP`, so the loads read written
        // values inside the arrays, and the compress-stores write
        // `popcount(back) <= take` values from `start`, also inside.
        let (rem, used, up, down, back) = unsafe {
            let rem = _mm512_maskz_loadu_epi32(k, h_rem.add(start));
            let used = _mm512_maskz_loadu_epi32(k, h_used.add(start));
            let up = _mm512_maskz_loadu_epi32(k, h_up.add(start));
            let down = _mm512_maskz_loadu_epi32(k, h_down.add(start));
            let bit =
                _mm512_and_si512(rem, _mm512_sub_epi32(_mm512_setzero_si512(), rem));
            let rest = _mm512_xor_si512(rem, bit);
            // Nodes with rows left go back where they were taken from.
            let back = _mm512_mask_test_epi32_mask(k, rest, rest);
            _mm512_mask_compressstoreu_epi32(h_rem.add(start), back, rest);
            _mm512_mask_compressstoreu_epi32(h_used.add(start), back, used);
            _mm512_mask_compressstoreu_epi32(h_up.add(start), back, up);
            _mm512_mask_compressstoreu_epi32(h_down.add(start), back, down);
            (rem, used, up, down, back)
        };
        let bit = _mm512_and_si512(rem, _mm512_sub_epi32(_mm512_setzero_si512(), rem));
        len[j] = start + back.count_ones() as usize;

        let u = _mm512_or_si512(used, bit);
        let a = _mm512_or_si512(up, bit);
        let b = _mm512_or_si512(down, bit);
        if j == last {
            let f1 = _mm512_andnot_si512(
                _mm512_or_si512(
                    _mm512_or_si512(u, vb1),
                    _mm512_or_si512(_mm512_sll_epi32(a, sh1), _mm512_srl_epi32(b, sh1)),
                ),
                vfull,
            );
            let f2 = _mm512_andnot_si512(
                _mm512_or_si512(
                    _mm512_or_si512(u, vb2),
                    _mm512_or_si512(_mm512_sll_epi32(a, sh12), _mm512_srl_epi32(b, sh12)),
                ),
                vfull,
            );
            let both =
                _mm512_mullo_epi32(_mm512_popcnt_epi32(f1), _mm512_popcnt_epi32(f2));
            let same = _mm512_popcnt_epi32(_mm512_and_si512(f1, f2));
            let lower =
                _mm512_popcnt_epi32(_mm512_and_si512(f1, _mm512_srl_epi32(f2, sh2)));
            let upper =
                _mm512_popcnt_epi32(_mm512_and_si512(f1, _mm512_sll_epi32(f2, sh2)));
            let pairs = _mm512_sub_epi32(
                both,
                _mm512_add_epi32(_mm512_add_epi32(same, lower), upper),
            );
            sums = _mm512_mask_add_epi32(sums, k, sums, pairs);
        } else {
            let next = j + 1;
            let sh = _mm_cvtsi32_si128(p.shift[next] as i32);
            let a = _mm512_sll_epi32(a, sh);
            let b = _mm512_srl_epi32(b, sh);
            let bl = _mm512_set1_epi32(p.blocked[next] as i32);
            let f = _mm512_andnot_si512(
                _mm512_or_si512(_mm512_or_si512(u, bl), _mm512_or_si512(a, b)),
                vfull,
            );
            let live = _mm512_mask_test_epi32_mask(k, f, f);
            let at = len[next];
            // The walk is at `j` only while `len[next] < DESCEND`, so the at
            // most 16 values written from `at` stay below `CAP`.
            debug_assert!(at < DESCEND);
            let [c_rem, c_used, c_up, c_down] = arrays(next);
            // SAFETY: as the line above explains, the stores stay inside.
            unsafe {
                _mm512_mask_compressstoreu_epi32(c_rem.add(at), live, f);
                _mm512_mask_compressstoreu_epi32(c_used.add(at), live, u);
                _mm512_mask_compressstoreu_epi32(c_up.add(at), live, a);
                _mm512_mask_compressstoreu_epi32(c_down.add(at), live, b);
            }
            len[next] = at + live.count_ones() as usize;
            if len[next] >= DESCEND || len[j] == 0 {
                j = next;
            }
        }
        steps += 1;
        if steps.is_multiple_of(FLUSH) {
            total += lane_sum(sums);
            sums = _mm512_setzero_si512();
            if stop.load(Ordering::Relaxed) {
                return None;
            }
        }
    }
    total += lane_sum(sums);
    Some((total, nodes))
}

/// The sum of the sixteen lanes, each an unsigned count.
#[target_feature(enable = "avx512f")]
fn lane_sum(v: __m512i) -> u128 {
    let mut lanes = [0u32; LANES];
    // SAFETY: `lanes` is 64 bytes long; the store is unaligned.
    unsafe { _mm512_storeu_si512(lanes.as_mut_ptr().cast(), v) };
    lanes.iter().map(|&x| u128::from(x)).sum()
}
