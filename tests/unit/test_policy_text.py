"""The tests' policy builder (tests/policy_text.py): overrides win, None leaves a key to its packaged default."""

from __future__ import annotations

import pytest

from slurm_elastic.policy import parse_config
from slurm_elastic.policy.schema import DEFAULTS
from tests.policy_text import CLUSTER, UNIT, policy_text


def test_overrides_win_and_none_leaves_the_packaged_default() -> None:
    cfg = parse_config(policy_text(CLUSTER, cooldown_s=5, moldable_start=None, step=2, goodput=True))
    assert {k: cfg.resolve(k).value for k in ("cooldown_s", "step", "goodput", "grace_s", "scale_up_above")} == {
        "cooldown_s": 5, "step": 2, "goodput": True, "grace_s": 3, "scale_up_above": 80}
    moldable = cfg.resolve("moldable_start")
    assert (moldable.value, moldable.provenance.source) == (DEFAULTS["moldable_start"], "default")
    assert parse_config(policy_text(UNIT)).resolve("moldable_start").value is False


def test_a_string_that_would_need_escaping_is_refused() -> None:
    assert 'signal = "USR2"' in policy_text(UNIT, signal="USR2")
    with pytest.raises(ValueError, match="TOML escaping"):
        policy_text(UNIT, signal='USR2"\nversion = 2')
