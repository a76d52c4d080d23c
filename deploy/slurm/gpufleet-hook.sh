#!/bin/sh
# Shared by prolog.sh and epilog.sh: configuration, logging, JSON quoting, API calls.
#
# Configuration (environment, or /etc/gpufleet/slurm.env):
#   GPUFLEET_API_URL     API base URL                    (default http://127.0.0.1:8420)
#   GPUFLEET_TOKEN_FILE  this node's node token          (default /etc/gpufleet/token)
#   GPUFLEET_NODE        node name the token was made for (default $SLURMD_NODENAME, else hostname -s)
#   GPUFLEET_JOB_DIR     per-GPU job files the agent reads (agent.job_files_dir; default /run/gpufleet/jobs)
#   GPUFLEET_RUN_PREFIX  prefix of run ids               (default empty: the run id is the Slurm job id,
#                        which is also what the agent finds in a process's SLURM_JOB_ID)
#   GPUFLEET_CA_FILE     CA bundle for an https API      (optional)
#   GPUFLEET_TIMEOUT_S   per-request limit, seconds      (default 5)
#
# A hook must never fail the job or drain the node because telemetry is
# unwell: every problem is logged to syslog (tag gpufleet-slurm) and the
# scripts exit 0.

GPUFLEET_CONF=${GPUFLEET_CONF:-/etc/gpufleet/slurm.env}
# shellcheck disable=SC1090
[ -r "$GPUFLEET_CONF" ] && . "$GPUFLEET_CONF"

GPUFLEET_API_URL=${GPUFLEET_API_URL:-http://127.0.0.1:8420}
GPUFLEET_TOKEN_FILE=${GPUFLEET_TOKEN_FILE:-/etc/gpufleet/token}
GPUFLEET_JOB_DIR=${GPUFLEET_JOB_DIR:-/run/gpufleet/jobs}
GPUFLEET_TIMEOUT_S=${GPUFLEET_TIMEOUT_S:-5}
GPUFLEET_NODE=${GPUFLEET_NODE:-${SLURMD_NODENAME:-$(hostname -s)}}
RUN_ID="${GPUFLEET_RUN_PREFIX:-}${SLURM_JOB_ID:-}"

log() {
    if command -v logger >/dev/null 2>&1; then
        logger -t gpufleet-slurm -- "job ${SLURM_JOB_ID:-?}: $*"
    fi
    [ -n "${GPUFLEET_HOOK_VERBOSE:-}" ] && echo "gpufleet-slurm: job ${SLURM_JOB_ID:-?}: $*" >&2
    return 0
}

# GPU indexes of this job on this node, one per line ("0,2-3" -> 0 2 3).
job_gpus() {
    printf '%s\n' "${SLURM_JOB_GPUS:-${CUDA_VISIBLE_DEVICES:-}}" | tr ',' '\n' | while read -r part; do
        case "$part" in
            *[!0-9-]*|'') ;;
            *-*) seq "${part%-*}" "${part#*-}" ;;
            *) echo "$part" ;;
        esac
    done | sort -n | uniq
}

# A JSON string: control characters dropped, backslash and quote escaped, at most 256 characters.
json_str() {
    printf '"%s"' "$(printf '%s' "$1" | tr -d '\000-\037' | cut -c1-256 | sed 's/\\/\\\\/g; s/"/\\"/g')"
}

valid_id() {
    printf '%s' "$1" | grep -Eq '^[A-Za-z0-9][A-Za-z0-9._:@/-]{0,127}$'
}

# api METHOD PATH BODY -> prints the HTTP status (000 when unreachable); retries once on 5xx/000.
api() {
    token=$(cat "$GPUFLEET_TOKEN_FILE" 2>/dev/null) || { log "cannot read token file $GPUFLEET_TOKEN_FILE"; echo 000; return; }
    for attempt in 1 2; do
        status=$(curl -sS -o /dev/null -w '%{http_code}' --max-time "$GPUFLEET_TIMEOUT_S" \
            ${GPUFLEET_CA_FILE:+--cacert "$GPUFLEET_CA_FILE"} \
            -X "$1" -H "Authorization: Bearer $token" -H 'Content-Type: application/json' \
            --data "$3" "${GPUFLEET_API_URL%/}$2" 2>/dev/null) || status=000
        case "$status" in
            2*|4*) break ;;
        esac
        [ "$attempt" = 1 ] && sleep 1
    done
    echo "$status"
}
