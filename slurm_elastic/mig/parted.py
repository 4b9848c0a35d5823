"""Import and export NVIDIA mig-parted configuration files (``version: v1``).

The format, as mig-parted's ``api/spec/v1`` defines it::

    version: v1
    mig-configs:
      all-balanced:
        - device-filter: ["0x233010DE", "0x233110DE"]   # optional; PCI device+vendor id, string or list
          devices: all                                   # or a list of GPU indexes: [0, 1]
          mig-enabled: true
          mig-devices:                                   # required when mig-enabled is true
            "1g.10gb": 2
            "2g.20gb": 1
            "3g.40gb": 1

Like mig-parted, the reader rejects a missing or unknown ``version``, unknown fields, entries without
``devices`` or ``mig-enabled``, ``mig-devices`` on a disabled entry and empty config lists. It is stricter in
two ways, both to keep a site's intent unambiguous: duplicate YAML keys are errors (YAML would silently keep
the last), and compute-instance profiles such as ``1c.2g.10gb`` are refused, because slurm-elastic creates
exactly one full-size compute instance per GPU instance (what Slurm schedules as one GPU).
"""

from __future__ import annotations

import json
import re
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import yaml

from slurm_elastic.mig.catalog import Catalog, normalize_pci_device_id
from slurm_elastic.mig.errors import LayoutProblem, MigRejectReason, PartedConfigError
from slurm_elastic.mig.model import PROFILE_NAME_RE, GpuModel, Layout, NodeLayout, describe_counts
from slurm_elastic.mig.validate import check_layout

PARTED_VERSION = "v1"
_SPEC_FIELDS = ("device-filter", "devices", "mig-enabled", "mig-devices")
_CI_PROFILE_RE = re.compile(r"^[0-9]+c\.[0-9]+g\.[0-9]+gb")

Devices = Literal["all"] | tuple[int, ...]


@dataclass(frozen=True)
class PartedSpec:
    """One entry of a mig-parted config: which GPUs it applies to and what they should look like."""

    devices: Devices
    mig_enabled: bool
    mig_devices: tuple[tuple[str, int], ...] = ()  # sorted by profile name, zero counts kept as written
    device_filter: tuple[str, ...] = ()
    device_filter_is_list: bool = True  # how the file wrote it, for a faithful export

    def layout(self) -> Layout:
        return Layout.of(dict(self.mig_devices), self.mig_enabled)

    def matches(self, index: int, pci_device_id: str | None) -> bool:
        if self.device_filter:
            if pci_device_id is None:
                return False
            primary = normalize_pci_device_id(pci_device_id.split(":")[0])
            if primary not in {f.split(":")[0] for f in self.device_filter}:
                return False
        return self.devices == "all" or index in self.devices


@dataclass(frozen=True)
class PartedConfig:
    version: str
    configs: tuple[tuple[str, tuple[PartedSpec, ...]], ...]

    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.configs)

    def get(self, name: str) -> tuple[PartedSpec, ...]:
        for n, specs in self.configs:
            if n == name:
                return specs
        raise PartedConfigError(f"no mig-config named {name!r} (have: {', '.join(self.names()) or 'none'})")


