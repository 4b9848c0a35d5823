"""The MIG profile catalog: loading ``slurm_elastic/data/mig_profiles.yaml`` strictly, and looking GPUs up.

The loader rejects unknown fields, a missing or unknown ``version``, and numbers that contradict each other
(a placement that runs past the last memory slice, a profile name whose ``Ng`` disagrees with its compute
slices, more instances than placements...). A catalog that loads is internally consistent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from slurm_elastic.mig.errors import CatalogError, UnknownGpuError
from slurm_elastic.mig.model import PROFILE_NAME_RE, GpuModel, MigProfile

CATALOG_VERSION = 1
_PACKAGED = "mig_profiles.yaml"

_TOP_FIELDS = {"version": True, "sources": True, "gpus": True}
_GPU_FIELDS = {
    "model": True,
    "description": False,
    "nvml_names": True,
    "pci_device_ids": False,
    "slurm_type": False,
    "memory_gb": False,
    "compute_slices": True,
    "memory_slices": True,
    "sources": True,
    "notes": False,
    "profiles": True,
}
_PROFILE_FIELDS = {
    "name": True,
    "profile_id": False,
    "nvml_profile": False,
    "compute_slices": True,
    "memory_slices": True,
    "max_instances": True,
    "placement_starts": True,
}


@dataclass(frozen=True)
class Catalog:
    """Every GPU model the catalog knows, plus the source descriptions its tables cite."""

    version: int
    gpus: tuple[GpuModel, ...]
    sources: tuple[tuple[str, str], ...] = ()

    def models(self) -> tuple[str, ...]:
        return tuple(g.model for g in self.gpus)

    def get(self, key: str) -> GpuModel:
        """Find a GPU by model (``H100-80GB``, any case), NVML name or PCI device id (``0x233010DE``)."""
        found = self.find(key)
        if found is None:
            raise UnknownGpuError(f"unknown GPU model {key!r} (known: {', '.join(self.models())})")
        return found

    def find(self, key: str) -> GpuModel | None:
        wanted = key.strip()
        low = wanted.lower()
        for gpu in self.gpus:
            if gpu.model.lower() == low or wanted in gpu.nvml_names:
                return gpu
        pci = normalize_pci_device_id(wanted)
        if pci is not None:
            for gpu in self.gpus:
                if pci in gpu.pci_device_ids:
                    return gpu
        return None

    def by_pci_device_id(self, device_id: str) -> GpuModel | None:
        pci = normalize_pci_device_id(device_id)
        if pci is None:
            return None
        for gpu in self.gpus:
            if pci in gpu.pci_device_ids:
                return gpu
        return None

    def source(self, key: str) -> str | None:
        return dict(self.sources).get(key)


def normalize_pci_device_id(value: str) -> str | None:
    """``0x233010de`` -> ``0x233010DE`` (device id, then vendor id, as mig-parted writes them); else None."""
    text = value.strip()
    if not text.lower().startswith("0x"):
        return None
    digits = text[2:]
    if len(digits) != 8 or any(c not in "0123456789abcdefABCDEF" for c in digits):
        return None
    return "0x" + digits.upper()


def load_catalog(path: str | Path | None = None) -> Catalog:
    """Load the packaged catalog, or the file at ``path``."""
    if path is None:
        text = (
            resources.files("slurm_elastic").joinpath("data").joinpath(_PACKAGED).read_text(encoding="utf-8")
        )
        origin = f"packaged {_PACKAGED}"
    else:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise CatalogError(f"cannot read MIG catalog {path}: {exc.strerror or exc}") from exc
        origin = str(path)
    return parse_catalog_text(text, origin)


def parse_catalog_text(text: str, origin: str = "catalog") -> Catalog:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CatalogError(f"{origin}: not valid YAML: {exc}") from exc
    return parse_catalog(data, origin)


def parse_catalog(data: Any, origin: str = "catalog") -> Catalog:
    """Validate a decoded catalog document into a :class:`Catalog`."""
    top = _mapping(data, origin)
    if "version" not in top:
        raise CatalogError(f"{origin}: missing 'version' (this loader reads version {CATALOG_VERSION})")
    _check_fields(top, _TOP_FIELDS, origin)
    version = top["version"]
    if version != CATALOG_VERSION or isinstance(version, bool):
        raise CatalogError(
            f"{origin}: unknown version {version!r} (this loader reads version {CATALOG_VERSION})"
        )

    sources_raw = _mapping(top["sources"], f"{origin}: sources")
    sources: list[tuple[str, str]] = []
    for key, text in sources_raw.items():
        sources.append((_string(key, f"{origin}: sources key"), _string(text, f"{origin}: sources.{key}")))
    source_keys = {k for k, _ in sources}

    gpus_raw = top["gpus"]
    if not isinstance(gpus_raw, list) or not gpus_raw:
        raise CatalogError(f"{origin}: gpus must be a non-empty list")
    gpus = [_parse_gpu(g, f"{origin}: gpus[{i}]", source_keys) for i, g in enumerate(gpus_raw)]

    seen: dict[str, str] = {}
    for gpu in gpus:
        keys = [gpu.model.lower(), *gpu.nvml_names, *gpu.pci_device_ids]
        for key in keys:
            if key in seen:
                raise CatalogError(f"{origin}: {key!r} is claimed by both {seen[key]} and {gpu.model}")
            seen[key] = gpu.model
    return Catalog(version=CATALOG_VERSION, gpus=tuple(gpus), sources=tuple(sources))


def _parse_gpu(raw: Any, where: str, source_keys: set[str]) -> GpuModel:
    g = _mapping(raw, where)
    if isinstance(g.get("model"), str):
        where = f"{where} ({g['model']})"
    _check_fields(g, _GPU_FIELDS, where)
    model = _string(g["model"], f"{where}.model")
    compute = _positive_int(g["compute_slices"], f"{where}.compute_slices")
    memory = _positive_int(g["memory_slices"], f"{where}.memory_slices")
    nvml_names = tuple(
        _string(n, f"{where}.nvml_names") for n in _list(g["nvml_names"], f"{where}.nvml_names")
    )
    pci_ids: list[str] = []
    for raw_id in _list(g.get("pci_device_ids", []), f"{where}.pci_device_ids"):
        norm = normalize_pci_device_id(_string(raw_id, f"{where}.pci_device_ids"))
        if norm is None:
            raise CatalogError(f"{where}.pci_device_ids: {raw_id!r} is not a PCI id like 0x233010DE")
        pci_ids.append(norm)
    sources = tuple(_string(s, f"{where}.sources") for s in _list(g["sources"], f"{where}.sources"))
    if not sources:
        raise CatalogError(f"{where}.sources: every GPU table must name its sources")
    for s in sources:
        if s not in source_keys:
            raise CatalogError(f"{where}.sources: {s!r} is not described under the top-level 'sources'")
    notes = tuple(_string(n, f"{where}.notes") for n in _list(g.get("notes", []), f"{where}.notes"))
    slurm_type = g.get("slurm_type")
    if slurm_type is not None:
        slurm_type = _string(slurm_type, f"{where}.slurm_type")
    memory_gb = g.get("memory_gb")
    if memory_gb is not None:
        memory_gb = _positive_int(memory_gb, f"{where}.memory_gb")

    profiles_raw = _list(g["profiles"], f"{where}.profiles")
    if not profiles_raw:
        raise CatalogError(f"{where}.profiles: at least one profile is required")
    profiles = [
        _parse_profile(p, f"{where}.profiles[{i}]", compute, memory) for i, p in enumerate(profiles_raw)
    ]
    names = [p.name for p in profiles]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise CatalogError(f"{where}.profiles: duplicate profile {', '.join(dupes)}")
    ids = [p.profile_id for p in profiles if p.profile_id is not None]
    if len(ids) != len(set(ids)):
        raise CatalogError(f"{where}.profiles: duplicate profile_id")
    return GpuModel(
        model=model,
        compute_slices=compute,
        memory_slices=memory,
        profiles=tuple(profiles),
        description=_string(g.get("description", ""), f"{where}.description"),
        nvml_names=nvml_names,
        pci_device_ids=tuple(pci_ids),
        slurm_type=slurm_type,
        memory_gb=memory_gb,
        sources=sources,
        notes=notes,
    )


def _parse_profile(raw: Any, where: str, gpu_compute: int, gpu_memory: int) -> MigProfile:
    p = _mapping(raw, where)
    if isinstance(p.get("name"), str):
        where = f"{where} ({p['name']})"
    _check_fields(p, _PROFILE_FIELDS, where)
    name = _string(p["name"], f"{where}.name")
    m = PROFILE_NAME_RE.match(name)
    if m is None:
        raise CatalogError(f"{where}: {name!r} is not a MIG profile name like 3g.40gb or 1g.10gb+me")
    compute = _positive_int(p["compute_slices"], f"{where}.compute_slices")
    memory = _positive_int(p["memory_slices"], f"{where}.memory_slices")
    max_instances = _positive_int(p["max_instances"], f"{where}.max_instances")
    if int(m.group("compute")) != compute:
        raise CatalogError(
            f"{where}: the name says {m.group('compute')} compute slices, compute_slices says {compute}"
        )
    if compute > gpu_compute:
        raise CatalogError(f"{where}: {compute} compute slices, the GPU has {gpu_compute}")
    if memory > gpu_memory:
        raise CatalogError(f"{where}: {memory} memory slices, the GPU has {gpu_memory}")
    starts_raw = _list(p["placement_starts"], f"{where}.placement_starts")
    starts = tuple(_non_negative_int(s, f"{where}.placement_starts") for s in starts_raw)
    if not starts:
        raise CatalogError(f"{where}.placement_starts: at least one start is required")
    if list(starts) != sorted(set(starts)):
        raise CatalogError(
            f"{where}.placement_starts: must be increasing without repeats, got {list(starts)}"
        )
    for s in starts:
        if s + memory > gpu_memory:
            raise CatalogError(f"{where}: placement {s}:{memory} runs past memory slice {gpu_memory - 1}")
    if max_instances * compute > gpu_compute or max_instances > len(starts):
        raise CatalogError(
            f"{where}: max_instances {max_instances} cannot fit ({len(starts)} placements, "
            f"{gpu_compute} compute slices)"
        )
    profile_id = p.get("profile_id")
    if profile_id is not None:
        profile_id = _non_negative_int(profile_id, f"{where}.profile_id")
    nvml_profile = p.get("nvml_profile")
    if nvml_profile is not None:
        nvml_profile = _string(nvml_profile, f"{where}.nvml_profile")
        if not nvml_profile.startswith("NVML_GPU_INSTANCE_PROFILE_"):
            raise CatalogError(
                f"{where}.nvml_profile: {nvml_profile!r} is not an NVML_GPU_INSTANCE_PROFILE_* name"
            )
    return MigProfile(
        name=name,
        compute_slices=compute,
        memory_slices=memory,
        max_instances=max_instances,
        placement_starts=starts,
        profile_id=profile_id,
        nvml_profile=nvml_profile,
    )


def _check_fields(obj: Mapping[str, Any], spec: Mapping[str, bool], where: str) -> None:
    unknown = sorted(str(k) for k in obj if k not in spec)
    if unknown:
        raise CatalogError(
            f"{where}: unknown field {', '.join(repr(u) for u in unknown)} (allowed: {', '.join(spec)})"
        )
    missing = [k for k, required in spec.items() if required and k not in obj]
    if missing:
        raise CatalogError(f"{where}: missing field {', '.join(repr(m) for m in missing)}")


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise CatalogError(f"{where}: expected a mapping, got {type(value).__name__}")
    return value


def _list(value: Any, where: str) -> Sequence[Any]:
    if not isinstance(value, list):
        raise CatalogError(f"{where}: expected a list, got {type(value).__name__}")
    return value


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise CatalogError(f"{where}: expected a string, got {type(value).__name__}")
    return value


def _positive_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CatalogError(f"{where}: expected a positive integer, got {value!r}")
    return value


def _non_negative_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise CatalogError(f"{where}: expected a non-negative integer, got {value!r}")
    return value
