#!/usr/bin/env bash
# What one `/metrics` scrape costs with 1,000 workers registered and idle,
# for two builds in turn (before and after a change), paired: the cost of
# building the answer, without the waiting for a CPU that a saturated
# coordinator adds (for that, saturated-latency.sh).
#
#   bash tests/bench/metrics-cost.sh BIN_A BIN_B [SCRAPES] [OUT]
#
# BIN_A and BIN_B each hold release builds of nq-coord and nq-loadtest
# (`cargo build --release -p nq-coord -p nq-e2e --bin nq-loadtest`). Runs
# A B B A, each a coordinator of its own: `nq-loadtest --n 16 --split 0:3`
# with 1,000 workers that register, lease and then "compute" for 300 s
# (`--think 300s`), so the coordinator is idle with 1,000 workers in its
# snapshot; then 10 scrapes to warm up and SCRAPES (150) timed ones, one
# after the other (curl's time to the whole answer). Prints each run's
# median and p90 and each build's median over its runs, and keeps the last
# body of each build in OUT (default a temporary directory) to compare.
set -euo pipefail
cd "$(dirname "$0")/../.."
usage="usage: metrics-cost.sh BIN_A BIN_B [SCRAPES] [OUT]"
a=${1:?$usage}
b=${2:?$usage}
scrapes=${3:-150}
out=${4:-$(mktemp -d)}
mkdir -p "$out"
for d in "$a" "$b"; do
  for tool in nq-coord nq-loadtest; do
    [ -x "$d/$tool" ] || { echo "metrics-cost: $d/$tool missing" >&2; exit 2; }
  done
done

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

one() { # one LABEL BIN RUN
  local label=$1 dir=$2 run=$3 port data log lt
  port=$(free_port)
  data=$(mktemp -d)
  log=$out/$label.$run.err
  CARGO=/bin/true "$dir/nq-loadtest" --n 16 --split 0:3 --jobs 100000 \
    --workers 1000 --want 8 --think 300s --duration 120s --data "$data/run" \
    -- --metrics "127.0.0.1:$port" >"$out/$label.$run.json" 2>"$log" &
  lt=$!
  until grep -q 'workers registered' "$log" 2>/dev/null; do
    kill -0 "$lt" 2>/dev/null || { echo "metrics-cost: load test failed: $log" >&2; exit 1; }
    sleep 0.5
  done
  local url=http://127.0.0.1:$port/metrics
  for _ in $(seq 10); do curl -sf -o /dev/null "$url"; done
  for _ in $(seq "$scrapes"); do
    echo -e "$label\t$run\t$(curl -sf -o /dev/null -w '%{time_total}\t%{size_download}' "$url")"
  done >>"$out/samples.tsv"
  curl -sf "$url" >"$out/body.$label.txt"
  # The load test stops its coordinator when it ends; it is ended early.
  kill "$lt" 2>/dev/null || true
  wait "$lt" 2>/dev/null || true
  pkill -f -- "--metrics 127.0.0.1:$port" 2>/dev/null || true
  rm -rf "$data"
}

: >"$out/samples.tsv"
one A "$a" 1; one B "$b" 1; one B "$b" 2; one A "$a" 2

python3 - "$out/samples.tsv" "$a" "$b" <<'PY'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
for label, path in (("A", sys.argv[2]), ("B", sys.argv[3])):
    print(f"{label} ({path}):")
    for run in ("1", "2"):
        v = sorted(float(r[2]) * 1000 for r in rows if r[0] == label and r[1] == run)
        size = next(r[3] for r in rows if r[0] == label and r[1] == run)
        print(f"  run {run}: n={len(v)} median={v[len(v) // 2]:.2f} ms "
              f"p90={v[int(len(v) * 0.9)]:.2f} ms bytes={size}")
    v = sorted(float(r[2]) * 1000 for r in rows if r[0] == label)
    print(f"  median of both runs: {v[len(v) // 2]:.2f} ms")
PY
echo "metrics-cost: samples and the last body of each build in $out"
