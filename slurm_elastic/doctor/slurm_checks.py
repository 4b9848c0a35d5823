"""Pure checks of the Slurm side: ``scontrol show config`` (parsed) and the files it names, in; findings out.

Each check says what it found with the values that decided, and for WARN/FAIL the slurm.conf line (or the file,
its mode) to change. Why each setting matters: docs/deployment.md, "Check the site".
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from slurm_elastic.doctor.model import Finding, fail, ok, value, warn

#: The line of plugins/job_submit.lua that carries the package version it belongs to.
LUA_VERSION_RE = re.compile(r'^\s*local\s+SLURM_ELASTIC_VERSION\s*=\s*"([^"]+)"', re.M)


@dataclass(frozen=True)
class HookFile:
    """A Prolog/Epilog path as found on this host: ``exists`` False when it is not here (it may be on the nodes
    only); ``ours`` when it is slurm-elastic's (or a script that calls it)."""

    path: str
    exists: bool
    mode: int = 0
    ours: bool = False


def _plugins(config: Mapping[str, str], key: str) -> list[str]:
    return [p.strip() for p in value(config, key).split(",") if p.strip()]


def select_type(config: Mapping[str, str]) -> Finding:
    got = value(config, "SelectType")
    if got == "select/cons_tres":
        return ok("select_type", "SelectType=select/cons_tres")
    return fail("select_type", f"SelectType={got or '(unset)'}: GPUs are not allocated as consumable resources",
                "slurm.conf: SelectType=select/cons_tres (and SelectTypeParameters=CR_Core_Memory or similar), "
                "then restart slurmctld and the slurmds")


def proctrack(config: Mapping[str, str]) -> Finding:
    got = value(config, "ProctrackType")
    if got != "proctrack/cgroup":
        return fail("proctrack", f"ProctrackType={got or '(unset)'}: a shrink cannot be sure to end every task on "
                    "a released node, and the agent cannot map GPU processes to jobs",
                    "slurm.conf: ProctrackType=proctrack/cgroup (with a cgroup.conf), restart the slurmds")
    tasks = _plugins(config, "TaskPlugin")
    if "task/cgroup" not in tasks:
        return warn("proctrack", f"ProctrackType=proctrack/cgroup, TaskPlugin={','.join(tasks) or '(unset)'}: "
                    "GPUs are not confined to the jobs holding them",
                    "slurm.conf: TaskPlugin=task/cgroup,task/affinity; cgroup.conf: ConstrainDevices=yes")
    return ok("proctrack", f"ProctrackType=proctrack/cgroup, TaskPlugin={','.join(tasks)}")


def job_submit(config: Mapping[str, str], lua_path: str, lua_text: str | None, package_version: str,
               plugins_dir: str = "plugins") -> Finding:
    """``lua_text``: job_submit.lua beside slurm.conf (``lua_path``), None when that file is missing;
    ``plugins_dir``: where this package's copy is (``<prefix>/share/slurm-elastic/plugins`` when installed)."""
    ours = f"{plugins_dir}/job_submit.lua"
    plugins = _plugins(config, "JobSubmitPlugins")
    if not any(p in ("lua", "job_submit/lua") for p in plugins):
        return warn("job_submit", f"JobSubmitPlugins={','.join(plugins) or '(unset)'}: #ELASTIC directives are "
                    "checked only when the controller reads the job, not at sbatch time",
                    f"copy {ours} to {lua_path}; slurm.conf: JobSubmitPlugins=lua; "
                    "scontrol reconfigure")
    if lua_text is None:
        return fail("job_submit", f"JobSubmitPlugins=lua but {lua_path} is missing",
                    f"copy {ours} to {lua_path} (mode 0644); scontrol reconfigure")
    if "ELASTIC" not in lua_text:
        return warn("job_submit", f"{lua_path} is not slurm-elastic's (no #ELASTIC handling)",
                    f"merge {ours} into {lua_path}; scontrol reconfigure")
    m = LUA_VERSION_RE.search(lua_text)
    found = m.group(1) if m else None
    if found != package_version:
        return warn("job_submit", f"{lua_path} is version {found or '(older, unversioned)'}, this package "
                    f"{package_version}: its directive checks may differ from `slurm-elastic check`'s",
                    f"copy this release's {ours} to {lua_path}; scontrol reconfigure")
    return ok("job_submit", f"JobSubmitPlugins=lua, {lua_path} version {found}")


