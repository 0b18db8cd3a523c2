// The GPU count kernel of nq: completions of the border split's sub-problems.
//
// ONE SOURCE, TWO COMPILERS. NVRTC compiles this file for the GPU (with
// -DNQ_N=<board size>), and the tests compile the same text as host C++
// through shim.h and run it under UBSan against nq-core. So it is written in
// a subset of CUDA C that means the same on both: no barriers, no warp
// intrinsics, no inline PTX, no shift by 32 or more (PTX gives 0, x86 masks
// the count; UBSan reports it on the host), and only 32- and 64-bit unsigned
// arithmetic.
//
// WORK. A *task* is a node of one sub-problem's search tree: its free column
// `level`, the candidate rows `rem` of that column, and the rows used and
// attacked along both diagonals as seen from it (`used`, `up`, `down`). The
// host (crates/nq-gpu/src/pack.rs) builds the tasks by expanding the first
// levels of each sub-problem, and one *table* per sub-problem that all its
// tasks share: the rows it may use (`full`), its number of free columns, and
// per free column the shift from the previous free column and the rows its
// prefix blocks. The kernel writes each task's completions and nodes (queens
// placed in every free column but the last two, as nq-core counts them).
//
// DESIGN (../shared/GPU.md sections 1.5 and 6). Shared-memory traffic, not
// ALU work, bounds this kind of kernel, so it is kept off the common path:
// * persistent threads: each thread pulls its next task with one atomicAdd
//   on a global counter, so no lane waits for a slow task of another;
// * the current node lives in registers (level, rem, used, up, down);
// * only ancestors that still have candidates are pushed, one 16-byte entry
//   per level at a slot fixed by the level, so the stack needs no pointer: a
//   register bit mask `pending` says which levels hold an entry, and the
//   highest one is the top;
// * the stack is in shared memory with level L of thread t at
//   stack[L * NQ_BLOCK + t]: lane i of a warp always reads and writes the same
//   four banks (16*i mod 128 bytes), whatever level each lane is at, so a
//   warp's 16-byte access takes the minimum four wavefronts;
// * the last two free columns are counted in closed form (pairs), never
//   searched;
// * the per-sub-problem tables are read from global memory through the
//   read-only path: every task of a sub-problem reads the same 66 words, so
//   they stay in L1. (A table in shared memory per block would need a barrier
//   to fill, and this subset has none.)
//
// MEMORY ACCESSES PER NODE (a node = one queen placed). The shared-memory
// accesses are what limits ygch's kernel: one 16-byte load and one 4-byte
// store every node, and a 16-byte store whenever it pushes. Here a node
// touches the stack only:
// * with a 16-byte store, when it descends and its parent still has rows
//   left to try;
// * with a 16-byte load, for the pop that later resumes that parent.
// A node of the last searched column never descends: it counts the two
// columns after it in closed form. Most nodes are such nodes, so the stack
// traffic is well below one access per node. Every node reads two table words
// (shift, blocked) through L1; a third and fourth in the last searched column.
// Those L1 reads are the kernel's main memory traffic. They take few
// wavefronts only while the lanes of a warp work on tasks of one sub-problem,
// whose tasks are contiguous. Neither count has been measured on a GPU.

#ifndef NQ_N
#error "compile with -DNQ_N=<board size>"
#endif
#if NQ_N < 1 || NQ_N > 32
#error "NQ_N must be 1..32"
#endif

// Threads per block; the launch MUST use this block size.
#ifndef NQ_BLOCK
#define NQ_BLOCK 96
#endif

// Linkage of the entry point: C for NVRTC (an unmangled name to look up);
// the host shim overrides it to compile one copy per board size.
#ifndef NQ_EXTERN
#define NQ_EXTERN extern "C"
#endif

// Buffer layout, shared with crates/nq-gpu/src/pack.rs (a test checks that
// both sides agree).
// A table: full, free columns, shift[32], blocked[32].
#define NQ_TABLE_WORDS 66
// A task: table index, level, rem, used, up, down.
#define NQ_TASK_WORDS 6

// Levels that can hold a pushed ancestor. A node at level L is pushed only
// when its child at L + 1 is searched one queen at a time, that is when
// L + 1 <= free - 3, and free <= N: so L <= N - 4, and N - 3 slots suffice.
#define NQ_STACK_LEVELS (NQ_N > 3 ? NQ_N - 3 : 1)

