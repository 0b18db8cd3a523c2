#!/usr/bin/env bash
# How the search grows with N, per kernel, and what that projects for a record
# run: single-thread `nq count N --threads 1 --kernel K --json` for every
# kernel this CPU runs and N = NMIN..NMAX, timed in on-CPU seconds (user +
# system of the process, from bash's `time`, so a busy machine's other
# processes do not count), then the node and time ratios per step N -> N+1,
# a least-squares fit of ln(ratio) against N, and the projection of nodes and
# core-seconds to the TARGETS (default N = 27 and 28). docs/record-runs.md
# explains the method and records a run of this script.
#
#   bash tests/bench/growth.sh [NMIN] [NMAX]          (default 14 19)
#   bash tests/bench/growth.sh --analyse RESULTS.tsv  (fit a saved run again)
#
# Environment:
#   NQ_GROWTH_KERNELS  kernels to time, space-separated (default: every one of
#                      scalar avx2 avx512 neon that this CPU runs)
#   NQ_GROWTH_REPS     runs per (N, kernel) shorter than 30 CPU-seconds; the
#                      minimum counts (default 3; longer runs are timed once)
#   NQ_GROWTH_TARGETS  the N to project to (default "27 28")
#   NQ_GROWTH_OUT      where to save the raw results (default: a temporary
#                      file, printed at the end)
#
# Needs bash, awk and a Rust toolchain; nothing x86-specific, so it runs
# unchanged on aarch64 (where it times `scalar` and `neon`). The total of every
# run is checked against the published count, and the node counts of all
# kernels must agree at every N (nq-core gives `nodes` one meaning on every
# kernel), or the script stops.
set -euo pipefail
cd "$(dirname "$0")/../.."

targets=${NQ_GROWTH_TARGETS:-27 28}
reps=${NQ_GROWTH_REPS:-3}

# Published Q(N) (OEIS A000170), used only to back-test the fit: the same fit,
# made on the published counts of NMIN..NMAX, is extrapolated to N = 27 and
# compared with the published Q(27), which says how far such a projection can
# be trusted over that many steps. The same values are in
# crates/nq-core/src/published.rs.
published_q() {
    cat <<'EOF'
8 92
9 352
10 724
11 2680
12 14200
13 73712
14 365596
15 2279184
16 14772512
17 95815104
18 666090624
19 4968057848
20 39029188884
21 314666222712
22 2691008701644
23 24233937684440
24 227514171973736
25 2207893435808352
26 22317699616364044
27 234907967154122528
EOF
}

