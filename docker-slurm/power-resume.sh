#!/bin/bash
# ResumeProgram of the test cluster (installed into etc/ by cluster.sh; slurmctld runs it as SlurmUser with a
# hostlist such as "n[5-6]"). "Booting" a node is starting its `slurmd -N` after the boot delay in
# etc/power.env (SLURM_ELASTIC_POWER_BOOT_S, or etc/power-boot-delay when a test overrides it). A node named in
# etc/power-fail-nodes never boots: Slurm marks it DOWN once ResumeTimeout passes. Returns at once; each boot
# runs detached, as a real power-on would.
set -u
ETC=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=/dev/null
. "$ETC/power.env"
export SLURM_CONF
# slurmctld runs this with a bare environment: no PATH to find slurmd, scontrol, unshare
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
exec >> "$POWER_LOG" 2>&1
delay=$POWER_BOOT_S
if [ -s "$ETC/power-boot-delay" ]; then delay=$(tr -dc 0-9. < "$ETC/power-boot-delay"); fi
for n in $(scontrol show hostnames "$1"); do
  echo "$(date -u +%FT%T.%N) resume $n (boot ${delay}s)"
  if grep -qx "$n" "$ETC/power-fail-nodes" 2>/dev/null; then
    echo "$(date -u +%FT%T.%N) $n never boots (listed in power-fail-nodes)"
    continue
  fi
  # A node Slurm gave up on (ResumeTimeout) may still run the slurmd of a late boot: power-cycle it.
  pid=$(tr -dc 0-9 2>/dev/null < "$RUN_DIR/slurmd-$n.pid" || true)
  if [ -n "$pid" ] && grep -q slurmd "/proc/$pid/comm" 2>/dev/null; then kill -TERM "$pid"; fi
  # slurmctld accepts a resumed node only if its boot time is after the resume request ("Still waiting for
  # boot"): every node here shares the host's boot time, so slurmd runs in a time namespace booted just now.
  # slurmctld runs this with SIGTERM and others blocked: a slurmd started with that mask never stops (measured),
  # so the mask is cleared (perl: POSIX sigprocmask) before slurmd starts.
  setsid bash -c 'sleep "$1"; up=$(cut -d. -f1 /proc/uptime)
    perl -MPOSIX -e "sigprocmask(SIG_SETMASK, POSIX::SigSet->new) or die; exec @ARGV" \
      unshare --time --boottime "-$up" slurmd -N "$2" && echo "$(date -u +%FT%T.%N) $2 booted"' _ "$delay" "$n" \
    < /dev/null >> "$POWER_LOG" 2>&1 &
done
exit 0
