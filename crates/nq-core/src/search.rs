//! The bitmask search: counting and listing the completions of a prefix.
//!
//! # How the depth-first search works
//!
//! The search fills the *free* columns of a [`Prefix`] from left to right and
//! keeps three masks of rows, one bit per row, as seen from the column it is in:
//!
//! * `used`: rows already holding a queen placed by the search;
//! * `up`: rows attacked along rising diagonals by queens placed to the left
//!   (a queen on row `r` attacks row `r + d` in the column `d` to its right, so
//!   the mask shifts left by the distance between columns);
//! * `down`: the same for falling diagonals (shifts right).
//!
//! Queens of the prefix are never placed by the search. Their rows are removed
//! from `full` once, and the squares they attack (in every direction, left and
//! right) are folded into a per-column `blocked` mask before the search starts.
//! Columns of the prefix are therefore skipped at no cost: moving from one free
//! column to the next shifts `up` and `down` by the distance between them.
//!
//! The free rows of a column are `full & !(used | up | down | blocked)`. Taking
//! the lowest set bit (`x & x.wrapping_neg()`) and clearing it (`x ^ bit`) walks
//! the candidates in increasing row order, so listings are lexicographic.
//!
//! Three shortcuts do most of the speed-up over the textbook loop:
//!
//! * *Look-ahead.* The free mask of the next column is computed when a queen is
//!   placed, and a placement that leaves the next column empty is never pushed.
//! * *Closed-form leaves.* The last two free columns are counted by `pairs`
//!   (a few popcounts) instead of placing queens in them.
//! * *No stack for the deepest levels.* The three columns before those are
//!   walked by nested loops, and the stack keeps only ancestors with rows
//!   left to try.
//!
//! # Four kernels, one result
//!
//! On x86-64 and aarch64, every count with at least `WIDE_MIN_FREE` (6) free
//! columns runs the *walk* of `crate::wide`, which expands a run of nodes of
//! one level per pass and has none of the depth-first search's unpredictable
//! branches: sixteen or eight nodes per step on the SIMD kernels (AVX-512 F
//! and VPOPCNTDQ, AVX2, or NEON on every aarch64 CPU), one on the portable
//! scalar kernel, which is about twice as fast as the depth-first search
//! (BENCHMARKS.md). Smaller searches, and every search on other
//! architectures, run the depth-first search here. Both scalar versions are
//! compiled twice on x86-64 (plain and with `popcnt`/BMI) and chosen at run
//! time. [`Kernel`] picks one explicitly. All walk the same tree and count
//! the same completions; a test compares every instance of the walk with the
//! depth-first search on thousands of plans. Listing always uses a
//! depth-first search, which visits solutions in lexicographic order.
//!
//! # Exactness
//!
//! The depth-first loop adds at most `32⁵` per step (the completions of five
//! columns) into a `u64`, takes at most `32 · 32` steps between two pops, and
//! moves that `u64` into a `u128` total every 4096 pops: at most `2⁴⁷` between
//! moves, far below `2⁶⁴`. The same checkpoint reads the stop flag, so a count
//! of any size can be cancelled within microseconds. The walk's bound
//! is in its own docs.

use std::fmt;
use std::ops::ControlFlow;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::board::{Board, EMPTY, MAX_N, Prefix};
use crate::symmetry::Symmetry;

/// Receives the solutions of a listing search.
///
/// The search drives and the sink reacts: returning [`ControlFlow::Break`] stops
/// the search (this is how "the first K solutions" works).
pub trait Sink {
    /// Called once per solution with `rows[col]`, the row of the queen in each
    /// column. The slice is only valid during the call.
    fn solution(&mut self, rows: &[u8]) -> ControlFlow<()>;
}

impl<F: FnMut(&[u8]) -> ControlFlow<()>> Sink for F {
    fn solution(&mut self, rows: &[u8]) -> ControlFlow<()> {
        self(rows)
    }
}

/// How a listing search ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every completion was passed to the sink.
    Finished {
        /// Solutions passed to the sink.
        solutions: u128,
    },
    /// The sink asked to stop.
    Stopped {
        /// Solutions passed to the sink, the last one included.
        solutions: u128,
    },
}

/// What a count found and what it cost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CountStats {
    /// Completions of the prefix.
    pub count: u128,
    /// The search's work, for throughput figures (nodes per second): the
    /// queens the search placed, that is the nodes of the search tree below
    /// the prefix, in every free column but the last two (which every kernel
    /// counts in closed form, without placing queens there). A property of the
    /// problem alone: every kernel reports the same number for the same
    /// search, so node rates compare across kernels and machines.
    pub nodes: u64,
}

/// Counts the completions of `prefix` on its board.
///
/// Returns `None` when `stop` was set during the search (checked every few
/// thousand nodes). A complete prefix counts as one completion.
pub fn count(prefix: &Prefix, stop: &AtomicBool) -> Option<u128> {
    count_stats(prefix, stop).map(|s| s.count)
}

/// [`count`], also reporting the search's nodes ([`CountStats::nodes`]).
pub fn count_stats(prefix: &Prefix, stop: &AtomicBool) -> Option<CountStats> {
    Plan::new(prefix).count(stop)
}

/// [`count_stats`] with extra forbidden squares: `forbidden[col]` is a mask of
/// rows where no queen may stand in column `col` (`forbidden.len()` = N), on
/// the chosen kernel.
pub fn count_masked(
    prefix: &Prefix,
    forbidden: &[u32],
    kernel: Kernel,
    stop: &AtomicBool,
) -> Option<CountStats> {
    Plan::masked(prefix, forbidden).count_with(kernel, stop)
}

/// [`count_masked`] on the depth-first search: the reference that every
/// kernel is checked against ([`crate::split::check_kernel`] and the tests).
/// A different algorithm from the walk that the SIMD kernels and the scalar
/// kernel share, so that a fault in the walk's logic shows as a difference
/// instead of being repeated by every kernel.
pub fn count_masked_reference(
    prefix: &Prefix,
    forbidden: &[u32],
    stop: &AtomicBool,
) -> Option<CountStats> {
    Plan::masked(prefix, forbidden).count_scalar(stop)
}

