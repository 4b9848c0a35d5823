"""Fair share: split a partition's spare nodes among accounts that have grow candidates, by weight.

Weights come from Slurm (sshare's normalized shares or fair-share factors, via ``PolicyInput.account_shares``);
only their ratios matter. An account missing from the mapping gets the smallest known positive weight (or 1
when none is known), so an unknown account is neither starved nor favoured.

The split first gives one node to every account with demand (highest weight first) while nodes last: one
account must not take all spare nodes while another account's job also qualifies. The rest is water-filled
by weight: each round offers every unsatisfied account its weighted part of what is left (rounded down,
capped at its demand); when the rounding leaves nothing to give, one node goes to the account with the
largest remainder. The result is deterministic (ties break on the account name).
"""

from __future__ import annotations

import math
from collections.abc import Mapping


def account_weight(shares: Mapping[str, float], account: str) -> float:
    value = shares.get(account)
    if value is not None and math.isfinite(value) and value > 0:
        return float(value)
    positive = [v for v in shares.values() if math.isfinite(v) and v > 0]
    return min(positive) if positive else 1.0


def split_spare(spare: int, demand: Mapping[str, int], shares: Mapping[str, float]) -> dict[str, int]:
    """Nodes per account (at most its demand, all together at most ``spare``)."""
    alloc = {a: 0 for a in demand}
    active = sorted((a for a, d in demand.items() if d > 0), key=lambda a: (-account_weight(shares, a), a))
    left = max(0, spare)
    for a in active:
        if left == 0:
            break
        alloc[a] = 1
        left -= 1
    while left > 0:
        unsat = [a for a in active if alloc[a] < demand[a]]
        if not unsat:
            break
        total_w = sum(account_weight(shares, a) for a in unsat)
        ideal = {a: left * account_weight(shares, a) / total_w for a in unsat}
        give = {a: min(math.floor(ideal[a]), demand[a] - alloc[a]) for a in unsat}
        if sum(give.values()) == 0:
            best = max(unsat, key=lambda a: (ideal[a] - math.floor(ideal[a]), account_weight(shares, a), _desc(a)))
            give = {best: 1}
        for a, g in give.items():
            alloc[a] += g
            left -= g
    return alloc


def _desc(name: str) -> tuple[int, ...]:
    """Sort key under which ``max`` picks the alphabetically first name."""
    return tuple(-ord(c) for c in name) + (1,)