def hook(config: Mapping[str, str], key: str, files: list[HookFile], plugins_dir: str = "plugins") -> Finding:
    """``key``: Prolog or Epilog; ``files``: what its paths are on this host."""
    check, script = key.lower(), f"{plugins_dir}/{key.lower()}.sh"
    setting = value(config, key)
    if not setting:
        return warn(check, f"{key} unset: the agent cannot tell which job holds an idle GPU (it reports it "
                    "unattributed, and such a job is never seen as idle)",
                    f"install {script} on every node; slurm.conf: {key}=/etc/slurm/{check}.d/slurm-elastic-"
                    f"{check}.sh (docs/deployment.md, section 4)")
    present = [f for f in files if f.exists]
    if not present:
        return warn(check, f"{key}={setting}: not on this host (check the GPU nodes)",
                    f"install {script} as {setting} (mode 0755) on every node")
    for f in present:
        if f.mode & 0o111 == 0 or f.mode & 0o022:
            return fail(check, f"{key}={setting}: {f.path} has mode {f.mode & 0o7777:04o} (slurmd needs it "
                        "executable and not writable by others)", f"chmod 0755 {f.path}")
    if not any(f.ours for f in present):
        return warn(check, f"{key}={setting} does not run slurm-elastic's {script}",
                    f"install {script} and run it from {setting}")
    return ok(check, f"{key}={setting}")


def power_saving(config: Mapping[str, str]) -> Finding:
    suspend_time = value(config, "SuspendTime")
    on = bool(value(config, "SuspendProgram")) and suspend_time.upper() not in ("", "INFINITE", "NONE")
    if not on:
        return ok("power_saving", f"power saving off (SuspendTime={suspend_time or '(unset)'})")
    private = [p.strip().lower() for p in value(config, "PrivateData").split(",")]
    if "cloud" not in private:
        return fail("power_saving", f"SuspendTime={suspend_time}, PrivateData={value(config, 'PrivateData') or 'none'}"
                    ": powered-down nodes are hidden from sinfo/scontrol, so the controller never counts them as "
                    "capacity", "slurm.conf: PrivateData=cloud (added to any other PrivateData flags); "
                    "scontrol reconfigure")
    return ok("power_saving", f"SuspendTime={suspend_time}, PrivateData includes cloud")


def accounting(config: Mapping[str, str], sacct_error: str | None) -> Finding:
    """``sacct_error``: None when a short ``sacct`` query answered, else its message."""
    storage = value(config, "AccountingStorageType")
    if storage != "accounting_storage/slurmdbd":
        return fail("accounting", f"AccountingStorageType={storage or '(unset)'}: report, whatif and lost-job "
                    "detection read sacct, and Slurm refuses a job's second update after a resize without slurmdbd",
                    "run slurmdbd; slurm.conf: AccountingStorageType=accounting_storage/slurmdbd, "
                    "AccountingStorageHost=<slurmdbd host>; restart slurmctld")
    if sacct_error is not None:
        host = value(config, "AccountingStorageHost") or "?"
        port = value(config, "AccountingStoragePort") or "6819"
        return fail("accounting", f"sacct failed: {sacct_error}",
                    f"start slurmdbd on {host}:{port} (systemctl status slurmdbd) and its database")
    return ok("accounting", f"AccountingStorageType={storage}, sacct answers")


def slurm_auth(config: Mapping[str, str], munge_error: str | None) -> Finding:
    """MUNGE as Slurm uses it. ``munge_error``: None when a credential made here decoded here."""
    auth = value(config, "AuthType")
    if auth != "auth/munge":
        return ok("munge", f"AuthType={auth or '(unset)'}: Slurm does not use MUNGE "
                  "(agents: use auth = \"hmac\")")
    if munge_error is not None:
        return fail("munge", f"AuthType=auth/munge but {munge_error}",
                    "systemctl start munge (the same /etc/munge/munge.key, mode 0400 munge, on every host)")
    return ok("munge", "AuthType=auth/munge, munged encodes and decodes a credential")


def slurm_checks(config: Mapping[str, str], *, lua_path: str, lua_text: str | None, package_version: str,
                 prolog: list[HookFile], epilog: list[HookFile], sacct_error: str | None,
                 munge_error: str | None, plugins_dir: str = "plugins") -> list[Finding]:
    return [select_type(config), proctrack(config),
            job_submit(config, lua_path, lua_text, package_version, plugins_dir),
            hook(config, "Prolog", prolog, plugins_dir), hook(config, "Epilog", epilog, plugins_dir),
            power_saving(config),
            accounting(config, sacct_error), slurm_auth(config, munge_error)]
