"""The GPU worker's torch.compile results kept in one file across fresh machines (`VOXSERVE_COMPILE_CACHE`).

A server in a fresh container (or on a GPU host that starts bare) compiles the codec
again at start-up: 96-131 s of the H200's 216-293 s start-ups (runs 2026-12-01_a7fe391 and 2026-12-01_2a42666).
torch's portable cache
(`torch.compiler.save_cache_artifacts` / `load_cache_artifacts`) carries inductor's compiled graphs in one blob:
loaded before anything compiles, the same graphs hit instead of compiling. torch checks each entry's key (graph,
torch version, device), so a stale file only misses.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

ENV_VAR = "VOXSERVE_COMPILE_CACHE"


def cache_path() -> Path | None:
    value = os.environ.get(ENV_VAR, "")
    return Path(value) if value else None


def load_compile_cache(path: Path | None) -> bool:
    """Load the file's artifacts into torch's caches before anything compiles; False when there is none to load."""
    if path is None or not path.is_file():
        return False
    try:
        info = torch.compiler.load_cache_artifacts(path.read_bytes())
    except Exception as exc:  # a damaged or foreign file: compile as if there were none
        logger.warning("voxserve: compile cache %s not loaded (%s: %s); compiling", path, type(exc).__name__, exc)
        return False
    if info is None:  # torch logs why (a damaged file fails its checksum) and loads nothing
        logger.warning("voxserve: compile cache %s not loaded (unreadable); compiling", path)
        return False
    entries = sum(len(keys) for keys in info.artifacts.values())
    logger.info("voxserve: compile cache %s loaded (%d entries)", path, entries)
    return True


def _compiled_anything_new() -> bool:
    from torch._dynamo.utils import counters  # inductor's own cache counters (what its tests read)

    return counters["inductor"]["fxgraph_cache_miss"] > 0


def save_compile_cache(path: Path | None) -> bool:
    """Write this process's compile results to `path` once it compiled anything the cache did not hold (the blob
    holds the entries it hit too); atomically, as two servers may start at once. False if nothing was written."""
    if path is None or not _compiled_anything_new():
        return False
    saved = torch.compiler.save_cache_artifacts()
    if saved is None:
        return False
    data, _ = saved
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_bytes(data)
    os.replace(partial, path)
    logger.info("voxserve: compile cache written to %s (%.1f MB)", path, len(data) / 1e6)
    return True
