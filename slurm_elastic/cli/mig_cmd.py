"""``slurm-elastic mig``: the MIG catalog, layout validation and mig-parted import/export.

The group is the home of every MIG verb. This module holds the pure, hardware-free ones; ``plan``,
``apply`` and ``suggest`` are added to the same group by their own modules with ``mig_cmd.add_command``.
Shared helpers for them: :func:`catalog_from_context`, :func:`parse_layout_option`, :func:`fail`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NoReturn

import click

from slurm_elastic.errors import SlurmElasticError
from slurm_elastic.mig.catalog import Catalog, load_catalog
from slurm_elastic.mig.errors import LayoutError
from slurm_elastic.mig.model import GpuModel, Layout, NodeLayout, describe_counts
from slurm_elastic.mig.parted import (
    check_config,
    config_from_node_layout,
    dump_parted_config,
    parse_parted_config,
)
from slurm_elastic.mig.validate import check_layout, parse_layout, plan_layout

_CATALOG_KEY = "slurm_elastic.mig.catalog"
_CATALOG_PATH_KEY = "slurm_elastic.mig.catalog_path"


@click.group("mig", context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--catalog",
    "catalog_path",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="SLURM_ELASTIC_MIG_CATALOG",
    help="MIG profile catalog to use instead of the packaged one (env SLURM_ELASTIC_MIG_CATALOG).",
)
@click.pass_context
def mig_cmd(ctx: click.Context, catalog_path: Path | None) -> None:
    """MIG layouts: profile catalog, validation, placement and mig-parted configs."""
    ctx.meta[_CATALOG_PATH_KEY] = catalog_path


def catalog_from_context(ctx: click.Context) -> Catalog:
    """The catalog chosen by ``--catalog`` (loaded once per invocation); exits 1 if it cannot be read."""
    cached = ctx.meta.get(_CATALOG_KEY)
    if isinstance(cached, Catalog):
        return cached
    try:
        catalog = load_catalog(ctx.meta.get(_CATALOG_PATH_KEY))
    except SlurmElasticError as exc:
        fail(ctx, str(exc))
    ctx.meta[_CATALOG_KEY] = catalog
    return catalog


def fail(ctx: click.Context, message: str) -> NoReturn:
    """One line on stderr, exit status 1 (usage errors are click's, status 2)."""
    click.echo(f"{ctx.command_path}: error: {message}", err=True)
    ctx.exit(1)
    raise AssertionError("unreachable")  # ctx.exit raises


def parse_layout_option(ctx: click.Context, param_name: str, text: str, mig_enabled: bool = True) -> Layout:
    """``'{"3g.40gb": 2}'`` -> Layout. Malformed JSON is a usage error (2), bad counts an error (1)."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(
            f"not valid JSON: {exc.msg} at column {exc.colno}", ctx, param_hint=param_name
        ) from None
    if not isinstance(raw, dict):
        raise click.BadParameter('expected a JSON object such as {"3g.40gb": 2}', ctx, param_hint=param_name)
    try:
        return parse_layout(raw, mig_enabled)
    except LayoutError as exc:
        fail(ctx, str(exc))


def _gpu(ctx: click.Context, catalog: Catalog, key: str) -> GpuModel:
    try:
        return catalog.get(key)
    except SlurmElasticError as exc:
        fail(ctx, str(exc))


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def _starts(starts: tuple[int, ...]) -> str:
    return ",".join(str(s) for s in starts)


@mig_cmd.command("catalog")
@click.option(
    "--gpu", "gpu_key", metavar="MODEL", help="Show one GPU's profiles (model, NVML name or PCI id)."
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def catalog_cmd(ctx: click.Context, gpu_key: str | None, as_json: bool) -> None:
    """List the catalog's GPUs, or one GPU's profiles and placement rules."""
    catalog = catalog_from_context(ctx)
    gpus = [_gpu(ctx, catalog, gpu_key)] if gpu_key else list(catalog.gpus)
    if as_json:
        click.echo(json.dumps([_gpu_json(g, catalog) for g in gpus], indent=2))
        return
    if not gpu_key:
        rows = [["MODEL", "SLICES", "PROFILES", "NVML_NAMES"]]
        for g in gpus:
            rows.append(
                [
                    g.model,
                    f"{g.compute_slices}c/{g.memory_slices}m",
                    ",".join(g.profile_names()),
                    "; ".join(g.nvml_names),
                ]
            )
        click.echo(_table(rows))
        return
    g = gpus[0]
    click.echo(
        f"{g.model}: {g.description} - {g.compute_slices} compute slices, {g.memory_slices} memory slices"
    )
    click.echo(f"NVML names: {'; '.join(g.nvml_names)}   PCI ids: {', '.join(g.pci_device_ids) or '-'}")
    rows = [["PROFILE", "ID", "COMPUTE", "MEMORY", "MAX", "STARTS"]]
    for p in g.profiles:
        rows.append(
            [
                p.name,
                "-" if p.profile_id is None else str(p.profile_id),
                str(p.compute_slices),
                str(p.memory_slices),
                str(p.max_instances),
                _starts(p.placement_starts),
            ]
        )
    click.echo(_table(rows))
    click.echo("Sources:")
    for s in g.sources:
        click.echo(f"  {s}: {' '.join((catalog.source(s) or '').split())}")
    for n in g.notes:
        click.echo(f"Note: {' '.join(n.split())}")


def _gpu_json(g: GpuModel, catalog: Catalog) -> dict[str, Any]:
    return {
        "model": g.model,
        "description": g.description,
        "nvml_names": list(g.nvml_names),
        "pci_device_ids": list(g.pci_device_ids),
        "slurm_type": g.slurm_type,
        "compute_slices": g.compute_slices,
        "memory_slices": g.memory_slices,
        "profiles": [
            {
                "name": p.name,
                "profile_id": p.profile_id,
                "nvml_profile": p.nvml_profile,
                "compute_slices": p.compute_slices,
                "memory_slices": p.memory_slices,
                "max_instances": p.max_instances,
                "placement_starts": list(p.placement_starts),
            }
            for p in g.profiles
        ],
        "sources": {s: catalog.source(s) for s in g.sources},
        "notes": list(g.notes),
    }


@mig_cmd.command("validate")
@click.option("--gpu", "gpu_key", required=True, metavar="MODEL", help="GPU model, NVML name or PCI id.")
@click.option(
    "--layout", "layout_text", required=True, metavar="JSON", help="Per-GPU layout, e.g. '{\"3g.40gb\": 2}'."
)
@click.option(
    "--json", "as_json", is_flag=True, help="Machine-readable output (exit status still 1 if invalid)."
)
@click.pass_context
def validate_cmd(ctx: click.Context, gpu_key: str, layout_text: str, as_json: bool) -> None:
    """Check a per-GPU layout against the catalog and show where each instance would go."""
    catalog = catalog_from_context(ctx)
    gpu = _gpu(ctx, catalog, gpu_key)
    layout = parse_layout_option(ctx, "--layout", layout_text)
    problems = check_layout(gpu, layout)
    placed = () if problems else plan_layout(gpu, layout)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "gpu": gpu.model,
                    "layout": layout.as_dict(),
                    "valid": not problems,
                    "problems": [{"code": p.code.value, "message": p.message} for p in problems],
                    "placements": [
                        {"profile": i.profile, "start": i.placement.start, "size": i.placement.size}
                        for i in placed
                    ],
                },
                indent=2,
            )
        )
        if problems:
            ctx.exit(1)
        return
    if problems:
        fail(ctx, "; ".join(p.message for p in problems))
    compute_of = {p.name: p.compute_slices for p in gpu.profiles}
    compute = sum(compute_of[i.profile] for i in placed)
    memory = sum(i.placement.size for i in placed)
    click.echo(
        f"{gpu.model}: {describe_counts(layout.counts)}: valid "
        f"({compute}/{gpu.compute_slices} compute slices, {memory}/{gpu.memory_slices} memory slices)"
    )
    if placed:
        rows = [["PROFILE", "START", "SIZE", "MEMORY_SLICES"]]
        for i in placed:
            rows.append(
                [
                    i.profile,
                    str(i.placement.start),
                    str(i.placement.size),
                    f"{i.placement.start}-{i.placement.end - 1}",
                ]
            )
        click.echo(_table(rows))


@mig_cmd.command("import-parted")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--config", "config_name", metavar="NAME", help="Check only this mig-config.")
@click.option(
    "--gpu", "gpu_key", metavar="MODEL", help="Check entries without a device-filter against this GPU."
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def import_parted_cmd(
    ctx: click.Context, path: Path, config_name: str | None, gpu_key: str | None, as_json: bool
) -> None:
    """Read a mig-parted config and check every entry against the catalog (exit 1 if any is invalid)."""
    catalog = catalog_from_context(ctx)
    gpu = _gpu(ctx, catalog, gpu_key) if gpu_key else None
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        fail(ctx, f"cannot read {path}: {exc.strerror or exc}")
    try:
        config = parse_parted_config(text, str(path))
        checks = check_config(config, catalog, config_name, gpu)
    except SlurmElasticError as exc:
        fail(ctx, str(exc))
    bad = [c for c in checks if not c.ok]
    if as_json:
        click.echo(
            json.dumps(
                [
                    {
                        "config": c.config,
                        "entry": c.entry,
                        "gpu": c.model,
                        "mig_enabled": c.layout.mig_enabled,
                        "layout": c.layout.as_dict(),
                        "valid": c.ok,
                        "problems": [{"code": p.code.value, "message": p.message} for p in c.problems],
                    }
                    for c in checks
                ],
                indent=2,
            )
        )
    else:
        for c in checks:
            click.echo(c.summary())
    if bad:
        if not as_json:
            click.echo(f"{ctx.command_path}: error: {len(bad)} of {len(checks)} checks failed", err=True)
        ctx.exit(1)


@mig_cmd.command("export-parted")
@click.option(
    "--layout", "layout_text", required=True, metavar="JSON", help="Per-GPU layout, e.g. '{\"3g.40gb\": 2}'."
)
@click.option("--name", "config_name", required=True, help="Name of the mig-config to write.")
@click.option(
    "--gpu", "gpu_key", metavar="MODEL", help="Validate against this GPU (and allow --device-filter)."
)
@click.option("--devices", default="all", show_default=True, help="'all' or GPU indexes such as 0,1.")
@click.option(
    "--device-filter", "with_filter", is_flag=True, help="Restrict the entry to --gpu's PCI device ids."
)
@click.option(
    "--mig-disabled", is_flag=True, help="Write an entry that turns MIG off (the layout must be {})."
)
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="Write here, not stdout."
)
@click.pass_context
def export_parted_cmd(
    ctx: click.Context,
    *,
    layout_text: str,
    config_name: str,
    gpu_key: str | None,
    devices: str,
    with_filter: bool,
    mig_disabled: bool,
    output: Path | None,
) -> None:
    """Write a per-GPU layout as a mig-parted config (version v1)."""
    catalog = catalog_from_context(ctx)
    layout = parse_layout_option(ctx, "--layout", layout_text, mig_enabled=not mig_disabled)
    gpu = _gpu(ctx, catalog, gpu_key) if gpu_key else None
    if with_filter and gpu is None:
        raise click.UsageError("--device-filter needs --gpu", ctx)
    if gpu is not None:
        problems = check_layout(gpu, layout)
        if problems:
            fail(ctx, "; ".join(p.message for p in problems))
    if devices.strip() == "all":
        indexes: list[int] = [0]
        gpu_count: int | None = 1  # one layout for every GPU: "devices: all"
    else:
        try:
            indexes = [int(d) for d in devices.split(",") if d.strip()]
        except ValueError:
            raise click.BadParameter(
                "expected 'all' or indexes such as 0,1", ctx, param_hint="--devices"
            ) from None
        if not indexes or any(i < 0 for i in indexes) or len(set(indexes)) != len(indexes):
            raise click.BadParameter("expected distinct GPU indexes >= 0", ctx, param_hint="--devices")
        gpu_count = None  # the caller named the GPUs: list them
    node_layout = NodeLayout.of({i: layout for i in indexes})
    filters = gpu.pci_device_ids if (with_filter and gpu is not None) else ()
    try:
        config = config_from_node_layout(config_name, node_layout, gpu_count, filters)
    except SlurmElasticError as exc:
        fail(ctx, str(exc))
    text = dump_parted_config(config)
    if output is None:
        click.echo(text, nl=False)
        return
    try:
        output.write_text(text, encoding="utf-8")
    except OSError as exc:
        fail(ctx, f"cannot write {output}: {exc.strerror or exc}")
