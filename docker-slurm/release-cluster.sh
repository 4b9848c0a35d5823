#!/usr/bin/env bash
# Slurm 24.11 / 26.05 test clusters, next to the default 22.05 one (docker-slurm/cluster.sh).
#
#   docker-slurm/cluster.sh start 24.11     # = docker-slurm/release-cluster.sh 24.11 start
#   docker-slurm/cluster.sh stop|status|env 26.05
#   docker-slurm/release-cluster.sh 24.11 build   # only build (or reuse) the cached root filesystem
#
# Debian bookworm ships Slurm 22.05 only, so each later release runs from a Debian root filesystem built with
# `debootstrap --variant=minbase` (trixie: 24.11, sid: 26.05) plus Debian's slurm-wlm, slurmdbd, munge and
# mariadb-server, cached under $SLURM_ELASTIC_ROOTFS_DIR (default /var/tmp/slurm-elastic-rootfs/<release>).
# Every daemon (its own munged, MariaDB, slurmdbd, slurmctld, NODES x slurmd -N) runs chrooted there, on its own
# ports; state lives under /var/tmp/slurm-elastic-cluster-<release>, bind-mounted at the same path inside the
# root, as is the checkout, so paths in job scripts and outputs read the same on both sides. Client commands
# (squeue, sbatch, ...) run chrooted too, through wrappers in $ROOT/bin that env.sh puts first in PATH.
# Facts behind the choices: docs/slurm-facts.md and docs/test-cluster.md.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
RELEASE=${1:-}
CMD=${2:-}

case "$RELEASE" in
  24.11) SUITE=trixie; PORT_OFFSET=1000 ;;
  26.05) SUITE=sid; PORT_OFFSET=2000 ;;
  *) echo "usage: $0 24.11|26.05 start|stop|status|env|build" >&2; exit 2 ;;
esac

ROOTFS=${SLURM_ELASTIC_ROOTFS_DIR:-/var/tmp/slurm-elastic-rootfs}/$RELEASE
ROOT=/var/tmp/slurm-elastic-cluster-$RELEASE
SLURM_CONF=$ROOT/etc/slurm.conf
# This cluster's daemons are the processes whose root is ROOTFS and whose SLURM_CONF is ours (daemon-lib.sh).
DAEMON_ROOTDIR=$ROOTFS
# shellcheck source=docker-slurm/daemon-lib.sh
. "$HERE/daemon-lib.sh"
NODES=${SLURM_ELASTIC_NODES:-4}
GPUS_PER_NODE=4
CLUSTER_NAME=elastic$(tr -d . <<< "$RELEASE")
CTLD_PORT=$((16817 + PORT_OFFSET))
DBD_PORT=$((16819 + PORT_OFFSET))
MYSQL_PORT=$((13306 + PORT_OFFSET))
NODE_PORT_BASE=$((17000 + PORT_OFFSET / 10))  # not 18001-18004: the agents of the cluster tests listen there
GPU_MAJOR=240
DB_USER=slurm
DB_PASS=slurm-elastic-test
HOST=$(hostname -s)
NODELIST="n[1-$NODES]"
# python3: the cluster tests' jobs run the virtual-GPU workload (stdlib only) with /usr/bin/python3 inside the root.
PACKAGES="slurm-wlm slurmdbd munge mariadb-server mariadb-client lua5.3 procps python3"

log() { printf 'cluster %s: %s\n' "$RELEASE" "$*" >&2; }
die() { printf 'cluster %s: error: %s\n' "$RELEASE" "$*" >&2; exit 1; }