# --- reading ---------------------------------------------------------------------------------------------


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys."""


def _construct_mapping(
    loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False
) -> dict[Hashable, Any]:
    seen: set[Hashable] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return yaml.SafeLoader.construct_mapping(loader, node, deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def parse_parted_config(text: str, origin: str = "mig-parted config") -> PartedConfig:
    """Parse mig-parted YAML (or JSON, which is YAML) into a :class:`PartedConfig`."""
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise PartedConfigError(f"{origin}: not valid YAML: {' '.join(str(exc).split())}") from exc
    if not isinstance(data, Mapping):
        raise PartedConfigError(f"{origin}: expected a mapping with 'version' and 'mig-configs'")
    if "version" not in data:
        raise PartedConfigError(f"{origin}: missing 'version' (mig-parted configs start with 'version: v1')")
    if data["version"] != PARTED_VERSION:
        raise PartedConfigError(
            f"{origin}: unknown version {data['version']!r} (supported: {PARTED_VERSION})"
        )
    for key in data:
        if key not in ("version", "mig-configs"):
            raise PartedConfigError(f"{origin}: unexpected field {key!r} (allowed: version, mig-configs)")
    raw_configs = data.get("mig-configs")
    if not isinstance(raw_configs, Mapping) or not raw_configs:
        raise PartedConfigError(f"{origin}: 'mig-configs' must be a mapping with at least one entry")
    configs: list[tuple[str, tuple[PartedSpec, ...]]] = []
    for name, entries in raw_configs.items():
        if not isinstance(name, str):
            raise PartedConfigError(f"{origin}: config names must be strings, got {name!r}")
        where = f"{origin}: mig-configs.{name}"
        if not isinstance(entries, list) or not entries:
            raise PartedConfigError(f"{where}: at least one entry is required")
        configs.append((name, tuple(_parse_spec(e, f"{where}[{i}]") for i, e in enumerate(entries))))
    return PartedConfig(PARTED_VERSION, tuple(configs))


def _parse_spec(raw: Any, where: str) -> PartedSpec:
    if not isinstance(raw, Mapping):
        raise PartedConfigError(f"{where}: expected a mapping, got {type(raw).__name__}")
    for key in raw:
        if key not in _SPEC_FIELDS:
            raise PartedConfigError(f"{where}: unexpected field {key!r} (allowed: {', '.join(_SPEC_FIELDS)})")
    for key in ("devices", "mig-enabled"):
        if key not in raw:
            raise PartedConfigError(f"{where}: missing required field {key!r}")

    devices_raw = raw["devices"]
    devices: Devices
    if devices_raw == "all":
        devices = "all"
    elif isinstance(devices_raw, list) and all(
        isinstance(d, int) and not isinstance(d, bool) for d in devices_raw
    ):
        if any(d < 0 for d in devices_raw) or len(set(devices_raw)) != len(devices_raw):
            raise PartedConfigError(f"{where}: devices must be distinct GPU indexes >= 0, got {devices_raw}")
        devices = tuple(devices_raw)
    else:
        raise PartedConfigError(
            f"{where}: devices must be 'all' or a list of GPU indexes, got {devices_raw!r}"
        )

    enabled = raw["mig-enabled"]
    if not isinstance(enabled, bool):
        raise PartedConfigError(f"{where}: mig-enabled must be true or false, got {enabled!r}")

    filters: tuple[str, ...] = ()
    filter_is_list = True
    if "device-filter" in raw:
        df = raw["device-filter"]
        items: list[Any]
        if isinstance(df, str):
            items, filter_is_list = [df], False
        elif isinstance(df, list) and df:
            items = df
        else:
            raise PartedConfigError(
                f"{where}: device-filter must be a PCI id string or a list of them, got {df!r}"
            )
        filters = tuple(_normalize_filter(f, where) for f in items)

    mig_devices: list[tuple[str, int]] = []
    if "mig-devices" in raw:
        md = raw["mig-devices"]
        if md is None:
            md = {}
        if not isinstance(md, Mapping):
            raise PartedConfigError(f"{where}: mig-devices must be a mapping of profile to count, got {md!r}")
        for profile, count in md.items():
            if not isinstance(profile, str) or (
                PROFILE_NAME_RE.match(profile) is None and _CI_PROFILE_RE.match(profile) is None
            ):
                raise PartedConfigError(f"{where}: {profile!r} is not a MIG profile name like 1g.10gb")
            if _CI_PROFILE_RE.match(profile):
                raise PartedConfigError(
                    f"{where}: compute-instance profile {profile!r} is not supported: slurm-elastic creates "
                    "one full-size compute instance per GPU instance"
                )
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise PartedConfigError(
                    f"{where}: count for {profile} must be a whole number >= 0, got {count!r}"
                )
            mig_devices.append((profile, count))
    elif enabled:
        raise PartedConfigError(f"{where}: missing required field 'mig-devices' when 'mig-enabled' is true")
    if not enabled and any(n for _, n in mig_devices):
        raise PartedConfigError(f"{where}: MIG devices included when 'mig-enabled' is false")
    return PartedSpec(
        devices=devices,
        mig_enabled=enabled,
        mig_devices=tuple(sorted(mig_devices)),
        device_filter=filters,
        device_filter_is_list=filter_is_list,
    )


def _normalize_filter(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise PartedConfigError(
            f"{where}: device-filter entries must be strings like 0x233010DE, got {value!r}"
        )
    parts = value.split(":")
    norm = [normalize_pci_device_id(p) for p in parts]
    if len(parts) > 2 or any(n is None for n in norm):
        raise PartedConfigError(
            f"{where}: device-filter {value!r} is not a PCI id like 0x233010DE (or 0x233010DE:0x16C110DE)"
        )
    return ":".join(n for n in norm if n is not None)


# --- writing ---------------------------------------------------------------------------------------------

_PLAIN_RE = re.compile(r"^[A-Za-z][A-Za-z0-9._+-]*$")
_YAML_WORDS = {"y", "yes", "n", "no", "true", "false", "on", "off", "null", "~"}


def dump_parted_config(config: PartedConfig) -> str:
    """mig-parted YAML for ``config``; :func:`parse_parted_config` reads it back to an equal value."""
    lines = [f"version: {config.version}", "mig-configs:"]
    for name, specs in config.configs:
        lines.append(f"  {_scalar(name)}:")
        for spec in specs:
            first = True

            def emit(text: str) -> None:
                nonlocal first
                lines.append(("    - " if first else "      ") + text)
                first = False

            if spec.device_filter:
                if spec.device_filter_is_list or len(spec.device_filter) > 1:
                    emit("device-filter: [" + ", ".join(json.dumps(f) for f in spec.device_filter) + "]")
                else:
                    emit(f"device-filter: {json.dumps(spec.device_filter[0])}")
            if spec.devices == "all":
                emit("devices: all")
            else:
                emit("devices: [" + ", ".join(str(d) for d in spec.devices) + "]")
            emit(f"mig-enabled: {'true' if spec.mig_enabled else 'false'}")
            if spec.mig_enabled or spec.mig_devices:
                if spec.mig_devices:
                    emit("mig-devices:")
                    for profile, count in spec.mig_devices:
                        lines.append(f"        {json.dumps(profile)}: {count}")
                else:
                    emit("mig-devices: {}")
    return "\n".join(lines) + "\n"


def _scalar(text: str) -> str:
    if _PLAIN_RE.match(text) and text.lower() not in _YAML_WORDS:
        return text
    return json.dumps(text)


# --- converting ------------------------------------------------------------------------------------------


def node_layout_from_specs(
    specs: Sequence[PartedSpec], gpus: Sequence[tuple[int, str | None]], config_name: str = "config"
) -> NodeLayout:
    """The layout a config asks for on a node whose GPUs are ``(index, pci_device_id)``.

    A GPU no entry matches is left out (left as it is, as mig-parted does). A GPU two entries match is an
    error: mig-parted would apply both in turn, and which one wins is rarely what the author meant.
    """
    per_gpu: dict[int, Layout] = {}
    for index, pci in gpus:
        matched = [i for i, spec in enumerate(specs) if spec.matches(index, pci)]
        if len(matched) > 1:
            raise PartedConfigError(
                f"{config_name}: GPU {index} matches entries {', '.join(str(i) for i in matched)}; "
                "make the device-filter or devices lists disjoint"
            )
        if matched:
            per_gpu[index] = specs[matched[0]].layout()
    return NodeLayout.of(per_gpu)


def config_from_node_layout(
    name: str, layout: NodeLayout, gpu_count: int | None = None, device_filter: Sequence[str] = ()
) -> PartedConfig:
    """A one-config mig-parted file for ``layout``: one entry per distinct per-GPU layout.

    ``gpu_count`` is how many GPUs the node has: when one layout covers GPUs 0..gpu_count-1 the entry says
    ``devices: all``. Without it, entries list their GPU indexes.
    """
    if not layout.gpus:
        raise PartedConfigError(f"{name}: the layout names no GPU")
    filters = tuple(_normalize_filter(f, name) for f in device_filter)
    groups: dict[Layout, list[int]] = {}
    for index, gpu_layout in layout.gpus:
        groups.setdefault(gpu_layout, []).append(index)
    specs: list[PartedSpec] = []
    for gpu_layout, indexes in sorted(groups.items(), key=lambda kv: kv[1][0]):
        covers_all = len(groups) == 1 and gpu_count is not None and sorted(indexes) == list(range(gpu_count))
        specs.append(
            PartedSpec(
                devices="all" if covers_all else tuple(indexes),
                mig_enabled=gpu_layout.mig_enabled,
                mig_devices=gpu_layout.counts,
                device_filter=filters,
                device_filter_is_list=True,
            )
        )
    return PartedConfig(PARTED_VERSION, ((name, tuple(specs)),))


@dataclass(frozen=True)
class EntryCheck:
    """The verdict on one entry of one config for one GPU model (``model`` None: no model to check with)."""

    config: str
    entry: int
    model: str | None
    layout: Layout
    problems: tuple[LayoutProblem, ...]
    note: str | None = None  # why an entry was not checked

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        what = describe_counts(self.layout.counts) if self.layout.mig_enabled else "MIG disabled"
        target = self.model or "-"
        verdict = "ok" if self.ok else "; ".join(p.message for p in self.problems)
        if self.note:
            verdict = f"{verdict} ({self.note})"
        return f"{self.config}[{self.entry}] {target}: {what}: {verdict}"


def check_config(
    config: PartedConfig, catalog: Catalog, name: str | None = None, gpu: GpuModel | None = None
) -> tuple[EntryCheck, ...]:
    """Check every entry (of config ``name``, or of all configs) against the catalog's GPUs.

    The GPUs an entry is checked against: those its device-filter names; else ``gpu`` when given; else every
    catalog GPU that has all the profiles the entry names (mig-parted's generic configs such as all-2g.20gb
    are meant for whichever GPUs have that profile).
    """
    checks: list[EntryCheck] = []
    chosen = [(name, config.get(name))] if name is not None else list(config.configs)
    for cname, specs in chosen:
        for i, spec in enumerate(specs):
            layout = spec.layout()
            models: list[GpuModel] = []
            unknown_ids: list[str] = []
            if spec.device_filter:
                for f in spec.device_filter:
                    found = catalog.by_pci_device_id(f.split(":")[0])
                    if found is None:
                        unknown_ids.append(f)
                    elif found not in models:
                        models.append(found)
            elif gpu is not None:
                models = [gpu]
            elif not layout.counts:
                # MIG off, or on with no instances: nothing GPU-specific to check.
                checks.append(EntryCheck(cname, i, None, layout, (), note="valid on any MIG-capable GPU"))
                continue
            else:
                names = {p for p, _ in layout.counts}
                models = [g for g in catalog.gpus if names <= set(g.profile_names())]
                if not models:
                    checks.append(
                        EntryCheck(
                            cname,
                            i,
                            None,
                            layout,
                            (
                                LayoutProblem(
                                    MigRejectReason.UNKNOWN_PROFILE,
                                    f"no catalog GPU has all of {', '.join(sorted(names))}",
                                ),
                            ),
                        )
                    )
                    continue
            for model in models:
                checks.append(EntryCheck(cname, i, model.model, layout, check_layout(model, layout)))
            for f in unknown_ids:
                checks.append(
                    EntryCheck(
                        cname, i, None, layout, (), note=f"device {f} is not in the catalog; not checked"
                    )
                )
    return tuple(checks)
