"""sshare weights, sacctmgr GPU limits and sacct final states: parsers on replies captured from the 22.05 test
cluster, and the adapter's commands (argument lists, one try, typed errors)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from slurm_elastic.slurm.accounting import (
    AssocGpuLimit,
    QosGpuLimit,
    ShareRow,
    account_weights,
    gpu_limit,
    parse_assoc_limits,
    parse_cluster_name,
    parse_qos_limits,
    parse_sacct_states,
    parse_sshare,
)
from slurm_elastic.slurm.adapter import SlurmCli
from slurm_elastic.slurm.errors import SlurmParseError, SlurmTransientError
from slurm_elastic.slurm.runner import CommandResult, RetryPolicy, SlurmCommands

CAPTURED = Path(__file__).resolve().parents[1] / "fixtures" / "slurm" / "22.05"


def captured(name: str) -> str:
    return (CAPTURED / name).read_text()


def test_sshare_rows_from_the_test_cluster() -> None:
    rows = parse_sshare(captured("sshare_all.txt"))
    assert [(r.account, r.user, r.depth) for r in rows] == [
        ("root", None, 0), ("root", "root", 1), ("nlp", None, 1), ("nlp", "alice", 2), ("vision", None, 1),
        ("vision", "bob", 2)]
    nlp = rows[2]
    assert (nlp.raw_shares, nlp.norm_shares, nlp.fair_share) == (2, 0.5, None)
    assert rows[3].fair_share == pytest.approx(0.333333)


@pytest.mark.parametrize("name", ["sshare.txt", "sshare_all.txt"])
def test_weights_are_the_accounts_normalized_shares(name: str) -> None:
    assert account_weights(parse_sshare(captured(name))) == {"nlp": 0.5, "vision": 0.25}


def test_sub_account_weights_multiply_along_the_tree() -> None:
    text = ("Account|User|RawShares|NormShares|FairShare|LevelFS\n"
            "root|||0.000000||\n"
            " physics||3|0.750000||1.0\n"
            "  theory||1|0.500000||1.0\n"
            "   theory|carol|1|1.000000|0.5|1.0\n"
            "  lab||1|0.500000||1.0\n"
            " chem||1|0.250000||1.0\n"
            "  chem|dave|1|1.000000|0.5|1.0\n"
            " zero||0|0.000000||\n")
    assert account_weights(parse_sshare(text)) == {"physics": 0.75, "theory": 0.375, "lab": 0.375, "chem": 0.25}


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", "empty output"),
        ("Account|User\nnlp|\n", "lacks RawShares, NormShares"),
        ("Account|User|RawShares|NormShares\n nlp||2|lots\n", "NormShares 'lots' is not a number"),
        ("Account|User|RawShares|NormShares\n nlp||2\n", "3 columns"),
        ("Account|User|RawShares|NormShares\n  |alice|1|1.0\n", "row without an account"),
    ],
)
def test_sshare_garbage_is_a_parse_error(text: str, error: str) -> None:
    with pytest.raises(SlurmParseError, match=error):
        parse_sshare(text)


def test_sshare_column_order_follows_the_header() -> None:
    rows = parse_sshare("User|NormShares|Account|RawShares\n|0.6| a|3\nx|1.0|  a|1\n")
    assert rows == (ShareRow("a", None, 1, 3, 0.6, None, None), ShareRow("a", "x", 2, 1, 1.0, None, None))


@pytest.mark.parametrize(
    ("tres", "gpus"),
    [("", None), ("gres/gpu=8", 8), ("cpu=64,gres/gpu=6", 6), ("cpu=4,mem=10G", None), ("gres/gpu:a100=4", None),
     ("gres/gpu=-1", None), ("gres/gpu=0", 0), ("gres/gpumem=100,gres/gpu=2", 2)],
)
def test_gpu_limit_of_a_tres_string(tres: str, gpus: int | None) -> None:
    assert gpu_limit(tres) == gpus


def test_gpu_limit_not_a_number() -> None:
    with pytest.raises(SlurmParseError, match="not a whole number"):
        gpu_limit("gres/gpu=lots")


def test_association_limits_from_the_test_cluster() -> None:
    assert parse_assoc_limits(captured("sacctmgr_assoc.txt"), "elastic") == (
        AssocGpuLimit("vision", None, None, 8), AssocGpuLimit("vision", "bob", None, 6))
    assert parse_assoc_limits(captured("sacctmgr_assoc.txt"), "other") == ()
    assert len(parse_assoc_limits(captured("sacctmgr_assoc.txt"))) == 2


def test_qos_limits_from_the_test_cluster() -> None:
    assert parse_qos_limits(captured("sacctmgr_qos.txt")) == (QosGpuLimit("scavenger", 4, 2, 3),)


def test_sacctmgr_rows_with_a_trailing_separator_and_wrong_widths() -> None:
    assert parse_qos_limits("high|gres/gpu=2|||\n") == (QosGpuLimit("high", 2, None, None),)
    with pytest.raises(SlurmParseError, match="2 columns"):
        parse_qos_limits("high|gres/gpu=2\n")
    with pytest.raises(SlurmParseError, match="expected 6"):
        parse_assoc_limits("elastic|nlp\n")


def test_cluster_name() -> None:
    assert parse_cluster_name(captured("scontrol_show_config.txt")) == "elastic"
    assert parse_cluster_name("SlurmctldPort = 6817\n") is None


def test_sacct_final_states() -> None:
    """Captured: ``sacct -n -P -X -o JobID,State -j 556,199,39,15,19,999999`` (999999 unknown: no row). A job
    resized in place has a RESIZING row before its final one; het components (19+0) are not plain jobs."""
    assert parse_sacct_states(captured("sacct_states.txt")) == {
        15: "COMPLETED", 39: "CANCELLED", 199: "NODE_FAIL", 556: "PREEMPTED"}
    assert parse_sacct_states("") == {}
    assert parse_sacct_states("7|PREEMPTED|\n") == {7: "PREEMPTED"}  # a trailing separator
    with pytest.raises(SlurmParseError, match="sacct: 4 columns"):
        parse_sacct_states("7|PREEMPTED|x|\n")
    with pytest.raises(SlurmParseError, match="empty State"):
        parse_sacct_states("7|\n")


class Runner:
    """Answers each command with a captured reply; records argv and the timeout it ran under."""

    def __init__(self, replies: Mapping[str, str], fail: str | None = None) -> None:
        self.replies = replies
        self.fail = fail
        self.calls: list[tuple[tuple[str, ...], float]] = []

    def __call__(self, argv: Sequence[str], *, timeout: float, input_text: str | None,
                 env: Mapping[str, str] | None) -> CommandResult:
        self.calls.append((tuple(argv), timeout))
        key = f"sacctmgr {argv[4]}" if argv[0] == "sacctmgr" else argv[0]
        if self.fail is not None and argv[0] == self.fail:
            return CommandResult(tuple(argv), 1, "", "sshare: error: Unable to contact slurm controller")
        return CommandResult(tuple(argv), 0, self.replies[key], "")


REPLIES = {
    "sshare": captured("sshare.txt"),
    "scontrol": captured("scontrol_show_config.txt"),
    "sacctmgr assoc": captured("sacctmgr_assoc.txt"),
    "sacctmgr qos": captured("sacctmgr_qos.txt"),
    "sacct": captured("sacct_states.txt"),
}


def test_adapter_reads_weights_and_limits_with_argument_lists() -> None:
    runner = Runner(REPLIES)
    cli = SlurmCli(SlurmCommands(runner=runner, env={}))
    assert cli.account_shares() == {"nlp": 0.5, "vision": 0.25}
    limits = cli.gpu_limits()
    assert limits.assocs == (AssocGpuLimit("vision", None, None, 8), AssocGpuLimit("vision", "bob", None, 6))
    assert limits.qos == (QosGpuLimit("scavenger", 4, 2, 3),)
    cli.gpu_limits()
    argvs = [argv for argv, _ in runner.calls]
    assert argvs[0] == ("sshare", "-P", "-o", "Account,User,RawShares,NormShares,FairShare,LevelFS")
    assert ("sacctmgr", "-n", "-P", "show", "assoc", "format=Cluster,Account,User,Partition,ParentName,GrpTRES") \
        in argvs
    assert ("sacctmgr", "-n", "-P", "show", "qos", "format=Name,GrpTRES,MaxTRESPerUser,MaxTRESPerAccount") in argvs
    assert sum(1 for a in argvs if a[0] == "scontrol") == 1  # ClusterName read once
    assert all(t == SlurmCli.ACCOUNTING_TIMEOUT_S for _, t in runner.calls)


def test_adapter_reads_final_states_in_one_sacct_call() -> None:
    runner = Runner(REPLIES)
    cli = SlurmCli(SlurmCommands(runner=runner, env={}))
    assert cli.final_states([]) == {} and runner.calls == []  # nothing to ask
    assert cli.final_states([556, 199, 556])[556] == "PREEMPTED"
    ((argv, timeout),) = runner.calls
    assert argv == ("sacct", "-n", "-P", "-X", "-o", "JobID,State", "-j", "199,556")
    assert timeout == SlurmCli.ACCOUNTING_TIMEOUT_S


def test_adapter_tries_accounting_reads_once_and_raises_typed_errors() -> None:
    runner = Runner(REPLIES, fail="sshare")
    slept: list[float] = []
    cli = SlurmCli(SlurmCommands(runner=runner, env={}, retry=RetryPolicy(attempts=4), sleep=slept.append))
    with pytest.raises(SlurmTransientError, match="Unable to contact"):
        cli.account_shares()
    assert len(runner.calls) == 1 and slept == []
