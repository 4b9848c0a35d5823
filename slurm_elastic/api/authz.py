"""Who may do what (pure): root, SlurmUser and the operators group may change things; ordinary users may only
read about their own jobs, unless the site says otherwise (``users_see_all``)."""

from __future__ import annotations

from dataclasses import dataclass

from slurm_elastic.errors import SlurmElasticError

#: Operations that change the controller's behaviour.
CHANGING_OPS = frozenset({"policy.set", "policy.rollback", "pause", "resume"})
#: Operations anyone may call; per-job filtering happens in the service.
READ_OPS = frozenset({"status", "jobs", "explain", "decisions", "policy.show", "policy.history", "policy.diff",
                      "agents", "whoami", "usage"})


class PermissionDeniedError(SlurmElasticError):
    """The caller may not do this."""


class UnknownOperationError(SlurmElasticError):
    """The request names no operation the API knows."""


@dataclass(frozen=True)
class AccessPolicy:
    """From controller.toml's ``[api]`` section."""

    slurm_user: str = "slurm"
    operators_group: str = ""
    users_see_all: bool = False


@dataclass(frozen=True)
class Caller:
    uid: int
    user: str
    groups: frozenset[str] = frozenset()

    def is_admin(self, policy: AccessPolicy) -> bool:
        return (self.uid == 0 or self.user == policy.slurm_user
                or (bool(policy.operators_group) and policy.operators_group in self.groups))

    def sees_all(self, policy: AccessPolicy) -> bool:
        return self.is_admin(policy) or policy.users_see_all


def authorize(caller: Caller, op: str, policy: AccessPolicy) -> None:
    """Raise unless ``caller`` may call ``op`` at all (per-job checks come later, with the job's owner)."""
    if op in CHANGING_OPS:
        if not caller.is_admin(policy):
            who = f"root, {policy.slurm_user}" + (f" or group {policy.operators_group}" if policy.operators_group
                                                  else "")
            raise PermissionDeniedError(f"{op}: permission denied for {caller.user} (only {who})")
        return
    if op not in READ_OPS:
        raise UnknownOperationError(f"unknown operation {op!r}")


def check_job_owner(caller: Caller, owner: str | None, job_id: int, policy: AccessPolicy) -> None:
    if caller.sees_all(policy) or (owner is not None and owner == caller.user):
        return
    raise PermissionDeniedError(f"job {job_id}: permission denied for {caller.user} (not your job)")