/// Which count kernel runs a search (see the module docs). All count the same
/// completions; the choice exists so that one machine can check a result with
/// a second, independent computation, and so that benchmarks can compare them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// The fastest kernel this CPU supports.
    #[default]
    Auto,
    /// Sixteen nodes per step; needs AVX-512 F and VPOPCNTDQ.
    Avx512,
    /// Eight nodes per step; needs AVX2.
    Avx2,
    /// Eight nodes per step in pairs of 128-bit registers; needs an aarch64
    /// CPU, all of which have NEON.
    Neon,
    /// The portable scalar kernel, whatever the CPU: the walk with one lane
    /// (or the depth-first search, for small searches and on architectures
    /// other than x86-64 and aarch64).
    Scalar,
}

impl Kernel {
    /// Every choice, in the order help texts list them.
    pub const ALL: [Kernel; 5] = [
        Kernel::Auto,
        Kernel::Avx512,
        Kernel::Avx2,
        Kernel::Neon,
        Kernel::Scalar,
    ];

    /// The name that [`Kernel::from_str`] accepts and [`fmt::Display`] prints.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Auto => "auto",
            Kernel::Avx512 => "avx512",
            Kernel::Avx2 => "avx2",
            Kernel::Neon => "neon",
            Kernel::Scalar => "scalar",
        }
    }

    /// What the CPU must have to run this kernel, for messages.
    pub fn requirement(self) -> &'static str {
        match self {
            Kernel::Auto | Kernel::Scalar => "nothing",
            Kernel::Avx512 => "an x86-64 CPU with AVX-512 F and VPOPCNTDQ",
            Kernel::Avx2 => "an x86-64 CPU with AVX2 and popcnt",
            Kernel::Neon => "an aarch64 (ARM 64-bit) CPU",
        }
    }

    /// True when this CPU can run the kernel (`Auto` and `Scalar` always).
    pub fn is_available(self) -> bool {
        match self {
            Kernel::Auto | Kernel::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => crate::wide::Isa::Avx512.available(),
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => crate::wide::Isa::Avx2.available(),
            #[cfg(not(target_arch = "x86_64"))]
            Kernel::Avx512 | Kernel::Avx2 => false,
            #[cfg(target_arch = "aarch64")]
            Kernel::Neon => crate::wide::Isa::Neon.available(),
            #[cfg(not(target_arch = "aarch64"))]
            Kernel::Neon => false,
        }
    }

    /// `self` if this CPU can run it, or an error that says what it needs.
    ///
    /// # Errors
    ///
    /// [`KernelUnavailable`] for a SIMD kernel this CPU lacks.
    pub fn require(self) -> Result<Kernel, KernelUnavailable> {
        if self.is_available() {
            Ok(self)
        } else {
            Err(KernelUnavailable { kernel: self })
        }
    }

    /// The kernel that actually runs a large search for `self` on this CPU:
    /// `Auto` becomes the fastest available one, and a SIMD kernel this CPU
    /// cannot run becomes `Scalar` (check [`Kernel::is_available`] first to
    /// refuse instead).
    pub fn resolved(self) -> Kernel {
        match self {
            Kernel::Auto => [Kernel::Avx512, Kernel::Avx2, Kernel::Neon]
                .into_iter()
                .find(|k| k.is_available())
                .unwrap_or(Kernel::Scalar),
            k if k.is_available() => k,
            _ => Kernel::Scalar,
        }
    }

    /// The name of [`Kernel::resolved`].
    pub fn resolved_name(self) -> &'static str {
        self.resolved().name()
    }

    /// The SIMD kernel that runs a large search, if any (`None`: the scalar
    /// one).
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    fn isa(self) -> Option<crate::wide::Isa> {
        match self.resolved() {
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => Some(crate::wide::Isa::Avx512),
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => Some(crate::wide::Isa::Avx2),
            #[cfg(target_arch = "aarch64")]
            Kernel::Neon => Some(crate::wide::Isa::Neon),
            _ => None,
        }
    }
}

/// [`search`] with extra forbidden squares, as in [`count_masked`].
pub fn search_masked<S: Sink + ?Sized>(
    prefix: &Prefix,
    forbidden: &[u32],
    sink: &mut S,
) -> Outcome {
    list(&Plan::masked(prefix, forbidden), prefix, sink)
}

/// Counts every solution on `board` (the completions of the empty prefix),
/// single-threaded and without symmetry. Use [`crate::split`] for the fast path.
pub fn count_board(board: Board, stop: &AtomicBool) -> Option<u128> {
    count(&Prefix::empty(board), stop)
}

/// Lists the completions of `prefix` in lexicographic order of `rows`, passing
/// each to `sink` until it returns `Break`.
pub fn search<S: Sink + ?Sized>(prefix: &Prefix, sink: &mut S) -> Outcome {
    list(&Plan::new(prefix), prefix, sink)
}

fn list<S: Sink + ?Sized>(plan: &Plan, prefix: &Prefix, sink: &mut S) -> Outcome {
    let mut rows = [EMPTY; MAX_N as usize];
    rows[..prefix.board().len()].copy_from_slice(prefix.rows());
    let mut lister = Lister {
        plan,
        rows,
        found: 0,
        sink,
    };
    let n = prefix.board().len();
    match lister.walk(0, 0, 0, 0, n) {
        ControlFlow::Continue(()) => Outcome::Finished {
            solutions: lister.found,
        },
        ControlFlow::Break(()) => Outcome::Stopped {
            solutions: lister.found,
        },
    }
}

/// The fewest free columns for which the walk of `crate::wide` is used, on
/// every kernel: below this a search is too small to fill vectors or to pay
/// for the walk's set-up, and the depth-first search runs it.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
const WIDE_MIN_FREE: usize = 6;

impl fmt::Display for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Kernel {
    type Err = UnknownKernel;

    /// Parses a kernel name, ignoring ASCII case and surrounding spaces.
    fn from_str(s: &str) -> Result<Kernel, UnknownKernel> {
        let name = s.trim();
        Kernel::ALL
            .into_iter()
            .find(|k| k.name().eq_ignore_ascii_case(name))
            .ok_or_else(|| UnknownKernel {
                name: name.to_string(),
            })
    }
}

