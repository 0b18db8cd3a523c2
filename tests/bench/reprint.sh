#!/usr/bin/env bash
# A finished run started again (its report printed from the store, as after
# a crash in the end-of-run digest, or a Job run again on a finished
# volume), with two release builds, interleaved, on one finished run.
# PRE and POST are the target/release directories of the two builds (the
# earlier one built in a git worktree). Both must print the same line, the
# audit digest included.
set -euo pipefail
PRE=${PRE:?set PRE to the target/release of the build to compare with}
POST=${POST:-target/release}
DATA=${DATA:-/tmp/reprint-run}
ROUNDS=${ROUNDS:-5}
lscpu | grep -m1 "Model name"
rm -rf "$DATA"
# 204,230 jobs at N = 18 with --split 0:3 --job-size 1.
/usr/bin/time -f "run: %e s, %M KB" "$POST/nq-coord" --n 18 --split 0:3 --job-size 1 \
    --data "$DATA" --progress none --listen 127.0.0.1:0 | grep -v '^listening'
for round in $(seq 1 "$ROUNDS"); do
  for b in pre post; do
    B=$PRE; [ $b = post ] && B=$POST
    /usr/bin/time -f "$b round $round: %e s, %M KB" "$B/nq-coord" --data "$DATA" \
        --progress none --listen 127.0.0.1:0 > "$DATA.$b.out"
  done
done
cmp "$DATA.pre.out" "$DATA.post.out" && echo "both printed: $(cat "$DATA.post.out")"
