//! The count kernels that walk the search tree level by level: sixteen
//! (AVX-512), eight (AVX2, NEON) or one (the portable scalar kernel) search
//! nodes per step.
//!
//! A depth-first search ([`crate::search`]'s reference kernel) spends most of
//! its time on branches it cannot predict: whether a column still has a free
//! row, whether a placement leaves the next column empty. These kernels remove
//! those branches by expanding a run of nodes of the same search level, one
//! vector of them (one SIMD lane each) per step, and turning every such
//! decision into a lane mask and a store whose index advances by the mask.
//! With one lane the same walk is the portable scalar kernel: branch-free, it
//! is about twice as fast as the depth-first search (BENCHMARKS.md).
//!
//! # Traversal
//!
//! Each level `j` of the search (free column `j` of the plan) has a buffer of
//! nodes, stored as four arrays: the free rows left to try (`rem`), and the
//! `used`, `up` and `down` masks as seen from column `j` (the same state the
//! depth-first search keeps, see its module docs). One *step* at level `j`
//! takes up to one vector of nodes of its buffer and, in every lane at once,
//! places a queen on the lowest row of `rem`:
//!
//! * the node stays at level `j` if it has rows left (compress-store);
//! * the child goes to level `j + 1` if its column has a free row;
//! * at the deepest searched level (`last`, three columns from the end) the
//!   child is not stored: its completions over the last two columns are
//!   counted in closed form (`pairs`, as in the scalar kernel) and added to
//!   the lane's running sum.
//!
//! Steps come in *passes*. A pass reads a run of nodes of one level in order,
//! one vector per step, and writes the nodes with rows left back over those
//! already read, compacted, so that it takes one queen of every node in the
//! run. The loads run ahead of the stores and never read what a recent store
//! wrote. (The first version of the walk took each step's vector off the end
//! of the buffer and so reloaded, at another offset, the slots that the step
//! before had just compress-stored; store-to-load forwarding cannot serve such
//! a load, and the CPU waited for the store on every step. Passes made AVX2
//! 1.9× and AVX-512 1.4× faster on AMD Zen 4, and are what makes the one-lane
//! walk fast.)
//!
//! Every node of the tree is taken exactly once and every placement is tried
//! exactly once, so the counts equal the depth-first search's; only the order
//! of the walk differs. The walk is depth-first over levels. Above `last`, a
//! pass covers the last [`CHUNK`] nodes of the level, and the walk repeats
//! such passes until the next level holds [`DESCEND`] nodes (enough for full
//! vectors and long passes) or the current level is empty, then moves down.
//! At `last`, passes cover the whole level until it is empty. The walk moves
//! up when the current level is empty. Hence the invariant the stores rely
//! on: while the walk is at level `j`, the levels deeper than `j + 1` are
//! empty and, when a pass starts, level `j + 1` holds fewer than `DESCEND`
//! nodes (the walk moved down as soon as it reached that, and returns only
//! once the deeper level is empty); a pass adds at most `CHUNK`. So each
//! buffer holds fewer than `DESCEND + CHUNK` plus one vector of nodes: about
//! 10 KB per level, 340 KB of stack in all, of which a search touches only
//! the levels it reaches.
//!
//! The walk is written once, in the `walk!` macro, and expanded inside each
//! kernel's module, whose functions (all compiled for that instruction set)
//! provide the vector operations; the portable module's "vectors" are plain
//! `u32`s. AVX2 has no compress-store and no vector
//! popcount: its module builds them from a permutation table and a nibble
//! lookup. NEON (aarch64) has a byte popcount (`cnt`) but neither
//! compress-stores, masked loads nor lane masks as bits: its module works on
//! pairs of 128-bit registers, compresses each half through a `tbl` byte
//! permutation from a 16-entry table, reads lane masks with an add across
//! the vector, and loads the short last step of a pass through a copy.
//!
//! # Exactness
//!
//! A lane's sum grows by at most `32 · 32` per step (the closed form counts
//! pairs of rows) and is moved into a `u128` at the end of the pass in which
//! [`FLUSH`] steps have passed since the last move: after fewer than
//! `FLUSH + CAP` steps, so lanes stay below `2¹³ · 2¹⁰`, far from `u32`
//! overflow. Lanes outside a step's
//! vector are kept out of every sum and every store by the same masks.
//!
//! # Nodes
//!
//! A pass places one queen in each node it covers, so the walk counts those
//! nodes per pass: the queens placed in the searched columns, that is every
//! column but the last two. The depth-first search counts the same
//! placements (`search::CountStats::nodes`), so node rates compare across
//! kernels.

