"""The Slurm adapter: the one place in slurm-elastic that talks to Slurm.

Reads come from ``squeue --json``, ``scontrol show nodes --json`` (23.02+; ``sinfo --json`` on 22.05, which has
no JSON in scontrol and whose sinfo still lists nodes one by one) and ``scontrol -o show partition``; jobs that
have left squeue (finished jobs are not in ``squeue --all`` from 23.02 on) are read from ``sacct``. Writes go through
``scontrol``, ``scancel`` and ``sbatch``. Facts that shaped the write paths (measured on Slurm 22.05):

* Shrink: ``scontrol update JobId=<raw id> NodeList=<nodes to keep>``. Het components must be addressed by their
  raw job id: ``JobId=8+1`` is refused ("Invalid job ID") while ``JobId=9`` works. Slurm keeps the batch host
  only if it is in the list, so we refuse any request that would drop it.
* Grow: Slurm refuses to expand a job with GRES in place, so growth is done by extension jobs submitted as the
  job's owner (see :meth:`SlurmCli.submit_as`).
* Submitting as another user uses ``runuser -u USER -- sbatch``: the request is authenticated by munge as that
  user, so Slurm applies the user's own associations, limits and QOS exactly as if the user had typed it, and it
  works on every Slurm release (``sbatch --uid`` is root-only and not portable across releases).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Protocol, TypeVar, runtime_checkable

from slurm_elastic.slurm import hostlist
from slurm_elastic.slurm.accounting import (
    ASSOC_FIELDS,
    QOS_FIELDS,
    REPORT_FIELDS,
    SACCT_FIELDS,
    SSHARE_FIELDS,
    GpuLimits,
    account_weights,
    merge_exports,
    parse_assoc_limits,
    parse_cluster_name,
    parse_qos_limits,
    parse_resume_timeout,
    parse_sacct_states,
    parse_sshare,
)
from slurm_elastic.slurm.decode import JobMemo, read_nodes, read_squeue
from slurm_elastic.slurm.errors import SlurmCommandError, SlurmError, SlurmParseError
from slurm_elastic.slurm.model import ClusterSnapshot, Job, Node, Partition
from slurm_elastic.slurm.openapi import ReplyMeta, gc_paused
from slurm_elastic.slurm.runner import SlurmCommands
from slurm_elastic.slurm.scontrol_text import parse_partitions
from slurm_elastic.slurm.topology import parse_leaf_switches

log = logging.getLogger(__name__)
R = TypeVar("R")


class ResizeRefusedError(SlurmError):
    """A resize request that we refuse before asking Slurm (it would break an invariant)."""


class SlurmReader(Protocol):
    """Read side: one consistent-enough snapshot of jobs, nodes and partitions."""

    def snapshot(self) -> ClusterSnapshot: ...


@runtime_checkable
class FinalStateReader(Protocol):
    """How jobs that have left squeue ended (the accounting database); optional: a site may run no slurmdbd."""

    def final_states(self, job_ids: Sequence[int]) -> dict[int, str]: ...


@runtime_checkable
class PowerConfigReader(Protocol):
    """Slurm's power-saving settings the policy bounds resume estimates with; optional."""

    def resume_timeout_s(self) -> float | None: ...


@runtime_checkable
class Molder(Protocol):
    """Reshapes a waiting job to start on fewer nodes (moldable start); optional, checked at run time."""

    def mold(self, job: Job, min_nodes: int, max_nodes: int, time_limit_min: int | None) -> None: ...


class SlurmControl(SlurmReader, Protocol):
    """What the controller (cycle, actuator, reconcile) does to Slurm; :class:`SlurmCli` is the real one.

    Optional reads are separate Protocols checked at run time: :class:`FinalStateReader` (sacct) and
    ``controller.shares.AccountingReader`` (sshare, sacctmgr); a backend without them still drives the controller.
    """

    def batch_script(self, job_id: int) -> str: ...
    def shrink(self, job: Job, keep_nodes: Sequence[str]) -> None: ...
    def extend_time_limit(self, job: Job, add_min: int) -> int: ...
    def shorten_time_limit(self, job: Job, sub_min: int) -> int: ...
    def signal(self, job_id: int, signal: str, *, batch_only: bool = False) -> None: ...
    def cancel(self, job_id: int) -> None: ...
    def submit_as(
        self, user: str, script: str, sbatch_args: Sequence[str], env: Mapping[str, str] | None = None
    ) -> int: ...


