#!/usr/bin/env bash
# Issue 27: the 10^8-job load test run to its end, then everything that reads
# the whole store, each process's memory measured, and one JSON of it all.
#
#   bash tests/bench/record-1e8.sh [OUT]        (default OUT: /tmp/record-1e8)
#
# 1. `nq-loadtest` runs the plan to its last job (N = 20, `--split 0:6`:
#    116,436,889 jobs, one sub-problem each; 1,000 simulated workers), with a
#    SIGKILL of the coordinator at 50 % and at 95 % of the jobs, each
#    followed by a restart on the same directory and port. (The issue names
#    N = 22 `--split 0:4`, but that split has 10,003,956 sub-problems: the
#    1.16·10^8 jobs it means are N = 20's `0:6`, the plan of BENCHMARKS.md
#    §16.)
# 2. Meanwhile, every second, the VmRSS and VmHWM of every coordinator
#    process on the data directory (so each of the three sessions has its
#    own peak) and of the load test itself, and every NQ_RECORD_POLL seconds
#    the latency of `nq-coord status` (the whole command, process start
#    included; at the workers' port and at the HTTP port), `/metrics`,
#    `/status.json` and the status page `/` (curl's time to the whole
#    answer). On 2 cores the load test's workers keep the
#    CPUs busy: these latencies include waiting for a CPU.
# 3. Then the scans, one after the other, each under `/usr/bin/time -v`
#    (wall time and peak RSS): `nq-coord backup`; `nq-coord audit --verify
#    0` (the load test's workers report all-zero counts, sound only under
#    `--verify 0`); `nq-coord restore` of the backup into a fresh directory;
#    `nq recheck --sample NQ_RECORD_SAMPLE` of the audit. (The restore ran
#    beside the audit once and hung in sled 0.34's deadlock between a file
#    truncation and its I/O threads, spacejam/sled#1412: BENCHMARKS.md §28.
#    Alone it has always finished.)
# 4. OUT/record.json: completions/s, the peak RSS of every process and the
#    coordinator's RSS curve, the time to serve again after each restart and
#    the leases lost to restarts, the totals, the status/metrics latencies,
#    and each scan's time and peak RSS. The raw files stay in OUT.
#
# The totals of a load test are zero (its workers do not compute), so the
# audit differs from the published Q(N) and the re-check's sampled jobs do
# not match their recomputation: both are expected, counted in the JSON
# (`audit.differences_from_published`, `recheck.mismatched`), and not a
# failure of the script. What must hold: every job settled exactly once
# (`totals.jobs_settled == totals.jobs`), the audit's rows adding up to the
# stored total (no other difference), 0 leases lost.
#
# Every sub-problem is its own job (`--jobs` = the split's sub-problems), so
# that the job count, and with it where the kills fall, is known before the
# run starts.
#
# Environment (the defaults are the record run; a dry run at a small scale,
# 1,191,876 jobs: NQ_RECORD_N=18 NQ_RECORD_SPLIT=0:4):
#   NQ_RECORD_BIN      release binaries: nq-coord, nq, nq-loadtest
#                      (default target/release)
#   NQ_RECORD_N        board size (20)
#   NQ_RECORD_SPLIT    split RING:EXTRA (0:6)
#   NQ_RECORD_WORKERS  simulated workers (1000)
#   NQ_RECORD_WANT     jobs each simulated worker asks for per lease (16: a
#                      16-thread worker machine; the load test's JSON gives
#                      what was granted, `jobs_per_batch`)
#   NQ_RECORD_AUDIT_DIR  where the audit is written (OUT; /dev/shm takes its
#                      110 bytes a job off the disk)
#   NQ_RECORD_SAMPLE   jobs `nq recheck` solves again (1000)
#   NQ_RECORD_POLL     seconds between status/metrics probes (30)
#   NQ_RECORD_KILLS    shares of the jobs at which to SIGKILL (0.50,0.95)
#   NQ_RECORD_DURATION the load test's time limit (12h); it ends earlier,
#                      when the run is complete
#   NQ_RECORD_DISK_PER_JOB  bytes of disk a job needs in OUT for the store,
#                      the backup, the restored copy and the audit (700; the
#                      10^7-job store of BENCHMARKS.md §22 took 243 + 116 +
#                      172 + 110 = 641 bytes a job, so about 75 GB for the
#                      record run; 540 with NQ_RECORD_LEAN_DISK=1); the
#                      script refuses to start without it
#   NQ_RECORD_LEAN_DISK=1  for a disk that cannot hold all four at once:
#                      give NQ_RECORD_AUDIT_DIR on another filesystem; the
#                      run's directory is deleted once audited (its
#                      report.json and size kept) and the audit once it is
#                      re-checked (its end line kept). The store and the
#                      backup are on disk together, then the backup and the
#                      restored copy (about 400 bytes a job at most)
#
# Resuming: run it again on the same OUT once the load test has ended (its
# JSON written) and the scans that ended are skipped (one killed by a signal
# runs again, a restore into a new directory): a session that
# ends in the scans loses none of the load test's hours. The load test
# itself cannot be resumed (its workers' tallies die with it): start it at
# the beginning of a session. Its end includes the coordinator's
# end-of-run digest, three passes over the store (BENCHMARKS.md §27).
#
# "Serving again" after a restart is the load test's `resume_seconds`: from
# the SIGKILL to the new process's `data directory ready`, which it logs
# just before `serving workers` (BENCHMARKS.md §14).
set -euo pipefail
cd "$(dirname "$0")/../.."