mirror() {
  local m
  m=$(grep -hvE '^[[:space:]]*#' /etc/apt/sources.list /etc/apt/sources.list.d/*.sources 2>/dev/null |
      grep -oE 'https?://[^ ]*/debian/?( |$)' | head -1 | tr -d ' ' || true)
  echo "${m:-http://deb.debian.org/debian}"
}

# --- the root filesystem: built once, cached ---------------------------------------------------------------
build_rootfs() {
  if [ -f "$ROOTFS/.slurm-elastic-ready" ]; then return 0; fi
  command -v debootstrap >/dev/null || die "debootstrap not found: apt-get install debootstrap"
  local t0=$SECONDS tmp="$ROOTFS.building"
  unmount_all "$tmp"
  rm -rf "$tmp"
  mkdir -p "$tmp"
  log "building a Debian $SUITE root filesystem in $ROOTFS (minutes, ~1 GB; cached for later starts)"
  log "debootstrap --variant=minbase $SUITE (log: $tmp.log)"
  debootstrap --variant=minbase "$SUITE" "$tmp" "$(mirror)" > "$tmp.log" 2>&1 ||
    die "debootstrap failed: see $tmp.log"
  log "debootstrap done after $((SECONDS - t0))s; installing $PACKAGES"
  # sid's Release file may have expired on the mirror's snapshot: apt would refuse it.
  echo 'Acquire::Check-Valid-Until "false";' > "$tmp/etc/apt/apt.conf.d/99slurm-elastic"
  # No daemon may start inside the root while packages are installed (the host's ports, the host's munged).
  printf '#!/bin/sh\nexit 101\n' > "$tmp/usr/sbin/policy-rc.d"; chmod 755 "$tmp/usr/sbin/policy-rc.d"
  mount_into "$tmp"
  chroot "$tmp" apt-get update >> "$tmp.log" 2>&1 || die "apt-get update failed: see $tmp.log"
  DEBIAN_FRONTEND=noninteractive chroot "$tmp" apt-get install -y --no-install-recommends $PACKAGES \
    >> "$tmp.log" 2>&1 || die "apt-get install failed: see $tmp.log"
  chroot "$tmp" apt-get clean
  unmount_all "$tmp"
  local got
  got=$(chroot "$tmp" slurmctld -V 2>/dev/null | awk '{print $2}')
  case "$got" in "$RELEASE".*) ;; *) die "$SUITE gives Slurm '$got', not $RELEASE" ;; esac
  echo "$got" > "$tmp/.slurm-elastic-ready"
  rm -rf "$ROOTFS"; mv "$tmp" "$ROOTFS"; mv "$tmp.log" "$ROOTFS.build.log"
  log "root filesystem ready: Slurm $got, $(du -sh "$ROOTFS" | cut -f1), built in $((SECONDS - t0))s"
}

ensure_packages() {  # a root cached before PACKAGES grew gets what it lacks (seconds; the build log says what)
  chroot "$ROOTFS" dpkg -s $PACKAGES >/dev/null 2>&1 && return 0
  log "installing into the cached root what it lacks of: $PACKAGES"
  mount_into "$ROOTFS"
  { chroot "$ROOTFS" apt-get update && DEBIAN_FRONTEND=noninteractive chroot "$ROOTFS" \
      apt-get install -y --no-install-recommends $PACKAGES && chroot "$ROOTFS" apt-get clean; } \
    >> "$ROOTFS.build.log" 2>&1 || die "apt-get install failed: see $ROOTFS.build.log"
}

# --- mounts: /proc, /sys, /dev, the cgroup tree, the state dir and the checkout --------------------------
is_mounted() { mountpoint -q "$1" 2>/dev/null; }

bind() {  # src dst [ro]
  mkdir -p "$2"
  is_mounted "$2" || mount --bind "$1" "$2"
}

mount_into() {  # rootfs dir
  local r=$1
  is_mounted "$r/proc" || { mkdir -p "$r/proc"; mount -t proc proc "$r/proc"; }
  bind /sys "$r/sys"
  is_mounted "$r/sys/fs/cgroup" || mount --rbind /sys/fs/cgroup "$r/sys/fs/cgroup" 2>/dev/null || true
  bind /dev "$r/dev"
  bind /dev/pts "$r/dev/pts"
}

unmount_all() {  # rootfs dir: everything mounted below it, deepest first
  local r=$1 m
  [ -d "$r" ] || return 0
  for m in $(awk -v r="$r/" 'index($2, r) == 1 {print $2}' /proc/self/mounts | sort -r); do
    umount -l "$m" 2>/dev/null || true
  done
}

# --- inside the root: users, mounts, wrappers -------------------------------------------------------------
in_root() { chroot "$ROOTFS" env SLURM_CONF="$ROOT/etc/slurm.conf" "$@"; }

