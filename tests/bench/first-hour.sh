#!/usr/bin/env bash
# What a new user's first hour costs (issue 26), two builds side by side,
# interleaved round by round so that both share the machine's state:
#
#   alone     nq-coord --n N on its own threads (the reference)
#   count     nq count N (the single-machine tool; `alone` should stay
#             within 1.05× of it)
#   tokens    --local-threads 0 and two workers with a per-machine token
#             each (two identities, both new: probation); copies =
#             jobs + confirmations + conflicts from report.json
#   ctrl-c    the same, with SIGINT to one worker one second in
#   resume    nq-coord --n N alone, kill -9 one second in, then the time of
#             the resumed run alone (against `alone`)
#
#   bash tests/bench/first-hour.sh BEFORE_BIN AFTER_BIN [N] [ROUNDS]
#
# BEFORE_BIN and AFTER_BIN are directories of release builds of nq-coord,
# nq-worker and nq (defaults: N = 18, 3 rounds). Prints one line per run
# and the medians per build; every run's report must say published=match.
set -euo pipefail
before=$1
after=$2
n=${3:-18}
rounds=${4:-3}
tmp=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    rm -rf "$tmp"
}
trap cleanup EXIT
lscpu | grep -m1 'Model name' || true
now() { date +%s.%N; }
since() { echo "$(now) - $1" | bc; }
export RUST_LOG=warn

# start_coord BIN DIR ARGS...: starts a coordinator on a free port, waits
# for its `listening on` line, sets $coord (pid) and $addr.
start_coord() {
    local bin=$1 dir=$2
    shift 2
    # Created before the coordinator, so that the wait below never reads a
    # file the background process has not opened yet.
    : >"$dir/coord.out"
    "$bin/nq-coord" --n "$n" --data "$dir/data" --listen 127.0.0.1:0 --progress none \
        "$@" >"$dir/coord.out" 2>"$dir/coord.err" &
    coord=$!
    pids+=("$coord")
    addr=""
    for _ in $(seq 1 600); do
        addr=$(sed -n 's/^listening on //p' "$dir/coord.out")
        [[ -n $addr ]] && return 0
        sleep 0.05
    done
    echo "no listening line:" >&2
    cat "$dir/coord.err" >&2
    exit 1
}

# copies DIR: jobs + confirmations + conflicts, and the published check.
copies() {
    python3 -c '
import json, sys
r = json.load(open(sys.argv[1] + "/data/report.json"))
assert r["published_match"], r
print(r["jobs"] + r.get("confirmations", 0) + r["conflicts"], r["status"])' "$1"
}

alone() {
    local bin=$1 dir=$2 t0
    t0=$(now)
    start_coord "$bin" "$dir"
    wait "$coord" || true
    echo "$(since "$t0") $(copies "$dir")"
}

count() {
    local bin=$1 t0
    t0=$(now)
    "$bin/nq" count "$n" >/dev/null
    echo "$(since "$t0")"
}

# two_workers BIN DIR STOP: --local-threads 0, workers a and b with their
# own tokens; STOP=1 sends SIGINT to a after one second.
two_workers() {
    local bin=$1 dir=$2 stop=$3 t0 a b
    printf 'a token-of-machine-a-0123456789\nb token-of-machine-b-0123456789\n' >"$dir/tokens"
    t0=$(now)
    start_coord "$bin" "$dir" --local-threads 0 --worker-tokens "$dir/tokens"
    "$bin/nq-worker" --connect "$addr" --token token-of-machine-a-0123456789 \
        >"$dir/a.out" 2>&1 &
    a=$!
    "$bin/nq-worker" --connect "$addr" --token token-of-machine-b-0123456789 \
        >"$dir/b.out" 2>&1 &
    b=$!
    pids+=("$a" "$b")
    if [[ $stop == 1 ]]; then
        sleep 1
        kill -INT "$a"
    fi
    wait "$coord" || true
    wait "$a" "$b" || true
    echo "$(since "$t0") $(copies "$dir")"
}

resume() {
    local bin=$1 dir=$2 t0
    start_coord "$bin" "$dir"
    sleep 1
    kill -9 "$coord"
    wait "$coord" 2>/dev/null || true
    t0=$(now)
    start_coord "$bin" "$dir"
    wait "$coord" || true
    echo "$(since "$t0") $(copies "$dir")"
}

declare -A results
for round in $(seq 1 "$rounds"); do
    for build in before after; do
        bin=${!build}
        for what in alone count tokens ctrl-c resume; do
            dir="$tmp/$build-$what-$round"
            mkdir -p "$dir"
            case $what in
                alone) line=$(alone "$bin" "$dir") ;;
                count) line=$(count "$bin") ;;
                tokens) line=$(two_workers "$bin" "$dir" 0) ;;
                ctrl-c) line=$(two_workers "$bin" "$dir" 1) ;;
                resume) line=$(resume "$bin" "$dir") ;;
            esac
            echo "round $round $build $what: $line"
            results[$build-$what]+="${line%% *} "
            [[ $what == tokens ]] && results[$build-copies]+="$(awk '{print $2}' <<<"$line") "
        done
    done
done

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo
echo "medians (seconds; copies of the tokens runs):"
for build in before after; do
    line="$build:"
    for what in alone count tokens ctrl-c resume copies; do
        line+=" $what=$(median <<<"${results[$build-$what]}")"
    done
    echo "$line"
done
