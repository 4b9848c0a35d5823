#!/bin/sh
# slurm-elastic Prolog: tells the node agent which job holds each GPU of this node, so a job that holds GPUs
# without using them is still seen (at 0%). One file per allocated GPU:
#   $SLURM_ELASTIC_GPU_MAP_DIR/$SLURMD_NODENAME/<global GPU index>  =  "jobid uid user account sluid"
# ("-" when unknown). A failing Prolog drains the node: this script ignores every error and always exits 0.
# Settings: slurm-elastic.env beside this script, else /etc/default/slurm-elastic (shell assignments).

load_settings() {
    env_file="$(dirname "$0")/slurm-elastic.env"
    [ -r "$env_file" ] || env_file=/etc/default/slurm-elastic
    # Checked with sh -n first: a syntax error in a sourced file would abort this script.
    if [ -r "$env_file" ] && sh -n "$env_file" 2>/dev/null; then . "$env_file"; fi
    MAP_DIR="${SLURM_ELASTIC_GPU_MAP_DIR:-/run/slurm-elastic/gpu-map}/${SLURMD_NODENAME:-$(hostname -s)}"
}

gpu_map_write() {
    [ -n "$SLURM_JOB_ID" ] && [ -n "$SLURM_JOB_GPUS" ] || return 0
    mkdir -p "$MAP_DIR" 2>/dev/null || return 0
    for gpu in $(echo "$SLURM_JOB_GPUS" | tr ',' ' '); do
        case "$gpu" in ''|*[!0-9]*) continue ;; esac
        tmp="$MAP_DIR/.$gpu.$SLURM_JOB_ID"
        printf '%s %s %s %s %s\n' "$SLURM_JOB_ID" "${SLURM_JOB_UID:--}" "${SLURM_JOB_USER:--}" \
            "${SLURM_JOB_ACCOUNT:--}" "${SLURM_JOB_SLUID:--}" > "$tmp" 2>/dev/null &&
            mv -f "$tmp" "$MAP_DIR/$gpu" 2>/dev/null
    done
}

load_settings
gpu_map_write
exit 0
