//! The SIMD count kernels: sixteen (AVX-512) or eight (AVX2, NEON) search
//! nodes per step.
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
//! than `DESCEND` plus one vector of nodes, and memory stays around a hundred
//! kilobytes for the levels in use, in L2 cache.
//!
//! The walk is written once, in the `walk!` macro, and expanded inside each
//! kernel's module, whose functions (all compiled for that instruction set)
//! provide the vector operations. AVX2 has no compress-store and no vector
//! popcount: its module builds them from a permutation table and a nibble
//! lookup. NEON (aarch64) has a byte popcount (`cnt`) but neither
//! compress-stores, masked loads nor lane masks as bits: its module works on
//! pairs of 128-bit registers, compresses each half through a `tbl` byte
//! permutation from a 16-entry table, and reads lane masks with an add across
//! the vector.
//!
//! # Exactness
//!
//! A lane's sum grows by at most `32 · 32` per step (the closed form counts
//! pairs of rows) and is moved into a `u128` every [`FLUSH`] steps, so lanes
//! stay below `2¹² · 2¹⁰`, far from `u32` overflow. Lanes outside a step's
//! vector are kept out of every sum and every store by the same masks.
//!
//! # Nodes
//!
//! Every step places one queen in each of its `take` lanes, so the walk counts
//! `take` nodes per step: the queens placed in the searched columns, that is
//! every column but the last two. The scalar kernel counts the same placements
//! (`search::CountStats::nodes`), so node rates compare across kernels.

use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::board::MAX_N;

/// The widest vector, in lanes.
const MAX_LANES: usize = 16;
/// The walk moves down a level once the next level holds this many nodes.
/// Larger values fill more vectors completely near the turns of the walk and
/// make the runs of steps at one level longer; 256 (16 AVX-512 vectors) beat
/// 128 on AVX-512 and tied on AVX2 (BENCHMARKS.md). The buffers of a search
/// then take about 140 KB of stack.
const DESCEND: usize = 256;
/// Capacity of a level's buffer: see the module docs for the bound. Every
/// kernel's compress-store writes a whole vector, of which the lanes past the
/// kept ones are junk beyond the buffer's length; this capacity leaves room
/// for it too.
const CAP: usize = DESCEND + MAX_LANES;
/// Steps between moves of the lane sums into the `u128` total, and checks of
/// the stop flag.
const FLUSH: u64 = 1 << 12;

/// A SIMD kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isa {
    /// Sixteen lanes: AVX-512 F and VPOPCNTDQ (and popcnt, which every such
    /// CPU has).
    #[cfg(target_arch = "x86_64")]
    Avx512,
    /// Eight lanes: AVX2 and popcnt.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// Eight lanes in two 128-bit registers: NEON, which every aarch64 CPU
    /// has (it is part of the architecture's baseline).
    #[cfg(target_arch = "aarch64")]
    Neon,
}

impl Isa {
    /// Every SIMD kernel this architecture has, fastest first.
    #[cfg(all(test, target_arch = "x86_64"))]
    pub(crate) const ALL: &'static [Isa] = &[Isa::Avx512, Isa::Avx2];
    /// Every SIMD kernel this architecture has, fastest first.
    #[cfg(all(test, target_arch = "aarch64"))]
    pub(crate) const ALL: &'static [Isa] = &[Isa::Neon];

    /// True when this CPU can run the kernel.
    pub(crate) fn available(self) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512vpopcntdq")
                    && std::arch::is_x86_feature_detected!("popcnt")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("popcnt")
            }
            // The aarch64 targets Rust supports all enable NEON.
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => true,
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
    match isa {
        // SAFETY: the instruction sets each kernel is compiled for were just
        // checked on the running CPU.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { avx512::count(p, stop) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { avx2::count(p, stop) },
        // SAFETY: as above (every aarch64 CPU has NEON).
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => unsafe { neon::count(p, stop) },
    }
}

