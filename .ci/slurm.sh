#!/usr/bin/env bash
# Runs deploy/slurm/nq.sbatch on a real Slurm cluster started on this machine.
#
#   .ci/slurm.sh
#
# Installs Debian's Slurm and MUNGE when missing, starts munged, slurmctld
# and two slurmd (two Slurm nodes, nq1 and nq2, on this one host, so that
# "one worker per node" is what really runs), all on 127.0.0.1 and in a
# temporary directory, then:
#
#   1. sbatch N=12 on both nodes and checks the exact counts in the output,
#      and the token the job made: DATA_DIR.token, mode 0600, 64 hex digits,
#      never printed;
#   2. sbatch N=18; while it runs, `nq-coord status` is refused without the
#      token and answered with it, and no process has the token on its
#      command line; then sends the time-limit warning signal of
#      `--signal=B:USR1@..` midway, and checks that the workers drain, the
#      job requeues itself, and the second start restores exactly the
#      finished jobs recorded by the first (with the same token);
#   3. cancels that second start midway (SIGTERM to every process, as for a
#      preemption), resubmits, and checks that the new job resumes the same
#      data directory and ends with the exact counts;
#   4. resubmits on the finished directory and checks that it prints the
#      stored result;
#   5. submits a job array, N = the task id, and checks both counts.
#
# Every daemon is stopped by pid on exit, on failure too. The run directory
# is removed after a pass (kept with NQ_SLURM_CI_KEEP=1, or after a failure,
# until the next run). Run as root (the daemons run as root, SlurmUser=root).
# Prints `slurm.sh: PASS` or `slurm.sh: FAIL: why` last and exits non-zero on
# failure.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
started=$SECONDS

say() { echo "slurm.sh: $*"; }
# The summary, printed last by the exit trap once it is set up.
summary=""
fail() {
    summary="FAIL: $*"
    [[ -n ${run:-} ]] || say "$summary"
    exit 1
}

[[ $(id -u) == 0 ]] || fail "must run as root (the Slurm daemons run as root here)"

# Every run lives in a directory under one parent, so that a later run can
# find and stop what an earlier, killed run left behind.
base=${TMPDIR:-/tmp}/nq-slurm-ci
mkdir -p "$base"
chmod 755 "$base"

# The proof that a process is ours: every process this script starts (the
# daemons, and through sbatch's environment every job process) carries
# NQ_SLURM_CI_RUN=<its run directory> in its environment. The script itself
# does not (it would find and stop itself).
pids_of_run() {
    { grep -lszxF "NQ_SLURM_CI_RUN=$1" /proc/[0-9]*/environ || true; } | cut -d/ -f3
}

# Stops every process of the run in $1: the daemons by their pid files first
# (so that nothing restarts job steps), then anything else it started.
stop_run() {
    local dir=$1 f pid left i
    for f in "$dir"/pids/slurmd-*.pid "$dir"/pids/slurmctld.pid "$dir"/pids/munged.pid; do
        [[ -s $f ]] || continue
        pid=$(<"$f")
        # A pid file can outlive its process and the pid be reused: check the
        # marker before signalling.
        if grep -qszxF "NQ_SLURM_CI_RUN=$dir" "/proc/$pid/environ"; then
            kill -TERM "$pid" 2>/dev/null || true
        fi
    done
    for i in $(seq 50); do
        left=$(pids_of_run "$dir")
        [[ -z $left ]] && return 0
        # After 2 s, the daemons had their chance: stop what is left (job
        # steps whose slurmd is gone) too.
        if ((i == 10)); then
            # shellcheck disable=SC2086 # one pid per word
            kill -TERM $left 2>/dev/null || true
        elif ((i == 40)); then
            # shellcheck disable=SC2086
            kill -KILL $left 2>/dev/null || true
        fi
        sleep 0.2
    done
    say "warning: processes of $dir still running: $(pids_of_run "$dir" | tr '\n' ' ')"
}

