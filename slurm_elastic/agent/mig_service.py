"""The agent's MIG side: report the node's MIG layout and apply a requested one, through NVML.

``GET /v1/mig`` answers :meth:`MigService.report`; ``POST /v1/mig/apply`` runs :meth:`MigService.apply` (one
apply at a time per agent). Both plan with what NVML reports (profiles, placements), checked against the catalog
(:func:`slurm_elastic.mig.nvml_check.effective_model`); disagreements are reported as notes per GPU.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pynvml

from slurm_elastic.agent.mig_nvml import MigNotSupportedError, NvmlMigDevice
from slurm_elastic.mig.apply import apply_node
from slurm_elastic.mig.catalog import Catalog
from slurm_elastic.mig.device import MigDevice, observe, report_of
from slurm_elastic.mig.errors import GresRenderError, LayoutError, LayoutProblem, MigDeviceError, MigRejectReason
from slurm_elastic.mig.gres import parse_mig_minors
from slurm_elastic.mig.model import GpuState, NodeLayout
from slurm_elastic.mig.nvml_check import effective_model
from slurm_elastic.mig.wire import ApplyAnswer, GpuMigReport, NodeMigReport

log = logging.getLogger("slurm_elastic.agent.mig")
DEFAULT_MIG_MINORS = Path("/proc/driver/nvidia-caps/mig-minors")


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class NvmlDevices:
    """The node's GPUs as :class:`NvmlMigDevice` objects, plus the identity fields the report carries."""

    def __init__(self, nvml: Any = pynvml) -> None:
        self._n = nvml
        self._open = False

    def open(self) -> None:
        if not self._open:
            self._n.nvmlInit()  # reference counted by NVML: the sampler holds its own
            self._open = True

    def close(self) -> None:
        if self._open:
            self._open = False
            try:
                self._n.nvmlShutdown()
            except self._n.NVMLError:
                pass

    def devices(self) -> Sequence[MigDevice]:
        self.open()
        return tuple(NvmlMigDevice(i, self._n) for i in range(int(self._n.nvmlDeviceGetCount())))

    def identity(self, index: int) -> tuple[str | None, int | None]:
        """(UUID, minor number) of a GPU; None where NVML cannot say."""
        n = self._n
        try:
            h = n.nvmlDeviceGetHandleByIndex(index)
        except n.NVMLError:
            return None, None
        uuid: str | None
        minor: int | None
        try:
            uuid = _text(n.nvmlDeviceGetUUID(h))
        except n.NVMLError:
            uuid = None
        try:
            minor = int(n.nvmlDeviceGetMinorNumber(h))
        except n.NVMLError:
            minor = None
        return uuid, minor


class MigApplyRefused(LayoutError):
    """The request names GPUs that are missing or not MIG capable."""


class MigService:
    def __init__(
        self,
        node: str,
        catalog: Catalog,
        *,
        devices: Callable[[], Sequence[MigDevice]],
        identity: Callable[[int], tuple[str | None, int | None]] = lambda i: (None, None),
        mig_minors_file: Path = DEFAULT_MIG_MINORS,
        allow_apply: bool = True,
    ) -> None:
        self.node = node
        self.catalog = catalog
        self._devices = devices
        self._identity = identity
        self._minors_file = mig_minors_file
        self.allow_apply = allow_apply
        self._lock = threading.Lock()  # one apply (or report) at a time: NVML MIG changes are not atomic

    def _minors(self) -> tuple[tuple[str, int], ...]:
        try:
            text = self._minors_file.read_text(encoding="utf-8")
        except OSError:
            return ()  # no MIG driver support here (or the virtual layer): nothing to report
        try:
            return tuple(sorted(parse_mig_minors(text).items()))
        except GresRenderError as exc:
            log.warning("cannot read %s: %s", self._minors_file, exc)
            return ()

    def _gpu(self, device: MigDevice) -> GpuMigReport:
        uuid, minor = self._identity(device.index)
        name = device.name()
        pci = device.pci_device_id() or None
        try:
            device.get_mig_mode()
        except MigNotSupportedError:
            return GpuMigReport(device.index, name, uuid, minor, False, GpuState(device.index, name, False), None,
                                pci_device_id=pci)
        catalog_gpu = self.catalog.find(name)
        if catalog_gpu is None and pci:
            catalog_gpu = self.catalog.by_pci_device_id(pci)
        model, notes = effective_model(report_of(device), catalog_gpu)
        state = observe(device, model.model)
        return GpuMigReport(device.index, name, uuid, minor, True, state, model, tuple(n.message for n in notes),
                            pci_device_id=pci)

    def _report(self, devices: Sequence[MigDevice]) -> NodeMigReport:
        return NodeMigReport(self.node, tuple(self._gpu(d) for d in devices), self._minors())

    def report(self) -> NodeMigReport:
        """The node's MIG state now (raises MigDeviceError when NVML fails)."""
        with self._lock:
            return self._report(self._devices())

    def apply(self, layout: NodeLayout) -> ApplyAnswer:
        """Apply ``layout`` (only what is missing). Raises LayoutError (bad request) or MigApplyError."""
        with self._lock:
            devices = self._devices()
            before = self._report(devices)
            problems = []
            for index, _ in layout.gpus:
                g = before.gpu(index)
                if g is None:
                    problems.append(LayoutProblem(MigRejectReason.UNKNOWN_PROFILE,
                                                  f"GPU {index} does not exist on {self.node}"))
                elif not g.mig_capable:
                    problems.append(LayoutProblem(MigRejectReason.UNKNOWN_PROFILE,
                                                  f"GPU {index} ({g.name}) has no MIG mode"))
            if problems:
                raise MigApplyRefused(problems)
            result = apply_node(devices, before.models(), layout)
            for line in result.changes:
                log.info("MIG apply on %s: %s", self.node, line)
            return ApplyAnswer(result.changes, self._report(devices))


def nvml_mig_service(node: str, catalog: Catalog, *, mig_minors_file: Path = DEFAULT_MIG_MINORS,
                     allow_apply: bool = True, nvml: Any = pynvml) -> tuple[MigService, NvmlDevices]:
    """The production service over NVML; close the returned :class:`NvmlDevices` on exit."""
    devs = NvmlDevices(nvml)
    service = MigService(node, catalog, devices=devs.devices, identity=devs.identity,
                         mig_minors_file=mig_minors_file, allow_apply=allow_apply)
    return service, devs


__all__ = ["MigApplyRefused", "MigDeviceError", "MigService", "NvmlDevices", "nvml_mig_service"]
