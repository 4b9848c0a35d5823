"""The adapters that gather what the checks judge: Slurm's commands (argument lists, a timeout, no retries: a
doctor reports, it does not wait), the files ``scontrol show config`` names, MUNGE, the state DB (a write that
is rolled back) and the agents (one signed request each, timed against the answer's ``Date``)."""

from __future__ import annotations

import asyncio
import glob
import os
import pwd
import stat
import time
from collections.abc import Mapping, Sequence
from email.utils import parsedate_to_datetime
from pathlib import Path

import aiohttp
from sqlalchemy import update
from sqlalchemy.exc import SQLAlchemyError

from slurm_elastic.doctor.model import value
from slurm_elastic.doctor.site_checks import AgentFacts, DbFacts, Identity
from slurm_elastic.doctor.slurm_checks import HookFile
from slurm_elastic.errors import SlurmElasticError
from slurm_elastic.slurm.errors import SlurmError
from slurm_elastic.slurm.runner import CommandRunner, subprocess_runner
from slurm_elastic.store.engine import make_engine, parse_url, redacted
from slurm_elastic.store.migrations import read_version
from slurm_elastic.store.models import check_prefix, models_for

TIMEOUT_S = 20.0
#: A short accounting query: any answer (even no job) proves slurmdbd and its database answer.
SACCT_ARGV = ("sacct", "-n", "-X", "-P", "-o", "JobID", "-S", "now-60")


class ProbeCommands:
    """Slurm's client commands through a :class:`CommandRunner` (recorded replies in the unit tests)."""

    def __init__(self, runner: CommandRunner = subprocess_runner, env: Mapping[str, str] | None = None) -> None:
        self.runner, self._env = runner, env

    def run(self, argv: Sequence[str]) -> tuple[int, str, str]:
        try:
            r = self.runner(argv, timeout=TIMEOUT_S, input_text=None, env=self._env)
        except SlurmError as e:
            return 127, "", str(e)
        return r.returncode, r.stdout, r.stderr

    def error_of(self, argv: Sequence[str]) -> str | None:
        rc, out, err = self.run(argv)
        return None if rc == 0 else (err.strip() or out.strip() or f"exit status {rc}").splitlines()[-1]


def read_text(path: str, limit: int = 1 << 20) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode(errors="replace")
    except OSError:
        return None


def lua_path(config: Mapping[str, str]) -> str:
    """job_submit/lua reads job_submit.lua beside slurm.conf."""
    conf = value(config, "SLURM_CONF") or os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf")
    return str(Path(conf).parent / "job_submit.lua")


def hook_files(config: Mapping[str, str], key: str) -> list[HookFile]:
    """The files a Prolog/Epilog setting names on this host (comma-separated paths, globs allowed)."""
    out: list[HookFile] = []
    for pattern in (p.strip() for p in value(config, key).split(",") if p.strip()):
        paths = sorted(glob.glob(pattern)) or [pattern]
        for p in paths:
            try:
                st = os.stat(p)
            except OSError:
                out.append(HookFile(p, exists=False))
                continue
            body = read_text(p, 1 << 16) or ""
            out.append(HookFile(p, exists=True, mode=st.st_mode, ours="slurm-elastic" in body))
    return out


def munge_error(socket: str) -> str | None:
    """None when a credential made through ``socket`` decodes there; else why not."""
    from slurm_elastic.agent.munge import Munge, MungeError

    try:
        m = Munge(socket)
        m.decode(m.encode(b"slurm-elastic doctor", 60))
    except MungeError as e:
        return str(e)
    return None


def identity(cmd: ProbeCommands) -> Identity:
    uid = os.geteuid()
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    level = None
    if uid != 0:
        rc, out, _ = cmd.run(["sacctmgr", "-n", "-P", "show", "user", user, "format=AdminLevel"])
        level = out.strip().splitlines()[0] if rc == 0 and out.strip() else "None"
    return Identity(user, uid, level)


def _file_note(path: Path) -> str:
    """`` (file /x/state.db mode 0644 owner root)`` for the file, else its nearest existing directory."""
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        st = p.stat()
    except OSError:
        return ""
    try:
        owner = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        owner = str(st.st_uid)
    kind = "directory" if stat.S_ISDIR(st.st_mode) else "file"
    return f" ({kind} {p} mode {st.st_mode & 0o7777:04o} owner {owner})"


