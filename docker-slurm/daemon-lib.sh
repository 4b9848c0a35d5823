# shellcheck shell=bash
# Finding and stopping ONE test cluster's own daemons; sourced by cluster.sh, release-cluster.sh, netns-cluster.sh
# and slurm-daemon.sh, which set, before calling anything here:
#   SLURM_CONF      that cluster's slurm.conf
#   DAEMON_ROOTDIR  the root directory its daemons run in: / (22.05, netns) or a release's root filesystem
#
# A process is that cluster's daemon NAME when
#   - its comm is NAME or NAME-wlm (Debian's /usr/sbin/slurmctld is a link to slurmctld-wlm: a 23.11+ slurmctld or
#     slurmd re-executes /proc/self/exe on `scontrol reconfigure`, so the new process is named slurmctld-wlm),
#   - its environment (/proc/PID/environ, as given to its exec) holds exactly SLURM_CONF=<that conf>: every script
#     here starts its daemons with it, and a re-executed slurmctld/slurmd passes a copy of its own environment on,
#   - its root (/proc/PID/root) is DAEMON_ROOTDIR,
#   - it is not slurmctld's slurmscriptd (SLURMSCRIPTD_MODE=1; named slurmctld-wlm until it renames itself)
#     unless NAME is slurmscriptd,
#   - and, given a NODE, its command line has `-N NODE` (slurmd).
# Pid files are not used to find daemons: while a 23.11+ slurmctld re-executes itself its pid file names the old
# process until the new one has taken over, and a second slurmctld that then fails to bind ("Address already in
# use") leaves its own, dead, pid in the file (docs/slurm-facts.md). Zombies have an empty environ: never matched.

# daemon_pids NAME [NODE]: the pids of this cluster's NAME daemons, one a line (none: empty, status 0)
daemon_pids() {
  local name=$1 node=${2:-} dir comm want_root
  local -a env args
  want_root=$(readlink -m "${DAEMON_ROOTDIR:?}")
  for dir in /proc/[0-9]*; do
    comm=
    read -r comm 2>/dev/null < "$dir/comm" || continue
    [ "$comm" = "$name" ] || [ "$comm" = "$name-wlm" ] || continue
    [ "$(readlink "$dir/root" 2>/dev/null)" = "$want_root" ] || continue
    mapfile -d '' -t env 2>/dev/null < "$dir/environ" || continue
    _daemon_has "SLURM_CONF=${SLURM_CONF:?}" "${env[@]}" || continue
    [ "$name" = slurmscriptd ] || ! _daemon_has SLURMSCRIPTD_MODE=1 "${env[@]}" || continue
    if [ -n "$node" ]; then
      mapfile -d '' -t args 2>/dev/null < "$dir/cmdline" || continue
      _daemon_has_option -N "$node" "${args[@]}" || continue
    fi
    echo "${dir#/proc/}"
  done
}

_daemon_has() {  # word list...: is word one of the list's items
  local want=$1 item; shift
  for item in "$@"; do [ "$item" = "$want" ] && return 0; done
  return 1
}

_daemon_has_option() {  # option value args...: `option value` next to each other in args
  local opt=$1 value=$2; shift 2
  while [ "$#" -ge 2 ]; do
    [ "$1" = "$opt" ] && [ "$2" = "$value" ] && return 0
    shift
  done
  return 1
}

# daemon_up NAME [NODE]: is at least one running
daemon_up() { [ -n "$(daemon_pids "$@")" ]; }

