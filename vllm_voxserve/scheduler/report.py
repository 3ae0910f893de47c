"""What the vLLM worker reports to the scheduler after each engine step (plain data, no torch).

All times are seconds on the monotonic clock the scheduler also reads (`time.monotonic()` in the server, a simulated
clock in tests and in the simulation).
"""

from __future__ import annotations

from dataclasses import dataclass, field

COST_KINDS = ("decode", "prefill", "urgent_codec", "background_codec")


@dataclass(slots=True)
class CostSample:
    """One measured execution: `size` is the decode batch, the prefill's prompt tokens, or the codec batch in chunks.
    `decode_rows`: of a prefill, the running requests that decoded in the same step (its time includes theirs)."""

    kind: str
    size: int
    seconds: float
    decode_rows: int = 0

    def __post_init__(self) -> None:
        if self.kind not in COST_KINDS:
            raise ValueError(f"kind must be one of {COST_KINDS}, got {self.kind!r}")
        if self.size < 1 or self.seconds < 0 or self.decode_rows < 0:
            raise ValueError(f"bad cost sample: size={self.size}, seconds={self.seconds}, "
                             f"decode_rows={self.decode_rows}")


@dataclass(slots=True)
class RequestProgress:
    """Where one admitted request stands (cumulative values, so a lost report is harmless)."""

    request_id: str
    frames_generated: int
    generation_done: bool
    chunks_delivered: int  # chunks whose audio has been handed to the transport
    audio_delivered_s: float
    first_audio_time: float | None = None
    chunk_in_flight: bool = False  # a codec lane holds this request's next chunk


@dataclass(slots=True)
class LaneBacklog:
    urgent_busy: bool = False
    background_busy: bool = False
    urgent_queued_chunks: int = 0
    background_queued_chunks: int = 0


@dataclass(slots=True)
class StepReport:
    now: float
    progress: list[RequestProgress] = field(default_factory=list)
    lanes: LaneBacklog = field(default_factory=LaneBacklog)
    costs: list[CostSample] = field(default_factory=list)
    # requests the worker failed (request id -> the error): they end at once, not after their max tokens
    failed: dict[str, str] = field(default_factory=dict)
