#!/usr/bin/env bash
# The test cluster's daemon controls for the MIG workflow (its [mig.commands], see docs/mig.md):
#
#   docker-slurm/slurm-daemon.sh stop-slurmd NODE     # stop that node's slurmd, wait until it is gone
#   docker-slurm/slurm-daemon.sh start-slurmd NODE    # start it again (`slurmd -N NODE`), wait until it runs
#   docker-slurm/slurm-daemon.sh restart-slurmctld    # stop every slurmctld of this cluster, start one, wait until
#                                                     # it is the only one and `scontrol ping` says UP
#
# The cluster is $SLURM_ELASTIC_CLUSTER_DIR (default the 22.05 one); for a release cluster source its env.sh first
# (its wrappers in PATH start the release's daemons chrooted; SLURM_ELASTIC_ROOTFS names that root). Only this
# cluster's daemons are signalled, found by name, SLURM_CONF and root (daemon-lib.sh), never by pid file alone.
# A site uses its own commands (systemctl over ssh, pdsh, ...).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=${SLURM_ELASTIC_CLUSTER_DIR:-/var/tmp/slurm-elastic-cluster}
export SLURM_CONF="$ROOT/etc/slurm.conf"
DAEMON_ROOTDIR=${SLURM_ELASTIC_ROOTFS:-/}
# shellcheck source=docker-slurm/daemon-lib.sh
. "$HERE/daemon-lib.sh"

die() { printf 'slurm-daemon: error: %s\n' "$*" >&2; exit 1; }
[ -f "$SLURM_CONF" ] || die "no $SLURM_CONF: is the cluster in $ROOT started?"
if [ -x "$ROOT/bin/slurmctld" ] && [ "$DAEMON_ROOTDIR" = / ]; then
  die "$ROOT is a release cluster: source $ROOT/env.sh first (it sets SLURM_ELASTIC_ROOTFS and PATH)"
fi

case "${1:-}" in
  stop-slurmd)
    [ -n "${2:-}" ] || die "usage: $0 stop-slurmd NODE"
    stop_daemons slurmd "$2" || die "slurmd -N $2 did not stop"
    rm -f "$ROOT/run/slurmd-$2.pid" ;;
  start-slurmd)
    [ -n "${2:-}" ] || die "usage: $0 start-slurmd NODE"
    daemon_up slurmd "$2" || slurmd -N "$2"
    for ((i = 0; i < 100; i++)); do daemon_up slurmd "$2" && exit 0; sleep 0.1; done
    die "slurmd -N $2 did not start (see $ROOT/log/slurmd-$2.log)" ;;
  restart-slurmctld)
    # Also the process a reconfigure is re-executing into, which the pid file does not name yet.
    stop_daemons slurmctld || die "slurmctld did not stop"
    stop_daemons slurmscriptd || die "slurmscriptd did not stop"
    rm -f "$ROOT/run/slurmctld.pid"
    slurmctld
    # Done when the one it started (its pid file: written before it listens) is this cluster's only slurmctld and
    # answers. One that fails to start (e.g. "Address already in use") leaves its pid in the file and is gone.
    for ((i = 0; i < 300; i++)); do
      started=$(tr -dc 0-9 2>/dev/null < "$ROOT/run/slurmctld.pid" || true)
      pids=$(daemon_pids slurmctld | xargs)
      if [ -n "$started" ] && [ "$pids" = "$started" ] && timeout 5 scontrol ping 2>/dev/null | grep -q 'is UP'; then
        exit 0
      fi
      if [ -n "$started" ] && [ ! -d "/proc/$started" ]; then  # twice: a handover rewrites the file at once
        [ "$started" = "${dead:-}" ] &&
          die "the slurmctld started (pid $started) exited; running: ${pids:-none} (see $ROOT/log/slurmctld.log)"
        dead=$started
      fi
      sleep 0.2
    done
    die "slurmctld did not answer as the only one of $ROOT within 60 s (pid file: ${started:-none}; running: ${pids:-none}; see $ROOT/log/slurmctld.log)" ;;
  *) echo "usage: $0 stop-slurmd NODE | start-slurmd NODE | restart-slurmctld" >&2; exit 2 ;;
esac
