"""Grids of runs side by side: launching them, their tables, statistics and plots."""