out=${1:-/tmp/record-1e8}
bin=${NQ_RECORD_BIN:-target/release}
n=${NQ_RECORD_N:-20}
split=${NQ_RECORD_SPLIT:-0:6}
workers=${NQ_RECORD_WORKERS:-1000}
want=${NQ_RECORD_WANT:-16}
sample=${NQ_RECORD_SAMPLE:-1000}
poll=${NQ_RECORD_POLL:-30}
kills=${NQ_RECORD_KILLS:-0.50,0.95}
duration=${NQ_RECORD_DURATION:-12h}
lean_disk=${NQ_RECORD_LEAN_DISK:-0}
if [ "$lean_disk" = 1 ]; then
  disk_per_job=${NQ_RECORD_DISK_PER_JOB:-540}
else
  disk_per_job=${NQ_RECORD_DISK_PER_JOB:-700}
fi

for b in nq-coord nq nq-loadtest; do
  [ -x "$bin/$b" ] || {
    echo "record-1e8: $bin/$b is missing: build with" \
      "cargo build --release -p nq-coord -p nq-cli -p nq-e2e --bin nq-loadtest" \
      "(or set NQ_RECORD_BIN)" >&2
    exit 2
  }
done
for tool in /usr/bin/time curl python3; do
  command -v "$tool" >/dev/null || { echo "record-1e8: needs $tool" >&2; exit 2; }
done
# A directory whose load test ended (its JSON written) goes on with the
# scans not done yet: a session that ends during them loses none of the
# load test's hours.
resume=0
if [ -e "$out" ]; then
  if [ -s "$out/loadtest.json" ] && [ -s "$out/meta.txt" ]; then
    resume=1
    echo "record-1e8: the load test in $out ended; going on with the scans not done yet" >&2
  else
    echo "record-1e8: $out exists: give a new directory (its data would be mixed)" >&2
    exit 2
  fi
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)
data=$out/data
audit_dir=${NQ_RECORD_AUDIT_DIR:-$out}
mkdir -p "$audit_dir"
audit=$(cd "$audit_dir" && pwd)/$(basename "$out")-audit.csv

