"""What crosses a process boundary between the API server (`entrypoints/`), the engine core (`scheduler/adapter.py`)
and the worker (`worker/`). Each side imports these names from here, never from another side.

    API server --SamplingParams.extra_args (JOB_KEY, PLAN_KEY)--> engine core --> worker
    worker --StepReport on each step's output--> engine core (`compat.attach_step_report`)
    engine core --stop_reason (rejection, failure)--> API server
    API server --collective_rpc (MODE_RPC_METHOD, CANCEL_RPC_METHOD, STATS_RPC_METHOD)--> worker; replies are dicts
    API server --collective_rpc (TEXT_RPC_METHOD)--> engine core (scheduler) --> worker: text of a text stream
    worker --audio channel (`transport`)--> API server

Pure Python: no vLLM, no torch. All times are seconds on `time.monotonic()`, which is system-wide on Linux, so the
worker's report and the scheduler read one clock (tests and the simulation pass a simulated one).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

# --- audio --------------------------------------------------------------------------------------------------------

SAMPLE_RATE = 24000  # Hz: the codec's audio out, and reference clips in
SAMPLES_PER_FRAME = 1920  # one codec frame
FRAME_DURATION_S = SAMPLES_PER_FRAME / SAMPLE_RATE  # 80 ms (12.5 Hz)

# --- a request: keys of vLLM's `SamplingParams.extra_args`, which vLLM carries to the engine and worker untouched ---

JOB_KEY = "voxserve"  # the speech job (`models.qwen3_tts.job.SpeechJob.to_extra_args`)
PLAN_KEY = "voxserve_plan"  # the endpoint's scheduling hints
EXPECTED_FRAMES = "expected_frames"  # in PLAN_KEY: audio frames the text will probably take


def plan_hints(expected_frames: int) -> dict[str, Any]:
    return {PLAN_KEY: {EXPECTED_FRAMES: expected_frames}}


def expected_frames_of(extra_args: dict[str, Any]) -> int | None:
    return (extra_args.get(PLAN_KEY) or {}).get(EXPECTED_FRAMES)


# --- the step report: worker -> engine core, after each engine step ---------------------------------------------

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
    # for each first audio since the last report: seconds from its first chunk's cut (all its frames existed) to its
    # audio leaving the worker (the codec's decode and the hand-over at a later step)
    first_audio_handovers: list[float] = field(default_factory=list)


# --- how a request ended early: engine core -> API server, in the finished output's `stop_reason` ---------------

REJECTION_PREFIX = "voxserve-overload:"  # the scheduler rejected it before it started: HTTP 503 + Retry-After
FAILURE_PREFIX = "voxserve-failed:"  # the worker failed it: the error follows


_BY_LIMIT, _BY_LOAD = "limit", "load"


class EngineRejection(NamedTuple):
    retry_after_s: float
    reason: str
    # refused for the number of requests in progress alone (the scheduler's in-progress limit): the API server may
    # then refuse arrivals itself while it has as many in progress (`entrypoints.rank_choice`)
    by_limit: bool = False


def encode_rejection(retry_after_s: float, reason: str, by_limit: bool = False) -> str:
    return f"{REJECTION_PREFIX}{retry_after_s:.3f}:{_BY_LIMIT if by_limit else _BY_LOAD}:{reason}"


def decode_rejection(stop_reason: Any) -> EngineRejection | None:
    """What the scheduler said when `stop_reason` says it rejected the request, else None."""
    if not isinstance(stop_reason, str) or not stop_reason.startswith(REJECTION_PREFIX):
        return None
    retry, _, rest = stop_reason[len(REJECTION_PREFIX):].partition(":")
    kind, _, reason = rest.partition(":")
    return EngineRejection(float(retry), reason, kind == _BY_LIMIT)


def encode_failure(error: str) -> str:
    return f"{FAILURE_PREFIX}{error}"


def decode_failure(stop_reason: Any) -> str | None:
    """The worker's error if `stop_reason` carries one, else None."""
    if isinstance(stop_reason, str) and stop_reason.startswith(FAILURE_PREFIX):
        return stop_reason[len(FAILURE_PREFIX):]
    return None


# --- RPC: API server -> workers, through vLLM's `collective_rpc` (methods of our worker classes) ------------------

# `GET /voxserve/modes`, `POST /voxserve/mode`: args (mode or None,); reply {"status": 200, "modes": [...],
# "current": NAME} or {"status": 400 | 409 | 500 | 503, "error": TEXT, ...} (503: no device memory for the new mode,
# the old one still serves). The engine core sees this call first (`compat.route_mode_rpc_through_scheduler`).
MODE_RPC_METHOD = "voxserve_codec_mode"
# streams whose listeners left: args (stream keys,); reply {"status": 200, "cancelled": N}
CANCEL_RPC_METHOD = "voxserve_cancel_audio"
# the engine's speech counters for /metrics: no args; reply {"status": 200, "stats": EngineSpeechStats.snapshot()}
STATS_RPC_METHOD = "voxserve_stats"

# --- streaming text in: API server -> engine core (scheduler) -> workers, through `collective_rpc` ------------------

# A text-stream request (`SpeechJob.text_stream`) starts with the target text's first token ids in its job; the rest
# follow here, in order: args (stream key, start, ids, state): the target text's token ids from index `start` on,
# and the text's state after them. Every data-parallel rank receives them (the request may run on any); a rank
# keeps a stream key's text until its request ends or TEXT_CLOSED comes. Reply {"status": 200, "requests": N,
# "audio_streams": M}: what the worker still holds (its requests, their open audio streams).
# The engine core sees this call first (`compat.route_rpc_through_scheduler`): a text stream that needs a token
# that has not arrived (and is not ended) is paused there, holding its KV cache and codec state but no decode row.
TEXT_RPC_METHOD = "voxserve_text"
TEXT_OPEN = "open"  # more text may follow
TEXT_ENDED = "ended"  # no more text: after the last token the model reads tts_eos, then tts_pad
TEXT_CLOSED = "closed"  # the stream is over (done or cancelled): its request, if still running, ends now
TEXT_STATES = (TEXT_OPEN, TEXT_ENDED, TEXT_CLOSED)
