"""MIG partitioning: the profile catalog, layout validation and placement, diffs, mig-parted and Slurm GRES.

Its modules are pure but one: they read no GPU, file or clock by themselves: devices come in through the
:class:`~slurm_elastic.mig.device.MigDevice` protocol, files through the callers. The exception is
:mod:`~slurm_elastic.mig.adapters`, the workflow's imperative shell (used by the CLI). Modules:

- :mod:`~slurm_elastic.mig.model` - frozen values (profiles, GPU models, placements, layouts, instances)
- :mod:`~slurm_elastic.mig.catalog` - the packaged profile catalog (data/mig_profiles.yaml), strict loader
- :mod:`~slurm_elastic.mig.validate` - layout validation and the placement search (planner)
- :mod:`~slurm_elastic.mig.diff` - current instances -> requested layout: what to destroy and create
- :mod:`~slurm_elastic.mig.device` / :mod:`~slurm_elastic.testing.mig_fake` - the GPU capability and its fake
- :mod:`~slurm_elastic.mig.nvml_check` - NVML's report against the catalog; NVML wins
- :mod:`~slurm_elastic.mig.parted` - NVIDIA mig-parted config import/export
- :mod:`~slurm_elastic.mig.gres` - gres.conf lines and node ``Gres=`` counts
- :mod:`~slurm_elastic.mig.slurmconf` - one node's GRES rewritten in slurm.conf and gres.conf (text in, text out)
- :mod:`~slurm_elastic.mig.apply` - apply a node layout through MigDevice objects (only what is missing)
- :mod:`~slurm_elastic.mig.wire` - the agent's ``/v1/mig`` and ``/v1/mig/apply`` JSON
- :mod:`~slurm_elastic.mig.steps` - ``mig apply``'s pure step machine: the next step from the journal alone
- :mod:`~slurm_elastic.mig.ports` - the workflow's settings, values and ports (Protocols)
- :mod:`~slurm_elastic.mig.gres_edit` / :mod:`~slurm_elastic.mig.verify` - the ``write_gres`` plan and the
  ``verify`` checks (pure)
- :mod:`~slurm_elastic.mig.workflow` - the loop that runs the steps through the ports, journaling each
- :mod:`~slurm_elastic.mig.adapters` - the ports' adapters (store journal, Slurm, files, daemons; agent HTTP in
  :mod:`slurm_elastic.agent.mig_remote`)
- :mod:`~slurm_elastic.mig.plan` / :mod:`~slurm_elastic.mig.suggest` - ``mig plan`` and ``mig suggest``
- :mod:`~slurm_elastic.mig.config` - the workflow's TOML settings (paths, commands, agents, timeouts)
"""

from slurm_elastic.mig.catalog import Catalog, load_catalog
from slurm_elastic.mig.diff import GpuDiff, diff_gpu, diff_node
from slurm_elastic.mig.errors import LayoutError, LayoutProblem, MigError, MigRejectReason
from slurm_elastic.mig.model import GpuModel, GpuState, Layout, MigInstance, MigProfile, NodeLayout, Placement
from slurm_elastic.mig.validate import check_layout, parse_layout, plan_layout

__all__ = [
    "Catalog",
    "GpuDiff",
    "GpuModel",
    "GpuState",
    "Layout",
    "LayoutError",
    "LayoutProblem",
    "MigError",
    "MigInstance",
    "MigProfile",
    "MigRejectReason",
    "NodeLayout",
    "Placement",
    "check_layout",
    "diff_gpu",
    "diff_node",
    "load_catalog",
    "parse_layout",
    "plan_layout",
]