# Reads the raw results (kernel n cpu_s user_s sys_s wall_s nodes total) and
# prints the tables, the ratios, the fits and the projections.
analyse() {
    local results=$1
    awk -v targets="$targets" -v pubfile=<(published_q) '
    function fit(xs, ys, m,    i, sx, sy, sxx, sxy, d) {
        # Least squares y = A + B x over m points; sets A, B, RSD (the
        # residual standard deviation of y, with m - 2 degrees of freedom)
        # and SEB (the standard error of B).
        sx = sy = sxx = sxy = 0
        for (i = 1; i <= m; i++) { sx += xs[i]; sy += ys[i]; sxx += xs[i]^2; sxy += xs[i] * ys[i] }
        d = m * sxx - sx * sx
        B = (m * sxy - sx * sy) / d
        A = (sy - B * sx) / m
        RSS = 0
        for (i = 1; i <= m; i++) RSS += (ys[i] - A - B * xs[i])^2
        RSD = (m > 2) ? sqrt(RSS / (m - 2)) : 0
        SEB = (m > 2) ? sqrt(RSS / (m - 2) * m / d) : 0
        SXX = sxx - sx * sx / m
        MX = sx / m
    }
    function project(last, from, to,    k, v) {
        # Multiplies `last` (the value at `from`) by the fitted ratios
        # exp(A + B k) for k = from .. to - 1.
        v = last
        for (k = from; k < to; k++) v *= exp(A + B * k)
        return v
    }
    function logband(from, to, m,    k, s) {
        # One standard error of ln(projection / value at `from`): the sum of
        # the fitted ln ratios over the steps, each carrying the fit error
        # RSD * sqrt(1/m + (k - mean)^2 / Sxx), summed as fully correlated
        # (the conservative choice: every step shares the same A and B).
        s = 0
        for (k = from; k < to; k++) s += RSD * sqrt(1 / m + (k - MX)^2 / SXX)
        return s
    }
    BEGIN {
        while ((getline line < pubfile) > 0) { split(line, f, " "); pubq[f[1]] = f[2] }
        nt = split(targets, tg, " ")
        year = 365.25 * 86400
    }
    {
        k = $1; n = $2 + 0
        if (!(k in seen)) { seen[k] = 1; kern[++nk] = k }
        cpu[k, n] = $3; nodes[k, n] = $7; total[n] = $8
        if (nmin == "" || n < nmin) nmin = n
        if (nmax == "" || n > nmax) nmax = n
    }
    END {
        if (nk == 0) { print "no results" > "/dev/stderr"; exit 1 }
        for (n = nmin; n <= nmax; n++)
            for (i = 1; i <= nk; i++)
                if (nodes[kern[i], n] != nodes[kern[1], n]) {
                    printf "node counts differ at N = %d: %s %s, %s %s\n", n, kern[1], nodes[kern[1], n], kern[i], nodes[kern[i], n] > "/dev/stderr"
                    exit 1
                }
        k1 = kern[1]

        print ""
        print "## On-CPU seconds and rates, one thread"
        printf "%3s %16s %15s", "N", "nodes", "Q(N)"
        for (i = 1; i <= nk; i++) printf " %10s %9s", kern[i] " s", "Mnode/s"
        printf "\n"
        for (n = nmin; n <= nmax; n++) {
            printf "%3d %16.0f %15.0f", n, nodes[k1, n], total[n]
            for (i = 1; i <= nk; i++) printf " %10.3f %9.1f", cpu[kern[i], n], nodes[k1, n] / cpu[kern[i], n] / 1e6
            printf "\n"
        }

        print ""
        print "## Ratios per step N -> N+1"
        printf "%7s %8s %8s %8s", "step", "nodes", "Q", "nodes/Q"
        for (i = 1; i <= nk; i++) printf " %9s", kern[i] " t"
        printf "\n"
        for (n = nmin; n < nmax; n++) {
            rn = nodes[k1, n + 1] / nodes[k1, n]; rq = total[n + 1] / total[n]
            printf "%3d->%-3d %8.4f %8.4f %8.4f", n, n + 1, rn, rq, nodes[k1, n + 1] / total[n + 1] / (nodes[k1, n] / total[n])
            for (i = 1; i <= nk; i++) printf " %9.4f", cpu[kern[i], n + 1] / cpu[kern[i], n]
            printf "\n"
        }

        # Fit 1: ln(nodes ratio) = A + B N over the measured steps.
        m = 0
        for (n = nmin; n < nmax; n++) { m++; xs[m] = n; ys[m] = log(nodes[k1, n + 1] / nodes[k1, n]) }
        fit(xs, ys, m)
        fa = A; fb = B; frsd = RSD; fseb = SEB; fm = m; fsxx = SXX; fmx = MX
        print ""
        printf "## Fit: ln(nodes(N+1)/nodes(N)) = A + B*N over the %d steps %d->%d .. %d->%d\n", m, nmin, nmin + 1, nmax - 1, nmax
        printf "A = %.5f, B = %.5f (standard error %.5f), residual sd of ln ratio = %.5f\n", A, B, SEB, RSD
        printf "%7s %9s %9s %10s\n", "step", "measured", "fitted", "residual"
        for (i = 1; i <= m; i++)
            printf "%3d->%-3d %9.4f %9.4f %+9.2f%%\n", xs[i], xs[i] + 1, exp(ys[i]), exp(A + B * xs[i]), (exp(ys[i] - A - B * xs[i]) - 1) * 100
        printf "fitted ratio at later steps:"
        for (n = nmax; n < tg[nt]; n++) printf " %d->%d %.3f;", n, n + 1, exp(A + B * n)
        printf "\n"

        print ""
        print "## Projection (fit on the node ratios above; rate = nodes per CPU-second at N = " nmax ")"
        printf "%3s %11s %8s", "N", "nodes", "+-1se"
        for (i = 1; i <= nk; i++) printf " %14s", kern[i] " core-yr"
        printf "\n"
        for (j = 1; j <= nt; j++) {
            t = tg[j]
            A = fa; B = fb; RSD = frsd; SXX = fsxx; MX = fmx
            pn = project(nodes[k1, nmax], nmax, t)
            band = exp(logband(nmax, t, fm))
            printf "%3d %11.3e %7.2fx", t, pn, band
            for (i = 1; i <= nk; i++) {
                rate = nodes[k1, nmax] / cpu[kern[i], nmax]
                printf " %14.1f", pn / rate / year
            }
            printf "\n"
        }
        printf "(+-1se: the projection is within this factor either way at one standard error of the fit)\n"

        # Fit 2: the same fit on each kernel'"'"'s time ratios, projected from
        # its own time at NMAX (includes any drift of the rate with N).
        print ""
        print "## Projection from each kernel'"'"'s own time ratios (same fit form)"
        print "(fitted only on steps that start at 0.1 CPU-second or more: below that, process start-up and"
        print "the start-up kernel check, about 5 ms, distort the ratios; no error band under 5 steps)"
        for (i = 1; i <= nk; i++) {
            m = 0
            for (n = nmin; n < nmax; n++)
                if (cpu[kern[i], n] >= 0.1) { m++; xs[m] = n; ys[m] = log(cpu[kern[i], n + 1] / cpu[kern[i], n]) }
            if (m < 3) { printf "%-7s only %d steps start at 0.1 CPU-second or more: no fit\n", kern[i], m; continue }
            fit(xs, ys, m)
            printf "%-7s %d steps from N = %d, A = %.4f, B = %.5f, residual sd %.4f:", kern[i], m, xs[1], A, B, RSD
            for (j = 1; j <= nt; j++) {
                t = tg[j]
                if (m >= 5) printf " N=%d %.1f core-years (x%.2f);", t, project(cpu[kern[i], nmax], nmax, t) / year, exp(logband(nmax, t, m))
                else printf " N=%d %.1f core-years;", t, project(cpu[kern[i], nmax], nmax, t) / year
            }
            printf "\n"
        }

        # Fit 3: nodes per solution, ln(nodes/Q) = A + B N, times the
        # published Q(27); Q(28) is not known, so it is projected from the
        # published Q ratios of N = 20..27 with the same ratio fit.
        m = 0
        for (n = nmin; n <= nmax; n++) { m++; xs[m] = n; ys[m] = log(nodes[k1, n] / total[n]) }
        fit(xs, ys, m)
        ca = A; cb = B; crsd = RSD; cm = m; csxx = SXX; cmx = MX
        m = 0
        for (n = 20; n < 27; n++) { m++; xs[m] = n; ys[m] = log(pubq[n + 1] / pubq[n]) }
        fit(xs, ys, m)
        q28 = pubq[27] * exp(A + B * 27)
        print ""
        printf "## Cross-check: nodes per solution, ln(nodes/Q) = %.4f + %.5f N (fit on N = %d..%d, residual sd %.4f)\n", ca, cb, nmin, nmax, crsd
        printf "Q(27) published %.4e; Q(28) projected %.4e (published Q ratios 20->21..26->27 fitted the same way: ratio 27->28 = %.4f, residual sd %.4f)\n", pubq[27], q28, exp(A + B * 27), RSD
        for (j = 1; j <= nt; j++) {
            t = tg[j]
            q = (t == 27) ? pubq[27] : (t == 28 ? q28 : 0)
            if (q == 0) continue
            pn = q * exp(ca + cb * t)
            # One standard error of the fitted ln s at t (a level, not a
            # product of ratios, so the band grows only linearly with distance).
            printf "N=%d: nodes %.3e (%.1f nodes per solution, +-1se x%.3f)", t, pn, exp(ca + cb * t), exp(crsd * sqrt(1 / cm + (t - cmx)^2 / csxx))
            for (i = 1; i <= nk; i++) printf "; %s %.1f core-years", kern[i], pn / (nodes[k1, nmax] / cpu[kern[i], nmax]) / year
            printf "\n"
        }

        # Back-test: the same ratio fit on the published Q of the measured
        # range, extrapolated to 27, against the published Q(27).
        m = 0
        for (n = nmin; n < nmax; n++) { m++; xs[m] = n; ys[m] = log(pubq[n + 1] / pubq[n]) }
        fit(xs, ys, m)
        bt = project(pubq[nmax], nmax, 27)
        print ""
        printf "## Back-test of the method: ln(Q ratio) fitted on published Q(%d..%d), projected to 27\n", nmin, nmax
        printf "projected Q(27) %.4e, published %.4e: projection / published = %.3f (one-se band x%.2f)\n", bt, pubq[27], bt / pubq[27], exp(logband(nmax, 27, m))
    }' "$results"
}

