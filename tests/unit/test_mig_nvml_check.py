"""NVML's report against the catalog: disagreements become notes, and NVML's answer is what gets planned."""

from __future__ import annotations

from slurm_elastic.mig.catalog import load_catalog
from slurm_elastic.mig.device import NvmlProfileInfo, report_of
from slurm_elastic.mig.model import Layout, Placement
from slurm_elastic.mig.nvml_check import NoteCode, compare_with_catalog, effective_model
from slurm_elastic.mig.validate import check_layout, plan_layout
from slurm_elastic.testing.mig_fake import FakeMigDevice

CATALOG = load_catalog()
H200 = CATALOG.get("H200-141GB")


def profiles_like_catalog() -> list[NvmlProfileInfo]:
    return [
        NvmlProfileInfo(p.profile_id or 0, f"MIG {p.name}", p.compute_slices, p.max_instances)
        for p in H200.profiles
    ]


def test_a_driver_that_agrees_gives_no_notes_and_the_catalog_model() -> None:
    report = report_of(FakeMigDevice(H200))
    assert report.name == "NVIDIA H200" and report.pci_device_id == "0x233510DE"
    model, notes = effective_model(report, H200)
    assert notes == ()
    assert [(p.name, p.placement_starts, p.memory_slices, p.max_instances) for p in model.profiles] == [
        (p.name, p.placement_starts, p.memory_slices, p.max_instances)
        for p in sorted(H200.profiles, key=lambda p: p.profile_id or 0)
    ]
    assert (model.compute_slices, model.memory_slices) == (7, 8)


def test_disagreements_become_notes_and_nvml_wins() -> None:
    profiles = [p for p in profiles_like_catalog() if p.name != "MIG 1g.18gb+me"]  # driver without +me
    profiles = [
        NvmlProfileInfo(
            p.profile_id, p.name, p.slice_count, 3 if p.name == "MIG 1g.35gb" else p.instance_count
        )
        for p in profiles
    ]
    profiles.append(NvmlProfileInfo(21, "MIG 1g.18gb-me", 1, 7))  # a profile the catalog does not know
    placements = {p.profile_id: H200.profile(p.profile_name()).placements() for p in profiles[:-1]}  # type: ignore[union-attr]
    placements[15] = (Placement(0, 2), Placement(2, 2), Placement(4, 2))  # no 1g.35gb at 6
    placements[21] = tuple(Placement(s, 1) for s in range(7))
    device = FakeMigDevice(H200, profiles=profiles, placements=placements)

    model, notes = effective_model(report_of(device), H200)
    assert [(n.code, n.profile) for n in notes] == [
        (NoteCode.PROFILE_NOT_REPORTED, "1g.18gb+me"),
        (NoteCode.PROFILE_NOT_IN_CATALOG, "1g.18gb-me"),
        (NoteCode.MAX_INSTANCES_DIFFER, "1g.35gb"),
        (NoteCode.PLACEMENTS_DIFFER, "1g.35gb"),
    ]
    assert notes[2].message == "H200-141GB: 1g.35gb max instances: catalog 4, NVML 3"
    assert notes[3].message == "H200-141GB: 1g.35gb placement starts: catalog {0,2,4,6}, NVML {0,2,4}"
    assert (
        notes[0].message
        == "H200-141GB: the catalog lists 1g.18gb+me, which NVML does not report (driver too old?)"
    )

    # Validation follows NVML: 4 × 1g.35gb is fine by the catalog but not on this driver.
    assert check_layout(H200, Layout.of({"1g.35gb": 4})) == ()
    assert [p.message for p in check_layout(model, Layout.of({"1g.35gb": 4}))] == [
        "4 × 1g.35gb exceeds the maximum of 3 instances of 1g.35gb on H200-141GB"
    ]
    assert [str(i) for i in plan_layout(model, Layout.of({"1g.18gb-me": 2}))] == [
        "1g.18gb-me@0:1",
        "1g.18gb-me@1:1",
    ]
    assert compare_with_catalog(report_of(device), H200) == notes


def test_profile_id_mismatch_is_noted() -> None:
    profiles = [
        NvmlProfileInfo(
            99 if p.name == "MIG 7g.141gb" else p.profile_id, p.name, p.slice_count, p.instance_count
        )
        for p in profiles_like_catalog()
    ]
    notes = compare_with_catalog(report_of(FakeMigDevice(H200, profiles=profiles)), H200)
    assert [(n.code, n.message) for n in notes] == [
        (NoteCode.PROFILE_ID_DIFFERS, "H200-141GB: 7g.141gb profile id: catalog 0, NVML 99")
    ]


def test_unknown_gpu_uses_nvml_profiles() -> None:
    h100 = CATALOG.get("H100-80GB")
    report = report_of(FakeMigDevice(h100))
    model, notes = effective_model(report, None)
    assert [n.code for n in notes] == [NoteCode.GPU_NOT_IN_CATALOG]
    assert (
        notes[0].message
        == "NVIDIA H100 80GB HBM3 (0x233010DE) is not in the MIG catalog; using NVML's profiles"
    )
    assert model.model == "NVIDIA H100 80GB HBM3"
    assert (model.compute_slices, model.memory_slices) == (7, 8)
    assert [str(i) for i in plan_layout(model, Layout.of({"4g.40gb": 1, "3g.40gb": 1}))] == [
        "4g.40gb@0:4",
        "3g.40gb@4:4",
    ]


def test_profile_without_placements_is_left_out() -> None:
    placements = {p.profile_id: p.placements() for p in H200.profiles
                  if p.name != "7g.141gb" and p.profile_id is not None}
    model, notes = effective_model(report_of(FakeMigDevice(H200, placements=placements)), H200)
    assert "7g.141gb" not in model.profile_names()
    assert [n.code for n in notes] == [NoteCode.NO_PLACEMENTS_REPORTED]
    assert (model.compute_slices, model.memory_slices) == (7, 8)  # totals fall back to the catalog
