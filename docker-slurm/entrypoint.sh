#!/usr/bin/env bash
# Container entrypoint: start the cluster with the very script the bare-metal tests use, then run CMD.
set -euo pipefail
/opt/slurm-elastic/docker-slurm/cluster.sh start
trap '/opt/slurm-elastic/docker-slurm/cluster.sh stop' TERM INT
"$@" &
wait $!
