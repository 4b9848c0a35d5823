"""The virtual GPU state of one node: typed model and its text format (pure: no I/O).

The format is line-oriented so that the C library parses it with a tokenizer and ``strtoll``. Fields are
separated by blanks; a trailing *name* field is the rest of the line and may hold spaces. ``#`` starts a
comment line. The first record is ``vgpu-state 1``; the last is ``end`` (a file without it is being written and
readers retry). Record types, in the order :func:`format_state` writes them::

    vgpu-state 1
    driver <version>
    clock_us <microseconds>            # optional; pins NVML's "now" (0 or absent: the real clock)
    gpu <index> <minor> <memory_mib> <mig_capable 0|1> <uuid> <name...>
    mig <gpu> <current 0|1> <pending 0|1>
    giprofile <gpu> <profile_index> <profile_id> <slices> <instances> <memory_mib> <sm_count>
              <placement_size> <start,start,...> <name...>              (one line in the file)
    ciprofile <gpu> <profile_index> <profile_id> <slices>
    gi <gpu> <gi_id> <profile_id> <placement_start> <placement_size>
    ci <gpu> <gi_id> <ci_id> <ci_profile_id> <placement_start> <placement_size>
    proc <pid> <gpu> <gi_id|-1> <ci_id|-1> <sm_util_pct> <mem_util_pct> <memory_mib> <starttime|0>
    fault <nvml function|*> <nvml return code> <gpu|-1>
    delay <nvml function|*> <milliseconds> <gpu|-1>
    end

``starttime`` is field 22 of ``/proc/<pid>/stat``; when non-zero, an entry whose pid now belongs to another
process (pid reuse) is ignored. ``gpu`` is always the GPU's NVML index. Unknown record types are kept verbatim.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace

from slurm_elastic.errors import SlurmElasticError

FORMAT_VERSION = 1
DEFAULT_DRIVER = "550.54.15"


class VgpuStateError(SlurmElasticError):
    """A virtual GPU state file or edit is invalid."""


@dataclass(frozen=True)
class GpuSpec:
    index: int
    minor: int
    memory_mib: int
    uuid: str
    name: str
    mig_capable: bool = False
    mig_current: bool = False
    mig_pending: bool = False


@dataclass(frozen=True)
class GiProfile:
    """A GPU-instance profile as ``nvmlDeviceGetGpuInstanceProfileInfo(gpu, index)`` reports it."""

    gpu: int
    index: int  # NVML_GPU_INSTANCE_PROFILE_* (what ProfileInfo takes)
    profile_id: int  # the id that Create*/PossiblePlacements take
    slices: int
    instances: int
    memory_mib: int
    sm_count: int
    placement_size: int
    starts: tuple[int, ...]
    name: str  # e.g. "MIG 3g.20gb"


@dataclass(frozen=True)
class CiProfile:
    gpu: int
    index: int  # NVML_COMPUTE_INSTANCE_PROFILE_*
    profile_id: int
    slices: int


@dataclass(frozen=True)
class GpuInstance:
    gpu: int
    id: int
    profile_id: int
    start: int
    size: int


@dataclass(frozen=True)
class ComputeInstance:
    gpu: int
    gi: int
    id: int
    profile_id: int
    start: int
    size: int


@dataclass(frozen=True)
class ProcessEntry:
    pid: int
    gpu: int
    sm_util: int
    mem_util: int
    memory_mib: int
    gi: int = -1
    ci: int = -1
    starttime: int = 0


@dataclass(frozen=True)
class Fault:
    """Makes ``function`` return NVML ``code`` (on one GPU, or all with gpu=-1)."""

    function: str
    code: int
    gpu: int = -1


@dataclass(frozen=True)
class Delay:
    """Makes ``function`` sleep ``ms`` before answering: a hung driver, for timeout tests."""

    function: str
    ms: int
    gpu: int = -1


@dataclass(frozen=True)
class VgpuState:
    gpus: tuple[GpuSpec, ...] = ()
    gi_profiles: tuple[GiProfile, ...] = ()
    ci_profiles: tuple[CiProfile, ...] = ()
    gpu_instances: tuple[GpuInstance, ...] = ()
    compute_instances: tuple[ComputeInstance, ...] = ()
    processes: tuple[ProcessEntry, ...] = ()
    faults: tuple[Fault, ...] = ()
    delays: tuple[Delay, ...] = ()
    driver: str = DEFAULT_DRIVER
    clock_us: int = 0
    extra: tuple[str, ...] = field(default=())

    def gpu(self, index: int) -> GpuSpec:
        for g in self.gpus:
            if g.index == index:
                return g
        raise VgpuStateError(f"no GPU with index {index}")


# ---- text format -------------------------------------------------------------------------------------------


def _b(flag: bool) -> int:
    return 1 if flag else 0


def format_state(state: VgpuState) -> str:
    """The state as the C library reads it. Round-trips through :func:`parse_state`."""
    validate_state(state)
    out = ["# slurm-elastic virtual GPU state (format: slurm_elastic/testing/vgpu/state.py)",
           f"vgpu-state {FORMAT_VERSION}"]
    out.append(f"driver {state.driver}")
    if state.clock_us:
        out.append(f"clock_us {state.clock_us}")
    for g in state.gpus:
        out.append(f"gpu {g.index} {g.minor} {g.memory_mib} {_b(g.mig_capable)} {g.uuid} {g.name}")
        if g.mig_capable:
            out.append(f"mig {g.index} {_b(g.mig_current)} {_b(g.mig_pending)}")
        for p in (p for p in state.gi_profiles if p.gpu == g.index):
            starts = ",".join(str(s) for s in p.starts)
            out.append(
                f"giprofile {p.gpu} {p.index} {p.profile_id} {p.slices} {p.instances} {p.memory_mib} "
                f"{p.sm_count} {p.placement_size} {starts} {p.name}"
            )
        for c in (c for c in state.ci_profiles if c.gpu == g.index):
            out.append(f"ciprofile {c.gpu} {c.index} {c.profile_id} {c.slices}")
    out += [f"gi {i.gpu} {i.id} {i.profile_id} {i.start} {i.size}" for i in state.gpu_instances]
    out += [f"ci {c.gpu} {c.gi} {c.id} {c.profile_id} {c.start} {c.size}" for c in state.compute_instances]
    out += [
        f"proc {p.pid} {p.gpu} {p.gi} {p.ci} {p.sm_util} {p.mem_util} {p.memory_mib} {p.starttime}"
        for p in state.processes
    ]
    out += [f"fault {f.function} {f.code} {f.gpu}" for f in state.faults]
    out += [f"delay {d.function} {d.ms} {d.gpu}" for d in state.delays]
    out += list(state.extra)
    out.append("end")
    return "\n".join(out) + "\n"


class TornStateError(VgpuStateError):
    """The text has no ``end`` record: a writer is still writing it."""


def _ints(fields: list[str], n: int, lineno: int, line: str) -> list[int]:
    if len(fields) < n:
        raise VgpuStateError(f"line {lineno}: expected {n} numbers: {line!r}")
    try:
        return [int(x) for x in fields[:n]]
    except ValueError as exc:
        raise VgpuStateError(f"line {lineno}: not a number in {line!r}") from exc


def parse_state(text: str) -> VgpuState:
    """Parses the state text. Raises :class:`TornStateError` without ``end``, :class:`VgpuStateError` if bad."""
    gpus: list[GpuSpec] = []
    mig: dict[int, tuple[bool, bool]] = {}
    gi_profiles: list[GiProfile] = []
    ci_profiles: list[CiProfile] = []
    gis: list[GpuInstance] = []
    cis: list[ComputeInstance] = []
    procs: list[ProcessEntry] = []
    faults: list[Fault] = []
    delays: list[Delay] = []
    extra: list[str] = []
    driver, clock_us = DEFAULT_DRIVER, 0
    header = ended = False
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if ended:
            raise VgpuStateError(f"line {lineno}: record after 'end'")
        kind, _, rest = line.partition(" ")
        fields = rest.split()
        if not header:
            if kind != "vgpu-state" or fields != [str(FORMAT_VERSION)]:
                raise VgpuStateError(f"line {lineno}: expected 'vgpu-state {FORMAT_VERSION}', got {line!r}")
            header = True
        elif kind == "end":
            ended = True
        elif kind == "driver":
            driver = rest.strip()
        elif kind == "clock_us":
            (clock_us,) = _ints(fields, 1, lineno, line)
        elif kind == "gpu":
            index, minor, mem, capable = _ints(fields, 4, lineno, line)
            parts = rest.split(None, 5)
            if len(parts) < 6:
                raise VgpuStateError(f"line {lineno}: gpu needs a uuid and a name: {line!r}")
            gpus.append(GpuSpec(index, minor, mem, parts[4], parts[5].strip(), bool(capable)))
        elif kind == "mig":
            g, cur, pend = _ints(fields, 3, lineno, line)
            mig[g] = (bool(cur), bool(pend))
        elif kind == "giprofile":
            nums = _ints(fields, 8, lineno, line)
            parts = rest.split(None, 9)
            if len(parts) < 10:
                raise VgpuStateError(f"line {lineno}: giprofile needs placements and a name: {line!r}")
            try:
                starts = tuple(int(s) for s in parts[8].split(","))
            except ValueError as exc:
                raise VgpuStateError(f"line {lineno}: bad placement starts {parts[8]!r}") from exc
            g, idx, pid_, slices, inst, mem, sm, size = nums
            gi_profiles.append(GiProfile(g, idx, pid_, slices, inst, mem, sm, size, starts, parts[9].strip()))
        elif kind == "ciprofile":
            ci_profiles.append(CiProfile(*_ints(fields, 4, lineno, line)))
        elif kind == "gi":
            gis.append(GpuInstance(*_ints(fields, 5, lineno, line)))
        elif kind == "ci":
            cis.append(ComputeInstance(*_ints(fields, 6, lineno, line)))
        elif kind == "proc":
            pid, gpu, gi, ci, sm, mu, mem, start = _ints(fields, 8, lineno, line)
            procs.append(ProcessEntry(pid, gpu, sm, mu, mem, gi, ci, start))
        elif kind in ("fault", "delay"):
            if len(fields) < 3:
                raise VgpuStateError(f"line {lineno}: {kind} needs function, value and gpu: {line!r}")
            value, gpu = _ints(fields[1:], 2, lineno, line)
            if kind == "fault":
                faults.append(Fault(fields[0], value, gpu))
            else:
                delays.append(Delay(fields[0], value, gpu))
        else:
            extra.append(line)
    if not header:
        raise TornStateError("state is empty")
    if not ended:
        raise TornStateError("state has no 'end' record (being written?)")
    gpus = [replace(g, mig_current=mig.get(g.index, (False, False))[0], mig_pending=mig.get(g.index, (False, False))[1])
            for g in gpus]
    state = VgpuState(
        gpus=tuple(gpus), gi_profiles=tuple(gi_profiles), ci_profiles=tuple(ci_profiles),
        gpu_instances=tuple(gis), compute_instances=tuple(cis), processes=tuple(procs), faults=tuple(faults),
        delays=tuple(delays), driver=driver, clock_us=clock_us, extra=tuple(extra),
    )
    validate_state(state)
    return state


_MAX_GPUS = 32  # the C library's limits (vnvml.c)
_MAX_GI_ID = 16
_MAX_CI_ID = 8


def validate_state(state: VgpuState) -> None:
    """Checks what the C library would refuse, so a bad edit fails in Python with a clear message."""
    indices = [g.index for g in state.gpus]
    if len(set(indices)) != len(indices):
        raise VgpuStateError(f"duplicate GPU index in {indices}")
    for g in state.gpus:
        if not 0 <= g.index < _MAX_GPUS:
            raise VgpuStateError(f"GPU index {g.index} outside 0..{_MAX_GPUS - 1}")
        if not g.uuid or any(c.isspace() for c in g.uuid) or not g.name.strip() or "\n" in g.name:
            raise VgpuStateError(f"GPU {g.index}: uuid must be one word and name one non-empty line")
    known = set(indices)
    for p in state.processes:
        if p.gpu not in known:
            raise VgpuStateError(f"process {p.pid} on unknown GPU {p.gpu}")
        if not (0 <= p.sm_util <= 100 and 0 <= p.mem_util <= 100) or p.memory_mib < 0 or p.pid <= 0:
            raise VgpuStateError(f"process entry out of range: {p}")
    for i in state.gpu_instances:
        if i.gpu not in known or not 0 <= i.id < _MAX_GI_ID:
            raise VgpuStateError(f"bad GPU instance {i}")
    for c in state.compute_instances:
        if c.gpu not in known or not 0 <= c.id < _MAX_CI_ID or not 0 <= c.gi < _MAX_GI_ID:
            raise VgpuStateError(f"bad compute instance {c}")
    for name in [f.function for f in state.faults] + [d.function for d in state.delays]:
        if not name or any(ch.isspace() for ch in name):
            raise VgpuStateError(f"bad fault function name {name!r}")


# ---- building states ---------------------------------------------------------------------------------------

A100_40GB_NAME = "NVIDIA A100-SXM4-40GB"
A100_40GB_MIB = 40960


def gpu_uuid(node: str, index: int) -> str:
    """A stable, node-unique GPU UUID in NVML's form ``GPU-xxxxxxxx-xxxx-...``."""
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"slurm-elastic-vgpu://{node}/{index}"))


