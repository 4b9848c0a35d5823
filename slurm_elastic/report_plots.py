"""PNG plots of ``report --plot`` and ``whatif --plot`` (matplotlib, Agg backend), in the tables' units: times on
an axis of seconds, minutes or hours picked from the values (a table prints 45s, 2:05 or 1:02:03), utilization in
percent (the tables print 57.3%).

* ``jct_cdf.png`` / ``wait_cdf.png``: one CDF per series (report: elastic, rigid; whatif: actual, rigid,
  elastic);
* ``utilization.png`` (report, with samples): the elastic jobs' GPU utilization over time, percent;
* ``nodes.png`` (whatif): each replayed job's node count over time, rigid and elastic side by side.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from slurm_elastic.errors import SlurmElasticError
from slurm_elastic.sim.plots import pyplot_in

#: (divisor, unit) by the largest value plotted: what a table shows for such values.
_TIME_UNITS = ((3600.0, "hours"), (60.0, "minutes"), (1.0, "seconds"))


class PlotError(SlurmElasticError):
    """matplotlib missing, or the directory cannot be made."""


def time_unit(values: Sequence[float]) -> tuple[float, str]:
    """The axis unit for durations ``values`` (seconds): hours from 2 h, minutes from 2 min, else seconds."""
    top = max(values, default=0.0)
    for divisor, unit in _TIME_UNITS:
        if top >= 2 * divisor or divisor == 1.0:
            return divisor, unit
    return 1.0, "seconds"  # pragma: no cover - the loop always returns


def _pyplot(directory: Path) -> Any:
    return pyplot_in(directory, PlotError)


def _save(fig: Any, path: Path, plt: Any) -> Path:
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as exc:
        raise PlotError(f"cannot write {path}: {exc.strerror or exc}") from exc
    finally:
        plt.close(fig)
    return path


def write_cdfs(jcts: Mapping[str, Sequence[float]], waits: Mapping[str, Sequence[float]], directory: Path
               ) -> list[Path]:
    """jct_cdf.png and wait_cdf.png: one curve per series (seconds in, the axis in the tables' unit)."""
    plt = _pyplot(directory)
    paths: list[Path] = []
    for name, series, what in (("jct_cdf.png", jcts, "job completion time"), ("wait_cdf.png", waits, "queue wait")):
        divisor, unit = time_unit([v for values in series.values() for v in values])
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for label, values in series.items():
            if values:
                ordered = sorted(v / divisor for v in values)
                ax.step(ordered, [(i + 1) / len(ordered) for i in range(len(ordered))], where="post", label=label)
        ax.set_xlabel(f"{what} ({unit})")
        ax.set_ylabel("fraction of jobs")
        ax.set_title(f"{what} CDF")
        ax.grid(True, alpha=0.3)
        ax.legend()
        paths.append(_save(fig, directory / name, plt))
    return paths


def write_utilization(utilization: Sequence[tuple[float, float]], directory: Path) -> Path:
    """utilization.png: (epoch seconds, utilization 0..1) of the elastic jobs, drawn in percent."""
    plt = _pyplot(directory)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.plot([datetime.fromtimestamp(t, UTC) for t, _ in utilization], [100.0 * u for _, u in utilization])
    ax.set_xlabel("time (UTC)")
    ax.set_ylabel("GPU utilization of elastic jobs (%)")
    ax.set_ylim(0, 105)
    ax.set_title("GPU utilization over time")
    ax.grid(True, alpha=0.3)
    fig.autofmt_xdate()
    return _save(fig, directory / "utilization.png", plt)


def write_node_timelines(timelines: Mapping[str, Mapping[str, Sequence[tuple[float, float, int]]]],
                         directory: Path) -> Path:
    """nodes.png: per run (rigid, elastic), each job's node count over time: ``{run: {job: [(start, end, nodes),
    ...]}}`` with times in seconds from the window's first submission."""
    plt = _pyplot(directory)
    runs = [r for r in timelines if timelines[r]]
    fig, axes = plt.subplots(max(1, len(runs)), 1, figsize=(9, 2.5 + 2.0 * max(1, len(runs))), sharex=True,
                             squeeze=False)
    ends = [e for r in runs for spans in timelines[r].values() for _, e, _ in spans]
    divisor, unit = time_unit(ends)
    for ax, run in zip(axes[:, 0], runs or [""], strict=False):
        for job, spans in sorted(timelines.get(run, {}).items()):
            xs: list[float] = []
            ys: list[float] = []
            for start, end, nodes in sorted(spans):
                xs += [start / divisor, end / divisor]
                ys += [nodes, nodes]
            ax.plot(xs, ys, drawstyle="steps-post", label=job)
        ax.set_ylabel(f"{run} nodes")
        ax.grid(True, alpha=0.3)
    axes[-1, 0].set_xlabel(f"time since the first submission ({unit})")
    axes[0, 0].set_title("node count per job")
    return _save(fig, directory / "nodes.png", plt)