if [[ ${1:-} == --analyse ]]; then
    [[ -f ${2:-} ]] || { echo "usage: $0 --analyse RESULTS.tsv (a file saved by a run of this script)" >&2; exit 2; }
    analyse "$2"
    exit 0
fi

nmin=${1:-14}
nmax=${2:-19}
if ! [[ $nmin =~ ^[0-9]+$ && $nmax =~ ^[0-9]+$ ]] || ((nmin < 8 || nmax > 27 || nmax - nmin < 3)); then
    echo "NMIN and NMAX must be whole numbers with 8 <= NMIN, NMAX <= 27 and at least 3 steps between them (got '$nmin' '$nmax')" >&2
    exit 2
fi

cargo build --release -q -p nq-cli
nq=target/release/nq
out=${NQ_GROWTH_OUT:-$(mktemp "${TMPDIR:-/tmp}/nq-growth.XXXXXX")}
: >"$out"
errfile=$(mktemp)
trap 'rm -f "$errfile" "$errfile.json"' EXIT

if [[ -n ${NQ_GROWTH_KERNELS:-} ]]; then
    read -ra kernels <<<"$NQ_GROWTH_KERNELS"
else
    # nq refuses (exit 2) a kernel this CPU cannot run: keep the ones it takes.
    kernels=()
    for k in scalar avx2 avx512 neon; do
        if "$nq" count 8 --threads 1 --kernel "$k" >/dev/null 2>&1; then kernels+=("$k"); fi
    done
