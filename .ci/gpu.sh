#!/usr/bin/env bash
# The GPU kernel through the real CUDA compilers, on a machine with no GPU.
#
# Installs NVRTC and ptxas from PyPI into a fresh virtual environment, then:
#   1. compiles crates/nq-gpu/kernel/count.cu through the worker's own NVRTC
#      path (the `nvrtc` example calls nq_gpu::compile_ptx) for compute_80,
#      compute_90 and compute_120, at N = 28 and N = 32;
#   2. assembles the compute_90 PTX with `ptxas -v` for sm_90 and FAILS on any
#      spill, any stack frame (local memory) or `.local` in the PTX, printing
#      the registers and shared memory (recorded in BENCHMARKS.md);
#   3. disassembles the sm_90 cubin of N = 21 and N = 28 with nvdisasm and
#      checks the kernel's lap (.ci/sass-lap.py): prints its instructions by
#      class and FAILS when it has more than LAP_BUDGET instructions, or a
#      convergence barrier or branch inside it other than the refill guard;
#   4. runs the lane-utilisation emulation (nq-gpu's host build of the
#      kernel lock-step over warps of 32 lanes) and prints its figures; it
#      FAILS below 28 of 32 lanes active or above 1.10 laps per node;
#   5. rebuilds the PTX embedded in nq-gpu and FAILS if it differs from the
#      committed crates/nq-gpu/kernel/count.ptx.
#
#   bash .ci/gpu.sh                    # the CI check
#   bash .ci/gpu.sh --write-embedded   # regenerate kernel/count.ptx after a kernel edit
#
# The wheels are pinned: the embedded PTX must be byte-for-byte what this
# NVRTC emits. nvdisasm has no CUDA 12 wheel; the pinned 13.5 one reads the
# cubins of ptxas 12.9.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS

NVRTC_WHEEL="nvidia-cuda-nvrtc-cu12==12.9.86"
NVCC_WHEEL="nvidia-cuda-nvcc-cu12==12.9.86"
NVDISASM_WHEEL="nvidia-cuda-nvdisasm==13.5.37"
# SASS instructions per lap at most (measured 29 at N = 21 and 28 on sm_90
# with the wheels above, BENCHMARKS.md section 24; it was 36 before, and
# GPU.md's hand-tuned estimate was 39).
LAP_BUDGET=29

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "== gpu: installing $NVRTC_WHEEL, $NVCC_WHEEL and $NVDISASM_WHEEL into a virtual environment"
if ! python3 -m venv "$work/venv" 2>/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq python3-venv >/dev/null
    python3 -m venv "$work/venv"
fi
"$work/venv/bin/pip" install -q --disable-pip-version-check --no-cache-dir \
    "$NVRTC_WHEEL" "$NVCC_WHEEL" "$NVDISASM_WHEEL"
site=$("$work/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
nvrtc_lib="$site/nvidia/cuda_nvrtc/lib"
ptxas="$site/nvidia/cuda_nvcc/bin/ptxas"
test -e "$nvrtc_lib/libnvrtc.so.12" || { echo "no libnvrtc.so.12 in $nvrtc_lib" >&2; exit 1; }
nvdisasm="$site/nvidia/cu13/bin/nvdisasm"
test -x "$ptxas" || { echo "no ptxas at $ptxas" >&2; exit 1; }
test -x "$nvdisasm" || { echo "no nvdisasm at $nvdisasm" >&2; exit 1; }
echo "   installed in $((SECONDS - start)) s"

cargo build -q --locked -p nq-gpu --example nvrtc
nvrtc() {
    # cudarc finds NVRTC only by name, through the loader's search path.
    LD_LIBRARY_PATH="$nvrtc_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
        target/debug/examples/nvrtc "$@"
}

if [ "${1:-}" = "--write-embedded" ]; then
    nvrtc --write-embedded
    exit 0
fi

echo "== gpu: NVRTC (the worker's compile path) for compute_80, compute_90, compute_120"
for n in 21 28 32; do
    for arch in compute_80 compute_90 compute_120; do
        nvrtc --n "$n" --arch "$arch" --out "$work/n$n-$arch.ptx" >/dev/null
        if grep -q '\.local' "$work/n$n-$arch.ptx"; then
            echo "N=$n $arch: the PTX uses local memory (.local)" >&2
            exit 1
        fi
        echo "   N=$n $arch: $(grep -m1 '^\.version' "$work/n$n-$arch.ptx"), $(wc -c <"$work/n$n-$arch.ptx") bytes"
    done
done

echo "== gpu: ptxas -v for sm_90 (fails on spills or local memory)"
for n in 21 28 32; do
    report=$("$ptxas" -arch=sm_90 -v "$work/n$n-compute_90.ptx" -o "$work/n$n.cubin" 2>&1)
    frame=$(grep -o '[0-9]* bytes stack frame' <<<"$report" | grep -o '^[0-9]*')
    stores=$(grep -o '[0-9]* bytes spill stores' <<<"$report" | grep -o '^[0-9]*')
    loads=$(grep -o '[0-9]* bytes spill loads' <<<"$report" | grep -o '^[0-9]*')
    regs=$(grep -o 'Used [0-9]* registers' <<<"$report" | grep -o '[0-9]*')
    smem=$(grep -o '[0-9]* bytes smem' <<<"$report" | grep -o '^[0-9]*')
    echo "   N=$n sm_90: $regs registers, $smem bytes shared memory, stack frame $frame, spills $stores/$loads bytes"
    if [ -z "$regs" ] || [ "$frame" != 0 ] || [ "$stores" != 0 ] || [ "$loads" != 0 ]; then
        echo "$report" >&2
        echo "N=$n sm_90: spills or local memory (or no ptxas report)" >&2
        exit 1
    fi
done

echo "== gpu: SASS budget of the lap, sm_90 (fails past $LAP_BUDGET instructions or on a barrier inside it)"
python3 .ci/sass-lap.py --self-test
for n in 21 28; do
    "$nvdisasm" -c "$work/n$n.cubin" 2>/dev/null >"$work/n$n.sass"
    python3 .ci/sass-lap.py --budget "$LAP_BUDGET" --label "N=$n sm_90: " "$work/n$n.sass"
done

echo "== gpu: lane-utilisation emulation of the kernel, lock-step over warps of 32 lanes (fails below its floors)"
# cargo test keeps a passing test's output to itself: --nocapture prints the
# figures (the same test also runs in the workspace's tests).
cargo test -q --locked -p nq-gpu --lib lane_utilisation_emulation -- --nocapture 2>&1 |
    grep -E '^lane emulation|test result' | sed 's/^/   /'
test "${PIPESTATUS[0]}" = 0

echo "== gpu: the embedded PTX is NVRTC's output for the current kernel source"
nvrtc --check-embedded
echo "== gpu: done in $((SECONDS - start)) s"
