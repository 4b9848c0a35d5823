"""Compare what NVML reports with the catalog, and build the GPU model to plan with.

The rule: **at runtime, what NVML reports wins.** The driver knows its GPU (a new driver may add a profile,
a SKU may differ from the table we read); the catalog is what we plan with when no GPU is at hand. Every
disagreement becomes a :class:`CatalogNote` with a stable code, so the agent can report it and an operator
can fix the catalog. Pure: the report is a value read beforehand (:func:`slurm_elastic.mig.device.report_of`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from slurm_elastic.mig.device import NvmlGpuReport
from slurm_elastic.mig.model import GpuModel, MigProfile


class NoteCode(StrEnum):
    GPU_NOT_IN_CATALOG = "GPU_NOT_IN_CATALOG"
    PROFILE_NOT_IN_CATALOG = "PROFILE_NOT_IN_CATALOG"
    PROFILE_NOT_REPORTED = "PROFILE_NOT_REPORTED"
    COMPUTE_SLICES_DIFFER = "COMPUTE_SLICES_DIFFER"
    MEMORY_SLICES_DIFFER = "MEMORY_SLICES_DIFFER"
    MAX_INSTANCES_DIFFER = "MAX_INSTANCES_DIFFER"
    PLACEMENTS_DIFFER = "PLACEMENTS_DIFFER"
    PROFILE_ID_DIFFERS = "PROFILE_ID_DIFFERS"
    NO_PLACEMENTS_REPORTED = "NO_PLACEMENTS_REPORTED"


@dataclass(frozen=True)
class CatalogNote:
    """One disagreement between NVML and the catalog. NVML's value is the one used."""

    code: NoteCode
    profile: str | None
    message: str


def compare_with_catalog(report: NvmlGpuReport, catalog_gpu: GpuModel | None) -> tuple[CatalogNote, ...]:
    """Every disagreement between the NVML report and the catalog entry, sorted by profile then code."""
    return effective_model(report, catalog_gpu)[1]


def effective_model(
    report: NvmlGpuReport, catalog_gpu: GpuModel | None
) -> tuple[GpuModel, tuple[CatalogNote, ...]]:
    """The model to validate and plan with on this GPU (NVML's profiles), and the notes on the catalog.

    A profile NVML reports without placements cannot be planned and is left out, with a note.
    """
    notes: list[CatalogNote] = []
    label = catalog_gpu.model if catalog_gpu is not None else report.name
    if catalog_gpu is None:
        notes.append(
            CatalogNote(
                NoteCode.GPU_NOT_IN_CATALOG,
                None,
                f"{report.name} ({report.pci_device_id}) is not in the MIG catalog; using NVML's profiles",
            )
        )

    profiles: list[MigProfile] = []
    for info in sorted(report.profiles, key=lambda p: p.profile_id):
        name = info.profile_name()
        placements = report.placements_of(info.profile_id)
        if not placements:
            notes.append(
                CatalogNote(
                    NoteCode.NO_PLACEMENTS_REPORTED,
                    name,
                    f"{label}: NVML reports {name} (id {info.profile_id}) without placements; not used",
                )
            )
            continue
        sizes = {pl.size for pl in placements}
        size = max(sizes)
        starts = tuple(sorted(pl.start for pl in placements if pl.size == size))
        nvml = MigProfile(
            name=name,
            compute_slices=info.slice_count,
            memory_slices=size,
            max_instances=info.instance_count,
            placement_starts=starts,
            profile_id=info.profile_id,
            nvml_profile=None,
        )
        known = catalog_gpu.profile(name) if catalog_gpu is not None else None
        if known is not None:
            nvml = MigProfile(
                nvml.name,
                nvml.compute_slices,
                nvml.memory_slices,
                nvml.max_instances,
                nvml.placement_starts,
                nvml.profile_id,
                known.nvml_profile,
            )
            notes.extend(_field_notes(label, known, nvml))
        elif catalog_gpu is not None:
            notes.append(
                CatalogNote(
                    NoteCode.PROFILE_NOT_IN_CATALOG,
                    name,
                    f"{label}: NVML reports profile {name} (id {info.profile_id}), which the catalog lacks",
                )
            )
        profiles.append(nvml)

    if catalog_gpu is not None:
        reported = {p.profile_name() for p in report.profiles}
        for p in catalog_gpu.profiles:
            if p.name not in reported:
                notes.append(
                    CatalogNote(
                        NoteCode.PROFILE_NOT_REPORTED,
                        p.name,
                        f"{label}: the catalog lists {p.name}, which NVML does not report (driver too old?)",
                    )
                )

    # NVML has no "total slices" query per profile table: the whole-GPU profile (7g, placement 0:8) spans
    # both axes. Without it, fall back to the catalog's totals rather than under-count.
    memory_slices = max((max(p.placement_starts) + p.memory_slices for p in profiles), default=0)
    compute_slices = max((p.compute_slices for p in profiles), default=0)
    if catalog_gpu is not None:
        memory_slices = max(memory_slices, catalog_gpu.memory_slices)
        compute_slices = max(compute_slices, catalog_gpu.compute_slices)
    model = GpuModel(
        model=label,
        compute_slices=compute_slices,
        memory_slices=memory_slices,
        profiles=tuple(profiles),
        description=catalog_gpu.description if catalog_gpu is not None else report.name,
        nvml_names=(report.name,),
        pci_device_ids=(report.pci_device_id,),
        slurm_type=catalog_gpu.slurm_type if catalog_gpu is not None else None,
        memory_gb=catalog_gpu.memory_gb if catalog_gpu is not None else None,
        sources=("nvml",),
        notes=tuple(n.message for n in notes),
    )
    notes.sort(key=lambda n: (n.profile or "", n.code.value, n.message))
    return model, tuple(notes)


def _field_notes(label: str, known: MigProfile, nvml: MigProfile) -> list[CatalogNote]:
    notes: list[CatalogNote] = []
    name = known.name

    def differ(code: NoteCode, what: str, catalog_value: object, nvml_value: object) -> None:
        notes.append(
            CatalogNote(code, name, f"{label}: {name} {what}: catalog {catalog_value}, NVML {nvml_value}")
        )

    if known.compute_slices != nvml.compute_slices:
        differ(NoteCode.COMPUTE_SLICES_DIFFER, "compute slices", known.compute_slices, nvml.compute_slices)
    if known.memory_slices != nvml.memory_slices:
        differ(NoteCode.MEMORY_SLICES_DIFFER, "memory slices", known.memory_slices, nvml.memory_slices)
    if known.max_instances != nvml.max_instances:
        differ(NoteCode.MAX_INSTANCES_DIFFER, "max instances", known.max_instances, nvml.max_instances)
    if known.placement_starts != nvml.placement_starts:
        differ(
            NoteCode.PLACEMENTS_DIFFER,
            "placement starts",
            _fmt(known.placement_starts),
            _fmt(nvml.placement_starts),
        )
    if known.profile_id is not None and known.profile_id != nvml.profile_id:
        differ(NoteCode.PROFILE_ID_DIFFERS, "profile id", known.profile_id, nvml.profile_id)
    return notes


def _fmt(starts: tuple[int, ...]) -> str:
    return "{" + ",".join(str(s) for s in starts) + "}"