if [ "$resume" = 0 ]; then
  # The plan: how many jobs, and so where the kills fall.
  subproblems=$("$bin/nq-loadtest" --n "$n" --split "$split" --plan |
    sed -n 's/.*subproblems=\([0-9]*\).*/\1/p')
  jobs=$subproblems
  kill_after=$(python3 -c "
print(','.join(str(int(float(s) * $jobs)) for s in '$kills'.split(',')))")
  need=$((jobs * disk_per_job))
  free=$(($(df --output=avail -B1 "$out" | tail -1)))
  if [ "$free" -lt "$need" ]; then
    echo "record-1e8: $jobs jobs need about $((need / 1000000000)) GB free in $out" \
      "(NQ_RECORD_DISK_PER_JOB=$disk_per_job bytes a job: store, backup, restored" \
      "copy, audit); it has $((free / 1000000000)) GB" >&2
    exit 2
  fi

  {
    echo "cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)"
    echo "cores=$(nproc)"
    echo "commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "started=$(date -u +%FT%TZ)"
    echo "load=$(cut -d' ' -f1-3 /proc/loadavg)"
    echo "n=$n split=$split jobs=$jobs kill_after=$kill_after workers=$workers want=$want"
    echo "lean_disk=$lean_disk"
  } | tee "$out/meta.txt"

  metrics_port=$(python3 -c '
import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])')

  # 1. The load test, to the end of the run.
  started=$(date +%s.%N)
  # CARGO=/bin/true: the load test takes the nq-coord beside it as built,
  # instead of building one for its profile.
  CARGO=/bin/true /usr/bin/time -v -o "$out/loadtest.time" \
    "$bin/nq-loadtest" --n "$n" --split "$split" --jobs "$jobs" \
    --workers "$workers" --want "$want" --duration "$duration" \
    --kill-after "$kill_after" --data "$data" \
    -- --metrics "127.0.0.1:$metrics_port" \
    >"$out/loadtest.json" 2>"$out/loadtest.err" &
  loadtest=$!

  # 2. Memory every second (each coordinator process, and the load test's own
  # process, whose peak /usr/bin/time would mix with its children's); status
  # and metrics latency every $poll seconds while a coordinator runs. A probe
  # that fails (the coordinator restarting) is recorded as such.
  . tests/bench/latency-probes.sh
  echo -e "seconds\trole\tpid\trss_kib\thwm_kib" >"$out/mem.tsv"
  echo -e "seconds\tstatus_ms\tmetrics_ms\tstatus_json_ms\tpage_ms\tstatus_http_ms" >"$out/latency.tsv"
  t0=$(date +%s%N)
  next_poll=0
  while kill -0 "$loadtest" 2>/dev/null; do
    at=$((($(date +%s%N) - t0) / 1000000000))
    coords=$(pgrep -f -- "nq-coord --data $data" || true)
    for pid in $(pgrep -P "$loadtest" || true) $coords; do
      role=coordinator
      [[ " $coords " == *" $pid "* ]] || role=loadtest
      mem=$(awk '/^VmRSS:/ {r = $2} /^VmHWM:/ {h = $2} END {if (r) print r "\t" h}' \
        "/proc/$pid/status" 2>/dev/null || true)
      [ -n "$mem" ] && echo -e "$at\t$role\t$pid\t$mem" >>"$out/mem.tsv"
    done
    addr=$(sed -n 's/^coordinator on \([0-9.:]*\) ready.*/\1/p' "$out/loadtest.err" | head -1)
    if [ -n "$coords" ] && [ -n "$addr" ] && [ "$at" -ge "$next_poll" ]; then
      web=http://127.0.0.1:$metrics_port
      echo -e "$at\t$(status_ms "$addr")\t$(curl_ms "$web/metrics")\t$(
        curl_ms "$web/status.json")\t$(curl_ms "$web/")\t$(
        status_ms "127.0.0.1:$metrics_port")" >>"$out/latency.tsv"
      next_poll=$((at + poll))
    fi
    sleep 1
  done
  wait "$loadtest" || {
    echo "record-1e8: the load test failed (exit $?): see $out/loadtest.err" >&2
    exit 1
  }
fi

