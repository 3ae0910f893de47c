"""Cumulative engine-side speech counters: kept by the worker from its step reports, read by the API server over
`collective_rpc` (`voxserve_stats`) for vLLM's /metrics. Codec batches by lane (a size histogram and device-busy
seconds) and the backbone's frames. Pure: no vLLM, no torch; snapshots are plain dicts (they cross processes)."""

from __future__ import annotations

from dataclasses import dataclass, field

CODEC_LANES = {"urgent_codec": "urgent", "background_codec": "background"}  # cost kind -> lane label
BACKBONE_KINDS = ("decode", "prefill")


@dataclass
class EngineSpeechStats:
    codec_batches: dict[str, dict[int, int]] = field(default_factory=dict)  # lane -> batch size (chunks) -> batches
    codec_busy_s: dict[str, float] = field(default_factory=dict)  # lane -> seconds its batches took
    backbone_frames: int = 0  # frames the backbone handed to the codec (the worker's audio pipeline counts them)
    backbone_busy_s: float = 0.0  # seconds of backbone steps measured

    def observe(self, samples) -> None:
        """Cost samples of one step (`contract.CostSample`: kind, size, seconds)."""
        for sample in samples:
            lane = CODEC_LANES.get(sample.kind)
            if lane is not None:
                sizes = self.codec_batches.setdefault(lane, {})
                sizes[sample.size] = sizes.get(sample.size, 0) + 1
                self.codec_busy_s[lane] = self.codec_busy_s.get(lane, 0.0) + sample.seconds
            elif sample.kind in BACKBONE_KINDS:
                self.backbone_busy_s += sample.seconds

    def snapshot(self) -> dict:
        return {"codec_batches": {lane: {str(size): n for size, n in sizes.items()}
                                  for lane, sizes in self.codec_batches.items()},
                "codec_busy_s": dict(self.codec_busy_s), "backbone_frames": self.backbone_frames,
                "backbone_busy_s": self.backbone_busy_s}