// Completions of the last two free columns, whose free rows are f1 and f2
// (before either holds a queen), s columns apart. A queen on row r of the
// first takes rows r, r + s and r - s of the second and nothing else, so the
// count is |f1|*|f2| minus the pairs that collide on each of those three
// rows. Never negative: each subtracted set is a subset of the pairs. s is
// at most N - 1 <= 31, so no shift reaches 32.
__device__ __forceinline__ unsigned int nq_pairs(unsigned int f1, unsigned int f2,
                                                 unsigned int s)
{
    return __popc(f1) * __popc(f2) - __popc(f1 & f2) - __popc(f1 & (f2 >> s)) -
           __popc(f1 & (f2 << s));
}

NQ_EXTERN __global__ void __launch_bounds__(NQ_BLOCK)
nq_count(const unsigned int* __restrict__ tables, const unsigned int* __restrict__ tasks,
         unsigned int task_count, unsigned int* __restrict__ next_task,
         unsigned long long* __restrict__ counts, unsigned long long* __restrict__ nodes_out)
{
    __shared__ uint4 stack[NQ_STACK_LEVELS * NQ_BLOCK];
    // This thread's column of the stack: level L is mine[L * NQ_BLOCK].
    uint4* const mine = stack + threadIdx.x;
    for (;;) {
        // Persistent thread: the next task, until none is left.
        const unsigned int task = atomicAdd(next_task, 1u);
        if (task >= task_count) {
            return;
        }
        const unsigned int* const t = tasks + (unsigned long long)task * NQ_TASK_WORDS;
        const unsigned int* const table = tables + (unsigned long long)t[0] * NQ_TABLE_WORDS;
        const unsigned int full = table[0];
        const unsigned int width = table[1];
        const unsigned int* const shift = table + 2;
        const unsigned int* const blocked = table + 2 + 32;
        unsigned int level = t[1];
        unsigned int rem = t[2];
        unsigned int used = t[3];
        unsigned int up = t[4];
        unsigned int down = t[5];
        // A task's count is at most 20! < 2^64 (the host keeps at most 20
        // free columns below a task), and its nodes at most e * 20!.
        unsigned long long count = 0;
        unsigned long long nodes = 0;
        if (width == 0) {
            // A complete prefix is its own single completion.
            count = 1;
        } else if (level + 1 == width) {
            // One column left: each candidate row is a completion.
            count = __popc(rem);
        } else if (level + 2 == width) {
            // Two columns left: the closed form, with the second column's
            // free rows as seen from the first.
            const unsigned int s = shift[level + 1];
            const unsigned int f2 =
                full & ~(used | (up << s) | (down >> s) | blocked[level + 1]);
            count = nq_pairs(rem, f2, s);
        } else {
            // Bit L set: stack level L holds an ancestor with candidates left.
            // Ancestors are pushed in increasing level order, so the highest
            // set bit is the top of the stack.
            unsigned int pending = 0;
            for (;;) {
                if (rem == 0) {
                    if (pending == 0) {
                        break;
                    }
                    level = 31 - __clz(pending);
                    pending ^= 1u << level;
                    const uint4 e = mine[level * NQ_BLOCK];
                    rem = e.x;
                    used = e.y;
                    up = e.z;
                    down = e.w;
                    continue;
                }
                // Place a queen on the lowest candidate row; x & -x isolates it.
                const unsigned int bit = rem & (0u - rem);
                rem ^= bit;
                nodes += 1;
                const unsigned int u = used | bit;
                const unsigned int s = shift[level + 1];
                const unsigned int a = (up | bit) << s;
                const unsigned int b = (down | bit) >> s;
                const unsigned int f = full & ~(u | a | b | blocked[level + 1]);
                if (level + 3 == width) {
                    // The child is the second-to-last column: count the last
                    // two in closed form instead of descending.
                    const unsigned int s2 = shift[level + 2];
                    const unsigned int f2 =
                        full & ~(u | (a << s2) | (b >> s2) | blocked[level + 2]);
                    count += nq_pairs(f, f2, s2);
                } else if (f != 0) {
                    // Descend. The parent is saved only if it has rows left to
                    // try; otherwise its child simply replaces it.
                    if (rem != 0) {
                        mine[level * NQ_BLOCK] = make_uint4(rem, used, up, down);
                        pending |= 1u << level;
                    }
                    level += 1;
                    rem = f;
                    used = u;
                    up = a;
                    down = b;
                }
            }
        }
        counts[task] = count;
        nodes_out[task] = nodes;
    }
}
