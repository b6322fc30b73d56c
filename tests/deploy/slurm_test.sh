#!/usr/bin/env bash
# Integration, issue 15 "deployment with existing tools": deploy/slurm/strata.sbatch runs a
# 4-task pipeline (one strata-stage per Slurm task, TLS 1.3 PSK links) on a single-node
# Slurm cluster that this test starts itself: munged with a fresh key, slurmctld and slurmd
# (one node "strata-node" declaring 4 CPUs, proctrack/linuxproc, task/none, no cgroups,
# SlurmUser root, every state file, socket and log in a temporary directory, random free
# ports), so it never touches a Slurm or munge already on the machine. The job's one-shot
# client must print the golden tokens, and the last stage's --out (tokens + logits) must be
# byte-identical to a single-stage run's. Every daemon is stopped on exit. Skipped with the
# reason where it cannot run: not root, no Slurm/munge binaries (Debian slurmctld, slurmd,
# slurm-client, munge), or daemons that do not come up within 20 s.
set -u
. "$(dirname "$0")/../pipeline/pipeline_lib.sh"
pl_init

skip() {
    echo "skipped: $*"
    exit 0
}

SL_DIR="" SL_PIDS="" SL_JOB=""
sl_cleanup() {
    local p i
    [ -n "$SL_JOB" ] && SLURM_CONF=$SL_DIR/slurm.conf scancel "$SL_JOB" 2>/dev/null
    # Only the daemons this test started, by pid: slurmd first (its job steps end with it).
    for p in $SL_PIDS; do
        kill -TERM "$p" 2>/dev/null
        for ((i = 0; i < 50; i++)); do
            kill -0 "$p" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$p" 2>/dev/null
        wait "$p" 2>/dev/null
    done
    SL_PIDS=""
    pl_cleanup
    [ -n "$SL_DIR" ] && rm -rf "$SL_DIR"
}
trap sl_cleanup EXIT
trap 'sl_cleanup; exit 1' INT TERM

