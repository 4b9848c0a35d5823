"""Test and demo support: never part of what a site installs.

The wheel leaves this package out (``[tool.setuptools.packages.find]`` in pyproject.toml) and no production module
imports it (tests/unit/test_testing_package.py). It holds what the tests, the benchmarks and ``scripts/demo`` run
from the source tree:

- :mod:`~slurm_elastic.testing.vgpu` - virtual GPUs beneath nvidia-ml-py (a ``libnvidia-ml.so.1``, its per-node
  state files and a pretend workload for jobs on the test clusters);
- :mod:`~slurm_elastic.testing.mig_fake` - :class:`FakeMigDevice`, an in-memory MIG GPU;
- :mod:`~slurm_elastic.testing.demo` - the live demo on the local test cluster (``scripts/demo``, whose command
  line is :mod:`~slurm_elastic.testing.demo_cli`);
- :mod:`~slurm_elastic.testing.promql_names` - metric names in PromQL, to check dashboards against /metrics.
"""
