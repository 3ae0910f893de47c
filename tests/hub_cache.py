"""Lay a checkpoint folder out as the Hugging Face hub client caches a download, for offline tests of hub ids.

    <cache>/models--<org>--<name>/blobs/<sha256>             the file contents
    <cache>/models--<org>--<name>/snapshots/<commit>/<path>  relative symlinks to the blobs
    <cache>/models--<org>--<name>/refs/main                  the commit
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def lay_out_hub_cache(source: Path, cache_dir: Path, repo_id: str, commit: str = COMMIT) -> Path:
    """Copy every file under `source` into `cache_dir` as the cached snapshot `commit` of `repo_id` (refs/main);
    returns the snapshot folder."""
    repo = Path(cache_dir) / ("models--" + repo_id.replace("/", "--"))
    blobs, snapshot = repo / "blobs", repo / "snapshots" / commit
    blobs.mkdir(parents=True, exist_ok=True)
    for file in sorted(p for p in Path(source).rglob("*") if p.is_file()):
        digest = hashlib.sha256(file.read_bytes()).hexdigest()
        blob = blobs / digest
        if not blob.exists():
            shutil.copyfile(file, blob)
        link = snapshot / file.relative_to(source)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return snapshot
