# shellcheck shell=bash
# A throwaway Slurm cluster for the deployment tests: munged with a fresh key,
# slurmctld and one slurmd per node, every state file, socket and log in one temporary
# directory, so nothing touches a Slurm or munge already on the machine. The configuration is
# the smallest that runs jobs as root without cgroups: proctrack/linuxproc, task/none, no
# accounting, SlurmUser root, the declared CPUs trusted over the hardware's
# (SlurmdParameters=config_overrides). The daemons run in the foreground as children of the
# test and are stopped by pid on exit, failure included.
#
# Source after pipeline_lib.sh (or netns_lib.sh), then: sl_init, sl_conf, sl_start_munged,
# sl_start_slurmctld, sl_start_slurmd (per node), sl_wait_idle, sl_run_job.

sl_skip() {
    echo "skipped: $*"
    exit 0
}

SL_DIR="" SL_DAEMONS="" SL_JOB=""

# sl_cleanup: cancels a running job, stops the daemons (slurmd first, so job steps end with
# them) and removes the directory. Call from the test's EXIT trap.
sl_cleanup() {
    local p i
    [ -n "$SL_JOB" ] && [ -f "$SL_DIR/slurm.conf" ] && SLURM_CONF=$SL_DIR/slurm.conf scancel "$SL_JOB" 2>/dev/null
    for p in $SL_DAEMONS; do
        kill -TERM "$p" 2>/dev/null
        for ((i = 0; i < 50; i++)); do
            kill -0 "$p" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$p" 2>/dev/null
        wait "$p" 2>/dev/null
    done
    SL_DAEMONS=""
    [ -n "$SL_DIR" ] && rm -rf "$SL_DIR"
    SL_DIR=""
}