copy_users() {  # alice and bob (and root) with the host's uids, so munge credentials name the same users
  local u line
  cp /etc/hosts "$ROOTFS/etc/hosts"  # mariadb-install-db and munged look the host name up
  for u in alice bob; do
    id "$u" >/dev/null 2>&1 || useradd --create-home --shell /bin/bash "$u"
    grep -q "^$u:" "$ROOTFS/etc/passwd" || getent passwd "$u" >> "$ROOTFS/etc/passwd"
    grep -q "^$u:" "$ROOTFS/etc/group" || getent group "$u" >> "$ROOTFS/etc/group"
    line=$(getent shadow "$u" || true)
    [ -z "$line" ] || grep -q "^$u:" "$ROOTFS/etc/shadow" || echo "$line" >> "$ROOTFS/etc/shadow"
  done
}

mount_all() {
  mount_into "$ROOTFS"
  local d
  for d in "$ROOT" "$REPO" /tmp /home; do bind "$d" "$ROOTFS$d"; done
}

write_wrappers() {  # client commands run chrooted: root through chroot, other users in a user namespace
  mkdir -p "$ROOT/bin"
  local c
  for c in squeue sinfo scontrol sbatch scancel sacct sacctmgr sshare srun salloc sprio sstat; do
    cat > "$ROOT/bin/$c" <<EOW
#!/bin/sh
# Slurm $RELEASE's $c, run inside its root filesystem (docker-slurm/release-cluster.sh).
if [ -f /.slurm-elastic-ready ]; then exec /usr/bin/$c "\$@"; fi
if [ "\$(id -u)" = 0 ]; then
  exec chroot "$ROOTFS" /bin/sh -c 'cd "\$1" 2>/dev/null || cd /; shift; exec "\$@"' sh "\$PWD" /usr/bin/$c "\$@"
fi
exec unshare --user --map-current-user --root="$ROOTFS" --wd="\$PWD" /usr/bin/$c "\$@"
EOW
    chmod 755 "$ROOT/bin/$c"
  done
  # The daemons too (root only), so docker-slurm/slurm-daemon.sh (the MIG workflow's restart commands) starts
  # this release's slurmd and slurmctld, chrooted like start_slurm does, when env.sh is sourced.
  for c in slurmd slurmctld; do
    cat > "$ROOT/bin/$c" <<EOW
#!/bin/sh
# Slurm $RELEASE's $c, started inside its root filesystem (docker-slurm/release-cluster.sh).
exec chroot "$ROOTFS" env SLURM_CONF="$ROOT/etc/slurm.conf" /usr/sbin/$c "\$@"
EOW
    chmod 755 "$ROOT/bin/$c"
  done
}

make_dirs() {
  mkdir -p "$ROOT"/{etc,log,run,spool/ctld,munge,mysql,dev,gpu-map,vgpu,jobs,bin}
  chmod 755 "$ROOT" "$ROOT/etc" "$ROOT/dev"
  chmod 1777 "$ROOT/vgpu" "$ROOT/jobs"
  local n i minor
  for ((n = 1; n <= NODES; n++)); do
    mkdir -p "$ROOT/spool/d/n$n" "$ROOT/dev/n$n" "$ROOT/gpu-map/n$n"
    for ((i = 0; i < GPUS_PER_NODE; i++)); do
      minor=$(( (n - 1) * GPUS_PER_NODE + i ))
      [ -c "$ROOT/dev/n$n/gpu$i" ] || { rm -f "$ROOT/dev/n$n/gpu$i"; mknod -m 666 "$ROOT/dev/n$n/gpu$i" c "$GPU_MAJOR" "$minor"; }
    done
  done
}

