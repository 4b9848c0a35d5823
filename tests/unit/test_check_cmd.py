"""``slurm-elastic check SCRIPT`` through the real command group (so the registration is tested too)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from slurm_elastic.cli import main

GOOD = ("#!/bin/bash\n#SBATCH -N 2\n#ELASTIC --min-nodes 1 --max-nodes=3 --window 1h30m --signal SIGusr2\n"
        "trap 'echo checkpoint' SIGUSR2\nsrun x\n")
BAD = "#!/bin/bash\n#ELASTIC --min-nodes 4 --max-nodes 2\n#ELASTIC --window 5 --frobnicate\nsrun x\n"


def _write(tmp_path: Path, text: str | bytes, name: str = "job.sh") -> Path:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def test_clean_script_prints_the_normalized_spec(tmp_path: Path) -> None:
    script = _write(tmp_path, GOOD)
    r = CliRunner().invoke(main, ["check", str(script)])
    assert r.exit_code == 0, r.output
    assert r.stdout == "elastic:v1 min=1 max=3 window=5400 signal=USR2\n"
    assert r.stderr == ""


def test_bad_script_one_line_per_error_on_stderr(tmp_path: Path) -> None:
    script = _write(tmp_path, BAD)
    r = CliRunner().invoke(main, ["check", str(script)])
    assert r.exit_code == 1
    assert r.stdout == ""
    assert r.stderr.splitlines() == [
        f"{script}:2: --max-nodes: 2 is below --min-nodes 4, set on line 2 (allowed: 4..65536)",
        f"{script}:3: --window: '5' is out of range (allowed: 10s..1d)",
        f"{script}:3: --frobnicate: unknown option (allowed: --min-nodes, --max-nodes, --step, --scale-up-above, "
        "--scale-down-below, --window, --cooldown, --grace, --signal, --het-group, --no-grow, --no-shrink, "
        "--serving, --slo-p99, --target-rps-per-replica, --prewarm, --prewarm-timeout, --whole-nodes)",
    ]


def test_warnings_do_not_fail_the_check(tmp_path: Path) -> None:
    script = _write(tmp_path, "#!/bin/bash\n#ELASTIC --max-nodes 2\ntrap : USR1\nsrun x\n#ELASTIC --step 2\n")
    r = CliRunner().invoke(main, ["check", str(script)])
    assert r.exit_code == 0
    assert r.stdout == "elastic:v1 max=2\n"
    assert r.stderr == (f"{script}:5: warning: ignored: #ELASTIC lines after the first command (line 3) "
                        "are not read\n")


def test_script_without_directives(tmp_path: Path) -> None:
    script = _write(tmp_path, "#!/bin/bash\nsrun x\n")
    r = CliRunner().invoke(main, ["check", str(script)])
    assert r.exit_code == 0
    assert r.stdout == f"{script}: no #ELASTIC directives: the job is not elastic\n"


def test_het_groups_print_one_spec_each(tmp_path: Path) -> None:
    script = _write(tmp_path, "#ELASTIC --window 5m\n#ELASTIC --het-group 2 --max-nodes 4\n#ELASTIC --het-group 0\n")
    r = CliRunner().invoke(main, ["check", str(script)])
    assert r.exit_code == 0
    assert r.stdout.splitlines() == ["elastic:v1 het=0 window=300", "elastic:v1 het=2 max=4 window=300"]


def test_json_output(tmp_path: Path) -> None:
    script = _write(tmp_path, BAD)
    r = CliRunner().invoke(main, ["check", "--json", str(script)])
    assert r.exit_code == 1
    doc = json.loads(r.stdout)
    assert doc["ok"] is False and doc["elastic"] is False and doc["specs"] == []
    assert [(e["line"], e["option"]) for e in doc["errors"]] == [(2, "--max-nodes"), (3, "--window"),
                                                                  (3, "--frobnicate")]
    assert doc["errors"][1]["allowed"] == "10s..1d"
    r = CliRunner().invoke(main, ["check", "--json", str(_write(tmp_path, GOOD, "good.sh"))])
    assert r.exit_code == 0
    doc = json.loads(r.stdout)
    assert doc["ok"] and doc["elastic"]
    assert doc["specs"][0]["normalized"] == "elastic:v1 min=1 max=3 window=5400 signal=USR2"
    assert doc["specs"][0]["explicit"] == ["max_nodes", "min_nodes", "signal", "window_s"]
    assert doc["specs"][0]["cooldown_s"] == 300


def test_stdin_and_binary_input() -> None:
    r = CliRunner().invoke(main, ["check", "-"], input=b"#ELASTIC --max-nodes 3\xff\n")
    assert r.exit_code == 1
    assert r.stderr == "stdin:1: --max-nodes: '3\\xff' is not a whole number (allowed: 1..65536)\n"


def test_unreadable_script_is_one_clear_error(tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["check", str(tmp_path / "missing.sh")])
    assert r.exit_code == 1
    assert r.stderr.startswith("slurm-elastic check: error: cannot read ")
    assert len(r.stderr.splitlines()) == 1


def test_usage_error_exit_2() -> None:
    r = CliRunner().invoke(main, ["check"])
    assert r.exit_code == 2


def test_installed_entry_point(tmp_path: Path) -> None:
    script = _write(tmp_path, GOOD)
    exe = Path(sys.executable).with_name("slurm-elastic")
    proc = subprocess.run([str(exe), "check", str(script)], capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "elastic:v1 min=1 max=3 window=5400 signal=USR2\n"


def test_a_script_without_a_handler_for_its_grace_signal_is_warned_about(tmp_path: Path) -> None:
    """`scancel --signal=USR1 --full` at a shrink kills a batch shell without a trap (FAILED 0:10)."""
    bare = _write(tmp_path, "#!/bin/bash\n#ELASTIC --min-nodes 1 --max-nodes 3\nsrun x\n")
    r = CliRunner().invoke(main, ["check", str(bare)])
    assert r.exit_code == 0 and "no handler for the grace signal SIGUSR1" in r.stderr
    assert "trap 'echo checkpoint' USR1" in r.stderr
    for handled in ("trap 'echo ckpt' USR1 TERM", "trap handler SIGUSR1", "trap - 10"):
        script = _write(tmp_path, f"#!/bin/bash\n#ELASTIC --max-nodes 3\n{handled}\nsrun x\n", "ok.sh")
        assert CliRunner().invoke(main, ["check", str(script)]).stderr == "", handled
    other = _write(tmp_path, "#!/bin/bash\n#ELASTIC --max-nodes 3 --signal USR2\ntrap 'x' USR1\nsrun x\n", "o.sh")
    assert "SIGUSR2" in CliRunner().invoke(main, ["check", str(other)]).stderr  # a trap for another signal
    never = _write(tmp_path, "#!/bin/bash\n#ELASTIC --max-nodes 3 --no-shrink\nsrun x\n", "n.sh")
    assert CliRunner().invoke(main, ["check", str(never)]).stderr == ""  # never shrinks: never signalled
    py = _write(tmp_path, "#!/usr/bin/env python3\n#ELASTIC --max-nodes 3\nimport signal\n"
                "signal.signal(signal.SIGUSR1, lambda *a: None)\n", "p.py")
    assert CliRunner().invoke(main, ["check", str(py)]).stderr == ""
    doc = json.loads(CliRunner().invoke(main, ["check", "--json", str(bare)]).stdout)
    assert len(doc["pitfalls"]) == 1


def test_the_prewarm_command_prints_as_text_not_hex(tmp_path: Path) -> None:
    script = _write(tmp_path, "#!/bin/bash\n#ELASTIC --max-nodes 3 --prewarm 'stage --to /tmp/x'\ntrap : USR1\n"
                              "srun x\n")
    r = CliRunner().invoke(main, ["check", str(script)])
    assert r.exit_code == 0 and r.stdout == "elastic:v1 max=3 prewarm='stage --to /tmp/x'\n", r.output


UP30 = "#!/bin/bash\n#SBATCH -p train -A nlp\n#ELASTIC --scale-up-above 30\ntrap : USR1\nsrun x\n"


def test_a_threshold_alone_meets_the_packaged_band_not_the_directive_default(tmp_path: Path) -> None:
    """The bug this guards: `--scale-up-above 30` was refused ("not above --scale-down-below 40, the default") while
    the packaged policy's band is 20..90, so the job would have run with 20..30."""
    script = _write(tmp_path, UP30)
    r = CliRunner().invoke(main, ["check", str(script)])
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines() == [
        "elastic:v1 up=30",
        "  band 20..30%: scale_down_below 20 (packaged default), scale_up_above 30 (script); partition train, "
        "account nlp",
    ]


