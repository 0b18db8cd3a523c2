// Host C++ stand-ins for the CUDA features count.cu uses, so that the tests
// compile the kernel's own text with g++ (under UBSan) and run it on OS
// threads. Each OS thread plays one GPU thread: `threadIdx`/`blockIdx` are
// thread-local and set by the caller, and `__shared__` becomes
// `static thread_local`, which gives every OS thread its own block's stack
// (only its own column of it is ever touched, as on the GPU).
#pragma once

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(threads)
#define __shared__ static thread_local

struct uint4 {
    unsigned int x, y, z, w;
};

static inline uint4 make_uint4(unsigned int x, unsigned int y, unsigned int z, unsigned int w)
{
    return uint4{x, y, z, w};
}

struct uint2 {
    unsigned int x, y;
};

static inline uint2 make_uint2(unsigned int x, unsigned int y) { return uint2{x, y}; }

struct nq_dim3 {
    unsigned int x, y, z;
};

extern thread_local nq_dim3 threadIdx;
extern thread_local nq_dim3 blockIdx;

static inline int __popc(unsigned int x) { return __builtin_popcount(x); }

// The GPU's atomicAdd returns the old value, as this does; relaxed is enough
// because each task index is handed out once and the results are read only
// after the threads are joined.
static inline unsigned int atomicAdd(unsigned int* p, unsigned int v)
{
    return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}

// The counters build (NQ_COUNTERS) only: 64-bit atomics, and the SM's cycle
// counter, for which any monotonic count will do on the host.
static inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v)
{
    return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}

static inline unsigned long long atomicMax(unsigned long long* p, unsigned long long v)
{
    unsigned long long old = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (old < v &&
           !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return old;
}

static inline long long clock64(void)
{
    static long long ticks;
    return __atomic_add_fetch(&ticks, 1, __ATOMIC_RELAXED);
}

// The GPU's funnel shifts (PTX shf.l.wrap / shf.r.wrap): the 64-bit hi:lo
// shifted by the low 5 bits of `shift`, its high (left) or low (right) word.
static inline unsigned int __funnelshift_l(unsigned int lo, unsigned int hi, unsigned int shift)
{
    const unsigned int s = shift & 31u;
    return s == 0 ? hi : (hi << s) | (lo >> (32u - s));
}

static inline unsigned int __funnelshift_r(unsigned int lo, unsigned int hi, unsigned int shift)
{
    const unsigned int s = shift & 31u;
    return s == 0 ? lo : (lo >> s) | (hi << (32u - s));
}