def _local(t: datetime) -> str:
    """An aware time as sacct's -S/-E read it: the host's local time, to the second."""
    return t.astimezone().strftime("%Y-%m-%dT%H:%M:%S")


def _check_value(name: str, value: str) -> str:
    """scontrol reads each argv element as one Key=Value; a newline would end up in Slurm's state verbatim."""
    if "\n" in value or "\r" in value or "\x00" in value:
        raise ResizeRefusedError(f"{name} must be a single line without NUL bytes")
    return value


class SlurmCli:
    """:class:`SlurmControl` over Slurm's command-line tools."""

    #: How long a topology read is reused: topology.conf changes only with a ``scontrol reconfigure``.
    TOPOLOGY_TTL = timedelta(minutes=5)

    def __init__(self, commands: SlurmCommands | None = None, *, topology: bool = False) -> None:
        """``topology``: snapshots carry each node's leaf switch (``scontrol show topology``, re-read every
        :attr:`TOPOLOGY_TTL`); off, no snapshot asks Slurm for it."""
        self.cmd = commands or SlurmCommands()
        self._topology = topology
        self._leaf_switch: tuple[datetime, Mapping[str, str]] | None = None  # (read at, node -> leaf switch)
        self._cluster: tuple[str | None] | None = None  # ClusterName, once read
        self._resume_timeout: tuple[float | None] | None = None  # ResumeTimeout, once read
        self._scontrol_json: bool | None = None  # does scontrol take --json (23.02+)? None: not tried yet
        self._jobs_seen = JobMemo()  # the last squeue's records: unchanged jobs are not built again

    # --- read ------------------------------------------------------------------------------------------
    def _read(self, argv: Sequence[str], read: Callable[[str], R]) -> R:
        """A JSON reply read by ``read`` (slurm/decode.py: typed, straight from the text into records)."""
        out = self.cmd.run(argv).stdout
        try:
            return read(out)
        except json.JSONDecodeError as e:
            raise SlurmParseError(f"{argv[0]} returned invalid JSON ({e.msg} at char {e.pos})") from e
        except RecursionError:  # nested too deeply for the decoder: typed, so the cycle carries on
            raise SlurmParseError(f"{argv[0]} returned JSON nested too deeply") from None

    def _read_squeue(self, text: str) -> tuple[ReplyMeta, tuple[Job, ...]]:
        return read_squeue(text, self._jobs_seen)

    def jobs(self) -> tuple[Job, ...]:
        with gc_paused():
            return self._read(["squeue", "--all", "--json"], self._read_squeue)[1]

    def nodes(self) -> tuple[Node, ...]:
        with gc_paused():
            return self._nodes()

    def _nodes(self) -> tuple[Node, ...]:
        """One Node per node: ``scontrol show nodes --json`` where scontrol has JSON (23.02+); there ``sinfo
        --json`` groups nodes (CPUs summed, the first node's port, no address). 22.05: ``sinfo --json``."""
        if self._scontrol_json is not False:
            try:
                nodes = self._read(["scontrol", "show", "nodes", "--json"], read_nodes)[1]
            except SlurmCommandError as e:
                if self._scontrol_json is None and "unrecognized option" in e.message.lower():
                    self._scontrol_json = False  # 22.05: "scontrol: unrecognized option '--json'"
                else:
                    raise
            else:
                self._scontrol_json = True
                return nodes
        return self._read(["sinfo", "--json"], read_nodes)[1]

    def partitions(self) -> tuple[Partition, ...]:
        return parse_partitions(self.cmd.run(["scontrol", "-o", "show", "partition"]).stdout)

    def snapshot(self) -> ClusterSnapshot:
        with gc_paused():  # the cycle's largest allocation (openapi.gc_paused says why)
            meta, jobs = self._read(["squeue", "--all", "--json"], self._read_squeue)
            nodes = self._nodes()
        return ClusterSnapshot(
            taken_at=datetime.now(tz=UTC),
            jobs=jobs,
            nodes=nodes,
            partitions=self.partitions(),
            slurm_version=meta.slurm_release,
            data_parser=meta.data_parser,
            leaf_switch=self.leaf_switches() if self._topology else {},
        )

    def leaf_switches(self) -> Mapping[str, str]:
        """Node -> leaf switch from ``scontrol show topology`` (slurm/topology.py); empty without a topology
        plugin. Reused for :attr:`TOPOLOGY_TTL`."""
        now = datetime.now(tz=UTC)
        if self._leaf_switch is None or now - self._leaf_switch[0] >= self.TOPOLOGY_TTL:
            last = self._leaf_switch[1] if self._leaf_switch is not None else {}
            try:
                leaves = parse_leaf_switches(self.cmd.run(["scontrol", "show", "topology"]).stdout)
            except SlurmError as e:  # a preference only: the cycle goes on with the last topology read
                log.warning("reading Slurm's topology failed, keeping the last one read: %s", e)
                leaves = last
            self._leaf_switch = (now, leaves)
        return self._leaf_switch[1]

    def job(self, job_id: int) -> Job | None:
        """One job, or None when squeue no longer lists it (finished jobs: :meth:`final_states`)."""
        for j in self.jobs():
            if j.job_id == job_id:
                return j
        return None

    def batch_script(self, job_id: int) -> str:
        """The job's batch script text (``scontrol write batch_script ID -``)."""
        return self.cmd.run(["scontrol", "write", "batch_script", str(int(job_id)), "-"]).stdout

    # --- accounting: fair-share weights and GPU limits (slurm_elastic/slurm/accounting.py) ----------------
    #: These reads feed a cache that keeps its last good values, so they are tried once, with a short timeout:
    #: a cycle must not wait out retries while slurmdbd is down.
    ACCOUNTING_TIMEOUT_S = 10.0

    def _accounting(self, argv: Sequence[str]) -> str:
        return self.cmd.run(argv, timeout=self.ACCOUNTING_TIMEOUT_S, retry_transient=False).stdout

    def account_shares(self) -> dict[str, float]:
        """Per account: its effective normalized shares from ``sshare`` (the fair-share weight)."""
        return account_weights(parse_sshare(self._accounting(["sshare", "-P", "-o", ",".join(SSHARE_FIELDS)])))

    def cluster_name(self) -> str | None:
        """This cluster's ``ClusterName`` (read once: it never changes while slurmctld runs)."""
        if self._cluster is None:
            self._cluster = (parse_cluster_name(self._accounting(["scontrol", "show", "config"])),)
        return self._cluster[0]

    def resume_timeout_s(self) -> float | None:
        """Slurm's ``ResumeTimeout`` (power saving), read once: it bounds a powered-down node's resume."""
        if self._resume_timeout is None:
            self._resume_timeout = (parse_resume_timeout(self._accounting(["scontrol", "show", "config"])),)
        return self._resume_timeout[0]

    def gpu_limits(self) -> GpuLimits:
        """GrpTRES ``gres/gpu`` limits of this cluster's associations, and the QOSes' GPU limits."""
        assoc = self._accounting(["sacctmgr", "-n", "-P", "show", "assoc", f"format={','.join(ASSOC_FIELDS)}"])
        qos = self._accounting(["sacctmgr", "-n", "-P", "show", "qos", f"format={','.join(QOS_FIELDS)}"])
        return GpuLimits(assocs=parse_assoc_limits(assoc, self.cluster_name()), qos=parse_qos_limits(qos))

    def final_states(self, job_ids: Sequence[int]) -> dict[int, str]:
        """How jobs that left squeue ended, from the accounting database (``sacct``); a job sacct does not
        know is absent. With ``-j``, sacct looks at any start time, not only today's."""
        ids = sorted(set(job_ids))
        if not ids:
            return {}
        return parse_sacct_states(self._accounting(
            ["sacct", "-n", "-P", "-X", "-o", ",".join(SACCT_FIELDS), "-j", ",".join(str(i) for i in ids)]))

    #: ``sacct`` reads of a reporting window: one per day, each allowed this long (a busy day of a large site
    #: takes seconds; slurmdbd may be slow while it rolls up usage).
    EXPORT_CHUNK = timedelta(days=1)
    EXPORT_TIMEOUT_S = 300.0

    def accounting_export(self, start: datetime, end: datetime, *, user: str | None = None,
                          on_chunk: Callable[[int, int], None] | None = None) -> str:
        """Job records (``sacct -X -P -o REPORT_FIELDS``) of jobs that were pending or running between ``start``
        and ``end``, read one day at a time and merged (:func:`~slurm_elastic.slurm.accounting.merge_exports`);
        every user's (``-a``) or ``user``'s only. ``on_chunk(done, total)`` after each day. sacct is given the
        host's local time, which is what it prints."""
        if end <= start:
            raise SlurmError(f"accounting window ends ({end.isoformat()}) before it starts ({start.isoformat()})")
        if user is not None and (not user or user.startswith("-") or any(c.isspace() for c in user)):
            raise SlurmError(f"invalid user name {user!r}")
        bounds: list[datetime] = [start]
        while bounds[-1] + self.EXPORT_CHUNK < end:
            bounds.append(bounds[-1] + self.EXPORT_CHUNK)
        bounds.append(end)
        who = ["-a"] if user is None else ["-u", user]
        chunks: list[str] = []
        total = len(bounds) - 1
        for i, (lo, hi) in enumerate(zip(bounds, bounds[1:], strict=False)):
            chunks.append(self.cmd.run(
                ["sacct", "-X", "-P", *who, "-o", ",".join(REPORT_FIELDS), "-S", _local(lo), "-E", _local(hi)],
                timeout=self.EXPORT_TIMEOUT_S).stdout)
            if on_chunk is not None:
                on_chunk(i + 1, total)
        return merge_exports(chunks)

    # --- act -------------------------------------------------------------------------------------------
    def shrink(self, job: Job, keep_nodes: Sequence[str]) -> None:
        """Keep exactly ``keep_nodes`` of a running job (or het component), releasing the others."""
        keep = list(dict.fromkeys(keep_nodes))
        if not job.is_running:
            raise ResizeRefusedError(f"job {job.display_id} is {job.state}, not RUNNING")
        if not keep:
            raise ResizeRefusedError(f"job {job.display_id}: refusing to shrink to zero nodes")
        unknown = [n for n in keep if n not in job.nodes]
        if unknown:
            raise ResizeRefusedError(f"job {job.display_id}: {','.join(unknown)} not in its nodes {job.nodes}")
        if job.batch_host and job.batch_host not in keep:
            raise ResizeRefusedError(f"job {job.display_id}: the batch host {job.batch_host} must be kept")
        if len(keep) >= len(job.nodes):
            raise ResizeRefusedError(f"job {job.display_id}: {len(keep)} nodes is not a shrink")
        # The raw id, never "leader+offset": scontrol refuses JobId=8+1 for updates (measured on 22.05).
        self.cmd.run(["scontrol", "update", f"JobId={job.job_id}", f"NodeList={hostlist.compress(keep)}"])

    def extend_time_limit(self, job: Job, add_min: int) -> int:
        """Raise a job's time limit by ``add_min`` minutes (after a shrink); returns the new limit in minutes.
        Needs root or SlurmUser (users may only lower limits)."""
        if add_min < 1:
            raise ResizeRefusedError(f"job {job.display_id}: a time limit extension must be at least 1 minute")
        return self._change_time_limit(job, add_min, "extend")

    def shorten_time_limit(self, job: Job, sub_min: int) -> int:
        """Lower a job's time limit by ``sub_min`` minutes (a grow giving back what shrinks added); returns the
        new limit, never below 1 minute."""
        if sub_min < 1:
            raise ResizeRefusedError(f"job {job.display_id}: a time limit reduction must be at least 1 minute")
        return self._change_time_limit(job, -sub_min, "shorten")

    def _change_time_limit(self, job: Job, delta_min: int, verb: str) -> int:
        """Set the absolute value ``TimeLimit=<limit in the snapshot + delta_min>`` rather than scontrol's
        ``TimeLimit=+N`` (also accepted by 22.05): a transient failure is retried, and a retried increment whose
        first attempt did reach slurmctld would apply twice."""
        if job.time_limit_min is None:
            raise ResizeRefusedError(f"job {job.display_id} has no time limit to {verb}")
        new = int(job.time_limit_min) + int(delta_min)
        if new < 1:
            raise ResizeRefusedError(f"job {job.display_id}: refusing to lower its time limit to {new} min")
        # The raw id, as for shrink: a het component is addressed by its own job id.
        self.cmd.run(["scontrol", "update", f"JobId={int(job.job_id)}", f"TimeLimit={new}"])
        return new

    def mold(self, job: Job, min_nodes: int, max_nodes: int, time_limit_min: int | None) -> None:
        """Let a PENDING job start on ``min_nodes`` up to ``max_nodes`` nodes (``NumNodes=min-max``: Slurm starts
        it on fewer nodes once they are free, docs/slurm-facts.md) and, when given, set its time limit in the
        same update. Absolute values, so a retried or repeated update changes nothing more."""
        if not job.is_pending:
            raise ResizeRefusedError(f"job {job.display_id} is {job.state}, not PENDING")
        if not 1 <= min_nodes <= max_nodes:
            raise ResizeRefusedError(f"job {job.display_id}: invalid node range {min_nodes}-{max_nodes}")
        fields = [f"NumNodes={int(min_nodes)}-{int(max_nodes)}"]
        if time_limit_min is not None:
            if time_limit_min < 1:
                raise ResizeRefusedError(f"job {job.display_id}: time limit must be at least 1 minute")
            fields.append(f"TimeLimit={int(time_limit_min)}")
        self.cmd.run(["scontrol", "update", f"JobId={int(job.job_id)}", *fields])

    def signal(self, job_id: int, signal: str, *, batch_only: bool = False) -> None:
        """Send ``signal`` to the job's batch shell and all its steps (``--full``) or the batch shell only."""
        scope = "--batch" if batch_only else "--full"
        self.cmd.run(["scancel", f"--signal={signal}", scope, str(int(job_id))])

    def cancel(self, job_id: int) -> None:
        self.cmd.run(["scancel", str(int(job_id))])

    def submit_as(
        self, user: str, script: str, sbatch_args: Sequence[str], env: Mapping[str, str] | None = None
    ) -> int:
        """Submit ``script`` (text, given on stdin) as ``user``; returns the new job id."""
        if not user or user.startswith("-") or any(c.isspace() for c in user):
            raise ResizeRefusedError(f"invalid user name {user!r}")
        # runuser lives in sbin, which a job environment's PATH usually lacks: resolve it here.
        runuser = shutil.which("runuser", path=f"{os.environ.get('PATH', os.defpath)}:/usr/sbin:/sbin") or "runuser"
        argv = [runuser, "-u", user, "--", "sbatch", "--parsable", *sbatch_args]
        out = self.cmd.run(argv, input_text=script, env=env, retry_transient=False).stdout.strip()
        try:
            return int(out.split(";", 1)[0])
        except ValueError as e:
            raise SlurmCommandError(argv, 0, f"unexpected sbatch reply {out!r}") from e

    def update_job(
        self,
        job_id: int,
        *,
        comment: str | None = None,
        admin_comment: str | None = None,
        time_limit_min: int | None = None,
    ) -> None:
        fields: list[str] = []
        if comment is not None:
            fields.append(f"Comment={_check_value('comment', comment)}")
        if admin_comment is not None:
            fields.append(f"AdminComment={_check_value('admin_comment', admin_comment)}")
        if time_limit_min is not None:
            if time_limit_min < 1:
                raise ResizeRefusedError("time limit must be at least 1 minute")
            fields.append(f"TimeLimit={int(time_limit_min)}")
        if not fields:
            return
        self.cmd.run(["scontrol", "update", f"JobId={int(job_id)}", *fields])

    def drain(self, node: str, reason: str) -> None:
        self.cmd.run(["scontrol", "update", f"NodeName={node}", "State=DRAIN",
                      f"Reason={_check_value('reason', reason)}"])

    def resume(self, node: str) -> None:
        self.cmd.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"])

    def reconfigure(self) -> None:
        self.cmd.run(["scontrol", "reconfigure"])
