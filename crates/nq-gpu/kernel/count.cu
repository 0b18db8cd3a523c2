// The GPU count kernel of nq: completions of the border split's sub-problems.
//
// ONE SOURCE, TWO COMPILERS. NVRTC compiles this file for the GPU, and the
// tests compile the same text as host C++ through shim.h and run it under
// UBSan against nq-core, both thread by thread and lock-step over warps of 32
// lanes (host.cpp). So it is written in a subset of CUDA C that means the
// same on both: no barriers, no warp intrinsics, no inline PTX, no shift by
// 32 or more (PTX gives 0, x86 masks the count; UBSan reports it on the
// host), and only 32- and 64-bit unsigned arithmetic.
//
// WORK. A *task* is a node of one prefix's search tree, in the column
// its search reaches next: `cur`, the rows already holding a queen (the
// prefix's rows included), `left` and `right`, the rows the placed queens
// attack along both diagonals as seen from that column, and `valid`, the
// rows of that column still to try. The host (crates/nq-gpu/src/pack.rs)
// builds the tasks by expanding the first levels of each sub-problem, and one
// *table* per prefix that all its tasks share (a sub-problem's own, or each
// of those with its strict border lines' queens pre-placed, as the CPU
// kernels count it).
//
// THE TABLE IS INDEXED BY POPCOUNT. Every queen on the board sits on its own
// row, so popc(cur) is the number of queens placed before the column a node
// is in: the prefix's P queens and one per free column searched. Entry k of a
// sub-problem's table describes the free column reached with k queens placed:
// its open rows (on the board, neither attacked by the prefix nor forbidden
// by the split), the shift, in columns, from the free column before it, and
// what a lap that reaches it counts (NQ_COUNT_SHIFT). A column that the
// prefix pre-placed is never visited: its queen is in `cur`, its attacks are
// out of the open rows, and the next free column is reached with a shift of
// 2 or more at no extra cost. The last free column is the one reached with
// N - 1 queens placed; entry N, reached by placing the last column's queen,
// is a sink with no open row that counts one completion.
//
// ONE LAP = ONE PLACEMENT, with no divergent branch but the rare refill
// (GPU.md section 8.3.2). A lane's stack, in shared memory, holds the node it
// expands on top and, below it, the ancestors that still have rows to try:
//   1. load the top entry and take its lowest untried row p; write the
//      other rows back (the entry is popped when none is left);
//   2. build the child: cur | p, and both diagonals shifted by the table's
//      shift of the child's column, whose entry k = popc(cur | p) is one
//      8-byte shared-memory load;
//   3. add the entry's count: a node, a completion (k = N), or nothing;
//   4. if the child has a free row, push it (in the last column it has at
//      most one, the row no queen uses; entry N has none).
// There is no test of k: the table says what each column counts. Every step
// is a select or a predicated store, so all lanes of a warp run the same
// instructions and each active lane places one queen per lap. A node (the
// project's meaning: a queen placed in any free column but the last two) is
// a lap that reaches a column before the second-to-last.
//
// NO LANE WAITS FOR ITS WARP. A lane whose stack is empty writes its task's
// results and takes the next task (one atomicAdd) inside the loop, then goes
// on with the next lap; the other lanes wait only for that refill. Lanes
// leave the loop one by one when no task is left.
//
// SHARED MEMORY PER LANE, lane-major (entry i of thread t at [i * NQ_BLOCK +
// t]), so that a warp's 16- or 8-byte accesses take the minimum 4 or 2
// wavefronts whatever entry each lane reads:
//   * NQ_DEPTH stack entries of 16 bytes (cur, left, right, valid);
//   * NQ_N + 1 table entries of 8 bytes, the lane's copy of the entries its
//     task's table has for the columns after the task's own, copied only
//     when the lane's column does not hold them already.
// Per lap a warp loads its stack tops (4 wavefronts), writes back `valid`
// (4: lanes 8 apart share a bank), loads its table entries (2) and pushes
// (4, predicated): about ygch's traffic plus the table.
//
// EXACTNESS. Counts and nodes are 64-bit per task; the host bounds every
// task below 2^64 completions and nodes and folds them into u128. The stack
// depth is a compile-time bound that the host guarantees: a task leaves at
// most NQ_DEPTH free columns to search (pack.rs, MAX_TASK_COLUMNS).

#ifndef NQ_N
#error "compile with -DNQ_N=<largest board size>"
#endif
#if NQ_N < 1 || NQ_N > 32
#error "NQ_N must be 1..32"
#endif

// Threads per block; the launch MUST use this block size.
#ifndef NQ_BLOCK
#define NQ_BLOCK 64
#endif

