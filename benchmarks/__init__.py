"""Benchmarks and profiling: above mars_core and tasks, below the app."""
