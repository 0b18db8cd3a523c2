#!/usr/bin/env bash
# The GPU device benchmark of issue 24 (item 5): one prepared script for a
# machine with an NVIDIA GPU, at most 8 minutes. Writes one JSON document to
# $OUT/gpu-device.json (stdout when OUT is unset); progress goes to stderr.
#
#   bash tests/bench/gpu-device.sh
#
# Steps, each under its own time limit (a step that runs out is recorded as
# "timeout", and later steps are skipped once the budget is spent):
#   1. the card: name, driver, compute capability, SM clock;
#   2. the start-up self-test (every sub-problem of N = 12 against the CPU):
#      the bench example at N = 12;
#   3. the kernel alone at N = 20: one launch of the whole border split,
#      total checked against Q(20);
#   4. Nsight Compute on one N = 20 launch (every 8th sub-problem, so that
#      its replays stay short) when `ncu` is installed: lanes active per
#      issued instruction, warp instructions, achieved occupancy, SM active
#      over elapsed cycles; without ncu, the counters build of the kernel on
#      the whole N = 20 (lanes active per loop iteration, tail efficiency);
#   5. ygch/n_queens (arXiv 2511.12009) on the same card: its public source,
#      brought into tests/bench/ygch/src/ (git-ignored, NEVER committed:
#      fetch github:ygch/n_queens and copy its src/ folder there before the
#      run, and carry the folder with the working tree), built
#      here with nvcc for this card and timed at N = 20 and 21 with 6 rows
#      pre-placed (its README's configuration 2);
#   6. nq end to end at N = 20, 21 and 22: nq-coord --local-threads 0 and one
#      nq-worker --gpu on this machine, the coordinator's `seconds` and its
#      check against the published totals, and from the worker's log the
#      jobs and wall time per launch (its lease aims at about 2 s a launch)
#      and the kernels' total time.
#
# Binaries: target/release/{nq-coord,nq-worker} and
# target/release/examples/bench, built before the run (carry them with the
# working tree) by
#   cargo build --release -p nq-coord -p nq-worker && cargo build --release -p nq-gpu --example bench
# or built here when missing (a few minutes of the budget).
set -euo pipefail
cd "$(dirname "$0")/../.."

BUDGET=${BUDGET:-470}   # seconds: 8 minutes less a margin for the JSON
BIN=${NQ_BIN:-target/release}
YGCH=${YGCH:-tests/bench/ygch}
work=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do
        kill "$p" 2>/dev/null || true
    done
    rm -rf "$work"
}
trap cleanup EXIT

say() { echo "== gpu-device ($SECONDS s): $*" >&2; }

