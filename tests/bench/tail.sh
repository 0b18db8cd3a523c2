#!/usr/bin/env bash
# The tail of a run (issue 27 item 4), two builds side by side, interleaved
# round by round so that both share the machine's state:
#
#   bash tests/bench/tail.sh BEFORE_BIN AFTER_BIN [N] [ROUNDS]
#
# BEFORE_BIN and AFTER_BIN are directories of release builds of nq-coord.
# Each round runs `nq-coord --n N` on this machine's own threads (the
# default plan of each build), checks that its result line says
# published=match, and reads the finished store with the `tail` example of
# nq-store (built here): the seconds from 99 % of the nodes searched to the
# last result, the span, and where the largest job fell (see
# crates/nq-store/examples/tail.rs). Defaults: N = 20, 2 rounds.
set -euo pipefail
cd "$(dirname "$0")/../.."
before=$1
after=$2
n=${3:-20}
rounds=${4:-2}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
lscpu | grep -m1 'Model name' || true
cargo build -q --release -p nq-store --example tail
tail_bin=target/release/examples/tail
export RUST_LOG=warn

declare -A tails spans
for round in $(seq "$rounds"); do
  for side in before after; do
    bin=$before
    [ "$side" = after ] && bin=$after
    dir=$tmp/$side-$round
    line=$("$bin/nq-coord" --n "$n" --data "$dir" --listen 127.0.0.1:0 | grep '^n=')
    case "$line" in
      *published=match*) ;;
      *) echo "tail: $side round $round did not match: $line" >&2; exit 1 ;;
    esac
    seconds=$(sed -n 's/.* seconds=\([0-9.]*\).*/\1/p' <<<"$line")
    jobs=$(sed -n 's/.* jobs=\([0-9]*\).*/\1/p' <<<"$line")
    t=$("$tail_bin" --data "$dir")
    echo "round=$round build=$side seconds=$seconds plan_jobs=$jobs $t"
    tails[$side]+="$(sed -n 's/.* tail_s=\([0-9.]*\).*/\1/p' <<<"$t") "
    spans[$side]+="$seconds "
    rm -rf "$dir"
  done
done
median() { tr ' ' '\n' | grep . | sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
for side in before after; do
  echo "$side: median tail_s=$(median <<<"${tails[$side]}") median seconds=$(median <<<"${spans[$side]}")"
done
