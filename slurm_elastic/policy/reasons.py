"""Stable codes: what a decision does (:class:`Action`), why (:class:`Reason`), and on what signal (:class:`Basis`).

These values are stored in the database and printed by ``explain``; they are an interface. Add codes, never
rename or reuse one.
"""

from __future__ import annotations

import enum


class Action(enum.StrEnum):
    GROW = "grow"
    SHRINK = "shrink"
    HOLD = "hold"


class Basis(enum.StrEnum):
    """The signal a decision was based on."""

    UTILIZATION = "utilization"  # mean GPU utilization over the window
    SERVING = "serving"  # a serving unit's published latency and load, or its demand forecast
    THROUGHPUT = "throughput"  # the job's published throughput (goodput rule)
    QUEUE = "queue"  # a pending job (shrink-to-admit)
    RESERVE = "reserve"  # the partition's free-node reserve (reserve reclaim)
    BOUNDS = "bounds"  # the unit is outside its min/max (e.g. a node failed, max lowered)
    NONE = "none"  # nothing measured was used (protections, pauses, missing metrics)


class Reason(enum.StrEnum):
    """Why a decision was taken. One code per rule; the message carries the numbers."""

    # metric-driven actions
    UNDERUTILIZED = "UNDERUTILIZED"  # shrink: mean util below scale_down_below over the window
    OVERUTILIZED = "OVERUTILIZED"  # grow: mean util above scale_up_above over the window
    IN_BAND = "IN_BAND"  # hold: between the thresholds (hysteresis)
    # bounds
    BELOW_MIN = "BELOW_MIN"  # grow back to min (lost an extension/node)
    ABOVE_MAX = "ABOVE_MAX"  # shrink down to max (max lowered)
    AT_MIN = "AT_MIN"
    AT_MAX = "AT_MAX"
    # protections
    NOT_RUNNING = "NOT_RUNNING"
    STARTUP = "STARTUP"
    COOLDOWN = "COOLDOWN"
    NEAR_END = "NEAR_END"
    EXTENSION_PENDING = "EXTENSION_PENDING"
    GROW_DISABLED = "GROW_DISABLED"
    SHRINK_DISABLED = "SHRINK_DISABLED"
    INVALID_SETTINGS = "INVALID_SETTINGS"
    PAUSED = "PAUSED"
    ACTION_CAP = "ACTION_CAP"
    # metrics quality
    NO_METRICS = "NO_METRICS"
    STALE_METRICS = "STALE_METRICS"
    WINDOW_NOT_FILLED = "WINDOW_NOT_FILLED"
    TOO_FEW_SAMPLES = "TOO_FEW_SAMPLES"
    # capacity
    NO_FREE_NODES = "NO_FREE_NODES"
    PENDING_HIGHER_PRIORITY = "PENDING_HIGHER_PRIORITY"
    RESERVE_KEPT = "RESERVE_KEPT"
    RESERVE_RECLAIM = "RESERVE_RECLAIM"
    # rules beyond the utilization band, each behind a switch
    SHRINK_TO_ADMIT = "SHRINK_TO_ADMIT"
    FAIR_SHARE_LIMIT = "FAIR_SHARE_LIMIT"
    RESTART_COST = "RESTART_COST"
    LOW_MARGINAL_EFFICIENCY = "LOW_MARGINAL_EFFICIENCY"
    QUOTA_REACHED = "QUOTA_REACHED"
    # protect the tail (bounded slowdown), behind tail_protection
    SHRUNK_TOO_LONG = "SHRUNK_TOO_LONG"
    TAIL_PROTECTED = "TAIL_PROTECTED"
    # speedup-aware growth, behind speedup_growth
    SPEEDUP_GAIN = "SPEEDUP_GAIN"
    LOW_SPEEDUP_GAIN = "LOW_SPEEDUP_GAIN"
    # goodput trades, behind goodput_moves
    GOODPUT_MOVE = "GOODPUT_MOVE"
    # moldable start of a pending elastic job, behind moldable_start (policy/moldable.py)
    MOLDABLE_START = "MOLDABLE_START"
    MOLDED_REGROW = "MOLDED_REGROW"  # grow: a molded unit back toward its request (policy/regrow.py)
    # serving units (#ELASTIC --serving)
    SLO_AT_RISK = "SLO_AT_RISK"
    SLO_PEAK_AHEAD = "SLO_PEAK_AHEAD"
    SLO_HEADROOM = "SLO_HEADROOM"
    SLO_MET = "SLO_MET"
    REPLICA_WARMING = "REPLICA_WARMING"
    SERVING_RECLAIM = "SERVING_RECLAIM"
    # Slurm-side losses (preemption, node failure): recorded by the controller's shell (controller/losses.py),
    # never by decide()
    PREEMPTED_BY_SLURM = "PREEMPTED_BY_SLURM"
    NODE_FAILURE = "NODE_FAILURE"
    # the shell's state: an unfinished action, extension jobs that die on their own (policy/holds.py)
    ACTION_IN_PROGRESS = "ACTION_IN_PROGRESS"
    GROW_BACKOFF = "GROW_BACKOFF"
    # Slurm power saving: growing onto powered-down nodes (policy/walk.py), a resume that failed (the shell)
    POWER_RESUME_COST = "POWER_RESUME_COST"
    RESUME_FAILED = "RESUME_FAILED"
    # cold start of a grow with #ELASTIC --prewarm (the shell, controller/coldstart.py)
    PREWARM_FAILED = "PREWARM_FAILED"
    COLD_START = "COLD_START"