write_config() {
  local etc=$ROOT/etc
  # The 22.05 cluster's configuration with this cluster's name, ports and paths, then what changed since.
  # Only the always-on nodes: the 22.05 cluster's power-saved CLOUD nodes (their record, their partition and the
  # Suspend*/Resume* settings) are left out, and every node record's port range moves to this cluster's range.
  awk -v shift=$((NODE_PORT_BASE - 17000)) '
    /^NodeName=/ && /State=CLOUD/ { split($1, kv, "="); cloud[kv[2]] = 1; next }
    /^PartitionName=/ { for (i = 2; i <= NF; i++) if ($i ~ /^Nodes=/ && (substr($i, 7) in cloud)) next }
    /^(Suspend|Resume)[A-Za-z]*=/ || /^PrivateData=cloud$/ || /^DebugFlags=Power$/ { next }
    /^NodeName=/ && match($0, /Port=\[[0-9]+-[0-9]+\]/) {
      split(substr($0, RSTART + 6, RLENGTH - 7), p, "-")
      $0 = substr($0, 1, RSTART - 1) "Port=[" p[1] + shift "-" p[2] + shift "]" substr($0, RSTART + RLENGTH)
    }
    { print }' "$SOURCE_ROOT/etc/slurm.conf" |
  sed -e "s|^ClusterName=.*|ClusterName=$CLUSTER_NAME|" \
      -e "s|^SlurmctldHost=.*|SlurmctldHost=$HOST(127.0.0.1)|" \
      -e "s|^SlurmctldPort=.*|SlurmctldPort=$CTLD_PORT|" -e "s|^SlurmdPort=.*|SlurmdPort=$NODE_PORT_BASE|" \
      -e "s|^AccountingStoragePort=.*|AccountingStoragePort=$DBD_PORT|" \
      -e "s|/var/tmp/slurm-elastic-cluster/|$ROOT/|g" > "$etc/slurm.conf"
  sed -e "s|/var/tmp/slurm-elastic-cluster/|$ROOT/|g" "$SOURCE_ROOT/etc/gres.conf" > "$etc/gres.conf"
  write_topology "$etc/topology.conf" n "$NODES" "$NODES"  # no CLOUD nodes: leaf1 n[1-2], leaf2 n[3-4]
  printf '%s\n' "$CGROUP_CONF" > "$etc/cgroup.conf"
  if [ "$CGROUP_CONF" = "CgroupPlugin=disabled" ]; then
    sed -i -e 's|^ProctrackType=.*|ProctrackType=proctrack/linuxproc|' -e 's|^TaskPlugin=.*|TaskPlugin=task/none|' \
      -e 's|^JobAcctGatherType=.*|JobAcctGatherType=jobacct_gather/linux|' "$etc/slurm.conf"
  fi
  (umask 077; sed -e "s|/var/tmp/slurm-elastic-cluster/|$ROOT/|g" -e "s|^DbdPort=.*|DbdPort=$DBD_PORT|" \
     -e "s|^StoragePort=.*|StoragePort=$MYSQL_PORT|" "$SOURCE_ROOT/etc/slurmdbd.conf" > "$etc/slurmdbd.conf")
  sed -e "s|/var/tmp/slurm-elastic-cluster/|$ROOT/|g" -e "s|^port=.*|port=$MYSQL_PORT|" \
    "$SOURCE_ROOT/etc/my.cnf" > "$etc/my.cnf"
  local f
  for f in job_submit.lua prolog.sh epilog.sh; do
    if [ -f "$REPO/plugins/$f" ]; then install -m 0755 "$REPO/plugins/$f" "$etc/$f"; fi
  done
  sed -e "s|/var/tmp/slurm-elastic-cluster/|$ROOT/|g" "$SOURCE_ROOT/etc/slurm-elastic.env" > "$etc/slurm-elastic.env"
  cat > "$ROOT/env.sh" <<EOE
export SLURM_CONF=$ROOT/etc/slurm.conf
export SLURM_ELASTIC_CLUSTER_DIR=$ROOT
export SLURM_ELASTIC_VGPU_DIR=$ROOT/vgpu
export SLURM_ELASTIC_GPU_MAP_DIR=$ROOT/gpu-map
export SLURM_ELASTIC_RELEASE=$RELEASE
export SLURM_ELASTIC_ROOTFS=$ROOTFS
export PATH=$ROOT/bin:\$PATH
EOE
}

wait_for() {  # seconds what command...   (in_root commands get a timeout inside the root)
  local secs=$1 what=$2 deadline=$((SECONDS + $1)); shift 2
  while ((SECONDS < deadline)); do
    if [ "$1" = in_root ]; then shift; in_root timeout 15 "$@" >/dev/null 2>&1 && return 0; set -- in_root "$@"
    elif [ "$(type -t "$1")" = function ]; then "$@" >/dev/null 2>&1 && return 0
    else timeout 15 "$@" >/dev/null 2>&1 && return 0; fi
    sleep 0.3
  done
  die "timed out after ${secs}s waiting for $what (logs: $ROOT/log)"
}

