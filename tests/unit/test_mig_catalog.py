"""The packaged MIG catalog: it loads, it says where its numbers come from, and the loader is strict."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from slurm_elastic.errors import ConfigError
from slurm_elastic.mig.catalog import load_catalog, parse_catalog, parse_catalog_text
from slurm_elastic.mig.errors import CatalogError, UnknownGpuError

PACKAGED = Path(__file__).resolve().parents[2] / "slurm_elastic" / "data" / "mig_profiles.yaml"


def raw() -> dict:
    return yaml.safe_load(PACKAGED.read_text())


def test_packaged_catalog_covers_the_required_gpus() -> None:
    catalog = load_catalog()
    assert {"A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB"} <= set(catalog.models())
    for gpu in catalog.gpus:
        assert gpu.compute_slices == 7 and gpu.memory_slices == 8
        assert gpu.sources and all(catalog.source(s) for s in gpu.sources)
        assert gpu.nvml_names


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("A100-40GB", ["1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]),
        ("A100-80GB", ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]),
        ("H100-80GB", ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]),
        ("H200-141GB", ["1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"]),
    ],
)
def test_profile_names(model: str, expected: list[str]) -> None:
    assert list(load_catalog().get(model).profile_names()) == expected


@pytest.mark.parametrize("model", ["A100-40GB", "A100-80GB", "H100-80GB", "H100-94GB", "H200-141GB"])
def test_placement_rules_match_nvidia_smi_lgipp(model: str) -> None:
    # MIG user guide, "List GPU Instance Profiles": the same seven lines on A100 and Hopper parts.
    lgipp = {
        19: ((0, 1, 2, 3, 4, 5, 6), 1),
        20: ((0, 1, 2, 3, 4, 5, 6), 1),
        15: ((0, 2, 4, 6), 2),
        14: ((0, 2, 4), 2),
        9: ((0, 4), 4),
        5: ((0,), 4),
        0: ((0,), 8),
    }
    gpu = load_catalog().get(model)
    got = {p.profile_id: (p.placement_starts, p.memory_slices) for p in gpu.profiles}
    assert got == lgipp
    maxima = {p.profile_id: p.max_instances for p in gpu.profiles}
    assert maxima == {19: 7, 20: 1, 15: 4, 14: 3, 9: 2, 5: 1, 0: 1}


@pytest.mark.parametrize(
    "key", ["H100-80GB", "h100-80gb", "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "0x233010de", "0x233110DE"]
)
def test_lookup_by_model_nvml_name_or_pci_id(key: str) -> None:
    assert load_catalog().get(key).model == "H100-80GB"


def test_unknown_gpu_lists_known_models() -> None:
    with pytest.raises(UnknownGpuError) as err:
        load_catalog().get("H300")
    assert (
        str(err.value)
        == "unknown GPU model 'H300' (known: A100-40GB, A100-80GB, H100-80GB, H100-94GB, H200-141GB)"
    )


def test_catalog_errors_are_config_errors() -> None:
    assert issubclass(CatalogError, ConfigError)


def test_missing_version_is_rejected() -> None:
    data = raw()
    del data["version"]
    with pytest.raises(CatalogError, match=r"catalog: missing 'version' \(this loader reads version 1\)"):
        parse_catalog(data)


def test_unknown_version_is_rejected() -> None:
    data = raw()
    data["version"] = 2
    with pytest.raises(CatalogError, match="unknown version 2"):
        parse_catalog(data)


def test_unknown_top_level_field_is_rejected() -> None:
    data = raw()
    data["gpu"] = []
    with pytest.raises(
        CatalogError, match=r"catalog: unknown field 'gpu' \(allowed: version, sources, gpus\)"
    ):
        parse_catalog(data)


def test_unknown_profile_field_is_rejected_with_its_location() -> None:
    data = raw()
    data["gpus"][2]["profiles"][4]["max"] = 2
    with pytest.raises(CatalogError) as err:
        parse_catalog(data)
    assert str(err.value).startswith(
        "catalog: gpus[2] (H100-80GB).profiles[4] (3g.40gb): unknown field 'max'"
    )


def test_placement_past_the_last_memory_slice_is_rejected() -> None:
    data = raw()
    data["gpus"][0]["profiles"][4]["placement_starts"] = [0, 4, 6]
    with pytest.raises(CatalogError, match=r"placement 6:4 runs past memory slice 7"):
        parse_catalog(data)


def test_name_and_compute_slices_must_agree() -> None:
    data = raw()
    data["gpus"][0]["profiles"][3]["compute_slices"] = 3
    with pytest.raises(CatalogError, match="the name says 2 compute slices, compute_slices says 3"):
        parse_catalog(data)


def test_more_instances_than_placements_is_rejected() -> None:
    data = raw()
    data["gpus"][0]["profiles"][4]["max_instances"] = 3
    with pytest.raises(CatalogError, match="max_instances 3 cannot fit"):
        parse_catalog(data)


def test_every_table_must_cite_a_described_source() -> None:
    data = raw()
    data["gpus"][1]["sources"] = ["a-blog-post"]
    with pytest.raises(CatalogError, match="'a-blog-post' is not described under the top-level 'sources'"):
        parse_catalog(data)


def test_duplicate_nvml_name_is_rejected() -> None:
    data = raw()
    data["gpus"][1]["nvml_names"].append("NVIDIA A100-SXM4-40GB")
    with pytest.raises(
        CatalogError, match="'NVIDIA A100-SXM4-40GB' is claimed by both A100-40GB and A100-80GB"
    ):
        parse_catalog(data)


def test_bad_yaml_and_missing_file() -> None:
    with pytest.raises(CatalogError, match="not valid YAML"):
        parse_catalog_text("version: [1")
    with pytest.raises(CatalogError, match="cannot read MIG catalog"):
        load_catalog("/nonexistent/mig.yaml")


def test_site_catalog_file_is_loaded(tmp_path: Path) -> None:
    data = raw()
    data["gpus"] = [data["gpus"][2]]
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(data))
    assert load_catalog(path).models() == ("H100-80GB",)
