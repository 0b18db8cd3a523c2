// The loop of nq_count (count.cu) run lock-step over warps of 32 lanes on the
// host, for the lane-utilisation test (host.rs). Included into each copy of
// the kernel in host.cpp, after count.cu, so it calls that copy's own
// nq_start, nq_due, nq_refill and nq_lap: the same code the GPU runs, in the
// same order per lane. Host-only: NVRTC never sees this file.
// (host.cpp includes <vector> before any copy of the kernel.)

// Runs `warps` warps of 32 lanes sharing one task counter. Each round gives
// every warp that still has a live lane one step, in warp order: every live
// lane whose task is done (nq_due) runs nq_refill, leaving when no task is
// left, and then every live lane runs one nq_lap. As on the GPU (no lane
// waits for another), a lane's lap depends only on its own state, so this
// order gives the counts of any other order; what it adds is which lanes of
// a warp are busy in each step. With a spill queue (`spill`, NULL: none),
// lanes give back their stacks in the tail as on the GPU.
static inline void nq_simt(unsigned int n, unsigned int warps, const unsigned int* tables,
                    const unsigned int* tasks, unsigned int task_count,
                    unsigned long long* counts, unsigned long long* nodes,
                    unsigned int* spill, nq_host_simt_stats* st)
{
    const unsigned int last = n - 1;
    unsigned int next = 0;
    // Each warp is threads 0..31 of a block of its own.
    std::vector<uint4> stack(std::size_t(warps) * NQ_DEPTH * NQ_BLOCK);
    std::vector<uint2> words(std::size_t(warps) * (NQ_N + 1) * NQ_BLOCK);
    std::vector<nq_lane> lanes(std::size_t(warps) * 32);
    std::vector<unsigned char> live(std::size_t(warps) * 32, 1);
    std::vector<unsigned int> live_in_warp(warps, 32);
    for (nq_lane& s : lanes) {
        nq_start(s);
    }
    unsigned int live_warps = warps;
    while (live_warps != 0) {
        for (unsigned int w = 0; w < warps; ++w) {
            if (live_in_warp[w] == 0) {
                continue;
            }
            const bool steady = next < task_count;
            unsigned int refilled = 0;
            unsigned int flushed = 0;
            unsigned int copied = 0;
            unsigned int copy_entries = 0;
            unsigned int copy_most = 0;
            unsigned int active = 0;
            for (unsigned int lane = 0; lane < 32; ++lane) {
                const std::size_t i = std::size_t(w) * 32 + lane;
                if (!live[i]) {
                    continue;
                }
                nq_lane& s = lanes[i];
                uint4* const stk = &stack[std::size_t(w) * NQ_DEPTH * NQ_BLOCK + lane];
                uint2* const tab = &words[std::size_t(w) * (NQ_N + 1) * NQ_BLOCK + lane];
                if (nq_due(s)) {
                    // A lane with a task flushes its accumulator only: the
                    // short path of the refill.
                    const bool flush = s.top != NQ_EMPTY;
                    refilled += flush ? 0 : 1;
                    flushed += flush ? 1 : 0;
                    const unsigned int table = s.table;
                    const unsigned int from = s.from;
                    const bool more = nq_refill(s, stk, tab, tables, tasks, task_count, &next,
                                                last, counts, nodes, spill);
                    if ((s.table != table || s.from != from) && s.table != NQ_NONE) {
                        // The entries from s.from to N, in the copy loop
                        // that the warp runs as long as its longest copy.
                        const unsigned int entries = last + 2u - s.from;
                        copied += 1;
                        copy_entries += entries;
                        copy_most = entries > copy_most ? entries : copy_most;
                    }
                    if (!more) {
                        live[i] = 0;
                        live_in_warp[w] -= 1;
                        live_warps -= live_in_warp[w] == 0 ? 1 : 0;
                        continue;
                    }
                }
                nq_lap(s);
                active += 1;
            }
            if (steady) {
                st->flush_steps += flushed != 0 && refilled == 0 ? 1 : 0;
                st->flush_lanes += refilled == 0 ? flushed : 0;
                st->refill_steps += refilled != 0 ? 1 : 0;
                st->refill_lanes += refilled;
                st->copy_steps += copied != 0 ? 1 : 0;
                st->copy_lanes += copied;
                st->copy_entries += copy_entries;
                st->copy_step_entries += copy_most;
            }
            if (active != 0) {
                st->steps += 1;
                st->lane_laps += active;
                if (steady) {
                    st->steady_steps += 1;
                    st->steady_lane_laps += active;
                }
            }
        }
    }
}
