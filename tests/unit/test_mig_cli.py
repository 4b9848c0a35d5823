"""``slurm-elastic mig``: catalog, validate, import-parted, export-parted."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from click.testing import CliRunner

from slurm_elastic.cli.mig_cmd import mig_cmd

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "mig" / "parted-site.yaml"


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(mig_cmd, list(args), prog_name="slurm-elastic mig")
    return result.exit_code, result.stdout, result.stderr


def test_catalog_lists_gpus() -> None:
    code, out, _ = run("catalog")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["MODEL", "SLICES", "PROFILES", "NVML_NAMES"]
    assert ["H200-141GB", "7c/8m", "1g.18gb,1g.18gb+me,1g.35gb,2g.35gb,3g.71gb,4g.71gb,7g.141gb"] in [
        line.split()[:3] for line in lines
    ]


def test_catalog_for_one_gpu_shows_profiles_sources_and_notes() -> None:
    code, out, _ = run("catalog", "--gpu", "NVIDIA H100 PCIe")
    assert code == 0
    assert out.startswith("H100-80GB: NVIDIA H100 80GB (SXM5 and PCIe) - 7 compute slices, 8 memory slices\n")
    assert "3g.40gb     9   3        4       2    0,4" in out
    assert "  mig-guide-placements: NVIDIA Multi-Instance GPU User Guide (v580)" in out


def test_catalog_json() -> None:
    code, out, _ = run("catalog", "--gpu", "A100-40GB", "--json")
    assert code == 0
    (gpu,) = json.loads(out)
    assert gpu["model"] == "A100-40GB"
    assert gpu["profiles"][2] == {
        "name": "1g.10gb",
        "profile_id": 15,
        "nvml_profile": "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2",
        "compute_slices": 1,
        "memory_slices": 2,
        "max_instances": 4,
        "placement_starts": [0, 2, 4, 6],
    }


def test_validate_shows_the_placement() -> None:
    code, out, err = run(
        "validate", "--gpu", "H100-80GB", "--layout", '{"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}'
    )
    assert (code, err) == (0, "")
    assert out == (
        "H100-80GB: 3g.40gb + 2g.20gb + 2 × 1g.10gb: valid (7/7 compute slices, 8/8 memory slices)\n"
        "PROFILE  START  SIZE  MEMORY_SLICES\n"
        "2g.20gb  0      2     0-1\n"
        "1g.10gb  2      1     2-2\n"
        "1g.10gb  3      1     3-3\n"
        "3g.40gb  4      4     4-7\n"
    )


def test_validate_rejects_with_one_line_and_status_1() -> None:
    code, out, err = run("validate", "--gpu", "H100-80GB", "--layout", '{"3g.40gb": 3}')
    assert (code, out) == (1, "")
    assert err == (
        "slurm-elastic mig validate: error: 3 × 3g.40gb needs 9 compute slices; H100-80GB has 7; "
        "3 × 3g.40gb exceeds the maximum of 2 instances of 3g.40gb on H100-80GB; "
        "3 × 3g.40gb needs 12 memory slices; H100-80GB has 8\n"
    )


def test_validate_json_keeps_status_1_when_invalid() -> None:
    code, out, _ = run("validate", "--gpu", "h200-141gb", "--layout", '{"2g.15gb": 1}', "--json")
    assert code == 1
    doc = json.loads(out)
    assert doc["valid"] is False and doc["problems"][0]["code"] == "UNKNOWN_PROFILE"
    code, out, _ = run("validate", "--gpu", "h200-141gb", "--layout", '{"7g.141gb": 1}', "--json")
    assert code == 0 and json.loads(out)["placements"] == [{"profile": "7g.141gb", "start": 0, "size": 8}]


def test_validate_usage_and_lookup_errors() -> None:
    code, _, err = run("validate", "--gpu", "H100-80GB", "--layout", "{3g: 2}")
    assert code == 2 and "Invalid value for --layout: not valid JSON" in err
    code, _, err = run("validate", "--gpu", "H100-80GB", "--layout", "[1]")
    assert code == 2 and "expected a JSON object" in err
    code, _, err = run("validate", "--gpu", "H300", "--layout", "{}")
    assert code == 1 and err == (
        "slurm-elastic mig validate: error: unknown GPU model 'H300' "
        "(known: A100-40GB, A100-80GB, H100-80GB, H100-94GB, H200-141GB)\n"
    )
    code, _, err = run("validate", "--gpu", "H100-80GB", "--layout", '{"3g.40gb": 1.5}')
    assert code == 1 and "count for 3g.40gb must be a whole number >= 0, got 1.5" in err


def test_import_parted_checks_every_entry() -> None:
    code, out, err = run("import-parted", str(FIXTURE))
    assert code == 1
    assert "all-1g.10gb[1] A100-40GB: 4 × 1g.10gb: ok" in out.splitlines()
    assert (
        "balanced[1] -: 2g.12gb + 2 × 1g.6gb: ok (device 0x20B710DE is not in the catalog; not checked)"
        in out
    )
    assert err == "slurm-elastic mig import-parted: error: 2 of 11 checks failed\n"
    code, out, _ = run("import-parted", str(FIXTURE), "--config", "balanced")
    assert code == 0 and out.splitlines()[0] == "balanced[0] H100-80GB: 3g.40gb + 2g.20gb + 2 × 1g.10gb: ok"


def test_import_parted_errors(tmp_path: Path) -> None:
    code, _, err = run("import-parted", str(tmp_path / "missing.yaml"))
    assert code == 1 and "cannot read" in err
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enable: true\n")
    code, _, err = run("import-parted", str(bad))
    assert code == 1
    assert err == (
        f"slurm-elastic mig import-parted: error: {bad}: mig-configs.a[0]: unexpected field 'mig-enable' "
        "(allowed: device-filter, devices, mig-enabled, mig-devices)\n"
    )


def test_export_then_import_round_trip(tmp_path: Path) -> None:
    out_file = tmp_path / "n4.yaml"
    code, _, err = run(
        "export-parted",
        "--layout",
        '{"3g.71gb": 1, "2g.35gb": 1, "1g.18gb": 2}',
        "--name",
        "n4-balanced",
        "--gpu",
        "H200-141GB",
        "--device-filter",
        "-o",
        str(out_file),
    )
    assert (code, err) == (0, "")
    assert yaml.safe_load(out_file.read_text()) == {
        "version": "v1",
        "mig-configs": {
            "n4-balanced": [
                {
                    "device-filter": ["0x233510DE", "0x233B10DE"],
                    "devices": "all",
                    "mig-enabled": True,
                    "mig-devices": {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1},
                }
            ]
        },
    }
    code, out, _ = run("import-parted", str(out_file))
    assert code == 0 and out == "n4-balanced[0] H200-141GB: 3g.71gb + 2g.35gb + 2 × 1g.18gb: ok\n"


def test_export_validates_and_lists_devices() -> None:
    code, _, err = run("export-parted", "--layout", '{"4g.40gb": 2}', "--name", "x", "--gpu", "H100-80GB")
    assert code == 1 and "2 × 4g.40gb needs 8 compute slices" in err
    code, out, _ = run(
        "export-parted", "--layout", "{}", "--name", "mig-off", "--mig-disabled", "--devices", "1,3"
    )
    assert (
        code == 0
        and out == "version: v1\nmig-configs:\n  mig-off:\n    - devices: [1, 3]\n      mig-enabled: false\n"
    )
    code, _, err = run("export-parted", "--layout", "{}", "--name", "x", "--device-filter")
    assert code == 2 and "--device-filter needs --gpu" in err


def test_site_catalog_option(tmp_path: Path) -> None:
    site = tmp_path / "catalog.yaml"
    site.write_text("version: 1\nsources: {}\ngpus: []\n")
    code, _, err = run("--catalog", str(site), "catalog")
    assert code == 1 and err == f"slurm-elastic mig catalog: error: {site}: gpus must be a non-empty list\n"