# Runs of this script that were killed before their cleanup.
for old in "$base"/run.*; do
    [[ -d $old ]] || continue
    owner=$(cat "$old/owner.pid" 2>/dev/null || true)
    # Its owner is alive if that pid is still a slurm.sh (a reused pid at
    # worst delays the cleanup to a later run).
    if [[ -n $owner ]] && tr '\0' ' ' 2>/dev/null <"/proc/$owner/cmdline" | grep -q 'slurm\.sh'; then
        say "skipping $old: its run (pid $owner) is still going"
        continue
    fi
    say "cleaning up an earlier run: $old"
    stop_run "$old"
    rm -rf "$old"
done

result=1
run=$(mktemp -d "$base/run.XXXXXX")
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    stop_run "$run"
    if ((result == 0 && rc == 0)) && [[ -z ${NQ_SLURM_CI_KEEP:-} ]]; then
        rm -rf "$run"
    else
        say "kept $run (logs/, jobs/) for inspection; the next run removes it"
    fi
    ((rc == 0 && result == 0)) || [[ $summary == FAIL* ]] || summary="FAIL: exit status $rc"
    say "$summary"
    exit "$rc"
}
trap cleanup EXIT
echo $$ >"$run/owner.pid"
mark=(env "NQ_SLURM_CI_RUN=$run")
# munged wants every directory on the way to its socket searchable by all.
chmod 755 "$run"
mkdir -p "$run"/{munge,pids,logs,state,spool/nq1,spool/nq2,jobs,shared}
trap 'fail "interrupted"' INT TERM

