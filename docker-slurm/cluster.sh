#!/usr/bin/env bash
# slurm-elastic test cluster: a real Slurm 22.05 cluster on this one host.
#
#   docker-slurm/cluster.sh start    # idempotent: starts what is not running, waits until nodes are idle
#   docker-slurm/cluster.sh stop     # cancels jobs, then stops only the daemons this script started (by pid)
#   docker-slurm/cluster.sh status   # which daemons are up, then sinfo; exit 0 only when all are up
#   docker-slurm/cluster.sh env      # prints `export SLURM_CONF=...` lines for your shell
#   docker-slurm/cluster.sh start 24.11   # the same for Slurm 24.11 or 26.05, next to this one
#                                         # (docker-slurm/release-cluster.sh; 22.05 is the default)
#   docker-slurm/cluster.sh start netns   # 22.05 with each node in its own network namespace, next to this one
#                                         # (docker-slurm/netns-cluster.sh: link cuts, port blocks, loss)
#   docker-slurm/cluster.sh start lane2   # a second (lane3: third), identical 22.05 instance for scripts/test's
#                                         # second (third) lane of cluster tests (SLURM_ELASTIC_CLUSTER_LANES;
#                                         # needs this one up)
#
# Parts: munged, MariaDB, slurmdbd, slurmctld and NODES x `slurmd -N nX` (one port each,
# SlurmdParameters=config_overrides). GPUs are character device nodes this script makes (mknod c 240 N), so
# Slurm hands jobs CUDA_VISIBLE_DEVICES / SLURM_JOB_GPUS exactly as on a GPU node. All state, logs and config
# live under $SLURM_ELASTIC_CLUSTER_DIR (default /var/tmp/slurm-elastic-cluster). Facts behind the choices:
# docs/slurm-facts.md and docs/test-cluster.md.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
# lane2 and lane3 (docs/test-cluster.md "Lanes"): the same cluster (nodes n1..n6, accounts, QOS, partitions) with
# its own root, ports, cluster name, slurmdbd and database, GPU device major and job ids. It shares this instance's
# munged (Slurm 22.05 clients only use the standard socket) and MariaDB server, which it never starts or stops. Its
# nodes have the same names, so their slurmd share the cgroup directories /slurm_nX (Debian's multiple-slurmd
# prefix, not configurable in 22.05): job ids from FirstJobId=1000000 (lane3: 2000000) keep the job cgroups
# (job_<id>) apart.
LANE=1
case "${2:-}" in lane2) LANE=2 ;; lane3) LANE=3 ;; esac
LANE_DIR_VAR=SLURM_ELASTIC_LANE${LANE}_CLUSTER_DIR
if [ "$LANE" != 1 ]; then
  ROOT=${!LANE_DIR_VAR:-/var/tmp/slurm-elastic-cluster-lane$LANE}
else
  ROOT=${SLURM_ELASTIC_CLUSTER_DIR:-/var/tmp/slurm-elastic-cluster}
fi
SHARED_ROOT=$ROOT  # the instance whose munged and MariaDB this one uses (itself, unless lane2/lane3)
NODES=${SLURM_ELASTIC_NODES:-4}
# Power-saved nodes n$((NODES+1)).. in their own hidden partition `cold` (docs/power-saving.md): Slurm powers them
# up through ResumeProgram when a job lands on them and down again after SuspendTime idle. n1..nNODES stay on.
POWER_NODES=${SLURM_ELASTIC_POWER_NODES:-2}
POWER_BOOT_S=${SLURM_ELASTIC_POWER_BOOT_S:-3}               # ResumeProgram's boot delay before slurmd starts
POWER_SUSPEND_TIME=${SLURM_ELASTIC_POWER_SUSPEND_TIME:-20}  # idle seconds before Slurm powers a node down
POWER_RESUME_TIMEOUT=${SLURM_ELASTIC_POWER_RESUME_TIMEOUT:-30}
GPUS_PER_NODE=4
CLUSTER_NAME=elastic
CTLD_PORT=16817
DBD_PORT=16819
MYSQL_PORT=13306
NODE_PORT_BASE=17000          # node nX listens on NODE_PORT_BASE + X
GPU_MAJOR=240                 # "local/experimental use" major: nothing ever opens these nodes
DB_USER=slurm
DB_PASS=slurm-elastic-test
DB_NAME=slurm_acct_db
FIRST_JOB_ID=1
if [ "$LANE" != 1 ]; then     # lane2 | lane3
  SHARED_ROOT=${SLURM_ELASTIC_CLUSTER_DIR_2205:-/var/tmp/slurm-elastic-cluster}
  CLUSTER_NAME=elastic$LANE
  CTLD_PORT=$((16897 + 10 * LANE))              # lane2 16917, lane3 16927
  DBD_PORT=$((CTLD_PORT + 2))
  NODE_PORT_BASE=$((17100 + 100 * LANE))        # lane2 17300, lane3 17400; 17101+ and 17201+ are the release
                                                # clusters', 17500 the netns cluster's
  GPU_MAJOR=$((239 + LANE))   # its own device numbers (241, 242): no device cgroup rule of one lane admits another's
  DB_NAME=slurm_acct_db_lane$LANE
  FIRST_JOB_ID=$((1000000 * (LANE - 1)))
