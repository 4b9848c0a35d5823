"""A real Prometheus (Debian's package; scripts/bootstrap installs it) on loopback for cluster tests."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

from tests.cluster.harness import stop_processes


@contextlib.contextmanager
def running_prometheus(tmp: Path, port: int, scrape_configs: str) -> Iterator[subprocess.Popen[bytes]]:
    """Prometheus scraping every second with ``scrape_configs`` (YAML list items) on 127.0.0.1:``port``, its
    config, TSDB and log under ``tmp``; stopped on exit."""
    binary = shutil.which("prometheus")
    assert binary, "prometheus is not installed: run scripts/bootstrap"
    cfg = tmp / "prometheus.yml"
    cfg.write_text("\nglobal: {scrape_interval: 1s, evaluation_interval: 1s}\nscrape_configs:\n" + scrape_configs)
    with open(tmp / "prometheus.log", "wb") as log:
        prom = subprocess.Popen([binary, f"--config.file={cfg}", f"--storage.tsdb.path={tmp / 'tsdb'}",
                                 f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    try:
        yield prom
    finally:
        stop_processes([prom])
