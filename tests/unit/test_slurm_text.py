"""Hostlists, GRES strings, scontrol one-liners and the command runner's error handling."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from slurm_elastic.slurm import hostlist
from slurm_elastic.slurm.errors import (
    SlurmCommandError,
    SlurmJobNotFoundError,
    SlurmParseError,
    SlurmPermissionError,
    SlurmTransientError,
)
from slurm_elastic.slurm.gres import parse_gres, parse_tres_per_node
from slurm_elastic.slurm.model import GresCount
from slurm_elastic.slurm.runner import CommandResult, RetryPolicy, SlurmCommands
from slurm_elastic.slurm.scontrol_text import parse_partitions


@pytest.mark.parametrize(
    "expr,hosts",
    [
        ("n1", ("n1",)),
        ("n[1-3]", ("n1", "n2", "n3")),
        ("n[1-2,5],x", ("n1", "n2", "n5", "x")),
        ("gpu[08-10]", ("gpu08", "gpu09", "gpu10")),
        ("r[1-2]n[1-2]", ("r1n1", "r1n2", "r2n1", "r2n2")),
        ("", ()),
    ],
)
def test_hostlist_expand(expr: str, hosts: tuple[str, ...]) -> None:
    assert hostlist.expand(expr) == hosts


@pytest.mark.parametrize(
    "hosts", [["n1", "n2", "n3"], ["n1", "n3"], ["gpu08", "gpu09", "gpu10"], ["a", "n1"]]
)
def test_hostlist_round_trip(hosts: list[str]) -> None:
    assert list(hostlist.expand(hostlist.compress(hosts))) == hosts


@pytest.mark.parametrize("bad", ["n[1-", "n]1[", "n[a-b]", "n[5-1]", "n[0-99999999]"])
def test_hostlist_rejects(bad: str) -> None:
    with pytest.raises(SlurmParseError):
        hostlist.expand(bad)


def test_gres_forms() -> None:
    assert parse_gres("gpu:4,mps:400") == (GresCount("gpu", None, 4), GresCount("mps", None, 400))
    assert parse_gres("gpu:(null):4(IDX:0-3),mps:(null):0(IDX:N/A)") == (
        GresCount("gpu", None, 4),
        GresCount("mps", None, 0),
    )
    assert parse_gres("gpu:l40s:4(S:0-1),tmpsize:7T") == (
        GresCount("gpu", "l40s", 4),
        GresCount("tmpsize", None, 7 * 1024**4),
    )
    assert parse_gres("N/A") == () and parse_gres(None) == ()
    assert parse_tres_per_node("gres:gpu:2") == (GresCount("gpu", None, 2),)
    assert parse_tres_per_node("cpu=4,gres/gpu:a100:1") == (GresCount("gpu", "a100", 1),)


def test_partitions_text() -> None:
    text = (
        "PartitionName=train AllowGroups=ALL Default=YES Nodes=n[1-4] PriorityTier=1 State=UP\n"
        "PartitionName=serve Default=NO Nodes=n[3-4] PriorityTier=10 State=UP\n"
    )
    train, serve = parse_partitions(text)
    assert train.is_default and train.nodes == ("n1", "n2", "n3", "n4") and train.priority_tier == 1
    assert not serve.is_default and serve.nodes == ("n3", "n4") and serve.priority_tier == 10


class ScriptedRunner:
    """Plays back command results; records the argv it was given."""

    def __init__(self, results: list[CommandResult]) -> None:
        self.results = results
        self.calls: list[tuple[str, ...]] = []

    def __call__(
        self, argv: Sequence[str], *, timeout: float, input_text: str | None, env: Mapping[str, str] | None
    ) -> CommandResult:
        self.calls.append(tuple(argv))
        return self.results.pop(0)


def _res(rc: int, err: str = "", out: str = "") -> CommandResult:
    return CommandResult(("scontrol", "update"), rc, out, err)


def test_transient_errors_are_retried_with_backoff() -> None:
    sleeps: list[float] = []
    runner = ScriptedRunner(
        [
            _res(1, "Job update not available right now, the DB index is being set"),
            _res(1, "slurm_update error: Socket timed out on send/recv operation"),
            _res(0, out="ok"),
        ]
    )
    cmds = SlurmCommands(
        env={}, runner=runner, sleep=sleeps.append, retry=RetryPolicy(attempts=4, first_delay=1)
    )
    assert cmds.run(["scontrol", "update"]).stdout == "ok"
    assert len(runner.calls) == 3 and sleeps == [1, 2]


def test_transient_error_raised_after_last_attempt() -> None:
    runner = ScriptedRunner([_res(1, "Unable to contact slurm controller (connect failure)")] * 3)
    cmds = SlurmCommands(env={}, runner=runner, sleep=lambda s: None, retry=RetryPolicy(attempts=3))
    with pytest.raises(SlurmTransientError, match="Unable to contact"):
        cmds.run(["squeue"])
    assert len(runner.calls) == 3


@pytest.mark.parametrize(
    "message,error",
    [
        ("Invalid job id specified", SlurmJobNotFoundError),
        ("Access/permission denied", SlurmPermissionError),
        ("Requested node configuration is not available", SlurmCommandError),
    ],
)
def test_permanent_errors_are_not_retried(message: str, error: type[Exception]) -> None:
    runner = ScriptedRunner([_res(1, message)])
    cmds = SlurmCommands(env={}, runner=runner, sleep=lambda s: None)
    with pytest.raises(error) as exc:
        cmds.run(["scontrol", "update"])
    assert len(runner.calls) == 1
    assert isinstance(exc.value, SlurmCommandError) and exc.value.message == message
    assert not isinstance(exc.value, SlurmTransientError)


def test_real_timeout_kills_and_raises() -> None:
    cmds = SlurmCommands(env={"PATH": "/usr/bin:/bin"}, retry=RetryPolicy(attempts=1))
    with pytest.raises(SlurmTransientError, match="timed out"):
        cmds.run(["sleep", "5"], timeout=0.2)


def test_missing_command_is_a_typed_error() -> None:
    cmds = SlurmCommands(env={"PATH": "/nonexistent"}, retry=RetryPolicy(attempts=1))
    with pytest.raises(SlurmCommandError, match="command not found"):
        cmds.run(["squeue-does-not-exist"])


def test_invalid_utf8_from_slurm_is_replaced_not_fatal() -> None:
    # A user can put any byte in a job comment and squeue --json passes it through verbatim.
    cmds = SlurmCommands(env={"PATH": "/usr/bin:/bin"}, retry=RetryPolicy(attempts=1))
    out = cmds.run(["printf", '{"comment": "c\\377"}']).stdout
    assert out == '{"comment": "c\ufffd"}'
