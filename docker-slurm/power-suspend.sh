#!/bin/bash
# SuspendProgram of the test cluster (installed into etc/ by cluster.sh; slurmctld runs it as SlurmUser with a
# hostlist): "powering a node off" is stopping its slurmd by the pid file that slurmd wrote (never by name).
set -u
ETC=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=/dev/null
. "$ETC/power.env"
export SLURM_CONF
# slurmctld runs this with a bare environment: no PATH to find slurmd, scontrol, unshare
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
exec >> "$POWER_LOG" 2>&1
for n in $(scontrol show hostnames "$1"); do
  f="$RUN_DIR/slurmd-$n.pid"
  pid=$(tr -dc 0-9 2>/dev/null < "$f" || true)
  echo "$(date -u +%FT%T.%N) suspend $n (slurmd pid ${pid:-none})"
  if [ -n "$pid" ] && grep -q slurmd "/proc/$pid/comm" 2>/dev/null; then kill -TERM "$pid"; fi
done
exit 0