fi
HOST=$(hostname -s)
NODELIST="n[1-$NODES]"
POWER_NODELIST="n[$((NODES + 1))-$((NODES + POWER_NODES))]"
export SLURM_CONF="$ROOT/etc/slurm.conf"
DAEMON_ROOTDIR=/  # this cluster's daemons: host processes with our SLURM_CONF (daemon-lib.sh)
# shellcheck source=docker-slurm/daemon-lib.sh
. "$HERE/daemon-lib.sh"

log() { printf 'cluster: %s\n' "$*" >&2; }
die() { printf 'cluster: error: %s\n' "$*" >&2; exit 1; }
if [ "$LANE" != 1 ] && [ "$(realpath -m "$ROOT")" = "$(realpath -m "$SHARED_ROOT")" ]; then
  die "lane$LANE needs its own directory, not $ROOT ($LANE_DIR_VAR)"
fi

node_names() { local i; for ((i = 1; i <= NODES; i++)); do echo "n$i"; done; }
power_node_names() { local i; for ((i = NODES + 1; i <= NODES + POWER_NODES; i++)); do echo "n$i"; done; }
all_node_names() { node_names; power_node_names; }

wait_for() {  # seconds description command...   (a deadline, not a count: each try may itself be slow)
  local secs=$1 what=$2 deadline; shift 2
  deadline=$((SECONDS + secs))
  while ((SECONDS < deadline)); do
    if [ "$(type -t "$1")" = function ]; then "$@" >/dev/null 2>&1 && return 0
    else timeout 15 "$@" >/dev/null 2>&1 && return 0; fi
    sleep 0.3
  done
  die "timed out after ${secs}s waiting for $what (logs: $ROOT/log)"
}

# --- one-time host preparation ---------------------------------------------------------------------------
require_packages() {
  local b
  for b in munged mysqld mariadb-install-db slurmdbd slurmctld slurmd sacctmgr; do
    command -v "$b" >/dev/null || [ -x "/usr/sbin/$b" ] ||
      die "$b not found: run scripts/bootstrap first (installs Debian's slurm-wlm, munge, mariadb)"
  done
}

ensure_users() {
  # Real Linux users for multi-user tests: alice in account nlp, bob in account vision.
  local u
  for u in alice bob; do
    id "$u" >/dev/null 2>&1 || useradd --create-home --shell /bin/bash "$u"
  done
}