use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::board::MAX_N;

/// The widest vector, in lanes.
const MAX_LANES: usize = 16;
/// The walk moves down a level once the next level holds this many nodes.
/// Larger values fill more vectors completely near the turns of the walk and
/// make the runs of steps at one level longer. With passes, 512 beat 256 by
/// 4–7 % on every kernel and larger values gained nothing (BENCHMARKS.md).
const DESCEND: usize = 512;
/// The nodes of a level that one pass above `last` takes a queen of: the
/// bound on what a pass adds to the next level. 128 and 256 tied; 64 and
/// below were slower (shorter passes).
const CHUNK: usize = 128;
/// Capacity of a level's buffer: see the module docs for the bound. Every
/// kernel's compress-store writes a whole vector, of which the lanes past the
/// kept ones are junk beyond the buffer's length; this capacity leaves room
/// for it too.
const CAP: usize = DESCEND + CHUNK + MAX_LANES;
/// Steps between moves of the lane sums into the `u128` total, and checks of
/// the stop flag (at the end of the pass in which they add up to this).
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
/// `popcnt3`, …) and `lane_sum` come from there.
macro_rules! walk {
    ($p:ident, $stop:ident) => {{
        let p: &Problem<'_> = $p;
        let free = p.shift.len();
        assert!(
            (4..=MAX_N as usize).contains(&free) && p.blocked.len() == free,
            "the walk needs 4 to 32 free columns"
        );
        // The deepest level that is stored; its children are counted in
        // closed form together with the last two columns.
        let last = free - 3;
        let (s1, s2) = (p.shift[free - 2], p.shift[free - 1]);
        let (c1, c12, c2) = (count_of(s1), count_of(s1 + s2), count_of(s2));
        let full = splat(p.full);
        let (b1, b2) = (splat(p.blocked[free - 2]), splat(p.blocked[free - 1]));

        // The buffers are not initialised: every value is written before it
        // is read (a level's values below its `len`), and loads read no lane
        // outside their step, so a search of any size starts at no cost.
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
        // The walk's passes come in runs at one level, in two inner loops
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
            // One step of a pass: takes the nodes `i..i + take` of level `j`,
            // stores those with rows left at `w` (compacted: `w <= i`), and
            // gives the lanes taken and their masks with the new queen placed.
            macro_rules! pass_step {
                ($i:ident, $w:ident, $end:expr) => {{
                    let take = ($end - $i).min(LANES);
                    let lanes = valid(take);
                    // SAFETY: `i + take <= lj`, and `lj + LANES <= CAP` (module
                    // docs), so the loads read written values inside the
                    // arrays. The compress-stores write one vector from
                    // `w <= i`: inside the arrays too, and over no node not
                    // yet read (they end at most at `i + LANES`, and nodes
                    // past `i + take` exist only when `take == LANES`).
                    let (rem, used, up, down) = unsafe {
                        (
                            load(h_rem.add($i), lanes),
                            load(h_used.add($i), lanes),
                            load(h_up.add($i), lanes),
                            load(h_down.add($i), lanes),
                        )
                    };
                    let bit = and(rem, neg(rem));
                    let rest = xor(rem, bit);
                    let back = nonzero(rest, lanes);
                    // SAFETY: see the loads above.
                    unsafe {
                        compress(h_rem.add($w), back, rest);
                        compress(h_used.add($w), back, used);
                        compress(h_up.add($w), back, up);
                        compress(h_down.add($w), back, down);
                    }
                    $w += kept(back);
                    $i += take;
                    (lanes, or(used, bit), or(up, bit), or(down, bit))
                }};
            }
            // Counts a pass over `$n` nodes (one queen placed in each, one
            // step per vector) and, once `FLUSH` steps have passed since it
            // last did, moves the lane sums into the total and reads the stop
            // flag. Once per pass, not per step: the one-lane walk spent a
            // tenth of its instructions on per-step counting.
            macro_rules! passed {
                ($n:expr) => {
                    let n: usize = $n;
                    nodes += n as u64;
                    steps += n.div_ceil(LANES) as u64;
                    if steps >= FLUSH {
                        steps = 0;
                        total += lane_sum(sums);
                        sums = splat(0);
                        if $stop.load(Ordering::Relaxed) {
                            return None;
                        }
                    }
                };
            }
            if j == last {
                // Children are counted, not stored: passes over the whole
                // level until it is empty.
                while lj > 0 {
                    let (mut i, mut w) = (0usize, 0usize);
                    while i < lj {
                        let (lanes, u, a, b) = pass_step!(i, w, lj);
                        let f1 = andnot(or(or(u, b1), or(shl(a, c1), shr(b, c1))), full);
                        let f2 =
                            andnot(or(or(u, b2), or(shl(a, c12), shr(b, c12))), full);
                        let both = mul(popcnt(f1), popcnt(f2));
                        // The pairs that collide on a row or a diagonal.
                        let clash = popcnt3(
                            and(f1, f2),
                            and(f1, shr(f2, c2)),
                            and(f1, shl(f2, c2)),
                        );
                        let pairs = sub(both, clash);
                        sums = add_in(sums, lanes, pairs);
                    }
                    passed!(lj);
                    lj = w;
                }
                len[j] = 0;
            } else {
                let next = j + 1;
                let s = count_of(p.shift[next]);
                let blocked = splat(p.blocked[next]);
                let [c_rem, c_used, c_up, c_down] = arrays(next);
                let mut ln = len[next];
                // Passes over the last `CHUNK` nodes of the level until the
                // next level holds `DESCEND` nodes or this one is empty.
                loop {
                    // A pass adds at most `CHUNK` children, plus the junk of
                    // one vector, to a level below `DESCEND`: within `CAP`.
                    // The walk is at `j` only while `ln < DESCEND` (module
                    // docs); checked anyway, as memory safety rests on it
                    // (the branch is never taken).
                    assert!(ln < DESCEND, "the walk's level invariant broke");
                    let start = lj.saturating_sub(CHUNK);
                    let (mut i, mut w) = (start, start);
                    while i < lj {
                        let (lanes, u, a, b) = pass_step!(i, w, lj);
                        let a = shl(a, s);
                        let b = shr(b, s);
                        let f = andnot(or(or(u, blocked), or(a, b)), full);
                        let live = nonzero(f, lanes);
                        // SAFETY: `ln < DESCEND + CHUNK` (this pass added at
                        // most `CHUNK`), so the vector from `ln` ends within
                        // `CAP`.
                        unsafe {
                            compress(c_rem.add(ln), live, f);
                            compress(c_used.add(ln), live, u);
                            compress(c_up.add(ln), live, a);
                            compress(c_down.add(ln), live, b);
                        }
                        ln += kept(live);
                    }
                    passed!(lj - start);
                    lj = w;
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
        _mm512_or_si512, _mm512_permutexvar_epi32, _mm512_popcnt_epi32,
        _mm512_set1_epi32, _mm512_setr_epi32, _mm512_setzero_si512, _mm512_sll_epi32,
        _mm512_srl_epi32, _mm512_storeu_si512, _mm512_sub_epi32, _mm512_xor_si512,
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

    /// Stores the lanes of `sel`, contiguously, from `p`, followed by junk
    /// (copies of lane 0) up to a whole vector (sixteen values are always
    /// written).
    ///
    /// A permutation and a plain store, not the compress-store instruction:
    /// AMD Zen 4 runs `vpcompressd` to memory as microcode, some ten times
    /// slower than the register form (BENCHMARKS.md). The permutation's
    /// indices are the lane numbers compressed by `sel`, the same for the
    /// four arrays of a step, so the compiler computes them once: one
    /// register compress and four `vpermd` per step and side, instead of
    /// four compresses, which Zen 4 runs more slowly (1–8 % faster at
    /// N = 15 and 16, over several interleaved runs).
    #[target_feature(enable = "avx512f")]
    unsafe fn compress(p: *mut i32, sel: u16, v: __m512i) {
        let lanes =
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        let idx = _mm512_maskz_compress_epi32(sel, lanes);
        // SAFETY: the caller's; sixteen values are written.
        unsafe { _mm512_storeu_si512(p.cast(), _mm512_permutexvar_epi32(idx, v)) }
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
mod avx2;

/// The NEON kernel (aarch64): eight lanes in a pair of 128-bit registers, so
/// that each step issues two independent instructions per operation (ARM
/// cores have two to four 128-bit vector pipes). Masks are vectors;
/// compress-stores are `tbl` byte permutations from a 16-entry table, one per
/// half; popcounts are byte counts (`cnt`) widened by pairwise adds.
///
/// NEON has no masked load: the walk's loads read whole vectors, except the
/// short last step of a pass, whose values are copied into a zeroed vector
/// first (the slots past it may never have been written). The masks keep the
/// lanes past a step out of every sum and store, as on AVX2.
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

    /// The lanes of a step: the first `take`, and as a vector mask (all ones
    /// in those lanes).
    #[derive(Clone, Copy)]
    struct Lanes {
        mask: V,
        take: usize,
    }

    #[target_feature(enable = "neon")]
    fn valid(take: usize) -> Lanes {
        let t = vdupq_n_u32(take as u32);
        // SAFETY: `IOTA` holds eight values.
        let (lo, hi) =
            unsafe { (vld1q_u32(IOTA.as_ptr()), vld1q_u32(IOTA.as_ptr().add(4))) };
        Lanes {
            mask: V(vcltq_u32(lo, t), vcltq_u32(hi, t)),
            take,
        }
    }

    /// The values of `lanes` from `p`, zeros in the other lanes.
    ///
    /// # Safety
    ///
    /// `p` must be valid for reading `lanes.take` initialised values, and
    /// for reading eight when `lanes.take` is eight.
    #[target_feature(enable = "neon")]
    unsafe fn load(p: *const i32, lanes: Lanes) -> V {
        if lanes.take == LANES {
            // SAFETY: the caller's.
            unsafe { V(vld1q_u32(p.cast()), vld1q_u32(p.add(4).cast())) }
        } else {
            // The short last step of a pass: the slots past it may never
            // have been written, so only `take` values are read.
            let mut buf = [0u32; LANES];
            // SAFETY: the caller's; `take < LANES`, the length of `buf`.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    p.cast::<u32>(),
                    buf.as_mut_ptr(),
                    lanes.take,
                );
                V(vld1q_u32(buf.as_ptr()), vld1q_u32(buf.as_ptr().add(4)))
            }
        }
    }

    /// A four-lane mask vector as bits.
    #[target_feature(enable = "neon")]
    fn bits(m: uint32x4_t) -> u32 {
        // SAFETY: `BITS` holds four values.
        vaddvq_u32(vandq_u32(m, unsafe { vld1q_u32(BITS.as_ptr()) }))
    }

    /// The lanes of `lanes` where `v` is not zero, as bits.
    #[target_feature(enable = "neon")]
    fn nonzero(v: V, lanes: Lanes) -> u32 {
        let m = map2(v, lanes.mask, |v, l| vandq_u32(vtstq_u32(v, v), l));
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
    fn add_in(acc: V, lanes: Lanes, x: V) -> V {
        add(acc, and(x, lanes.mask))
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

/// The portable scalar kernel: the walk with one lane, a plain `u32`.
///
/// Nothing here needs an instruction set beyond the baseline; the lane mask
/// of a step is 0 or 1, and a "compress-store" is a store whose index
/// advances by that mask, so the walk has no branch on the search's data.
/// On x86-64 the walk is also compiled with `popcnt`, BMI1 and BMI2 and that
/// copy is chosen at run time where the CPU has them (the generic target has
/// no `popcnt` instruction), as the depth-first search does.
pub(crate) mod portable {
    use super::*;

    const LANES: usize = 1;

    /// Counts on the portable kernel; see [`super::count`], which this is but
    /// for any CPU.
    ///
    /// # Panics
    ///
    /// When `p` has fewer than four free columns.
    pub(crate) fn count(p: &Problem<'_>, stop: &AtomicBool) -> Option<(u128, u64)> {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("popcnt")
                && std::arch::is_x86_feature_detected!("bmi1")
                && std::arch::is_x86_feature_detected!("bmi2")
            {
                // SAFETY: the features this function is compiled with were
                // just detected on the running CPU.
                return unsafe { count_bmi(p, stop) };
            }
        }
        walk_here(p, stop)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "popcnt,bmi1,bmi2")]
    fn count_bmi(p: &Problem<'_>, stop: &AtomicBool) -> Option<(u128, u64)> {
        walk_here(p, stop)
    }

    /// The walk, inlined into each caller so that it is compiled for the
    /// caller's instruction set (as are the functions below, for the same
    /// reason: an outlined call would lose the caller's target features).
    #[inline(always)]
    fn walk_here(p: &Problem<'_>, stop: &AtomicBool) -> Option<(u128, u64)> {
        walk!(p, stop)
    }

    #[inline(always)]
    fn splat(x: u32) -> u32 {
        x
    }

    /// The lane mask of a step of `take` nodes (always one here).
    #[inline(always)]
    fn valid(take: usize) -> u32 {
        u32::from(take > 0)
    }

    /// # Safety
    ///
    /// `p` must be valid for reading one initialised value (every step
    /// takes one node).
    #[inline(always)]
    unsafe fn load(p: *const i32, _lanes: u32) -> u32 {
        // SAFETY: the caller's.
        unsafe { p.read() as u32 }
    }

    #[inline(always)]
    fn nonzero(v: u32, lanes: u32) -> u32 {
        u32::from(v != 0) & lanes
    }

    #[inline(always)]
    fn kept(sel: u32) -> usize {
        sel as usize
    }

    /// Writes `v` at `p`, kept or not: the caller advances its index by
    /// `sel`, so a value not kept is overwritten by the next.
    ///
    /// # Safety
    ///
    /// `p` must be valid for writing one value.
    #[inline(always)]
    unsafe fn compress(p: *mut i32, _sel: u32, v: u32) {
        // SAFETY: the caller's.
        unsafe { p.write(v as i32) }
    }

    /// `acc + x` if the lane is in the step, `acc` otherwise.
    #[inline(always)]
    fn add_in(acc: u32, lanes: u32, x: u32) -> u32 {
        acc.wrapping_add(x & lanes.wrapping_neg())
    }

    #[inline(always)]
    fn and(a: u32, b: u32) -> u32 {
        a & b
    }

    #[inline(always)]
    fn or(a: u32, b: u32) -> u32 {
        a | b
    }

    #[inline(always)]
    fn xor(a: u32, b: u32) -> u32 {
        a ^ b
    }

    /// `!a & b`.
    #[inline(always)]
    fn andnot(a: u32, b: u32) -> u32 {
        !a & b
    }

    #[inline(always)]
    fn neg(a: u32) -> u32 {
        a.wrapping_neg()
    }

    #[inline(always)]
    fn sub(a: u32, b: u32) -> u32 {
        a.wrapping_sub(b)
    }

    #[inline(always)]
    fn mul(a: u32, b: u32) -> u32 {
        a.wrapping_mul(b)
    }

    #[inline(always)]
    fn count_of(s: u32) -> u32 {
        s
    }

    /// Shift left by `s` bits, 0 for `32 ≤ s < 64` as the vector shifts give
    /// (shift distances are below 64).
    #[inline(always)]
    fn shl(a: u32, s: u32) -> u32 {
        (u64::from(a) << s) as u32
    }

    /// Shift right by `s` bits, 0 for `32 ≤ s < 64`.
    #[inline(always)]
    fn shr(a: u32, s: u32) -> u32 {
        (u64::from(a) >> s) as u32
    }

    #[inline(always)]
    fn popcnt(a: u32) -> u32 {
        a.count_ones()
    }

    #[inline(always)]
    fn popcnt3(a: u32, b: u32, c: u32) -> u32 {
        a.count_ones() + b.count_ones() + c.count_ones()
    }

    #[inline(always)]
    fn lane_sum(v: u32) -> u128 {
        u128::from(v)
    }
}
