"""Fixtures for the real sshd, the real SLURM and the fake nvidia-smi."""
