//! Buffer packing: sub-problems into the kernel's tables and tasks, and the
//! kernel's per-task results back into per-sub-problem counts.
//!
//! Plain functions with no GPU in sight, so that the tests run the kernel's
//! host build (`crate::host`) on exactly the buffers the GPU gets.
//!
//! # The buffers (see the layout comment in `kernel/count.cu`)
//!
//! * One *table* per prefix that nq-core's own count of a sub-problem
//!   searches ([`SubProblem::solve_prefixes`]: the sub-problem's prefix, or,
//!   where the CPU pre-places the queens of the strict border lines, each
//!   prefix with them placed), [`TABLE_WORDS`] words: per free column,
//!   indexed by the number of queens placed before it (the prefix's and one
//!   per free column before it), the rows open to a queen (on the board, not
//!   attacked by the prefix, not forbidden by the border split's strict
//!   lines), the shift from the previous free column and what a lap counts
//!   there. This is nq-core's own plan of a masked count, rebuilt here from
//!   the public prefixes and [`SubProblem::forbidden`], so the kernel visits
//!   the nodes the CPU kernels visit.
//! * One or more *tasks* per sub-problem, [`TASK_WORDS`] words: a node of its
//!   search tree (the rows holding a queen, the prefix's included; both
//!   diagonals; the rows to try). The host expands the first levels of each
//!   sub-problem's tree itself, so that a launch has enough tasks to fill a
//!   GPU even when a job has few sub-problems, and so that no task leaves
//!   more than [`MAX_TASK_COLUMNS`] free columns to search (which bounds the
//!   kernel's stack).
//!
//! # Exactness
//!
//! The tasks of a sub-problem partition its completions: each completion
//! passes through exactly one node at the expansion depth, and nodes whose
//! next column has no free row are dropped only because they have no
//! completion. A task below at most 17 free columns has at most `17! < 2^64`
//! completions and fewer than `e·17! < 2^64` nodes, so the kernel's `u64`
//! counters cannot wrap; [`Batch::fold`] sums them into `u128` with checked
//! adds. A sub-problem with no free column (its prefix is complete) is its
//! own single completion and needs no task.

use nq_core::board::{Board, MAX_N, Prefix};
use nq_core::search::{CountStats, blocked_rows};
use nq_core::split::SubProblem;

use crate::{Error, Result};

/// Words per table; `NQ_TABLE_WORDS` in the kernel: two per entry, for the
/// columns reached with 0 to 32 queens placed.
pub const TABLE_WORDS: usize = 66;
/// Words per task; `NQ_TASK_WORDS` in the kernel.
pub const TASK_WORDS: usize = 5;
/// Words before the tasks of the kernel's spill queue; `NQ_SPILL_HEAD`.
pub const SPILL_HEAD: usize = 4;
/// Stack entries per lane; `NQ_DEPTH` in the kernel.
pub const STACK_DEPTH: usize = 16;
/// The most free columns a task leaves to search, its own included: its
/// stack holds at most one node per column (the last column's included), so
/// [`STACK_DEPTH`]; and it bounds a task's count by `16! < 2^64`.
pub const MAX_TASK_COLUMNS: usize = STACK_DEPTH;
/// The deepest expansion [`pack`] does to reach `min_tasks` (beyond what
/// [`MAX_TASK_COLUMNS`] demands): each level multiplies the tasks by about
/// N/3, so four levels turn even one sub-problem into thousands.
const MAX_HOST_DEPTH: usize = 4;

const MAX: usize = MAX_N as usize;

/// Where a table entry's count starts in its shift word; `NQ_COUNT_SHIFT`.
const COUNT_SHIFT: u32 = 5;
/// A node in the kernel's 32-bit accumulator (completions go in the bits
/// below); `NQ_NODE`.
const NODE: u32 = 1 << 18;

/// A sub-problem's search, as the kernel reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Table {
    /// The board's rows, `(1 << N) - 1`.
    board: u32,
    /// Rows holding a prefix queen.
    prefix_rows: u32,
    /// Queens of the prefix.
    placed: usize,
    /// Rows not used by the prefix.
    full: u32,
    /// Free columns.
    free: usize,
    /// Queens of the prefix that nq-core's count pre-placed on the strict
    /// border lines, beyond the sub-problem's own prefix: they stand for
    /// levels of the sub-problem's search, so the host's expansion counts
    /// them ([`target_level`]), and a sub-problem's tasks come out about as
    /// large as without them.
    lines: usize,
    /// `shift[j]`: columns from free column `j - 1` to free column `j`.
    shift: [u32; MAX],
    /// `blocked[j]`: rows of free column `j` the prefix attacks or the split
    /// forbids.
    blocked: [u32; MAX],
}