def database(url: str, table_prefix: str = "") -> DbFacts:
    """The schema version and a write that is rolled back. A SQLite file that does not exist yet is not created:
    its directory must be writable for the controller to create it."""
    try:
        u = parse_url(url)
    except SlurmElasticError as e:
        return DbFacts(url, error=str(e))
    where = redacted(u)
    sqlite_file = u.get_backend_name() == "sqlite" and bool(u.database) and not str(u.database).startswith(":")
    if sqlite_file and not u.query.get("uri"):  # a file: URI (mode=ro, ...) opens as it says
        path = Path(str(u.database))
        if not path.exists():
            parent = path.parent
            if not parent.is_dir():
                return DbFacts(where, error=f"directory {parent} does not exist", file_note=_file_note(parent))
            if not os.access(parent, os.W_OK):
                return DbFacts(where, write_error=f"cannot create the file in {parent}",
                               file_note=_file_note(parent))
            return DbFacts(where)
    models = models_for(check_prefix(table_prefix))
    try:
        engine = make_engine(url, timeout_s=10)
    except SlurmElasticError as e:
        return DbFacts(where, error=str(e))
    note = _file_note(Path(str(u.database).removeprefix("file:"))) if sqlite_file else ""
    try:
        with engine.connect() as conn:
            version = read_version(conn, models)
            conn.rollback()
            if version is None:
                return DbFacts(where, version=None)
            table = models.schema_version.__table__  # type: ignore[attr-defined]
            try:
                conn.execute(update(table).values(version=table.c.version))
            except SQLAlchemyError as e:
                return DbFacts(where, version=version, write_error=_one_line(e), file_note=note)
            finally:
                conn.rollback()  # a probe: nothing is ever written
            return DbFacts(where, version=version)
    except SQLAlchemyError as e:
        return DbFacts(where, error=_one_line(e), file_note=note)
    finally:
        engine.dispose()


def _one_line(e: BaseException) -> str:
    orig = getattr(e, "orig", None)
    return str(orig if orig is not None else e).splitlines()[0]


def agents(urls: Mapping[str, str], auth: object, timeout_s: float) -> list[AgentFacts]:
    """One signed ``GET /v1/node`` per agent (``auth``: the controller's ClientAuth), concurrently."""
    return asyncio.run(_agents(urls, auth, timeout_s))


async def _agents(urls: Mapping[str, str], auth: object, timeout_s: float) -> list[AgentFacts]:
    from slurm_elastic.agent.client import AgentClient
    from slurm_elastic.agent.errors import (
        AgentAuthError,
        AgentClientError,
        AgentPayloadError,
        AgentTimeoutError,
        AgentUnreachableError,
    )

    dates: dict[str, tuple[float, float, str]] = {}  # url -> (sent, received, Date header)

    async def on_start(session: object, ctx: object, params: aiohttp.TraceRequestStartParams) -> None:
        dates[str(params.url)] = (time.time(), 0.0, "")

    async def on_end(session: object, ctx: object, params: aiohttp.TraceRequestEndParams) -> None:
        sent = dates.get(str(params.url), (time.time(), 0.0, ""))[0]
        dates[str(params.url)] = (sent, time.time(), params.response.headers.get("Date", ""))

    trace = aiohttp.TraceConfig()
    trace.on_request_start.append(on_start)
    trace.on_request_end.append(on_end)
    kinds = ((AgentAuthError, "auth"), (AgentUnreachableError, "unreachable"), (AgentTimeoutError, "timeout"),
             (AgentPayloadError, "payload"))
    async with aiohttp.ClientSession(trace_configs=[trace]) as session:
        client = AgentClient(auth, timeout_s=timeout_s, session=session)  # type: ignore[arg-type]
        results = await client.fetch_many(dict(urls))
    out = []
    for node, url in urls.items():
        r = results[node]
        if isinstance(r, AgentClientError):
            kind = next((k for t, k in kinds if isinstance(r, t)), "http")
            out.append(AgentFacts(node, url, kind, str(r).removeprefix(f"{url}: ")))
            continue
        offset = None
        for u, (sent, received, date) in dates.items():
            if u.startswith(url.rstrip("/")) and date and received:
                # Date has whole seconds: the agent's time lies in [Date, Date + 1).
                offset = parsedate_to_datetime(date).timestamp() + 0.5 - (sent + received) / 2
        out.append(AgentFacts(node, url, version=r.agent_version, offset_s=offset))
    return out
