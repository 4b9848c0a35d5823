#!/bin/sh
# slurm-elastic Epilog: removes the map files of this job written by prolog.sh (only files that still name
# this job, so a newer job's file is never touched), and for an MPS job stops a GPU's MPS daemon when no other
# MPS job is left on it (the node is drained with a reason if it will not quit). Ignores every error and always
# exits 0: a failing Epilog drains the node. Settings: slurm-elastic.env beside this script, else
# /etc/default/slurm-elastic.

load_settings() {
    env_file="$(dirname "$0")/slurm-elastic.env"
    [ -r "$env_file" ] || env_file=/etc/default/slurm-elastic
    if [ -r "$env_file" ] && sh -n "$env_file" 2>/dev/null; then . "$env_file"; fi
    NODE=${SLURMD_NODENAME:-$(hostname -s)}
    MAP_BASE=${SLURM_ELASTIC_GPU_MAP_DIR:-/run/slurm-elastic/gpu-map}
    MAP_DIR="$MAP_BASE/$NODE"
    MPS_BASE="${SLURM_ELASTIC_MPS_DIR:-$(dirname "$MAP_BASE")/mps}/$NODE"
    MPS_CONTROL=${SLURM_ELASTIC_MPS_CONTROL:-nvidia-cuda-mps-control}
}

gpu_map_remove() {
    [ -n "$SLURM_JOB_ID" ] && [ -d "$MAP_DIR" ] || return 0
    for f in "$MAP_DIR"/*; do
        [ -f "$f" ] || continue
        job=
        { read -r job _ || [ -n "$job" ]; } < "$f" 2>/dev/null || continue
        [ "$job" = "$SLURM_JOB_ID" ] && rm -f "$f" 2>/dev/null
    done
    rm -f "$MAP_DIR"/.*."$SLURM_JOB_ID" 2>/dev/null
}

mps_ctl() {  # GPU COMMAND (as in prolog.sh)
    d="$MPS_BASE/gpu$1"
    echo "$2" | CUDA_MPS_PIPE_DIRECTORY="$d/pipe" CUDA_MPS_LOG_DIRECTORY="$d/log" CUDA_VISIBLE_DEVICES="$1" \
        timeout 10 "$MPS_CONTROL" >/dev/null 2>&1
}

mps_teardown() {
    [ -n "$SLURM_JOB_ID" ] && [ -n "$SLURM_JOB_GPUS" ] && command -v "$MPS_CONTROL" >/dev/null 2>&1 || return 0
    for gpu in $(echo "$SLURM_JOB_GPUS" | tr ',' ' '); do
        case "$gpu" in ''|*[!0-9]*) continue ;; esac
        [ -f "$MPS_BASE/gpu$gpu/jobs/$SLURM_JOB_ID" ] || continue
        rm -f "$MPS_BASE/gpu$gpu/jobs/$SLURM_JOB_ID"
        [ -z "$(ls -A "$MPS_BASE/gpu$gpu/jobs")" ] || continue  # another MPS job still uses this GPU
        mps_ctl "$gpu" get_server_list || continue
        mps_ctl "$gpu" quit
        tries=${SLURM_ELASTIC_MPS_QUIT_WAIT:-10}
        while [ "$tries" -gt 0 ] && mps_ctl "$gpu" get_server_list; do tries=$((tries - 1)); sleep 1; done
        [ "$tries" -gt 0 ] || scontrol update NodeName="$NODE" State=DRAIN \
            Reason="slurm-elastic: MPS on GPU $gpu would not quit after job $SLURM_JOB_ID"
    done
}

load_settings
gpu_map_remove
mps_teardown >/dev/null 2>&1
exit 0
