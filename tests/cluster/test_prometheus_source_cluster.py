"""The controller on the Prometheus metrics source, on the real cluster: Debian's Prometheus scrapes a
dcgm-exporter stand-in per node (dcgm_exporter.py: dcgm-exporter's text format and HPC job mapping, from the
virtual GPUs and the prolog's GPU map files, with fully qualified Hostnames) and the project's agents (their
/metrics with the bearer token); the controller reads per-job utilization with PromQL only, and shrinks an idle
job and grows a busy one as it does with the agents. The agents' own series are read back through the same
Prometheus with the source's ``agent`` series."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from slurm_elastic.controller.config import MetricsSourceConfig
from slurm_elastic.controller.prometheus import PrometheusSource
from slurm_elastic.store.records import ActionKind
from tests.cluster.agents_harness import Agents
from tests.cluster.controller_harness import (
    controller_config,
    elastic_script,
    marker_file,
    node_count,
    running_controller,
    wait_until,
)
from tests.cluster.dcgm_exporter import vgpu_dcgm_exporters
from tests.cluster.prometheus_harness import running_prometheus
from tests.cluster.test_controller_e2e import extensions_of

pytestmark = pytest.mark.cluster

PROMETHEUS_PORT = 19092
PROM = f"http://127.0.0.1:{PROMETHEUS_PORT}"
IDLE = "#ELASTIC --min-nodes 1 --max-nodes 2 --window 10s --cooldown 15s --grace 3s --signal USR2"
BUSY = "#ELASTIC --min-nodes 1 --max-nodes 2 --window 10s --cooldown 15s --grace 3s --signal USR2"


def instant(expr: str) -> list[dict[str, object]]:
    url = f"{PROM}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - a fixed loopback URL
            doc = json.loads(resp.read())
    except OSError:
        return []
    return doc["data"]["result"] if doc.get("status") == "success" else []  # type: ignore[no-any-return]


def test_controller_on_prometheus_shrinks_an_idle_job_and_grows_a_busy_one(stack: Agents, tmp_path: Path) -> None:
    cluster = stack.cluster
    marker = marker_file(cluster)
    idle = cluster.submit(elastic_script(10, IDLE, marker), "-N2", "--gres=gpu:2", "--time=60", user="alice")
    busy = cluster.submit(elastic_script(90, BUSY, marker), "-N1", "--gres=gpu:2", "--time=60", user="bob")
    cluster.wait_state(idle, {"RUNNING"})
    cluster.wait_state(busy, {"RUNNING"})
    with vgpu_dcgm_exporters(cluster.root, cluster.nodes, hostname=lambda n: f"{n}.cluster.test") as dcgm:
        agents = ", ".join(f'"{stack.metrics_address(n)}"' for n in cluster.nodes)
        with running_prometheus(tmp_path, PROMETHEUS_PORT, f"""\
  - job_name: dcgm
    static_configs: [{{targets: [{", ".join(f'"{a}"' for a in dcgm.values())}]}}]
  - job_name: agents
    authorization: {{type: Bearer, credentials_file: {stack.metrics_token_file}}}
    static_configs: [{{targets: [{agents}]}}]
"""):
            wait_until("Prometheus to scrape the exporters and the agents",
                       lambda: len(instant("up == 1")) == 2 * len(cluster.nodes), 60)
            wait_until("both jobs' GPUs in dcgm's series", lambda: {
                r["metric"]["hpc_job"] for r in instant('DCGM_FI_DEV_GPU_UTIL{hpc_job!=""}')  # type: ignore[index]
            } >= {str(idle), str(busy)}, 30)
            config = controller_config(tmp_path, stack)
            with open(config, "a") as f:
                f.write(f'\n[metrics_source]\nkind = "prometheus"\nurl = "{PROM}"\nseries = "dcgm"\nwindow_s = 10\n'
                        f'timeout_s = 3\n')
            with running_controller(cluster, config) as ctl:
                wait_until("the idle job to shrink to 1 node and the busy one to grow by an extension",
                           lambda: node_count(cluster, idle) == 1 and sum(
                               1 for e in extensions_of(cluster, busy) if e.state == "RUNNING") == 1, 90, ctl)
                shrinks = ctl.wait_applied(idle, ActionKind.SHRINK, 1)
                grows = ctl.wait_applied(busy, ActionKind.GROW, 1)
                st = ctl.store()
                try:
                    seen = {a.node: a for a in st.agents.list_agents()}
                    mean_idle = [d for d in ctl.decisions(idle) if d.action == "shrink"][0].inputs["mean_util"]
                    mean_busy = [d for d in ctl.decisions(busy) if d.action == "grow"][0].inputs["mean_util"]
                finally:
                    st.close()
                assert "metrics source: Prometheus" in ctl.log_text()
            assert [(a.params["from"], a.params["to"]) for a in shrinks] == [(2, 1)]
            assert [(a.params["from"], a.params["to"]) for a in grows] == [(1, 2)]
            assert 5 <= float(mean_idle) <= 15 and 85 <= float(mean_busy) <= 95  # type: ignore[arg-type]
            # Every node was read through Prometheus (fully qualified Hostnames mapped to the Slurm names).
            assert set(seen) == set(cluster.nodes)
            assert all(a.url == PROM and a.version == "prometheus" and a.gpu_count == 4 for a in seen.values())
            # The agents' own per-job series, through the same Prometheus (exported_job holds the job id).
            agent_view = PrometheusSource(MetricsSourceConfig(kind="prometheus", url=PROM, series="agent"))(
                {n: "" for n in cluster.nodes})
            assert agent_view.errors == {}
            busy_jobs = [j for r in agent_view.reports.values() for j in r.jobs if j.job_id == busy]
            assert busy_jobs and all(85 <= (j.util_mean_percent or 0) <= 95 for j in busy_jobs)