/// A kernel name that [`Kernel::from_str`] does not know.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownKernel {
    /// The name given.
    pub name: String,
}

impl fmt::Display for UnknownKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "`{}` is not a count kernel: use `auto` (the fastest this CPU has), \
             `avx512`, `avx2`, `neon` or `scalar` (the portable one)",
            self.name
        )
    }
}

impl std::error::Error for UnknownKernel {}

/// A kernel this CPU cannot run (see [`Kernel::require`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelUnavailable {
    /// The kernel asked for.
    pub kernel: Kernel,
}

impl fmt::Display for KernelUnavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "this CPU cannot run the `{}` kernel, which needs {}: use `auto` (the \
             fastest this CPU has) or `scalar`",
            self.kernel,
            self.kernel.requirement()
        )
    }
}

impl std::error::Error for KernelUnavailable {}

/// The rows of free column `col` that a search of `prefix` may not use: the
/// rows a queen of the prefix attacks along a diagonal, and the rows in
/// `forbidden` (a row mask, such as the border split's strict lines give one
/// column in [`SubProblem::forbidden`](crate::split::SubProblem::forbidden)),
/// both within the rows the prefix leaves free.
///
/// The rows the prefix's queens hold are not in the mask: a search removes
/// them from every column at once (they are outside
/// `board.full_mask() & !prefix.used_rows()`). This is the one rule for the
/// `blocked` mask of every search plan: the CPU kernels' plan here and the
/// GPU kernel's table (`nq-gpu`'s `pack`) both build theirs with it, so the
/// two cannot disagree about which squares a prefix takes away.
///
/// `col` must be a column of the board that holds no queen of `prefix`.
pub fn blocked_rows(prefix: &Prefix, col: u8, forbidden: u32) -> u32 {
    let board = prefix.board();
    let n = board.n();
    debug_assert!(
        col < n && prefix.get(col).is_none(),
        "column {col} is not free"
    );
    let mut blocked = forbidden;
    for (c, r) in prefix.queens() {
        // A queen at (c, r) attacks rows r ± d in the column d away.
        let d = c.abs_diff(col);
        if u32::from(r) + u32::from(d) < u32::from(n) {
            blocked |= 1 << (r + d);
        }
        if r >= d {
            blocked |= 1 << (r - d);
        }
    }
    blocked & board.full_mask() & !prefix.used_rows()
}

/// The search problem of one prefix, prepared for the kernels.
struct Plan {
    /// Rows not used by the prefix: the only rows the search may use.
    full: u32,
    /// Number of free columns.
    free: usize,
    /// `cols[j]`: the board column of the `j`-th free column.
    cols: [u8; MAX_N as usize],
    /// `shift[j]`: distance from free column `j - 1` to free column `j`
    /// (`shift[0]` is unused). Diagonal masks shift by this much between levels.
    shift: [u32; MAX_N as usize],
    /// `blocked[j]`: rows of free column `j` attacked by queens of the prefix.
    blocked: [u32; MAX_N as usize],
}

impl Plan {
    /// The plan of `prefix` with the squares in `forbidden[col]` (a row mask
    /// per board column) also blocked.
    fn masked(prefix: &Prefix, forbidden: &[u32]) -> Plan {
        let mut plan = Plan::new(prefix);
        for j in 0..plan.free {
            plan.blocked[j] |= forbidden[usize::from(plan.cols[j])] & plan.full;
        }
        plan
    }

    fn new(prefix: &Prefix) -> Plan {
        let board = prefix.board();
        let n = board.n();
        let mut plan = Plan {
            full: board.full_mask() & !prefix.used_rows(),
            free: 0,
            cols: [0; MAX_N as usize],
            shift: [0; MAX_N as usize],
            blocked: [0; MAX_N as usize],
        };
        let mut prev = 0u8;
        for x in (0..n).filter(|&x| prefix.get(x).is_none()) {
            let j = plan.free;
            plan.cols[j] = x;
            plan.shift[j] = u32::from(x - prev);
            plan.blocked[j] = blocked_rows(prefix, x, 0);
            prev = x;
            plan.free += 1;
        }
        plan
    }

    /// Counts on the fastest kernel this CPU has.
    fn count(&self, stop: &AtomicBool) -> Option<CountStats> {
        self.count_with(Kernel::Auto, stop)
    }

    /// Counts on `kernel` as [`Kernel::resolved`] gives it (the walk, with
    /// one lane for `Scalar`), or by the depth-first search when the search
    /// has fewer than `WIDE_MIN_FREE` free columns or the architecture has
    /// no walk.
    fn count_with(&self, kernel: Kernel, stop: &AtomicBool) -> Option<CountStats> {
        #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
        {
            if self.free >= WIDE_MIN_FREE {
                let (count, nodes) = match kernel.isa() {
                    Some(isa) => crate::wide::count(isa, &self.wide(), stop)?,
                    // The scalar kernel: the walk with one lane.
                    None => crate::wide::portable::count(&self.wide(), stop)?,
                };
                return Some(CountStats { count, nodes });
            }
        }
        // Elsewhere there is no SIMD kernel: every choice runs the scalar one.
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        let _ = kernel;
        self.count_scalar(stop)
    }

