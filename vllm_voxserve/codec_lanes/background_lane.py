"""The background codec lane: batches of chunks with slack, on the codec SM partition.

Buckets are powers of two up to the largest batch, or past a step its multiples; a batch may span several backbone
steps while the LM lane keeps stepping on its own partition. `depth` executable sets
(sharing one graph memory pool) let the next batch queue behind the running one.
"""

from __future__ import annotations

from collections.abc import Sequence

from vllm_voxserve.codec_lanes.codec_lane import CodecLane, LaneKind
from vllm_voxserve.codec_lanes.executables import CodecExecutables
from vllm_voxserve.models.batch_sizes import powers_then_multiples
from vllm_voxserve.codec_lanes.partitions import Partitions
from vllm_voxserve.models.program import CodecProgram, CodecStatePool


def make_background_lane(program: CodecProgram, pool: CodecStatePool, partitions: Partitions,
                         frame_counts: Sequence[int], padding_slot: int, use_graphs: bool,
                         max_batch: int, depth: int = 2, bucket_step: int = 0) -> CodecLane:
    sets = []
    for _ in range(depth):
        exe = CodecExecutables(program, pool, partitions.codec_stream, partitions.codec_launch_stream,
                               partitions.device, powers_then_multiples(max_batch, bucket_step), frame_counts,
                               padding_slot, use_graphs)
        exe.capture(mempool=sets[0].mempool if sets else None)
        sets.append(exe)
    return CodecLane(LaneKind.BACKGROUND, sets)