sl_fail() {
    local f
    for f in "$SL_DIR"/*.log "$SL_DIR"/*.out "$SL_DIR"/strata-*.stages.log; do
        [ -f "$f" ] && { echo "---- $f (last 20 lines)"; tail -n 20 "$f"; } >&2
    done
    pl_fail "$@"
}

# sl_init: the skip checks, then the directory and the munge key. A short path of its own
# (the munge socket's path must fit in sun_path); munged insists that its socket's directory
# is not writable by others and that its key is private.
sl_init() {
    local b
    [ "$(id -u)" = 0 ] || sl_skip "a test Slurm cluster needs root (slurmd runs jobs as root; uid $(id -u))"
    for b in munged slurmctld slurmd sbatch scontrol squeue sinfo scancel srun; do
        command -v "$b" >/dev/null 2>&1 ||
            sl_skip "$b not installed (Debian packages munge, slurmctld, slurmd, slurm-client)"
    done
    SL_SCRIPT="$PL_ROOT/deploy/slurm/strata.sbatch"
    [ -f "$SL_SCRIPT" ] || pl_fail "no $SL_SCRIPT"
    SL_DIR=$(mktemp -d /tmp/strata-slurm.XXXXXX)
    chmod 755 "$SL_DIR"
    mkdir -p "$SL_DIR/state" "$SL_DIR/spool" "$SL_DIR/munge" "$SL_DIR/run"
    head -c 1024 /dev/urandom >"$SL_DIR/munge/munge.key"
    chmod 600 "$SL_DIR/munge/munge.key"
    export SLURM_CONF="$SL_DIR/slurm.conf"
}

# sl_conf CTLD_ADDR CTLD_PORT SLURMD_PORT NODE_LINE...: slurm.conf with the given node lines
# ("NodeName=... NodeAddr=... CPUs=..."), all nodes in one default partition.
sl_conf() {
    local addr=$1 ctld_port=$2 slurmd_port=$3 nodes=() line
    shift 3
    for line in "$@"; do
        line=${line%% *}
        nodes+=("${line#NodeName=}")
    done
    {
        cat <<CONF
ClusterName=stratatest
SlurmctldHost=$(hostname -s)($addr)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
AuthType=auth/munge
AuthInfo=socket=$SL_DIR/munge/munge.sock
CredType=cred/munge
StateSaveLocation=$SL_DIR/state
SlurmdSpoolDir=$SL_DIR/spool/%n
SlurmctldPidFile=$SL_DIR/run/slurmctld.pid
SlurmdPidFile=$SL_DIR/run/slurmd.%n.pid
SlurmctldLogFile=$SL_DIR/slurmctld.log
SlurmdLogFile=$SL_DIR/slurmd.%n.log
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
CONF
        printf '%s State=UNKNOWN\n' "$@"
        echo "PartitionName=strata Nodes=$(
            IFS=,
            echo "${nodes[*]}"
        ) Default=YES MaxTime=5 State=UP"
    } >"$SLURM_CONF"
    # slurmd always initialises its cgroup plugin. On a cgroup v2 host, slurmd not started
    # by systemd asks systemd over D-Bus for a scope; where that fails (no D-Bus), build the
    # hierarchy itself instead of refusing to start. (Only exercised on cgroup v1 here.)
    echo "IgnoreSystemdOnFailure=yes" >"$SL_DIR/cgroup.conf"
    SL_NODES=${#nodes[@]}
}

sl_start_munged() {
    munged -F --socket="$SL_DIR/munge/munge.sock" --key-file="$SL_DIR/munge/munge.key" \
        --pid-file="$SL_DIR/run/munged.pid" --seed-file="$SL_DIR/munge/seed" \
        --log-file="$SL_DIR/munged.log" >"$SL_DIR/munged.out" 2>&1 &
    SL_DAEMONS="$! $SL_DAEMONS"
    pl_wait_log "$SL_DIR/munged.out" "Created socket" 1 10 ||
        sl_skip "munged did not start: $(tail -n 3 "$SL_DIR/munged.out" | tr '\n' ' ')"
}

# sl_start_slurmctld [NETNS] / sl_start_slurmd NODE [NETNS]: in the given network namespace
# (nsenter: `ip netns exec` would remount /sys without the cgroup mount slurmd probes).
sl_in_netns() {
    if [ -n "$1" ]; then echo nsenter "--net=/run/netns/$1"; fi
}
sl_start_slurmctld() {
    # shellcheck disable=SC2046
    $(sl_in_netns "${1:-}") slurmctld -D -i -f "$SLURM_CONF" >"$SL_DIR/slurmctld.out" 2>&1 &
    SL_DAEMONS="$! $SL_DAEMONS"
}
sl_start_slurmd() {
    mkdir -p "$SL_DIR/spool/$1"
    # shellcheck disable=SC2046
    $(sl_in_netns "${2:-}") slurmd -D -N "$1" -f "$SLURM_CONF" >"$SL_DIR/slurmd.$1.out" 2>&1 &
    SL_DAEMONS="$! $SL_DAEMONS"
}

# sl_wait_idle [NETNS]: every node registered and idle within 20 s, else the test is skipped
# with slurmd's last words.
sl_wait_idle() {
    local i state t0
    t0=$(date +%s.%N)
    for ((i = 0; i < 100; i++)); do
        # shellcheck disable=SC2046
        state=$($(sl_in_netns "${1:-}") sinfo -h -o '%t %D' 2>/dev/null)
        [ "$state" = "idle $SL_NODES" ] && break
        sleep 0.2
    done
    [ "$state" = "idle $SL_NODES" ] || sl_skip "the test Slurm did not come up within 20 s (nodes:" \
        "'${state:-none}'; $(tail -q -n 2 "$SL_DIR"/slurmd.*.out 2>/dev/null | tr '\n' ' ' | cut -c1-300))"
    echo "slurm: munged, slurmctld, $SL_NODES slurmd up; idle after $(pl_secs_between "$t0" "$(date +%s.%N)") s"
}

# sl_run_job NETNS|"" SBATCH_OPTIONS... -- SCRIPT_ARGS...: submits deploy/slurm/strata.sbatch
# (from NETNS, if given; the caller's exported STRATA_* variables go with the job, as sbatch
# exports the environment) and waits up to 60 s for the job's end. Fails unless it completed
# with exit code 0. Sets SL_JOB_SECS, SL_JOB_OUT (its output), SL_JOB_LOG (the stage logs).
sl_run_job() {
    local netns=$1 opts=() i t0 job
    shift
    while [ $# -gt 0 ] && [ "$1" != -- ]; do
        opts+=("$1")
        shift
    done
    shift
    t0=$(date +%s.%N)
    # shellcheck disable=SC2046
    job=$(cd "$SL_DIR" && $(sl_in_netns "$netns") sbatch --parsable --time=2 \
        --output="$SL_DIR/job.%j.out" "${opts[@]}" "$SL_SCRIPT" "$@") || sl_fail "sbatch refused the job"
    SL_JOB=$job
    for ((i = 0; i < 300; i++)); do
        # shellcheck disable=SC2046
        SL_JOB_STATE=$($(sl_in_netns "$netns") scontrol show job "$job" 2>/dev/null |
            sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')
        case "$SL_JOB_STATE" in PENDING | CONFIGURING | RUNNING | COMPLETING | "") sleep 0.2 ;; *) break ;; esac
    done
    # shellcheck disable=SC2046
    SL_JOB_EXIT=$($(sl_in_netns "$netns") scontrol show job "$job" | sed -n 's/.*ExitCode=\([0-9:]*\).*/\1/p')
    # shellcheck disable=SC2034 # (SL_JOB_* are read by the tests)
    SL_JOB_SECS=$(pl_secs_between "$t0" "$(date +%s.%N)")
    # shellcheck disable=SC2034
    SL_JOB_OUT="$SL_DIR/job.$job.out"
    # shellcheck disable=SC2034
    SL_JOB_LOG="$SL_DIR/strata-$job.stages.log"
    if [ "$SL_JOB_STATE" != COMPLETED ] || [ "$SL_JOB_EXIT" != 0:0 ]; then
        sl_fail "job $job ended ${SL_JOB_STATE:-?}, exit code ${SL_JOB_EXIT:-?} (after $SL_JOB_SECS s)"
    fi
    SL_JOB=""
}
