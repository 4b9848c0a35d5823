"""PNG plots of runs (matplotlib, Agg backend): JCT CDF, GPU utilization and queue length over time."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from slurm_elastic.sim.engine import SimResult
from slurm_elastic.sim.errors import SimulationError

_BINS = 400


def _utilization_series(result: SimResult, start: float, end: float) -> tuple[list[float], list[float], list[float]]:
    """Bin centres (hours from start), allocated and effective utilization per bin (0..1)."""
    width = max((end - start) / _BINS, 1e-9)
    held = [0.0] * _BINS
    busy = [0.0] * _BINS
    for u in result.usage:
        first = max(0, int((u.start - start) / width))
        last = min(_BINS - 1, int((u.end - start) / width))
        for b in range(first, last + 1):
            lo, hi = start + b * width, start + (b + 1) * width
            overlap = min(hi, u.end) - max(lo, u.start)
            if overlap > 0:
                held[b] += u.gpus * overlap
                busy[b] += u.busy_gpus * overlap
    capacity = result.config.total_gpus * width
    hours = [(b + 0.5) * width / 3600.0 for b in range(_BINS)]
    return hours, [h / capacity for h in held], [x / capacity for x in busy]


def pyplot_in(directory: Path, error: type[Exception] = SimulationError) -> Any:
    """matplotlib.pyplot on the Agg backend, once ``directory`` exists; ``error`` (the caller's own type) when
    matplotlib is missing or the directory cannot be made."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise error("--plot needs matplotlib: pip install 'slurm-elastic[sim]'") from exc
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise error(f"cannot create {directory}: {exc.strerror or exc}") from exc
    return plt


def write_plots(results: Mapping[str, SimResult], directory: Path) -> list[Path]:
    """Write jct_cdf.png, utilization.png and queue_length.png into ``directory``; return their paths."""
    plt = pyplot_in(directory)
    runs = {name: r for name, r in results.items() if r.jobs}
    start = min((min(j.submit_time for j in r.jobs) for r in runs.values()), default=0.0)
    end = max((max(j.end_time for j in r.jobs) for r in runs.values()), default=1.0)
    paths: list[Path] = []

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, r in runs.items():
        jcts = sorted(j.jct / 3600.0 for j in r.jobs)
        ax.step(jcts, [(i + 1) / len(jcts) for i in range(len(jcts))], where="post", label=name)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (hours, log scale)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title("JCT CDF")
    ax.grid(True, alpha=0.3)
    ax.legend()
    paths.append(_save(fig, directory / "jct_cdf.png", plt))

    fig, ax = plt.subplots(figsize=(9, 4.5))
    for name, r in runs.items():
        hours, held, busy = _utilization_series(r, start, end)
        line = ax.plot(hours, held, label=f"{name} allocated")[0]
        ax.plot(hours, busy, linestyle="--", color=line.get_color(), label=f"{name} effective")
    ax.set_xlabel("time (hours)")
    ax.set_ylabel("GPU utilization")
    ax.set_ylim(0, 1.05)
    ax.set_title("GPU utilization over time")
    ax.grid(True, alpha=0.3)
    ax.legend()
    paths.append(_save(fig, directory / "utilization.png", plt))

    fig, ax = plt.subplots(figsize=(9, 4.5))
    for name, r in runs.items():
        times = [(t - start) / 3600.0 for t, _ in r.queue_length]
        ax.step(times, [n for _, n in r.queue_length], where="post", label=name)
    ax.set_xlabel("time (hours)")
    ax.set_ylabel("pending jobs")
    ax.set_title("Queue length over time")
    ax.grid(True, alpha=0.3)
    ax.legend()
    paths.append(_save(fig, directory / "queue_length.png", plt))
    return paths


def _save(fig: Any, path: Path, plt: Any) -> Path:
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