    /// The plan as the SIMD kernels take it.
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    fn wide(&self) -> crate::wide::Problem<'_> {
        crate::wide::Problem {
            full: self.full,
            shift: &self.shift[..self.free],
            blocked: &self.blocked[..self.free],
        }
    }

    /// The depth-first count kernel, compiled for the best instruction set
    /// this CPU has: the scalar kernel for small searches, and the reference
    /// that the tests compare the walk with.
    ///
    /// Most of the kernel's work is bit counting and variable shifts. The
    /// generic x86-64 target has no `popcnt` instruction, so the same code is
    /// also compiled with `popcnt`, BMI1 and BMI2 enabled and chosen at run time:
    /// one binary runs everywhere and is fast where the CPU allows.
    fn count_scalar(&self, stop: &AtomicBool) -> Option<CountStats> {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("popcnt")
                && std::arch::is_x86_feature_detected!("bmi1")
                && std::arch::is_x86_feature_detected!("bmi2")
            {
                // SAFETY: the features this function is compiled with were
                // just detected on the running CPU.
                return unsafe { self.count_bmi(stop) };
            }
        }
        self.count_impl(stop)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "popcnt,bmi1,bmi2")]
    fn count_bmi(&self, stop: &AtomicBool) -> Option<CountStats> {
        self.count_impl(stop)
    }

    /// The count of a prefix with at most two free columns, in closed form
    /// (none are nodes, see `CountStats::nodes`); `None` for a longer one.
    #[inline]
    fn closed_form(&self) -> Option<CountStats> {
        let full = self.full;
        match self.free {
            // A complete prefix is its own single completion.
            0 => Some(CountStats { count: 1, nodes: 0 }),
            // The last two columns are counted in closed form and are not
            // nodes (see `CountStats::nodes`).
            1 => {
                let count = (full & !self.blocked[0]).count_ones();
                Some(CountStats {
                    count: count.into(),
                    nodes: 0,
                })
            }
            2 => {
                let f1 = full & !self.blocked[0];
                let f2 = full & !self.blocked[1];
                let count = pairs(f1, f2, self.shift[1]);
                Some(CountStats {
                    count: count.into(),
                    nodes: 0,
                })
            }
            _ => None,
        }
    }

    /// The deepest five free columns of a count whose main loop ends at
    /// level `last` (see [`Tail`]).
    #[inline]
    fn tail(&self, last: usize) -> Tail {
        Tail {
            full: self.full,
            sm: self.shift[last.saturating_sub(1)],
            bm: self.blocked[last.saturating_sub(1)],
            s0: self.shift[last],
            b0: self.blocked[last],
            s1: self.shift[self.free - 2],
            b1: self.blocked[self.free - 2],
            s2: self.shift[self.free - 1],
            b2: self.blocked[self.free - 1],
        }
    }

    /// The count kernel. See the module docs for the invariants.
    #[inline(always)]
    fn count_impl(&self, stop: &AtomicBool) -> Option<CountStats> {
        let full = self.full;
        if let Some(stats) = self.closed_form() {
            return Some(stats);
        }
        // The main loop iterates levels 0..last - 2. Levels `last - 2` to
        // `last` are counted by tight inner loops over their free rows
        // (`Tail::five`, `four`, `three`), and the two columns after them in
        // closed form by `pairs`, so the deepest five columns never touch the
        // stack.
        let last = self.free - 3;
        let tail = self.tail(last);
        let first = full & !self.blocked[0];
        if last <= 2 {
            let packed = match last {
                0 => tail.three(first, 0, 0, 0),
                1 => tail.four(first, 0, 0, 0),
                _ => tail.five(first, 0, 0, 0),
            };
            return Some(CountStats {
                count: (packed & (NODE - 1)).into(),
                nodes: packed >> 32,
            });
        }
        // The current level lives in registers (`level`, `rem`, `used`, `up`,
        // `down`); the stack holds only ancestors that still have candidates
        // left. A parent whose last candidate was just taken is not saved: its
        // child replaces it, which saves the push, the pop and the pop's
        // mispredicted branch. Entries carry their level for that reason.
        // Indices are masked with `& 31` (both stay below 32), which lets the
        // compiler drop bounds checks from the hot loop.
        let mut stack = [[0u32; 5]; MAX_N as usize];
        let mut sp = 0usize;
        let mut level = 0usize;
        let mut rem = first;
        let (mut used, mut up, mut down) = (0u32, 0u32, 0u32);

        let mut total: u128 = 0;
        // Counts since the last checkpoint; bounded as the module docs explain.
        let mut partial: u64 = 0;
        let mut pops: u64 = 0;
        // Queens placed (see `CountStats::nodes`).
        let mut nodes = u64::from(first.count_ones());
        loop {
            if rem == 0 {
                if sp == 0 {
                    break;
                }
                sp -= 1;
                let e = stack[sp & 31];
                [rem, used, up, down] = [e[0], e[1], e[2], e[3]];
                level = e[4] as usize;
                pops += 1;
                if pops.is_multiple_of(4096) {
                    total += u128::from(partial);
                    partial = 0;
                    if stop.load(Ordering::Relaxed) {
                        return None;
                    }
                }
                continue;
            }
            let bit = rem & rem.wrapping_neg();
            rem ^= bit;
            let u = used | bit;
            let next = (level + 1) & 31;
            let s = self.shift[next];
            let (a, b) = ((up | bit) << s, (down | bit) >> s);
            let free = full & !(u | a | b | self.blocked[next]);
            if next + 2 == last {
                let packed = tail.five(free, u, a, b);
                let (sum, placed) = (packed & (NODE - 1), packed >> 32);
                partial += sum;
                nodes += placed;
                continue;
            }
            if free != 0 {
                nodes += u64::from(free.count_ones());
                stack[sp & 31] = [rem, used, up, down, level as u32];
                sp += usize::from(rem != 0);
                level = next;
                rem = free;
                used = u;
                up = a;
                down = b;
            }
        }
        total += u128::from(partial);
        Some(CountStats {
            count: total,
            nodes,
        })
    }
}

/// The deepest five free columns of a count (`last - 2` to `last + 2` in
/// [`Plan::count_impl`]), searched by nested loops instead of the stack.
///
/// Methods rather than closures so that `#[inline(always)]` holds: an
/// outlined closure would lose the caller's `popcnt`/BMI target features.
#[derive(Clone, Copy)]
struct Tail {
    full: u32,
    /// Shift and blocked rows of column `last - 1`.
    sm: u32,
    bm: u32,
    /// Shift and blocked rows of column `last`.
    s0: u32,
    b0: u32,
    /// Of column `last + 1`.
    s1: u32,
    b1: u32,
    /// Of column `last + 2`, the final one.
    s2: u32,
    b2: u32,
}