fi

echo "# nq growth bench, $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "# CPU: $(lscpu 2>/dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -1) ($(uname -m), $(nproc) CPUs)"
if commit=$(git rev-parse --short HEAD 2>/dev/null); then
    git diff --quiet HEAD -- crates || commit+=" (crates/ modified)"
else
    commit="unknown (not a git checkout)"
fi
echo "# commit: $commit"
echo "# load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# kernels: ${kernels[*]}; N = $nmin..$nmax; runs per point under 30 CPU-s: $reps (minimum kept)"
echo "# raw results: $out"
printf '%-7s %3s %10s %10s %8s %10s %16s %14s\n' kernel N cpu_s user_s sys_s wall_s nodes total

# Times one count; sets user, sys, wall and the JSON line in `json`.
time_one() {
    local n=$1 k=$2 t
    local TIMEFORMAT='%3U %3S %3R'
    t=$({ time "$nq" count "$n" --threads 1 --kernel "$k" --json >"$errfile.json" 2>"$errfile"; } 2>&1) || {
        echo "nq count $n --kernel $k failed:" >&2
        cat "$errfile" "$errfile.json" >&2
        exit 1
    }
    read -r user sys wall <<<"$t"
    json=$(cat "$errfile.json")
    rm -f "$errfile.json"
}

# Pulls a numeric field out of nq's one-line JSON.
field() { sed -n "s/.*\"$1\":\([0-9.]*\).*/\1/p" <<<"$json"; }

for ((n = nmin; n <= nmax; n++)); do
    # Kernels interleaved per N, so that a change in the machine's load hits
    # all of them alike.
    for k in "${kernels[@]}"; do
        best=
        for ((r = 0; r < reps; r++)); do
            time_one "$n" "$k"
            grep -q '"published_match":true' <<<"$json" || {
                echo "N = $n on $k does not match the published count: $json" >&2
                exit 1
            }
            cpu=$(awk -v u="$user" -v s="$sys" 'BEGIN { printf "%.3f", u + s }')
            if [[ -z $best ]] || awk -v a="$cpu" -v b="$best" 'BEGIN { exit !(a < b) }'; then
                best=$cpu bu=$user bs=$sys bw=$wall
                nodes=$(field nodes) total=$(field total)
            fi
            # A long run is timed once: its noise is small against its length.
            awk -v c="$cpu" 'BEGIN { exit !(c >= 30) }' && break
        done
        line=$(printf '%-7s %3d %10s %10s %8s %10s %16s %14s' "$k" "$n" "$best" "$bu" "$bs" "$bw" "$nodes" "$total")
        echo "$line"
        echo "$line" >>"$out"
    done
done
echo "# load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"

analyse "$out"
echo ""
echo "# raw results kept in $out (bash $0 --analyse $out fits them again)"
