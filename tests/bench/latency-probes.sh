# Sourced by the bench scripts that time status and metrics (record-1e8.sh,
# status-latency.sh): one probe each, in milliseconds, or "fail". They read
# $bin, the directory of the release nq-coord.

curl_ms() { # curl_ms URL: curl's time to the whole answer
  local t
  if t=$(curl -sf -o /dev/null --max-time 10 -w '%{time_total}' "$1" 2>/dev/null); then
    awk -v t="$t" 'BEGIN {printf "%.0f\n", t * 1000}'
  else
    echo fail
  fi
}

status_ms() { # status_ms ADDR: `nq-coord status` (the whole command)
  local t0 t1
  t0=$(date +%s%N)
  if "$bin/nq-coord" status --connect "$1" --json --timeout 10s >/dev/null 2>&1; then
    t1=$(date +%s%N)
    echo $(((t1 - t0) / 1000000))
  else
    echo fail
  fi
}