// Stack entries per lane. A task in free column j of F stacks at most one
// node of each of the columns j .. F - 1, F - j of them: pack.rs keeps
// F - j <= NQ_DEPTH (MAX_TASK_COLUMNS).
#ifndef NQ_DEPTH
#define NQ_DEPTH 16
#endif

// Linkage of the entry point: C for NVRTC (an unmangled name to look up);
// the host shim overrides it to compile one copy per board size.
#ifndef NQ_EXTERN
#define NQ_EXTERN extern "C"
#endif

// Buffer layout, shared with crates/nq-gpu/src/pack.rs (a test checks that
// both sides agree).
// A table: 33 entries of (open rows, shift | count << NQ_COUNT_SHIFT), for
// the columns reached with 0 .. 32 queens placed.
#define NQ_TABLE_WORDS 66
// A task: table index, cur, left, right, valid.
#define NQ_TASK_WORDS 5
// The spill queue (NULL: no spilling): words reserved, written and capacity
// (in tasks), one unused word, then the spilled tasks, NQ_TASK_WORDS each.
#define NQ_SPILL_HEAD 4

// A lap adds to one 32-bit accumulator what its child's table entry says
// (the entry's shift word from bit NQ_COUNT_SHIFT, added by the same
// instruction that shifts it down): 2^18 for a node, 1 for a completion (the
// lap that takes the one free row of a node in the last column), 0 for a
// queen in the second-to-last column. The lane flushes it into its task's
// 64-bit totals once the nodes reach 2^12 (bit 30: the loop's guard tests it
// together with the empty stack's bit 30 in one instruction). A completion
// lap pops a last-column node that a lap in the second-to-last column pushed,
// taking a row of the one stack entry there, which a node lap made (or the
// task, or it was on the stack at the last flush); so between two flushes
// the completions are at most 32 * (2^12 + 1) + 1 < 2^18, and the nodes at
// most 2^12: neither field can spill into the other, nor past bit 30.
#define NQ_NODE (1u << 18)
#define NQ_COUNT_SHIFT 5
#define NQ_LEAVES (NQ_NODE - 1u)
#define NQ_DUE 0x40000000u

// No task, no table: a lane's state before its first fetch.
#define NQ_NONE 0xffffffffu

// Bytes from one stack entry of a lane to the next (lane-major), and the
// `top` of an empty stack: entry -1, the one value of top with its top bit
// set (the stack is far smaller than 2 GiB).
#define NQ_ENTRY_BYTES (NQ_BLOCK * 16u)
#define NQ_EMPTY (0u - NQ_ENTRY_BYTES)

// A lane's state between laps. Everything here lives in registers on the GPU;
// the node being expanded is the top entry of the lane's stack.
struct nq_lane {
    // The lane's stack and table columns: entry i is [i * NQ_BLOCK]. Set
    // again by every refill: a value the loop carries stays in a register,
    // where a loop-invariant shared address is recomputed by the compiler
    // every lap (7 instructions on sm_90).
    uint4* stk;
    const uint2* tab;
    // The byte offset of the top stack entry in the lane's column (entry i
    // at i * NQ_ENTRY_BYTES), or NQ_EMPTY: its top bit is set only when
    // the stack is empty, so one test of (top | acc) guards the refill.
    unsigned int top;
    // The task being counted, the table copied into the lane's entries,
    // and the first entry copied (the others, up to N, follow it).
    unsigned int task, table, from;
    // The task's completions and nodes so far, without `acc`, which is
    // added in at the next refill.
    unsigned long long count, nodes;
    // Nodes (times NQ_NODE) and completions since then: one add per lap. A
    // refill (a flush only, when the task goes on) is forced when the top
    // bit is set, so neither field can wrap.
    unsigned int acc;
};

// A lane before its first task.
__device__ __forceinline__ void nq_start(nq_lane& s)
{
    s.stk = 0;
    s.tab = 0;
    s.top = NQ_EMPTY;
    s.task = NQ_NONE;
    s.table = NQ_NONE;
    s.from = 0;
    s.count = 0;
    s.nodes = 0;
    s.acc = 0;
}

// True when the lane must run nq_refill before its next lap: its task is done
// (or it has none yet), or its accumulator is due to be flushed.
__device__ __forceinline__ bool nq_due(const nq_lane& s)
{
    return ((s.top | s.acc) & NQ_DUE) != 0;
}