start_daemons() {
  if ! daemon_up munged; then
    [ -s "$ROOT/munge/munge.key" ] || (umask 077; dd if=/dev/urandom of="$ROOT/munge/munge.key" bs=1024 count=1 status=none)
    chmod 0700 "$ROOT/munge"; chmod 0400 "$ROOT/munge/munge.key"
    mkdir -p "$ROOTFS/run/munge"; rm -f "$ROOTFS/run/munge/munge.socket.2"*
    in_root munged --force --key-file="$ROOT/munge/munge.key" --pid-file="$ROOT/run/munged.pid" \
      --log-file="$ROOT/log/munged.log" --seed-file="$ROOT/munge/munged.seed"
    wait_for 10 munged in_root munge -n
    log "munged up (its own key and socket)"
  fi
  if ! daemon_up mariadbd; then
    if [ ! -d "$ROOT/mysql/data/mysql" ]; then
      log "initialising MariaDB"
      in_root mariadb-install-db --defaults-file="$ROOT/etc/my.cnf" --user=root --skip-test-db \
        --auth-root-authentication-method=socket > "$ROOT/log/mysql-install.log" 2>&1 || die "mariadb-install-db failed"
    fi
    rm -f "$ROOT/mysql/mysqld.sock"
    in_root setsid mariadbd --defaults-file="$ROOT/etc/my.cnf" < /dev/null >> "$ROOT/log/mysqld.log" 2>&1 &
    wait_for 60 MariaDB in_root mariadb --no-defaults --socket="$ROOT/mysql/mysqld.sock" -uroot -e 'SELECT 1'
    in_root mariadb --no-defaults --socket="$ROOT/mysql/mysqld.sock" -uroot <<EOS
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS '$DB_USER'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
CREATE USER IF NOT EXISTS '$DB_USER'@'localhost' IDENTIFIED BY '$DB_PASS';
GRANT ALL ON slurm_acct_db.* TO '$DB_USER'@'127.0.0.1';
GRANT ALL ON slurm_acct_db.* TO '$DB_USER'@'localhost';
FLUSH PRIVILEGES;
EOS
    log "MariaDB up on 127.0.0.1:$MYSQL_PORT"
  fi
  if ! daemon_up slurmdbd; then
    in_root slurmdbd
    wait_for 60 slurmdbd in_root sacctmgr -n -P show cluster
    log "slurmdbd up on 127.0.0.1:$DBD_PORT"
  fi
}

sacct_add() {
  local out
  out=$(in_root sacctmgr -i "$@" 2>&1) || { grep -qiE 'already exists|nothing new' <<< "$out" && return 0; die "sacctmgr $*: $out"; }
}

setup_accounting() {
  in_root sacctmgr -n -P show cluster format=cluster | grep -qx "$CLUSTER_NAME" || sacct_add add cluster "$CLUSTER_NAME"
  local q
  for q in scavenger high; do in_root sacctmgr -n -P show qos format=name | grep -qx $q || sacct_add add qos $q; done
  in_root sacctmgr -i modify qos scavenger set priority=0 >/dev/null
  in_root sacctmgr -i modify qos normal set priority=10 preempt=scavenger >/dev/null
  in_root sacctmgr -i modify qos high set priority=1000 preempt=scavenger preemptmode=requeue >/dev/null
  local acct ua
  for acct in nlp:2 vision:1; do
    in_root sacctmgr -n -P show account format=account | grep -qx "${acct%%:*}" ||
      sacct_add add account "${acct%%:*}" cluster="$CLUSTER_NAME" fairshare="${acct##*:}" \
        description="${acct%%:*} research" organization=lab
  done
  for ua in alice:nlp bob:vision; do
    in_root sacctmgr -n -P show assoc where user="${ua%%:*}" format=account | grep -qx "${ua##*:}" ||
      sacct_add add user "${ua%%:*}" account="${ua##*:}" cluster="$CLUSTER_NAME"
  done
  in_root sacctmgr -i modify user where name=alice,bob,root set qos=normal,high,scavenger defaultqos=normal >/dev/null
}

nodes_ready() {
  local out
  out=$(in_root sinfo -h -N -o '%N %T' 2>/dev/null) || return 1
  [ "$(awk '{print $1}' <<< "$out" | sort -u | wc -l)" -eq "$NODES" ] &&
    ! awk '$2 ~ /down|unk|not_responding|inval|fail/' <<< "$out" | grep -q .
}

