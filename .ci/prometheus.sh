#!/usr/bin/env bash
# Checks deploy/prometheus/ with the distribution's promtool, and the live
# /metrics of a real coordinator:
#
#   1. promtool check config deploy/prometheus/prometheus.yml (and the rule
#      file it names);
#   2. promtool check rules deploy/prometheus/nq-alerts.yml;
#   3. promtool test rules deploy/prometheus/nq-alerts.test.yml, and every
#      alert of the rule file has a test there;
#   4. a live run: the debug nq-coord for N = 20 with `--metrics 127.0.0.1:0`
#      and one nq-worker with one thread (minutes of work, stopped after its
#      first reported job); its /metrics must parse as OpenMetrics 1.0
#      (prometheus_client's strict parser), pass `promtool check metrics`,
#      and carry every nq_* series the rules read.
#
# promtool (Prometheus 2.42 in Debian 12) lints only the classic text format
# (0.0.4), and the coordinator serves OpenMetrics: so step 4 parses the
# OpenMetrics text, writes the same families as text 0.0.4 (the translation
# Prometheus itself applies: `info` becomes a gauge `_info`, counters are
# named with `_total`) and lints that.
#
# Installs Debian's prometheus and python3-prometheus-client when missing
# (needs root then), without starting the Prometheus service. Everything
# listens on 127.0.0.1; what it started is stopped by pid on exit. About
# 10 s once installed and built.
set -euo pipefail
cd "$(dirname "$0")/.."

DIR=deploy/prometheus
# How long to wait for each signal of the live run, in tenths of a second.
WAIT_TENTHS=600
# Findings of `promtool check metrics` on the live output that are known and
# tracked, one exact line each; any other finding fails. nq_work_total is a
# gauge (the run's estimated work) whose name reads as a counter's; the
# rename belongs to nq-coord (crates/nq-coord/src/metrics.rs).
KNOWN_LINT=(
    'nq_work_total non-counter metrics should not have "_total" suffix'
)
# Debian's python, which the python3-prometheus-client package serves (a
# python3 earlier on PATH, such as pyenv's, would not see it).
PY=/usr/bin/python3

echo "== install promtool and prometheus_client (Debian packages)"
if ! command -v promtool >/dev/null 2>&1 ||
    ! "$PY" -c 'import prometheus_client' 2>/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    # The prometheus package would start its service where no policy forbids
    # it: forbid it for this install only (the usual Debian container way).
    policy=/usr/sbin/policy-rc.d
    own_policy=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy"
        chmod 755 "$policy"
        own_policy=1
    fi
    rc=0
    { apt-get update -qq &&
        apt-get install -y -qq --no-install-recommends prometheus python3-prometheus-client \
            >/dev/null; } || rc=$?
    [ $own_policy = 1 ] && rm -f "$policy"
    [ $rc = 0 ] || { echo "FAIL: apt-get install prometheus python3-prometheus-client" >&2; exit 1; }
fi
promtool --version 2>&1 | head -n 1

echo "== promtool check config"
promtool check config "$DIR/prometheus.yml"

echo "== promtool check rules"
promtool check rules "$DIR/nq-alerts.yml"

echo "== promtool test rules"
(cd "$DIR" && promtool test rules nq-alerts.test.yml)
alerts=$(grep -oP '^\s+- alert: \K\S+' "$DIR/nq-alerts.yml" | sort -u)
tested=$(grep -oP '^\s+alertname: \K\S+' "$DIR/nq-alerts.test.yml" | sort -u)
untested=$(comm -23 <(echo "$alerts") <(echo "$tested"))
[ -z "$untested" ] || { echo "FAIL: alerts without a test: $untested" >&2; exit 1; }
echo "ok: every alert has a test ($(echo "$alerts" | wc -l) alerts)"

echo "== live /metrics: promtool check metrics"
cargo build -q --locked -p nq-coord -p nq-worker
bin=${CARGO_TARGET_DIR:-target}/debug
work=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$work"
}
trap cleanup EXIT

