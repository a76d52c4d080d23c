#!/bin/sh
# Slurm Prolog (slurm.conf: Prolog=/etc/gpufleet/slurm/prolog.sh, with PrologFlags=Alloc so it runs
# at allocation on every node of the job): label this node's GPUs with the job's run id and register
# the run with its GPUs on this node.  Each node registers its own GPUs; the API merges them into one run.
#
#  1. writes GPUFLEET_JOB_DIR/<gpu index> containing the run id, for the agent's attribution
#     (read before the processes on the GPU are even started);
#  2. POST /v1/runs {run_id, name, slurm: {account, user, partition}, allocations: [{node, gpus}]} with
#     this node's token: whose job it is comes from the prolog's environment (SLURM_JOB_ACCOUNT,
#     SLURM_JOB_USER, SLURM_JOB_PARTITION), else sacct, else scontrol; the server makes them the run's
#     slurm.* labels and, by its teams settings, the run's team.
#
# Before that, where DCGM is installed, it runs DCGM's diagnostic (dcgmi diag -r LEVEL -j) and saves
# the result where the agent's node checks read it (agent.dcgm_diag_result_file): the node page and
# the collector's quarantine see it like every other check.
#   GPUFLEET_DCGM_DIAG_LEVEL      0 (off) or 1-4 (default 1: deployment checks, seconds, GPUs untouched)
#   GPUFLEET_DCGM_DIAG_FILE       where the result goes (default /var/lib/gpufleet/dcgm-diag.json)
#   GPUFLEET_DCGM_DIAG_TIMEOUT_S  longest the diagnostic may run, seconds (default 120)
#   GPUFLEET_DCGM_DIAG_DRAIN      1: a failed test makes the prolog exit 1, so Slurm drains the node
#                                 and requeues the job (default 0: recorded only)
#
# Otherwise always exits 0: telemetry must not keep a job from starting.

. "$(dirname "$0")/gpufleet-hook.sh"

GPUFLEET_DCGM_DIAG_FILE=${GPUFLEET_DCGM_DIAG_FILE:-/var/lib/gpufleet/dcgm-diag.json}
GPUFLEET_DCGM_DIAG_TIMEOUT_S=${GPUFLEET_DCGM_DIAG_TIMEOUT_S:-120}

# Runs dcgmi diag and saves its JSON; returns 1 only when a test failed and GPUFLEET_DCGM_DIAG_DRAIN=1.
dcgm_diag() {
    level=${GPUFLEET_DCGM_DIAG_LEVEL:-1}
    case "$level" in
        0) return 0 ;;
        1|2|3|4) ;;
        *) log "GPUFLEET_DCGM_DIAG_LEVEL=$level is not 0-4; DCGM diagnostic not run"; return 0 ;;
    esac
    if ! command -v dcgmi >/dev/null 2>&1; then
        log "dcgmi not installed; DCGM diagnostic not run"
        return 0
    fi
    dir=$(dirname "$GPUFLEET_DCGM_DIAG_FILE")
    if ! mkdir -p "$dir" 2>/dev/null; then
        log "cannot create $dir; DCGM diagnostic not run"
        return 0
    fi
    tmp="$dir/.dcgm-diag.$$"
    limit=""
    command -v timeout >/dev/null 2>&1 && limit="timeout $GPUFLEET_DCGM_DIAG_TIMEOUT_S"
    # dcgmi exits non-zero when a test fails and still prints its document: the document decides.
    $limit dcgmi diag -r "$level" -j > "$tmp" 2>/dev/null
    rc=$?
    if [ "$(head -c 1 "$tmp" 2>/dev/null)" != "{" ]; then
        log "dcgmi diag -r $level gave no result (exit status $rc)"
        rm -f "$tmp"
        return 0
    fi
    if ! mv -f "$tmp" "$GPUFLEET_DCGM_DIAG_FILE"; then
        log "cannot write $GPUFLEET_DCGM_DIAG_FILE"
        rm -f "$tmp"
        return 0
    fi
    if grep -Eiq '"status"[[:space:]]*:[[:space:]]*"fail"' "$GPUFLEET_DCGM_DIAG_FILE"; then
        log "dcgmi diag -r $level on $GPUFLEET_NODE: a test failed (see $GPUFLEET_DCGM_DIAG_FILE)"
        [ "${GPUFLEET_DCGM_DIAG_DRAIN:-0}" = 1 ] && return 1
    else
        log "dcgmi diag -r $level on $GPUFLEET_NODE passed"
    fi
    return 0
}

# A Slurm name the API takes (account, user, partition); anything else is left out rather than refused.
valid_name() {
    printf '%s' "$1" | grep -Eq '^[A-Za-z0-9_][A-Za-z0-9._@+-]{0,127}$'
}

