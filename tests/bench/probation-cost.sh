#!/usr/bin/env bash
# What probation costs on a small cluster: the README's cluster set-up
# (`nq-coord --n N --local-threads 0`, default `--verify auto`) with W worker
# processes of one thread each on loopback (W identities), run with two
# builds, interleaved so that both share the machine's state. Prints, per
# run, the wall time and the copies computed (jobs + confirmations +
# conflicts, from report.json), then the medians and their ratio.
#
#   bash tests/bench/probation-cost.sh BEFORE_BIN AFTER_BIN [N] [ROUNDS] [W]
#
# BEFORE_BIN and AFTER_BIN are directories holding release builds of
# nq-coord and nq-worker (defaults: N=18, 3 rounds, 4 workers).
set -euo pipefail
before=$1
after=$2
n=${3:-18}
rounds=${4:-3}
workers=${5:-4}
tmp=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    rm -rf "$tmp"
}
trap cleanup EXIT
lscpu | grep -m1 'Model name' || true
now() { date +%s.%N; }
# run BIN LABEL: one run; prints "seconds copies jobs confirmations conflicts status".
run() {
    local bin=$1 label=$2 dir="$tmp/$2" t0 addr coord
    rm -rf "$dir"
    mkdir -p "$dir"
    t0=$(now)
    "$bin/nq-coord" --n "$n" --data "$dir/data" --listen 127.0.0.1:0 --progress none \
        --local-threads 0 >"$dir/coord.out" 2>"$dir/coord.err" &
    coord=$!
    pids+=("$coord")
    for _ in $(seq 1 300); do
        addr=$(sed -n 's/^listening on //p' "$dir/coord.out")
        [[ -n $addr ]] && break
        sleep 0.05
    done
    [[ -n $addr ]] || { echo "$label: the coordinator did not listen" >&2; exit 1; }
    local ws=()
    for ((w = 1; w <= workers; w++)); do
        "$bin/nq-worker" --connect "$addr" --name "w$w" --threads 1 \
            >/dev/null 2>"$dir/w$w.err" &
        ws+=("$!")
        pids+=("$!")
    done
    local rc=0
    wait "$coord" || rc=$?
    for p in "${ws[@]}"; do wait "$p" || true; done
    local secs
    secs=$(echo "$(now) - $t0" | bc -l)
    grep -q "published=match" "$dir/coord.out" || {
        echo "$label: no published=match (exit $rc): $(tail -n 1 "$dir/coord.out")" >&2
        exit 1
    }
    python3 - "$dir/data/report.json" "$secs" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
copies = r["jobs"] + r["confirmations"] + r["conflicts"]
print(f'{float(sys.argv[2]):.3f} {copies} {r["jobs"]} {r["confirmations"]} {r["conflicts"]} {r["status"]}')
PY
}
declare -a tb ta cb ca
for ((i = 0; i < rounds; i++)); do
    read -r s c j conf confl st < <(run "$before" before)
    tb+=("$s"); cb+=("$c")
    printf 'round %d before: %s s, %s copies (%s jobs, %s confirmations, %s conflicts), %s\n' \
        "$((i + 1))" "$s" "$c" "$j" "$conf" "$confl" "$st"
    read -r s c j conf confl st < <(run "$after" after)
    ta+=("$s"); ca+=("$c")
    printf 'round %d after:  %s s, %s copies (%s jobs, %s confirmations, %s conflicts), %s\n' \
        "$((i + 1))" "$s" "$c" "$j" "$conf" "$confl" "$st"
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
mtb=$(median "${tb[@]}"); mta=$(median "${ta[@]}")
mcb=$(median "${cb[@]}"); mca=$(median "${ca[@]}")
printf 'N=%s, %s workers, medians: before %.3f s %s copies; after %.3f s %s copies; time %.3fx, copies %.3fx\n' \
    "$n" "$workers" "$mtb" "$mcb" "$mta" "$mca" "$(echo "$mta / $mtb" | bc -l)" \
    "$(echo "$mca / $mcb" | bc -l)"
