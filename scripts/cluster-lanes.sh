# Which lane runs each 22.05 cluster test file (sourced by scripts/test and tests/unit/test_cluster_lanes.py).
# Each lane has its own 22.05 instance: lane 1 the default cluster, lanes 2 and 3 `docker-slurm/cluster.sh start
# lane2|lane3`. Lane 1 runs every file not named here, so a new file lands on the default instance. With
# SLURM_ELASTIC_CLUSTER_LANES=2 (the default) lane 3's files go back to the lanes they ran in before lane 3
# existed: those in lane3_two_lanes to lane 2, the others to lane 1; with 1, every file runs in lane 1.
#
# Balanced by file by the durations of the first three-lane CI run (2026-12-02 05:31, 1,189 s in all): lane 1
# 840 s (controller_e2e, resize_templates, controller_ha, then small files), lane 2 1,023 s (slurm_losses 488,
# reliability_faults 240, operating_cli ~92 with its 17-s setups, then small files), lane 3 714 s (power_saving
# 170, serving 127, policy_rules 92, fair_share 87, time_limit 75, goodput 62, reliability_hostile ~40); then
# operating_cli, controller_failover and moldable_start (~140 s) moved from lane 2 to lane 3: 867 / 888 / 879 s.
#
# Lane 1 must keep: test_store_mariadb.py and test_controller_ha.py (the database slurm_elastic in the default
# instance's MariaDB on 13306), test_mig_cluster.py (rewrites that instance's slurm.conf/gres.conf and restarts its
# slurmctld: not tried on the other instances) and the torchrun files, test_controller_e2e.py,
# test_resize_templates.py, test_resize_phases_cluster.py, test_adaptive_batch_cluster.py and
# test_gpu_granular_cluster.py (~75 s; a leader's rendezvous port is 29500 + job id % 1000, which job ids of two
# instances could share). test_operating_cli.py and test_prometheus_source_cluster.py each
# start a Prometheus on a fixed port of their own. No file depends on another's order.
lane2_files=(
  tests/cluster/test_slurm_losses_cluster.py tests/cluster/test_reliability_faults.py tests/cluster/test_agent_cluster.py
  tests/cluster/test_slurm_adapter.py tests/cluster/test_extension_cluster.py tests/cluster/test_mps_cluster.py
  tests/cluster/test_prometheus_source_cluster.py tests/cluster/test_sim_sacct_live.py
)
lane3_files=(
  tests/cluster/test_power_saving_cluster.py tests/cluster/test_serving_cluster.py
  tests/cluster/test_policy_rules_cluster.py tests/cluster/test_fair_share_cluster.py
  tests/cluster/test_time_limit_cluster.py tests/cluster/test_goodput_cluster.py
  tests/cluster/test_reliability_hostile.py tests/cluster/test_operating_cli.py
  tests/cluster/test_controller_failover.py tests/cluster/test_moldable_start_cluster.py
  tests/cluster/test_doctor_cluster.py tests/cluster/test_topology_cluster.py
)
# With two lanes: lane 2 ~1,290 s, lane 1 ~1,280 s (the two-lane CI runs of 2026-12-02).
lane3_two_lanes=(
  tests/cluster/test_power_saving_cluster.py tests/cluster/test_fair_share_cluster.py
  tests/cluster/test_operating_cli.py tests/cluster/test_controller_failover.py
  tests/cluster/test_moldable_start_cluster.py
)

file_lane() {  # FILE LANES: the lane (1..LANES) that runs FILE
  local lane=1
  if [[ " ${lane2_files[*]} " == *" $1 "* ]]; then lane=2
  elif [[ " ${lane3_files[*]} " == *" $1 "* ]]; then
    if [ "$2" -ge 3 ]; then lane=3
    elif [[ " ${lane3_two_lanes[*]} " == *" $1 "* ]]; then lane=2; fi
  fi
  echo $((lane < $2 ? lane : $2))
}

lane_ignores() {  # LANE LANES: an --ignore= for each 22.05 cluster test file another lane runs
  local f
  for f in tests/cluster/test_*.py; do
    [ "$(file_lane "$f" "$2")" = "$1" ] || echo "--ignore=$f"
  done
}
