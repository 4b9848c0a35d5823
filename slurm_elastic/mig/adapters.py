"""The MIG workflow's adapters: the imperative shell around the ports of :mod:`slurm_elastic.mig.ports`
(the agent's, :class:`~slurm_elastic.agent.mig_remote.HttpAgent`, lives beside the agent client).

* :class:`MigStoreJournal` - the store's action journal (kinds ``mig_workflow`` and ``mig_step``, job id 0);
* :class:`CliSlurm` - Slurm through :class:`~slurm_elastic.slurm.adapter.SlurmCli`;
* :class:`LocalFiles` - slurm.conf / gres.conf, written atomically (temp file + rename, mode kept);
* :class:`CommandDaemons` - the site's commands that stop/start slurmd and restart slurmctld
  (:class:`~slurm_elastic.slurm.daemons.SlurmDaemons`, its errors as workflow errors);
* :class:`SystemClock`, and :func:`fault_hook` - the documented, test-only fault injection.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from slurm_elastic.mig.config import Commands
from slurm_elastic.mig.errors import InjectedFault, WorkflowBusyError, WorkflowError
from slurm_elastic.mig.ports import JobOnNode, NodeStatus
from slurm_elastic.mig.steps import Record, RecordState
from slurm_elastic.slurm.adapter import SlurmCli
from slurm_elastic.slurm.daemons import DaemonCommandError, SlurmDaemons, daemon_runner
from slurm_elastic.slurm.runner import CommandRunner
from slurm_elastic.store import ActionKind, ActionRecord, DuplicateIntentError
from slurm_elastic.store.protocols import Journal

FAULT_ENV = "SLURM_ELASTIC_MIG_FAULT"
ACTIVE_JOB_STATES = frozenset({"RUNNING", "COMPLETING", "SUSPENDED", "CONFIGURING", "STOPPED", "SIGNALING"})


def _record(a: ActionRecord) -> Record:
    return Record(id=a.id, key=a.idempotency_key, kind=a.kind.value, state=RecordState(a.state.value),
                  params=a.params, message=a.message)


class MigStoreJournal:
    """:class:`~slurm_elastic.mig.ports.WorkflowJournal` over the store's journal."""

    def __init__(self, journal: Journal) -> None:
        self._j = journal

    def create(self, key: str, kind: str, params: Mapping[str, object], gpus: int) -> Record:
        try:
            action_id = self._j.record_intent(job_id=0, kind=ActionKind(kind), idempotency_key=key, params=params,
                                              nodes=1, gpus=gpus)
        except DuplicateIntentError as exc:  # a crashed run recorded it already: use that record
            return self.get(exc.existing_id)
        return self.get(action_id)

    def get(self, record_id: int) -> Record:
        return _record(self._j.get(record_id))

    def find(self, key: str) -> Record | None:
        found = self._j.find_by_idempotency_key(key)
        return None if found is None else _record(found)

    def start(self, record_id: int) -> Record:
        return _record(self._j.mark_in_progress(record_id))

    def finish(self, record_id: int, message: str) -> Record:
        return _record(self._j.mark_applied(record_id, message))

    def fail(self, record_id: int, message: str) -> Record:
        return _record(self._j.mark_failed(record_id, message, transient=False))

    def abort(self, record_id: int, message: str) -> Record:
        return _record(self._j.abort(record_id, message))

    def open_workflows(self) -> list[Record]:
        return [_record(a) for a in self._j.open_actions() if a.kind is ActionKind.MIG_WORKFLOW]

    def workflows(self, limit: int = 20) -> list[Record]:
        """The newest workflows, open or not (for ``mig workflows``)."""
        out = []
        for a in self._j.list_actions(limit=limit * 20):
            if a.kind is ActionKind.MIG_WORKFLOW:
                out.append(_record(a))
            if len(out) >= limit:
                break
        return out


class CliSlurm:
    """:class:`~slurm_elastic.mig.ports.SlurmPort` over the Slurm command-line tools."""

    def __init__(self, cli: SlurmCli | None = None) -> None:
        self.cli = cli or SlurmCli()

    def node_status(self, node: str) -> NodeStatus:
        for n in self.cli.nodes():
            if n.name == node:
                started = n.slurmd_start_time.timestamp() if n.slurmd_start_time is not None else None
                return NodeStatus(n.name, n.state, n.state_flags, n.reason, ",".join(str(g) for g in n.gres),
                                  started)
        raise WorkflowError(f"Slurm does not know node {node}")

    def jobs_on(self, node: str) -> tuple[JobOnNode, ...]:
        return tuple(JobOnNode(j.job_id, j.user, j.state) for j in self.cli.jobs()
                     if node in j.nodes and j.state in ACTIVE_JOB_STATES)

    def drain(self, node: str, reason: str) -> None:
        self.cli.drain(node, reason)

    def resume(self, node: str) -> None:
        self.cli.resume(node)

    def reconfigure(self) -> None:
        self.cli.reconfigure()