/// The walk of the module docs, expanded inside a kernel's module: `LANES`,
/// the vector functions (`splat`, `valid`, `load`, `nonzero`, `compress`,
/// `popcnt3`, …),
/// `lane_sum` and `prepare` come from there.
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
        for j in 0..free {
            // SAFETY: `arrays` gives the addresses of level `j`'s arrays.
            unsafe { prepare(arrays(j)) };
        }
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
        // The walk's steps come in runs at one level, in two inner loops
        // (one for `last`, one for the levels above it) that keep the
        // level's length, its arrays and its next level's constants in
        // registers; the order of the steps is the module docs' walk.
        loop {
            if len[j] == 0 {
                // Everything below `j` is done (see the module docs): go up.
                if j == 0 {
                    break;
                }
                j -= 1;
                continue;
            }
            let [h_rem, h_used, h_up, h_down] = arrays(j);
            let mut lj = len[j];
            // Takes one step's nodes off level `j` and puts back those with
            // rows left; gives the lanes taken and their masks with the new
            // queen placed.
            macro_rules! pop {
                () => {{
                    let take = lj.min(LANES);
                    let start = lj - take;
                    nodes += take as u64;
                    let lanes = valid(take);
                    // SAFETY: `start + take <= lj <= CAP`, so the loads read
                    // written values inside the arrays; the compress-stores
                    // write at most one vector from `start`, and
                    // `start + LANES <= CAP` (either `take == LANES` and
                    // `start + LANES == lj`, or `start == 0`).
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
                    // SAFETY: see the loads above; the values just loaded are
                    // in registers, so overwriting their slots is fine.
                    unsafe {
                        compress(h_rem.add(start), back, rest);
                        compress(h_used.add(start), back, used);
                        compress(h_up.add(start), back, up);
                        compress(h_down.add(start), back, down);
                    }
                    lj = start + kept(back);
                    (lanes, or(used, bit), or(up, bit), or(down, bit))
                }};
            }
            // Counts a step and, every `FLUSH` steps, moves the lane sums into
            // the total and reads the stop flag.
            macro_rules! stepped {
                () => {
                    steps += 1;
                    if steps.is_multiple_of(FLUSH) {
                        total += lane_sum(sums);
                        sums = splat(0);
                        if $stop.load(Ordering::Relaxed) {
                            return None;
                        }
                    }
                };
            }
            if j == last {
                // Children are counted, not stored: drain the level.
                while lj > 0 {
                    let (lanes, u, a, b) = pop!();
                    let f1 = andnot(or(or(u, b1), or(shl(a, c1), shr(b, c1))), full);
                    let f2 = andnot(or(or(u, b2), or(shl(a, c12), shr(b, c12))), full);
                    let both = mul(popcnt(f1), popcnt(f2));
                    // The pairs that collide on a row or a diagonal.
                    let clash =
                        popcnt3(and(f1, f2), and(f1, shr(f2, c2)), and(f1, shl(f2, c2)));
                    let pairs = sub(both, clash);
                    sums = add_in(sums, lanes, pairs);
                    stepped!();
                }
                len[j] = 0;
            } else {
                let next = j + 1;
                let s = count_of(p.shift[next]);
                let blocked = splat(p.blocked[next]);
                let [c_rem, c_used, c_up, c_down] = arrays(next);
                let mut ln = len[next];
                // Steps until the next level holds `DESCEND` nodes or this
                // one is empty; then the walk moves down.
                loop {
                    let (lanes, u, a, b) = pop!();
                    let a = shl(a, s);
                    let b = shr(b, s);
                    let f = andnot(or(or(u, blocked), or(a, b)), full);
                    let live = nonzero(f, lanes);
                    // The walk is at `j` only while `ln < DESCEND` (module
                    // docs), so the vector written from `ln` stays below
                    // `CAP`. Checked anyway: memory safety rests on it, and
                    // the branch is never taken.
                    assert!(ln < DESCEND, "the walk's level invariant broke");
                    // SAFETY: as the line above explains, the stores stay
                    // inside.
                    unsafe {
                        compress(c_rem.add(ln), live, f);
                        compress(c_used.add(ln), live, u);
                        compress(c_up.add(ln), live, a);
                        compress(c_down.add(ln), live, b);
                    }
                    ln += kept(live);
                    stepped!();
                    if ln >= DESCEND || lj == 0 {
                        break;
                    }
                }
                len[j] = lj;
                len[next] = ln;
                j = next;
            }
        }
        total += lane_sum(sums);
        Some((total, nodes))
    }};
}

