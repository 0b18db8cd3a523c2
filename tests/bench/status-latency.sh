#!/usr/bin/env bash
# Issue 27 item 3: `nq-coord status`, `/metrics`, `/status.json` and the
# status page over a large store, on a machine with no load test beside it.
#
#   bash tests/bench/status-latency.sh DATA OUT [BIN] [SECONDS]
#
# DATA is a finished run's directory that may be changed (the restored copy
# that `tests/bench/record-1e8.sh` leaves in OUT/restored, or a copy): its
# stored summary is removed (`scan-probe --forget-summary`), so that the
# coordinator resumes it as a run killed just before its end: it serves at
# once, checks every stored copy in the background (a restart's full scan,
# the heaviest thing a serving coordinator does), and finishes again. While
# it runs, every 2 s: the latency of `nq-coord status` (the whole command,
# process start included) and curl's time to the whole answer of
# `/metrics`, `/status.json` and `/`, and the coordinator's VmRSS/VmHWM.
# Writes OUT/latency.tsv, OUT/mem.tsv, OUT/coord.err and a summary,
# OUT/status-latency.json. BIN holds release builds of nq-coord and the
# nq-store example scan-probe (default target/release; build them with
# `cargo build --release -p nq-coord -p nq-store --example scan-probe`).
# SECONDS, if given, ends the measurement that long after the coordinator
# started (SIGTERM; it stops cleanly mid-check), for a store whose whole
# background check takes longer than the probes need.
set -euo pipefail
cd "$(dirname "$0")/../.."
usage="usage: status-latency.sh DATA OUT [BIN] [SECONDS]"
data=${1:?$usage}
out=${2:?$usage}
bin=${3:-target/release}
limit_ms=$((${4:-0} * 1000))
probe=$bin/scan-probe
[ -x "$probe" ] || probe=$bin/examples/scan-probe
for tool in "$bin/nq-coord" "$probe" curl python3; do
  command -v "$tool" >/dev/null || {
    echo "status-latency: $tool not found" >&2
    exit 2
  }
done
mkdir -p "$out"
"$probe" --data "$data" --forget-summary

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
grpc_port=$(free_port)
metrics_port=$(free_port)
t0=$(date +%s%N)
"$bin/nq-coord" --data "$data" --listen "127.0.0.1:$grpc_port" \
  --local-threads 0 --progress none --metrics "127.0.0.1:$metrics_port" \
  >"$out/coord.out" 2>"$out/coord.err" &
coord=$!
trap 'kill "$coord" 2>/dev/null || true' EXIT

. tests/bench/latency-probes.sh
echo -e "ms\tstatus_ms\tmetrics_ms\tstatus_json_ms\tpage_ms" >"$out/latency.tsv"
echo -e "ms\trss_kib\thwm_kib" >"$out/mem.tsv"
stopped=0
while kill -0 "$coord" 2>/dev/null; do
  at=$((($(date +%s%N) - t0) / 1000000))
  mem=$(awk '/^VmRSS:/ {r = $2} /^VmHWM:/ {h = $2} END {if (r) print r "\t" h}' \
    "/proc/$coord/status" 2>/dev/null || true)
  [ -n "$mem" ] && echo -e "$at\t$mem" >>"$out/mem.tsv"
  if grep -q 'serving workers' "$out/coord.err"; then
    web=http://127.0.0.1:$metrics_port
    echo -e "$at\t$(status_ms "127.0.0.1:$grpc_port")\t$(curl_ms "$web/metrics")\t$(
      curl_ms "$web/status.json")\t$(curl_ms "$web/")" >>"$out/latency.tsv"
  fi
  if ((limit_ms > 0 && at >= limit_ms)); then
    kill -TERM "$coord"
    stopped=1
    break
  fi
  sleep 2
done
# Stopped by SIGTERM, it exits 3 (interrupted, resumable): not a failure.
wait "$coord" || ((stopped)) || echo "status-latency: the coordinator exited with $?" >&2
trap - EXIT
t1=$(date +%s%N)

python3 - "$out" "$(((t1 - t0) / 1000000))" <<'EOF'
import csv, json, statistics, sys
out, wall_ms = sys.argv[1], int(sys.argv[2])
rows = list(csv.DictReader(open(f"{out}/latency.tsv"), delimiter="\t"))
summary = {"probes": len(rows), "coordinator_seconds": wall_ms / 1000}
for key in ("status_ms", "metrics_ms", "status_json_ms", "page_ms"):
    ok = sorted(int(r[key]) for r in rows if r[key] != "fail")
    summary[key] = {
        "count": len(ok),
        "failed": sum(1 for r in rows if r[key] == "fail"),
        "median": statistics.median(ok) if ok else None,
        "p90": ok[int(0.9 * (len(ok) - 1))] if ok else None,
        "max": ok[-1] if ok else None,
    }
mem = list(csv.DictReader(open(f"{out}/mem.tsv"), delimiter="\t"))
summary["peak_rss_mib"] = max((int(r["hwm_kib"]) for r in mem), default=0) / 1024
json.dump(summary, open(f"{out}/status-latency.json", "w"), indent=2)
print(json.dumps(summary, indent=2))
EOF
