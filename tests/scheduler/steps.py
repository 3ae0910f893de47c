"""Small builders for step-table tests: streams and waiting requests at a simulated time."""

from vllm_voxserve.contract import LaneBacklog
from vllm_voxserve.scheduler.streams import StreamState, WaitingRequest


def stream(rid, arrival=0.0, frames=0, done=False, delivered=0, in_flight=False, first_audio=None, expected=None):
    return StreamState(
        request_id=rid,
        arrival_time=arrival,
        prompt_tokens=40,
        expected_frames=expected,
        frames_generated=frames,
        generation_done=done,
        chunks_delivered=delivered,
        chunk_in_flight=in_flight,
        first_audio_time=first_audio,
    )


def waiting(rid, arrival=0.0, tokens=40, expected=100):
    return WaitingRequest(rid, arrival, tokens, expected)


def lanes(urgent_busy=False, background_busy=False):
    return LaneBacklog(urgent_busy=urgent_busy, background_busy=background_busy)


def ids(chunks):
    return [(c.request_id, c.index) for c in chunks]