impl Tail {
    /// The completions of the last three columns, given the free rows `rem`
    /// of column `last` and the masks as seen from it, plus `2³²` per queen
    /// placed in column `last` (its nodes, packed where adding them costs no
    /// instruction of its own; the count is below `32³`).
    #[inline(always)]
    fn three(&self, mut rem: u32, used: u32, up: u32, down: u32) -> u64 {
        let Tail {
            full,
            s1,
            b1,
            s2,
            b2,
            ..
        } = *self;
        let mut sum = 0u64;
        while rem != 0 {
            let bit = rem & rem.wrapping_neg();
            rem ^= bit;
            let (u, a, b) = (used | bit, up | bit, down | bit);
            // Free rows of the last two columns with this queen placed but
            // before either of them holds one.
            let f1 = full & !(u | a << s1 | b >> s1 | b1);
            let f2 = full & !(u | a << (s1 + s2) | b >> (s1 + s2) | b2);
            sum += u64::from(pairs(f1, f2, s2)) + NODE;
        }
        sum
    }

    /// The same for the last four columns, given the free rows of column
    /// `last - 1`: the completions, plus `2³²` per node of columns `last - 1`
    /// and `last` (one per queen placed in either, as the SIMD kernels count
    /// them).
    #[inline(always)]
    fn four(&self, mut rem: u32, used: u32, up: u32, down: u32) -> u64 {
        let (full, s0, b0) = (self.full, self.s0, self.b0);
        // Packed as in `three`: at most `32⁴ < 2³²` completions and `32 + 32²`
        // nodes.
        let mut sum = 0u64;
        while rem != 0 {
            let bit = rem & rem.wrapping_neg();
            rem ^= bit;
            let u = used | bit;
            let (a, b) = ((up | bit) << s0, (down | bit) >> s0);
            sum += self.three(full & !(u | a | b | b0), u, a, b) + NODE;
        }
        sum
    }

    /// The same for the last five columns, given the free rows of column
    /// `last - 2`; packed as in `four` (at most `32⁵ < 2³²` completions).
    #[inline(always)]
    fn five(&self, mut rem: u32, used: u32, up: u32, down: u32) -> u64 {
        let (full, sm, bm) = (self.full, self.sm, self.bm);
        let mut sum = 0u64;
        while rem != 0 {
            let bit = rem & rem.wrapping_neg();
            rem ^= bit;
            let u = used | bit;
            let (a, b) = ((up | bit) << sm, (down | bit) >> sm);
            sum += self.four(full & !(u | a | b | bm), u, a, b) + NODE;
        }
        sum
    }
}

/// One node, in the packed sums of [`Tail`]: their completions (below
/// `32⁵ < 2³²` in one call) in the low half, their nodes in the high half.
const NODE: u64 = 1 << 32;

/// The number of ways to finish the last two free columns, whose free rows
/// (before either holds a queen) are `f1` and `f2`, `s` columns apart.
///
/// A queen on row `r` of the first column takes rows `r`, `r + s` and `r - s`
/// from the second, and nothing else; those three rows are distinct. So the
/// count is `|f1|·|f2|` minus, for each of the three offsets, the pairs that
/// collide: `|f1 ∩ f2|`, `|f1 ∩ (f2 >> s)|` (row `r + s` free in the second
/// column) and `|f1 ∩ (f2 << s)|`. Bits shifted off either end belong to rows
/// off the board, which `f1` never holds. This replaces a whole level of the
/// search with six bit operations.
#[inline(always)]
fn pairs(f1: u32, f2: u32, s: u32) -> u32 {
    f1.count_ones() * f2.count_ones()
        - (f1 & f2).count_ones()
        - (f1 & (f2 >> s)).count_ones()
        - (f1 & (f2 << s)).count_ones()
}

/// Random descents Knuth's estimator takes below each placement of the first
/// free column (see [`estimate_work`]).
const ESTIMATE_PROBES: u32 = 4;

/// An estimate of the work of counting the completions of `prefix`: the
/// number of nodes of its search tree, in expectation. Comparable between
/// prefixes of one board; only progress figures, job sizes and the hand-out
/// order (largest first) use it, never a count.
///
/// Knuth's estimator ("Estimating the efficiency of backtrack programs",
/// 1975), stratified by the first free column: for each placement there,
/// `ESTIMATE_PROBES` (4) random descents, each adding `d₁ + d₁d₂ + …` (the
/// free rows met on the way, multiplied up), and their mean added to the
/// exact count of the levels above. It replaces "placements in the first
/// three columns × 3 per further column", which knew nothing below the third
/// column: over every sub-problem of N = 17 `0:3` its log correlated 0.60
/// with the nodes actually searched, and only 453 of the 1,126 largest
/// sub-problems were among the 1 % with the largest estimates; this one
/// correlates 0.76 and finds 870 of them, at 2.4–3× the cost (about 4 µs a
/// sub-problem there, 15 µs at N = 28; BENCHMARKS.md §25).
///
/// The descents are seeded by the placement's masks, so a prefix always gets
/// the same estimate: a plan's creation, resumed, groups the same jobs.
pub fn estimate_work(prefix: &Prefix, forbidden: &[u32]) -> u64 {
    let plan = Plan::masked(prefix, forbidden);
    if plan.free == 0 {
        return 1;
    }
    let s = plan.shift.get(1).copied().unwrap_or(0);
    let mut first = plan.full & !plan.blocked[0];
    // The root and the first column's nodes, exactly.
    let mut nodes = 1.0 + f64::from(first.count_ones());
    while first != 0 {
        let bit = first & first.wrapping_neg();
        first ^= bit;
        let below = plan.descend(1, bit, bit << s, bit >> s);
        nodes += below;
    }
    // `as` saturates: a tree past 2^64 nodes (none exists on 32 columns
    // with a prefix) would read as u64::MAX, still "largest".
    (nodes as u64).max(1)
}

impl Plan {
    /// Knuth's estimate of the nodes strictly below a node at free column
    /// `j` with masks `used`, `up`, `down`: the mean over
    /// [`ESTIMATE_PROBES`] random descents of the sum, over the levels met,
    /// of the product of the free rows so far.
    fn descend(&self, j: usize, used: u32, up: u32, down: u32) -> f64 {
        // xorshift64, seeded by the node (never 0: `| 1`).
        let mut seed = (u64::from(used) << 32 | u64::from(up ^ down.rotate_left(16))) | 1;
        let mut sum = 0.0;
        for _ in 0..ESTIMATE_PROBES {
            let (mut used, mut up, mut down) = (used, up, down);
            let mut weight = 1.0;
            for k in j..self.free {
                let free = self.full & !(used | up | down | self.blocked[k]);
                if free == 0 {
                    break;
                }
                let choices = free.count_ones();
                weight *= f64::from(choices);
                sum += weight;
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let bit = nth_set_bit(free, (seed % u64::from(choices)) as u32);
                let s = self.shift.get(k + 1).copied().unwrap_or(0);
                used |= bit;
                up = (up | bit) << s;
                down = (down | bit) >> s;
            }
        }
        sum / f64::from(ESTIMATE_PROBES)
    }
}

