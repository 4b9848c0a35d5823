"""One node's GRES in slurm.conf and gres.conf: read it, and rewrite it without touching any other node.

Pure text in, text out. Measured on Slurm 22.05.8 (docs/mig.md, section 8): a typed ``gpu`` GRES change needs
*both* files, because slurmctld takes a node's GRES names, types and counts from ``NodeName=... Gres=`` in
slurm.conf and slurmd takes the device files from gres.conf. With typed lines in gres.conf only, the node keeps
``Gres=gpu:4`` and ``--gres=gpu:3g.20gb:1`` stays pending (BadConstraints).

slurm.conf: the node's ``NodeName=`` record is found through its hostlist. A record that names several nodes
(``NodeName=n[1-4] ... Port=[17001-17004]``) is split into the other nodes and this node, and per-node lists
(``Port``, ``NodeAddr``, ``NodeHostname``) are split with it. A port list left longer than its node list makes
slurmctld exit ("Port count must equal that of NodeName records"), so every rewritten record is checked.

gres.conf: every ``Name=gpu`` / ``Name=mps`` line whose ``NodeName=`` covers the node is replaced by the new
lines, in place. A line for several nodes keeps the others. A marker comment (``# slurm-elastic-mig: <node>``)
precedes the node's lines; the test cluster's start script keeps a gres.conf that has one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from slurm_elastic.mig.errors import MigError
from slurm_elastic.slurm import hostlist
from slurm_elastic.slurm.errors import SlurmParseError
from slurm_elastic.slurm.gres import parse_gres

MARKER = "# slurm-elastic-mig:"
PER_NODE_KEYS = ("NodeHostname", "NodeAddr", "Port")  # slurm.conf keys whose value may be one entry per node
MANAGED_GRES = ("gpu", "mps")  # gres.conf names this module rewrites for a node


class SlurmConfEditError(MigError):
    """slurm.conf or gres.conf cannot be edited safely for this node (say why and what to change by hand)."""


@dataclass(frozen=True)
class _ConfLine:
    index: int  # line number (0-based)
    tokens: tuple[str, ...]
    hosts: tuple[str, ...]


def _key(token: str) -> str:
    return token.split("=", 1)[0].lower()


def _value(tokens: Sequence[str], key: str) -> str | None:
    for t in tokens:
        if "=" in t and _key(t) == key.lower():
            return t.split("=", 1)[1]
    return None


def _with_value(tokens: Sequence[str], key: str, value: str | None) -> tuple[str, ...]:
    """Replace (or append, or with None drop) ``key=value`` keeping the token order."""
    out: list[str] = []
    done = False
    for t in tokens:
        if "=" in t and _key(t) == key.lower():
            if value is not None and not done:
                out.append(f"{t.split('=', 1)[0]}={value}")
                done = True
            continue
        out.append(t)
    if value is not None and not done:
        out.append(f"{key}={value}")
    return tuple(out)


def _expand(value: str, where: str) -> tuple[str, ...]:
    try:
        return hostlist.expand(value)
    except SlurmParseError as exc:
        raise SlurmConfEditError(f"{where}: {exc}") from exc


def _logical_lines(text: str) -> list[str]:
    lines = text.split("\n")
    for n, line in enumerate(lines, 1):
        if line.rstrip().endswith("\\") and not line.lstrip().startswith("#"):
            raise SlurmConfEditError(f"line {n}: continuation lines ('\\') are not supported; join the line first")
    return lines


def _node_records(lines: Sequence[str], what: str) -> list[_ConfLine]:
    out: list[_ConfLine] = []
    for i, line in enumerate(lines):
        stripped = line.split("#", 1)[0].strip()
        if not stripped:
            continue
        tokens = tuple(stripped.split())
        first = tokens[0]
        if "=" not in first or _key(first) != "nodename":
            continue
        name = first.split("=", 1)[1]
        if name.upper() == "DEFAULT":
            continue
        out.append(_ConfLine(i, tokens, _expand(name, f"{what} line {i + 1}")))
    return out


# ---- slurm.conf -----------------------------------------------------------------------------------------------


def node_gres_value(slurm_conf: str, node: str) -> str | None:
    """The ``Gres=`` of ``node``'s NodeName record (None: the record has none); raises if no record names it."""
    rec = _find_record(_node_records(_logical_lines(slurm_conf), "slurm.conf"), node, "slurm.conf")
    return _value(rec.tokens, "Gres")


