#!/usr/bin/env bash
# A Slurm 22.05 test cluster whose nodes have their own network, next to the default one (docker-slurm/cluster.sh).
#
#   docker-slurm/cluster.sh start netns     # = docker-slurm/netns-cluster.sh start; also stop|status|env
#   docker-slurm/netns-cluster.sh link x2 down|up        # cut / heal node x2's link (slurmd, agent, jobs)
#   docker-slurm/netns-cluster.sh block x2 18000|off     # drop TCP to/from one port of x2 (its agent), or heal
#   docker-slurm/netns-cluster.sh loss x2 5|off          # drop that percentage of x2's packets, both ways
#   docker-slurm/netns-cluster.sh block ctl 19817|off    # the controller namespace cut off from slurmctld
#
# Each node xK runs `slurmd -N xK` (and, where tests start one, its agent) in its own network namespace se-xK,
# joined to the bridge sebr0 by a veth pair, at 10.77.0.(10+K); every slurmd listens on the same port at its own
# address (NodeAddr in slurm.conf). slurmctld and slurmdbd run in the root namespace on the bridge address
# 10.77.0.1, on their own ports; a namespace se-ctl (10.77.0.2) is where tests run the controller, so it can be cut
# off from slurmctld alone. Namespaces are entered with `nsenter --net` only (not `ip netns exec`, which remounts
# /sys and hides the cgroup tree slurmd needs).
# Shared with the default cluster, which must be up (CI starts it first): its munged (MUNGE sockets are files, so
# every namespace reaches the one socket Slurm 22.05 clients insist on) and its MariaDB server, in which this cluster
# keeps its own database. Everything else (config, spool, logs, pids, GPU device nodes) is under its own root.
# The kernel here has no sch_netem: loss is nftables `numgen random` (drop), and there is no added latency.
# Facts: docs/slurm-facts.md and docs/test-cluster.md.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
ROOT=${SLURM_ELASTIC_NETNS_CLUSTER_DIR:-/var/tmp/slurm-elastic-cluster-netns}
SHARED_ROOT=${SLURM_ELASTIC_CLUSTER_DIR_2205:-/var/tmp/slurm-elastic-cluster}
NODES=${SLURM_ELASTIC_NODES:-4}
GPUS_PER_NODE=4
CLUSTER_NAME=elasticnet
CTLD_PORT=19817
DBD_PORT=19819
SLURMD_PORT=17500              # the same on every node: each has its own address
MYSQL_PORT=13306               # the default cluster's MariaDB
GPU_MAJOR=240
DB_USER=slurm
DB_PASS=slurm-elastic-test
DB_NAME=slurm_acct_db_netns
BRIDGE=sebr0
NET=10.77.0
CTL_ADDR=$NET.1                # slurmctld and slurmdbd (root namespace, on the bridge)
HOST=$(hostname -s)
NODELIST="x[1-$NODES]"
MUNGE_SOCKET=/run/munge/munge.socket.2
# SlurmctldDebug and SlurmdDebug (default: the default cluster's, info). debug logs step kills and the signals
# slurmd delivers (the soak's long runs: docs/reliability.md); SLURM_ELASTIC_NETNS_DEBUG_FLAGS: slurmctld's DebugFlags
# (Steps logs every step cancel with its sender's uid). Written at start, so restart to change them.
DEBUG_LEVEL=${SLURM_ELASTIC_NETNS_DEBUG:-}
DEBUG_FLAGS=${SLURM_ELASTIC_NETNS_DEBUG_FLAGS:-}
export SLURM_CONF="$ROOT/etc/slurm.conf"
DAEMON_ROOTDIR=/  # this cluster's daemons: host processes with our SLURM_CONF (daemon-lib.sh)
# shellcheck source=docker-slurm/daemon-lib.sh
. "$HERE/daemon-lib.sh"

log() { printf 'cluster netns: %s\n' "$*" >&2; }
die() { printf 'cluster netns: error: %s\n' "$*" >&2; exit 1; }

node_names() { local i; for ((i = 1; i <= NODES; i++)); do echo "x$i"; done; }
node_addr() { echo "$NET.$((10 + ${1#x}))"; }

