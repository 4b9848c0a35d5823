"""The elastic policy: a pure, deterministic function shared by the controller and the simulator.

Interface (stable; add fields with defaults, never change meanings)::

    from slurm_elastic.policy import decide, PolicyInput, parse_config

    cfg = parse_config(toml_text, source="/etc/slurm-elastic/policy.toml")   # or default_config()
    decisions = decide(PolicyInput(snapshot, units, utilization, history, account_shares), cfg, now)

- :func:`decide` ``(inp: PolicyInput, cfg: PolicyConfig, now: datetime) -> list[Decision]`` returns exactly
  one :class:`Decision` per :class:`ElasticUnit`, sorted by unit id: ``grow``, ``shrink`` or ``hold``, each
  with a stable :class:`Reason`, a message with its numbers, the inputs that mattered, the :class:`Basis`
  (signal) used, and for actions the plan (:class:`GrowPlan` / :class:`ShrinkPlan`). It reads no clock, file,
  process or network; the same arguments always give the same list, whatever the order of units, jobs and
  nodes inside them.
- :func:`resolve_unit` gives a unit's effective settings with the provenance of each value (for ``explain``,
  and so that the caller aggregates utilization over the unit's ``window_s``).
- Config: :func:`parse_config` (TOML text), :func:`config_from_mapping` (an already parsed table),
  :func:`default_config`; invalid config raises :class:`PolicyConfigError` (a ``ConfigError``).
  :meth:`PolicyConfig.with_active_profile` switches the time-window profile.

The rules, config keys and reason codes are documented in docs/policy.md. This package imports only the
standard library, :mod:`slurm_elastic.slurm.model`, :mod:`slurm_elastic.directives` and
:mod:`slurm_elastic.errors` (a unit test checks that).
"""

from slurm_elastic.policy.config import (
    LayerSet,
    PolicyConfig,
    PolicyConfigError,
    Provenance,
    Resolved,
    UnitSettings,
    default_config,
    resolve_unit,
)
from slurm_elastic.policy.decide import decide
from slurm_elastic.policy.errors import PolicyInputError
from slurm_elastic.policy.loader import config_from_mapping, parse_config
from slurm_elastic.policy.model import (
    AdmitBasis,
    Decision,
    ElasticUnit,
    ExtensionJob,
    ExtensionShrink,
    GrowPlan,
    JobUtilization,
    Outcome,
    PolicyInput,
    PowerState,
    ResizeRecord,
    ServingLoad,
    ServingPoint,
    ShrinkPlan,
    ThroughputSample,
)
from slurm_elastic.policy.progress import Progress, unit_progress
from slurm_elastic.policy.reasons import REASON_DOCS, Action, Basis, Reason
from slurm_elastic.policy.schema import CONFIG_VERSION, KEYS, render_defaults_toml, render_keys_markdown

__all__ = [
    "Progress",
    "unit_progress",
    "CONFIG_VERSION",
    "KEYS",
    "REASON_DOCS",
    "Action",
    "AdmitBasis",
    "Basis",
    "Decision",
    "ElasticUnit",
    "ExtensionJob",
    "ExtensionShrink",
    "GrowPlan",
    "JobUtilization",
    "LayerSet",
    "Outcome",
    "PolicyConfig",
    "PolicyConfigError",
    "PolicyInput",
    "PolicyInputError",
    "PowerState",
    "Provenance",
    "Reason",
    "ResizeRecord",
    "ServingLoad",
    "ServingPoint",
    "Resolved",
    "ShrinkPlan",
    "ThroughputSample",
    "UnitSettings",
    "config_from_mapping",
    "decide",
    "default_config",
    "parse_config",
    "render_defaults_toml",
    "render_keys_markdown",
    "resolve_unit",
]
