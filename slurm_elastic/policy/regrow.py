"""Molded jobs grow back to their request (``MOLDED_REGROW``).

Moldable start (policy/moldable.py) begins a waiting job now on the free whole nodes when its request does not
fit, instead of letting it wait. Rigid Slurm would have run it at its request, a little later; the job was
promised to grow back. Measured before this rule (docs/performance.md, "Fairness"): most jobs more than 1.25x
later than rigid were molded, held for ten minutes (the startup hold, then a window of samples) and then
refused every next node by the speedup check (the linear-sync model predicts a marginal efficiency of 0.36-0.48
for a small job at 84-88% utilization), so they ran their whole life at a quarter of their request.

The rule, for a unit with ``molded_request`` (the node count it asked for) that runs below it:

* it grows toward ``min(request, max)`` whatever its utilization band, goodput or speedup check says. Those
  checks exist to stop growth *past* the request that does not pay; up to the request, rigid Slurm would have
  given it the nodes, and the user sized the job for them;
* no window of samples: it grows as soon as the startup hold (``startup_protection_s``) and the cooldown after
  a resize are over, without utilization. Growing during the startup hold too was measured and lost: a molded
  job is then no longer protected as a starting job, becomes the first victim of the next arrival (it has the
  lowest priority: it hardly waited), and workload-3 greedy with the round plan went from 1.2% to 6.2% of its
  jobs more than 2x later than rigid (docs/performance.md, "Fairness");
* in the walk it is a waiting job that got part of its nodes: it takes free nodes at its priority, in line with
  the waiting jobs (after those of equal priority), and ahead of every other training grow, whatever that
  unit's priority: those grow past a size the job was given or asked for (policy/walk.py).

Pure: no clock, ``now`` comes with the context.
"""

from __future__ import annotations

from slurm_elastic.policy.model import ElasticUnit


def regrow_target(unit: ElasticUnit) -> int | None:
    """The size a molded unit grows back to (its request, within its max), or None when it is not molded, may
    not grow (``--no-grow``) or already holds that many nodes."""
    request = unit.molded_request
    if request is None or not unit.spec.grow:
        return None
    target = min(request, unit.max_nodes)
    return target if unit.current_nodes < target else None


def regrow_message(unit: ElasticUnit, target: int) -> str:
    return (f"molded: started below its request of {unit.molded_request} node(s), runs on {unit.current_nodes}; "
            f"back to {target} first, whatever the utilization band or the speedup check says "
            f"(rigid Slurm would have given it those nodes)")


__all__ = ["regrow_message", "regrow_target"]