impl Table {
    /// The plan of nq-core's masked count (`search::count_masked`) of
    /// `prefix` avoiding `forbidden`, built the same way: the prefix's rows
    /// leave `full`, and the squares its queens attack and the forbidden
    /// squares are folded into `blocked` by nq-core's own rule
    /// ([`blocked_rows`]).
    fn of(prefix: &Prefix, forbidden: &[u32; MAX]) -> Table {
        let n = prefix.board().n();
        let full = prefix.board().full_mask() & !prefix.used_rows();
        let mut t = Table {
            board: prefix.board().full_mask(),
            prefix_rows: prefix.used_rows(),
            placed: prefix.len(),
            full,
            free: 0,
            lines: 0,
            shift: [0; MAX],
            blocked: [0; MAX],
        };
        let mut prev = 0u8;
        for x in (0..n).filter(|&x| prefix.get(x).is_none()) {
            t.shift[t.free] = u32::from(x - prev);
            t.blocked[t.free] = blocked_rows(prefix, x, forbidden[usize::from(x)]);
            prev = x;
            t.free += 1;
        }
        t
    }

    /// The kernel's table: entry `k` (words `2k`, `2k + 1`) is the free
    /// column reached with `k` queens placed, the prefix's `placed` first:
    /// its open rows (on the board, not blocked), and its shift (bits 0..4)
    /// plus, from bit [`COUNT_SHIFT`], what a lap that reaches it counts:
    /// [`NODE`] (a queen placed in a column before the last two), nothing
    /// (in the second-to-last column) or, in entry N, one completion (the
    /// lap that takes the last column's free row). Entry N and entries of
    /// no free column have no open row.
    fn write(&self, out: &mut Vec<u32>) {
        let at = out.len();
        out.resize(at + TABLE_WORDS, 0);
        let n = self.placed + self.free;
        for j in 0..self.free {
            let k = self.placed + j;
            let counted = if k + 1 < n { NODE } else { 0 };
            out[at + 2 * k] = self.board & !self.blocked[j];
            out[at + 2 * k + 1] = self.shift[j] | counted << COUNT_SHIFT;
        }
        out[at + 2 * n + 1] = 1 << COUNT_SHIFT;
    }

    /// The kernel's task for `node`: its rows in use include the prefix's,
    /// so that their popcount indexes the table.
    fn task(&self, index: u32, node: &Node) -> [u32; TASK_WORDS] {
        [
            index,
            self.prefix_rows | node.used,
            node.up,
            node.down,
            node.rem,
        ]
    }

    /// The root of the search: the first free column's free rows.
    fn root(&self) -> Node {
        Node {
            level: 0,
            rem: if self.free == 0 {
                0
            } else {
                self.full & !self.blocked[0]
            },
            used: 0,
            up: 0,
            down: 0,
        }
    }

    /// True when the host may expand a node at `level`: not in the last three
    /// free columns, whose subtrees are too small to be worth a task each.
    fn expandable(&self, level: usize) -> bool {
        level + 4 <= self.free
    }

    /// Calls `f` on each child of `node` that has a free row in its column,
    /// and returns the queens placed (the nodes of `node`'s column).
    fn children(&self, node: &Node, f: &mut dyn FnMut(Node)) -> u64 {
        let mut rem = node.rem;
        let mut placed = 0;
        let next = node.level + 1;
        while rem != 0 {
            // The lowest candidate row; `x & -x` isolates it.
            let bit = rem & rem.wrapping_neg();
            rem ^= bit;
            placed += 1;
            let used = node.used | bit;
            let s = self.shift[next];
            let (up, down) = ((node.up | bit) << s, (node.down | bit) >> s);
            let free = self.full & !(used | up | down | self.blocked[next]);
            if free != 0 {
                f(Node {
                    level: next,
                    rem: free,
                    used,
                    up,
                    down,
                });
            }
        }
        placed
    }
}

/// A node of a search: the kernel's task state.
#[derive(Clone, Copy, Debug)]
struct Node {
    level: usize,
    rem: u32,
    used: u32,
    up: u32,
    down: u32,
}