# A command bounded by GPUFLEET_TIMEOUT_S where timeout(1) exists: a stuck slurmdbd must not hold the job.
limited() {
    if command -v timeout >/dev/null 2>&1; then timeout "$GPUFLEET_TIMEOUT_S" "$@"; else "$@"; fi
}

# Sets account, user and partition of the job: the environment first, then sacct, then scontrol.
job_owner() {
    account=${SLURM_JOB_ACCOUNT:-}
    user=${SLURM_JOB_USER:-}
    partition=${SLURM_JOB_PARTITION:-}
    if [ -n "$account" ] && [ -n "$user" ] && [ -n "$partition" ]; then
        return 0
    fi
    if command -v sacct >/dev/null 2>&1; then
        line=$(limited sacct -j "$SLURM_JOB_ID" -X -n -P -o Account,User,Partition \
               2>/dev/null | head -n 1)
        [ -z "$account" ] && account=$(printf '%s' "$line" | cut -d'|' -f1)
        [ -z "$user" ] && user=$(printf '%s' "$line" | cut -d'|' -f2)
        [ -z "$partition" ] && partition=$(printf '%s' "$line" | cut -d'|' -f3)
    fi
    if { [ -z "$account" ] || [ -z "$user" ] || [ -z "$partition" ]; } && command -v scontrol >/dev/null 2>&1; then
        info=$(limited scontrol -o show job "$SLURM_JOB_ID" 2>/dev/null | tr ' ' '\n')
        [ -z "$account" ] && account=$(printf '%s\n' "$info" | sed -n 's/^Account=//p' | head -n 1)
        [ -z "$user" ] && user=$(printf '%s\n' "$info" | sed -n 's/^UserId=\([^(]*\).*/\1/p' | head -n 1)
        [ -z "$partition" ] && partition=$(printf '%s\n' "$info" | sed -n 's/^Partition=//p' | head -n 1)
    fi
    return 0
}

# The "slurm" member of the registration: the fields found, each checked; empty when none.
slurm_json() {
    job_owner
    fields=""
    for pair in "account:$account" "user:$user" "partition:$partition"; do
        key=${pair%%:*}
        value=${pair#*:}
        if [ -n "$value" ] && valid_name "$value"; then
            fields="$fields${fields:+, }\"$key\": $(json_str "$value")"
        elif [ -n "$value" ]; then
            log "job $key '$value' is not a name the API takes; left out"
        fi
    done
    [ -n "$fields" ] && printf ', "slurm": {%s}' "$fields"
    return 0
}

main() {
    if [ -z "${SLURM_JOB_ID:-}" ] || ! valid_id "$RUN_ID"; then
        log "no usable job id (SLURM_JOB_ID='${SLURM_JOB_ID:-}'); nothing to do"
        return 0
    fi
    gpus=$(job_gpus)
    if [ -z "$gpus" ]; then
        log "no GPUs allocated on $GPUFLEET_NODE; nothing to do"
        return 0
    fi

    if mkdir -p "$GPUFLEET_JOB_DIR" 2>/dev/null; then
        for g in $gpus; do
            tmp="$GPUFLEET_JOB_DIR/.$g.$$"
            if printf '%s\n' "$RUN_ID" > "$tmp" && mv -f "$tmp" "$GPUFLEET_JOB_DIR/$g"; then :; else
                log "cannot write job file $GPUFLEET_JOB_DIR/$g"
                rm -f "$tmp"
            fi
        done
    else
        log "cannot create $GPUFLEET_JOB_DIR"
    fi

    gpu_list=$(printf '%s' "$gpus" | tr '\n' ',' | sed 's/,$//')
    name=""
    [ -n "${SLURM_JOB_NAME:-}" ] && name=", \"name\": $(json_str "$SLURM_JOB_NAME")"
    slurm=$(slurm_json)
    alloc="\"allocations\": [{\"node\": $(json_str "$GPUFLEET_NODE"), \"gpus\": [$gpu_list]}]"
    body="{\"run_id\": $(json_str "$RUN_ID")$name$slurm, $alloc}"
    status=$(api POST /v1/runs "$body")
    if [ "$status" = 422 ] && [ -n "$slurm" ]; then
        # a server from before runs took the job's owner: register the run without it
        log "the API refused the job's account/user/partition (HTTP 422); registering without them"
        status=$(api POST /v1/runs "{\"run_id\": $(json_str "$RUN_ID")$name, $alloc}")
    fi
    case "$status" in
        200|201) log "registered run $RUN_ID on $GPUFLEET_NODE GPUs $gpu_list" ;;
        *) log "registering run $RUN_ID failed (HTTP $status); GPUs are still labelled through job files" ;;
    esac
}

if ! dcgm_diag; then
    echo "gpufleet: DCGM diagnostic failed on $GPUFLEET_NODE (see $GPUFLEET_DCGM_DIAG_FILE); draining" >&2
    exit 1
fi
main
exit 0