#: Reasons ``decide()`` never returns: what the controller's shell records (controller/losses.py), and moldable
#: start's, decided for a waiting job by policy/moldable.py after ``decide()``.
SHELL_REASONS = frozenset({Reason.PREEMPTED_BY_SLURM, Reason.NODE_FAILURE, Reason.RESUME_FAILED,
                           Reason.PREWARM_FAILED, Reason.COLD_START, Reason.MOLDABLE_START})

#: One line per reason, for docs/policy.md and ``explain --reasons``.
REASON_DOCS: dict[Reason, str] = {
    Reason.UNDERUTILIZED: "shrink: mean GPU utilization stayed below scale_down_below over a filled window",
    Reason.OVERUTILIZED: "grow: mean GPU utilization stayed above scale_up_above over a filled window",
    Reason.IN_BAND: "hold: utilization is between the thresholds (the hysteresis band)",
    Reason.BELOW_MIN: "grow: the unit runs below its min (an extension job or node was lost); metrics not needed",
    Reason.ABOVE_MAX: "shrink: the unit runs above its max (e.g. max lowered); metrics not needed",
    Reason.AT_MIN: "hold: would shrink, but the unit is at its min",
    Reason.AT_MAX: "hold: would grow, but the unit is at its max",
    Reason.NOT_RUNNING: "hold: the unit's job is not RUNNING",
    Reason.STARTUP: "hold: the job started less than startup_protection_s ago",
    Reason.COOLDOWN: "hold: the unit was resized less than cooldown_s ago",
    Reason.NEAR_END: "hold: would grow, but less than min_remaining_for_grow_s of the time limit is left",
    Reason.EXTENSION_PENDING: "hold: would grow, but an extension job of this unit is still pending",
    Reason.GROW_DISABLED: "hold: would grow, but the job said --no-grow",
    Reason.SHRINK_DISABLED: "hold: would shrink, but the job said --no-shrink",
    Reason.INVALID_SETTINGS: "hold: the unit's directives and the site policy combine into invalid settings",
    Reason.PAUSED: "hold: the policy is paused for this job, its partition, account, QOS or globally",
    Reason.ACTION_CAP: "hold: max_actions_per_cycle was reached; retried next cycle",
    Reason.NO_METRICS: "hold: no utilization reported for the unit (never a shrink)",
    Reason.STALE_METRICS: "hold: the last sample is older than max_metric_age_s (never a shrink)",
    Reason.WINDOW_NOT_FILLED: "hold: the samples cover less than the window",
    Reason.TOO_FEW_SAMPLES: "hold: fewer than min_samples samples in the window",
    Reason.NO_FREE_NODES: "hold: would grow, but no free node of the partition fits the unit's GRES per node",
    Reason.PENDING_HIGHER_PRIORITY: "hold: would grow, but a pending job of equal or higher priority can use the "
    "free nodes",
    Reason.RESERVE_KEPT: "hold: would grow, but that would leave fewer than free_node_reserve free nodes",
    Reason.RESERVE_RECLAIM: "shrink: the partition has fewer free nodes than free_node_reserve and "
    "reclaim_reserve is on (e.g. a profile raised the reserve)",
    Reason.SHRINK_TO_ADMIT: "shrink: a higher-priority pending job is blocked only by nodes elastic units hold "
    "above their min",
    Reason.FAIR_SHARE_LIMIT: "hold (or smaller grow): the account's weighted share of spare nodes is used up",
    Reason.RESTART_COST: "hold: the expected gain over the remaining time does not exceed the restart cost",
    Reason.LOW_MARGINAL_EFFICIENCY: "hold or shrink: measured or predicted marginal efficiency is below "
    "goodput_min_marginal_efficiency",
    Reason.QUOTA_REACHED: "hold (or smaller grow): the account's or QOS's max_extension_nodes quota, or a Slurm "
    "GPU limit (GrpTRES, MaxTRESPerUser/PerAccount gres/gpu), is used up",
    Reason.SHRUNK_TOO_LONG: "grow: the unit has run below its requested size for more than max_shrunk_share of "
    "its life (tail_protection); it grows back to its request, ahead of pending jobs",
    Reason.TAIL_PROTECTED: "hold: a higher-priority pending job waits, but this unit has run below its requested "
    "size for more than max_shrunk_share of its life (tail_protection), so it is not shrunk for it",
    Reason.SPEEDUP_GAIN: "grow (speedup_growth): the next step's speedup (throughput, for an opted-in job the "
    "goodput model of adaptive batch size, else the linear-sync model of utilization) saves more of the "
    "remaining time than a restart costs; spare nodes go to the largest saving first",
    Reason.LOW_SPEEDUP_GAIN: "hold (speedup_growth): the next step's marginal efficiency is below "
    "goodput_min_marginal_efficiency, or the time it saves does not exceed a restart",
    Reason.GOODPUT_MOVE: "shrink (goodput_moves): gives its last node to a unit whose speedup grow found no free "
    "node, because that unit's next node saves more (net of its restart) than losing it costs this one (plus a "
    "restart), by the speedup_growth model",
    Reason.MOLDABLE_START: "mold (moldable_start): a pending elastic job that cannot start at its request, "
    "but whose min fits the free whole nodes, is reshaped (scontrol update NumNodes=size-request) to start now on "
    "them; its time limit grows by request / size and it keeps its request as its max, so it grows back",
    Reason.MOLDED_REGROW: "grow: a unit that moldable start began below its request grows back toward it "
    "after the startup hold, whatever its utilization or predicted speedup says (rigid Slurm would have given it "
    "those nodes); walked at its priority like the waiting job it was, ahead of every other training grow",
    Reason.SLO_AT_RISK: "grow (serving): the short window's p99 latency or load per replica is above "
    "serving_risk_percent of the objective; scales out at once, ahead of pending jobs and training grows, "
    "reclaiming training nodes above their min when no node is free",
    Reason.SLO_PEAK_AHEAD: "grow (serving): the demand forecast for one cold start ahead needs more replicas "
    "than run now; capacity is reserved before the peak",
    Reason.SLO_HEADROOM: "shrink (serving): over the whole long window latency and load stayed below "
    "serving_headroom_percent of what one replica fewer could carry, and the forecast agrees",
    Reason.SLO_MET: "hold (serving): the objective is met without enough headroom to give a replica back",
    Reason.REPLICA_WARMING: "hold (serving): the SLO is at risk but replicas added less than a cold start ago "
    "are not serving yet",
    Reason.SERVING_RECLAIM: "shrink: gives nodes above its min to a serving unit whose SLO is at risk (serving "
    "grows outrank training), through the usual grace signal",
    Reason.PREEMPTED_BY_SLURM: "shrink, recorded by the controller: Slurm preempted an extension job (state "
    "PREEMPTED); counts as a resize, so the cooldown follows",
    Reason.NODE_FAILURE: "shrink, recorded by the controller: a node under an extension job went DOWN (or the "
    "job ended NODE_FAIL); counts as a resize, so the cooldown follows",
    Reason.ACTION_IN_PROGRESS: "hold: would grow or shrink, but an earlier action of the unit is not finished "
    "(e.g. a shrink in its grace period)",
    Reason.GROW_BACKOFF: "hold: would grow, but grows of the unit failed (a prewarm failed, a resume failed, an "
    "extension sbatch was refused, or an extension job ended on its own within 600 s of submission): 60 s after "
    "the last one, doubling per failed grow in the last hour (at most 1 h)",
    Reason.POWER_RESUME_COST: "hold: would grow, no powered-on free node fits, and the expected gain over the "
    "remaining time does not pay for resuming powered-down nodes plus a restart (power_resume)",
    Reason.RESUME_FAILED: "hold, recorded by the controller: an extension job's powered-down node did not come "
    "back within ResumeTimeout; the extension job is cancelled (or Slurm ended it: ended_by), the unit keeps its "
    "size, the node is not grown onto for power_resume_backoff_s and the unit's grows back off (GROW_BACKOFF)",
    Reason.PREWARM_FAILED: "hold, recorded by the controller: a grow's --prewarm command failed or timed out on a "
    "new node; the extension job is cancelled before it joined, the unit keeps its size and its grows back off "
    "(GROW_BACKOFF)",
    Reason.COLD_START: "hold, recorded by the controller: a grow's new nodes joined; its cold start in phases "
    "(resume, start, prewarm, join), recorded as the unit's restart cost",
}


def render_reasons_markdown() -> str:
    """The reason-code table of docs/policy.md."""
    lines = ["| code | meaning |", "|---|---|"]
    lines.extend(f"| `{reason.value}` | {REASON_DOCS[reason]} |" for reason in Reason)
    return "\n".join(lines) + "\n"
