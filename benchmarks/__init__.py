"""Streaming text-to-speech serving benchmarks: open-loop client, SLO metrics, sweeps, capacity search, ablation.

Speaks to any server over HTTP only; imports nothing from vllm_voxserve.
"""