def a100_mig_profiles(gpu: int) -> tuple[tuple[GiProfile, ...], tuple[CiProfile, ...]]:
    """The MIG profiles of an A100-SXM4-40GB as NVML reports them (index, id, slices, placements)."""
    gi = (
        GiProfile(gpu, 0, 19, 1, 7, 4864, 14, 1, (0, 1, 2, 3, 4, 5, 6), "MIG 1g.5gb"),
        GiProfile(gpu, 1, 14, 2, 3, 9856, 28, 2, (0, 2, 4), "MIG 2g.10gb"),
        GiProfile(gpu, 2, 9, 3, 2, 19968, 42, 4, (0, 4), "MIG 3g.20gb"),
        GiProfile(gpu, 3, 5, 4, 1, 19968, 56, 4, (0,), "MIG 4g.20gb"),
        GiProfile(gpu, 4, 0, 7, 1, 40192, 98, 8, (0,), "MIG 7g.40gb"),
        GiProfile(gpu, 7, 20, 1, 1, 4864, 14, 1, (0, 1, 2, 3, 4, 5, 6), "MIG 1g.5gb+me"),
        GiProfile(gpu, 9, 15, 1, 4, 9856, 14, 2, (0, 2, 4, 6), "MIG 1g.10gb"),
    )
    ci = tuple(CiProfile(gpu, i, i, s) for i, s in ((0, 1), (1, 2), (2, 3), (3, 4), (4, 7)))
    return gi, ci


