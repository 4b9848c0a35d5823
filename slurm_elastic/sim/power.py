"""Slurm power saving in the simulator: part of the nodes are switched off while idle (docs/power-saving.md).

The last ``cold_nodes`` nodes of the cluster behave like the test cluster's CLOUD nodes: powered down until a job
is placed on them; then they boot for ``resume_s`` (the job placed there makes no progress meanwhile, on top of
its start or resize cost); once idle for ``suspend_s`` (SuspendTime + SuspendTimeout) they are off again. The
other nodes are always on (SuspendExcNodes). Energy is counted as **powered node-seconds**: an always-on node
for the whole run, a cold node from each allocation on it (its boot included) until ``suspend_s`` after it was
last released, overlaps merged, cut at the end of the run.

The policy sees a cold node as Slurm shows it (:meth:`NodePower.state`): ``IDLE+CLOUD+POWERED_DOWN`` while off,
``+POWERING_UP`` while it boots for a job, so the power walk charges its resume cost and the controller's
PowerTracker measures its resume time (sim/policy_adapter.py). Not modelled: failed resumes; placement takes the
cold nodes last (they have the highest indices), and a node that is freed while it still boots counts as booted.
"""

from __future__ import annotations

from dataclasses import dataclass

from slurm_elastic.errors import ConfigError


@dataclass(frozen=True)
class PowerSaving:
    cold_nodes: int  # the last nodes of the cluster: powered down while idle
    resume_s: float  # a powered-down node's boot, until the job on it can run
    suspend_s: float  # idle time until a cold node is off again (SuspendTime + SuspendTimeout)

    def __post_init__(self) -> None:
        if self.cold_nodes < 0:
            raise ConfigError(f"cold_nodes must be >= 0, not {self.cold_nodes}")
        for name in ("resume_s", "suspend_s"):
            if not getattr(self, name) >= 0:
                raise ConfigError(f"{name} must be >= 0 seconds, not {getattr(self, name)}")


@dataclass(frozen=True)
class PowerReport:
    powered_node_s: float  # energy: node-seconds powered on
    always_on_node_s: float  # the same cluster without power saving: every node for the whole run
    resumes: int  # allocations that had to boot a powered-down node
    horizon_s: float  # the run's end
    always_on_nodes: int = 0

    def until(self, end: float) -> float:
        """Powered node-seconds up to ``end`` >= the run's end (to compare runs that end at different times):
        after its end only the always-on nodes are on."""
        return self.powered_node_s + self.always_on_nodes * max(0.0, end - self.horizon_s)


class NodePower:
    """Busy periods and resumes per node. The cluster calls :meth:`used` / :meth:`freed` when a node goes from
    no GPU allocated to some, and back."""

    def __init__(self, cfg: PowerSaving, num_nodes: int) -> None:
        if cfg.cold_nodes > num_nodes:
            raise ConfigError(f"cold_nodes {cfg.cold_nodes} exceeds the cluster's {num_nodes} nodes")
        self.cfg = cfg
        self.num_nodes = num_nodes
        self.first_cold = num_nodes - cfg.cold_nodes
        self._since: dict[int, float] = {}  # node -> busy since
        self._periods: dict[int, list[tuple[float, float]]] = {}
        self._boot_until: dict[int, float] = {}  # node -> when the boot of its current allocation ends
        self.resumes = 0

    def is_off(self, node: int, now: float) -> bool:
        if node < self.first_cold or node in self._since:
            return False
        periods = self._periods.get(node)
        return not periods or now - periods[-1][1] > self.cfg.suspend_s

    def used(self, node: int, now: float) -> float:
        """The node gets its first GPU allocated at ``now``; returns its boot time (0 when it is on)."""
        boot = 0.0
        if self.is_off(node, now):
            self.resumes += 1
            boot = self.cfg.resume_s
        self._since[node] = now
        self._boot_until[node] = now + boot
        return boot

    def state(self, node: int, now: float) -> str:
        """What Slurm would show: "" for an always-on node; "off", "booting" or "on" for a cold one."""
        if node < self.first_cold:
            return ""
        if node in self._since:
            return "booting" if now < self._boot_until.get(node, now) else "on"
        return "off" if self.is_off(node, now) else "on"

    def freed(self, node: int, now: float) -> None:
        start = self._since.pop(node, now)
        self._periods.setdefault(node, []).append((start, now))

    def report(self, end: float) -> PowerReport:
        powered = self.first_cold * end
        for node in range(self.first_cold, self.num_nodes):
            spans = [*self._periods.get(node, []), *([(self._since[node], end)] if node in self._since else [])]
            covered, reach = 0.0, 0.0
            for start, stop in sorted(spans):
                lo, hi = max(start, reach), min(end, stop + self.cfg.suspend_s)
                if hi > lo:
                    covered += hi - lo
                reach = max(reach, hi)
            powered += covered
        return PowerReport(powered_node_s=powered, always_on_node_s=self.num_nodes * end, resumes=self.resumes,
                           horizon_s=end, always_on_nodes=self.first_cold)