wait_for() {  # seconds what command...
  local secs=$1 what=$2 deadline=$((SECONDS + $1)); shift 2
  while ((SECONDS < deadline)); do
    if [ "$(type -t "$1")" = function ]; then "$@" >/dev/null 2>&1 && return 0
    else timeout 15 "$@" >/dev/null 2>&1 && return 0; fi
    sleep 0.3
  done
  die "timed out after ${secs}s waiting for $what (logs: $ROOT/log)"
}

in_ns() { local ns=$1; shift; nsenter --net="/run/netns/$ns" "$@"; }

# --- the network: a bridge in the root namespace, one namespace + veth pair per node and for the controller ---
make_ns() {  # name address
  local ns=$1 addr=$2 veth="sev-${1#se-}"
  [ -e "/run/netns/$ns" ] || ip netns add "$ns"
  if ! ip link show "$veth" >/dev/null 2>&1; then
    ip link add "$veth" type veth peer name eth0 netns "$ns"
  fi
  ip link set "$veth" master "$BRIDGE"
  ip link set "$veth" up
  in_ns "$ns" ip link set lo up
  in_ns "$ns" ip addr replace "$addr/24" dev eth0
  in_ns "$ns" ip link set eth0 up
}

make_network() {
  command -v nft >/dev/null || die "nft not found: run scripts/bootstrap (installs nftables)"
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then ip link add "$BRIDGE" type bridge; fi
  ip addr replace "$CTL_ADDR/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  local n
  for n in $(node_names); do make_ns "se-$n" "$(node_addr "$n")"; port_range "$n"; done
  make_ns se-ctl "$NET.2"
}

# Every node's processes share this host's name (NodeHostname), so an srun reports that name as its host and
# slurmctld sends each srun's messages (SRUN_JOB_COMPLETE when its job ends, SRUN_PING, ...) to the first node
# with that hostname, x1, at the srun's port: whichever srun listens on that port in x1's namespace gets another
# job's message (seen in the soak: a leader's srun on x1 took an ending extension's SRUN_JOB_COMPLETE for its own,
# aborted and killed its step; docs/reliability.md). Disjoint ephemeral port ranges per node namespace keep an srun
# on another node from ever sharing a port with one on x1, so such a message finds no listener, as on a cluster whose
# nodes have their own names.
port_range() {  # node
  local k=${1#x} span=$((40000 / NODES))
  ((span <= 7000)) || span=7000
  in_ns "se-$1" sysctl -q -w net.ipv4.ip_local_port_range="$((20000 + (k - 1) * span)) $((20000 + k * span - 1))"
}

remove_network() {
  local ns
  for ns in $(node_names) ctl; do
    ip link del "sev-$ns" 2>/dev/null || true
    [ -e "/run/netns/se-$ns" ] && ip netns del "se-$ns" 2>/dev/null || true
  done
  ip link del "$BRIDGE" 2>/dev/null || true
}

ns_of() {  # x2 | ctl -> se-x2 | se-ctl
  case "$1" in ctl) echo se-ctl ;; x[0-9]*) echo "se-$1" ;; *) die "no such namespace: $1 (x1..x$NODES or ctl)" ;; esac
}

# Faults: nftables tables in the namespace, one per kind, so each heals on its own.
fault_table() {  # ns table rule...   (replaces the table's rules)
  local ns=$1 table=$2; shift 2
  in_ns "$ns" nft delete table inet "$table" 2>/dev/null || true
  [ "$#" -eq 0 ] && return 0
  in_ns "$ns" nft add table inet "$table"
  in_ns "$ns" nft add chain inet "$table" in '{ type filter hook input priority 0; }'
  in_ns "$ns" nft add chain inet "$table" out '{ type filter hook output priority 0; }'
  local rule
  for rule in "$@"; do
    in_ns "$ns" nft add rule inet "$table" in $rule
    in_ns "$ns" nft add rule inet "$table" out $rule
  done
}

cmd_link() {  # node down|up
  local ns; ns=$(ns_of "$1")
  case "${2:-}" in down|up) in_ns "$ns" ip link set eth0 "$2" ;; *) die "link $1 down|up" ;; esac
}