def make_node_state(
    node: str,
    gpus: int = 4,
    *,
    minor_base: int = 0,
    name: str = A100_40GB_NAME,
    memory_mib: int = A100_40GB_MIB,
    mig_capable: bool = True,
) -> VgpuState:
    """A node's initial state: ``gpus`` idle GPUs indexed 0.., minors from ``minor_base``, MIG off."""
    specs: list[GpuSpec] = []
    gip: list[GiProfile] = []
    cip: list[CiProfile] = []
    for i in range(gpus):
        specs.append(GpuSpec(i, minor_base + i, memory_mib, gpu_uuid(node, i), name, mig_capable))
        if mig_capable:
            g, c = a100_mig_profiles(i)
            gip += g
            cip += c
    return VgpuState(gpus=tuple(specs), gi_profiles=tuple(gip), ci_profiles=tuple(cip))


def with_process(
    state: VgpuState, pid: int, gpus: tuple[int, ...], *, sm_util: int, memory_mib: int, mem_util: int | None = None,
    starttime: int = 0, gi: int = -1, ci: int = -1,
) -> VgpuState:
    """Registers ``pid`` on each of ``gpus`` (replacing its earlier entries)."""
    for g in gpus:
        state.gpu(g)
    mu = round(sm_util * 0.4) if mem_util is None else mem_util
    entries = tuple(ProcessEntry(pid, g, sm_util, mu, memory_mib, gi, ci, starttime) for g in gpus)
    new = replace(state, processes=tuple(p for p in state.processes if p.pid != pid) + entries)
    validate_state(new)
    return new


