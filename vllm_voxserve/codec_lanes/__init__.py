"""Codec lanes: SM partitions, lanes, state slots, CUDA-graph executables."""

from vllm_voxserve.codec_lanes.codec_lane import CodecChunk, CodecLane, FinishedChunk, LaneKind
from vllm_voxserve.codec_lanes.lane_manager import BatchCost, LaneConfig, LaneManager
from vllm_voxserve.codec_lanes.partitions import (
    Partitions,
    SplitSpec,
    cpu_partitions,
    create_partitions,
    shared_partitions,
)

__all__ = [
    "BatchCost", "CodecChunk", "CodecLane", "FinishedChunk", "LaneConfig", "LaneKind", "LaneManager",
    "Partitions", "SplitSpec", "cpu_partitions", "create_partitions", "shared_partitions",
]
