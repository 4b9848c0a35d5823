"""docs/policy.md shows the packaged config keys and every reason code, generated from the code."""

from __future__ import annotations

import re
from pathlib import Path

from slurm_elastic.policy import Reason, render_keys_markdown
from slurm_elastic.policy.reasons import REASON_DOCS, render_reasons_markdown

DOC = Path(__file__).resolve().parents[2] / "docs" / "policy.md"


def _block(name: str) -> str:
    m = re.search(rf"<!-- {name}:begin -->\n(.*?)<!-- {name}:end -->", DOC.read_text(), re.S)
    assert m is not None, f"markers for {name} missing in {DOC}"
    return m.group(1)


def test_keys_table_matches_the_packaged_defaults() -> None:
    assert _block("policy-keys") == render_keys_markdown(), "regenerate with render_keys_markdown()"


def test_reason_table_matches_the_codes() -> None:
    assert set(REASON_DOCS) == set(Reason)
    assert _block("policy-reasons") == render_reasons_markdown(), "regenerate with render_reasons_markdown()"


def test_example_messages_are_what_decide_says() -> None:
    from slurm_elastic.policy import decide
    from tests.unit.policy_builders import NOW
    from tests.unit.test_policy_rules import CASES

    said = set()
    for case in CASES:
        inp, config = case.build()
        d = {d.unit_id: d for d in decide(inp, config, NOW)}[case.unit_id]
        said.add(f"{d.action:6} {d.reason:24} {d.message}")
    text = DOC.read_text()
    block = text[text.index("## Example messages"):]
    shown = [line for line in block.splitlines() if line.startswith(("shrink ", "grow ", "hold "))]
    assert shown and all(line in said for line in shown), sorted(set(shown) - said)
