"""``slurm-elastic check``'s comparison with the effective policy: a threshold set alone meets the site's other.

A script may set ``--scale-up-above`` without ``--scale-down-below`` (or the reverse); the other threshold is
then the site's, resolved for the job's partition and account as the controller resolves it. When the two do
not make a band (down >= up), the controller holds the job with INVALID_SETTINGS and it is never resized:
``check`` says so at check time, naming the value it compared with and where that value comes from: the policy's
packaged default (keyschema.JOB_KEYS, the same the option table shows) or the site file's scope.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import cast

from slurm_elastic.directives.spec import ElasticSpec
from slurm_elastic.policy import PolicyConfig
from slurm_elastic.policy.config import SettingsResolver

_SBATCH = re.compile(rb"^#SBATCH\s+(.*)$", re.MULTILINE)
_OPTIONS = {"-p": "partition", "--partition": "partition", "-A": "account", "--account": "account"}


def sbatch_scope(data: bytes) -> tuple[str | None, str | None]:
    """(partition, account) from the script's ``#SBATCH`` lines (the first partition of a list), or None each."""
    found: dict[str, str] = {}
    for m in _SBATCH.finditer(data):
        words = m.group(1).decode("utf-8", "replace").split()
        for i, word in enumerate(words):
            opt, eq, value = word.partition("=")
            if opt in _OPTIONS and not eq and i + 1 < len(words):
                value = words[i + 1]
            if opt in _OPTIONS and value:
                found.setdefault(_OPTIONS[opt], value.split(",")[0])
    return found.get("partition"), found.get("account")


@dataclass(frozen=True)
class Band:
    """The utilization band a spec gets under a policy: each threshold with where it comes from."""

    down: int
    down_source: str
    up: int
    up_source: str
    scope: str  # "partition train, account nlp" or "any partition and account"

    @property
    def ok(self) -> bool:
        return self.down < self.up

    def problem(self) -> str | None:
        """The message for a band that is not one, naming the policy's side; None when it is one."""
        if self.ok:
            return None
        if self.up_source == "script":
            mine, theirs = ("--scale-up-above", self.up), (self.down, self.down_source)
        else:
            mine, theirs = ("--scale-down-below", self.down), (self.up, self.up_source)
        what = "not above scale_down_below" if mine[0] == "--scale-up-above" else "not below scale_up_above"
        return (f"{mine[0]}: {mine[1]} is {what} {theirs[0]} (policy: {theirs[1]}) for {self.scope}: the "
                f"controller would hold the job (INVALID_SETTINGS) and never resize it")

    def to_dict(self) -> dict[str, object]:
        return {"scale_down_below": self.down, "scale_down_below.source": self.down_source,
                "scale_up_above": self.up, "scale_up_above.source": self.up_source, "scope": self.scope,
                "ok": self.ok}


def effective_band(spec: ElasticSpec, cfg: PolicyConfig, partition: str | None, account: str | None) -> Band:
    """The band ``spec`` runs with: its own thresholds where its directives set them, else the policy's for the
    partition and account (qos: none; a QOS override is not known from the script)."""
    resolved = SettingsResolver(cfg).scope(partition, account, None)

    def pick(key: str) -> tuple[int, str]:
        if key in spec.explicit:
            return int(getattr(spec, key)), "script"
        r = resolved[key]
        if r.provenance.source == "default":  # say which default: the policy's packaged one, not the option table's
            return cast(int, r.value), "packaged default"
        return cast(int, r.value), str(r.provenance)

    down, down_source = pick("scale_down_below")
    up, up_source = pick("scale_up_above")
    where = ", ".join(f"{k} {v}" for k, v in (("partition", partition), ("account", account)) if v)
    return Band(down, down_source, up, up_source, where or "any partition and account")
