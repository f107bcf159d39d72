"""hpcrun: plan and run large data-processing campaigns on Slurm HPC systems."""

__version__ = "0.1.0"
