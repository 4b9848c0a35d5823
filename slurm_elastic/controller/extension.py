"""Extension jobs: how the controller grows a GPU job that Slurm cannot expand in place.

An extension job is the leader's own batch script, submitted as the leader's owner with the same account,
partition, QOS and GRES per node, pinned to the nodes the policy chose, with role variables that make its
workers join the leader's rendezvous. It is recognisable in ``squeue`` by its name ``elastic-ext-<leader>`` and
carries a tag in its comment: ``slurm-elastic:ext parent=<leader> key=<idempotency key>``.

The comment alone proves nothing (a user can write any comment on their own job). A job counts as an extension
of a leader only if it belongs to the same user as the leader AND its idempotency key is one the controller
journaled for that leader (:func:`trusted_extensions`). So alice cannot make her job pass as an extension of
bob's, and a forged tag on one's own job only gets it ignored.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from slurm_elastic.directives.spec import ElasticSpec
from slurm_elastic.prewarm import ENV_COMMAND as ENV_PREWARM
from slurm_elastic.prewarm import ENV_TIMEOUT as ENV_PREWARM_TIMEOUT
from slurm_elastic.slurm import hostlist
from slurm_elastic.slurm.model import GresCount, Job

TAG = "slurm-elastic:ext"
RDZV_PORT_BASE = 29500
_TAG_RE = re.compile(r"slurm-elastic:ext parent=(\d+) key=([A-Za-z0-9:._-]{1,128})")


@dataclass(frozen=True)
class ExtensionTag:
    parent: int
    key: str

    def render(self) -> str:
        return f"{TAG} parent={self.parent} key={self.key}"


def parse_tag(comment: str) -> ExtensionTag | None:
    m = _TAG_RE.search(comment or "")
    return ExtensionTag(int(m.group(1)), m.group(2)) if m else None


def extension_name(parent: int) -> str:
    return f"elastic-ext-{parent}"


def rendezvous_endpoint(leader: Job, node_address: str | None) -> str:
    """``host:port`` of the leader's rendezvous: its batch host, port 29500 + id % 1000 (as the templates do)."""
    host = node_address or leader.batch_host or ""
    return f"{host}:{RDZV_PORT_BASE + leader.job_id % 1000}"


_JOB_PATTERNS = {"j": "job_id", "A": "job_id", "x": "name", "u": "user"}


