// The kernel compiled for the host, once per board size, for the tests
// (crates/nq-gpu/src/host.rs). Built by build.rs with UBSan.
#include "shim.h"

thread_local nq_dim3 threadIdx;
thread_local nq_dim3 blockIdx;

// One copy of the kernel per board size: NQ_N is a compile-time constant, as
// it is under NVRTC.
#define NQ_EXTERN static
#define NQ_N 1
namespace nq1 {
#include "count.cu"
}
#undef NQ_N
#define NQ_N 2
namespace nq2 {
#include "count.cu"
}
#undef NQ_N
#define NQ_N 3
namespace nq3 {
#include "count.cu"
}
#undef NQ_N
#define NQ_N 4
namespace nq4 {
#include "count.cu"
}
#undef NQ_N
#define NQ_N 5
namespace nq5 {
#include "count.cu"
}
#undef NQ_N
#define NQ_N 6
namespace nq6 {
#include "count.cu"
}
#undef NQ_N
#define NQ_N 7
namespace nq7 {
#include "count.cu"
}
#undef NQ_N
#define NQ_N 8
namespace nq8 {
#include "count.cu"
}
#undef NQ_N
#define NQ_N 9
namespace nq9 {
#include "count.cu"
}
#undef NQ_N
#define NQ_N 10
namespace nq10 {
#include "count.cu"
}
#undef NQ_N
#define NQ_N 11
namespace nq11 {
#include "count.cu"
}
#undef NQ_N
#define NQ_N 12
namespace nq12 {
#include "count.cu"
}
#undef NQ_N
#define NQ_N 13
namespace nq13 {
#include "count.cu"
}
#undef NQ_N
#define NQ_N 14
namespace nq14 {
#include "count.cu"
}
#undef NQ_N
#define NQ_N 15
namespace nq15 {
#include "count.cu"
}
#undef NQ_N
#define NQ_N 16
namespace nq16 {
#include "count.cu"
}
#undef NQ_N
// The build the embedded PTX uses: valid for every board size.
#define NQ_N 32
namespace nq32 {
#include "count.cu"
}
#undef NQ_N

extern "C" {

// The buffer layout as the kernel source defines it, for a test against
// pack.rs.
unsigned int nq_host_table_words(void) { return NQ_TABLE_WORDS; }
unsigned int nq_host_task_words(void) { return NQ_TASK_WORDS; }
unsigned int nq_host_block(void) { return NQ_BLOCK; }

// Runs the kernel of board size `n` as GPU thread `thread` of block `block`
// on this OS thread until the task counter runs out. Returns 0, or -1 when no
// copy was compiled for `n` or `thread` is not a thread of a block.
int nq_host_count(unsigned int n, unsigned int block, unsigned int thread,
                  const unsigned int* tables, const unsigned int* tasks,
                  unsigned int task_count, unsigned int* next_task,
                  unsigned long long* counts, unsigned long long* nodes)
{
    if (thread >= NQ_BLOCK) {
        return -1;
    }
    threadIdx = nq_dim3{thread, 0, 0};
    blockIdx = nq_dim3{block, 0, 0};
#define NQ_CASE(k)                                                                 \
    case k:                                                                        \
        nq##k::nq_count(tables, tasks, task_count, next_task, counts, nodes);      \
        return 0;
    switch (n) {
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
        NQ_CASE(32)
    default:
        return -1;
    }
}
}
