#!/usr/bin/env bash
# Issue 15's speed check: nq-loadtest at 10^7 jobs with two release builds,
# alternating, one machine, one run. PRE and POST are the target/release
# directories of the two builds (the pre-refactor one is f2f4609, built in a
# git worktree); the JSON of every run lands in OUT.
set -u
PRE=${PRE:?set PRE to the target/release of the build to compare with}
POST=${POST:-target/release}
OUT=${OUT:-/tmp/engine-vs-pre}
DATA=${DATA:-/tmp/lt-data}
ROUNDS=${ROUNDS:-3}
mkdir -p $OUT
lscpu | grep -m1 "Model name"
uptime
for round in $(seq 1 $ROUNDS); do
  for b in pre post; do
    B=$PRE; [ $b = post ] && B=$POST
    rm -rf $DATA
    $B/nq-loadtest --n 22 --split 0:4 --jobs 10003956 --workers 1000 --want 8 \
        --duration 60s --data $DATA > $OUT/lt-$b-$round.json 2> $OUT/lt-$b-$round.err
    echo "loadtest $b round $round: $(grep -o '"completions_per_second": [0-9.]*' $OUT/lt-$b-$round.json) $(grep -o '"median_per_second": [0-9.]*' $OUT/lt-$b-$round.json) $(grep -o '"coord_peak_rss_mib": [0-9.]*' $OUT/lt-$b-$round.json)"
    rm -rf $DATA
  done
done
uptime
