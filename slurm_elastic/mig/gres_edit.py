"""The ``write_gres`` step's plan (pure): the rewrite of slurm.conf's ``Gres=`` and gres.conf's lines for one
node, with the texts before and after, so that the step can check nobody changed the files since and the
rollback can put them back."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from slurm_elastic.mig.gres import NodeGresConfig, render_node_gres_config
from slurm_elastic.mig.ports import WorkflowSettings
from slurm_elastic.mig.slurmconf import node_gres_lines, node_gres_value, set_node_gres, set_node_gres_lines
from slurm_elastic.mig.wire import NodeMigReport


@dataclass(frozen=True)
class GresEdit:
    """The two file rewrites of ``write_gres`` (texts before and after), and what Slurm should then show."""

    slurm_conf: str
    gres_conf: str
    slurm_before: str
    slurm_after: str
    gres_before: str
    gres_after: str
    node_gres: str
    gres_lines: tuple[str, ...]
    old_node_gres: str | None
    old_gres_lines: tuple[str, ...]

    def to_obj(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["gres_lines"] = list(self.gres_lines)
        d["old_gres_lines"] = list(self.old_gres_lines)
        return d

    @classmethod
    def from_obj(cls, obj: Mapping[str, Any]) -> GresEdit:
        known = set(cls.__dataclass_fields__)
        d = {k: v for k, v in obj.items() if k in known}
        d["gres_lines"] = tuple(d.get("gres_lines", ()))
        d["old_gres_lines"] = tuple(d.get("old_gres_lines", ()))
        return cls(**d)


def plan_gres_edit(node: str, config: NodeGresConfig, settings: WorkflowSettings, *, slurm_text: str,
                   gres_text: str, note: str) -> GresEdit:
    """The rewrite of both files for the node's new GRES (pure)."""
    return GresEdit(
        slurm_conf=settings.slurm_conf,
        gres_conf=settings.gres_conf,
        slurm_before=slurm_text,
        slurm_after=set_node_gres(slurm_text, node, config.node_gres, note),
        gres_before=gres_text,
        gres_after=set_node_gres_lines(gres_text, node, config.gres_lines, note),
        node_gres=config.node_gres,
        gres_lines=config.gres_lines,
        old_node_gres=node_gres_value(slurm_text, node),
        old_gres_lines=node_gres_lines(gres_text, node),
    )


def node_config_for(node: str, report: NodeMigReport, settings: WorkflowSettings) -> NodeGresConfig:
    return render_node_gres_config(
        node, report, device_files=settings.device_files, mps_per_gpu=settings.mps_per_gpu,
        autodetect_off=settings.autodetect_off, whole_gpu_type=settings.whole_gpu_type,
    )
