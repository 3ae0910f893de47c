"""Discrete-event simulation of the serving policy on one GPU: `python -m benchmarks.simulation --help`."""