/// The `i`-th set bit (from 0, lowest first) of `mask`, as a mask; `i` is
/// below the number of set bits. Knuth's estimators pick their random row
/// with it (here and in `nq count`'s forecast).
pub fn nth_set_bit(mut mask: u32, i: u32) -> u32 {
    for _ in 0..i {
        mask &= mask - 1;
    }
    mask & mask.wrapping_neg()
}

/// The listing kernel: plain recursion, since listing speed is bounded by the
/// sink, not by the search.
struct Lister<'a, S: ?Sized> {
    plan: &'a Plan,
    rows: [u8; MAX_N as usize],
    found: u128,
    sink: &'a mut S,
}

impl<S: Sink + ?Sized> Lister<'_, S> {
    fn walk(
        &mut self,
        j: usize,
        used: u32,
        up: u32,
        down: u32,
        n: usize,
    ) -> ControlFlow<()> {
        if j == self.plan.free {
            self.found += 1;
            return self.sink.solution(&self.rows[..n]);
        }
        let mut free = self.plan.full & !(used | up | down | self.plan.blocked[j]);
        let s = self.plan.shift.get(j + 1).copied().unwrap_or(0);
        while free != 0 {
            let bit = free & free.wrapping_neg();
            free ^= bit;
            self.rows[usize::from(self.plan.cols[j])] = bit.trailing_zeros() as u8;
            // Shifting by `s` moves the masks into the next free column's frame.
            self.walk(j + 1, used | bit, (up | bit) << s, (down | bit) >> s, n)?;
        }
        ControlFlow::Continue(())
    }
}

/// Counts the completions of `prefix` that `g` maps to themselves.
///
/// `g` MUST be a rotation (`Rot90`, `Rot180` or `Rot270`): no reflection fixes a
/// solution of N > 1 (see [`crate::split`]). The search places whole orbits of
/// the group generated by `g`, so it visits only symmetric placements; it is
/// small next to a full count. Returns `None` when `stop` is set.
pub fn count_fixed(prefix: &Prefix, g: Symmetry, stop: &AtomicBool) -> Option<u128> {
    assert!(g.is_rotation(), "count_fixed takes a rotation, got {g:?}");
    let n = prefix.board().n();
    let powers = group_powers(g);
    // A fixed completion contains every image of the prefix.
    let mut start = *prefix;
    for (c, r) in prefix.queens() {
        if !place_orbit(&mut start, &powers, n, (c, r)) {
            return Some(0);
        }
    }
    let mut total = 0u128;
    let mut state = Fixed {
        n,
        full: prefix.board().full_mask(),
        cols: 0,
        rows: 0,
        rising: 0,
        falling: 0,
    };
    for (x, y) in start.queens() {
        // `start` is a prefix: its queens do not attack each other.
        state = state
            .place(x, y)
            .expect("queens of a prefix attack no other");
    }
    state.walk(&powers, stop, &mut total)?;
    Some(total)
}

/// `g, g², …` up to the identity (exclusive).
fn group_powers(g: Symmetry) -> Vec<Symmetry> {
    let mut out = vec![Symmetry::Identity];
    let mut h = g;
    while h != Symmetry::Identity {
        out.push(h);
        h = h.compose(g);
    }
    out
}

/// Adds the orbit of square `q` to `p`. Returns false when the orbit conflicts
/// with `p` or with itself; `p` may then be partly changed, so callers work on
/// a copy.
fn place_orbit(p: &mut Prefix, powers: &[Symmetry], n: u8, q: (u8, u8)) -> bool {
    for h in powers {
        let (x, y) = h.apply(n, q);
        match p.get(x) {
            Some(r) if r == y => {}
            Some(_) => return false,
            None => {
                if p.place(x, y).is_err() {
                    return false;
                }
            }
        }
    }
    true
}

/// The search of [`count_fixed`]: a placement made of whole orbits, as
/// bitmasks of its columns, rows and diagonals (so that a square is checked
/// in a few instructions, not against every queen).
#[derive(Clone, Copy)]
struct Fixed {
    n: u8,
    full: u32,
    cols: u32,
    rows: u32,
    /// Bit `x + y` per queen at `(x, y)`.
    rising: u64,
    /// Bit `x + (n - 1 - y)`.
    falling: u64,
}

impl Fixed {
    /// The placement with a queen added at `(x, y)`, or `None` when a queen
    /// attacks that square (or stands on it).
    fn place(self, x: u8, y: u8) -> Option<Fixed> {
        let (col, row) = (1u32 << x, 1u32 << y);
        let rise = 1u64 << (x + y);
        let fall = 1u64 << (x + (self.n - 1 - y));
        if self.cols & col != 0
            || self.rows & row != 0
            || self.rising & rise != 0
            || self.falling & fall != 0
        {
            return None;
        }
        Some(Fixed {
            cols: self.cols | col,
            rows: self.rows | row,
            rising: self.rising | rise,
            falling: self.falling | fall,
            ..self
        })
    }

