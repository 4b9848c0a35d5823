"""The node agent: per-job GPU telemetry through NVML, served as signed JSON and Prometheus metrics.

Pure core: :mod:`.jobmap` (cgroup/environ/map-file parsing), :mod:`.attribution` (devices and processes to jobs),
:mod:`.aggregate` (per-job window statistics), :mod:`.payload` (the v1 wire schema and its validator),
:mod:`.auth` (request signing). Imperative shell: :mod:`.reader` (the ``GpuReader`` port and its NVML adapter),
:mod:`.procfs` (/proc and map files), :mod:`.bounded` (NVML on a worker thread with a timeout),
:mod:`.sampler` (one sample end to end), :mod:`.server` (aiohttp), :mod:`.client` (the controller's side).
See docs/agent.md.
"""