# 3. The scans, one after the other. A command's own verdict is kept in its
# log; the load test's zero counts make the audit and the re-check report
# differences from the published values (see the header).
ended() { # ended NAME: the step ran before, and no signal ended it (a hung
  # step killed by hand runs again)
  grep -q 'Exit status' "$out/$1.time" 2>/dev/null &&
    ! grep -q '^Command terminated by signal' "$out/$1.time"
}
timed() { # timed NAME COMMAND...: runs it under /usr/bin/time -v, once
  local name=$1
  shift
  if ended "$name"; then
    echo "$name: done before"
    return
  fi
  /usr/bin/time -v -o "$out/$name.time" "$@" >"$out/$name.out" 2>"$out/$name.err" || true
  # A child killed by a signal has "Exit status: 0" in /usr/bin/time's
  # report; the signal is on the line above it.
  echo "$name: $(grep -m1 -E '^Command terminated by signal|Exit status' "$out/$name.time" |
    sed 's/.*: //; s/^Command terminated by //') exit," \
    "$(grep 'Elapsed (wall' "$out/$name.time" | sed 's/.*: //'),"\
    "peak $(($(grep 'Maximum resident' "$out/$name.time" | sed 's/.*: //') / 1024)) MiB"
}
# Backup first: sled locks the store, so nothing else can read it meanwhile.
# One scan at a time: the restore beside the audit once hung in a sled
# deadlock (see the header). The re-check needs the whole audit.
timed backup "$bin/nq-coord" backup --data "$data" --to "$out/run.backup"
timed audit "$bin/nq-coord" audit --verify 0 --data "$data" --output "$audit"
# (Each file below is written while what it describes is there: a resumed
# lean run deleted the audit or the store before.)
[ -d "$data" ] && du -sb "$data" | cut -f1 >"$out/data.bytes"
if [ "$lean_disk" = 1 ] && [ -d "$data" ]; then
  cp "$data/report.json" "$out/report.json" 2>/dev/null || true
  rm -rf "$data"
fi
# A restore that is run again starts from a new directory: one that was
# killed left a part of a store.
ended restore || rm -rf "$out/restored"
timed restore "$bin/nq-coord" restore --from "$out/run.backup" --data "$out/restored"
[ -d "$out/restored" ] && du -sb "$out/restored" | cut -f1 >"$out/restored.bytes"
timed recheck "$bin/nq" recheck "$audit" --sample "$sample" --seed record-1e8
if [ -e "$audit" ]; then
  grep '^# end ' "$audit" >"$out/audit.end" || true
  du -sb "$audit" | cut -f1 >"$out/audit.bytes"
  [ "$lean_disk" = 1 ] && rm -f "$audit"
fi

# 4. One JSON.
python3 - "$out" "$audit" <<'PY'
import csv, json, os, re, sys

out, audit = sys.argv[1], sys.argv[2]
meta = dict(
    line.strip().split("=", 1) for line in open(f"{out}/meta.txt") if "=" in line
)
lt = json.load(open(f"{out}/loadtest.json"))


def timed(name):
    t = {}
    for line in open(f"{out}/{name}.time"):
        k, _, v = line.strip().rpartition(": ")
        t[k] = v
    signal = re.search(r"^Command terminated by signal (\d+)", open(f"{out}/{name}.time").read(), re.M)
    wall = t.get("Elapsed (wall clock) time (h:mm:ss or m:ss)", "0:0")
    seconds = 0.0
    for part in wall.split(":"):
        seconds = seconds * 60 + float(part)
    return {
        "seconds": seconds,
        "peak_rss_mib": int(t.get("Maximum resident set size (kbytes)", 0)) / 1024,
        # A signal's death is reported as exit status 0: 128 + the signal,
        # as a shell gives it.
        "exit_status": 128 + int(signal.group(1)) if signal else int(t.get("Exit status", -1)),
    }


# The coordinator: each process's peak, and the curve (MiB every 10 s of
# the load test's own per-second lines, with the completions so far).
peaks, loadtest_peak = {}, 0
for row in csv.DictReader(open(f"{out}/mem.tsv"), delimiter="\t"):
    if not row.get("hwm_kib"):
        continue  # a process that ended while it was read
    if row["role"] == "loadtest":
        loadtest_peak = max(loadtest_peak, int(row["hwm_kib"]))
        continue
    pid = row["pid"]
    peaks[pid] = max(peaks.get(pid, 0), int(row["hwm_kib"]))
curve = []
line = re.compile(r"t=\s*(\d+)s .*total=\s*(\d+) rss=(\d+) MiB")
for l in open(f"{out}/loadtest.err"):
    m = line.search(l)
    if m and int(m.group(1)) % 10 == 0:
        curve.append([int(m.group(1)), int(m.group(2)), int(m.group(3))])