/// The kernel's input for a list of sub-problems, and what is needed to fold
/// its output back. Build it with [`pack`].
#[derive(Clone, Debug)]
pub struct Batch {
    /// The board every sub-problem is on.
    board: Board,
    /// [`TABLE_WORDS`] words per table: the prefixes of each sub-problem in
    /// the order given to [`pack`].
    tables: Vec<u32>,
    /// The sub-problem of each table.
    owner: Vec<u32>,
    /// [`TASK_WORDS`] words per task, in any order: a task's first word is
    /// its table's index.
    tasks: Vec<u32>,
    /// Completions and nodes the host counted itself, per sub-problem: the
    /// nodes its expansion placed, and the single completion of a complete
    /// prefix.
    host: Vec<CountStats>,
}

impl Batch {
    /// The board of the sub-problems.
    pub fn board(&self) -> Board {
        self.board
    }

    /// The tables, for the kernel's `tables` argument.
    pub fn tables(&self) -> &[u32] {
        &self.tables
    }

    /// The tasks, for the kernel's `tasks` argument.
    pub fn tasks(&self) -> &[u32] {
        &self.tasks
    }

    /// The number of tasks, for the kernel's `task_count` argument.
    pub fn task_count(&self) -> u32 {
        u32::try_from(self.tasks.len() / TASK_WORDS).expect("checked by pack")
    }

    /// The number of sub-problems.
    pub fn subproblems(&self) -> usize {
        self.host.len()
    }

    /// The batch that counts `spilled`, the tasks a launch of this batch
    /// gave back ([`TASK_WORDS`] words each, as the kernel's spill queue
    /// holds them): the same board and tables, those tasks (those with the
    /// most columns left and rows to try first), and nothing counted by the
    /// host. Fold its results and add them to this batch's: together they
    /// are exact.
    ///
    /// # Errors
    ///
    /// [`Error::ResultLength`] when `spilled` is not whole tasks of this
    /// batch's sub-problems.
    pub fn follow_up(&self, spilled: &[u32]) -> Result<Batch> {
        let bad = || Error::ResultLength {
            got: spilled.len(),
            want: spilled.len() / TASK_WORDS * TASK_WORDS,
        };
        if !spilled.len().is_multiple_of(TASK_WORDS)
            || spilled
                .chunks(TASK_WORDS)
                .any(|t| t[0] as usize >= self.owner.len())
        {
            return Err(bad());
        }
        let mut order: Vec<&[u32]> = spilled.chunks(TASK_WORDS).collect();
        // Queens placed (fewest first), then rows to try (most first): a
        // cheap stand-in for the largest first.
        order.sort_by_key(|t| (t[1].count_ones(), std::cmp::Reverse(t[4].count_ones())));
        Ok(Batch {
            board: self.board,
            tables: self.tables.clone(),
            owner: self.owner.clone(),
            tasks: order.concat(),
            host: vec![CountStats::default(); self.subproblems()],
        })
    }

    /// Folds the kernel's per-task `counts` and `nodes` into one
    /// [`CountStats`] per sub-problem, in the order given to [`pack`].
    ///
    /// # Errors
    ///
    /// [`Error::ResultLength`] when a slice does not have one entry per task,
    /// [`Error::Overflow`] if a sum would not fit (no correct result does).
    pub fn fold(&self, counts: &[u64], nodes: &[u64]) -> Result<Vec<CountStats>> {
        let tasks = self.tasks.len() / TASK_WORDS;
        for got in [counts.len(), nodes.len()] {
            if got != tasks {
                return Err(Error::ResultLength { got, want: tasks });
            }
        }
        let mut out = self.host.clone();
        for ((task, &count), &n) in self.tasks.chunks(TASK_WORDS).zip(counts).zip(nodes) {
            // pack wrote the index of one of the tables.
            let stats = &mut out[self.owner[task[0] as usize] as usize];
            stats.count = stats
                .count
                .checked_add(u128::from(count))
                .ok_or(Error::Overflow)?;
            stats.nodes = stats.nodes.checked_add(n).ok_or(Error::Overflow)?;
        }
        Ok(out)
    }
}