fail() {
    echo "FAIL: $1" >&2
    for f in "$work"/*.log "$work"/*.out; do
        [ -e "$f" ] && { echo "----- $f" >&2; tail -n 40 "$f" >&2; }
    done
    exit 1
}

# Waits until file $1 has a line matching $2 while process $3 lives.
wait_line() {
    local i
    for ((i = 0; i < WAIT_TENTHS; i++)); do
        grep -q -- "$2" "$1" 2>/dev/null && return 0
        kill -0 "$3" 2>/dev/null || fail "process $3 ended before printing '$2'"
        sleep 0.1
    done
    fail "no '$2' in $1 after $((WAIT_TENTHS / 10)) s"
}

# A token, as every deployment has one (deploy/): loopback needs none, but
# the check runs the coordinator as it is deployed.
token=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
NQ_TOKEN=$token RUST_LOG=info NO_COLOR=1 "$bin/nq-coord" --n 20 --split 0:2 --jobs 100000 --local-threads 0 \
    --listen 127.0.0.1:0 --metrics 127.0.0.1:0 --data "$work/run" --progress none \
    >"$work/coord.out" 2>"$work/coord.log" &
coord=$!
pids+=("$coord")
wait_line "$work/coord.out" '^metrics on ' "$coord"
grpc=$(sed -n 's/^listening on //p' "$work/coord.out")
http=$(sed -n 's/^metrics on //p' "$work/coord.out")
NQ_TOKEN=$token RUST_LOG=info,nq_worker=debug NO_COLOR=1 "$bin/nq-worker" \
    --connect "$grpc" --threads 1 --name metrics-worker --grace 100ms \
    >"$work/worker.out" 2>"$work/worker.log" &
worker=$!
pids+=("$worker")
# The first acknowledged job: every family, the per-worker ones included,
# has a series.
wait_line "$work/worker.log" 'job reported' "$worker"
# (Python's urllib rather than curl, which a fresh machine may lack.)
"$PY" -c 'import sys, urllib.request
sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())' \
    "http://$http/metrics" >"$work/metrics.om" || fail "GET http://$http/metrics failed"
# The worker first (it hands its jobs back within --grace), then the
# coordinator; both were only needed for the scrape.
kill "$worker"
wait "$worker" 2>/dev/null || true
kill "$coord"
wait "$coord" 2>/dev/null || true
pids=()
echo "ok: scraped http://$http/metrics ($(wc -l <"$work/metrics.om") lines)"

# Strict OpenMetrics parse (a missing `# EOF`, a bad type or a malformed
# sample is an error), then the same families as text 0.0.4.
"$PY" - "$work/metrics.om" >"$work/metrics.txt" <<'EOF' || fail "not valid OpenMetrics"
import sys

from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

with open(sys.argv[1], encoding="utf-8") as f:
    families = list(text_string_to_metric_families(f.read()))


class Scraped:
    """The parsed families, as a collector for generate_latest."""

    def collect(self):
        return families


registry = CollectorRegistry(auto_describe=False)
registry.register(Scraped())
sys.stdout.write(generate_latest(registry).decode())
EOF
echo "ok: valid OpenMetrics ($(grep -c '^# TYPE' "$work/metrics.txt") families)"

lint_rc=0
promtool check metrics <"$work/metrics.txt" >"$work/lint.out" 2>&1 || lint_rc=$?
# 0: clean; 3: lint findings (sorted out below); anything else: unreadable.
[ $lint_rc = 0 ] || [ $lint_rc = 3 ] || { cat "$work/lint.out" >&2; fail "promtool check metrics exited $lint_rc"; }
unknown=$(grep -vxF -f <(printf '%s\n' "${KNOWN_LINT[@]}") "$work/lint.out" || true)
[ -z "$unknown" ] || fail "promtool check metrics: $unknown"
for known in "${KNOWN_LINT[@]}"; do
    if grep -qxF -- "$known" "$work/lint.out"; then
        echo "known finding (tracked): $known"
    else
        echo "note: no longer reported, remove it from KNOWN_LINT: $known"
    fi
done
echo "ok: promtool check metrics"

# The rules must read series that exist: every nq_* name in nq-alerts.yml is
# a sample of the live output.
missing=()
while read -r name; do
    grep -qE "^$name(\{| )" "$work/metrics.om" || missing+=("$name")
done < <(grep -oE '\bnq_[a-z_]+' "$DIR/nq-alerts.yml" | sort -u)
[ ${#missing[@]} = 0 ] || fail "series the rules read but /metrics lacks: ${missing[*]}"
echo "ok: every nq_* series the rules read is served"
echo "prometheus: PASS"