# status_http_ms: `nq-coord status` at the HTTP port (a column since
# BENCHMARKS.md §29; a run before it has none).
lat = {"status_ms": [], "metrics_ms": [], "status_json_ms": [], "page_ms": [], "status_http_ms": []}
header = open(f"{out}/latency.tsv").readline().rstrip("\n").split("\t")
lat = {k: v for k, v in lat.items() if k in header}
failed = 0
for row in csv.DictReader(open(f"{out}/latency.tsv"), delimiter="\t"):
    if any(not row.get(k) for k in lat):
        continue
    for k in lat:
        if row[k] == "fail":
            failed += 1
        else:
            lat[k].append(int(row[k]))


def spread(v):
    v = sorted(v)
    if not v:
        return None
    return {"count": len(v), "median": v[len(v) // 2], "p99": v[min(len(v) - 1, int(len(v) * 0.99))], "max": v[-1]}


audit_end = {}
for l in open(f"{out}/audit.end", errors="replace") if os.path.exists(f"{out}/audit.end") else []:
    if l.startswith("# end "):
        audit_end = dict(f.split("=", 1) for f in l[6:].split() if "=" in f)
audit_err = open(f"{out}/audit.err").read()
mismatches = [l for l in audit_err.splitlines() if l.startswith("nq-coord audit: MISMATCH")]
recheck_out = open(f"{out}/recheck.out").read()
summary = dict(f.split("=", 1) for f in recheck_out.split() if "=" in f)
recheck_err = open(f"{out}/recheck.err").read()
report = {}
for path in (f"{out}/data/report.json", f"{out}/report.json"):
    if os.path.exists(path):
        report = json.load(open(path))
        break


def size(name):
    path = f"{out}/{name}.bytes"
    return int(open(path).read()) if os.path.exists(path) else None

record = {
    "meta": meta,
    "completions": lt["completions"],
    "seconds": lt["seconds"],
    "completions_per_second": lt["completions_per_second"],
    "median_per_second": lt["median_per_second"],
    "setup_seconds": lt["setup_seconds"],
    "restarts": lt["restarts"],
    "leases_lost_to_restarts": lt["leases_lost_to_restarts"],
    "refused_reports": lt["refused_reports"],
    "registrations_again": lt["registrations_again"],
    "lease_expiries": lt["lease_expiries"],
    "peak_rss_mib": {
        "coordinator_overall": lt["coord_peak_rss_mib"],
        "coordinator_by_process": {p: k / 1024 for p, k in sorted(peaks.items(), key=lambda kv: int(kv[0]))},
        "loadtest": loadtest_peak / 1024,
        "audit": timed("audit")["peak_rss_mib"],
        "recheck": timed("recheck")["peak_rss_mib"],
        "backup": timed("backup")["peak_rss_mib"],
        "restore": timed("restore")["peak_rss_mib"],
    },
    "coordinator_rss_curve": {"columns": ["seconds", "completions", "rss_mib"], "rows": curve},
    "latency_ms": {k: spread(v) for k, v in lat.items()},
    "latency_probes_failed": failed,
    "totals": {
        "jobs": lt["jobs"],
        "jobs_settled": int(audit_end.get("settled", -1)),
        "audit_total": audit_end.get("total"),
        "report_status": report.get("status"),
        "report_total": report.get("total"),
        "report_jobs_done": report.get("jobs_done"),
    },
    "store_mib": lt["store_mib"],
    "disk_bytes": {"store": size("data"), "audit": size("audit") or (
        os.path.getsize(audit) if os.path.exists(audit) else None),
        "restored": size("restored")},
    "lean_disk": meta.get("lean_disk") == "1",
    "audit": dict(timed("audit"), differences_from_published=len(
                      [l for l in mismatches if "published" in l]),
                  other_differences=[l for l in mismatches if "published" not in l]),
    "recheck": dict(timed("recheck"), sampled=summary.get("sampled"), matched=summary.get("matched"),
                    mismatched=recheck_err.count(": the audit says count_total")),
    "backup": dict(timed("backup"), bytes=os.path.getsize(f"{out}/run.backup") if os.path.exists(f"{out}/run.backup") else None),
    "restore": timed("restore"),
}
json.dump(record, open(f"{out}/record.json", "w"), indent=2)
print(json.dumps({k: record[k] for k in ("completions_per_second", "restarts", "leases_lost_to_restarts", "peak_rss_mib", "totals", "latency_ms")}, indent=2))
PY
echo "record-1e8: $out/record.json"
