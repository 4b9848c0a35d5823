#!/bin/sh
# slurm-elastic Prolog: tells the node agent which job holds each GPU of this node, so a job that holds GPUs
# without using them is still seen (at 0%). One file per allocated GPU:
#   $SLURM_ELASTIC_GPU_MAP_DIR/$SLURMD_NODENAME/<global GPU index>  =  "jobid uid user account sluid"
# ("-" when unknown). MPS: for a job allocated gres/mps (Slurm then sets CUDA_MPS_ACTIVE_THREAD_PERCENTAGE), it
# starts one MPS control daemon per GPU (pipe and log directory per GPU, docs/mig.md "MPS") and an MPS server for
# the job's user; a whole-GPU job stops MPS on its GPUs, and the node is drained if MPS will not quit.
# A failing Prolog drains the node: this script ignores every error and always exits 0.
# Settings: slurm-elastic.env beside this script, else /etc/default/slurm-elastic (shell assignments).

load_settings() {
    env_file="$(dirname "$0")/slurm-elastic.env"
    [ -r "$env_file" ] || env_file=/etc/default/slurm-elastic
    # Checked with sh -n first: a syntax error in a sourced file would abort this script.
    if [ -r "$env_file" ] && sh -n "$env_file" 2>/dev/null; then . "$env_file"; fi
    NODE=${SLURMD_NODENAME:-$(hostname -s)}
    MAP_BASE=${SLURM_ELASTIC_GPU_MAP_DIR:-/run/slurm-elastic/gpu-map}
    MAP_DIR="$MAP_BASE/$NODE"
    MPS_BASE="${SLURM_ELASTIC_MPS_DIR:-$(dirname "$MAP_BASE")/mps}/$NODE"
    MPS_CONTROL=${SLURM_ELASTIC_MPS_CONTROL:-nvidia-cuda-mps-control}
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

mps_ctl() {  # GPU COMMAND: one command to that GPU's MPS control daemon ("-d" starts the daemon)
    d="$MPS_BASE/gpu$1"
    if [ "$2" = "-d" ]; then set -- "$1" "" -d; fi
    echo "$2" | CUDA_MPS_PIPE_DIRECTORY="$d/pipe" CUDA_MPS_LOG_DIRECTORY="$d/log" CUDA_VISIBLE_DEVICES="$1" \
        timeout 10 "$MPS_CONTROL" $3 >/dev/null 2>&1
}

mps_stop() {  # GPU: quit its MPS daemon and wait until it is gone; fails if it stays
    mps_ctl "$1" get_server_list || return 0
    mps_ctl "$1" quit
    tries=${SLURM_ELASTIC_MPS_QUIT_WAIT:-10}
    while [ "$tries" -gt 0 ]; do
        mps_ctl "$1" get_server_list || return 0
        tries=$((tries - 1)); sleep 1
    done
    return 1
}

mps_setup() {
    [ -n "$SLURM_JOB_ID" ] && [ -n "$SLURM_JOB_GPUS" ] && command -v "$MPS_CONTROL" >/dev/null 2>&1 || return 0
    pct=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
    for gpu in $(echo "$SLURM_JOB_GPUS" | tr ',' ' '); do
        case "$gpu" in ''|*[!0-9]*) continue ;; esac
        if [ -n "$pct" ]; then
            mkdir -p "$MPS_BASE/gpu$gpu/pipe" "$MPS_BASE/gpu$gpu/log" "$MPS_BASE/gpu$gpu/jobs" || continue
            echo "${SLURM_JOB_UID:-0} $pct" > "$MPS_BASE/gpu$gpu/jobs/$SLURM_JOB_ID"
            mps_ctl "$gpu" get_server_list || mps_ctl "$gpu" -d
            mps_ctl "$gpu" "set_default_active_thread_percentage $pct"
            mps_ctl "$gpu" "start_server -uid ${SLURM_JOB_UID:-0}"
        elif [ -d "$MPS_BASE/gpu$gpu/pipe" ] && ! mps_stop "$gpu"; then
            scontrol update NodeName="$NODE" State=DRAIN \
                Reason="slurm-elastic: MPS on GPU $gpu would not quit for whole-GPU job $SLURM_JOB_ID"
        fi
    done
}

load_settings
gpu_map_write
mps_setup >/dev/null 2>&1
exit 0
