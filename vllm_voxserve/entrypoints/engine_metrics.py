"""The engine's speech metrics on the API server's /metrics: a poller asks the workers for their cumulative counters
(`collective_rpc` "voxserve_stats", answered between steps: the step loop never waits on it) every few seconds, and
a Prometheus collector serves the latest answer: per-lane codec batch sizes and busy seconds, backbone frames, and
rates over the last poll interval (busy fraction, frames per second).

A collector, not counters updated in place: the workers' numbers are already cumulative and are served as they are.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

from vllm_voxserve.compat import collective_rpc_per_rank
from vllm_voxserve.contract import STATS_RPC_METHOD

logger = logging.getLogger(__name__)

POLL_INTERVAL_S = 5.0
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class EngineSpeechCollector:
    """Serves the last snapshot of the engine's speech counters (`speech_stats.EngineSpeechStats.snapshot`)."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.snapshot: dict | None = None
        self.busy_fraction: dict[str, float] = {}
        self.frames_per_second = 0.0
        self._last: tuple[float, dict] | None = None

    def update(self, snapshot: dict, now: float) -> None:
        """A new snapshot at `now` (seconds): rates come from its difference to the previous one."""
        if self._last is not None and now > self._last[0]:
            then, before = self._last
            span = now - then
            self.busy_fraction = {
                lane: min(1.0, max(0.0, (busy - before["codec_busy_s"].get(lane, 0.0)) / span))
                for lane, busy in snapshot["codec_busy_s"].items()}
            self.frames_per_second = max(0.0, (snapshot["backbone_frames"] - before["backbone_frames"]) / span)
        self._last = (now, snapshot)
        self.snapshot = snapshot

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        snapshot = self.snapshot
        if snapshot is None:
            return
        labels = ["model_name", "lane"]
        sizes = HistogramMetricFamily("vllm:voxserve_codec_batch_size",
                                      "Chunks per codec batch, by lane (inline decoding counts as the urgent lane).",
                                      labels=labels)
        for lane, counts in sorted(snapshot["codec_batches"].items()):
            counts = {int(size): n for size, n in counts.items()}
            buckets = [(str(bound), sum(n for size, n in counts.items() if size <= bound))
                       for bound in BATCH_SIZE_BUCKETS]
            buckets.append(("+Inf", sum(counts.values())))
            sizes.add_metric([self.model_name, lane], buckets, sum(size * n for size, n in counts.items()))
        yield sizes
        busy = CounterMetricFamily("vllm:voxserve_codec_busy_seconds",
                                   "Seconds the codec spent on batches, by lane.", labels=labels)
        fraction = GaugeMetricFamily("vllm:voxserve_codec_busy_fraction",
                                     f"Share of the last {POLL_INTERVAL_S:g} s the codec lane was busy.", labels=labels)
        for lane, seconds in sorted(snapshot["codec_busy_s"].items()):
            busy.add_metric([self.model_name, lane], seconds)
            fraction.add_metric([self.model_name, lane], self.busy_fraction.get(lane, 0.0))
        yield busy
        yield fraction
        frames = CounterMetricFamily("vllm:voxserve_backbone_frames",
                                     "Audio frames (80 ms each) the backbone generated.", labels=["model_name"])
        frames.add_metric([self.model_name], snapshot["backbone_frames"])
        yield frames
        rate = GaugeMetricFamily("vllm:voxserve_backbone_frames_per_second",
                                 f"Backbone frames per second over the last {POLL_INTERVAL_S:g} s.",
                                 labels=["model_name"])
        rate.add_metric([self.model_name], self.frames_per_second)
        yield rate


def merge_rank_snapshots(snapshots: list[dict]) -> dict:
    """One snapshot of several data-parallel ranks' counters: their sums, busy seconds averaged so that a busy
    fraction stays the share of time the ranks' lanes were busy (each rank has its own GPU and lanes)."""
    if len(snapshots) == 1:
        return snapshots[0]
    batches: dict[str, dict[str, int]] = {}
    busy: dict[str, float] = {}
    for snapshot in snapshots:
        for lane, counts in snapshot["codec_batches"].items():
            merged = batches.setdefault(lane, {})
            for size, n in counts.items():
                merged[size] = merged.get(size, 0) + n
        for lane, seconds in snapshot["codec_busy_s"].items():
            busy[lane] = busy.get(lane, 0.0) + seconds / len(snapshots)
    return {"codec_batches": batches, "codec_busy_s": busy,
            "backbone_frames": sum(s["backbone_frames"] for s in snapshots),
            "backbone_busy_s": sum(s.get("backbone_busy_s", 0.0) for s in snapshots) / len(snapshots)}


async def poll_engine_stats(engine_client, collector: EngineSpeechCollector,
                            interval_s: float = POLL_INTERVAL_S) -> None:
    """Forever: each data-parallel rank's first worker's counters, merged, into `collector` (the workers of one
    rank run the same steps: summing them would count a tensor-parallel step once per GPU). A failed call is logged
    once and retried; a snapshot is taken only when every rank answered."""
    failing = False
    while True:
        try:
            per_rank = await collective_rpc_per_rank(engine_client, STATS_RPC_METHOD)
            replies = [replies[0] if replies else {} for replies in per_rank]
            if replies and all(reply.get("status") == 200 for reply in replies):
                collector.update(merge_rank_snapshots([reply["stats"] for reply in replies]), time.monotonic())
            failing = False
        except asyncio.CancelledError:
            raise
        except Exception:
            if not failing:
                logger.exception("reading the engine's speech counters failed; retrying every %g s", interval_s)
            failing = True
        await asyncio.sleep(interval_s)


def start_engine_metrics(engine_client, model_name: str) -> asyncio.Task | None:
    """Register the collector in the registry vLLM serves and start polling. With several API servers vLLM serves
    prometheus_client's multiprocess files, which a collector cannot write to: the engine's series are left out."""
    from prometheus_client import REGISTRY

    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        logger.warning("voxserve: with several API servers /metrics has the speech API's series but not the "
                       "engine's (codec lanes, backbone frames)")
        return None

    collector = EngineSpeechCollector(model_name)
    REGISTRY.register(collector)
    return asyncio.get_running_loop().create_task(poll_engine_stats(engine_client, collector))
