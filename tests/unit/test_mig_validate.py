"""Layout validation and the placement search, on every catalog GPU and profile."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_elastic.mig.catalog import load_catalog
from slurm_elastic.mig.errors import LayoutError, MigRejectReason
from slurm_elastic.mig.model import GpuModel, Layout, MigInstance, MigProfile, Placement
from slurm_elastic.mig.validate import check_instances, check_layout, parse_layout, plan_layout

CATALOG = load_catalog()
EVERY_PROFILE = [(g.model, p.name) for g in CATALOG.gpus for p in g.profiles]


def gpu(model: str) -> GpuModel:
    return CATALOG.get(model)


def messages(model: str, counts: dict[str, int]) -> list[str]:
    return [p.message for p in check_layout(gpu(model), Layout.of(counts))]


def codes(model: str, counts: dict[str, int]) -> list[MigRejectReason]:
    return [p.code for p in check_layout(gpu(model), Layout.of(counts))]


def placed(model: str, counts: dict[str, int]) -> list[str]:
    return [str(i) for i in plan_layout(gpu(model), Layout.of(counts))]


@pytest.mark.parametrize(("model", "profile"), EVERY_PROFILE)
def test_each_profile_alone_at_its_maximum_is_valid(model: str, profile: str) -> None:
    p = gpu(model).profile(profile)
    assert p is not None
    layout = Layout.of({profile: p.max_instances})
    assert check_layout(gpu(model), layout) == ()
    instances = plan_layout(gpu(model), layout)
    assert len(instances) == p.max_instances
    assert all(p.allows(i.placement) for i in instances)


@pytest.mark.parametrize(("model", "profile"), EVERY_PROFILE)
def test_each_profile_one_over_its_maximum_is_invalid(model: str, profile: str) -> None:
    p = gpu(model).profile(profile)
    assert p is not None
    n = p.max_instances + 1
    problems = check_layout(gpu(model), Layout.of({profile: n}))
    max_problem = [x for x in problems if x.code is MigRejectReason.MAX_INSTANCES]
    plural = "s" if p.max_instances > 1 else ""
    assert [x.message for x in max_problem] == [
        f"{n} × {profile} exceeds the maximum of {p.max_instances} instance{plural} of {profile} on {model}"
    ]
    with pytest.raises(LayoutError):
        plan_layout(gpu(model), Layout.of({profile: n}))


def test_three_3g_on_h100_names_compute_instances_and_memory() -> None:
    assert messages("H100-80GB", {"3g.40gb": 3}) == [
        "3 × 3g.40gb needs 9 compute slices; H100-80GB has 7",
        "3 × 3g.40gb exceeds the maximum of 2 instances of 3g.40gb on H100-80GB",
        "3 × 3g.40gb needs 12 memory slices; H100-80GB has 8",
    ]


def test_unknown_profile_lists_the_known_ones() -> None:
    assert messages("H100-80GB", {"2g.15gb": 1}) == [
        "unknown profile 2g.15gb for H100-80GB "
        "(known: 1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb)"
    ]


def test_a100_profile_name_on_h100_is_unknown() -> None:
    assert codes("H100-80GB", {"3g.20gb": 1}) == [MigRejectReason.UNKNOWN_PROFILE]


def test_mixed_layout_over_compute_lists_largest_first() -> None:
    assert messages("H100-80GB", {"1g.10gb": 1, "3g.40gb": 1, "4g.40gb": 1}) == [
        "4g.40gb + 3g.40gb + 1g.10gb needs 8 compute slices; H100-80GB has 7",
        "4g.40gb + 3g.40gb + 1g.10gb needs 9 memory slices; H100-80GB has 8",
    ]


# --- the classic A100 cases (MIG user guide, "Concepts" > "Partitioning") -----------------------------------


def test_a100_4g_plus_3g_is_valid_and_fills_the_gpu() -> None:
    assert placed("A100-40GB", {"4g.20gb": 1, "3g.20gb": 1}) == ["4g.20gb@0:4", "3g.20gb@4:4"]


def test_a100_4g_plus_4g_is_invalid() -> None:
    assert messages("A100-40GB", {"4g.20gb": 2}) == [
        "2 × 4g.20gb needs 8 compute slices; A100-40GB has 7",
        "2 × 4g.20gb exceeds the maximum of 1 instance of 4g.20gb on A100-40GB",
    ]


def test_a100_3g_plus_3g_is_valid() -> None:
    assert placed("A100-40GB", {"3g.20gb": 2}) == ["3g.20gb@0:4", "3g.20gb@4:4"]


def test_a100_3g_plus_3g_plus_1g_is_invalid_two_3g_take_all_eight_memory_slices() -> None:
    # A 3g instance occupies 4 memory slices (placements {0,4}:4), so two of them leave no memory slice
    # for a 1g, although one compute slice is free. The seventh compute slice is stranded.
    assert messages("A100-40GB", {"3g.20gb": 2, "1g.5gb": 1}) == [
        "2 × 3g.20gb + 1g.5gb needs 9 memory slices; A100-40GB has 8"
    ]


def test_seven_1g_are_valid_on_slices_0_to_6() -> None:
    assert placed("A100-40GB", {"1g.5gb": 7}) == [f"1g.5gb@{i}:1" for i in range(7)]


def test_balanced_h100_layout_matches_nvidia_smi_placement() -> None:
    # The layout a DGX H100 shows with mig-parted's all-balanced: 2g@0, 1g@2, 1g@3, 3g@4.
    assert placed("H100-80GB", {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}) == [
        "2g.20gb@0:2",
        "1g.10gb@2:1",
        "1g.10gb@3:1",
        "3g.40gb@4:4",
    ]


def test_double_memory_1g_takes_two_slices_and_even_starts() -> None:
    assert placed("H200-141GB", {"1g.35gb": 4}) == [f"1g.35gb@{s}:2" for s in (0, 2, 4, 6)]
    assert placed("H200-141GB", {"1g.35gb": 1, "1g.18gb": 6}) == [
        *[f"1g.18gb@{s}:1" for s in range(6)],
        "1g.35gb@6:2",
    ]


def test_empty_and_disabled_layouts_are_valid() -> None:
    assert check_layout(gpu("H100-80GB"), Layout.of({})) == ()
    assert check_layout(gpu("H100-80GB"), Layout.disabled()) == ()
    assert plan_layout(gpu("H100-80GB"), Layout.disabled()) == ()


def test_disabled_layout_with_instances_is_invalid() -> None:
    problems = check_layout(gpu("H100-80GB"), Layout.of({"1g.10gb": 1}, mig_enabled=False))
    assert [p.message for p in problems] == ["MIG is disabled but 1g.10gb requested on H100-80GB"]


def test_kept_instances_can_make_a_valid_layout_unplaceable() -> None:
    kept = [MigInstance("1g.10gb", Placement(0, 1)), MigInstance("1g.10gb", Placement(4, 1))]
    with pytest.raises(LayoutError) as err:
        plan_layout(gpu("H100-80GB"), Layout.of({"4g.40gb": 1}), occupied=kept)
    assert [p.code for p in err.value.problems] == [MigRejectReason.NO_PLACEMENT]
    assert str(err.value) == (
        "no valid placement: 4g.40gb on H100-80GB next to the kept 1g.10gb@0:1, 1g.10gb@4:1 "
        "(4g.40gb starts at 0)"
    )
    # Without the instance at slice 0 it fits.
    assert [str(i) for i in plan_layout(gpu("H100-80GB"), Layout.of({"4g.40gb": 1}), occupied=kept[1:])] == [
        "4g.40gb@0:4"
    ]


def test_placement_search_backtracks_on_a_toy_gpu() -> None:
    # A 4-slice toy GPU where the sums fit but both profiles can only start at slice 0.
    toy = GpuModel(
        model="toy",
        compute_slices=4,
        memory_slices=4,
        profiles=(
            MigProfile("1g.1gb", 1, 1, 1, (0,)),
            MigProfile("2g.2gb", 2, 2, 1, (0,)),
            MigProfile("1g.2gb", 1, 2, 2, (0, 2)),
        ),
    )
    assert [p.code for p in check_layout(toy, Layout.of({"1g.1gb": 1, "2g.2gb": 1}))] == [MigRejectReason.NO_PLACEMENT]
    # The search must move the first 1g.2gb off slice 0 to fit the 2g.2gb.
    assert [str(i) for i in plan_layout(toy, Layout.of({"2g.2gb": 1, "1g.2gb": 1}))] == [
        "2g.2gb@0:2",
        "1g.2gb@2:2",
    ]


def test_plan_is_deterministic_whatever_the_order_of_the_request() -> None:
    a = plan_layout(gpu("A100-80GB"), Layout.of({"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}))
    b = plan_layout(gpu("A100-80GB"), Layout.of({"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}))
    assert a == b


def test_parse_layout_rejects_bad_counts() -> None:
    with pytest.raises(LayoutError) as err:
        parse_layout({"3g.40gb": -1, "1g.10gb": "2", "2g.20gb": True})
    assert [p.code for p in err.value.problems] == [MigRejectReason.BAD_COUNT] * 3
    assert str(err.value).startswith("count for 3g.40gb must be a whole number >= 0, got -1")
    assert parse_layout({"3g.40gb": 2, "1g.10gb": 0}) == Layout.of({"3g.40gb": 2})


def test_check_instances_flags_bad_placements_and_overlaps() -> None:
    problems = check_instances(
        gpu("H100-80GB"),
        [
            MigInstance("3g.40gb", Placement(0, 4)),
            MigInstance("1g.10gb", Placement(2, 1)),
            MigInstance("3g.40gb", Placement(2, 4)),
            MigInstance("2g.15gb", Placement(6, 2)),
        ],
    )
    assert [p.code for p in problems] == [MigRejectReason.OVERLAP, MigRejectReason.BAD_PLACEMENT,
                                          MigRejectReason.UNKNOWN_PROFILE]
    assert problems[0].message == "1g.10gb@2:1 overlaps 3g.40gb@0:4"


# --- property: whatever the validator accepts, the planner places without overlap -----------------------


@st.composite
def requests(draw: st.DrawFn) -> tuple[GpuModel, dict[str, int]]:
    model = draw(st.sampled_from(CATALOG.gpus))
    names = draw(st.lists(st.sampled_from(model.profile_names()), min_size=0, max_size=4, unique=True))
    counts = {name: draw(st.integers(min_value=0, max_value=8)) for name in names}
    return model, counts


@settings(max_examples=400, deadline=None)
@given(requests())
def test_accepted_layouts_get_non_overlapping_allowed_placements(
    req: tuple[GpuModel, dict[str, int]],
) -> None:
    model, counts = req
    layout = Layout.of(counts)
    if check_layout(model, layout):
        with pytest.raises(LayoutError):
            plan_layout(model, layout)
        return
    instances = plan_layout(model, layout)
    assert sorted(i.profile for i in instances) == sorted(n for n, c in counts.items() for _ in range(c))
    used: set[int] = set()
    compute = 0
    for inst in instances:
        profile = model.profile(inst.profile)
        assert profile is not None and profile.allows(inst.placement)
        slices = set(inst.placement.slices())
        assert not (slices & used), f"{inst} overlaps another instance"
        assert max(slices) < model.memory_slices
        used |= slices
        compute += profile.compute_slices
    assert compute <= model.compute_slices
    assert check_instances(model, instances) == ()