cmd_block() {  # node port|off: drop TCP from and to that port (its agent, or slurmctld's port from se-ctl)
  local ns; ns=$(ns_of "$1")
  case "${2:-}" in
    off) fault_table "$ns" se_block ;;
    [0-9]*) fault_table "$ns" se_block "tcp sport $2 drop" "tcp dport $2 drop" ;;
    *) die "block $1 PORT|off" ;;
  esac
}

cmd_loss() {  # node percent|off
  local ns; ns=$(ns_of "$1")
  case "${2:-}" in
    off) fault_table "$ns" se_loss ;;
    [0-9]*) fault_table "$ns" se_loss "numgen random mod 100 < $2 drop" ;;
    *) die "loss $1 PERCENT|off" ;;
  esac
}

heal_all() {
  local n
  for n in $(node_names) ctl; do
    [ -e "/run/netns/$(ns_of "$n")" ] || continue
    cmd_link "$n" up; cmd_block "$n" off; cmd_loss "$n" off
  done
}

# --- files ------------------------------------------------------------------------------------------------
make_dirs() {
  mkdir -p "$ROOT"/{etc,log,run,spool/ctld,dev,gpu-map,vgpu,jobs}
  chmod 755 "$ROOT" "$ROOT/etc" "$ROOT/dev"
  chmod 1777 "$ROOT/vgpu" "$ROOT/jobs"
  local n i minor
  for n in $(node_names); do
    mkdir -p "$ROOT/spool/d/$n" "$ROOT/dev/$n" "$ROOT/gpu-map/$n"
    for ((i = 0; i < GPUS_PER_NODE; i++)); do
      minor=$(( (${n#x} - 1) * GPUS_PER_NODE + i ))
      [ -c "$ROOT/dev/$n/gpu$i" ] || { rm -f "$ROOT/dev/$n/gpu$i"; mknod -m 666 "$ROOT/dev/$n/gpu$i" c "$GPU_MAJOR" "$minor"; }
    done
  done
}

write_config() {
  local etc=$ROOT/etc n
  [ -f "$SHARED_ROOT/etc/slurm.conf" ] || die "needs the default cluster: run docker-slurm/cluster.sh start first"
  local debug=()
  case "$DEBUG_LEVEL" in
    '') ;;
    quiet|fatal|error|info|verbose|debug|debug2|debug3|debug4|debug5)
      debug=(-e "s|^SlurmctldDebug=.*|SlurmctldDebug=$DEBUG_LEVEL|" -e "s|^SlurmdDebug=.*|SlurmdDebug=$DEBUG_LEVEL|") ;;
    *) die "SLURM_ELASTIC_NETNS_DEBUG=$DEBUG_LEVEL: not a Slurm debug level (info, verbose, debug, debug2..debug5)" ;;
  esac
  [[ $DEBUG_FLAGS =~ ^[A-Za-z,]*$ ]] || die "SLURM_ELASTIC_NETNS_DEBUG_FLAGS=$DEBUG_FLAGS: a comma-separated list of names"
  # The default cluster's configuration with this cluster's name, addresses, ports, paths and short timeouts
  # (a cut node is NOT_RESPONDING after ~SlurmdTimeout/3 and DOWN after SlurmdTimeout).
  sed -e "s|^ClusterName=.*|ClusterName=$CLUSTER_NAME|" \
      -e "s|^SlurmctldHost=.*|SlurmctldHost=$HOST($CTL_ADDR)|" \
      -e "s|^SlurmctldPort=.*|SlurmctldPort=$CTLD_PORT|" -e "s|^SlurmdPort=.*|SlurmdPort=$SLURMD_PORT|" \
      -e "s|^AccountingStorageHost=.*|AccountingStorageHost=$CTL_ADDR|" \
      -e "s|^AccountingStoragePort=.*|AccountingStoragePort=$DBD_PORT|" \
      -e "s|^SlurmdTimeout=.*|SlurmdTimeout=10|" -e "s|^MessageTimeout=.*|MessageTimeout=5|" \
      -e "s|^SlurmctldTimeout=.*|SlurmctldTimeout=10|" \
      -e "s|$SHARED_ROOT/|$ROOT/|g" \
      -e '/^NodeName=/d' -e '/^PartitionName=/d' -e '/^Suspend[A-Za-z]*=/d' -e '/^Resume[A-Za-z]*=/d' \
      -e '/^DebugFlags=Power/d' \
      "${debug[@]}" \
      "$SHARED_ROOT/etc/slurm.conf" > "$etc/slurm.conf.tmp"
  {
    echo "TCPTimeout=2"
    [ -z "$DEBUG_FLAGS" ] || echo "DebugFlags=$DEBUG_FLAGS"
    for n in $(node_names); do
      echo "NodeName=$n NodeHostname=$HOST NodeAddr=$(node_addr "$n") Port=$SLURMD_PORT CPUs=8 RealMemory=8000" \
           "Gres=gpu:$GPUS_PER_NODE,mps:$((GPUS_PER_NODE * 100)) State=UNKNOWN"
    done
    echo "PartitionName=train Nodes=$NODELIST Default=YES MaxTime=INFINITE State=UP PriorityTier=1"
    echo "PartitionName=serve Nodes=$NODELIST MaxTime=INFINITE State=UP PriorityTier=10"
  } >> "$etc/slurm.conf.tmp"
  mv "$etc/slurm.conf.tmp" "$etc/slurm.conf"
  write_topology "$etc/topology.conf" x "$NODES" "$NODES"  # leaf1 x[1-2], leaf2 x[3-4]
  : > "$etc/gres.conf"
  for n in $(node_names); do
    printf 'NodeName=%s Name=gpu File=%s/dev/%s/gpu[0-%d]\n' "$n" "$ROOT" "$n" $((GPUS_PER_NODE - 1)) >> "$etc/gres.conf"
    printf 'NodeName=%s Name=mps Count=%d File=%s/dev/%s/gpu[0-%d]\n' \
      "$n" $((GPUS_PER_NODE * 100)) "$ROOT" "$n" $((GPUS_PER_NODE - 1)) >> "$etc/gres.conf"
  done
  cp "$SHARED_ROOT/etc/cgroup.conf" "$etc/cgroup.conf"
  (umask 077; sed -e "s|^DbdAddr=.*|DbdAddr=$CTL_ADDR|" -e "s|^DbdPort=.*|DbdPort=$DBD_PORT|" \
     -e "s|^StorageLoc=.*|StorageLoc=$DB_NAME|" -e "s|$SHARED_ROOT/|$ROOT/|g" \
     "$SHARED_ROOT/etc/slurmdbd.conf" > "$etc/slurmdbd.conf")
  local f
  for f in job_submit.lua prolog.sh epilog.sh; do
    if [ -f "$REPO/plugins/$f" ]; then install -m 0755 "$REPO/plugins/$f" "$etc/$f"
    else install -m 0755 "$SHARED_ROOT/etc/$f" "$etc/$f"; fi
  done
  sed -e "s|$SHARED_ROOT/|$ROOT/|g" "$SHARED_ROOT/etc/slurm-elastic.env" > "$etc/slurm-elastic.env"
  cat > "$ROOT/env.sh" <<EOF
export SLURM_CONF=$ROOT/etc/slurm.conf
export SLURM_ELASTIC_CLUSTER_DIR=$ROOT
export SLURM_ELASTIC_VGPU_DIR=$ROOT/vgpu
export SLURM_ELASTIC_GPU_MAP_DIR=$ROOT/gpu-map
EOF
}

# --- daemons ----------------------------------------------------------------------------------------------
start_daemons() {
  timeout 5 munge -n -S "$MUNGE_SOCKET" >/dev/null 2>&1 ||
    die "no munged on $MUNGE_SOCKET: run docker-slurm/cluster.sh start first (this cluster shares its munged)"
  timeout 10 mariadb --no-defaults --socket="$SHARED_ROOT/mysql/mysqld.sock" -uroot <<EOF ||
CREATE DATABASE IF NOT EXISTS $DB_NAME;
GRANT ALL ON $DB_NAME.* TO '$DB_USER'@'127.0.0.1';
GRANT ALL ON $DB_NAME.* TO '$DB_USER'@'localhost';
EOF
    die "the default cluster's MariaDB does not answer: run docker-slurm/cluster.sh start first"
  if ! daemon_up slurmdbd; then
    slurmdbd  # reads slurmdbd.conf next to $SLURM_CONF
    wait_for 60 slurmdbd sacctmgr -n -P show cluster
    log "slurmdbd up on $CTL_ADDR:$DBD_PORT"
  fi
  sacctmgr -n -P show cluster format=cluster | grep -qx "$CLUSTER_NAME" ||
    sacctmgr -i add cluster "$CLUSTER_NAME" >/dev/null
  local acct ua
  for acct in nlp vision; do
    sacctmgr -n -P show account format=account | grep -qx "$acct" ||
      sacctmgr -i add account "$acct" cluster="$CLUSTER_NAME" >/dev/null
  done
  for ua in alice:nlp bob:vision; do
    sacctmgr -n -P show assoc where user="${ua%%:*}" cluster="$CLUSTER_NAME" format=account | grep -qx "${ua##*:}" ||
      sacctmgr -i add user "${ua%%:*}" account="${ua##*:}" cluster="$CLUSTER_NAME" >/dev/null
  done
  for q in scavenger high; do sacctmgr -n -P show qos format=name | grep -qx $q || sacctmgr -i add qos $q >/dev/null; done
  sacctmgr -i modify user where name=alice,bob,root set qos=normal,high,scavenger defaultqos=normal >/dev/null
  if ! daemon_up slurmctld; then
    slurmctld
    wait_for 60 slurmctld scontrol ping
    log "slurmctld up on $CTL_ADDR:$CTLD_PORT"
  fi
  local n
  for n in $(node_names); do
    daemon_up slurmd "$n" || in_ns "se-$n" slurmd -N "$n"
  done
  for n in $(node_names); do scontrol update NodeName="$n" State=RESUME >/dev/null 2>&1 || true; done
}

nodes_ready() {
  local out
  out=$(timeout 15 sinfo -h -N -o '%N %T') || return 1
  [ "$(awk '{print $1}' <<< "$out" | sort -u | wc -l)" -eq "$NODES" ] &&
    ! awk '$2 ~ /down|unk|not_responding|inval|fail|drain/' <<< "$out" | grep -q .
}

cmd_start() {
  local t0=$SECONDS
  close_inherited_fds
  make_network
  heal_all
  make_dirs
  write_config
  start_daemons
  wait_for 60 "nodes $NODELIST to be ready" nodes_ready
  log "cluster '$CLUSTER_NAME' up in $((SECONDS - t0))s: $NODES nodes in their own network namespaces; source $ROOT/env.sh"
}

cmd_stop() {
  if daemon_up slurmctld; then
    heal_all 2>/dev/null || true
    timeout 30 scancel --full --quiet -u root,alice,bob >/dev/null 2>&1 || true
  fi
  # Every one of this cluster's, not only those its pid files name (docs/slurm-facts.md); munged and MariaDB are
  # the default cluster's.
  stop_all slurmd slurmctld slurmscriptd slurmdbd || die "could not stop every daemon"
  rm -f "$ROOT"/run/*.pid
  remove_network
}

cmd_status() {
  local rc=0 n
  report() { report_daemon "$@" || rc=1; }  # label name [node]
  report slurmdbd slurmdbd
  report slurmctld slurmctld
  for n in $(node_names); do report "slurmd $n" slurmd "$n"; done
  if daemon_up slurmctld; then echo; timeout 15 sinfo -N -o '%N %T %o' || rc=1; fi
  return $rc
}

case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  restart) cmd_stop; cmd_start ;;
  status) cmd_status ;;
  env) cat "$ROOT/env.sh" ;;
  link) cmd_link "${2:-}" "${3:-}" ;;
  block) cmd_block "${2:-}" "${3:-}" ;;
  loss) cmd_loss "${2:-}" "${3:-}" ;;
  heal) heal_all ;;
  *) echo "usage: $0 start|stop|restart|status|env | link NODE down|up | block NODE PORT|off | loss NODE PCT|off | heal" >&2
     exit 2 ;;
esac
