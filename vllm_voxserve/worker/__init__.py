"""Adapters to vLLM's workers and model runners: thin, each subclassing a documented hook."""
