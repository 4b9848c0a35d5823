"""One sample of the node, end to end (the imperative shell around the pure attribution and aggregation).

Every side effect enters through an injected object: the GPU reader, the /proc resolver, the map reader and the
clock. NVML runs on a bounded worker thread (:mod:`.bounded`), so a hung driver costs at most ``nvml_timeout_s``
per sample and never blocks the agent. A failed NVML read is reported in the sample (status "error", an error
entry) and the reader is re-opened next time; allocations from the map files are still reported, unmeasured.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from slurm_elastic import __version__
from slurm_elastic.agent.aggregate import JobHistory
from slurm_elastic.agent.attribution import attribute
from slurm_elastic.agent.bounded import BoundedCaller
from slurm_elastic.agent.errors import (
    NvmlBusyError,
    NvmlReadError,
    NvmlTimeoutError,
    NvmlUnavailableError,
    PayloadError,
)
from slurm_elastic.agent.metrics import AgentCounters
from slurm_elastic.agent.model import DeviceReading, SampleError
from slurm_elastic.agent.mps import MpsReader
from slurm_elastic.agent.payload import ErrorReport, MpsGpuReport, NodeReport, NvmlInfo, to_json_bytes
from slurm_elastic.agent.procfs import GpuMapReader, ProcJobResolver
from slurm_elastic.agent.reader import GpuReader, NullGpuReader

log = logging.getLogger("slurm_elastic.agent")


class Sampler:
    def __init__(
        self,
        *,
        node: str,
        reader: GpuReader,
        resolver: ProcJobResolver,
        gpu_map: GpuMapReader,
        interval_s: float,
        window_s: float,
        nvml_timeout_s: float,
        degraded_ok: bool = False,
        clock: Callable[[], float] = time.time,
        mps: MpsReader | None = None,
    ) -> None:
        self.node = node
        self.interval_s = interval_s
        self.window_s = window_s
        self._reader = reader
        self._resolver = resolver
        self._gpu_map = gpu_map
        self._timeout = nvml_timeout_s
        self._degraded_ok = degraded_ok
        self._clock = clock
        self._mps = mps
        self._caller = BoundedCaller("nvml")
        self._history = JobHistory(window_s)
        self._lock = threading.Lock()
        self._latest: NodeReport | None = None
        self._latest_json: bytes | None = None
        self._nvml = NvmlInfo("error", None, "not started")
        self._reopen = False
        self._last_codes: frozenset[str] = frozenset()
        self.counters = AgentCounters()

    # -- lifecycle -----------------------------------------------------------------------------------------
    def start(self) -> NvmlInfo:
        """Opens NVML. Raises NvmlUnavailableError, unless configured to run degraded (reporting no GPUs)."""
        try:
            driver = self._caller.call(self._reader.open, self._timeout)
        except NvmlTimeoutError as exc:
            self._nvml_unavailable(NvmlUnavailableError("nvml_timeout", f"NVML initialisation hung: {exc}"))
        except NvmlUnavailableError as exc:
            self._nvml_unavailable(exc)
        else:
            self._nvml = NvmlInfo("ok", driver, None)
        return self._nvml

    def _nvml_unavailable(self, exc: NvmlUnavailableError) -> None:
        if not self._degraded_ok:
            raise exc
        log.warning("NVML unavailable (%s): running degraded, reporting no GPUs", exc)
        self._reader = NullGpuReader()
        self._nvml = NvmlInfo("degraded", None, f"{exc}; reporting no GPUs")

    def latest_nvml_status(self) -> str:
        """"ok", "degraded" (running without NVML) or "error"."""
        return self._nvml.status

    def close(self) -> None:
        if not self._caller.busy:
            try:
                self._caller.call(self._reader.close, self._timeout)
            except (NvmlTimeoutError, NvmlBusyError):
                pass
        self._caller.close()

    # -- sampling ------------------------------------------------------------------------------------------
    def _read_devices(self, errors: list[SampleError]) -> tuple[tuple[DeviceReading, ...], NvmlInfo]:
        base = self._nvml
        try:
            if self._reopen:
                self._caller.call(self._reader.close, self._timeout)
                driver = self._caller.call(self._reader.open, self._timeout)
                base = self._nvml = NvmlInfo("ok", driver, None)
                self._reopen = False
            reading = self._caller.call(self._reader.read, self._timeout)
        except (NvmlReadError, NvmlUnavailableError) as exc:
            self._reopen = True
            errors.append(SampleError(exc.reason, str(exc)))
        except NvmlTimeoutError as exc:
            errors.append(SampleError("nvml_timeout", str(exc)))
        except NvmlBusyError as exc:
            errors.append(SampleError("nvml_busy", str(exc)))
        else:
            errors.extend(reading.errors)
            return reading.devices, base
        return (), NvmlInfo("error", base.driver_version, errors[-1].message)

    def sample_once(self) -> NodeReport:
        t0 = time.monotonic()
        now = self._clock()
        errors: list[SampleError] = []
        devices, nvml = self._read_devices(errors)
        allocations, map_errors = self._gpu_map.read()
        errors += map_errors
        pid_jobs = self._resolver.resolve(p.pid for d in devices for p in d.processes)
        gpus, points = attribute(devices, allocations, pid_jobs)
        self._history.add(now, points)
        report = NodeReport(
            node=self.node, agent_version=__version__, generated_at=now, sampled_at=now,
            interval_s=self.interval_s, window_s=self.window_s, nvml=nvml, gpus=gpus,
            jobs=self._history.jobs(now),
            errors=tuple(ErrorReport(e.code, e.message, e.device) for e in errors),
            mps=self._read_mps(),
        )
        try:
            body = to_json_bytes(report)
        except PayloadError:
            log.exception("sample does not match the payload schema (a bug); keeping the previous one")
            raise
        duration = time.monotonic() - t0
        with self._lock:
            self._latest, self._latest_json = report, body
            self.counters.samples_total += 1
            self.counters.last_sample_duration_s = duration
            for e in errors:
                self.counters.sample_errors_total[e.code] = self.counters.sample_errors_total.get(e.code, 0) + 1
        self._log_errors(errors)
        return report

    def _read_mps(self) -> tuple[MpsGpuReport, ...]:
        if self._mps is None:
            return ()
        return tuple(MpsGpuReport(m.gpu, m.daemon, m.pipe_dir, m.servers, m.jobs, m.active_thread_percentage,
                                  m.error) for m in self._mps.read())

    def _log_errors(self, errors: list[SampleError]) -> None:
        """Logs a problem when it appears and when it clears, not at every sample."""
        codes = frozenset(e.code for e in errors)
        for e in errors:
            if e.code not in self._last_codes:
                log.warning("sample: %s: %s", e.code, e.message)
        for code in sorted(self._last_codes - codes):
            log.info("sample: %s cleared", code)
        self._last_codes = codes

    def latest(self) -> tuple[NodeReport | None, bytes | None]:
        with self._lock:
            return self._latest, self._latest_json

    def snapshot(self) -> tuple[NodeReport | None, AgentCounters]:
        with self._lock:
            c = self.counters
            return self._latest, AgentCounters(c.samples_total, dict(c.sample_errors_total), c.last_sample_duration_s)