# stop_daemons NAME [NODE]: SIGTERM every one, also one that appears meanwhile (a re-executing slurmctld's new
# process), again every 2 s (a slurmctld drops signals early in its start, before its signal thread runs), until
# two scans in a row find none (one scan is not atomic: a process born after it listed /proc whose parent dies
# before it is read is in neither); SIGKILL what is left after DAEMON_STOP_TIMEOUT (default 30) seconds; fails
# (status 1, message on stderr) if any is still there 5 s after that.
stop_daemons() {
  local name=$1 node=${2:-} what=$1${2:+ $2} deadline resend pids pid signalled=" " killed= empty=0
  deadline=$((SECONDS + ${DAEMON_STOP_TIMEOUT:-30}))
  resend=$((SECONDS + 2))
  while ((empty < 2)); do
    pids=$(daemon_pids "$name" "$node")
    if [ -z "$pids" ]; then empty=$((empty + 1)); continue; fi
    empty=0
    for pid in $pids; do
      case "$signalled" in *" $pid "*) ((SECONDS < resend)) && continue ;; *) signalled+="$pid " ;; esac
      kill -TERM "$pid" 2>/dev/null || true
    done
    ((SECONDS < resend)) || resend=$((SECONDS + 2))
    if ((SECONDS >= deadline)); then
      [ -n "$killed" ] && { echo "error: $what (pids $pids) still running after SIGKILL" >&2; return 1; }
      echo "$what (pids $pids) did not stop within ${DAEMON_STOP_TIMEOUT:-30}s of SIGTERM: SIGKILL" >&2
      # shellcheck disable=SC2086  # one pid a word
      kill -KILL $pids 2>/dev/null || true
      killed=1; deadline=$((SECONDS + 5))
    fi
    sleep 0.1
  done
  if [ "$signalled" != " " ] && declare -F log >/dev/null; then log "stopped $what (pid${signalled% })"; fi
  return 0
}

# stop_all NAME...: stop_daemons for each name in turn (all nodes' slurmd for slurmd); fails on the first that fails
stop_all() {
  local name
  for name in "$@"; do stop_daemons "$name" || return 1; done
}

# report_daemon LABEL NAME [NODE]: one status line, "LABEL up pid ..." or "LABEL DOWN" (then status 1)
report_daemon() {
  local pids
  pids=$(daemon_pids "$2" "${3:-}" | xargs)
  if [ -n "$pids" ]; then printf '%-12s up    pid %s\n' "$1" "$pids"; else printf '%-12s DOWN\n' "$1"; return 1; fi
}

# close_inherited_fds: `flock LOCK <script> start` hands its lock fd to the script, and daemons started from it
# (munged, MariaDB, slurmdbd keep inherited fds) would hold the lock for as long as they run (measured: every later
# flock waited). Call it first in a start.
close_inherited_fds() {
  local fd
  for fd in $(ls /proc/$$/fd); do
    if ((fd > 2 && fd != 255)); then eval "exec $fd>&-" 2>/dev/null || true; fi
  done
}

# write_topology FILE PREFIX ALWAYS_ON TOTAL: a topology.conf (topology/tree) for nodes PREFIX1..PREFIXTOTAL with two
# leaf switches under one spine: leaf1 holds the first half of the always-on nodes, leaf2 the rest and the
# power-saved ones (22.05: leaf1 n[1-2], leaf2 n[3-6]; 4 nodes: [1-2] and [3-4]), so each switch has always-on
# nodes of partition train. Every cluster script writes it next to its slurm.conf (TopologyPlugin=topology/tree):
# grows that keep a job on its leaf switch (slurm_elastic/policy/topology.py) are tested for real. The spine joins
# the leaves, so a job may still span both (Slurm refuses a job only across switches that share no parent).
write_topology() {
  local file=$1 prefix=$2 on=$3 total=$4 half
  half=$(((on + 1) / 2))
  {
    echo "# Generated by docker-slurm (daemon-lib.sh write_topology) -- edits are overwritten on start."
    echo "SwitchName=leaf1 Nodes=${prefix}[1-$half]"
    if ((total > half)); then
      echo "SwitchName=leaf2 Nodes=${prefix}[$((half + 1))-$total]"
      echo "SwitchName=spine Switches=leaf[1-2]"
    fi
  } > "$file"
}