// One lap: one queen placed on the lowest untried row of the node on top of
// the stack; what the child's column counts added; the child pushed or
// dropped; the node popped when it has no row left. The task is done when
// the stack is empty. Every step is an unconditional or predicated
// instruction: no branch.
__device__ __forceinline__ void nq_lap(nq_lane& s)
{
    // The node on top of the stack, the other rows to try (v & (v - 1)) and
    // the lowest one, p = v ^ rest: written this way the compiler folds p
    // into each of its three uses (one three-input logic op each) and never
    // computes it alone.
    uint4* const at = (uint4*)((char*)s.stk + s.top);
    const uint4 n = *at;
    const unsigned int rest = n.w & (n.w - 1u);
    const unsigned int p = n.w ^ rest;
    // Written back whether or not the node is done: a done node is popped,
    // and its entry is dead.
    at->w = rest;
    const unsigned int c = n.x | p;
    // The child's column, entry popc(c) of the table: its open rows, and its
    // shift and count word. popc(c) <= N <= NQ_N.
    // Indexed in bytes with an unsigned product, which the compiler folds
    // into one shift-and-add (the plain index costs two instructions).
    const uint2 e = *(const uint2*)((const char*)s.tab +
                                    (unsigned int)__popc(c) * (NQ_BLOCK * 8u));
    // Funnel shifts read only the low 5 bits of e.y (the shift), so the
    // count in its upper bits costs no mask (a plain shift by 32 or more
    // gives 0).
    const unsigned int l = __funnelshift_l(0u, n.y | p, e.y);
    const unsigned int r = __funnelshift_r(n.z | p, 0u, e.y);
    const unsigned int free = e.x & ~(c | l | r);
    // A node, a completion, or nothing (NQ_COUNT_SHIFT): one shift-and-add.
    s.acc += e.y >> NQ_COUNT_SHIFT;
    // The node stays on the stack while it has rows left, else it is popped;
    // the child, if it has a free row, goes above what stays. A child in
    // the last column has at most one (its column has one unused row), and
    // its own lap counts it; the sink column after it has none. Addresses
    // are byte offsets, so that the push is the popped-or-not top's address
    // plus a constant.
    const unsigned int pop = rest == 0 ? NQ_ENTRY_BYTES : 0u;
    uint4* const below = (uint4*)((char*)at - pop);
    if (free != 0) {
        below[NQ_BLOCK] = make_uint4(c, l, r, free);
    }
    s.top = s.top - pop + (free != 0 ? NQ_ENTRY_BYTES : 0u);
}

// TAIL CONTROL. When the launch has no task left for anyone, a lane that
// still has a long task gives back its pending work: at its next flush (every
// 2^12 nodes) it writes every entry of its stack as a new task (each entry's
// untried rows are a part of the remaining subtree, and together they are
// all of it) to the spill queue, ends its task with what it counted so far,
// and leaves. The host counts the spilled tasks in a follow-up launch, where
// every lane of the GPU shares them, instead of one lane finishing them
// alone. Returns true when the stack was given back. A reservation that does
// not fit the queue spills nothing, and every later one fails too, so the
// written tasks are the first `written` slots.
__device__ __forceinline__ bool nq_spill(nq_lane& s, unsigned int* __restrict__ spill,
                                         unsigned int* __restrict__ next_task,
                                         unsigned int task_count)
{
    if (spill == 0 || atomicAdd(next_task, 0u) < task_count) {
        return false;
    }
    const unsigned int entries = (s.top + NQ_ENTRY_BYTES) / NQ_ENTRY_BYTES;
    const unsigned int at = atomicAdd(&spill[0], entries);
    const unsigned int cap = spill[2];
    if (at > cap || cap - at < entries) {
        return false;
    }
    for (unsigned int i = 0; i < entries; ++i) {
        const uint4 e = s.stk[i * NQ_BLOCK];
        unsigned int* const w = spill + NQ_SPILL_HEAD + (at + i) * NQ_TASK_WORDS;
        w[0] = s.table;
        w[1] = e.x;
        w[2] = e.y;
        w[3] = e.z;
        w[4] = e.w;
    }
    atomicAdd(&spill[1], entries);
    s.top = NQ_EMPTY;
    return true;
}

