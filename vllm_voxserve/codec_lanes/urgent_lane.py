"""The urgent codec lane: first chunks and chunks near their deadline, on the whole GPU.

It runs on the primary-context stream of greatest priority, so its graphs are captured
there (a graph keeps the priority of its capture stream). It has its own static buffers
and its own padding slot, so it never waits for the background lane's batch.
"""

from __future__ import annotations

from collections.abc import Sequence

from vllm_voxserve.codec_lanes.codec_lane import CodecLane, LaneKind
from vllm_voxserve.codec_lanes.executables import CodecExecutables
from vllm_voxserve.codec_lanes.partitions import Partitions
from vllm_voxserve.models.program import CodecProgram, CodecStatePool


def make_urgent_lane(program: CodecProgram, pool: CodecStatePool, partitions: Partitions,
                     frame_counts: Sequence[int], padding_slot: int, use_graphs: bool,
                     buckets: Sequence[int]) -> CodecLane:
    exe = CodecExecutables(program, pool, partitions.urgent_stream, partitions.urgent_stream, partitions.device,
                           buckets, frame_counts, padding_slot, use_graphs)
    exe.capture()
    return CodecLane(LaneKind.URGENT, exe)