    /// Adds to `total` the completions of `self` that are made of whole
    /// orbits of `powers`, filling the lowest empty column first.
    ///
    /// Each image of a square of an empty column is a new queen: were one
    /// already placed, its orbit, which is placed whole, would hold the
    /// square. The images are distinct except for the centre of an odd
    /// board, which every rotation fixes; a repeated image is skipped.
    fn walk(
        self,
        powers: &[Symmetry],
        stop: &AtomicBool,
        total: &mut u128,
    ) -> Option<()> {
        let empty = self.full & !self.cols;
        if empty == 0 {
            *total += 1;
            return Some(());
        }
        if stop.load(Ordering::Relaxed) {
            return None;
        }
        let x = empty.trailing_zeros() as u8;
        let mut free = self.full & !self.rows;
        while free != 0 {
            let y = free.trailing_zeros() as u8;
            free &= free - 1;
            let mut next = Some(self);
            for (i, h) in powers.iter().enumerate() {
                let q = h.apply(self.n, (x, y));
                if powers[..i].iter().any(|g| g.apply(self.n, (x, y)) == q) {
                    continue;
                }
                next = next.and_then(|s| s.place(q.0, q.1));
            }
            if let Some(next) = next {
                next.walk(powers, stop, total)?;
            }
        }
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn never() -> AtomicBool {
        AtomicBool::new(false)
    }

    /// Brute force over permutations, the slowest and most obviously right way.
    fn brute(n: u8) -> Vec<Vec<u8>> {
        fn go(n: u8, rows: &mut Vec<u8>, out: &mut Vec<Vec<u8>>) {
            if rows.len() == usize::from(n) {
                out.push(rows.clone());
                return;
            }
            let c = rows.len() as u8;
            for r in 0..n {
                let ok = rows
                    .iter()
                    .enumerate()
                    .all(|(c2, &r2)| !crate::board::attacks((c2 as u8, r2), (c, r)));
                if ok {
                    rows.push(r);
                    go(n, rows, out);
                    rows.pop();
                }
            }
        }
        let mut out = vec![];
        go(n, &mut vec![], &mut out);
        out
    }

    #[test]
    fn counts_match_brute_force() {
        for n in 1..=9u8 {
            let b = Board::new(n.into()).unwrap();
            let all = brute(n);
            assert_eq!(count_board(b, &never()), Some(all.len() as u128), "n={n}");
            let mut listed = vec![];
            let out = search(&Prefix::empty(b), &mut |rows: &[u8]| {
                listed.push(rows.to_vec());
                ControlFlow::Continue(())
            });
            assert_eq!(
                out,
                Outcome::Finished {
                    solutions: all.len() as u128
                }
            );
            assert_eq!(listed, all, "listing is lexicographic, n={n}");
        }
    }

    /// Every instance of the walk (the portable one and each SIMD kernel this
    /// CPU runs) against the depth-first search, on prefixes with queens in
    /// scattered columns and with random forbidden squares: every shape of
    /// plan (gaps between free columns, blocked rows, 4 to 13 free columns).
    #[test]
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    fn walk_kernels_agree_with_depth_first() {
        use crate::wide::Isa;
        let isas: Vec<Isa> = Isa::ALL.iter().copied().filter(|i| i.available()).collect();
        if isas.is_empty() {
            eprintln!("no SIMD kernel on this CPU to compare: the portable walk only");
        }
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut random = move || {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            (seed >> 33) as u32
        };
        let mut compared = 0;
        for n in 5..=14u8 {
            let b = Board::new(n.into()).unwrap();
            // Queens in column 0 and in one other column, each in every row.
            for other in [1, 2, n / 2, n - 1] {
                for r0 in 0..n {
                    for r1 in 0..n {
                        let mut p = Prefix::empty(b);
                        p.place(0, r0).unwrap();
                        if p.place(other, r1).is_err() {
                            continue;
                        }
                        let mut forbidden = [0u32; MAX_N as usize];
                        if r1 % 2 == 0 {
                            for f in forbidden.iter_mut().take(usize::from(n)) {
                                *f = random() & random();
                            }
                        }
                        let plan = Plan::masked(&p, &forbidden);
                        if plan.free < 4 {
                            continue;
                        }
                        let dfs = plan.count_impl(&never()).unwrap();
                        let (count, nodes) =
                            crate::wide::portable::count(&plan.wide(), &never()).unwrap();
                        assert_eq!(
                            CountStats { count, nodes },
                            dfs,
                            "portable n={n} prefix={p:?} forbidden={forbidden:?}"
                        );
                        compared += 1;
                        for &isa in &isas {
                            let (count, nodes) =
                                crate::wide::count(isa, &plan.wide(), &never()).unwrap();
                            assert_eq!(
                                CountStats { count, nodes },
                                dfs,
                                "{isa:?} n={n} prefix={p:?} forbidden={forbidden:?}"
                            );
                            compared += 1;
                        }
                    }
                }
            }
        }
        assert!(compared > 1000, "only {compared} plans compared");
    }

    impl Plan {
        /// Placements of the free columns `j..depth`, given the masks at
        /// column `j`: the exact node count of one level, by recursion.
        fn leaves(&self, j: usize, depth: usize, used: u32, up: u32, down: u32) -> u64 {
            if j == depth {
                return 1;
            }
            let mut free = self.full & !(used | up | down | self.blocked[j]);
            let s = self.shift.get(j + 1).copied().unwrap_or(0);
            let mut total = 0;
            while free != 0 {
                let bit = free & free.wrapping_neg();
                free ^= bit;
                total += self.leaves(
                    j + 1,
                    depth,
                    used | bit,
                    (up | bit) << s,
                    (down | bit) >> s,
                );
            }
            total
        }
    }

    /// `estimate_work` is Knuth's estimate of the search tree's nodes: the
    /// same every time for one prefix (a resumed plan groups the same jobs),
    /// and, summed over many prefixes, close to the exact count (an
    /// unbiased estimator whose errors average out), here within 10 % over
    /// the one-queen prefixes of N = 10 to 13 and their masked variants.
    #[test]
    fn work_estimates_are_repeatable_and_count_the_tree() {
        let (mut estimated, mut exact) = (0u64, 0u64);
        for n in 10..=13u8 {
            let b = Board::new(n.into()).unwrap();
            for r in 0..n {
                for c in [0, 1, n / 2] {
                    let mut p = Prefix::empty(b);
                    p.place(c, r).unwrap();
                    // A corner-mask like the border split's: no queen in
                    // rows 0 and 1 of the last column.
                    let mut forbidden = [0u32; MAX_N as usize];
                    forbidden[usize::from(n - 1)] = 0b11;
                    for mask in [&[0u32; MAX_N as usize], &forbidden] {
                        let e = estimate_work(&p, mask);
                        assert_eq!(e, estimate_work(&p, mask), "n={n} {p:?}");
                        let plan = Plan::masked(&p, mask);
                        exact += (0..=plan.free)
                            .map(|depth| plan.leaves(0, depth, 0, 0, 0))
                            .sum::<u64>();
                        estimated += e;
                    }
                }
            }
        }
        let ratio = estimated as f64 / exact as f64;
        assert!(
            (0.9..1.1).contains(&ratio),
            "estimated {estimated} against {exact} nodes"
        );
    }

    #[test]
    fn nth_set_bit_walks_the_set_bits() {
        assert_eq!(nth_set_bit(0b1011_0100, 0), 0b100);
        assert_eq!(nth_set_bit(0b1011_0100, 1), 0b1_0000);
        assert_eq!(nth_set_bit(0b1011_0100, 3), 0b1000_0000);
        assert_eq!(nth_set_bit(u32::MAX, 31), 1 << 31);
    }

    /// `CountStats::nodes` means the same on every kernel: the placements in
    /// all free columns but the last two, counted here by plain recursion
    /// (`Plan::leaves`) on plans of every size from 0 to 13 free columns.
    #[test]
    fn every_kernel_counts_the_same_nodes() {
        let kernels: Vec<Kernel> = Kernel::ALL
            .into_iter()
            .filter(|k| *k != Kernel::Auto && k.is_available())
            .collect();
        let mut checked = 0;
        for n in 1..=13u8 {
            let b = Board::new(n.into()).unwrap();
            let mut prefixes = vec![Prefix::empty(b)];
            for r in 0..n {
                let mut p = Prefix::empty(b);
                p.place(n / 2, r).unwrap();
                prefixes.push(p);
                if n >= 3 && p.place(0, (r + 2) % n).is_ok() {
                    prefixes.push(p);
                }
            }
            for p in prefixes {
                let plan = Plan::new(&p);
                let want: u64 = (1..plan.free.saturating_sub(1))
                    .map(|depth| plan.leaves(0, depth, 0, 0, 0))
                    .sum();
                for &k in &kernels {
                    let got = plan.count_with(k, &never()).unwrap();
                    assert_eq!(got.nodes, want, "{k} n={n} prefix={p:?}");
                    checked += 1;
                }
            }
        }
        assert!(checked > 300, "only {checked} searches checked");
    }

    #[test]
    fn kernel_names_round_trip_and_errors_name_the_choices() {
        for k in Kernel::ALL {
            assert_eq!(k.to_string().parse::<Kernel>(), Ok(k));
        }
        assert_eq!(" Scalar ".parse::<Kernel>(), Ok(Kernel::Scalar));
        assert!(Kernel::Auto.is_available() && Kernel::Scalar.is_available());
        assert!(Kernel::Auto.resolved() != Kernel::Auto);
        assert_eq!(Kernel::Scalar.require(), Ok(Kernel::Scalar));
        let e = KernelUnavailable {
            kernel: Kernel::Avx512,
        }
        .to_string();
        assert!(
            e.contains("`avx512`") && e.contains("AVX-512 F") && e.contains("`scalar`"),
            "{e}"
        );
        let e = "gpu".parse::<Kernel>().unwrap_err().to_string();
        assert!(
            e.contains("`gpu`") && e.contains("auto") && e.contains("scalar"),
            "{e}"
        );
    }

    #[test]
    fn blocked_rows_are_the_squares_the_prefix_attacks_or_forbids() {
        // Checked square by square against `Prefix::allows` (the pairwise
        // attack rule), on every prefix of two queens in columns 0 and N-1
        // (the split's border columns) and 2, with and without a forbidden
        // mask, for N = 4..=12.
        for n in 4..=12u8 {
            let b = Board::new(u64::from(n)).unwrap();
            for (r0, r1) in (0..n).flat_map(|a| (0..n).map(move |c| (a, c))) {
                let mut p = Prefix::empty(b);
                if p.place(0, r0).is_err() || p.place(2, r1).is_err() {
                    continue;
                }
                let last = n - 1;
                let _ = p.place(last, (r0 + r1) % n);
                for col in (0..n).filter(|&c| p.get(c).is_none()) {
                    for forbidden in [0, 0b1010_0101 & b.full_mask()] {
                        let got = blocked_rows(&p, col, forbidden);
                        for row in 0..n {
                            let free_row = p.used_rows() & 1 << row == 0;
                            let want = free_row
                                && (forbidden & 1 << row != 0 || !p.allows(col, row));
                            assert_eq!(
                                got & 1 << row != 0,
                                want,
                                "n={n} {p:?} col={col} row={row} forbidden={forbidden:#b}"
                            );
                        }
                        assert_eq!(got & !b.full_mask(), 0, "off-board rows in {got:#b}");
                    }
                }
            }
        }
    }

    #[test]
    fn prefix_counts_partition() {
        // Fixing column 3 in every way partitions the solutions.
        let b = Board::new(10).unwrap();
        let sum: u128 = (0..10)
            .map(|r| {
                let mut p = Prefix::empty(b);
                p.place(3, r).unwrap();
                count(&p, &never()).unwrap()
            })
            .sum();
        assert_eq!(sum, 724);
    }

    #[test]
    fn sink_can_stop() {
        let b = Board::new(8).unwrap();
        let mut seen = 0;
        let out = search(&Prefix::empty(b), &mut |_: &[u8]| {
            seen += 1;
            if seen == 5 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        });
        assert_eq!(out, Outcome::Stopped { solutions: 5 });
    }

    #[test]
    fn stop_flag_cancels() {
        let b = Board::new(16).unwrap();
        assert_eq!(count_board(b, &AtomicBool::new(true)), None);
    }

    #[test]
    fn fixed_counts_match_brute_force() {
        for n in 1..=10u8 {
            let all = brute(n);
            let b = Board::new(n.into()).unwrap();
            for g in [Symmetry::Rot90, Symmetry::Rot180] {
                let mut img = vec![0; usize::from(n)];
                let want = all
                    .iter()
                    .filter(|s| {
                        g.apply_rows(s, &mut img);
                        img == **s
                    })
                    .count() as u128;
                assert_eq!(
                    count_fixed(&Prefix::empty(b), g, &never()),
                    Some(want),
                    "n={n} {g:?}"
                );
            }
        }
    }
}