/// Packs `subs` into the kernel's buffers for one launch, with tail control:
///
/// 0. each sub-problem becomes one table per prefix that nq-core's count
///    searches ([`SubProblem::solve_prefixes`]);
/// 1. every sub-problem is expanded on the host to the first depth (at most
///    `MAX_HOST_DEPTH` levels below its pre-placed lines, which count as
///    levels) that gives at least `min_tasks` tasks, and always
///    far enough that no task leaves more than [`MAX_TASK_COLUMNS`] free
///    columns;
/// 2. each task's work is estimated (Knuth's estimator: a few random probes
///    down its subtree, seeded by the task so that a batch packs the same way
///    every time), and every task estimated above [`HEAVY`] times the mean
///    is split into its children, again until none is;
/// 3. the tasks are ordered longest first, so that the launch ends on its
///    smallest tasks instead of waiting for a heavy one that started last.
///
/// # Errors
///
/// [`Error::MixedBoards`] when the sub-problems are not all on one board,
/// [`Error::TooManyTasks`] when the tasks would not fit the kernel's 32-bit
/// task counter.
pub fn pack(subs: &[SubProblem], min_tasks: usize) -> Result<Batch> {
    let board = board_of(subs)?;
    let (tables, owner) = tables_of(subs)?;
    // MAX_HOST_DEPTH levels of search below the pre-placed lines at most.
    let deepest = MAX_HOST_DEPTH + tables.iter().map(|t| t.lines).max().unwrap_or(0);
    let mut depth = 0;
    while depth < deepest && count_tasks(&tables, depth) < min_tasks {
        depth += 1;
    }
    pack_tables(board, &tables, &owner, subs.len(), depth, true)
}

/// The tables of `subs` (one per prefix that nq-core's count searches,
/// [`SubProblem::solve_prefixes`]), and the sub-problem of each.
fn tables_of(subs: &[SubProblem]) -> Result<(Vec<Table>, Vec<u32>)> {
    let mut tables = vec![];
    let mut owner = vec![];
    for (i, sub) in subs.iter().enumerate() {
        let i =
            u32::try_from(i).map_err(|_| Error::TooManyTasks { tasks: subs.len() })?;
        let forbidden = sub.forbidden();
        for prefix in sub.solve_prefixes() {
            let mut table = Table::of(&prefix, &forbidden);
            table.lines = prefix.len() - sub.prefix().len();
            tables.push(table);
            owner.push(i);
        }
    }
    if u32::try_from(tables.len()).is_err() {
        return Err(Error::TooManyTasks {
            tasks: tables.len(),
        });
    }
    Ok((tables, owner))
}

/// Packs `subs` with every sub-problem expanded to level `depth` (or as deep
/// as the host expands at all, or deeper where [`MAX_TASK_COLUMNS`] demands):
/// [`pack`] at a depth chosen by the caller, with no splitting or ordering,
/// for tests.
///
/// # Errors
///
/// As [`pack`].
pub fn pack_at_depth(subs: &[SubProblem], depth: usize) -> Result<Batch> {
    let board = board_of(subs)?;
    let (tables, owner) = tables_of(subs)?;
    pack_tables(board, &tables, &owner, subs.len(), depth, false)
}

/// The one board of `subs`.
fn board_of(subs: &[SubProblem]) -> Result<Board> {
    let board = match subs.first() {
        Some(s) => s.prefix().board(),
        None => Board::new(1).expect("a valid board size"),
    };
    if let Some(other) = subs.iter().find(|s| s.prefix().board() != board) {
        return Err(Error::MixedBoards {
            first: board.n(),
            other: other.prefix().board().n(),
        });
    }
    Ok(board)
}

/// A task on its way into a batch: its table and node, and the estimate of
/// its work.
struct Pending {
    table: u32,
    node: Node,
    estimate: f64,
}