def _find_record(records: Sequence[_ConfLine], node: str, what: str) -> _ConfLine:
    found = [r for r in records if node in r.hosts]
    if not found:
        raise SlurmConfEditError(f"{what}: no NodeName= record names {node}")
    if len(found) > 1:
        lines = ", ".join(str(r.index + 1) for r in found)
        raise SlurmConfEditError(f"{what}: {node} is named by several NodeName= records (lines {lines})")
    return found[0]


def set_node_gres(slurm_conf: str, node: str, gres: str | None, note: str = "", *, marker: bool = True) -> str:
    """``slurm_conf`` with ``node``'s ``Gres=`` set to ``gres`` (None drops it), splitting a shared record.

    With ``marker``, a comment naming the node (and ``note``) is put above the node's own record.
    """
    if gres is not None and (not gres or any(c.isspace() for c in gres)):
        raise SlurmConfEditError(f"bad Gres value {gres!r}")
    lines = _logical_lines(slurm_conf)
    rec = _find_record(_node_records(lines, "slurm.conf"), node, "slurm.conf")
    marker_line = [f"{MARKER} {node}" + (f" {note}" if note else "")] if marker else []
    if rec.hosts == (node,):
        new = [" ".join(_with_value(rec.tokens, "Gres", gres))]
        replaced = [rec.index]
    else:
        others = tuple(h for h in rec.hosts if h != node)
        pos = rec.hosts.index(node)
        mine_tokens: tuple[str, ...] = rec.tokens
        other_tokens: tuple[str, ...] = rec.tokens
        for key in PER_NODE_KEYS:
            value = _value(rec.tokens, key)
            if value is None:
                continue
            items = _expand(value, f"slurm.conf line {rec.index + 1} {key}")
            if len(items) == 1:
                continue
            if len(items) != len(rec.hosts):
                raise SlurmConfEditError(
                    f"slurm.conf line {rec.index + 1}: {key} lists {len(items)} values for {len(rec.hosts)} nodes"
                )
            mine_tokens = _with_value(mine_tokens, key, items[pos])
            other_tokens = _with_value(
                other_tokens, key, hostlist.compress(v for k, v in enumerate(items) if k != pos)
            )
        other_tokens = (f"NodeName={hostlist.compress(others)}", *other_tokens[1:])
        mine_tokens = (f"NodeName={node}", *_with_value(mine_tokens, "Gres", gres)[1:])
        new = [" ".join(other_tokens), " ".join(mine_tokens)]
        replaced = [rec.index]
    out = list(lines)
    start = replaced[0]
    # Drop an earlier marker for this node right above the record (a second apply replaces it).
    if start > 0 and _is_marker_for(out[start - 1], node):
        del out[start - 1]
        start -= 1
    out[start : start + 1] = new[:-1] + marker_line + [new[-1]]
    result = "\n".join(out)
    _check_slurm_conf(result, node)
    return result


def _is_marker_for(line: str, node: str) -> bool:
    rest = line.strip().removeprefix(MARKER)
    return line.strip().startswith(MARKER) and rest.split()[:1] == [node]


def _check_slurm_conf(text: str, node: str) -> None:
    """Refuse a result slurmctld would reject: per-node lists that do not match their node list."""
    for rec in _node_records(text.split("\n"), "slurm.conf"):
        for key in PER_NODE_KEYS:
            value = _value(rec.tokens, key)
            if value is None:
                continue
            n = len(_expand(value, f"slurm.conf line {rec.index + 1} {key}"))
            if n not in (1, len(rec.hosts)):
                raise SlurmConfEditError(
                    f"rewriting {node} would leave slurm.conf line {rec.index + 1} with {n} {key} values "
                    f"for {len(rec.hosts)} nodes (slurmctld refuses to start)"
                )


