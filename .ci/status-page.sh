#!/usr/bin/env bash
# Renders the coordinator's status page in headless Chromium against a live
# run, checks what the page shows once its JavaScript ran, and keeps a
# screenshot of each as a CI artifact: target/status-page.png (a run
# going) and target/status-page-complete.png (a run with its result).
#
# The running run: the debug nq-coord for N = 18 with no local threads and
# `--metrics 127.0.0.1:0`, and one nq-worker with one thread (about a minute
# of work with the faster kernels, far more than the check needs). The complete one: N = 16 in two sessions, held
# open after its last job by the coordinator's linger for the first session's worker. Every wait is on a
# real signal: the coordinator's `metrics on ADDR` and `every job is done`
# lines, the workers' `registered` and `job reported` lines, exits. Installs Chromium from Debian's packages when it is missing (needs
# root then). Everything listens on 127.0.0.1; the processes it started are
# stopped by pid on exit. About 30 s once built.
set -euo pipefail
cd "$(dirname "$0")/.."

# How long to wait for each signal before giving up, in tenths of a second.
WAIT_TENTHS=600
SHOT=target/status-page.png
DONE_SHOT=target/status-page-complete.png
SIZE=1200,1000

if ! command -v chromium >/dev/null 2>&1; then
    echo "== install chromium (Debian package)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
fi
command -v chromium >/dev/null || { echo "chromium could not be installed" >&2; exit 1; }

echo "== build nq-coord and nq-worker (debug)"
cargo build -q --locked -p nq-coord -p nq-worker
bin=target/debug

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

echo "== start a run"
RUST_LOG=info NO_COLOR=1 "$bin/nq-coord" --n 18 --local-threads 0 \
    --listen 127.0.0.1:0 --metrics 127.0.0.1:0 --data "$work/run" \
    >"$work/coord.out" 2>"$work/coord.log" &
coord=$!
pids+=("$coord")
wait_line "$work/coord.out" '^metrics on ' "$coord"
grpc=$(sed -n 's/^listening on //p' "$work/coord.out")
http=$(sed -n 's/^metrics on //p' "$work/coord.out")
echo "coordinator on $grpc, status page on http://$http/"

RUST_LOG=info,nq_worker=debug NO_COLOR=1 "$bin/nq-worker" --connect "$grpc" \
    --threads 1 --name page-worker >"$work/worker.out" 2>"$work/worker.log" &
worker=$!
pids+=("$worker")
# The first acknowledged job: the worker has a row with throughput.
wait_line "$work/worker.log" 'job reported' "$worker"

chrome=(chromium --headless --no-sandbox --disable-gpu --hide-scrollbars
    --user-data-dir="$work/chrome" --window-size="$SIZE"
    # Lets the page's timers run a few polls (and draw the chart) before
    # the DOM is dumped or the screenshot taken.
    --virtual-time-budget=4000)

echo "== render the page (DOM after its JavaScript ran)"
"${chrome[@]}" --dump-dom "http://$http/" >"$work/dom.html" 2>"$work/chrome-dom.log" \
    || fail "chromium --dump-dom failed"
check() {
    grep -Eq -- "$2" "$work/dom.html" || {
        cp "$work/dom.html" target/status-page.html
        fail "the page shows no $1 (DOM kept in target/status-page.html)"
    }
    echo "ok: $1"
}
check "board size" 'id="n">18<'
check "running state" 'id="state" class="badge running">running<'
check "progress percentage" 'id="percent">[0-9]+\.[0-9]%<'
check "progress bar width" 'id="bar-fill" style="width: [0-9.]+%'
check "ETA" 'id="eta">[0-9]+(h|m|s)'
check "worker row" '<tr class="worker"><td>page-worker</td><td class="mono">127\.0\.0\.1</td><td class="num">1</td>'
check "throughput chart" '<(polyline|circle) '

echo "== screenshot"
mkdir -p target
rm -f "$SHOT"
"${chrome[@]}" --screenshot="$SHOT" "http://$http/" >"$work/chrome-shot.log" 2>&1 \
    || fail "chromium --screenshot failed"
# A PNG starts with \x89PNG.
[ "$(head -c 4 "$SHOT" | tail -c 3)" = "PNG" ] || fail "$SHOT is not a PNG"
echo "ok: screenshot of the running run in $SHOT ($(stat -c %s "$SHOT") bytes)"
kill "$worker" "$coord"
wait "$worker" "$coord" 2>/dev/null || true
pids=()

# A complete run, held open so the page can show its result: after the last
# job the coordinator lingers, up to --linger, for the identities that voted
# in an earlier session of the run and have not come back to hear that it is
# over. So the run has two sessions: in the first, worker `early` computes a
# few jobs and drains (it leaves at once, since issue 26), and the
# coordinator is stopped; the second, resumed, is finished by `finisher`
# while it waits for `early`. No verification: a check copy would wait for
# a second machine.
echo "== a complete run"
start_run16() {
    RUST_LOG=info NO_COLOR=1 "$bin/nq-coord" --n 16 --local-threads 0 --verify 0 \
        --lease-ttl 60s --linger 60s --listen 127.0.0.1:0 --metrics 127.0.0.1:0 \
        --data "$work/run16" >"$work/coord16-$1.out" 2>"$work/coord16-$1.log" &
    coord=$!
    pids+=("$coord")
    wait_line "$work/coord16-$1.out" '^metrics on ' "$coord"
    grpc=$(sed -n 's/^listening on //p' "$work/coord16-$1.out")
    http=$(sed -n 's/^metrics on //p' "$work/coord16-$1.out")
}
start_run16 first
RUST_LOG=info,nq_worker=debug NO_COLOR=1 "$bin/nq-worker" --connect "$grpc" --threads 1 \
    --grace 0s --name early >"$work/early.out" 2>"$work/early.log" &
early=$!
pids+=("$early")
wait_line "$work/early.log" 'job reported' "$early"
kill -TERM "$early"
wait "$early" || fail "the early worker did not drain cleanly"
kill -TERM "$coord"
wait "$coord" || true
grep -q 'status=interrupted' "$work/coord16-first.out" ||
    fail "the first session did not stop before the end: $(cat "$work/coord16-first.out")"
start_run16 second
RUST_LOG=info NO_COLOR=1 "$bin/nq-worker" --connect "$grpc" --threads 2 \
    --name finisher >"$work/finisher.out" 2>"$work/finisher.log" &
pids+=("$!")
wait_line "$work/coord16-second.log" 'every job is done' "$coord"
"${chrome[@]}" --dump-dom "http://$http/" >"$work/dom.html" 2>"$work/chrome-dom.log" \
    || fail "chromium --dump-dom failed"
check "complete state" 'id="state" class="badge complete">complete<'
check "100% progress" 'id="percent">100\.0%<'
check "result" '<section id="result" class="card">'
check "Q(16)" 'id="total" class="mono">14772512<'
check "U(16)" 'id="unique" class="mono">1846955<'
check "published match" 'id="published">matches OEIS A000170<'
check "finisher row" '<tr class="worker"><td>finisher</td>'
"${chrome[@]}" --screenshot="$DONE_SHOT" "http://$http/" >"$work/chrome-shot.log" 2>&1 \
    || fail "chromium --screenshot failed"
[ "$(head -c 4 "$DONE_SHOT" | tail -c 3)" = "PNG" ] || fail "$DONE_SHOT is not a PNG"
echo "PASS: status page rendered; screenshots in $SHOT and $DONE_SHOT"