start_slurm() {
  if ! daemon_up slurmctld; then
    in_root slurmctld
    wait_for 60 slurmctld in_root scontrol ping
    log "slurmctld up on 127.0.0.1:$CTLD_PORT"
  fi
  local n
  for ((n = 1; n <= NODES; n++)); do
    daemon_up slurmd "n$n" || in_root slurmd -N "n$n" || true
  done
  for ((n = 1; n <= NODES; n++)); do
    in_root scontrol update NodeName="n$n" State=RESUME >/dev/null 2>&1 || true
  done
}

cmd_start() {
  close_inherited_fds  # a caller's `flock LOCK cluster.sh start <release>` must not live on in the daemons
  local t0=$SECONDS
  [ -f "$SOURCE_ROOT/etc/slurm.conf" ] ||
    die "needs the 22.05 cluster's configuration in $SOURCE_ROOT/etc: run docker-slurm/cluster.sh start once"
  build_rootfs
  ensure_packages
  log "root filesystem $ROOTFS (Slurm $(cat "$ROOTFS/.slurm-elastic-ready"))"
  copy_users
  make_dirs
  mount_all
  CGROUP_CONF=$(cat "$ROOT/etc/.cgroup-mode" 2>/dev/null || echo "CgroupPlugin=autodetect
ConstrainDevices=yes
ConstrainCores=no
ConstrainRAMSpace=no")
  write_config
  write_wrappers
  start_daemons
  setup_accounting
  start_slurm
  local deadline=$((SECONDS + 40))
  while ! nodes_ready && ((SECONDS < deadline)); do sleep 0.5; done
  if ! nodes_ready && [ "$CGROUP_CONF" != "CgroupPlugin=disabled" ]; then
    log "slurmd does not start with cgroups in the chroot (see $ROOT/log/slurmd-n1.log); CgroupPlugin=disabled"
    echo "CgroupPlugin=disabled" > "$ROOT/etc/.cgroup-mode"
    cmd_stop_slurm
    CGROUP_CONF="CgroupPlugin=disabled"
    write_config
    start_slurm
  fi
  wait_for 90 "nodes to be ready" nodes_ready
  log "cluster '$CLUSTER_NAME' (Slurm $RELEASE) up in $((SECONDS - t0))s: $NODES nodes x $GPUS_PER_NODE GPUs; source $ROOT/env.sh"
}

stop() {  # name: every one of this cluster's (daemon-lib.sh: also a re-executed slurmctld or slurmd)
  stop_daemons "$1" || die "could not stop $1"
}

cmd_stop_slurm() {
  stop slurmd
  stop slurmctld
  stop slurmscriptd
  rm -f "$ROOT"/run/slurmd-*.pid "$ROOT/run/slurmctld.pid"
}

cmd_stop() {
  local u  # one user each: 26.05's scancel refuses a list ("Invalid user name: root,alice,bob")
  if daemon_up slurmctld; then for u in root alice bob; do in_root timeout 30 scancel --full --quiet -u "$u" || true; done; fi
  cmd_stop_slurm
  stop slurmdbd
  stop mariadbd
  stop munged
  rm -f "$ROOT/run/slurmdbd.pid" "$ROOT/run/mysqld.pid" "$ROOT/run/munged.pid"
  unmount_all "$ROOTFS"
}

cmd_status() {
  local rc=0 n
  report() { report_daemon "$@" || rc=1; }  # label name [node]
  report munged munged
  report mariadb mariadbd
  report slurmdbd slurmdbd
  report slurmctld slurmctld
  for ((n = 1; n <= NODES; n++)); do report "slurmd n$n" slurmd "n$n"; done
  if daemon_up slurmctld; then echo; in_root sinfo -o '%P %a %D %T %N %G' || rc=1; fi
  return $rc
}

SOURCE_ROOT=${SLURM_ELASTIC_CLUSTER_DIR_2205:-/var/tmp/slurm-elastic-cluster}

case "$CMD" in
  build) build_rootfs ;;
  start) cmd_start ;;
  stop) cmd_stop ;;
  restart) cmd_stop; cmd_start ;;
  status) cmd_status ;;
  env) cat "$ROOT/env.sh" ;;
  *) echo "usage: $0 24.11|26.05 start|stop|restart|status|env|build" >&2; exit 2 ;;
esac