make_dirs() {
  mkdir -p "$ROOT"/{etc,log,run,spool/ctld,munge,mysql,dev,gpu-map} "$ROOT/vgpu" "$ROOT/jobs"
  chmod 755 "$ROOT" "$ROOT/etc" "$ROOT/dev"
  chmod 1777 "$ROOT/vgpu" "$ROOT/jobs"
  local n i minor=0
  for n in $(all_node_names); do
    mkdir -p "$ROOT/spool/d/$n" "$ROOT/dev/$n" "$ROOT/gpu-map/$n"
    for ((i = 0; i < GPUS_PER_NODE; i++)); do
      minor=$(( (${n#n} - 1) * GPUS_PER_NODE + i ))
      local dev="$ROOT/dev/$n/gpu$i"
      if [ ! -c "$dev" ]; then rm -f "$dev"; mknod -m 666 "$dev" c "$GPU_MAJOR" "$minor"; fi
    done
  done
}

# --- configuration (rewritten on every start: the checkout may have moved) ------------------------------
write_config() {
  local etc=$ROOT/etc
  cat > "$etc/slurm.conf" <<EOF
# Generated by docker-slurm/cluster.sh -- edits are overwritten on start.
ClusterName=$CLUSTER_NAME
FirstJobId=$FIRST_JOB_ID
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$NODE_PORT_BASE
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$ROOT/spool/ctld
SlurmdSpoolDir=$ROOT/spool/d/%n
SlurmctldPidFile=$ROOT/run/slurmctld.pid
SlurmdPidFile=$ROOT/run/slurmd-%n.pid
SlurmctldLogFile=$ROOT/log/slurmctld.log
SlurmdLogFile=$ROOT/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# Several slurmd on one host: each node keeps its configured CPUs/GRES instead of what the host has.
SlurmdParameters=config_overrides
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=60
MessageTimeout=20
KillWait=5
MinJobAge=120
InactiveLimit=0
MailProg=/bin/true
# Real Slurm cgroups, as on a site: pid -> job mapping and device constraint are the production ones.
ProctrackType=proctrack/cgroup
TaskPlugin=task/cgroup
JobAcctGatherType=jobacct_gather/cgroup
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# Two leaf switches under a spine (topology.conf, daemon-lib.sh write_topology): n1-n2 on leaf1, n3-n6 on leaf2.
TopologyPlugin=topology/tree
GresTypes=gpu,mps
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=5,sched_min_interval=200000
PriorityType=priority/multifactor
PriorityWeightQOS=10000
PriorityWeightPartition=1000
PriorityWeightFairshare=1000
PriorityWeightAge=100
PriorityDecayHalfLife=1-0
PreemptType=preempt/qos
PreemptMode=REQUEUE
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
AccountingStorageEnforce=associations,limits,qos
AccountingStorageTRES=gres/gpu,gres/mps
JobCompType=jobcomp/none
JobSubmitPlugins=lua
Prolog=$etc/prolog.sh
Epilog=$etc/epilog.sh
NodeName=$NODELIST NodeHostname=$HOST NodeAddr=127.0.0.1 Port=[$((NODE_PORT_BASE + 1))-$((NODE_PORT_BASE + NODES))] CPUs=8 RealMemory=8000 Gres=gpu:$GPUS_PER_NODE,mps:$((GPUS_PER_NODE * 100)) State=UNKNOWN
PartitionName=train Nodes=$NODELIST Default=YES MaxTime=INFINITE State=UP PriorityTier=1
PartitionName=serve Nodes=$NODELIST MaxTime=INFINITE State=UP PriorityTier=10
EOF
  if ((POWER_NODES > 0)); then
    cat >> "$etc/slurm.conf" <<EOF
# Power saving (docs/power-saving.md): only the CLOUD nodes of the hidden partition cold are ever powered down.
NodeName=$POWER_NODELIST NodeHostname=$HOST NodeAddr=127.0.0.1 Port=[$((NODE_PORT_BASE + NODES + 1))-$((NODE_PORT_BASE + NODES + POWER_NODES))] CPUs=8 RealMemory=8000 Gres=gpu:$GPUS_PER_NODE,mps:$((GPUS_PER_NODE * 100)) State=CLOUD
PartitionName=cold Nodes=$POWER_NODELIST MaxTime=INFINITE State=UP PriorityTier=1 Hidden=YES
ResumeProgram=$etc/power-resume.sh
SuspendProgram=$etc/power-suspend.sh
SuspendTime=$POWER_SUSPEND_TIME
SuspendTimeout=10
ResumeTimeout=$POWER_RESUME_TIMEOUT
SuspendExcNodes=$NODELIST
ResumeRate=0
SuspendRate=0
PrivateData=cloud
DebugFlags=Power
EOF
    install -m 0755 "$HERE/power-resume.sh" "$HERE/power-suspend.sh" "$etc/"
    cat > "$etc/power.env" <<EOF
SLURM_CONF=$etc/slurm.conf
POWER_LOG=$ROOT/log/power.log
RUN_DIR=$ROOT/run
POWER_BOOT_S=$POWER_BOOT_S
EOF
    : > "$etc/power-fail-nodes"  # a test hook (nodes that never boot): a start forgets what a test left
  fi

  write_topology "$etc/topology.conf" n "$NODES" $((NODES + POWER_NODES))

  : > "$etc/gres.conf.tmp"
  local n
  for n in $(all_node_names); do
    printf 'NodeName=%s Name=gpu File=%s/dev/%s/gpu[0-%d]\n' "$n" "$ROOT" "$n" $((GPUS_PER_NODE - 1)) >> "$etc/gres.conf.tmp"
    printf 'NodeName=%s Name=mps Count=%d File=%s/dev/%s/gpu[0-%d]\n' \
      "$n" $((GPUS_PER_NODE * 100)) "$ROOT" "$n" $((GPUS_PER_NODE - 1)) >> "$etc/gres.conf.tmp"
  done
  # Keep a gres.conf that a MIG workflow rewrote for its node (marked), else use the generated one.
  if [ -f "$etc/gres.conf" ] && grep -q '^# slurm-elastic-mig:' "$etc/gres.conf"; then
    rm -f "$etc/gres.conf.tmp"
  else
    mv "$etc/gres.conf.tmp" "$etc/gres.conf"
  fi

  cat > "$etc/cgroup.conf" <<EOF
CgroupPlugin=autodetect
ConstrainDevices=yes
ConstrainCores=no
ConstrainRAMSpace=no
EOF

  (umask 077; cat > "$etc/slurmdbd.conf" <<EOF
AuthType=auth/munge
DbdHost=$HOST
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
DebugLevel=info
LogFile=$ROOT/log/slurmdbd.log
PidFile=$ROOT/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$MYSQL_PORT
StorageUser=$DB_USER
StoragePass=$DB_PASS
StorageLoc=$DB_NAME
EOF
  )

  cat > "$etc/my.cnf" <<EOF
[mysqld]
datadir=$ROOT/mysql/data
socket=$ROOT/mysql/mysqld.sock
pid-file=$ROOT/run/mysqld.pid
log-error=$ROOT/log/mysqld.log
port=$MYSQL_PORT
bind-address=127.0.0.1
user=root
skip-name-resolve
innodb_buffer_pool_size=128M
innodb_log_file_size=64M
innodb_lock_wait_timeout=900
max_connections=200
EOF

  # Slurm-side plugins from the checkout: job_submit.lua, prolog/epilog (the project's real ones).
  local f
  for f in job_submit.lua prolog.sh epilog.sh; do
    if [ -f "$REPO/plugins/$f" ]; then
      install -m 0755 "$REPO/plugins/$f" "$etc/$f"
    fi
  done
  # Until the project ships its own, a job_submit.lua that accepts everything keeps JobSubmitPlugins=lua
  # loadable, and prolog/epilog that do nothing keep Prolog= valid.
  [ -f "$etc/job_submit.lua" ] || printf '%s\n' \
    'function slurm_job_submit(job_desc, part_list, submit_uid) return slurm.SUCCESS end' \
    'function slurm_job_modify(job_desc, job_rec, part_list, modify_uid) return slurm.SUCCESS end' \
    > "$etc/job_submit.lua"
  for f in prolog.sh epilog.sh; do
    [ -f "$etc/$f" ] || printf '#!/bin/sh\nexit 0\n' > "$etc/$f"
    chmod 0755 "$etc/$f"
  done
  cat > "$etc/slurm-elastic.env" <<EOF
SLURM_ELASTIC_GPU_MAP_DIR=$ROOT/gpu-map
SLURM_ELASTIC_VGPU_DIR=$ROOT/vgpu
SLURM_ELASTIC_MPS_CONTROL=$REPO/tests/fakes/nvidia-cuda-mps-control
EOF
  cat > "$ROOT/env.sh" <<EOF
export SLURM_CONF=$ROOT/etc/slurm.conf
export SLURM_ELASTIC_CLUSTER_DIR=$ROOT
export SLURM_ELASTIC_VGPU_DIR=$ROOT/vgpu
export SLURM_ELASTIC_GPU_MAP_DIR=$ROOT/gpu-map
EOF
}

# --- daemons ---------------------------------------------------------------------------------------------
# munged listens on the standard socket: Slurm 22.05 clients talking to slurmdbd ignore AuthInfo=socket= and
# always use /run/munge/munge.socket.2 (measured here), so a private socket path breaks sacctmgr.
MUNGE_SOCKET=/run/munge/munge.socket.2

start_munge() {
  if [ "$LANE" != 1 ]; then
    timeout 5 munge -n -S "$MUNGE_SOCKET" >/dev/null 2>&1 ||
      die "no munged on $MUNGE_SOCKET: lane$LANE shares the default cluster's; run docker-slurm/cluster.sh start first"
    return 0
  fi
  if daemon_up munged; then return 0; fi
  if [ -S "$MUNGE_SOCKET" ] && timeout 5 munge -n -S "$MUNGE_SOCKET" >/dev/null 2>&1; then
    die "another munged already serves $MUNGE_SOCKET; stop it first (this cluster runs its own, with its own key)"
  fi
  mkdir -p "$(dirname "$MUNGE_SOCKET")"; chmod 0755 "$(dirname "$MUNGE_SOCKET")"
  if [ ! -s "$ROOT/munge/munge.key" ]; then
    (umask 077; dd if=/dev/urandom of="$ROOT/munge/munge.key" bs=1024 count=1 status=none)
  fi
  chmod 0700 "$ROOT/munge"; chmod 0400 "$ROOT/munge/munge.key"
  rm -f "$MUNGE_SOCKET" "$MUNGE_SOCKET.lock"
  munged --force --key-file="$ROOT/munge/munge.key" --socket="$MUNGE_SOCKET" \
    --pid-file="$ROOT/run/munged.pid" --log-file="$ROOT/log/munged.log" --seed-file="$ROOT/munge/munged.seed"
  wait_for 10 munged munge -n -S "$MUNGE_SOCKET"
  log "munged up"
}

mysql_cli() { mariadb --no-defaults --socket="$ROOT/mysql/mysqld.sock" -uroot "$@"; }

start_mysql_lane() {  # lane2/lane3: its database in the default cluster's MariaDB server
  timeout 10 mariadb --no-defaults --socket="$SHARED_ROOT/mysql/mysqld.sock" -uroot <<EOF ||
CREATE DATABASE IF NOT EXISTS $DB_NAME;
GRANT ALL ON $DB_NAME.* TO '$DB_USER'@'127.0.0.1';
GRANT ALL ON $DB_NAME.* TO '$DB_USER'@'localhost';
EOF
    die "the default cluster's MariaDB does not answer: run docker-slurm/cluster.sh start first"
}

start_mysql() {
  if [ "$LANE" != 1 ]; then start_mysql_lane; return 0; fi
  if daemon_up mariadbd || daemon_up mysqld; then return 0; fi
  if [ ! -d "$ROOT/mysql/data/mysql" ]; then
    log "initialising MariaDB data dir"
    mariadb-install-db --defaults-file="$ROOT/etc/my.cnf" --user=root --skip-test-db \
      --auth-root-authentication-method=socket > "$ROOT/log/mysql-install.log" 2>&1 ||
      die "mariadb-install-db failed: see $ROOT/log/mysql-install.log"
  fi
  rm -f "$ROOT/mysql/mysqld.sock"
  setsid mysqld --defaults-file="$ROOT/etc/my.cnf" < /dev/null >> "$ROOT/log/mysqld.log" 2>&1 &
  wait_for 60 MariaDB mysql_cli -e 'SELECT 1'
  mysql_cli <<EOF
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE DATABASE IF NOT EXISTS slurm_elastic;
CREATE USER IF NOT EXISTS '$DB_USER'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
CREATE USER IF NOT EXISTS '$DB_USER'@'localhost' IDENTIFIED BY '$DB_PASS';
GRANT ALL ON slurm_acct_db.* TO '$DB_USER'@'127.0.0.1';
GRANT ALL ON slurm_acct_db.* TO '$DB_USER'@'localhost';
GRANT ALL ON slurm_elastic.* TO '$DB_USER'@'127.0.0.1';
GRANT ALL ON slurm_elastic.* TO '$DB_USER'@'localhost';
FLUSH PRIVILEGES;
EOF
  log "MariaDB up on 127.0.0.1:$MYSQL_PORT"
}

start_slurmdbd() {
  if daemon_up slurmdbd; then return 0; fi
  slurmdbd
  wait_for 60 slurmdbd sacctmgr -n -P show cluster
  log "slurmdbd up on 127.0.0.1:$DBD_PORT"
}

sacct_add() {  # idempotent sacctmgr add: "Nothing new added" and "already exists" are fine
  local out
  out=$(sacctmgr -i "$@" 2>&1) || {
    grep -qiE 'already exists|nothing new' <<< "$out" && return 0
    die "sacctmgr $*: $out"
  }
}

setup_accounting() {
  sacctmgr -n -P show cluster format=cluster | grep -qx "$CLUSTER_NAME" || sacct_add add cluster "$CLUSTER_NAME"
  # QOS: high preempts only scavenger (requeue), the QOS a site may give extension jobs; it does not preempt
  # normal, so a high job pending behind an elastic job is admitted by shrink-to-admit (only the surplus goes).
  sacctmgr -n -P show qos format=name | grep -qx scavenger || sacct_add add qos scavenger
  sacctmgr -n -P show qos format=name | grep -qx high || sacct_add add qos high
  sacctmgr -i modify qos scavenger set priority=0 >/dev/null
  sacctmgr -i modify qos normal set priority=10 preempt=scavenger >/dev/null
  sacctmgr -i modify qos high set priority=1000 preempt=scavenger preemptmode=requeue >/dev/null
  local acct
  for acct in nlp:2 vision:1; do
    sacctmgr -n -P show account format=account | grep -qx "${acct%%:*}" ||
      sacct_add add account "${acct%%:*}" cluster="$CLUSTER_NAME" fairshare="${acct##*:}" \
        description="${acct%%:*} research" organization=lab
  done
  local ua
  for ua in alice:nlp bob:vision; do
    sacctmgr -n -P show assoc where user="${ua%%:*}" format=account | grep -qx "${ua##*:}" ||
      sacct_add add user "${ua%%:*}" account="${ua##*:}" cluster="$CLUSTER_NAME"
  done
  sacctmgr -i modify user where name=alice,bob,root set qos=normal,high,scavenger defaultqos=normal >/dev/null
}

start_slurmctld() {
  if daemon_up slurmctld; then return 0; fi
  slurmctld
  wait_for 60 slurmctld scontrol ping
  log "slurmctld up on 127.0.0.1:$CTLD_PORT"
}

start_slurmds() {
  local n
  for n in $(node_names); do
    if daemon_up slurmd "$n"; then continue; fi
    slurmd -N "$n"
  done
}

nodes_ready() {
  # Ready = every node responds and none is down/unknown; drained nodes made by tests are resumed on start.
  local bad
  # Power-saved nodes are not waited for: Slurm boots them when a job needs them.
  bad=$(timeout 15 sinfo -h -N -n "$NODELIST" -o '%N %T' | awk '$2 ~ /down|unk|not_responding|inval|fail/ {print $1}' | sort -u)
  [ -z "$bad" ] && [ "$(timeout 15 sinfo -h -N -n "$NODELIST" -o '%N' | sort -u | wc -l)" -eq "$NODES" ]
}

resume_nodes() {
  local n state
  # A power-saved node left DOWN or NOT_RESPONDING by a failed resume is refused by the scheduler
  # (ReqNodeNotAvail) until it is powered down again: POWER_DOWN_FORCE (its slurmd is not running).
  for n in $(power_node_names); do
    daemon_up slurmd "$n" && continue
    state=$(scontrol show node "$n" 2>/dev/null | grep -o 'State=[^ ]*' || true)
    case "$state" in
      State=DOWN*|*NOT_RESPONDING*)
        scontrol update NodeName="$n" State=RESUME >/dev/null 2>&1 || true
        scontrol update NodeName="$n" State=POWER_DOWN_FORCE >/dev/null 2>&1 || true ;;
    esac
  done
  for n in $(node_names); do
    state=$(sinfo -h -n "$n" -o '%T' | head -1)
    case "$state" in
      down*|drain*|unknown*|fail*) scontrol update NodeName="$n" State=RESUME >/dev/null 2>&1 || true ;;
    esac
  done
}

cmd_start() {
  close_inherited_fds
  require_packages
  ensure_users
  make_dirs
  write_config
  start_munge
  start_mysql
  start_slurmdbd
  setup_accounting
  start_slurmctld
  start_slurmds
  resume_nodes
  wait_for 90 "nodes ${NODELIST} to be ready" nodes_ready
  scontrol reconfigure >/dev/null 2>&1 || true   # picks up a changed job_submit.lua / prolog paths
  wait_for 60 "nodes ${NODELIST} to be ready after reconfigure" nodes_ready
  log "cluster '$CLUSTER_NAME' up: $NODES nodes x $GPUS_PER_NODE GPUs; export SLURM_CONF=$SLURM_CONF"
}

cmd_stop() {
  if daemon_up slurmctld; then
    scancel --full --quiet -M "$CLUSTER_NAME" --state=PENDING >/dev/null 2>&1 || true
    scancel --full --quiet >/dev/null 2>&1 || true
    local i
    for ((i = 0; i < 50; i++)); do
      [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.2
    done
  fi
  # Every one of this cluster's, not only those its pid files name: a pid file can be stale (docs/slurm-facts.md).
  # lane2's and lane3's munged and MariaDB are the default cluster's (and run with its SLURM_CONF): never stopped
  # from here.
  if [ "$LANE" != 1 ]; then stop_all slurmd slurmctld slurmscriptd slurmdbd || die "could not stop every daemon"
  else stop_all slurmd slurmctld slurmscriptd slurmdbd mariadbd mysqld munged || die "could not stop every daemon"; fi
  rm -f "$ROOT"/run/*.pid
}

cmd_status() {
  local rc=0 n pids
  report() { report_daemon "$@" || rc=1; }  # label name [node]
  # munged and MariaDB: the instance's that runs them (lane2/lane3 use the default cluster's; daemon-lib.sh finds a
  # daemon by the SLURM_CONF it was started with)
  SLURM_CONF="$SHARED_ROOT/etc/slurm.conf" report munged munged
  if SLURM_CONF="$SHARED_ROOT/etc/slurm.conf" daemon_up mariadbd; then SLURM_CONF="$SHARED_ROOT/etc/slurm.conf" report mariadb mariadbd
  else SLURM_CONF="$SHARED_ROOT/etc/slurm.conf" report mariadb mysqld; fi
  report slurmdbd slurmdbd
  report slurmctld slurmctld
  for n in $(node_names); do report "slurmd $n" slurmd "$n"; done
  for n in $(power_node_names); do  # powered down is their normal state: not an error
    pids=$(daemon_pids slurmd "$n" | xargs)
    if [ -n "$pids" ]; then printf '%-12s up    pid %s (power saving)\n' "slurmd $n" "$pids"
    else printf '%-12s off   (power saving)\n' "slurmd $n"; fi
  done
  if daemon_up slurmctld; then
    echo
    sinfo -o '%P %a %D %T %N %G' || rc=1
  fi
  return $rc
}

# A later Slurm release (24.11, 26.05) runs from its own Debian root filesystem, next to this cluster.
case "${2:-22.05}" in
  22.05|lane2|lane3) ;;
  24.11|26.05) exec "$HERE/release-cluster.sh" "$2" "$1" ;;
  netns) exec "$HERE/netns-cluster.sh" "$1" ;;  # nodes in their own network namespaces (22.05)
  *) echo "usage: $0 start|stop|restart|status|env [22.05|24.11|26.05|netns|lane2|lane3]" >&2; exit 2 ;;
esac

case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  restart) cmd_stop; cmd_start ;;
  status) cmd_status ;;
  env) cat "$ROOT/env.sh" ;;
  *) echo "usage: $0 start|stop|restart|status|env [22.05|24.11|26.05|netns|lane2|lane3]" >&2; exit 2 ;;
esac