# ---- gres.conf ------------------------------------------------------------------------------------------------


def _gres_name(tokens: Sequence[str]) -> str | None:
    name = _value(tokens, "Name")
    return name.lower() if name is not None else None


def node_gres_lines(gres_conf: str, node: str) -> tuple[str, ...]:
    """The gres.conf lines that define ``gpu``/``mps`` on ``node`` (as written, even if shared with others)."""
    lines = _logical_lines(gres_conf)
    _refuse_global_lines(lines)
    return tuple(
        lines[r.index].strip()
        for r in _node_records(lines, "gres.conf")
        if node in r.hosts and _gres_name(r.tokens) in MANAGED_GRES
    )


def _refuse_global_lines(lines: Sequence[str]) -> None:
    for i, line in enumerate(lines):
        stripped = line.split("#", 1)[0].strip()
        if not stripped:
            continue
        tokens = stripped.split()
        if _key(tokens[0]) != "nodename" and _gres_name(tokens) in MANAGED_GRES:
            raise SlurmConfEditError(
                f"gres.conf line {i + 1} defines {_gres_name(tokens)} for every node (no NodeName=); "
                "give it a NodeName= so one node's GPUs can change alone"
            )


def set_node_gres_lines(gres_conf: str, node: str, new_lines: Sequence[str], note: str = "", *,
                        marker: bool = True) -> str:
    """``gres_conf`` with ``node``'s gpu/mps lines replaced by ``new_lines`` (which must name only ``node``).

    The new lines go where the node's first old line was (else at the end), after a marker comment (unless
    ``marker`` is false: putting a node's original lines back).
    """
    for line in new_lines:
        tokens = line.split()
        if not tokens or _key(tokens[0]) != "nodename" or tokens[0].split("=", 1)[1] != node or "\n" in line:
            raise SlurmConfEditError(f"gres.conf line {line!r} must start with NodeName={node}")
    lines = _logical_lines(gres_conf)
    _refuse_global_lines(lines)
    trailing_newline = bool(lines) and lines[-1] == ""
    if trailing_newline:
        lines = lines[:-1]
    records = {r.index: r for r in _node_records(lines, "gres.conf")}
    out: list[str] = []
    insert_at: int | None = None
    for i, line in enumerate(lines):
        if _is_marker_for(line, node):
            insert_at = len(out) if insert_at is None else insert_at
            continue
        rec = records.get(i)
        if rec is None or node not in rec.hosts or _gres_name(rec.tokens) not in MANAGED_GRES:
            out.append(line)
            continue
        others = [h for h in rec.hosts if h != node]
        if others:
            out.append(" ".join((f"NodeName={hostlist.compress(others)}", *rec.tokens[1:])))
        if insert_at is None:
            insert_at = len(out)
    head = [f"{MARKER} {node}" + (f" {note}" if note else "")] if marker and new_lines else []
    block = [*head, *new_lines]
    if insert_at is None:
        insert_at = len(out)
    out[insert_at:insert_at] = block
    return "\n".join(out) + ("\n" if trailing_newline or not out else "")


def gres_summary(value: str | None) -> dict[str, int]:
    """``gpu:3g.20gb:2,gpu:a100:1,mps:100`` -> ``{"gpu:3g.20gb": 2, "gpu:a100": 1, "mps": 100}``.

    Zero counts are dropped and typed ``mps`` counts are summed under ``mps`` (after a type change Slurm shows
    ``mps:3g.20gb:0,mps:a100:300``).
    """
    try:
        entries = parse_gres(value)
    except SlurmParseError as exc:
        raise SlurmConfEditError(str(exc)) from exc
    out: dict[str, int] = {}
    for g in entries:
        key = g.name if g.name == "mps" or g.type is None else f"{g.name}:{g.type}"
        if g.count:
            out[key] = out.get(key, 0) + g.count
    return dict(sorted(out.items()))