/// The AVX-512 kernel: sixteen lanes, native masks, compress-stores and
/// popcounts.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::{
        __m128i, __m512i, _mm_cvtsi32_si128, _mm512_add_epi32, _mm512_and_si512,
        _mm512_andnot_si512, _mm512_mask_add_epi32, _mm512_mask_test_epi32_mask,
        _mm512_maskz_compress_epi32, _mm512_maskz_loadu_epi32, _mm512_mullo_epi32,
        _mm512_or_si512, _mm512_popcnt_epi32, _mm512_set1_epi32, _mm512_setzero_si512,
        _mm512_sll_epi32, _mm512_srl_epi32, _mm512_storeu_si512, _mm512_sub_epi32,
        _mm512_xor_si512,
    };

    use super::*;

    const LANES: usize = 16;

    /// Nothing to prepare: masked loads read no lane past a level's length.
    unsafe fn prepare(_: [*mut i32; 4]) {}

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

    /// Stores the lanes of `sel`, contiguously, from `p`, followed by zeros
    /// up to a whole vector (sixteen values are always written).
    ///
    /// A compress into a register and a plain store, not the compress-store
    /// instruction: AMD Zen 4 runs `vpcompressd` to memory as microcode, some
    /// ten times slower than the register form (BENCHMARKS.md).
    #[target_feature(enable = "avx512f")]
    unsafe fn compress(p: *mut i32, sel: u16, v: __m512i) {
        // SAFETY: the caller's; sixteen values are written.
        unsafe { _mm512_storeu_si512(p.cast(), _mm512_maskz_compress_epi32(sel, v)) }
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

    /// `popcnt(a) + popcnt(b) + popcnt(c)`.
    #[target_feature(enable = "avx512f,avx512vpopcntdq")]
    fn popcnt3(a: __m512i, b: __m512i, c: __m512i) -> __m512i {
        add(add(popcnt(a), popcnt(b)), popcnt(c))
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
#[cfg(target_arch = "x86_64")]
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

    /// Nothing to prepare: masked loads read no lane past a level's length.
    unsafe fn prepare(_: [*mut i32; 4]) {}

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
}

/// The NEON kernel (aarch64): eight lanes in a pair of 128-bit registers, so
/// that each step issues two independent instructions per operation (ARM
/// cores have two to four 128-bit vector pipes). Masks are vectors;
/// compress-stores are `tbl` byte permutations from a 16-entry table, one per
/// half; popcounts are byte counts (`cnt`) widened by pairwise adds.
///
/// NEON has no masked load: the walk's loads read whole vectors, and the first
/// vector of every level is zeroed by `prepare`, so that the lanes past a
/// short level's length hold written values (zeros or old nodes). The masks
/// keep those lanes out of every sum and store, as on AVX2.
#[cfg(target_arch = "aarch64")]
mod neon {
    use std::arch::aarch64::{
        int32x4_t, uint32x4_t, vaddlvq_u32, vaddq_u8, vaddq_u32, vaddvq_u32, vandq_u32,
        vbicq_u32, vcltq_u32, vcntq_u8, vdupq_n_s32, vdupq_n_u32, veorq_u32, vld1q_u8,
        vld1q_u32, vmulq_u32, vorrq_u32, vpaddlq_u8, vpaddlq_u16, vqtbl1q_u8,
        vreinterpretq_u8_u32, vreinterpretq_u32_u8, vshlq_u32, vst1q_u32, vsubq_u32,
        vtstq_u32,
    };

    use super::*;

    const LANES: usize = 8;

    /// Eight 32-bit lanes: lanes 0–3 in the first register, 4–7 in the second.
    #[derive(Clone, Copy)]
    struct V(uint32x4_t, uint32x4_t);

    /// A shift distance as `vshlq_u32` takes it: `s` to shift left, `-s` to
    /// shift right.
    #[derive(Clone, Copy)]
    struct Shift {
        left: int32x4_t,
        right: int32x4_t,
    }

    /// `COMPRESS[m]`: the bytes of the 32-bit lanes set in `m` (four bits), in
    /// order, then zeros: the `tbl` permutation that packs those lanes at the
    /// front of a register.
    static COMPRESS: [[u8; 16]; 16] = {
        let mut table = [[0u8; 16]; 16];
        let mut m = 0;
        while m < 16 {
            let (mut lane, mut out) = (0usize, 0usize);
            while lane < 4 {
                if m & (1 << lane) != 0 {
                    let mut byte = 0;
                    while byte < 4 {
                        table[m][4 * out + byte] = (4 * lane + byte) as u8;
                        byte += 1;
                    }
                    out += 1;
                }
                lane += 1;
            }
            m += 1;
        }
        table
    };

    /// `ONES[m]`: bits set in `m`. A load is cheaper than `count_ones`, which
    /// aarch64 before v8.9 computes through the vector unit.
    static ONES: [u8; 256] = {
        let mut table = [0u8; 256];
        let mut m = 0;
        while m < 256 {
            table[m] = (m as u32).count_ones() as u8;
            m += 1;
        }
        table
    };

    /// Lane numbers, and the bit of each lane in a mask vector.
    static IOTA: [u32; 8] = [0, 1, 2, 3, 4, 5, 6, 7];
    static BITS: [u32; 4] = [1, 2, 4, 8];

    /// Counts on this kernel; see [`super::count`].
    #[target_feature(enable = "neon")]
    pub(super) fn count(p: &Problem<'_>, stop: &AtomicBool) -> Option<(u128, u64)> {
        walk!(p, stop)
    }

    /// Zeroes the first vector of a level's four arrays (see the module docs).
    ///
    /// # Safety
    ///
    /// Each pointer must be valid for writing `LANES` values.
    #[target_feature(enable = "neon")]
    unsafe fn prepare(arrays: [*mut i32; 4]) {
        for a in arrays {
            // SAFETY: the caller's.
            unsafe { a.cast::<[i32; LANES]>().write([0; LANES]) };
        }
    }

    /// `f` on both halves.
    #[target_feature(enable = "neon")]
    fn map2(a: V, b: V, f: impl Fn(uint32x4_t, uint32x4_t) -> uint32x4_t) -> V {
        V(f(a.0, b.0), f(a.1, b.1))
    }

    #[target_feature(enable = "neon")]
    fn splat(x: u32) -> V {
        let v = vdupq_n_u32(x);
        V(v, v)
    }

    /// The first `take` lanes, as a vector mask (all ones in those lanes).
    #[target_feature(enable = "neon")]
    fn valid(take: usize) -> V {
        let t = vdupq_n_u32(take as u32);
        // SAFETY: `IOTA` holds eight values.
        let (lo, hi) =
            unsafe { (vld1q_u32(IOTA.as_ptr()), vld1q_u32(IOTA.as_ptr().add(4))) };
        V(vcltq_u32(lo, t), vcltq_u32(hi, t))
    }

    /// Eight values from `p`; the lanes outside `lanes` are read but ignored.
    ///
    /// # Safety
    ///
    /// `p` must be valid for reading eight initialised values.
    #[target_feature(enable = "neon")]
    unsafe fn load(p: *const i32, _lanes: V) -> V {
        // SAFETY: the caller's; the walk's reads stay below `CAP` and every
        // value read was written (by `prepare` or by a store).
        unsafe { V(vld1q_u32(p.cast()), vld1q_u32(p.add(4).cast())) }
    }

    /// A four-lane mask vector as bits.
    #[target_feature(enable = "neon")]
    fn bits(m: uint32x4_t) -> u32 {
        // SAFETY: `BITS` holds four values.
        vaddvq_u32(vandq_u32(m, unsafe { vld1q_u32(BITS.as_ptr()) }))
    }

    /// The lanes of `lanes` where `v` is not zero, as bits.
    #[target_feature(enable = "neon")]
    fn nonzero(v: V, lanes: V) -> u32 {
        let m = map2(v, lanes, |v, l| vandq_u32(vtstq_u32(v, v), l));
        bits(m.0) | bits(m.1) << 4
    }

    /// How many lanes `sel` keeps.
    #[target_feature(enable = "neon")]
    fn kept(sel: u32) -> usize {
        usize::from(ONES[(sel & 0xff) as usize])
    }

    /// One half, its lanes of `sel` packed at the front.
    #[target_feature(enable = "neon")]
    fn packed(v: uint32x4_t, sel: u32) -> uint32x4_t {
        // SAFETY: each row of `COMPRESS` holds sixteen bytes.
        let idx = unsafe { vld1q_u8(COMPRESS[(sel & 0xf) as usize].as_ptr()) };
        vreinterpretq_u32_u8(vqtbl1q_u8(vreinterpretq_u8_u32(v), idx))
    }

    /// Stores the lanes of `sel`, contiguously, from `p`, followed by junk up
    /// to a whole vector (the values written end at most eight past `p`).
    ///
    /// # Safety
    ///
    /// `p` must be valid for writing eight values.
    #[target_feature(enable = "neon")]
    unsafe fn compress(p: *mut i32, sel: u32, v: V) {
        let low = usize::from(ONES[(sel & 0xf) as usize]);
        // SAFETY: the caller's; the second store ends at `p + low + 4`, and
        // `low ≤ 4`.
        unsafe {
            vst1q_u32(p.cast(), packed(v.0, sel));
            vst1q_u32(p.add(low).cast(), packed(v.1, sel >> 4));
        }
    }

    /// `acc + x` in the lanes of `lanes`, `acc` elsewhere.
    #[target_feature(enable = "neon")]
    fn add_in(acc: V, lanes: V, x: V) -> V {
        add(acc, and(x, lanes))
    }

    #[target_feature(enable = "neon")]
    fn and(a: V, b: V) -> V {
        map2(a, b, |a, b| vandq_u32(a, b))
    }

    #[target_feature(enable = "neon")]
    fn or(a: V, b: V) -> V {
        map2(a, b, |a, b| vorrq_u32(a, b))
    }

    #[target_feature(enable = "neon")]
    fn xor(a: V, b: V) -> V {
        map2(a, b, |a, b| veorq_u32(a, b))
    }

    /// `!a & b`.
    #[target_feature(enable = "neon")]
    fn andnot(a: V, b: V) -> V {
        map2(a, b, |a, b| vbicq_u32(b, a))
    }

    #[target_feature(enable = "neon")]
    fn neg(a: V) -> V {
        sub(splat(0), a)
    }

    #[target_feature(enable = "neon")]
    fn add(a: V, b: V) -> V {
        map2(a, b, |a, b| vaddq_u32(a, b))
    }

    #[target_feature(enable = "neon")]
    fn sub(a: V, b: V) -> V {
        map2(a, b, |a, b| vsubq_u32(a, b))
    }

    #[target_feature(enable = "neon")]
    fn mul(a: V, b: V) -> V {
        map2(a, b, |a, b| vmulq_u32(a, b))
    }

    /// A shift distance as the shift instructions take it.
    #[target_feature(enable = "neon")]
    fn count_of(s: u32) -> Shift {
        // Distances are below 64, so they fit the signed byte that `ushl`
        // reads.
        let s = s as i32;
        Shift {
            left: vdupq_n_s32(s),
            right: vdupq_n_s32(-s),
        }
    }

    /// Shift left by `s` bits (0 for `s ≥ 32`, as `ushl` gives).
    #[target_feature(enable = "neon")]
    fn shl(a: V, s: Shift) -> V {
        V(vshlq_u32(a.0, s.left), vshlq_u32(a.1, s.left))
    }

    /// Shift right by `s` bits (0 for `s ≥ 32`): `ushl` by a negative amount.
    #[target_feature(enable = "neon")]
    fn shr(a: V, s: Shift) -> V {
        V(vshlq_u32(a.0, s.right), vshlq_u32(a.1, s.right))
    }

    /// Bits set in each lane: byte counts, widened by two pairwise adds.
    #[target_feature(enable = "neon")]
    fn popcnt(a: V) -> V {
        let half =
            |x: uint32x4_t| vpaddlq_u16(vpaddlq_u8(vcntq_u8(vreinterpretq_u8_u32(x))));
        V(half(a.0), half(a.1))
    }

    /// `popcnt(a) + popcnt(b) + popcnt(c)`, added as bytes (at most 24 each)
    /// and widened once.
    #[target_feature(enable = "neon")]
    fn popcnt3(a: V, b: V, c: V) -> V {
        let half = |a: uint32x4_t, b: uint32x4_t, c: uint32x4_t| {
            let count = |x: uint32x4_t| vcntq_u8(vreinterpretq_u8_u32(x));
            let bytes = vaddq_u8(vaddq_u8(count(a), count(b)), count(c));
            vpaddlq_u16(vpaddlq_u8(bytes))
        };
        V(half(a.0, b.0, c.0), half(a.1, b.1, c.1))
    }

    /// The sum of the lanes, each an unsigned count.
    #[target_feature(enable = "neon")]
    fn lane_sum(v: V) -> u128 {
        u128::from(vaddlvq_u32(v.0)) + u128::from(vaddlvq_u32(v.1))
    }
}
