"""The JSON record of a benchmark: what ran, where, against what, and every request's timeline."""

from __future__ import annotations

import dataclasses
import gzip
import json
import lzma
import math
import os
import platform
import shlex
import socket
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from benchmarks.metrics import FAILED, RateSummary, Timeline, text_ready_times

RECORD_VERSION = 1


def git_commit(repo_dir: str | Path | None = None) -> str | None:
    """HEAD's commit, with "+dirty" when the work tree has uncommitted changes; None outside git. VOXSERVE_COMMIT, where
    set, wins: the GPU machine's copy of the tree can carry a stale .git (a run 2026-11-30_cf01941 run at b1f2127
    recorded cf01941), so its commands name the commit they were sent from."""
    if os.environ.get("VOXSERVE_COMMIT"):
        return os.environ["VOXSERVE_COMMIT"]
    cwd = Path(repo_dir) if repo_dir else Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, timeout=10)
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _gpu_names() -> list[str]:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []


def machine_info() -> dict[str, Any]:
    return {"hostname": socket.gethostname(), "platform": platform.platform(), "python": sys.version.split()[0],
            "cpu": cpu_name(), "cpu_count": os.cpu_count(), "gpus": _gpu_names()}


def summary_json(summary: RateSummary) -> dict[str, Any]:
    return dataclasses.asdict(summary)


def config_json(config: Any) -> Any:
    return dataclasses.asdict(config) if dataclasses.is_dataclass(config) else config


def build_record(kind: str, server: str, model: str | None, config: Any, body: dict[str, Any],
                 command: list[str] | None = None) -> dict[str, Any]:
    """`body` holds the kind-specific results (runs, summaries, capacities, ...)."""
    return {
        "record_version": RECORD_VERSION,
        "kind": kind,
        "server": server,
        "model": model,
        "command": shlex.join(command if command is not None else sys.argv),
        "commit": git_commit(),
        "machine": machine_info(),
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "config": config_json(config),
        **body,
    }


def write_record(record: dict[str, Any], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".tmp")  # a run killed mid-write keeps the previous record
    partial.write_text(json.dumps(record, indent=1, default=str) + "\n", encoding="utf-8")
    os.replace(partial, path)
    return path


def _read_file(path: Path) -> dict[str, Any]:
    data = path.read_bytes()
    if path.suffix == ".xz":
        data = lzma.decompress(data)
    elif path.suffix == ".gz":
        data = gzip.decompress(data)
    return json.loads(data.decode("utf-8"))


def read_record(folder: str | Path) -> dict[str, Any]:
    """The record of a results folder: record.json, or record.json.xz / .gz as committed (keeps the repository
    small: the tree travels to the GPU machine beside a 60 MiB part of the vLLM stack, 64 MiB in all); or a record
    file itself (NAME.json, NAME.json.xz, NAME.json.gz)."""
    folder = Path(folder)
    if folder.is_file():
        return _read_file(folder)
    for name in ("record.json", "record.json.xz"):
        if (folder / name).exists():
            return _read_file(folder / name)
    return _read_file(folder / "record.json.gz")


_SLIM_DROPPED = ("text", "chunk_times_s", "header_bytes")
SLIM_TICK_S = 1e-4  # a slimmed chunk's lag behind playback is in whole ticks of 0.1 ms


def first_audio_s(request: dict[str, Any]) -> float | None:
    """Seconds from the run's start to a recorded request's first audio (the first chunk carrying audio bytes, not a
    lone WAV header), in a full record (every chunk's time) or a slimmed one (`first_audio_s`)."""
    if "first_audio_s" in request:
        return request["first_audio_s"]
    times = request.get("chunk_times_s") or []
    sizes = request.get("chunk_audio_bytes")
    if sizes is None:
        return times[0] if times else None
    return next((t for t, size in zip(times, sizes) if size > 0), None)


def _chunk_origin(request: dict[str, Any], first_audio: float | None) -> float:
    """What slimmed chunk times count from: the first audio, or the sending time in a stream that brought none."""
    for origin in (first_audio, request.get("sent_s"), request.get("scheduled_s")):
        if origin is not None:
            return origin
    return 0.0


def _audio_before(sizes: list[int], bytes_per_second: float) -> list[float]:
    """Seconds of audio in the chunks before each chunk."""
    before, total = [], 0.0
    for size in sizes:
        before.append(total)
        total += size / bytes_per_second
    return before


def encode_chunk_lags(times: list[float], sizes: list[int], bytes_per_second: float, origin: float) -> list[int]:
    """Each chunk's lag: its arrival minus the time the audio before it runs out when played without pause from the
    first audio (`origin`), in whole ticks rounded down. A player's total pause is the largest lag (see
    metrics.playback_pause_s), so rounding down keeps, for any stall threshold of whole ticks, whether it is reached."""
    before = _audio_before(sizes, bytes_per_second)
    return [math.floor((t - origin - played) / SLIM_TICK_S) for t, played in zip(times, before)]


