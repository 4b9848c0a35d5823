"""mig-parted config import/export: strict reading, faithful round trips, checks against the catalog."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_elastic.errors import ConfigError
from slurm_elastic.mig.catalog import load_catalog
from slurm_elastic.mig.errors import PartedConfigError
from slurm_elastic.mig.model import Layout, NodeLayout
from slurm_elastic.mig.parted import (
    PartedConfig,
    PartedSpec,
    check_config,
    config_from_node_layout,
    dump_parted_config,
    node_layout_from_specs,
    parse_parted_config,
)

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "mig" / "parted-site.yaml"
CATALOG = load_catalog()


def site() -> PartedConfig:
    return parse_parted_config(FIXTURE.read_text(), "parted-site.yaml")


def test_reads_a_site_config() -> None:
    cfg = site()
    assert cfg.names() == (
        "all-disabled",
        "all-enabled",
        "all-1g.10gb",
        "balanced",
        "half-and-half",
        "too-big",
    )
    first, second = cfg.get("balanced")
    assert first.device_filter == ("0x233010DE", "0x233110DE") and first.devices == "all"
    assert first.layout() == Layout.of({"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1})
    assert second.device_filter == ("0x20B710DE",) and not second.device_filter_is_list
    assert cfg.get("all-disabled")[0].layout() == Layout.disabled()
    assert cfg.get("all-enabled")[0].layout() == Layout.of({})
    assert cfg.get("half-and-half")[0].devices == (0, 1)


def test_round_trip_keeps_every_detail() -> None:
    cfg = site()
    text = dump_parted_config(cfg)
    assert parse_parted_config(text) == cfg
    assert dump_parted_config(parse_parted_config(text)) == text


def test_dump_looks_like_mig_parted() -> None:
    cfg = PartedConfig(
        "v1",
        (
            (
                "all-balanced",
                (
                    PartedSpec(
                        "all", True, (("1g.10gb", 2), ("2g.20gb", 1), ("3g.40gb", 1)), ("0x233010DE",)
                    ),
                    PartedSpec((2, 3), False, (), ("0x20B710DE",), device_filter_is_list=False),
                ),
            ),
            ("yes", (PartedSpec("all", True),)),
        ),
    )
    assert dump_parted_config(cfg) == (
        "version: v1\n"
        "mig-configs:\n"
        "  all-balanced:\n"
        '    - device-filter: ["0x233010DE"]\n'
        "      devices: all\n"
        "      mig-enabled: true\n"
        "      mig-devices:\n"
        '        "1g.10gb": 2\n'
        '        "2g.20gb": 1\n'
        '        "3g.40gb": 1\n'
        '    - device-filter: "0x20B710DE"\n'
        "      devices: [2, 3]\n"
        "      mig-enabled: false\n"
        '  "yes":\n'
        "    - devices: all\n"
        "      mig-enabled: true\n"
        "      mig-devices: {}\n"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "mig-configs: {a: [{devices: all, mig-enabled: false}]}",
            "missing 'version' (mig-parted configs start",
        ),
        (
            "version: v2\nmig-configs: {a: [{devices: all, mig-enabled: false}]}",
            "unknown version 'v2' (supported: v1)",
        ),
        ("version: v1\nmig-config: {}", "unexpected field 'mig-config' (allowed: version, mig-configs)"),
        ("version: v1\nmig-configs: {}", "'mig-configs' must be a mapping with at least one entry"),
        ("version: v1\nmig-configs: {a: []}", "mig-configs.a: at least one entry is required"),
        (
            "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true, mig-device: {}}]}",
            "mig-configs.a[0]: unexpected field 'mig-device' (allowed: device-filter, devices, mig-enabled, "
            "mig-devices)",
        ),
        (
            "version: v1\nmig-configs: {a: [{mig-enabled: true}]}",
            "mig-configs.a[0]: missing required field 'devices'",
        ),
        (
            "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true}]}",
            "missing required field 'mig-devices' when 'mig-enabled' is true",
        ),
        (
            "version: v1\nmig-configs: {a: [{devices: all, "
            'mig-enabled: false, mig-devices: {"1g.10gb": 1}}]}',
            "MIG devices included when 'mig-enabled' is false",
        ),
        (
            "version: v1\nmig-configs: {a: [{devices: some, mig-enabled: false}]}",
            "devices must be 'all' or a list",
        ),
        (
            "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: 1}]}",
            "mig-enabled must be true or false",
        ),
        (
            "version: v1\nmig-configs: {a: [{devices: all, "
            'mig-enabled: true, mig-devices: {"1c.2g.20gb": 1}}]}',
            "compute-instance profile '1c.2g.20gb' is not supported",
        ),
        (
            "version: v1\nmig-configs: {a: [{devices: all, "
            'mig-enabled: true, mig-devices: {"1g.10gb": -1}}]}',
            "count for 1g.10gb must be a whole number >= 0, got -1",
        ),
        (
            "version: v1\nmig-configs: {a: [{device-filter: A100, devices: all, mig-enabled: false}]}",
            "device-filter 'A100' is not a PCI id",
        ),
        ("version: v1\nversion: v1\n", "duplicate key 'version'"),
        ("version: [v1", "not valid YAML"),
    ],
)
def test_bad_configs_are_rejected_clearly(text: str, message: str) -> None:
    with pytest.raises(PartedConfigError) as err:
        parse_parted_config(text, "site.yaml")
    assert message in str(err.value)
    assert str(err.value).startswith("site.yaml: ")
    assert isinstance(err.value, ConfigError)


def test_unknown_config_name() -> None:
    with pytest.raises(
        PartedConfigError, match=r"no mig-config named 'nope' \(have: all-disabled, all-enabled"
    ):
        site().get("nope")


def test_node_layout_follows_filters_and_device_lists() -> None:
    cfg = site()
    h100_node = [(i, "0x233010DE") for i in range(4)]
    assert node_layout_from_specs(cfg.get("all-1g.10gb"), h100_node) == NodeLayout.of(
        {i: Layout.of({"1g.10gb": 7}) for i in range(4)}
    )
    a100_40_node = [(0, "0x20b010de")]
    assert node_layout_from_specs(cfg.get("all-1g.10gb"), a100_40_node).for_gpu(0) == Layout.of(
        {"1g.10gb": 4}
    )
    # No entry for an H200: left alone.
    assert node_layout_from_specs(cfg.get("all-1g.10gb"), [(0, "0x233510DE")]) == NodeLayout()
    mixed = node_layout_from_specs(cfg.get("half-and-half"), [(i, None) for i in range(4)])
    assert mixed.for_gpu(1) == Layout.of({"3g.71gb": 2}) and mixed.for_gpu(3) == Layout.disabled()


def test_overlapping_entries_are_an_error() -> None:
    specs = (PartedSpec("all", True, (("1g.10gb", 7),)), PartedSpec((1,), False))
    with pytest.raises(PartedConfigError, match="c: GPU 1 matches entries 0, 1"):
        node_layout_from_specs(specs, [(0, None), (1, None)], "c")


def test_export_groups_gpus_by_layout() -> None:
    same = NodeLayout.of({i: Layout.of({"3g.40gb": 2}) for i in range(4)})
    cfg = config_from_node_layout("n4", same, gpu_count=4, device_filter=["0x233010de"])
    assert cfg.get("n4") == (PartedSpec("all", True, (("3g.40gb", 2),), ("0x233010DE",)),)
    mixed = NodeLayout.of({0: Layout.of({"7g.80gb": 1}), 1: Layout.disabled(), 2: Layout.of({"7g.80gb": 1})})
    specs = config_from_node_layout("n4", mixed, gpu_count=4).get("n4")
    assert [(s.devices, s.layout()) for s in specs] == [
        ((0, 2), Layout.of({"7g.80gb": 1})),
        ((1,), Layout.disabled()),
    ]
    assert node_layout_from_specs(specs, [(i, None) for i in range(3)]) == mixed


def test_check_against_catalog() -> None:
    checks = check_config(site(), CATALOG)
    by_key = {(c.config, c.entry, c.model): c for c in checks}
    assert by_key[("all-1g.10gb", 0, "H100-80GB")].ok
    assert by_key[("all-1g.10gb", 0, "A100-80GB")].ok
    assert by_key[("all-1g.10gb", 1, "A100-40GB")].ok
    assert by_key[("balanced", 0, "H100-80GB")].ok
    unknown = by_key[("balanced", 1, None)]
    assert unknown.ok and unknown.note == "device 0x20B710DE is not in the catalog; not checked"
    # No filter: checked on every GPU that has 3g.71gb.
    assert [c.model for c in checks if c.config == "half-and-half" and c.entry == 0] == ["H200-141GB"]
    bad = [c for c in checks if not c.ok]
    assert [(c.config, c.model) for c in bad] == [("too-big", "A100-80GB"), ("too-big", "H100-80GB")]
    assert bad[1].summary() == (
        "too-big[0] H100-80GB: 3 × 3g.40gb: 3 × 3g.40gb needs 9 compute slices; H100-80GB has 7; "
        "3 × 3g.40gb exceeds the maximum of 2 instances of 3g.40gb on H100-80GB; "
        "3 × 3g.40gb needs 12 memory slices; H100-80GB has 8"
    )


def test_check_with_a_gpu_and_a_config_name() -> None:
    checks = check_config(site(), CATALOG, "all-enabled", CATALOG.get("H200-141GB"))
    assert [(c.model, c.ok) for c in checks] == [("H200-141GB", True)]
    checks = check_config(site(), CATALOG, "all-disabled")
    assert [(c.model, c.ok, c.note) for c in checks] == [(None, True, "valid on any MIG-capable GPU")]
    checks = check_config(site(), CATALOG, "balanced", CATALOG.get("H200-141GB"))  # filters win over --gpu
    assert [c.model for c in checks] == ["H100-80GB", None]


profile_names = st.sampled_from(["1g.10gb", "1g.10gb+me", "2g.20gb", "3g.40gb", "7g.80gb", "1g.24gb+me.all"])
specs = st.builds(
    PartedSpec,
    devices=st.one_of(
        st.just("all"), st.lists(st.integers(0, 15), min_size=1, max_size=4, unique=True).map(tuple)
    ),
    mig_enabled=st.just(True),
    mig_devices=st.dictionaries(profile_names, st.integers(0, 7), max_size=4).map(
        lambda d: tuple(sorted(d.items()))
    ),
    device_filter=st.lists(
        st.sampled_from(["0x233010DE", "0x20B010DE", "0x233510DE:0x16C110DE"]), max_size=2
    ).map(tuple),
) | st.builds(PartedSpec, devices=st.just("all"), mig_enabled=st.just(False))


@settings(max_examples=150, deadline=None)
@given(
    st.dictionaries(
        st.from_regex(r"[a-z][a-z0-9.\-]{0,12}", fullmatch=True), st.lists(specs, min_size=1, max_size=3)
    )
)
def test_any_config_round_trips(configs: dict[str, list[PartedSpec]]) -> None:
    if not configs:
        return
    cfg = PartedConfig("v1", tuple((name, tuple(s)) for name, s in configs.items()))
    assert parse_parted_config(dump_parted_config(cfg)) == cfg
