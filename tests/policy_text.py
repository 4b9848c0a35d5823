"""The tests' policy files: one builder, for unit and cluster tests alike, so that each test states only the keys
in which it differs from the common base, and a new test does not copy (and silently fork) a whole header."""

from __future__ import annotations

from collections.abc import Mapping

PolicyValue = bool | int | float | str

# What every controller test pins, so that a decision comes within a few cycles: a short window of few samples,
# no protection of a job's start, no minimum remaining time for a grow.
FAST: Mapping[str, PolicyValue] = {
    "window_s": 10, "min_samples": 3, "startup_protection_s": 0, "min_remaining_for_grow_s": 0,
}
# The unit tests' controller on a fake clock (tests/unit/test_controller_cycle.py); moldable start, a packaged
# default, is off unless a test is about it.
UNIT: Mapping[str, PolicyValue] = {
    **FAST, "cooldown_s": 20, "grace_s": 5, "max_metric_age_s": 30, "moldable_start": False,
}
# The cluster tests' controller process: written for the 40..80 band without shrink-to-admit, they say so rather
# than rely on the packaged defaults (nor on moldable start, a packaged default too); the agents' samples are
# fresh within 12 s on the live cluster.
CLUSTER: Mapping[str, PolicyValue] = {
    **FAST, "scale_up_above": 80, "scale_down_below": 40, "shrink_to_admit": False, "moldable_start": False,
    "cooldown_s": 15, "grace_s": 3, "max_metric_age_s": 12,
}
# The simulator's shrink-to-admit scenarios (tests/unit/test_sim_*.py): one sample decides, no cooldown, a
# 120 s grace period; each scenario sets the scale-up threshold it needs.
SIM_ADMIT: Mapping[str, PolicyValue] = {
    "scale_down_below": 10, "window_s": 60, "min_samples": 1, "startup_protection_s": 0, "cooldown_s": 0,
    "shrink_to_admit": True, "grace_s": 120,
}


def _toml(value: PolicyValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        if any(c in value for c in '"\\\n'):
            raise ValueError(f"policy_text: {value!r} needs TOML escaping; write that key as text")
        return f'"{value}"'
    return str(value)


def policy_text(base: Mapping[str, PolicyValue], /, **keys: PolicyValue | None) -> str:
    """A policy file: ``version = 1``, then ``base`` with ``keys`` over it, one top-level ``key = value`` line
    each. A key given as None is left out, so the packaged default holds. Tables ([partition.x], [profile.y])
    go after the returned text."""
    merged: dict[str, PolicyValue | None] = {**base, **keys}
    return "version = 1\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in merged.items() if v is not None)
