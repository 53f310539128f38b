"""Experiment grids (sweeps) and reports."""