def decode_chunk_lags(lags: list[int], sizes: list[int], bytes_per_second: float, origin: float) -> list[float]:
    """Chunk times from lags: the first audio at `origin`, every other chunk in the middle of its tick (so a pause
    sits half a tick from any threshold of whole ticks, clear of float rounding)."""
    first = next((i for i, size in enumerate(sizes) if size > 0), None)
    times, latest = [], -math.inf
    for i, (lag, played) in enumerate(zip(lags, _audio_before(sizes, bytes_per_second))):
        t = origin if i == first else origin + played + (lag + 0.5) * SLIM_TICK_S
        latest = max(latest, t)  # chunks within one tick of each other can come out a little out of order
        times.append(latest)
    return times


def chunk_times_s(request: dict[str, Any]) -> list[float] | None:
    """Every chunk's arrival (seconds from the run's start) of a full or slimmed request; None where a record was
    slimmed without them (records made before slimming kept chunks)."""
    if "chunk_times_s" in request:
        return request["chunk_times_s"]
    if "chunk_lags_100us" in request:
        return decode_chunk_lags(request["chunk_lags_100us"], request["chunk_audio_bytes"],
                                 request.get("bytes_per_second") or 1, _chunk_origin(request, request["first_audio_s"]))
    return None


def request_timeline(request: dict[str, Any]) -> Timeline:
    """The metrics' view of one recorded request (full or slimmed record), as the client built it while running."""
    times = chunk_times_s(request)
    if times is None:
        raise ValueError("this record was slimmed without chunk times: stalls cannot be recomputed from it "
                         "(use the full record)")
    rate = request.get("bytes_per_second") or 1
    sent = request.get("sent_s")
    audio = tuple(size / rate for size in request.get("chunk_audio_bytes") or ())
    ready = ()
    if "word_sent_s" in request:  # text sent word by word (`text_stream`): pauses waiting for text are not stalls
        ready = text_ready_times(audio, request["word_sent_s"], request.get("end_sent_s"),
                                 request.get("lookahead_words", 0))
    return Timeline(sent_s=sent if sent is not None else request["scheduled_s"],
                    outcome=request.get("outcome") or FAILED, chunk_times_s=tuple(times), chunk_audio_s=audio,
                    chunk_text_ready_s=ready)


def _slim_request(request: dict[str, Any]) -> None:
    if "chunk_times_s" in request:  # a request slimmed before is left as it is
        first = first_audio_s(request)
        request["chunk_lags_100us"] = encode_chunk_lags(request["chunk_times_s"], request["chunk_audio_bytes"],
                                                        request.get("bytes_per_second") or 1,
                                                        _chunk_origin(request, first))
        request["first_audio_s"] = first
    for key in _SLIM_DROPPED:
        request.pop(key, None)
    for key, value in request.items():
        if isinstance(value, float):
            request[key] = round(value, 4)


def slim_record(record: dict[str, Any]) -> dict[str, Any]:
    """A record small enough to commit: the summaries whole, and per request its outcome, times (to 0.1 ms), first
    audio and every chunk (its audio bytes, and its arrival as a lag behind playback in 0.1 ms ticks), not its text
    (the texts follow from `index` and the workload). Stalls recomputed from it are those of the full record (for a
    stall threshold of whole 0.1 ms), pauses to 0.05 ms."""
    bodies = list(record["modes"].values()) if "modes" in record else [record]
    for body in bodies:
        for run in body.get("runs", []):
            for request in run.get("requests", []):
                _slim_request(request)
    record["slimmed"] = True
    return record


def compressed_slim(record: dict[str, Any]) -> bytes:
    """The slimmed record as committed: compact JSON, xz at its strongest preset."""
    data = json.dumps(slim_record(record), separators=(",", ":"), default=str).encode("utf-8")
    return lzma.compress(data, preset=9 | lzma.PRESET_EXTREME)


def main(argv: list[str]) -> int:
    """`python -m benchmarks.record --slim IN OUT_DIR`: OUT_DIR/record.json.xz, slimmed, from IN's record (a results
    folder or a record file)."""
    if len(argv) != 3 or argv[0] != "--slim":
        print(main.__doc__, file=sys.stderr)
        return 2
    out = Path(argv[2])
    out.mkdir(parents=True, exist_ok=True)
    (out / "record.json.xz").write_bytes(compressed_slim(read_record(argv[1])))
    (out / "record.json.gz").unlink(missing_ok=True)  # one record per folder
    print(out / "record.json.xz")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
