"""Which library should check the key declarations? Time the packaged policy plus a full controller.toml in each.

The same declarations (slurm_elastic/keyschema.py: kind, range, default) are turned into a msgspec Struct and
a pydantic model, and each library validates the same TOML tables; the project's own loaders (standard-library
dataclasses, every problem collected with its line and a "did you mean") are the baseline, so the figures are
ratios within one run. pydantic is not a dependency: the bench reports it only when it is importable (e.g.
``PYTHONPATH=$PWD:/path/to/a/venv/site-packages``).

    PYTHONPATH=$PWD python bench/key_schema.py [--rounds 2000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slurm_elastic.controller import config as controller_config  # noqa: E402
from slurm_elastic.controller.config import SECTIONS, parse_controller_config  # noqa: E402
from slurm_elastic.keyschema import Key, Kind  # noqa: E402
from slurm_elastic.policy import parse_config, render_defaults_toml  # noqa: E402
from slurm_elastic.policy.loader import config_from_mapping  # noqa: E402
from slurm_elastic.policy.schema import KEYS  # noqa: E402

_PY: Mapping[Kind, Any] = {Kind.INT: int, Kind.PERCENT: int, Kind.DURATION: int, Kind.FLOAT: float,
                           Kind.NUMBER: float, Kind.BOOL: bool, Kind.STR: str, Kind.PATH: str, Kind.SIGNAL: str,
                           Kind.TABLE: dict[str, str], Kind.STR_LIST: list[str], Kind.INT_LIST: list[int]}


def _controller_text() -> str:
    doc = controller_config.__doc__ or ""
    return doc[doc.index("    version = 1"):].replace("\n    ", "\n").strip() + "\n"


def _msgspec_types() -> tuple[Any, Any]:
    import msgspec

    def field(key: Key) -> tuple[Any, Any]:
        t = _PY[key.kind]
        if key.lo is not None or key.hi is not None:
            t = Annotated[t, msgspec.Meta(ge=key.lo, le=key.hi)]
        default = key.default if not isinstance(key.default, dict | list | tuple) else msgspec.UNSET
        return (t | None if key.default is None else t), default

    def struct(name: str, keys: Mapping[str, Key]) -> Any:
        return msgspec.defstruct(name, [(n, *field(k)) for n, k in keys.items()], forbid_unknown_fields=True,
                                 kw_only=True)

    policy = msgspec.defstruct("Policy", [("version", int), *((k.name, *field(k.key)) for k in KEYS)],
                               forbid_unknown_fields=True, kw_only=True)
    sections = [(name, struct(name.title(), keys), msgspec.UNSET) for name, keys in SECTIONS.items()]
    controller = msgspec.defstruct("Controller", [("version", int), *sections], forbid_unknown_fields=True,
                                   kw_only=True)
    return policy, controller


def _pydantic_types() -> tuple[Any, Any] | None:
    try:
        import pydantic
    except ImportError:
        return None
    strict = pydantic.ConfigDict(extra="forbid", strict=True)

    def field(key: Key) -> tuple[Any, Any]:
        t = _PY[key.kind]
        if key.kind in (Kind.FLOAT, Kind.NUMBER):
            t = int | float
        default = None if isinstance(key.default, dict | list | tuple) else key.default
        return (t | None, pydantic.Field(default, ge=key.lo, le=key.hi))

    def model(name: str, keys: Mapping[str, Key]) -> Any:
        return pydantic.create_model(name, __config__=strict, **{n: field(k) for n, k in keys.items()})

    policy = pydantic.create_model("Policy", __config__=strict, version=(int, ...),
                                   **{k.name: field(k.key) for k in KEYS})
    sections = {name: (model(name.title(), keys) | None, None) for name, keys in SECTIONS.items()}
    controller = pydantic.create_model("Controller", __config__=strict, version=(int, ...), **sections)
    return policy, controller


def _time(fn: Callable[[], object], rounds: int) -> float:
    """Median of 5 batches, microseconds per call."""
    fn()
    batches = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(rounds):
            fn()
        batches.append((time.perf_counter() - t0) / rounds * 1e6)
    return statistics.median(batches)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2000)
    rounds = ap.parse_args().rounds
    policy_text, controller_text = render_defaults_toml(), _controller_text()
    policy_data, controller_data = tomllib.loads(policy_text), tomllib.loads(controller_text)
    controller_data["agents"].pop("urls", None)  # a free-form table: no fixed fields to declare

    rows: list[tuple[str, float]] = [
        ("tomllib.loads only (both files)", _time(lambda: (tomllib.loads(policy_text),
                                                          tomllib.loads(controller_text)), rounds)),
        ("stdlib dataclasses: project loaders, text in (baseline)",
         _time(lambda: (parse_config(policy_text), parse_controller_config(controller_text)), rounds)),
        ("stdlib dataclasses: policy table in (config_from_mapping)",
         _time(lambda: config_from_mapping(policy_data), rounds)),
    ]
    import msgspec

    m_policy, m_controller = _msgspec_types()
    rows.append((f"msgspec {msgspec.__version__}: convert both tables",
                 _time(lambda: (msgspec.convert(policy_data, m_policy),
                                msgspec.convert(controller_data, m_controller)), rounds)))
    pyd = _pydantic_types()
    if pyd is not None:
        import pydantic

        p_policy, p_controller = pyd
        rows.append((f"pydantic {pydantic.VERSION}: validate both tables",
                     _time(lambda: (p_policy.model_validate(policy_data),
                                    p_controller.model_validate(controller_data)), rounds)))
    else:
        rows.append(("pydantic: not installed (not a dependency)", float("nan")))
    base = rows[1][1]
    print(f"packaged policy ({len(KEYS)} keys) + controller.toml example ({sum(map(len, SECTIONS.values()))} "
          f"keys), median of 5 x {rounds} rounds")
    for name, us in rows:
        print(f"  {name:60s} {us:9.1f} us   {us / base:5.2f}x baseline")


if __name__ == "__main__":
    main()
