#!/bin/sh
# slurm-elastic Epilog: removes the map files of this job written by prolog.sh (only files that still name
# this job, so a newer job's file is never touched). Ignores every error and always exits 0: a failing
# Epilog drains the node. Settings: slurm-elastic.env beside this script, else /etc/default/slurm-elastic.

load_settings() {
    env_file="$(dirname "$0")/slurm-elastic.env"
    [ -r "$env_file" ] || env_file=/etc/default/slurm-elastic
    if [ -r "$env_file" ] && sh -n "$env_file" 2>/dev/null; then . "$env_file"; fi
    MAP_DIR="${SLURM_ELASTIC_GPU_MAP_DIR:-/run/slurm-elastic/gpu-map}/${SLURMD_NODENAME:-$(hostname -s)}"
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

load_settings
gpu_map_remove
exit 0