# A JSON string.
jstr() {
    local s=${1//\\/\\\\}
    s=${s//\"/\\\"}
    s=${s//$'\n'/ }
    printf '"%s"' "$s"
}

# A number, or null when empty or not numeric.
jnum() {
    if [[ ${1:-} =~ ^-?[0-9]+([.][0-9]+)?([eE][-+]?[0-9]+)?$ ]]; then
        printf '%s' "$1"
    else
        printf 'null'
    fi
}

# Seconds left, at least 1.
left() {
    local l=$((BUDGET - SECONDS))
    echo $((l > 1 ? l : 1))
}

# Runs "$@" under a limit of min($1, seconds left); the output goes to
# $work/out and $work/err. Prints ok, timeout or failed.
step() {
    local limit=$1
    shift
    local l
    l=$(left)
    ((limit < l)) || limit=$l
    if timeout --kill-after=5 "$limit" "$@" >"$work/out" 2>"$work/err"; then
        echo ok
    else
        local rc=$?
        if ((rc == 124 || rc == 137)); then echo timeout; else echo failed; fi
    fi
}

# The last line of $work/out if it is a JSON object, else null.
json_out() {
    local line
    line=$(grep '^{' "$work/out" | tail -n 1 || true)
    if [ -n "$line" ]; then printf '%s' "$line"; else printf 'null'; fi
}

# ---------------------------------------------------------------- 1. card
say "the card"
card=null
if command -v nvidia-smi >/dev/null; then
    IFS=',' read -r name driver cap clock < <(nvidia-smi \
        --query-gpu=name,driver_version,compute_cap,clocks.max.sm \
        --format=csv,noheader,nounits | head -n 1)
    card=$(printf '{"name":%s,"driver":%s,"compute_capability":%s,"max_sm_mhz":%s}' \
        "$(jstr "${name# }")" "$(jstr "${driver# }")" "$(jstr "${cap# }")" "$(jnum "${clock# }")")
else
    say "no nvidia-smi: is this a GPU machine?"
fi
arch=$(tr -d ' .' <<<"${cap:-90}")

# ---------------------------------------------------------------- binaries
if [ ! -x "$BIN/nq-coord" ] || [ ! -x "$BIN/nq-worker" ] || [ ! -x "$BIN/examples/bench" ]; then
    say "building the release binaries (none were carried)"
    build=$(step 240 bash -c 'cargo build -q --release -p nq-coord -p nq-worker && cargo build -q --release -p nq-gpu --example bench')
    [ "$build" = ok ] || { cat "$work/err" >&2; say "build $build"; }
fi
bench="$BIN/examples/bench"

# ---------------------------------------------------------------- 2. self-test
say "start-up self-test (N = 12 against the CPU)"
selftest_status=$(step 60 "$bench" --n 12)
selftest=$(json_out)
[ "$selftest_status" = ok ] || sed 's/^/   /' "$work/err" >&2

# ---------------------------------------------------------------- 3. kernel alone
say "the kernel alone at N = 20"
kernel20_status=$(step 90 "$bench" --n 20)
kernel20=$(json_out)
[ "$kernel20_status" = ok ] || sed 's/^/   /' "$work/err" >&2

# ---------------------------------------------------------------- 4. ncu or counters
profile=null
profile_status=skipped
if command -v ncu >/dev/null && timeout 20 ncu --version >/dev/null 2>&1; then
    say "Nsight Compute on one N = 20 launch (every 8th sub-problem)"
    metrics=smsp__thread_inst_executed_per_inst_executed.ratio,smsp__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active,sm__cycles_active.avg,sm__cycles_elapsed.max,smsp__issue_active.avg.pct_of_peak_sustained_active
    # The first nq_count launch is the self-test's: skip it.
    profile_status=$(step 150 ncu --csv --page raw --launch-skip 1 --launch-count 1 \
        -k regex:nq_count --metrics "$metrics" "$bench" --n 20 --every 8)
    bench_line=$(json_out)
    # ncu's raw CSV: a header line of metric names, a units line, a values line.
    vals=$(grep '^"' "$work/out" | tail -n 1 || true)
    hdr=$(grep '^"' "$work/out" | head -n 1 || true)
    fields=""
    if [ -n "$vals" ] && [ -n "$hdr" ]; then
        IFS=',' read -r -a H <<<"${hdr//\"/}"
        IFS=',' read -r -a V <<<"${vals//\"/}"
        for i in "${!H[@]}"; do
            case "${H[$i]}" in
            smsp__* | sm__*) fields+=$(printf '%s:%s,' "$(jstr "${H[$i]}")" "$(jnum "${V[$i]:-}")") ;;
            esac
        done
    fi
    profile=$(printf '{"tool":"ncu","slice":"every 8th sub-problem of N = 20","metrics":{%s},"bench":%s}' \
        "${fields%,}" "$bench_line")
else
    say "no Nsight Compute: the counters build of the kernel at N = 20"
    profile_status=$(step 90 "$bench" --n 20 --counters)
    profile=$(printf '{"tool":"counters build","bench":%s}' "$(json_out)")
fi

# ---------------------------------------------------------------- 5. ygch
ygch=null
ygch_status=skipped
if [ -f "$YGCH/src/n_queens_cuda.cu" ] && command -v nvcc >/dev/null; then
    say "ygch/n_queens: nvcc for compute_$arch, then N = 20 and 21 (6 rows)"
    cp -r "$YGCH/src" "$work/ygch"
    ygch_status=$(step 120 bash -c "cd '$work/ygch' && nvcc -gencode arch=compute_$arch,code=sm_$arch -O3 \
        -Xcompiler -fopenmp -D_USE_CONFIG2_ n_queens_cuda.cu n_queens.cpp utils.cpp main.cpp -o n_queens")
    runs=""
    if [ "$ygch_status" = ok ]; then
        for n in 20 21; do
            st=$(step 90 "$work/ygch/n_queens" "$n" 6)
            line=$(grep -o 'cuda [0-9]* queens result [0-9]*, calc time: \[[0-9.]*ms\]' "$work/out" | tail -n 1 || true)
            result=$(sed -n 's/.*result \([0-9]*\),.*/\1/p' <<<"$line")
            ms=$(sed -n 's/.*\[\([0-9.]*\)ms\].*/\1/p' <<<"$line")
            runs+=$(printf '{"n":%s,"status":%s,"result":%s,"seconds":%s},' \
                "$n" "$(jstr "$st")" "$(jstr "$result")" "$(jnum "$(awk -v m="${ms:-x}" 'BEGIN{if (m ~ /^[0-9.]+$/) print m/1000}')")")
        done
    else
        sed 's/^/   /' "$work/err" | tail -n 20 >&2
    fi
    ygch=$(printf '{"source":"github:ygch/n_queens (never committed)","config":"-D_USE_CONFIG2_, 6 rows","runs":[%s]}' "${runs%,}")
else
    say "ygch/n_queens skipped: no $YGCH/src/n_queens_cuda.cu or no nvcc"
fi

# ---------------------------------------------------------------- 6. end to end
e2e=""
for n in 20 21 22; do
    limit=$((n == 22 ? 170 : 90))
    if (($(left) < 20)); then
        e2e+=$(printf '{"n":%s,"status":"skipped: budget spent"},' "$n")
        continue
    fi
    say "end to end at N = $n (limit $limit s)"
    : >"$work/coord.out"
    "$BIN/nq-coord" --data "$work/d$n" --n "$n" --local-threads 0 --verify 0 \
        --listen 127.0.0.1:0 --linger 1s >"$work/coord.out" 2>"$work/coord.err" &
    coord=$!
    pids+=("$coord")
    addr=""
    for _ in $(seq 100); do
        addr=$(sed -n 's/^listening on //p' "$work/coord.out")
        [ -n "$addr" ] && break
        sleep 0.1
    done
    st=failed
    : >"$work/worker$n.err"
    if [ -n "$addr" ]; then
        # Every core (the default): the worker's claim, four jobs a thread,
        # bounds what the coordinator lets it hold, and a GPU counts many
        # jobs at once; --threads 2 held it to 16.
        st=$(step "$limit" "$BIN/nq-worker" --connect "$addr" --gpu --name gpu)
        cp "$work/err" "$work/worker$n.err"
        # A finished run's coordinator leaves within its linger (1 s).
        for _ in $(seq 50); do
            kill -0 "$coord" 2>/dev/null || break
            sleep 0.1
        done
    fi
    kill "$coord" 2>/dev/null || true
    wait "$coord" 2>/dev/null || true
    final=$(grep 'status=' "$work/coord.out" | tail -n 1 || true)
    get() { sed -n "s/.*\b$1=\([^ ]*\).*/\1/p" <<<"$final"; }
    launches=$(grep -c 'GPU launch counted' "$work/worker$n.err" 2>/dev/null || true)
    # How the worker's measured leasing shaped its launches: jobs and wall
    # time per launch (the lease aims at about 2 s a launch), and the
    # kernels' time over the run's.
    field() { { grep 'GPU launch counted' "$work/worker$n.err" 2>/dev/null || true; } | { grep -o "\b$1=[0-9.]*" || true; } | cut -d= -f2; }
    median() { sort -g | awk '{v[NR]=$1} END {if (NR) print v[int((NR+1)/2)]}'; }
    jobs_median=$(field jobs | median)
    wall_median=$(field wall_ms | median)
    kernel_total=$(field kernel_ms | awk '{s+=$1} END {if (NR) printf "%.1f", s}')
    why=""
    [ "$st" = ok ] || why=$(tail -n 1 "$work/worker$n.err" 2>/dev/null || true)
    e2e+=$(printf '{"n":%s,"status":%s,"error":%s,"coordinator":%s,"total":%s,"published":%s,"seconds":%s,"gpu_launches":%s,"jobs_per_launch_median":%s,"launch_wall_ms_median":%s,"kernel_ms_total":%s},' \
        "$n" "$(jstr "$st")" "$(jstr "$why")" "$(jstr "$(get status)")" "$(jstr "$(get total)")" \
        "$(jstr "$(get published)")" "$(jnum "$(get seconds)")" "$(jnum "$launches")" \
        "$(jnum "$jobs_median")" "$(jnum "$wall_median")" "$(jnum "$kernel_total")")
done

# ---------------------------------------------------------------- JSON
doc=$(printf '{"script":"tests/bench/gpu-device.sh","commit":%s,"elapsed_s":%s,"card":%s,"self_test":{"status":%s,"bench":%s},"kernel_n20":{"status":%s,"bench":%s},"profile":{"status":%s,"result":%s},"ygch":{"status":%s,"result":%s},"end_to_end":[%s]}' \
    "$(jstr "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)")" "$SECONDS" "$card" \
    "$(jstr "$selftest_status")" "$selftest" "$(jstr "$kernel20_status")" "$kernel20" \
    "$(jstr "$profile_status")" "$profile" "$(jstr "$ygch_status")" "$ygch" "${e2e%,}")
if [ -n "${OUT:-}" ]; then
    printf '%s\n' "$doc" >"$OUT/gpu-device.json"
    say "wrote $OUT/gpu-device.json"
else
    printf '%s\n' "$doc"
fi
