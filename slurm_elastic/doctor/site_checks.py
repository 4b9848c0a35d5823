"""Pure checks of slurm-elastic's own setup: the controller's rights in Slurm, the state DB, the agents and the
clocks. Facts in (gathered by :mod:`slurm_elastic.doctor.probes`), findings out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from slurm_elastic.doctor.model import Finding, fail, ok, value, warn

#: Clock offsets (s) between this host and an agent: the HMAC scheme refuses past 30 s
#: (agent/auth.py DEFAULT_MAX_SKEW_S); windows, cooldowns and the lease assume far less.
CLOCK_WARN_S = 1.0
CLOCK_FAIL_S = 10.0


@dataclass(frozen=True)
class Identity:
    """Who runs ``doctor`` (run it as the controller's user), and what Slurm says about that user."""

    user: str
    uid: int
    admin_level: str | None  # sacctmgr's AdminLevel ("None", "Operator", "Administrator"); None: not asked


def operator(config: Mapping[str, str], who: Identity, api_slurm_user: str) -> list[Finding]:
    """The controller needs root: it updates every user's jobs (Slurm operator rights, which root and SlurmUser
    have) and submits extension jobs as their owners (``runuser -u USER -- sbatch``, root only)."""
    slurm_user = value(config, "SlurmUser").split("(")[0] or "root"
    out: list[Finding] = []
    if who.uid == 0:
        out.append(ok("operator", "runs as root: Slurm operator rights, submits extension jobs as their owners"))
    else:
        level = who.admin_level or "None"
        missing = ["root (extension jobs are submitted with runuser as each job's owner)"]
        if who.user != slurm_user and level not in ("Operator", "Administrator"):
            missing.append(f"Slurm operator rights (AdminLevel={level}: "
                           f"sacctmgr modify user {who.user} set AdminLevel=Operator)")
        out.append(fail("operator", f"runs as {who.user} (uid {who.uid}); missing: " + "; ".join(missing),
                        "run the controller as root (packaging/systemd/slurm-elastic-controller.service) "
                        "and doctor as the same user"))
    if api_slurm_user != slurm_user:
        out.append(warn("api_slurm_user", f"controller.toml [api] slurm_user = {api_slurm_user!r}, Slurm's "
                        f"SlurmUser is {slurm_user!r}: the wrong user may change the policy",
                        f"controller.toml: [api] slurm_user = \"{slurm_user}\""))
    return out


@dataclass(frozen=True)
class DbFacts:
    where: str                     # the URL without its password
    error: str | None = None       # could not connect / read (the message)
    version: int | None = None     # None: empty database
    write_error: str | None = None  # a rolled-back write failed (the message); None: it worked
    file_note: str = ""            # SQLite: the file's or its directory's mode and owner


def database(db: DbFacts, supported: int) -> Finding:
    upgrade = f"slurm-elastic db upgrade --url '{db.where}'"
    if db.error is not None:
        return fail("database", f"{db.where}: {db.error}{db.file_note}",
                    "controller.toml [store] url; the DB server's grants; the directory of a SQLite file "
                    "(mode 0700, owned by the controller's user)")
    if db.write_error is not None:
        return fail("database", f"{db.where} is not writable: {db.write_error}{db.file_note}",
                    "make the DB writable by the controller's user (SQLite: chown root and chmod 0600 the file, "
                    "0700 its directory; a server DB: GRANT ALL ON the schema)")
    if db.version is None:
        return warn("database", f"{db.where}: no schema yet (the controller creates it at its first start)",
                    upgrade)
    if db.version < supported:
        return fail("database", f"{db.where}: schema {db.version}, this slurm-elastic needs {supported} (the "
                    "controller refuses to start)", f"stop the controller(s), back up the DB, {upgrade}")
    if db.version > supported:
        return fail("database", f"{db.where}: schema {db.version} is newer than this slurm-elastic's {supported}",
                    "install the slurm-elastic release that wrote it")
    return ok("database", f"{db.where}: schema {db.version}, writable")


@dataclass(frozen=True)
class AgentFacts:
    node: str
    url: str
    error_kind: str | None = None  # "auth", "unreachable", "timeout", "http", "payload"; None: answered
    error: str = ""
    version: str | None = None
    offset_s: float | None = None  # the agent's clock minus ours (midpoint of the request)


def agents(results: Sequence[AgentFacts], *, auth: str, key_note: str, package_version: str,
           source: str) -> list[Finding]:
    """One finding per agent. ``auth``: the configured scheme; ``key_note``: where its key comes from."""
    if not results:
        return [warn("agents", "no node to ask (Slurm lists none that is powered up)", "")]
    out: list[Finding] = []
    for a in results:
        check = f"agent:{a.node}"
        if a.error_kind == "auth":
            out.append(fail(check, f"{a.url} refused our {auth} credentials: {a.error}",
                            f"the agent's auth and key must match {source} [agents] ({key_note}); restart the agent "
                            "after changing its key"))
        elif a.error_kind in ("unreachable", "timeout"):
            out.append(fail(check, f"{a.url}: {a.error}",
                            f"systemctl start slurm-elastic-agent on {a.node}; allow this host to reach the port "
                            f"(or fix {source} [agents] url_template)"))
        elif a.error_kind is not None:
            out.append(fail(check, f"{a.url}: {a.error}", f"the agent's log on {a.node} (journalctl -u "
                            "slurm-elastic-agent)"))
        elif a.version != package_version:
            out.append(warn(check, f"{a.url} answers, agent version {a.version}, controller {package_version}",
                            f"install slurm-elastic {package_version} on {a.node} and restart its agent"))
        else:
            out.append(ok(check, f"{a.url} answers ({auth}), version {a.version}"))
    return out


def clock(results: Sequence[AgentFacts]) -> Finding:
    offsets = [(a.node, a.offset_s) for a in results if a.offset_s is not None]
    if not offsets:
        return warn("clock", "no agent answered: clock offsets unknown", "keep every host NTP-synchronized")
    node, off = max(offsets, key=lambda t: abs(t[1]))
    detail = f"largest offset {off:+.1f} s ({node}) over {len(offsets)} agent(s)"
    if abs(off) >= CLOCK_FAIL_S:
        return fail("clock", f"{detail} >= {CLOCK_FAIL_S:g} s", f"synchronize {node} and this host (chrony/NTP)")
    if abs(off) >= CLOCK_WARN_S:
        return warn("clock", f"{detail} >= {CLOCK_WARN_S:g} s", f"synchronize {node} and this host (chrony/NTP)")
    return ok("clock", detail)