def test_a_threshold_alone_is_compared_with_the_sites_policy_for_its_partition(tmp_path: Path) -> None:
    script = _write(tmp_path, UP30)
    policy = _write(tmp_path, "version = 1\n[partition.train]\nscale_down_below = 35\n", "policy.toml")
    r = CliRunner().invoke(main, ["check", str(script), "--policy", str(policy)])
    assert r.exit_code == 1
    assert r.stderr.splitlines() == [
        f"{script}: --scale-up-above: 30 is not above scale_down_below 35 (policy: partition train) for partition "
        "train, account nlp: the controller would hold the job (INVALID_SETTINGS) and never resize it"]
    # another partition keeps the packaged 20: fine
    r = CliRunner().invoke(main, ["check", str(script), "--policy", str(policy), "--partition", "serve"])
    assert r.exit_code == 0, r.output
    doc = json.loads(CliRunner().invoke(main, ["check", str(script), "--policy", str(policy), "--json"]).stdout)
    assert doc["ok"] is False and doc["bands"][0]["scale_down_below.source"] == "partition train"
    assert len(doc["policy_errors"]) == 1


def test_check_names_the_packaged_default_it_compared_with(tmp_path: Path) -> None:
    """A threshold alone that misses the packaged band names the packaged default (90 here), not a directive
    table default."""
    script = _write(tmp_path, "#!/bin/bash\n#ELASTIC --scale-down-below 95\ntrap : USR1\nsrun x\n")
    r = CliRunner().invoke(main, ["check", str(script)])
    assert r.exit_code == 1
    assert r.stderr.splitlines() == [
        f"{script}: --scale-down-below: 95 is not below scale_up_above 90 (policy: packaged default) for any "
        "partition and account: the controller would hold the job (INVALID_SETTINGS) and never resize it"]