/// Packs `tables` (of `subproblems` sub-problems, `owner` giving each
/// table's) with each expanded to level `depth`, then balanced if asked.
fn pack_tables(
    board: Board,
    tables: &[Table],
    owner: &[u32],
    subproblems: usize,
    depth: usize,
    balance: bool,
) -> Result<Batch> {
    let mut batch = Batch {
        board,
        tables: Vec::with_capacity(tables.len() * TABLE_WORDS),
        owner: owner.to_vec(),
        tasks: vec![],
        host: vec![CountStats::default(); subproblems],
    };
    let mut pending = vec![];
    for ((i, table), &sub) in tables.iter().enumerate().zip(owner) {
        table.write(&mut batch.tables);
        // tables_of checked that every table index fits.
        let index = i as u32;
        let host = &mut batch.host[sub as usize];
        if table.free == 0 {
            // A complete prefix: its own single completion, no search.
            host.count += 1;
            continue;
        }
        let target = target_level(table, depth);
        expand(table, table.root(), target, &mut host.nodes, &mut |node| {
            pending.push(Pending {
                table: index,
                node,
                estimate: 0.0,
            });
        });
    }
    if balance {
        pending = split_heavy(tables, owner, pending, &mut batch.host);
        // Longest first; ties keep the sub-problem order.
        pending.sort_by(|a, b| b.estimate.total_cmp(&a.estimate));
    }
    let tasks = pending.len();
    if u32::try_from(tasks).is_err() {
        return Err(Error::TooManyTasks { tasks });
    }
    batch.tasks.reserve(tasks * TASK_WORDS);
    for p in &pending {
        let table = &tables[p.table as usize];
        batch.tasks.extend_from_slice(&table.task(p.table, &p.node));
    }
    Ok(batch)
}

/// A task is split when its estimate is above this many times the mean.
pub const HEAVY: f64 = 2.0;

/// Random probes per task estimate.
const PROBES: u32 = 4;

/// Estimates every task and splits, level by level, each one above [`HEAVY`]
/// times the mean into its children (adding the queens placed to `host`, per
/// sub-problem: `owner` gives each table's), while it can be expanded.
fn split_heavy(
    tables: &[Table],
    owner: &[u32],
    mut pending: Vec<Pending>,
    host: &mut [CountStats],
) -> Vec<Pending> {
    for p in &mut pending {
        p.estimate = estimate(&tables[p.table as usize], p.table, &p.node);
    }
    let total: f64 = pending.iter().map(|p| p.estimate).sum();
    if pending.is_empty() || total <= 0.0 {
        return pending;
    }
    let limit = HEAVY * total / pending.len() as f64;
    let mut out = Vec::with_capacity(pending.len());
    while let Some(p) = pending.pop() {
        let table = &tables[p.table as usize];
        if p.estimate <= limit || !table.expandable(p.node.level) {
            out.push(p);
            continue;
        }
        let placed = table.children(&p.node, &mut |node| {
            let estimate = estimate(table, p.table, &node);
            pending.push(Pending {
                table: p.table,
                node,
                estimate,
            });
        });
        let stats = &mut host[owner[p.table as usize] as usize];
        stats.nodes += placed;
    }
    out
}

/// Knuth's estimate of the laps below `node` (queens placed in every free
/// column but the last): the mean over [`PROBES`] random paths of the sum,
/// over the levels of the path, of the product of the branchings above. The
/// probes are seeded by the task, so the same batch packs the same way.
fn estimate(table: &Table, index: u32, node: &Node) -> f64 {
    let mut seed =
        (u64::from(index) << 32 | u64::from(node.used)) ^ u64::from(node.rem) << 7 | 1;
    let mut sum = 0.0;
    for _ in 0..PROBES {
        let mut n = *node;
        let mut weight = 1.0;
        while n.level + 1 < table.free && n.rem != 0 {
            let choices = n.rem.count_ones();
            weight *= f64::from(choices);
            sum += weight;
            // xorshift64: a different row per probe and level.
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let mut pick = (seed % u64::from(choices)) as u32;
            let mut rem = n.rem;
            while pick > 0 {
                rem &= rem - 1;
                pick -= 1;
            }
            let bit = rem & rem.wrapping_neg();
            let next = n.level + 1;
            let s = table.shift[next];
            let used = n.used | bit;
            let (up, down) = ((n.up | bit) << s, (n.down | bit) >> s);
            n = Node {
                level: next,
                rem: table.full & !(used | up | down | table.blocked[next]),
                used,
                up,
                down,
            };
        }
    }
    sum / f64::from(PROBES)
}

/// The level a table's tasks start at: `depth` queens below the
/// sub-problem's prefix (its pre-placed line queens count), or deeper when
/// that would leave more than [`MAX_TASK_COLUMNS`] free columns below a task.
fn target_level(table: &Table, depth: usize) -> usize {
    depth
        .saturating_sub(table.lines)
        .max(table.free.saturating_sub(MAX_TASK_COLUMNS))
}