def leader_file(pattern: str, leader: Job) -> str:
    """The leader's ``--output``/``--error`` pattern with its per-job fields (%j, %A, %x, %u) filled in with the
    leader's values, so that the extension appends to the leader's own file (``slurm-%j.out`` would otherwise
    name a new file per extension). Per-node and per-task fields (%N, %n, %t, ...) are left to Slurm."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "%" and i + 1 < len(pattern):
            j = i + 1
            while j < len(pattern) and pattern[j].isdigit():  # %5j: zero-padded width
                j += 1
            if j < len(pattern) and pattern[j] in _JOB_PATTERNS:
                value = str(getattr(leader, _JOB_PATTERNS[pattern[j]]))
                width = int(pattern[i + 1:j]) if j > i + 1 else 0
                out.append(value.zfill(width) if pattern[j] in "jA" else value)
                i = j + 1
                continue
            if j < len(pattern) and pattern[j] == "%" and j == i + 1:
                out.append("%%")
                i = j + 1
                continue
        out.append(c)
        i += 1
    return "".join(out)


@dataclass(frozen=True)
class ExtensionRequest:
    """Everything needed to submit one extension job (no I/O here)."""

    user: str
    sbatch_args: tuple[str, ...]
    env: Mapping[str, str]
    tag: ExtensionTag


def build_request(
    leader: Job,
    nodes: Iterable[str],
    key: str,
    now: datetime,
    *,
    rendezvous: str,
    base_env: Mapping[str, str] | None = None,
    qos: str = "",
    notice_grace_s: float | None = None,
    prewarm: tuple[str, int] | None = None,
    gres: Sequence[GresCount] | None = None,
    partition: str | None = None,
) -> ExtensionRequest:
    """sbatch arguments and environment for an extension job of ``leader`` on exactly ``nodes``.

    ``qos``: the site's QOS for extension jobs (``[extension] qos``, e.g. a preemptible scavenger QOS); empty
    means the leader's own QOS. The leader itself never runs in it. ``notice_grace_s``: how long the extension's
    launcher waits for the running workers to acknowledge their checkpoint before its own workers join.
    ``prewarm``: the job's ``--prewarm`` command and timeout (s), which the launcher runs on each new node first
    (slurm_elastic/prewarm.py). ``gres``: the GRES per node the grow plan gives the extension when not the
    leader's: a GPU-granular grow (gpu_granular_growth) asks ``gpu:k`` on a node other jobs share.
    ``partition``: the grow plan's, one of those the leader was submitted to (default: the leader's own)."""
    node_list = list(nodes)
    if not node_list:
        raise ValueError("an extension job needs at least one node")
    tag = ExtensionTag(parent=leader.job_id, key=key)
    args = [
        f"--job-name={extension_name(leader.job_id)}",
        f"--partition={partition or leader.partition}",
        f"--nodes={len(node_list)}",
        f"--nodelist={hostlist.compress(node_list)}",
        f"--comment={tag.render()}",
        "--no-kill",
        "--no-requeue",
    ]
    if leader.account:
        args.append(f"--account={leader.account}")
    if qos or leader.qos:
        args.append(f"--qos={qos or leader.qos}")
    per_node = [str(g) for g in (leader.gres_per_node if gres is None else gres)]
    if per_node:
        args.append(f"--gres={','.join(per_node)}")
    if leader.working_dir:
        args.append(f"--chdir={leader.working_dir}")
    # Write where the leader writes (an output the owner cannot open fails the job at once); append, so that a
    # pattern without %j never truncates the leader's own file.
    if leader.standard_output:
        args.append(f"--output={leader_file(leader.standard_output, leader)}")
    if leader.standard_error and leader.standard_error != leader.standard_output:
        args.append(f"--error={leader_file(leader.standard_error, leader)}")
    if leader.standard_output or leader.standard_error:
        args.append("--open-mode=append")
    remaining = leader.remaining_seconds(now)
    if remaining is not None:
        # Never outlive the leader: at most its remaining time, whole minutes, at least one.
        args.append(f"--time={max(1, int(remaining // 60))}")
    env = dict(base_env or {})
    env.update(
        SLURM_ELASTIC_ROLE="extension",
        SLURM_ELASTIC_PARENT=str(leader.job_id),
        SLURM_ELASTIC_RDZV_ENDPOINT=rendezvous,
    )
    if notice_grace_s is not None:
        env["SLURM_ELASTIC_NOTICE_GRACE"] = f"{notice_grace_s:g}"
    if prewarm is not None:
        env[ENV_PREWARM], env[ENV_PREWARM_TIMEOUT] = prewarm[0], str(int(prewarm[1]))
    return ExtensionRequest(user=leader.user, sbatch_args=tuple(args), env=env, tag=tag)


def prewarm_of(spec: ElasticSpec) -> tuple[str, int] | None:
    """The leader's ``--prewarm`` command and timeout from its spec as controller/units.py read it (the plugin's
    admin_comment, else its script: parsed once per job there, never again for a grow); None when it has none."""
    if spec.prewarm is None:
        return None
    return spec.prewarm, spec.prewarm_timeout_s


def trusted_extensions(
    jobs: Iterable[Job], leaders: Mapping[int, Job], is_known_key: Callable[[int, str], bool]
) -> dict[int, list[Job]]:
    """Extension jobs per leader id, keeping only those that pass the ownership and journal checks."""
    out: dict[int, list[Job]] = {}
    for job in jobs:
        tag = parse_tag(job.comment)
        if tag is None:
            continue
        leader = leaders.get(tag.parent)
        if leader is None or leader.user != job.user or not is_known_key(tag.parent, tag.key):
            continue
        out.setdefault(tag.parent, []).append(job)
    return out


def orphaned_extensions(jobs: Iterable[Job], live_leader_ids: set[int],
                        is_known_key: Callable[[int, str], bool]) -> list[Job]:
    """Our extension jobs (journaled key) whose leader is no longer running: they must be cancelled."""
    out = []
    for job in jobs:
        tag = parse_tag(job.comment)
        if tag and tag.parent not in live_leader_ids and is_known_key(tag.parent, tag.key) \
                and job.state in {"PENDING", "RUNNING", "CONFIGURING", "SUSPENDED"}:
            out.append(job)
    return out
