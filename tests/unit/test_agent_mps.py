"""The agent's MPS report: per GPU with a prolog directory, the daemon's state from get_server_list (the fake
nvidia-cuda-mps-control), the jobs and the newest job's share; carried in the v1 payload as an additive field."""

from __future__ import annotations

import subprocess
from pathlib import Path

from slurm_elastic.agent.mps import MpsReader
from slurm_elastic.agent.payload import MpsGpuReport, parse_payload_bytes, to_json_bytes
from tests.unit.test_agent_auth import report

FAKE = Path(__file__).resolve().parents[1] / "fakes" / "nvidia-cuda-mps-control"


def fake(d: Path, *args: str, stdin: str = "") -> None:
    subprocess.run([str(FAKE), *args], input=stdin, text=True, check=False, timeout=30,
                   env={"CUDA_MPS_PIPE_DIRECTORY": str(d / "pipe"), "CUDA_MPS_LOG_DIRECTORY": str(d / "log")})


def test_running_and_stopped_daemons(tmp_path: Path) -> None:
    base = tmp_path / "n1"
    g0, g2 = base / "gpu0", base / "gpu2"
    for d in (g0, g2):
        (d / "jobs").mkdir(parents=True)
    fake(g0, "-d")
    fake(g0, stdin="start_server -uid 1001\n")
    (g0 / "jobs" / "42").write_text("1001 50\n")
    reports = MpsReader(tmp_path, "n1", str(FAKE)).read()
    assert [(r.gpu, r.daemon, r.servers, r.jobs, r.active_thread_percentage) for r in reports] == [
        (0, "running", (11001,), (42,), 50), (2, "stopped", (), (), None)]
    assert reports[0].pipe_dir == str(g0 / "pipe")


def test_no_directory_no_report_and_a_missing_binary_is_an_error(tmp_path: Path) -> None:
    assert MpsReader(tmp_path, "n9", str(FAKE)).read() == ()
    (tmp_path / "n1" / "gpu1").mkdir(parents=True)
    (r,) = MpsReader(tmp_path, "n1", str(tmp_path / "nope")).read()
    assert (r.daemon, r.error) == ("error", f"{tmp_path / 'nope'} not found")


def test_the_payload_carries_mps_and_older_payloads_parse() -> None:
    mps = (MpsGpuReport(0, "running", "/run/mps/n1/gpu0/pipe", (11001,), (42,), 50, None),)
    r = report()
    with_mps = type(r)(**{**r.__dict__, "mps": mps})
    assert parse_payload_bytes(to_json_bytes(with_mps)).mps == mps
    assert parse_payload_bytes(to_json_bytes(r)).mps == ()
    old = to_json_bytes(r).replace(b',"mps":[]', b"")
    assert b'"mps"' not in old and parse_payload_bytes(old).mps == ()
