// The kernel compiled for the host, once per largest board size, for the
// tests (crates/nq-gpu/src/host.rs): run thread by thread (nq_host_count), as
// the GPU runs it, and lock-step over warps of 32 lanes (nq_host_simt), to
// measure how many lanes of a warp are busy. Built by build.rs with UBSan.
#include <cstddef>
#include <vector>

#include "shim.h"

thread_local nq_dim3 threadIdx;
thread_local nq_dim3 blockIdx;

// What the lock-step run saw (nq_host_simt). A *step* is one iteration of the
// kernel's loop for one warp: the refill guard (taken by the lanes whose task
// ended), then one lap of every lane that has a task.
struct nq_host_simt_stats {
    // Warp steps in which some lane placed a queen, and the lanes that did.
    unsigned long long steps, lane_laps;
    // The same, counted only while the task counter had tasks left (the
    // steady state, before the launch's tail).
    unsigned long long steady_steps, steady_lane_laps;
    // Steady steps in which at least one lane ran the refill branch for a new
    // task, and the lanes that ran it (the others wait).
    unsigned long long refill_steps, refill_lanes;
    // Steady steps in which lanes ran only its short path (a flush of the
    // accumulator), and those lanes.
    unsigned long long flush_steps, flush_lanes;
    // The same for the table copy inside the refill (a lane whose next task
    // needs entries its column does not hold), then the entries the lanes
    // copied, and the longest copy of each step summed over the steps.
    unsigned long long copy_steps, copy_lanes, copy_entries, copy_step_entries;
};

// One copy of the kernel per largest board size: NQ_N sizes the lane's table
// copy, as it does under NVRTC (the board itself is a kernel argument).
#define NQ_EXTERN static
#define NQ_N 1
namespace nq1 {
#include "count.cu"
#include "simt.h"
}
#undef NQ_N
#define NQ_N 2
namespace nq2 {
#include "count.cu"
#include "simt.h"
}
#undef NQ_N
#define NQ_N 3
namespace nq3 {
#include "count.cu"
#include "simt.h"
}
#undef NQ_N
#define NQ_N 4
namespace nq4 {
#include "count.cu"
#include "simt.h"
}
#undef NQ_N
#define NQ_N 5
namespace nq5 {
#include "count.cu"
#include "simt.h"
}
#undef NQ_N
#define NQ_N 6
namespace nq6 {
#include "count.cu"
#include "simt.h"
}
#undef NQ_N
#define NQ_N 7
namespace nq7 {
#include "count.cu"
#include "simt.h"
}
#undef NQ_N
#define NQ_N 8
namespace nq8 {
#include "count.cu"
#include "simt.h"
}
#undef NQ_N
#define NQ_N 9
namespace nq9 {
#include "count.cu"
#include "simt.h"
}
#undef NQ_N
#define NQ_N 10
namespace nq10 {
#include "count.cu"
#include "simt.h"
}
#undef NQ_N
#define NQ_N 11
namespace nq11 {
#include "count.cu"
#include "simt.h"
}
#undef NQ_N
#define NQ_N 12
namespace nq12 {
#include "count.cu"
#include "simt.h"
}
#undef NQ_N
#define NQ_N 13
namespace nq13 {
#include "count.cu"
#include "simt.h"
}
#undef NQ_N
#define NQ_N 14
namespace nq14 {
#include "count.cu"
#include "simt.h"
}
#undef NQ_N
#define NQ_N 15
namespace nq15 {
#include "count.cu"
#include "simt.h"
}
#undef NQ_N
#define NQ_N 16
namespace nq16 {
#include "count.cu"
#include "simt.h"
}
#undef NQ_N
#define NQ_N 17
namespace nq17 {
#include "count.cu"
#include "simt.h"
}
#undef NQ_N
// The counters build (for GPU machines without Nsight Compute), so that its
// extra code is tested too.
#define NQ_N 32
#define NQ_COUNTERS
namespace nq32c {
#include "count.cu"
}
#undef NQ_COUNTERS
#undef NQ_N
// The build the embedded PTX uses: valid for every board size.
#define NQ_N 32
namespace nq32 {
#include "count.cu"
#include "simt.h"
}
#undef NQ_N

