"""Runnable experiments (python -m fedrun.experiments.NAME)."""