// Ends the lane's task (writing its results) and takes tasks until one has
// something to expand. Returns false when no task is left. Tasks in the last
// free column, or whose column has no free row, are counted here at once.
__device__ __forceinline__ bool nq_refill(nq_lane& s, uint4* stk, uint2* tab,
                                          const unsigned int* __restrict__ tables,
                                          const unsigned int* __restrict__ tasks,
                                          unsigned int task_count,
                                          unsigned int* __restrict__ next_task,
                                          unsigned int last,
                                          unsigned long long* __restrict__ counts,
                                          unsigned long long* __restrict__ nodes_out,
                                          unsigned int* __restrict__ spill)
{
    for (;;) {
        s.count += s.acc & NQ_LEAVES;
        s.nodes += s.acc / NQ_NODE;
        s.acc = 0;
        if (s.top != NQ_EMPTY && !nq_spill(s, spill, next_task, task_count)) {
            // Only a flush: the task goes on.
            return true;
        }
        if (s.task != NQ_NONE) {
            counts[s.task] = s.count;
            nodes_out[s.task] = s.nodes;
        }
        // Persistent thread: the next task, until none is left.
        s.task = atomicAdd(next_task, 1u);
        if (s.task >= task_count) {
            s.task = NQ_NONE;
            return false;
        }
        const unsigned int* const t = tasks + (unsigned long long)s.task * NQ_TASK_WORDS;
        const unsigned int cur = t[1];
        const unsigned int valid = t[4];
        s.count = 0;
        s.nodes = 0;
        const unsigned int placed = __popc(cur);
        if (placed == last) {
            // The task's column is the last: each free row is a completion.
            s.count = __popc(valid);
            continue;
        }
        if (valid == 0) {
            continue;
        }
        s.stk = stk;
        s.tab = tab;
        s.top = 0;
        stk[0] = make_uint4(cur, t[2], t[3], valid);
        // The task's laps read the entries of the columns after its own,
        // placed + 1 .. N: copied unless the lane's column holds them.
        if (t[0] != s.table || placed + 1u < s.from) {
            s.table = t[0];
            s.from = placed + 1u;
            const unsigned int* const w =
                tables + (unsigned long long)s.table * NQ_TABLE_WORDS;
            for (unsigned int k = s.from; k <= last + 1u; ++k) {
                tab[k * NQ_BLOCK] = make_uint2(w[2 * k], w[2 * k + 1]);
            }
        }
        return true;
    }
}

#ifdef NQ_COUNTERS
// The counters build (-DNQ_COUNTERS), for a GPU machine without Nsight
// Compute: each lane adds its laps, its loop iterations and its cycles from
// start to exit, and raises its warp's iteration count to its own, so that
// the host gets lanes active per lap (laps over the warps' iterations) and
// the launch's tail (lane cycles over lanes times the longest). Counter
// words: [0] laps, [1] iterations, [2] cycles, [3] longest lane's cycles,
// [NQ_COUNTER_WARPS + w] iterations of warp w (the longest of its lanes).
#define NQ_COUNTER_WARPS 4
__device__ __forceinline__ void nq_counters_flush(unsigned long long* counters,
                                                  unsigned long long laps,
                                                  unsigned long long iters,
                                                  unsigned long long cycles)
{
    const unsigned int warp = (blockIdx.x * NQ_BLOCK + threadIdx.x) / 32;
    atomicAdd(&counters[0], laps);
    atomicAdd(&counters[1], iters);
    atomicAdd(&counters[2], cycles);
    atomicMax(&counters[3], cycles);
    atomicMax(&counters[NQ_COUNTER_WARPS + warp], iters);
}
#endif

// `spill` is the spill queue (NULL: no spilling); `counters` is read only by
// the counters build (NULL otherwise), so that both builds take the same
// arguments.
NQ_EXTERN __global__ void __launch_bounds__(NQ_BLOCK)
nq_count(const unsigned int* __restrict__ tables, const unsigned int* __restrict__ tasks,
         unsigned int task_count, unsigned int* __restrict__ next_task, unsigned int n,
         unsigned long long* __restrict__ counts, unsigned long long* __restrict__ nodes_out,
         unsigned int* __restrict__ spill, unsigned long long* __restrict__ counters)
{
    __shared__ uint4 stack[NQ_DEPTH * NQ_BLOCK];
    __shared__ uint2 words[(NQ_N + 1) * NQ_BLOCK];
    // This thread's column of each: entry i is [i * NQ_BLOCK].
    uint4* const stk = stack + threadIdx.x;
    uint2* const tab = words + threadIdx.x;
    if (n == 0 || n > NQ_N) {
        return;
    }
    const unsigned int last = n - 1;
    nq_lane s;
    nq_start(s);
#ifdef NQ_COUNTERS
    unsigned long long laps = 0;
    unsigned long long iters = 0;
    const long long started = clock64();
#else
    (void)counters;
#endif
    for (;;) {
#ifdef NQ_COUNTERS
        iters += 1;
#endif
        // The refill is the loop's only branch, taken in the rare lap after a
        // lane's task ended (or its 32-bit counters are due); the lanes of
        // the warp join again for the lap.
        if (nq_due(s) &&
            !nq_refill(s, stk, tab, tables, tasks, task_count, next_task, last, counts,
                       nodes_out, spill)) {
#ifdef NQ_COUNTERS
            nq_counters_flush(counters, laps, iters,
                              (unsigned long long)(clock64() - started));
#endif
            return;
        }
        nq_lap(s);
#ifdef NQ_COUNTERS
        laps += 1;
#endif
    }
}
