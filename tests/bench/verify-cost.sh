#!/usr/bin/env bash
# What verification costs on one machine: `nq count N` against
# `nq-coord --n N --verify 0` and `--verify 1` (every job computed twice, the
# second copy on the other kernel), interleaved so that the three share the
# machine's state. Prints one line per run and the median ratios.
#
#   bash tests/bench/verify-cost.sh [N] [ROUNDS]     (default N=17, 3 rounds)
set -euo pipefail
cd "$(dirname "$0")/../.."
n=${1:-17}
rounds=${2:-3}
cargo build --release -q -p nq-coord -p nq-cli
bin=target/release
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
lscpu | grep -m1 'Model name' || true
now() { date +%s.%N; }
elapsed() { local t0=$1; echo "$(now) - $t0" | bc -l; }
declare -a count v0 v1
for ((i = 0; i < rounds; i++)); do
    t=$(now); "$bin/nq" count "$n" >/dev/null; count+=("$(elapsed "$t")")
    rm -rf "$tmp/v0"; t=$(now)
    "$bin/nq-coord" --n "$n" --data "$tmp/v0" --listen 127.0.0.1:0 --progress none \
        --verify 0 >"$tmp/v0.out" 2>/dev/null
    v0+=("$(elapsed "$t")")
    rm -rf "$tmp/v1"; t=$(now)
    "$bin/nq-coord" --n "$n" --data "$tmp/v1" --listen 127.0.0.1:0 --progress none \
        --verify 1 >"$tmp/v1.out" 2>/dev/null
    v1+=("$(elapsed "$t")")
    grep -q "published=match" "$tmp/v0.out" && grep -q "published=match" "$tmp/v1.out" \
        || { echo "a run did not match the published count" >&2; exit 1; }
    printf 'round %d: count %.3f s, --verify 0 %.3f s, --verify 1 %.3f s\n' \
        "$((i + 1))" "${count[i]}" "${v0[i]}" "${v1[i]}"
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
mc=$(median "${count[@]}"); m0=$(median "${v0[@]}"); m1=$(median "${v1[@]}")
printf 'N=%s medians: count %.3f s, --verify 0 %.3f s (%.3fx), --verify 1 %.3f s (%.3fx)\n' \
    "$n" "$mc" "$m0" "$(echo "$m0 / $mc" | bc -l)" "$m1" "$(echo "$m1 / $mc" | bc -l)"
