"""Pure scheduling policy: no vLLM, no torch; the clock is passed in (seconds, monotonic)."""

from vllm_voxserve.scheduler.costs import CostModel, CostSeed, LinearCost, paper_h100_seed
from vllm_voxserve.scheduler.overload import Rejection
from vllm_voxserve.scheduler.planner import Planner, StepPlan
from vllm_voxserve.scheduler.policy_config import SchedulerPolicyConfig
from vllm_voxserve.scheduler.streams import StreamState, WaitingRequest
from vllm_voxserve.scheduler.timeline import ChunkSchedule, PlaybackTimeline
from vllm_voxserve.scheduler.urgency import ReadyChunk

__all__ = [
    "ChunkSchedule", "CostModel", "CostSeed", "LinearCost", "Planner", "PlaybackTimeline", "ReadyChunk", "Rejection",
    "SchedulerPolicyConfig", "StepPlan", "StreamState", "WaitingRequest", "paper_h100_seed",
]
