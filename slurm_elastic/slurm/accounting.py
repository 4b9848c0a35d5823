"""Parsers for Slurm's accounting reads: ``sshare`` (fair-share weights), ``sacctmgr`` GPU limits and ``sacct``
final job states.

Pure text -> typed values; :class:`slurm_elastic.slurm.adapter.SlurmCli` runs the commands.

**Weights** (``sshare -P -a -o Account,User,RawShares,NormShares,FairShare,LevelFS``): an account's weight is
its *effective normalized shares*: its NormShares times the NormShares of each parent account up to root.
22.05 normalizes NormShares among siblings only, so for top-level accounts (the usual case) this is exactly
their NormShares, and for a sub-account it is its part of its parent's part. Shares are what the site
*granted* (sacctmgr ``Fairshare=``), so the split of spare nodes follows the site's intent rather than recent
usage; with the fair-tree algorithm, 22.05 leaves FairShare empty on account rows anyway (it is a per-user
factor). An account row has an empty User column; sshare indents the Account column one space per level.

**GPU limits** (``sacctmgr -n -P show assoc format=Cluster,Account,User,Partition,ParentName,GrpTRES`` and
``sacctmgr -n -P show qos format=Name,GrpTRES,MaxTRESPerUser,MaxTRESPerAccount``): the ``gres/gpu=N`` part of a
TRES string, untyped only (a typed ``gres/gpu:a100=N`` limit is not read). Unlimited is an absent entry (Slurm
prints nothing, or ``-1`` in some releases).

**Final states** (``sacct -n -P -X -o JobID,State -j <ids>``): how a job that has left ``squeue`` (after
``MinJobAge``) ended, e.g. ``PREEMPTED`` or ``NODE_FAIL``. ``CANCELLED by 0`` is read as ``CANCELLED``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from slurm_elastic.slurm.errors import SlurmParseError

SSHARE_FIELDS = ("Account", "User", "RawShares", "NormShares", "FairShare", "LevelFS")
ASSOC_FIELDS = ("Cluster", "Account", "User", "Partition", "ParentName", "GrpTRES")
QOS_FIELDS = ("Name", "GrpTRES", "MaxTRESPerUser", "MaxTRESPerAccount")
SACCT_FIELDS = ("JobID", "State")
#: Columns of the accounting export that ``report`` and ``whatif`` read (by name, with
#: :func:`slurm_elastic.sim.loaders.sacct.parse_accounting`).
REPORT_FIELDS = ("JobID", "Submit", "Start", "End", "Elapsed", "AllocTRES", "ReqTRES", "NNodes", "State",
                 "Partition", "Account", "User", "QOS", "Timelimit")


@dataclass(frozen=True)
class ShareRow:
    """One row of ``sshare``: an account (``user`` None) or a user in an account, at ``depth`` in the tree."""

    account: str
    user: str | None
    depth: int
    raw_shares: int | None
    norm_shares: float | None
    fair_share: float | None
    level_fs: float | None


@dataclass(frozen=True)
class AssocGpuLimit:
    """An association's GrpTRES GPU limit: the account's (``user`` None) or a user's within the account."""

    account: str
    user: str | None
    partition: str | None
    gpus: int


@dataclass(frozen=True)
class QosGpuLimit:
    """A QOS's GPU limits: all its jobs together, per user, per account (None: unlimited)."""

    name: str
    grp_gpus: int | None
    per_user_gpus: int | None
    per_account_gpus: int | None


@dataclass(frozen=True)
class GpuLimits:
    assocs: tuple[AssocGpuLimit, ...] = ()
    qos: tuple[QosGpuLimit, ...] = ()


def _float(text: str, what: str) -> float | None:
    text = text.strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise SlurmParseError(f"sshare: {what} {text!r} is not a number") from None
    return value if math.isfinite(value) else None


def _int(text: str, what: str) -> int | None:
    value = _float(text, what)
    return None if value is None else int(value)