/// Emits the nodes of `node`'s subtree at level `target` (or the deepest
/// level the host expands), adding the queens placed on the way to `nodes`.
fn expand(
    table: &Table,
    node: Node,
    target: usize,
    nodes: &mut u64,
    emit: &mut dyn FnMut(Node),
) {
    if node.level >= target || !table.expandable(node.level) {
        return emit(node);
    }
    let mut children = vec![];
    *nodes += table.children(&node, &mut |c| children.push(c));
    for child in children {
        expand(table, child, target, nodes, emit);
    }
}

/// The number of tasks [`pack`] would make at expansion depth `depth`.
fn count_tasks(tables: &[Table], depth: usize) -> usize {
    let mut tasks = 0;
    let mut nodes = 0;
    for table in tables {
        expand(
            table,
            table.root(),
            target_level(table, depth),
            &mut nodes,
            &mut |_| tasks += 1,
        );
    }
    tasks
}

/// nq-core's depth-first reference count of `sub`'s completions, summed
/// over the prefixes its own count searches: the completions and the nodes
/// the kernel must report. For the tests.
#[cfg(test)]
pub(crate) fn reference(sub: &SubProblem) -> CountStats {
    let never = std::sync::atomic::AtomicBool::new(false);
    let forbidden = sub.forbidden();
    let mut total = CountStats::default();
    for prefix in sub.solve_prefixes() {
        let s = nq_core::search::count_masked_reference(&prefix, &forbidden, &never)
            .expect("never stopped");
        total.count += s.count;
        total.nodes += s.nodes;
    }
    total
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use nq_core::split::{SplitSpec, split};

    use super::*;

    /// The tables rebuild nq-core's plan: a depth-first count over a table (a
    /// plain recursive walk here, independent of the kernel) gives nq-core's
    /// reference count and nodes for every sub-problem.
    #[test]
    fn tables_and_expansion_reproduce_the_reference_counts() {
        let never = AtomicBool::new(false);
        for n in 4..=11u64 {
            let board = Board::new(n).unwrap();
            for extra in 0..=2 {
                let subs = split(board, SplitSpec::border(extra).unwrap());
                for min_tasks in [0, 1 << 12] {
                    let batch = pack(&subs, min_tasks).unwrap();
                    let (counts, nodes) = walk_batch(&batch);
                    let got = batch.fold(&counts, &nodes).unwrap();
                    for (sub, got) in subs.iter().zip(got) {
                        let want = reference(sub);
                        assert_eq!(got, want, "n={n} extra={extra} {:?}", sub.prefix());
                        // The nodes nq-core's own count reports: the
                        // kernel visits what the CPU kernels visit.
                        let (counts, cpu) = sub.solve(&never).unwrap();
                        assert_eq!((got.count, got.nodes), (counts.count, cpu.nodes));
                    }
                }
            }
        }
    }

    #[test]
    fn expansion_reaches_the_asked_tasks_and_bounds_each_task() {
        let board = Board::new(16).unwrap();
        let subs = split(board, SplitSpec::BORDER);
        let few = pack_at_depth(&subs, 0).unwrap();
        let many = pack(&subs, 100_000).unwrap();
        // One task per table (no prefix of N = 16 is complete), and at
        // least one table per sub-problem.
        let tables = few.tables().len() / TABLE_WORDS;
        assert_eq!(few.task_count() as usize, tables);
        assert!(tables > subs.len(), "no line was pre-placed");
        assert!(many.task_count() >= 100_000, "{}", many.task_count());
        // N = 24 leaves 23 free columns after the column-0 queen: the host
        // must place at least three more before a task is small enough.
        let subs = split(Board::new(24).unwrap(), SplitSpec::BORDER);
        let b = pack(&subs[..3], 0).unwrap();
        for task in b.tasks().chunks(TASK_WORDS) {
            // Free columns left to search: N minus the queens placed.
            assert!(24 - task[1].count_ones() as usize <= MAX_TASK_COLUMNS);
        }
    }

    /// pack's tail control: after it, no task that the host could still
    /// split is estimated above HEAVY times the mean, and the tasks come
    /// longest first.
    #[test]
    fn heavy_tasks_are_split_and_the_longest_go_first() {
        let subs = split(Board::new(16).unwrap(), SplitSpec::border(1).unwrap());
        let (tables, _) = tables_of(&subs).unwrap();
        let plain = pack_at_depth(&subs, 1).unwrap();
        let batch = pack(&subs, plain.task_count() as usize).unwrap();
        assert!(batch.task_count() > plain.task_count(), "nothing was split");
        // (estimate, splittable) of each task, as pack computed them.
        let estimates = |b: &Batch| -> Vec<(f64, bool)> {
            b.tasks()
                .chunks(TASK_WORDS)
                .map(|t| {
                    let table = &tables[t[0] as usize];
                    let used = t[1] & !table.prefix_rows;
                    let node = Node {
                        level: used.count_ones() as usize,
                        rem: t[4],
                        used,
                        up: t[2],
                        down: t[3],
                    };
                    (estimate(table, t[0], &node), table.expandable(node.level))
                })
                .collect()
        };
        let after = estimates(&batch);
        assert!(
            after.windows(2).all(|w| w[0].0 >= w[1].0),
            "not longest first"
        );
        // pack expanded to depth 1 (the first with that many tasks), then
        // split against HEAVY times the mean there.
        let before = estimates(&plain);
        let limit = HEAVY * before.iter().map(|e| e.0).sum::<f64>() / before.len() as f64;
        for (e, splittable) in after {
            assert!(e <= limit || !splittable, "{e} over the limit {limit}");
        }
        // And the counts stay exact (the order is free: fold reads each
        // task's table from the task).
        let (counts, nodes) = walk_batch(&batch);
        for (sub, got) in subs.iter().zip(batch.fold(&counts, &nodes).unwrap()) {
            assert_eq!(got, reference(sub), "{:?}", sub.prefix());
        }
    }

    #[test]
    fn bad_batches_are_refused_by_name() {
        let a = split(Board::new(6).unwrap(), SplitSpec::BORDER);
        let b = split(Board::new(7).unwrap(), SplitSpec::BORDER);
        let mixed = [a[0], b[0]];
        let e = pack(&mixed, 0).unwrap_err().to_string();
        assert!(e.contains('6') && e.contains('7'), "{e}");
        let batch = pack(&a, 0).unwrap();
        let e = batch.fold(&[], &[]).unwrap_err().to_string();
        assert!(e.contains("results"), "{e}");
        let tasks = batch.task_count() as usize;
        let e = batch
            .fold(&vec![u64::MAX; tasks], &vec![0; tasks])
            .map(|v| v.len())
            .unwrap();
        assert_eq!(e, a.len(), "u64::MAX per task still folds into u128");
    }

    /// Counts every task by a plain recursive search over its table, read as
    /// the kernel reads it (entry `k` by the popcount of the rows in use).
    fn walk_batch(batch: &Batch) -> (Vec<u64>, Vec<u64>) {
        let last = u32::from(batch.board().n()) - 1;
        let mut counts = vec![];
        let mut nodes = vec![];
        for task in batch.tasks().chunks(TASK_WORDS) {
            let t = &batch.tables()[task[0] as usize * TABLE_WORDS..][..TABLE_WORDS];
            let (c, k) = walk(t, last, task[1], task[2], task[3], task[4]);
            counts.push(c);
            nodes.push(k);
        }
        (counts, nodes)
    }

    /// (completions, nodes) below a node: a queen in each column to the last,
    /// nodes counted in every free column but the last two. Reads each
    /// entry's open rows and shift, and checks its count word against the
    /// column it stands for.
    fn walk(
        t: &[u32],
        last: u32,
        cur: u32,
        left: u32,
        right: u32,
        rows: u32,
    ) -> (u64, u64) {
        if cur.count_ones() == last {
            return (rows.count_ones().into(), 0);
        }
        let (mut count, mut nodes) = (0, 0);
        let mut rem = rows;
        while rem != 0 {
            let bit = rem & rem.wrapping_neg();
            rem ^= bit;
            let c = cur | bit;
            let k = c.count_ones() as usize;
            let (open, s) = (t[2 * k], t[2 * k + 1] & 31);
            let (l, r) = ((left | bit) << s, (right | bit) >> s);
            let counted = t[2 * k + 1] >> COUNT_SHIFT;
            if k as u32 != last {
                assert_eq!(counted, NODE, "entry {k}");
                nodes += 1;
            } else {
                assert_eq!(counted, 0, "entry {k}");
                assert_eq!(t[2 * k + 3] >> COUNT_SHIFT, 1, "entry {}", k + 1);
                assert_eq!(t[2 * k + 2], 0, "entry {}", k + 1);
            }
            let (a, b) = walk(t, last, c, l, r, open & !(c | l | r));
            count += a;
            nodes += b;
        }
        (count, nodes)
    }
}
