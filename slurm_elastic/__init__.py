"""slurm-elastic: a Slurm-native elastic job controller for GPU training."""

__version__ = "0.1.0"
