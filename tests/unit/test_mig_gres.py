"""Slurm GRES for MIG layouts: gres.conf lines, node Gres= counts, type names, device files."""

from __future__ import annotations

import pytest

from slurm_elastic.mig.catalog import load_catalog
from slurm_elastic.mig.errors import GresRenderError
from slurm_elastic.mig.gres import (
    NvidiaCapsFiles,
    TemplateFiles,
    gres_counts,
    gres_devices,
    parse_mig_minors,
    profile_for_slurm_type,
    render_gres_conf,
    render_node_gres,
    slurm_autodetect_type,
    slurm_type_for_profile,
)
from slurm_elastic.mig.model import GpuState, MigInstance, Placement

CATALOG = load_catalog()
TEST_CLUSTER_FILES = TemplateFiles("/var/tmp/slurm-elastic-cluster/dev/{node}/gpu{ordinal}")


def node_state() -> list[GpuState]:
    return [
        GpuState(
            0,
            "H100-80GB",
            True,
            (MigInstance("3g.40gb", Placement(4, 4), 2, 0), MigInstance("3g.40gb", Placement(0, 4), 1, 0)),
        ),
        GpuState(
            1,
            "H100-80GB",
            True,
            (
                MigInstance("4g.40gb", Placement(0, 4), 1, 0),
                MigInstance("2g.20gb", Placement(4, 2), 2, 0),
                MigInstance("1g.10gb+me", Placement(6, 1), 3, 0),
            ),
        ),
        GpuState(2, "H100-80GB", False),
    ]


def test_gres_conf_for_the_test_cluster() -> None:
    devices = gres_devices("n4", node_state(), {2: "h100"}, TEST_CLUSTER_FILES)
    assert render_gres_conf("n4", devices) == (
        "NodeName=n4 Name=gpu Type=3g.40gb File=/var/tmp/slurm-elastic-cluster/dev/n4/gpu0\n"
        "NodeName=n4 Name=gpu Type=3g.40gb File=/var/tmp/slurm-elastic-cluster/dev/n4/gpu1\n"
        "NodeName=n4 Name=gpu Type=4g.40gb File=/var/tmp/slurm-elastic-cluster/dev/n4/gpu2\n"
        "NodeName=n4 Name=gpu Type=2g.20gb File=/var/tmp/slurm-elastic-cluster/dev/n4/gpu3\n"
        "NodeName=n4 Name=gpu Type=1g.10gb_me File=/var/tmp/slurm-elastic-cluster/dev/n4/gpu4\n"
        "NodeName=n4 Name=gpu Type=h100 File=/var/tmp/slurm-elastic-cluster/dev/n4/gpu5\n"
    )
    assert (
        render_node_gres(devices) == "gpu:3g.40gb:2,gpu:4g.40gb:1,gpu:2g.20gb:1,gpu:1g.10gb_me:1,gpu:h100:1"
    )
    assert render_node_gres(devices, extra=["mps:100"]).endswith(",gpu:h100:1,mps:100")
    assert gres_counts(devices)[0] == ("3g.40gb", 2)


def test_gres_conf_for_real_mig_devices() -> None:
    minors = parse_mig_minors(
        "config 1\nmonitor 2\n"
        "gpu0/gi1/access 21\ngpu0/gi1/ci0/access 22\n"
        "gpu0/gi2/access 30\ngpu0/gi2/ci0/access 31\n"
    )
    assert minors["gpu0/gi2/ci0/access"] == 31
    devices = gres_devices("gpu07", node_state()[:1], {}, NvidiaCapsFiles(minors))
    assert render_gres_conf("gpu07", devices, autodetect_off=True) == (
        "NodeName=gpu07 AutoDetect=off\n"
        "NodeName=gpu07 Name=gpu Type=3g.40gb "
        "MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/nvidia-cap21,/dev/nvidia-caps/nvidia-cap22\n"
        "NodeName=gpu07 Name=gpu Type=3g.40gb "
        "MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/nvidia-cap30,/dev/nvidia-caps/nvidia-cap31\n"
    )
    whole = gres_devices("gpu07", [GpuState(3, "H100-80GB", False)], {3: "h100"}, NvidiaCapsFiles({}, {3: 5}))
    assert render_gres_conf("gpu07", whole) == "NodeName=gpu07 Name=gpu Type=h100 File=/dev/nvidia5\n"


def test_missing_instance_ids_or_minors_are_errors() -> None:
    planned = [GpuState(0, "H100-80GB", True, (MigInstance("7g.80gb", Placement(0, 8)),))]
    with pytest.raises(GresRenderError, match="n1 GPU 0: 7g.80gb@0:8 has no GPU/compute instance id yet"):
        gres_devices("n1", planned, {}, NvidiaCapsFiles({}))
    with pytest.raises(GresRenderError, match="no gpu0/gi1/access in mig-minors"):
        gres_devices("n1", node_state()[:1], {}, NvidiaCapsFiles({}))
    with pytest.raises(GresRenderError, match="mig-minors line 1: expected '<path> <minor>'"):
        parse_mig_minors("gpu0/gi1/access twenty\n")


def test_whole_gpu_needs_a_type() -> None:
    # slurm.conf(5): a node may not have both typed and untyped GRES of one name.
    with pytest.raises(GresRenderError, match="n4 GPU 2: no Slurm type for the whole GPU"):
        gres_devices("n4", node_state(), {}, TEST_CLUSTER_FILES)


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("/dev/{node}/{gpu_index}", "unknown field {gpu_index}"),
        ("/dev/{node!r}", "unknown field {node}"),
        ("/dev/{node", "bad device file template"),
        ("dev/{node}/gpu{ordinal}", "must be an absolute path"),
    ],
)
def test_bad_templates_are_rejected_when_made(template: str, message: str) -> None:
    with pytest.raises(GresRenderError, match=message.replace("{", r"\{").replace("}", r"\}")):
        TemplateFiles(template)


def test_template_fields() -> None:
    files = TemplateFiles("/d/{node}/g{gpu}-gi{gi}-ci{ci}-{ordinal}")
    assert files.files("n2", 1, MigInstance("1g.10gb", Placement(3, 1), 7, 0), 4) == ("/d/n2/g1-gi7-ci0-4",)
    assert files.files("n2", 1, None, 0) == ("/d/n2/g1-gi-ci-0",)


@pytest.mark.parametrize("profile", sorted({p.name for g in CATALOG.gpus for p in g.profiles}))
def test_slurm_type_names_are_reversible(profile: str) -> None:
    slurm_type = slurm_type_for_profile(profile)
    assert profile_for_slurm_type(slurm_type) == profile
    assert "+" not in slurm_type and ":" not in slurm_type and "," not in slurm_type
    assert slurm_type == profile or profile.endswith(("+me",))


def test_slurm_autodetect_type_names() -> None:
    # Slurm's gpu/nvml plugin: device name up to the first '-', then <slices>g.<round(MiB/1024)>gb.
    assert slurm_autodetect_type("NVIDIA A100-SXM4-40GB", 3, 19968) == "nvidia_a100_3g.20gb"
    assert slurm_autodetect_type("NVIDIA A100-SXM4-40GB", 1, 4864) == "nvidia_a100_1g.5gb"
    # An H100's 7g.80gb reports 79.25 GiB: AutoDetect would call it 7g.79gb, not NVIDIA's 7g.80gb.
    assert slurm_autodetect_type("NVIDIA H100 80GB HBM3", 7, 81152) == "nvidia_h100_80gb_hbm3_7g.79gb"
