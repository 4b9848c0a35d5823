"""What a steady cycle writes (nothing changed in Slurm or in the measurements): no unit row, no decision row, and
one statement for every agent's scrape; the rest is the cycle's own bookkeeping (its row, the lease, the sample).
Replies recorded from the live cluster (controller_scenarios.steady_cli, which fails on any Slurm write)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from sqlalchemy import event

from tests.unit.test_controller_hold_filter import Steady, steady  # noqa: F401  (the fixture)


def _writes(st: Steady, cycles: int) -> Counter[tuple[str, str]]:
    """(verb, table) -> rows written by the next ``cycles`` cycles (an executemany counts its rows)."""
    seen: Counter[tuple[str, str]] = Counter()
    statements: Counter[tuple[str, str]] = Counter()

    def count(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
        words = statement.split()
        verb = words[0].upper()
        if verb in {"INSERT", "UPDATE", "DELETE"}:
            table = words[1] if verb == "UPDATE" else words[2]
            seen[(verb, table)] += len(parameters) if executemany else 1
            statements[(verb, table)] += 1

    engine = st.store.db.engine
    event.listen(engine, "before_cursor_execute", count)
    try:
        st.run(cycles)
    finally:
        event.remove(engine, "before_cursor_execute", count)
    seen[("statements", "agents")] = statements[("UPDATE", "agents")]
    return seen


def test_a_steady_cycle_writes_no_unit_and_no_decision_row(steady: Steady) -> None:  # noqa: F811
    steady.run(8)  # the window fills, the hold settles
    writes = _writes(steady, 5)
    assert not [k for k in writes if k[1] in {"elastic_jobs", "decisions"}], writes
    agents = len(steady.store.agents.list_agents())
    assert agents >= len(steady.nodes) and writes[("UPDATE", "agents")] == 5 * agents  # every scrape recorded...
    assert writes[("statements", "agents")] == 5  # ...in one statement per cycle
    steady.busy(95.0)  # something changes: the hold's reason (AT_MAX), written once
    changed = _writes(steady, 3)
    assert changed[("INSERT", "decisions")] >= 1 and not [k for k in changed if k[1] == "elastic_jobs"]
