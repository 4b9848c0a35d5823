"""plugins/job_submit.lua inside the real slurmctld (JobSubmitPlugins=lua; 22.05, and 24.11 and 26.05 in the
release subset): sbatch rejects bad #ELASTIC directives with the clear message, good ones land on the job as the
normalized admin_comment.

Jobs are submitted held (--hold), so these tests never take nodes from other tests; each cancels its own jobs.
"""

from __future__ import annotations

import filecmp
import shutil
from collections.abc import Iterator

import pytest

from slurm_elastic.directives import parse_script
from slurm_elastic.slurm.decode import parse_squeue
from slurm_elastic.slurm.model import Job
from tests.cluster.harness import REPO, TestCluster

PLUGIN = REPO / "plugins" / "job_submit.lua"

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module", autouse=True)
def current_plugin(cluster: TestCluster) -> None:
    """The cluster copies the plugin at start; refresh it (slurmctld re-reads job_submit.lua when it changes)."""
    install_plugin(cluster)


def install_plugin(cluster: TestCluster) -> None:
    target = cluster.root / "etc" / "job_submit.lua"
    if not target.exists() or not filecmp.cmp(PLUGIN, target, shallow=False):
        tmp = target.with_name("job_submit.lua.new")
        shutil.copyfile(PLUGIN, tmp)
        tmp.chmod(0o755)
        tmp.replace(target)


@pytest.fixture
def submitted(cluster: TestCluster) -> Iterator[list[int]]:
    """Job ids a test submitted; cancelled afterwards."""
    ids: list[int] = []
    yield ids
    cluster.cancel(*ids)


def _sbatch(cluster: TestCluster, script: str, *args: str, user: str | None = None) -> tuple[int, str, str]:
    cp = cluster.run(["sbatch", "--parsable", "--hold", "--chdir=/tmp", "--output=/dev/null", *args],
                     user=user, input_text=script, timeout=60)
    return cp.returncode, cp.stdout, cp.stderr


def _records(cluster: TestCluster, job_id: int) -> list[Job]:
    """The adapter's view of a job, or of every component of a het job, from ``squeue --json`` (any release:
    24.11 and later give numbers such as het_job_offset as {set, infinite, number} objects)."""
    _, jobs = parse_squeue(cluster.squeue_json())
    return [j for j in jobs if job_id in (j.job_id, j.het_job_id)]


BAD = """#!/bin/bash
#SBATCH -N 1
#ELASTIC --min-nodes 4 --max-nodes 2
#ELASTIC --signal KILL --window 5
hostname
"""


def test_bad_directives_rejected_by_sbatch_with_clear_messages(cluster: TestCluster) -> None:
    rc, out, err = _sbatch(cluster, BAD, "--job-name=elastic-bad-directive")
    assert rc != 0 and out.strip() == ""
    assert "slurm-elastic: job rejected: invalid #ELASTIC directives" in err
    # Exactly the lines `slurm-elastic check` prints for the same script.
    for e in parse_script(BAD).errors:
        assert f"slurm-elastic: line {e.line}: {e.describe()}" in err
    assert "slurm-elastic: line 3: --max-nodes: 2 is below --min-nodes 4, set on line 3 (allowed: 4..65536)" in err
    assert "slurm-elastic: line 4: --signal: SIGKILL can not be caught" in err
    names = cluster.run(["squeue", "--all", "-h", "-o", "%j"]).stdout.split()
    assert "elastic-bad-directive" not in names


GOOD = """#!/bin/bash
#SBATCH -N 1
#ELASTIC --min-nodes 1 --max-nodes=3 --window 1h30m --signal SIGusr2
#ELASTIC --no-grow   # shrink only
hostname
"""


def test_good_directives_land_as_normalized_admin_comment(cluster: TestCluster, submitted: list[int]) -> None:
    rc, out, err = _sbatch(cluster, GOOD, user="alice")
    assert rc == 0, err
    job_id = int(out.strip().split(";")[0])
    submitted.append(job_id)
    (expected,) = [s.to_normalized() for s in parse_script(GOOD).specs]
    assert expected == "elastic:v1 min=1 max=3 window=5400 signal=USR2 grow=0"
    (record,) = _records(cluster, job_id)
    assert record.admin_comment == f"[{expected}]"
    shown = cluster.run(["scontrol", "show", "job", str(job_id)], check=True).stdout
    assert f"AdminComment=[{expected}]" in shown


def test_warnings_are_shown_and_the_job_accepted(cluster: TestCluster, submitted: list[int]) -> None:
    script = "#!/bin/bash\n# ELASTIC --max-nodes 3\n#ELASTIC --max-nodes 2\nhostname\n#ELASTIC --step 2\n"
    rc, out, err = _sbatch(cluster, script, user="bob")
    assert rc == 0, err
    submitted.append(int(out.strip().split(";")[0]))
    assert ("slurm-elastic: warning: line 2: ignored: looks like a directive, but only lines that start with "
            "'#ELASTIC' are read") in err
    assert "slurm-elastic: warning: line 5: ignored: #ELASTIC lines after the first command (line 4)" in err
    (record,) = _records(cluster, submitted[0])
    assert record.admin_comment == "[elastic:v1 max=2]"


def test_jobs_without_directives_are_untouched(cluster: TestCluster, submitted: list[int]) -> None:
    rc, out, err = _sbatch(cluster, "#!/bin/bash\n#SBATCH -N 1\nhostname\n")
    assert rc == 0, err
    submitted.append(int(out.strip().split(";")[0]))
    (record,) = _records(cluster, submitted[0])
    assert record.admin_comment == ""
    assert "slurm-elastic" not in err


HET = """#!/bin/bash
#SBATCH -N 1
#SBATCH hetjob
#SBATCH -N 1
#ELASTIC --window 5m
#ELASTIC --het-group 1 --max-nodes 2
srun hostname
"""


def test_het_job_component_gets_its_group_spec(cluster: TestCluster, submitted: list[int]) -> None:
    rc, out, err = _sbatch(cluster, HET)
    assert rc == 0, err
    leader = int(out.strip().split(";")[0])
    submitted.append(leader)
    by_offset = {r.het_job_offset: r for r in _records(cluster, leader)}
    assert set(by_offset) == {0, 1}
    assert by_offset[0].admin_comment == ""
    assert by_offset[1].admin_comment == "[elastic:v1 het=1 max=2 window=300]"


def test_het_group_on_an_ordinary_job_is_rejected(cluster: TestCluster) -> None:
    rc, _, err = _sbatch(cluster, "#!/bin/bash\n#ELASTIC --het-group 1 --max-nodes 2\nhostname\n")
    assert rc != 0
    assert "slurm-elastic: line 2: --het-group: the job is not heterogeneous" in err


def test_admin_edit_of_admin_comment_keeps_the_spec(cluster: TestCluster, submitted: list[int]) -> None:
    rc, out, err = _sbatch(cluster, GOOD)
    assert rc == 0, err
    job_id = int(out.strip().split(";")[0])
    submitted.append(job_id)
    cp = cluster.run(["scontrol", "update", f"JobId={job_id}", "AdminComment=ops: watch this one"])
    assert cp.returncode == 0, cp.stderr
    (record,) = _records(cluster, job_id)
    assert record.admin_comment == "ops: watch this one [elastic:v1 min=1 max=3 window=5400 signal=USR2 grow=0]"
    cp = cluster.run(["scontrol", "update", f"JobId={job_id}", "AdminComment=[elastic:off]"])
    assert cp.returncode == 0, cp.stderr
    (record,) = _records(cluster, job_id)
    assert record.admin_comment == "[elastic:off]"
