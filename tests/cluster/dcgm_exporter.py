"""A stand-in for NVIDIA dcgm-exporter, for tests: its documented text format and HPC job mapping.

dcgm-exporter serves one series per GPU (labels ``gpu, UUID, pci_bus_id, device, modelName, Hostname``) and, with
``--hpc-job-mapping-dir``, reads one file per GPU index naming the job(s) on it, one series per job with the job
in ``hpc_job``. :func:`dcgm_text` renders that format; :class:`VgpuDcgmExporter` serves it per node of the test
cluster from the virtual GPUs' state file (utilization and memory computed as the virtual NVML library computes
them) and the prolog's GPU map files (the job id is their first field).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from slurm_elastic.testing.vgpu.statefile import StateFile, process_starttime

FAMILIES = (("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)."),
            ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)."),
            ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB)."))


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    model: str
    util: int
    fb_used: int
    fb_total: int
    jobs: tuple[str, ...]  # from the HPC job mapping; () for a GPU no job holds


def dcgm_text(hostname: str, gpus: Sequence[Gpu], driver: str = "550.54.15") -> str:
    lines: list[str] = []
    for name, doc in FAMILIES:
        lines += [f"# HELP {name} {doc}", f"# TYPE {name} gauge"]
        for g in gpus:
            value = {"DCGM_FI_DEV_GPU_UTIL": g.util, "DCGM_FI_DEV_FB_USED": g.fb_used,
                     "DCGM_FI_DEV_FB_FREE": g.fb_total - g.fb_used}[name]
            base = (f'gpu="{g.index}",UUID="{g.uuid}",pci_bus_id="00000000:{g.index + 0x17:02X}:00.0",'
                    f'device="nvidia{g.index}",modelName="{g.model}",Hostname="{hostname}",'
                    f'DCGM_FI_DRIVER_VERSION="{driver}"')
            for job in g.jobs or (None,):
                labels = base if job is None else f'{base},hpc_job="{job}"'
                lines.append(f"{name}{{{labels}}} {value}")
    return "\n".join(lines) + "\n"


def vgpu_gpus(state_file: Path, map_dir: Path) -> list[Gpu]:
    """A node's GPUs as its virtual NVML reports them, with the jobs of its GPU map files."""
    state = StateFile(state_file).read()
    out = []
    for spec in state.gpus:
        alive = [p for p in state.processes if p.gpu == spec.index and p.pid > 0
                 and (start := process_starttime(p.pid)) != 0 and p.starttime in (0, start)]
        util = min(100, sum(p.sm_util for p in alive))
        used = min(spec.memory_mib, sum(p.memory_mib for p in alive))
        try:
            jobs = tuple(line.split()[0] for line in (map_dir / str(spec.index)).read_text().splitlines()
                         if line.split())
        except OSError:
            jobs = ()
        out.append(Gpu(spec.index, spec.uuid, spec.name, util, used, spec.memory_mib, jobs))
    return out


def serve_text(render: Callable[[], str], port: int = 0) -> ThreadingHTTPServer:
    """An HTTP server answering GET /metrics with ``render()``, in a daemon thread; ``.shutdown()`` stops it."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path != "/metrics":
                self.send_error(404)
                return
            body = render().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@contextlib.contextmanager
def vgpu_dcgm_exporters(root: Path, nodes: Sequence[str], hostname: Callable[[str], str] = str
                        ) -> Iterator[dict[str, str]]:
    """One exporter per node of the test cluster (its vgpu state and gpu-map); yields node -> host:port."""
    servers = {}
    try:
        for node in nodes:
            servers[node] = serve_text(lambda node=node: dcgm_text(hostname(node), vgpu_gpus(  # type: ignore[misc]
                root / "vgpu" / f"{node}.state", root / "gpu-map" / node)))
        yield {n: f"127.0.0.1:{s.server_address[1]}" for n, s in servers.items()}
    finally:
        for s in servers.values():
            s.shutdown()
            s.server_close()
