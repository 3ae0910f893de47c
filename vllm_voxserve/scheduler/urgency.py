"""Ready chunks and their urgency class (paper §3.2).

A chunk is ready once all of its frames exist and the request's previous chunk has left the codec (chunks of one
request are decoded in order). A ready chunk is urgent if it is the request's first, or if its deadline is less than
δu away; every other ready chunk is a background chunk.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from vllm_voxserve.scheduler.policy_config import SchedulerPolicyConfig
from vllm_voxserve.scheduler.streams import StreamState, schedule_of
from vllm_voxserve.scheduler.timeline import chunk_deadline


@dataclass(frozen=True, slots=True)
class ReadyChunk:
    request_id: str
    index: int
    deadline: float
    frames: int  # frames in this chunk (the last one may be partial)


def ready_chunks(streams: Iterable[StreamState], cfg: SchedulerPolicyConfig) -> list[ReadyChunk]:
    """At most one chunk per request: its next one, if all its frames exist and no earlier chunk is in flight."""
    schedule = schedule_of(cfg)
    ready = []
    for stream in streams:
        if stream.chunk_in_flight:
            continue
        index = stream.next_chunk
        if not schedule.is_ready(index, stream.frames_generated, stream.generation_done):
            continue
        end = min(schedule.end_frame(index), stream.frames_generated)
        frames = end - schedule.start_frame(index)
        deadline = chunk_deadline(schedule, index, stream.arrival_time, cfg.ttfa_target_s, stream.first_audio_time)
        ready.append(ReadyChunk(stream.request_id, index, deadline, frames))
    return ready


def is_urgent(chunk: ReadyChunk, now: float, urgent_margin_s: float) -> bool:
    return chunk.index == 0 or chunk.deadline - now < urgent_margin_s


def split_by_urgency(
    chunks: Sequence[ReadyChunk], now: float, urgent_margin_s: float
) -> tuple[list[ReadyChunk], list[ReadyChunk]]:
    urgent = [c for c in chunks if is_urgent(c, now, urgent_margin_s)]
    background = [c for c in chunks if not is_urgent(c, now, urgent_margin_s)]
    return urgent, background


def by_deadline(chunks: Iterable[ReadyChunk]) -> list[ReadyChunk]:
    return sorted(chunks, key=lambda c: (c.deadline, c.request_id))


def urgent_batch(urgent: Sequence[ReadyChunk], max_batch: int) -> list[ReadyChunk]:
    """Everything urgent in one batch, earliest deadline first, up to the largest urgent executable."""
    return by_deadline(urgent)[:max_batch]
