"""``python -m slurm_elastic.cli`` = ``slurm-elastic``."""

from slurm_elastic.cli import main

main()
