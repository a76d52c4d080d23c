#!/bin/sh
# Slurm Prolog (slurm.conf: Prolog=/etc/gpufleet/slurm/prolog.sh, with PrologFlags=Alloc so it runs
# at allocation on every node of the job): label this node's GPUs with the job's run id and register
# the run with its GPUs on this node.  Each node registers its own GPUs; the API merges them into one run.
#
#  1. writes GPUFLEET_JOB_DIR/<gpu index> containing the run id, for the agent's attribution
#     (read before the processes on the GPU are even started);
#  2. POST /v1/runs {run_id, name, allocations: [{node, gpus}]} with this node's token.
#
# Always exits 0: telemetry must not keep a job from starting.

. "$(dirname "$0")/gpufleet-hook.sh"

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
    body="{\"run_id\": $(json_str "$RUN_ID")$name, \"allocations\": [{\"node\": $(json_str "$GPUFLEET_NODE"), \"gpus\": [$gpu_list]}]}"
    status=$(api POST /v1/runs "$body")
    case "$status" in
        200|201) log "registered run $RUN_ID on $GPUFLEET_NODE GPUs $gpu_list" ;;
        *) log "registering run $RUN_ID failed (HTTP $status); GPUs are still labelled through job files" ;;
    esac
}

main
exit 0