sl_fail() {
    local f
    for f in "$SL_DIR"/*.log "$SL_DIR"/job.out "$SL_DIR"/strata-*.stages.log; do
        [ -f "$f" ] && { echo "---- $f (last 20 lines)"; tail -n 20 "$f"; } >&2
    done
    pl_fail "$@"
}

[ "$(id -u)" = 0 ] || skip "a test Slurm cluster needs root (slurmd runs as root; uid $(id -u))"
for b in munged slurmctld slurmd sbatch scontrol squeue sinfo scancel srun; do
    command -v "$b" >/dev/null 2>&1 ||
        skip "$b not installed (Debian packages munge, slurmctld, slurmd, slurm-client)"
done
SBATCH_SCRIPT="$PL_ROOT/deploy/slurm/strata.sbatch"
[ -f "$SBATCH_SCRIPT" ] || pl_fail "no $SBATCH_SCRIPT"

# free_port: a random TCP port nothing listens on.
free_port() {
    local p i
    for ((i = 0; i < 100; i++)); do
        p=$((20000 + RANDOM % 12000))
        if [ -z "$(ss -Htln "( sport = :$p or sport = :$((p + 1)) or sport = :$((p + 2)) or sport = :$((p + 3)) )")" ]; then
            echo "$p"
            return 0
        fi
    done
    return 1
}

# A short path of its own (the munge socket path must fit in sun_path); munged insists that
# its socket's directory is not writable by others and its key is private.
SL_DIR=$(mktemp -d /tmp/strata-slurm.XXXXXX)
chmod 755 "$SL_DIR"
mkdir -p "$SL_DIR/state" "$SL_DIR/spool" "$SL_DIR/munge" "$SL_DIR/run"
head -c 1024 /dev/urandom >"$SL_DIR/munge/munge.key"
chmod 600 "$SL_DIR/munge/munge.key"
if ! ctld_port=$(free_port) || ! slurmd_port=$(free_port) || ! stage_port=$(free_port); then
    pl_fail "no free ports"
fi
host=$(hostname -s)
export SLURM_CONF="$SL_DIR/slurm.conf"
cat >"$SLURM_CONF" <<CONF
ClusterName=stratatest
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
AuthType=auth/munge
AuthInfo=socket=$SL_DIR/munge/munge.sock
CredType=cred/munge
StateSaveLocation=$SL_DIR/state
SlurmdSpoolDir=$SL_DIR/spool
SlurmctldPidFile=$SL_DIR/run/slurmctld.pid
SlurmdPidFile=$SL_DIR/run/slurmd.pid
SlurmctldLogFile=$SL_DIR/slurmctld.log
SlurmdLogFile=$SL_DIR/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
SlurmdParameters=config_overrides
NodeName=strata-node NodeAddr=127.0.0.1 NodeHostname=$host CPUs=4 State=UNKNOWN
PartitionName=strata Nodes=strata-node Default=YES MaxTime=5 State=UP
CONF

t0=$(date +%s.%N)
munged -F --socket="$SL_DIR/munge/munge.sock" --key-file="$SL_DIR/munge/munge.key" \
    --pid-file="$SL_DIR/run/munged.pid" --seed-file="$SL_DIR/munge/seed" \
    --log-file="$SL_DIR/munged.log" >"$SL_DIR/munged.log" 2>&1 &
munged_pid=$!
SL_PIDS="$munged_pid"
pl_wait_log "$SL_DIR/munged.log" "Created socket" 1 10 || skip "munged did not start: $(tail -n 3 "$SL_DIR/munged.log" | tr '\n' ' ')"
slurmctld -D -i -f "$SLURM_CONF" >"$SL_DIR/slurmctld.out" 2>&1 &
SL_PIDS="$! $SL_PIDS"
slurmd -D -N strata-node -f "$SLURM_CONF" >"$SL_DIR/slurmd.out" 2>&1 &
SL_PIDS="$! $SL_PIDS"
for ((i = 0; i < 100; i++)); do
    state=$(sinfo -h -n strata-node -o %t 2>/dev/null)
    [ "$state" = idle ] && break
    sleep 0.2
done
[ "$state" = idle ] || skip "the test Slurm did not come up within 20 s (node state '${state:-none}';" \
    "slurmd: $(tail -n 2 "$SL_DIR/slurmd.log" "$SL_DIR/slurmd.out" 2>/dev/null | tr '\n' ' ' | cut -c1-300))"
echo "slurm: munged, slurmctld (port $ctld_port), slurmd (port $slurmd_port) up in" \
    "$(pl_secs_between "$t0" "$(date +%s.%N)") s; $(sinfo -h -o '%P %D %c %t')"

case=qwen3_deep8
model=$(pl_golden "$case")
prompt=$(pl_golden_prompt "$case")
want=$(pl_golden_generated "$case")
steps=$(pl_golden_steps "$case")
opts=(--max-seq 256 --max-batch 4 --chunk-size 8)
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$SL_DIR/key"
chmod 600 "$SL_DIR/key"

pl_start_pipeline one 1 "$model" "${opts[@]}" --out "$PL_WORK/one.safetensors"
pl_client one --prompt "$prompt" --max-tokens "$steps" >"$PL_WORK/one.client" ||
    pl_fail "single stage: client failed: $(cat "$PL_WORK/one.client")"
pl_wait_file "$PL_WORK/one.safetensors" 5 || pl_fail "single stage: no --out file"
pl_stop_pipeline one 1

t0=$(date +%s.%N)
SL_JOB=$(cd "$SL_DIR" && STRATA_BIN_DIR="$PL_BIN" STRATA_PORT_BASE="$stage_port" \
    STRATA_READY_TIMEOUT=30 STRATA_CLIENT_ARGS="--prompt $prompt --max-tokens $steps" \
    sbatch --parsable --ntasks=4 --time=2 --output="$SL_DIR/job.out" "$SBATCH_SCRIPT" \
    --model "$model" --auth-key-file "$SL_DIR/key" "${opts[@]}" --out "$SL_DIR/out.safetensors") ||
    sl_fail "sbatch refused the job"
for ((i = 0; i < 300; i++)); do
    jstate=$(scontrol show job "$SL_JOB" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')
    case "$jstate" in PENDING | CONFIGURING | RUNNING | COMPLETING | "") sleep 0.2 ;; *) break ;; esac
done
took=$(pl_secs_between "$t0" "$(date +%s.%N)")
exit_code=$(scontrol show job "$SL_JOB" | sed -n 's/.*ExitCode=\([0-9:]*\).*/\1/p')
if [ "$jstate" != COMPLETED ] || [ "$exit_code" != 0:0 ]; then
    sl_fail "job $SL_JOB ended ${jstate:-?}, exit code ${exit_code:-?} (after $took s)"
fi
SL_JOB=""
got=$(pl_tokens_of "$SL_DIR/job.out" 0)
[ "$got" = "$want" ] || sl_fail "tokens from the Slurm job $got, golden $want"
cmp -s "$SL_DIR/out.safetensors" "$PL_WORK/one.safetensors" ||
    sl_fail "the Slurm pipeline's tokens/logits differ from the single stage"
log=$(ls "$SL_DIR"/strata-*.stages.log)
for r in 0 1 2 3; do
    grep -q "^$r: .*listening on 127.0.0.1:$((stage_port + r))" "$log" ||
        sl_fail "task $r did not listen on its ring address"
    grep -q "^$r: .*connected to next stage .*(TLS 1.3, PSK)" "$log" ||
        sl_fail "task $r's link is not TLS 1.3"
done
grep "^  stage\|ring ready\|client exit" "$SL_DIR/job.out"
echo "slurm job: 4 tasks (srun), tokens golden, --out identical to the single stage, stages" \
    "stopped with status 0; job took $took s from sbatch to COMPLETED"
echo "PASS"
