#!/usr/bin/env bash
# The test cluster's daemon controls for the MIG workflow (its [mig.commands], see docs/mig.md):
#
#   docker-slurm/slurm-daemon.sh stop-slurmd NODE     # stop that node's slurmd (by its pid file), wait for it
#   docker-slurm/slurm-daemon.sh start-slurmd NODE    # start it again (`slurmd -N NODE`), wait for its pid file
#   docker-slurm/slurm-daemon.sh restart-slurmctld    # stop slurmctld, start it, wait until `scontrol ping` is UP
#
# A site uses its own commands (systemctl over ssh, pdsh, ...). Only pids recorded in $ROOT/run are signalled.
set -euo pipefail
ROOT=${SLURM_ELASTIC_CLUSTER_DIR:-/var/tmp/slurm-elastic-cluster}
export SLURM_CONF="$ROOT/etc/slurm.conf"

die() { printf 'slurm-daemon: error: %s\n' "$*" >&2; exit 1; }
alive() {  # pidfile comm
  local p
  [ -s "$1" ] || return 1
  p=$(tr -dc 0-9 < "$1")
  [ -n "$p" ] && [ -d "/proc/$p" ] && grep -q "$2" "/proc/$p/comm" 2>/dev/null
}

stop() {  # pidfile comm
  local pid i
  alive "$1" "$2" || { rm -f "$1"; return 0; }
  pid=$(tr -dc 0-9 < "$1")
  kill -TERM "$pid"
  for ((i = 0; i < 300; i++)); do [ -d "/proc/$pid" ] || { rm -f "$1"; return 0; }; sleep 0.1; done
  die "$2 (pid $pid) did not stop within 30 s"
}

case "${1:-}" in
  stop-slurmd)
    [ -n "${2:-}" ] || die "usage: $0 stop-slurmd NODE"
    stop "$ROOT/run/slurmd-$2.pid" slurmd ;;
  start-slurmd)
    [ -n "${2:-}" ] || die "usage: $0 start-slurmd NODE"
    alive "$ROOT/run/slurmd-$2.pid" slurmd || slurmd -N "$2"
    for ((i = 0; i < 100; i++)); do alive "$ROOT/run/slurmd-$2.pid" slurmd && exit 0; sleep 0.1; done
    die "slurmd -N $2 did not start (see $ROOT/log/slurmd-$2.log)" ;;
  restart-slurmctld)
    stop "$ROOT/run/slurmctld.pid" slurmctld
    slurmctld
    for ((i = 0; i < 300; i++)); do
      timeout 5 scontrol ping 2>/dev/null | grep -q 'is UP' && exit 0
      sleep 0.2
    done
    die "slurmctld did not answer within 60 s (see $ROOT/log/slurmctld.log)" ;;
  *) echo "usage: $0 stop-slurmd NODE | start-slurmd NODE | restart-slurmctld" >&2; exit 2 ;;
esac