def without_pid(state: VgpuState, pid: int) -> VgpuState:
    return replace(state, processes=tuple(p for p in state.processes if p.pid != pid))


def with_utilization(state: VgpuState, pid: int, sm_util: int, mem_util: int | None = None) -> VgpuState:
    """Changes the utilization of every entry of ``pid``."""
    mu = round(sm_util * 0.4) if mem_util is None else mem_util
    procs = tuple(replace(p, sm_util=sm_util, mem_util=mu) if p.pid == pid else p for p in state.processes)
    new = replace(state, processes=procs)
    validate_state(new)
    return new


def with_fault(state: VgpuState, function: str, code: int, gpu: int = -1) -> VgpuState:
    return replace(state, faults=(*state.faults, Fault(function, code, gpu)))


def with_delay(state: VgpuState, function: str, ms: int, gpu: int = -1) -> VgpuState:
    return replace(state, delays=(*state.delays, Delay(function, ms, gpu)))


def without_faults(state: VgpuState) -> VgpuState:
    return replace(state, faults=(), delays=())


def with_mig(state: VgpuState, gpu: int, instances: tuple[tuple[str, int], ...]) -> VgpuState:
    """Puts ``gpu`` in MIG mode with GPU instances given as (profile name, placement start), each holding one
    compute instance that spans it, like ``nvidia-smi mig -cgi 3g.20gb:0,... -C``. For tests and the demo; the
    MIG-apply workflow goes through real NVML calls instead."""
    g = state.gpu(gpu)
    if not g.mig_capable:
        raise VgpuStateError(f"GPU {gpu} is not MIG capable")
    profiles = {p.name.removeprefix("MIG "): p for p in state.gi_profiles if p.gpu == gpu}
    ci_by_slices = {c.slices: c for c in state.ci_profiles if c.gpu == gpu}
    gis = [i for i in state.gpu_instances if i.gpu != gpu]
    cis = [c for c in state.compute_instances if c.gpu != gpu]
    used: list[tuple[int, int]] = []
    for n, (pname, start) in enumerate(instances, start=1):
        prof = profiles.get(pname)
        if prof is None:
            raise VgpuStateError(f"GPU {gpu}: unknown MIG profile {pname!r} (known: {sorted(profiles)})")
        if start not in prof.starts or any(start < s + z and s < start + prof.placement_size for s, z in used):
            raise VgpuStateError(f"GPU {gpu}: placement {start} of {pname} is invalid or taken")
        used.append((start, prof.placement_size))
        ci = ci_by_slices.get(prof.slices)
        if ci is None:
            raise VgpuStateError(f"GPU {gpu}: no compute-instance profile with {prof.slices} slices")
        gis.append(GpuInstance(gpu, n, prof.profile_id, start, prof.placement_size))
        cis.append(ComputeInstance(gpu, n, 0, ci.profile_id, 0, prof.slices))
    gpus = tuple(replace(x, mig_current=True, mig_pending=True) if x.index == gpu else x for x in state.gpus)
    return replace(state, gpus=gpus, gpu_instances=tuple(gis), compute_instances=tuple(cis))
