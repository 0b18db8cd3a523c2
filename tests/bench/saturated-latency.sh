#!/usr/bin/env bash
# Issue 27 item 3, under load: `nq-coord status` (at the workers' port, and
# at the HTTP port: `status_http_ms`), `/metrics`, `/status.json` and the
# status page while 1,000 closed-loop workers keep the coordinator
# saturated, for two builds in turn (before and after a change), paired;
# or for one build (BIN_B `-`), or under a lighter load (NQ_SAT_THINK).
#
#   bash tests/bench/saturated-latency.sh BIN_A BIN_B [ROUNDS] [OUT]
#
# BIN_A and BIN_B each hold release builds of nq-coord and nq-loadtest
# (`cargo build --release -p nq-coord -p nq-e2e --bin nq-loadtest`). Each
# round runs A then B (then B then A in the next round, so that a drift of
# the machine's load falls on both): `nq-loadtest --n 18 --split 0:4`
# (1,191,876 jobs, every job its own; settings below) with 1,000 workers for
# 45 s, and from
# the workers' registration on, a probe of each of the four every 0.5 s.
# Prints each build's median, p90 and max per probe; the raw samples stay in
# OUT (default a temporary directory). Latencies include waiting for a CPU:
# on 2 cores the load test's workers and the coordinator share them.
#
# The plan and the load are settings, for the same probes at 10^8 jobs
# (the record run's plan: NQ_SAT_N=20 NQ_SAT_SPLIT=0:6 NQ_SAT_JOBS=116436889
# NQ_SAT_WANT=16; its creation takes about 4 minutes before each load):
#   NQ_SAT_N, NQ_SAT_SPLIT  board size and split (18, 0:4)
#   NQ_SAT_JOBS             jobs, every sub-problem its own (1191876)
#   NQ_SAT_WANT             jobs a worker asks for per lease (8)
#   NQ_SAT_DURATION         the load's length, from the workers'
#                           registration (45s)
#   NQ_SAT_TMP              where each run's store goes (TMPDIR or /tmp;
#                           about 15 GB at 10^8 jobs)
#   NQ_SAT_THINK            each worker's think time between a lease and
#                           its report (0: the closed loop, saturation;
#                           1,000 workers leasing 16 jobs with 10s settle
#                           about 1,600 jobs/s, 10x what a record run on
#                           50,000 cores needs)
set -euo pipefail
cd "$(dirname "$0")/../.."
usage="usage: saturated-latency.sh BIN_A BIN_B [ROUNDS] [OUT]"
a=${1:?$usage}
b=${2:?$usage}
rounds=${3:-2}
out=${4:-$(mktemp -d)}
n=${NQ_SAT_N:-18}
split=${NQ_SAT_SPLIT:-0:4}
jobs=${NQ_SAT_JOBS:-1191876}
want=${NQ_SAT_WANT:-8}
duration=${NQ_SAT_DURATION:-45s}
think=${NQ_SAT_THINK:-0s}
mkdir -p "$out"
builds=("$a")
[ "$b" = - ] || builds+=("$b")
for d in "${builds[@]}"; do
  for tool in nq-coord nq-loadtest; do
    [ -x "$d/$tool" ] || { echo "saturated-latency: $d/$tool missing" >&2; exit 2; }
  done
done
. tests/bench/latency-probes.sh

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

one() { # one LABEL BIN: a load test with probes beside it
  local label=$1 dir=$2 port log data
  bin=$dir # read by the probes
  port=$(free_port)
  log=$out/$label.$round.err
  data=$(mktemp -d -p "${NQ_SAT_TMP:-${TMPDIR:-/tmp}}")
  CARGO=/bin/true "$dir/nq-loadtest" --n "$n" --split "$split" --jobs "$jobs" \
    --workers 1000 --want "$want" --think "$think" --duration "$duration" \
    --data "$data/run" \
    -- --metrics "127.0.0.1:$port" >"$out/$label.$round.json" 2>"$log" &
  local lt=$!
  until grep -q 'workers registered' "$log" 2>/dev/null; do
    kill -0 "$lt" 2>/dev/null || { echo "saturated-latency: load test failed: $log" >&2; exit 1; }
    sleep 0.2
  done
  local addr web
  addr=$(sed -n 's/^coordinator on \([0-9.:]*\) ready.*/\1/p' "$log" | head -1)
  web=http://127.0.0.1:$port
  while kill -0 "$lt" 2>/dev/null && ! grep -q 'measuring up to here\|coordinator stopped' "$log"; do
    echo -e "$label\t$(status_ms "$addr")\t$(curl_ms "$web/metrics")\t$(
      curl_ms "$web/status.json")\t$(curl_ms "$web/")\t$(
      status_ms "127.0.0.1:$port")" >>"$out/samples.tsv"
    sleep 0.5
  done
  wait "$lt" || true
  rm -rf "$data"
}

echo -e "build\tstatus_ms\tmetrics_ms\tstatus_json_ms\tpage_ms\tstatus_http_ms" >"$out/samples.tsv"
for round in $(seq 1 "$rounds"); do
  if [ "$b" = - ]; then
    one A "$a"
  elif [ $((round % 2)) = 1 ]; then
    one A "$a"; one B "$b"
  else
    one B "$b"; one A "$a"
  fi
done

python3 - "$out/samples.tsv" "$a" "$b" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
for label, path in (("A", sys.argv[2]), ("B", sys.argv[3])):
    if path == "-":
        continue
    print(f"{label} ({path}):")
    for k in ("status_ms", "metrics_ms", "status_json_ms", "page_ms", "status_http_ms"):
        # A build without gRPC on its HTTP port fails every status_http_ms.
        v = sorted(int(r[k]) for r in rows if r["build"] == label and r[k] != "fail")
        failed = sum(1 for r in rows if r["build"] == label and r[k] == "fail")
        if not v:
            print(f"  {k}: no sample")
            continue
        pick = lambda q: v[min(len(v) - 1, int(len(v) * q))]
        print(f"  {k}: n={len(v)} median={pick(0.5)} p90={pick(0.9)} max={v[-1]} failed={failed}")
PY
echo "saturated-latency: samples in $out/samples.tsv"