on_failure_show() {
    local f
    for f in "$run"/jobs/*.out "$run"/logs/*.log; do
        [[ -f $f ]] || continue
        echo "----- $f (last 25 lines)"
        tail -n 25 "$f"
    done
}

# --- Slurm and MUNGE from the distribution -----------------------------------
t=$SECONDS
export PATH=$PATH:/usr/sbin
missing=()
for c in sbatch srun scontrol scancel sinfo slurmctld slurmd munged; do
    command -v "$c" >/dev/null 2>&1 || missing+=("$c")
done
if ((${#missing[@]})); then
    say "installing slurm-wlm and munge (missing: ${missing[*]})"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq || fail "apt-get update failed"
    apt-get install -y -qq --no-install-recommends slurm-wlm munge >"$run/logs/apt.log" 2>&1 ||
        { tail -n 20 "$run/logs/apt.log"; fail "apt-get install slurm-wlm munge failed"; }
fi
version=$(slurmctld -V)
say "$version, $(munged -V 2>&1 | head -n1) ready in $((SECONDS - t)) s"

# --- nq binaries ---------------------------------------------------------------
t=$SECONDS
cargo build -q --locked -p nq-coord -p nq-worker
bin=${CARGO_TARGET_DIR:-$repo/target}/debug
[[ -x $bin/nq-coord && -x $bin/nq-worker ]] || fail "no nq-coord and nq-worker in $bin after cargo build"
say "nq binaries ready in $((SECONDS - t)) s ($bin)"

# --- the cluster ---------------------------------------------------------------
t=$SECONDS
# A port nobody listens on. Another process could take it before the daemon
# binds; the daemon would then fail to start and the wait below says so.
free_port() {
    local p
    while :; do
        p=$((20000 + RANDOM % 40000))
        (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || {
            echo "$p"
            return
        }
    done
}
ctld_port=$(free_port)
d1_port=$(free_port)
d2_port=$(free_port)
while [[ $d2_port == "$d1_port" || $d2_port == "$ctld_port" || $d1_port == "$ctld_port" ]]; do
    d1_port=$(free_port)
    d2_port=$(free_port)
done

# A fresh random key: nothing outside this run can talk to this cluster.
head -c 1024 /dev/urandom >"$run/munge/munge.key"
chmod 400 "$run/munge/munge.key"
socket=$run/munge/munge.socket
"${mark[@]}" munged --socket="$socket" --key-file="$run/munge/munge.key" \
    --pid-file="$run/pids/munged.pid" --log-file="$run/logs/munged.log" \
    --seed-file="$run/munge/munged.seed" ||
    { on_failure_show; fail "munged did not start"; }

host=$(hostname -s 2>/dev/null || uname -n)
host=${host%%.*}
export SLURM_CONF=$run/slurm.conf
# Facts from trials in this sandbox: no cgroup.conf (22.05 has no
# CgroupPlugin=disabled; slurmd fails on it), proctrack/linuxproc and
# task/none. Everything on 127.0.0.1. Two Slurm nodes on this one host (the
# Debian build allows several slurmd, each with its own -N and port), one
# CPU each: slurmd warns that the hardware has more, which is harmless.
cat >"$SLURM_CONF" <<EOF
ClusterName=nqci
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$d1_port
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$socket,cred_expire=10
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$run/state
SlurmdSpoolDir=$run/spool/%n
SlurmctldPidFile=$run/pids/slurmctld.pid
SlurmdPidFile=$run/pids/slurmd-%n.pid
SlurmctldLogFile=$run/logs/slurmctld.log
SlurmdLogFile=$run/logs/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
KillWait=10
NodeName=nq1 NodeHostname=$host NodeAddr=127.0.0.1 Port=$d1_port CPUs=1
NodeName=nq2 NodeHostname=$host NodeAddr=127.0.0.1 Port=$d2_port CPUs=1
PartitionName=ci Nodes=nq1,nq2 Default=YES MaxTime=INFINITE State=UP
EOF

"${mark[@]}" slurmctld -f "$SLURM_CONF" || { on_failure_show; fail "slurmctld did not start"; }
"${mark[@]}" slurmd -f "$SLURM_CONF" -N nq1 || { on_failure_show; fail "slurmd nq1 did not start"; }
"${mark[@]}" slurmd -f "$SLURM_CONF" -N nq2 || { on_failure_show; fail "slurmd nq2 did not start"; }

# wait_until WHAT SECONDS COMMAND...: runs COMMAND until it succeeds; fails
# the test with WHAT if it has not after SECONDS.
wait_until() {
    local what=$1 limit=$2 deadline=$((SECONDS + $2))
    shift 2
    until "$@"; do
        if ((SECONDS >= deadline)); then
            on_failure_show
            fail "timed out after ${limit}s waiting for $what"
        fi
        sleep 0.2
    done
}
nodes_idle() { [[ $(sinfo -h -N -p ci -o '%N %t' 2>/dev/null | sort | tr '\n' ' ') == "nq1 idle nq2 idle " ]]; }
wait_until "nodes nq1 and nq2 idle" 60 nodes_idle
say "cluster up in $((SECONDS - t)) s: slurmctld on 127.0.0.1:$ctld_port, slurmd nq1 :$d1_port, nq2 :$d2_port"

# --- helpers for jobs ----------------------------------------------------------
# What the published table says: crates/nq-core/src/published.rs, the same
# table the binaries check against (used to check, never to produce, counts).
published() {
    sed -n '/^const PUBLISHED/,/^];/p' crates/nq-core/src/published.rs |
        grep -oE '\([0-9]+, [0-9]+\)' | sed -n "${1}p" | tr -d '(),'
}

job_field() { scontrol show job "$1" -o 2>/dev/null | grep -o "\b$2=[^ ]*" | head -n1 | cut -d= -f2; }
job_state() { job_field "$1" JobState; }
job_ended() {
    case $(job_state "$1") in
        COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE | PREEMPTED) return 0 ;;
        *) return 1 ;;
    esac
}
out_of() { echo "$run/jobs/nq-$1.out"; }
has_line() { [[ -f $1 ]] && grep -qE "$2" "$1"; }
count_lines() { if [[ -f $1 ]]; then grep -cE "$2" "$1" || true; else echo 0; fi; }
# last_match FILE ERE: the last match of ERE in FILE, or nothing.
last_match() { grep -oE "$2" "$1" 2>/dev/null | tail -n 1 || true; }
# first_number FILE ERE: the number that ends the first match of ERE.
first_number() { { grep -oE "$2" "$1" 2>/dev/null || true; } | head -n 1 | grep -oE '[0-9]+$' || true; }
# progressed_past FILE K: the latest progress line has more than K jobs done.
progressed_past() {
    local last
    last=$(last_match "$1" 'progress jobs_done=[0-9]+')
    last=${last##*=}
    [[ -n $last ]] && ((last > $2))
}
interrupted_count() { count_lines "$1" '^n=[0-9]+ status=interrupted '; }
restarts_is_1_and_pending() { [[ $(job_field "$1" Restarts) == 1 && $(job_state "$1") == PENDING ]]; }
more_interrupted_than() { (($(interrupted_count "$1") > $2)); }

# submit N DATA [sbatch options...]: the real script, as a user would submit
# it, plus what this sandbox needs: the binaries from target/ and loopback
# only. Prints the job id.
submit() {
    local n=$1 data=$2
    shift 2
    NQ_SLURM_CI_RUN=$run NQ_BIN=$bin NQ_LISTEN=127.0.0.1:0 NQ_COORD_HOST=127.0.0.1 \
        NQ_COORD_ARGS="--progress-interval 500ms" NQ_GRACE=20s \
        sbatch --parsable --chdir="$run/jobs" --cpus-per-task=1 --time=10 "$@" \
        deploy/slurm/nq.sbatch "$n" "$data"
}

# check_result JOB N [OUTPUT]: the output's last line is the exact, complete
# result, and the job completed with exit code 0.
check_result() {
    local job=$1 n=$2 out=${3:-$(out_of "$1")} last want total unique
    read -r total unique <<<"$(published "$n")"
    [[ -n $total ]] || fail "no published count for N=$n in crates/nq-core/src/published.rs"
    last=$(tail -n 1 "$out")
    want="^n=$n status=complete total=$total unique=$unique .* published=match$"
    [[ $last =~ $want ]] || {
        on_failure_show
        fail "job $job: last line of $out is '$last'; expected total=$total unique=$unique (OEIS)"
    }
    [[ $(job_state "$job") == COMPLETED && $(job_field "$job" ExitCode) == 0:0 ]] ||
        fail "job $job ended $(job_state "$job") with exit code $(job_field "$job" ExitCode)"
    say "job $job: $last"
}

# --- 1. N=12 on two nodes ------------------------------------------------------
t=$SECONDS
job=$(submit 12 "$run/shared/nq-12.sled") || fail "sbatch failed"
wait_until "job $job (N=12) to end" 120 job_ended "$job"
check_result "$job" 12
out=$(out_of "$job")
for node in nq1 nq2; do
    has_line "$out" "name=$node\}?:? .*worker registered" ||
        { on_failure_show; fail "job $job: no worker from node $node registered"; }
done
# The token the script made for the run (deploy/slurm/nq.sbatch).
check_token_file() {
    local file=$1 out=$2 mode
    [[ -f $file ]] || { on_failure_show; fail "no token file $file beside the data directory"; }
    mode=$(stat -c %a "$file")
    [[ $mode == 600 ]] || fail "$file has mode $mode, expected 600 (readable by the job's user only)"
    [[ $(<"$file") =~ ^[0-9a-f]{64}$ ]] || fail "$file does not hold 64 hex digits"
    grep -qF -f "$file" "$out" && fail "the token of $file is printed in $out"
    return 0
}
check_token_file "$run/shared/nq-12.sled.token" "$out"
has_line "$out" "token: made $run/shared/nq-12.sled.token" || { on_failure_show; fail "job $job: no 'token: made' line"; }
say "1. N=12 on nq1 and nq2: exact in $((SECONDS - t)) s; token in nq-12.sled.token, mode 600"

# --- 2. the time-limit signal: drain, requeue, resume ---------------------------
# N=18: with the faster kernels of issue 10 a debug-build N=17 run ends in
# about a second, before steps 2 and 3 can stop it midway.
t=$SECONDS
data=$run/shared/nq-18.sled
job=$(submit 18 "$data") || fail "sbatch failed"
out=$(out_of "$job")
# Stop it once some jobs are done: a progress line with jobs_done > 0.
wait_until "job $job to finish some work" 120 has_line "$out" 'progress jobs_done=[1-9]'
# While it runs: the coordinator answers only with the run's token.
token_file=$data.token
check_token_file "$token_file" "$out"
cmp -s "$token_file" "$run/shared/nq-12.sled.token" && fail "the runs N=12 and N=18 share a token"
addr=$(last_match "$out" 'workers dial [0-9.]+:[0-9]+')
addr=${addr#workers dial }
[[ -n $addr ]] || { on_failure_show; fail "job $job: no 'workers dial' line"; }
if status_out=$(env -u NQ_TOKEN "$bin/nq-coord" status --connect "$addr" 2>&1); then
    fail "nq-coord status without the token was answered: $status_out"
fi
grep -qi 'unauthenticated\|token' <<<"$status_out" || fail "nq-coord status without the token failed, but not for the token: $status_out"
NQ_TOKEN=$(<"$token_file") "$bin/nq-coord" status --connect "$addr" >/dev/null 2>&1 ||
    fail "nq-coord status with the token of $token_file was refused"
# The token reached the coordinator and the workers through the environment:
# on no command line of the run's processes (which every user can read).
exposed=$(for p in $(pids_of_run "$run"); do grep -lsF -f "$token_file" "/proc/$p/cmdline" || true; done)
[[ -z $exposed ]] || fail "the token is on the command line of: $exposed"
say "2. token: status refused without it, answered with it; on no command line"
# What Slurm sends the batch shell at the warning time of --signal=B:USR1@T
# (Slurm sends the real one on a coarse timer, "up to 60 seconds earlier
# than specified" says sbatch(1): too coarse for a test).
scancel --batch --signal=USR1 "$job"
wait_until "job $job to requeue itself" 120 restarts_is_1_and_pending "$job"
interrupted=$(last_match "$out" '^n=18 status=interrupted .*')
[[ $interrupted =~ jobs_done=([0-9]+)\  ]] || { on_failure_show; fail "job $job: no interrupted result line"; }
done1=${BASH_REMATCH[1]}
((done1 > 0)) || fail "job $job: interrupted with no job done"
drained=$(count_lines "$out" 'drained: every job is reported or handed back')
[[ $drained == 2 ]] || { on_failure_show; fail "job $job: $drained of 2 workers drained"; }
# Slurm holds a requeued job until its old credential expires (BeginTime,
# cred_expire + 1 s: 11 s with the cred_expire=10 above). Starting it
# earlier by hand raced that expiry ("Job credential revoked").
wait_until "job $job to restart and restore its jobs" 120 \
    has_line "$out" 'restored finished jobs done=[0-9]+ jobs='
restored=$(first_number "$out" 'restored finished jobs done=[0-9]+')
# At least as many: a restart judges every stored copy again, and a job the
# live run held for a probation check that its voter no longer needs (it
# left probation meanwhile) settles on restore. Fewer would be lost work.
((restored >= done1)) || fail "job $job: the first start recorded $done1 finished jobs, the restart restored $restored"
has_line "$out" "token: $token_file \(kept from an earlier job" || { on_failure_show; fail "job $job: the restart did not keep the run's token"; }
say "2. time-limit signal: both workers drained, $done1 jobs done; requeued; restart restored $restored in $((SECONDS - t)) s"

# --- 3. cancelled midway, then resubmitted ---------------------------------------
t=$SECONDS
wait_until "job $job to finish more work after the restart" 120 progressed_past "$out" "$done1"
scancel "$job"
wait_until "job $job to print its result after scancel" 60 more_interrupted_than "$out" 1
wait_until "job $job to end after scancel" 120 job_ended "$job"
[[ $(job_state "$job") == CANCELLED ]] || fail "job $job: $(job_state "$job") after scancel"
interrupted=$(last_match "$out" '^n=18 status=interrupted .*')
[[ $interrupted =~ jobs_done=([0-9]+)\  ]] || { on_failure_show; fail "job $job: no result line after scancel"; }
done2=${BASH_REMATCH[1]}
((done2 > done1)) || fail "job $job: cancelled with $done2 jobs done, no more than the $done1 before"
job2=$(submit 18 "$data") || fail "sbatch failed"
wait_until "job $job2 (N=18, resubmitted) to end" 120 job_ended "$job2"
out2=$(out_of "$job2")
has_line "$out2" "resuming run dir=$data" || { on_failure_show; fail "job $job2 did not resume $data"; }
restored=$(first_number "$out2" 'restored finished jobs done=[0-9]+')
((${restored:-0} >= done2)) || fail "job $job2: the cancelled job recorded $done2 finished jobs, the resubmission restored ${restored:-none}"
check_result "$job2" 18
say "3. scancel at $done2 jobs done; resubmission $job2 restored $restored and finished in $((SECONDS - t)) s"

# --- 4. resubmitted on the finished directory ------------------------------------
t=$SECONDS
final=$(tail -n 1 "$out2")
job3=$(submit 18 "$data") || fail "sbatch failed"
wait_until "job $job3 (N=18, finished directory) to end" 120 job_ended "$job3"
check_result "$job3" 18
# The stored run, not a new computation: the same line but for the last
# digit of `seconds` (the live report rounds the elapsed time, the stored one
# keeps milliseconds).
out3=$(out_of "$job3")
# A finished run is read, not resumed: it binds no port (issue 26).
has_line "$out3" "the run is already finished dir=$data" || { on_failure_show; fail "job $job3 did not find the run in $data finished"; }
has_line "$out3" "(created run|serving workers)" && fail "job $job3 served a new computation"
strip_seconds() { sed -E 's/ seconds=[0-9.]+ / /'; }
[[ $(tail -n 1 "$out3" | strip_seconds) == "$(strip_seconds <<<"$final")" ]] ||
    fail "job $job3 printed '$(tail -n 1 "$out3")', not the stored result '$final'"
say "4. resubmission on the finished directory printed the stored result in $((SECONDS - t)) s"

# --- 5. a job array, one N per task ----------------------------------------------
t=$SECONDS
# From the jobs directory: with no DATA_DIR, each task's data directory is
# nq-N.sled in the submit directory.
array=$(cd "$run/jobs" && NQ_SLURM_CI_RUN=$run NQ_BIN=$bin NQ_LISTEN=127.0.0.1:0 NQ_COORD_HOST=127.0.0.1 \
    sbatch --parsable --cpus-per-task=1 --time=10 --array=10-11 --output=nq-array-%A_%a.out \
    "$repo/deploy/slurm/nq.sbatch") || fail "sbatch --array failed"
array_ended() {
    local states
    states=$(scontrol show job "$array" -o 2>/dev/null | grep -o 'JobState=[A-Z_]*' | sort | uniq -c | tr -s ' ')
    [[ $states == " 2 JobState=COMPLETED" || $states == *FAILED* || $states == *CANCELLED* || $states == *TIMEOUT* ]]
}
wait_until "job array $array (N=10, 11) to end" 120 array_ended
for n in 10 11; do
    task=$(scontrol show job "$array" -o | grep -E "ArrayTaskId=$n " | grep -oE '^JobId=[0-9]+' | cut -d= -f2)
    [[ -n $task ]] || fail "job array $array has no task $n"
    check_result "$task" "$n" "$run/jobs/nq-array-${array}_$n.out"
    [[ -d $run/jobs/nq-$n.sled ]] || fail "array task $n did not keep its run in nq-$n.sled"
done
say "5. job array 10-11: exact in $((SECONDS - t)) s"

result=0
summary="PASS ($version, $((SECONDS - started)) s)"
