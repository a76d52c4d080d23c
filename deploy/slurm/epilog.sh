#!/bin/sh
# Slurm Epilog (slurm.conf: Epilog=/etc/gpufleet/slurm/epilog.sh): end the run and unlabel this node's GPUs.
#
#  1. PATCH /v1/runs/<run id> {"end": now} with this node's token (every node of the job does it; the
#     last one to finish sets the end, within 5 minutes of the first; a node token ends only runs a
#     scheduler hook registered, never an admin's);
#  2. removes GPUFLEET_JOB_DIR/<gpu index> for this job's GPUs, only where the file still names this run.
#
# Always exits 0: telemetry must not drain a node.

. "$(dirname "$0")/gpufleet-hook.sh"

main() {
    if [ -z "${SLURM_JOB_ID:-}" ] || ! valid_id "$RUN_ID"; then
        log "no usable job id; nothing to do"
        return 0
    fi
    gpus=$(job_gpus)
    for g in $gpus; do
        f="$GPUFLEET_JOB_DIR/$g"
        if [ -f "$f" ] && [ "$(head -n 1 "$f" 2>/dev/null)" = "$RUN_ID" ]; then
            rm -f "$f" || log "cannot remove $f"
        fi
    done
    [ -z "$gpus" ] && return 0

    now=$(date -u +%Y-%m-%dT%H:%M:%S.%6NZ 2>/dev/null || date -u +%Y-%m-%dT%H:%M:%SZ)
    case "$now" in *N*) now=$(date -u +%Y-%m-%dT%H:%M:%SZ) ;; esac
    # The run id may contain '/', '@' or ':': encode it for the path.
    path_id=$(printf '%s' "$RUN_ID" | sed 's/%/%25/g; s#/#%2F#g; s/@/%40/g; s/:/%3A/g')
    status=$(api PATCH "/v1/runs/$path_id" "{\"end\": \"$now\"}")
    case "$status" in
        200) log "ended run $RUN_ID at $now" ;;
        *) log "ending run $RUN_ID failed (HTTP $status)" ;;
    esac
}

main
exit 0
