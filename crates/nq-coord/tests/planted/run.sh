#!/usr/bin/env bash
# Shows that the simulations bite: plants each bug of this folder in turn
# (`git apply` on the checkout, reverted afterwards, even on Ctrl-C), runs
# the simulations (`cargo test -p nq-coord --lib sim::core`, then
# `sim::engine` only if the core's did not catch it; debug, as CI), and
# prints whether they caught it, in which test, the seed and the step of the
# failing scenario, and how many scenarios and steps passed before it.
# Not in CI: it rebuilds nq-coord once per bug.
#
#   bash crates/nq-coord/tests/planted/run.sh            # every bug
#   bash crates/nq-coord/tests/planted/run.sh NAME...    # some of them
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(git -C "$here" rev-parse --show-toplevel)
cd "$root"
if ! git diff --quiet -- crates/nq-coord/src; then
    echo "run.sh: crates/nq-coord/src has uncommitted changes; commit or stash them first (each bug is applied to the checkout and reverted)" >&2
    exit 2
fi
patches=()
if (($#)); then
    for name in "$@"; do patches+=("$here/$name.patch"); done
else
    patches=("$here"/*.patch)
fi
applied=""
revert() { if [[ -n $applied ]]; then git apply -R "$applied"; applied=""; fi; }
trap revert EXIT INT TERM
printf '| %-31s | %-6s | %-34s | %-6s | %-5s | %-17s | %-13s |\n' \
    "planted bug" caught test seed step "scenarios before" "steps before"
printf '|%s|\n' "---------------------------------|--------|------------------------------------|--------|-------|-------------------|---------------"
for patch in "${patches[@]}"; do
    name=$(basename "$patch" .patch)
    git apply "$patch"
    applied=$patch
    # The core simulation first (thousands of scenarios a second), the
    # engine's over real sled only if the core's did not catch the bug.
    out=$(cargo test -q -p nq-coord --lib sim::core 2>&1 || true)
    if ! grep -q 'SIM FAILURE' <<<"$out" && ! grep -q '^error' <<<"$out"; then
        out=$(cargo test -q -p nq-coord --lib sim::engine 2>&1 || true)
    fi
    revert
    line=$(grep -m1 'SIM FAILURE' <<<"$out" || true)
    if [[ $line =~ test=([a-z_]+)\ seed=([0-9]+)\ step=([0-9]+)\ scenarios_passed=([0-9]+)\ total_steps_before=([0-9]+) ]]; then
        printf '| %-31s | %-6s | %-34s | %-6s | %-5s | %-17s | %-13s |\n' "$name" yes \
            "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}" "${BASH_REMATCH[3]}" "${BASH_REMATCH[4]}" "${BASH_REMATCH[5]}"
        echo "    ${line#*: }" | cut -c1-200
    elif [[ $line =~ test=([a-z_]+): ]]; then
        printf '| %-31s | %-6s | %-34s | %-6s | %-5s | %-17s | %-13s |\n' "$name" yes "${BASH_REMATCH[1]}" - - "all" -
        echo "    ${line#*: }" | cut -c1-200
    elif grep -q '^error' <<<"$out"; then
        printf '| %-31s | %-6s | %-34s | %-6s | %-5s | %-17s | %-13s |\n' "$name" BUILD - - - - -
        grep -m3 '^error' <<<"$out" | sed 's/^/    /'
    else
        printf '| %-31s | %-6s | %-34s | %-6s | %-5s | %-17s | %-13s |\n' "$name" NO - - - - -
    fi
done