extern "C" {

// Runs the counters build (boards up to 32) like nq_host_count, adding into
// `counters` (4 words, then one per warp of the grid: `block` and `thread`
// place this OS thread in it).
int nq_host_count_counters(unsigned int n, unsigned int block, unsigned int thread,
                           const unsigned int* tables, const unsigned int* tasks,
                           unsigned int task_count, unsigned int* next_task,
                           unsigned long long* counts, unsigned long long* nodes,
                           unsigned long long* counters)
{
    if (thread >= NQ_BLOCK) {
        return -1;
    }
    threadIdx = nq_dim3{thread, 0, 0};
    blockIdx = nq_dim3{block, 0, 0};
    nq32c::nq_count(tables, tasks, task_count, next_task, n, counts, nodes, nullptr,
                    counters);
    return 0;
}

// The buffer layout as the kernel source defines it, for a test against
// pack.rs.
unsigned int nq_host_table_words(void) { return NQ_TABLE_WORDS; }
unsigned int nq_host_task_words(void) { return NQ_TASK_WORDS; }
unsigned int nq_host_block(void) { return NQ_BLOCK; }
unsigned int nq_host_depth(void) { return NQ_DEPTH; }
unsigned int nq_host_spill_head(void) { return NQ_SPILL_HEAD; }

// Runs the kernel built for boards up to `kernel_n` on a board of `n`, as GPU
// thread `thread` of block `block`, on this OS thread until the task counter
// runs out, spilling into `spill` (NULL: never) in the tail. Returns 0, or -1
// when no copy was compiled for `kernel_n` or `thread` is not a thread of a
// block.
int nq_host_count(unsigned int kernel_n, unsigned int n, unsigned int block,
                  unsigned int thread, const unsigned int* tables,
                  const unsigned int* tasks, unsigned int task_count,
                  unsigned int* next_task, unsigned long long* counts,
                  unsigned long long* nodes, unsigned int* spill)
{
    if (thread >= NQ_BLOCK) {
        return -1;
    }
    threadIdx = nq_dim3{thread, 0, 0};
    blockIdx = nq_dim3{block, 0, 0};
#define NQ_CASE(k)                                                                 \
    case k:                                                                        \
        nq##k::nq_count(tables, tasks, task_count, next_task, n, counts, nodes,    \
                        spill, nullptr);                                           \
        return 0;
    switch (kernel_n) {
        NQ_CASE(1)
        NQ_CASE(2)
        NQ_CASE(3)
        NQ_CASE(4)
        NQ_CASE(5)
        NQ_CASE(6)
        NQ_CASE(7)
        NQ_CASE(8)
        NQ_CASE(9)
        NQ_CASE(10)
        NQ_CASE(11)
        NQ_CASE(12)
        NQ_CASE(13)
        NQ_CASE(14)
        NQ_CASE(15)
        NQ_CASE(16)
        NQ_CASE(17)
        NQ_CASE(32)
    default:
        return -1;
    }
#undef NQ_CASE
}

// Runs the loop of nq_count lock-step: `warps` warps of 32 lanes share the
// task counter, and each round gives every warp with a live lane one step,
// in warp order. Each lane runs the kernel's own nq_refill and nq_lap on its
// own column of the warp's shared memory, exactly as on the GPU, so the
// counts come out as the threaded run's (what the lanes spilled into
// `spill`, if not NULL, aside). Returns 0, or -1 when no copy was compiled
// for `kernel_n` or `warps` is 0.
int nq_host_simt(unsigned int kernel_n, unsigned int n, unsigned int warps,
                 const unsigned int* tables, const unsigned int* tasks,
                 unsigned int task_count, unsigned long long* counts,
                 unsigned long long* nodes, unsigned int* spill,
                 struct nq_host_simt_stats* stats)
{
    if (warps == 0 || n == 0 || n > kernel_n) {
        return -1;
    }
    *stats = nq_host_simt_stats{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
#define NQ_CASE(k)                                                                 \
    case k:                                                                        \
        nq##k::nq_simt(n, warps, tables, tasks, task_count, counts, nodes, spill,  \
                       stats);                                                     \
        return 0;
    switch (kernel_n) {
        NQ_CASE(16)
        NQ_CASE(17)
        NQ_CASE(32)
    default:
        return -1;
    }
#undef NQ_CASE
}
}