def node_address(node: str, cli: SlurmCli | None = None) -> str | None:
    """The node's NodeAddr as Slurm reports it (None: Slurm does not know the node or gives no address)."""
    for n in (cli or SlurmCli()).nodes():
        if n.name == node:
            return n.address
    return None


class LocalFiles:
    """Config files on this host. Writes are atomic: a reader sees the old or the new file, never half."""

    def read(self, path: str) -> str:
        try:
            return Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise WorkflowError(f"cannot read {path}: {exc.strerror or exc}") from exc

    def write(self, path: str, text: str) -> None:
        target = Path(path)
        try:
            st = target.stat()
            fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    f.write(text)
                    f.flush()
                    os.fsync(f.fileno())
                os.chmod(tmp, st.st_mode & 0o7777)
                with contextlib.suppress(PermissionError):
                    os.chown(tmp, st.st_uid, st.st_gid)
                os.replace(tmp, target)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        except OSError as exc:
            raise WorkflowError(f"cannot write {path}: {exc.strerror or exc}") from exc


class CommandDaemons:
    """:class:`~slurm_elastic.mig.ports.DaemonsPort` over the configured commands (argument lists, ``{node}``
    replaced, a timeout each, never a shell); a command's failure is the step's :class:`WorkflowError`."""

    def __init__(self, commands: Commands, env: Mapping[str, str] | None = None,
                 runner: CommandRunner = daemon_runner) -> None:
        self.daemons = SlurmDaemons(commands, env, runner)

    def stop_slurmd(self, node: str) -> None:
        try:
            self.daemons.stop_slurmd(node)
        except DaemonCommandError as exc:
            raise WorkflowError(str(exc)) from exc

    def start_slurmd(self, node: str) -> None:
        try:
            self.daemons.start_slurmd(node)
        except DaemonCommandError as exc:
            raise WorkflowError(str(exc)) from exc

    def restart_slurmctld(self) -> None:
        try:
            self.daemons.restart_slurmctld()
        except DaemonCommandError as exc:
            raise WorkflowError(str(exc)) from exc


class FileNodeLock:
    """One workflow per node on this host: ``flock`` on ``<dir>/<node>.lock``. The kernel drops the lock when the
    process dies, so a crashed workflow never blocks its resume. (Processes on other hosts are not excluded:
    run MIG workflows from one host, the controller's.)"""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)

    @contextlib.contextmanager
    def hold(self, node: str) -> Iterator[None]:
        if not node or "/" in node or node.startswith("."):
            raise WorkflowError(f"bad node name {node!r}")
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.directory / f"{node}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise WorkflowError(f"cannot open the lock of {node} in {self.directory}: {exc.strerror}") from exc
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise WorkflowBusyError(
                    f"another MIG workflow process is working on {node} right now (lock {self.directory})"
                ) from None
            yield
        finally:
            os.close(fd)


class SystemClock:
    def now(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


def fault_hook(spec: str | None, kill: Callable[[], None] | None = None) -> Callable[[str], None]:
    """TEST ONLY. ``SLURM_ELASTIC_MIG_FAULT``: comma-separated ``kill-before:<step>``, ``kill-during:<step>``
    (the step's effect done, not yet journaled as applied), ``kill-after:<step>`` (SIGKILL of this process at
    that point: a controller that dies mid-workflow) and ``fail:<step>`` (the step fails with InjectedFault)."""
    rules = [r.strip() for r in (spec or "").split(",") if r.strip()]
    do_kill = kill or (lambda: os.kill(os.getpid(), signal.SIGKILL))

    def hook(point: str) -> None:
        where, _, step = point.partition(":")
        for rule in rules:
            action, _, target = rule.partition(":")
            if target != step:
                continue
            if action == f"kill-{where}":
                do_kill()
            if action == "fail" and where == "before":
                raise InjectedFault(f"injected failure at {step} ({FAULT_ENV})")

    return hook