def _header_index(header: str, fields: Sequence[str], command: str) -> dict[str, int]:
    names = header.split("|")
    index = {name: i for i, name in enumerate(names)}
    missing = [f for f in fields if f not in index]
    if missing:
        raise SlurmParseError(f"{command}: header {header!r} lacks {', '.join(missing)}")
    return index


def parse_sshare(text: str) -> tuple[ShareRow, ...]:
    """Rows of ``sshare -P -o ...`` (with its header line), in sshare's (tree) order."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise SlurmParseError("sshare: empty output")
    idx = _header_index(lines[0], ("Account", "User", "RawShares", "NormShares"), "sshare")
    rows: list[ShareRow] = []
    for line in lines[1:]:
        cols = line.split("|")
        if len(cols) < len(idx):
            raise SlurmParseError(f"sshare: {len(cols)} columns in {line!r}, expected {len(idx)}")
        account_col = cols[idx["Account"]]
        account = account_col.strip()
        if not account:
            raise SlurmParseError(f"sshare: row without an account: {line!r}")

        def col(name: str, row: list[str] = cols) -> str:
            return row[idx[name]] if name in idx else ""

        rows.append(ShareRow(
            account=account,
            user=col("User").strip() or None,
            depth=len(account_col) - len(account_col.lstrip(" ")),
            raw_shares=_int(col("RawShares"), "RawShares"),
            norm_shares=_float(col("NormShares"), "NormShares"),
            fair_share=_float(col("FairShare"), "FairShare"),
            level_fs=_float(col("LevelFS"), "LevelFS"),
        ))
    return tuple(rows)


def account_weights(rows: Sequence[ShareRow]) -> dict[str, float]:
    """Effective normalized shares per account (see the module docstring); root and unknown values left out.

    The parent of an account row is the nearest account row above it with a smaller depth.
    """
    weights: dict[str, float] = {}
    stack: list[tuple[int, float]] = []  # (depth, effective share) of the open ancestors
    for row in rows:
        if row.user is not None:
            continue
        while stack and stack[-1][0] >= row.depth:
            stack.pop()
        own = row.norm_shares
        if row.depth == 0:  # the root account: NormShares 0 by definition; the tree's total is 1
            stack.append((row.depth, 1.0))
            continue
        parent = stack[-1][1] if stack else 1.0
        effective = parent * own if own is not None else 0.0
        stack.append((row.depth, effective))
        if effective > 0:
            weights[row.account] = effective
    return weights


def gpu_limit(tres: str) -> int | None:
    """The untyped ``gres/gpu=N`` limit of a TRES string such as ``cpu=64,gres/gpu=8`` (None: no such limit)."""
    for part in tres.split(","):
        key, sep, value = part.strip().partition("=")
        if not sep or key.strip() != "gres/gpu":
            continue
        value = value.strip()
        try:
            number = int(value)
        except ValueError:
            raise SlurmParseError(f"TRES limit {part.strip()!r} is not a whole number") from None
        return number if number >= 0 else None
    return None


def _rows(text: str, fields: Sequence[str], command: str) -> list[list[str]]:
    out: list[list[str]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cols = line.split("|")
        if cols and cols[-1] == "" and len(cols) == len(fields) + 1:
            cols = cols[:-1]  # some releases end each -P row with a separator
        if len(cols) != len(fields):
            raise SlurmParseError(f"{command}: {len(cols)} columns in {line!r}, expected {len(fields)}")
        out.append(cols)
    return out


def parse_assoc_limits(text: str, cluster: str | None = None) -> tuple[AssocGpuLimit, ...]:
    """GPU limits of ``sacctmgr -n -P show assoc format=<ASSOC_FIELDS>`` rows (of ``cluster`` when given)."""
    out: list[AssocGpuLimit] = []
    for cols in _rows(text, ASSOC_FIELDS, "sacctmgr show assoc"):
        row = dict(zip(ASSOC_FIELDS, cols, strict=True))
        if cluster is not None and row["Cluster"] != cluster:
            continue
        gpus = gpu_limit(row["GrpTRES"])
        if gpus is None or not row["Account"]:
            continue
        out.append(AssocGpuLimit(account=row["Account"], user=row["User"] or None,
                                 partition=row["Partition"] or None, gpus=gpus))
    return tuple(out)


def parse_qos_limits(text: str) -> tuple[QosGpuLimit, ...]:
    """QOSes of ``sacctmgr -n -P show qos format=<QOS_FIELDS>`` that have some GPU limit."""
    out: list[QosGpuLimit] = []
    for cols in _rows(text, QOS_FIELDS, "sacctmgr show qos"):
        row = dict(zip(QOS_FIELDS, cols, strict=True))
        limit = QosGpuLimit(name=row["Name"], grp_gpus=gpu_limit(row["GrpTRES"]),
                            per_user_gpus=gpu_limit(row["MaxTRESPerUser"]),
                            per_account_gpus=gpu_limit(row["MaxTRESPerAccount"]))
        if row["Name"] and (limit.grp_gpus, limit.per_user_gpus, limit.per_account_gpus) != (None, None, None):
            out.append(limit)
    return tuple(out)


def parse_cluster_name(text: str) -> str | None:
    """``ClusterName`` from ``scontrol show config`` (``ClusterName             = elastic``)."""
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "ClusterName":
            return value.strip() or None
    return None


def parse_resume_timeout(text: str) -> float | None:
    """``ResumeTimeout`` in seconds from ``scontrol show config`` (``ResumeTimeout           = 60 sec``): how long
    Slurm waits for a powered-down node to come back before it marks the node DOWN (power saving)."""
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "ResumeTimeout":
            number = value.split()[0] if value.split() else ""
            return float(number) if number.isdigit() else None
    return None


def merge_exports(chunks: Sequence[str]) -> str:
    """One ``sacct -P`` export from several (consecutive windows, oldest first, each with its header line).

    A job that ran across windows is listed in each; its record is kept once, as the newest window printed it
    (a job running when one window was read may have ended by the next). Records are told apart by JobID,
    Submit and Start: a resized job's records differ in Submit, a requeued job's runs in Start."""
    header: str | None = None
    records: dict[tuple[str, ...], str] = {}
    for chunk in chunks:
        lines = [line for line in chunk.splitlines() if line.strip()]
        if not lines:
            continue
        if header is None:
            header = lines[0]
        elif lines[0] != header:
            raise SlurmParseError(f"sacct: header {lines[0]!r} differs from {header!r}")
        names = header.rstrip("|").split("|")
        try:
            key_at = [names.index(k) for k in ("JobID", "Submit", "Start")]
        except ValueError:
            raise SlurmParseError(f"sacct: header {header!r} lacks JobID, Submit or Start") from None
        for line in lines[1:]:
            cols = line.split("|")
            key = tuple(cols[i] if i < len(cols) else "" for i in key_at)
            records.pop(key, None)  # re-inserted: the newest text, in the newest window's order
            records[key] = line
    return "" if header is None else "\n".join([header, *records.values()]) + "\n"


def parse_sacct_states(text: str) -> dict[int, str]:
    """Job id -> final state of ``sacct -n -P -X -o JobID,State`` rows. Rows of array tasks (``12_3``) and
    het components (``12+1``) are skipped: extension jobs are plain jobs. A job listed twice (a requeued job
    keeps its id) takes its last row."""
    out: dict[int, str] = {}
    for job_id, state in _rows(text, SACCT_FIELDS, "sacct"):
        if not job_id.isdigit():
            continue
        words = state.split()
        if not words:
            raise SlurmParseError(f"sacct: empty State for job {job_id}")
        out[int(job_id)] = words[0]
    return out

