"""Text streams (streaming text in) in the engine core's scheduler: the part of the speech policy's vLLM adapter
(`scheduler/adapter.py`, which mixes this in) that keeps a request waiting for its text off the decode batch.

A text stream's request carries the target text's first tokens in its job; the rest arrive through
`contract.TEXT_RPC_METHOD`, which the engine core hands to `handle_text_call` before the workers get it. Decode step
k reads token k + 1, so a request whose next step reads a token that has not arrived (and whose text has not ended)
leaves `running` and `waiting` while vLLM schedules: it keeps its KV blocks (and the worker its codec state), runs
no row, and has no deadline (`StreamState.pause`) until the token comes. vLLM can then neither schedule nor preempt
it; one preempted otherwise (e.g. `reset_prefix_cache`) waits the same way in `waiting` and is recomputed after.
"""

from __future__ import annotations

import time

from vllm.v1.request import Request, RequestStatus

from vllm_voxserve.compat import route_rpc_through_scheduler
from vllm_voxserve.contract import JOB_KEY, TEXT_CLOSED, TEXT_ENDED, TEXT_RPC_METHOD, TEXT_STATES
from vllm_voxserve.scheduler.text_arrivals import TextArrivals

# A step with nothing to run while text streams wait for text, where the engine core cannot wait on its input
# instead (`has_requests`): the engine loop would spin (vLLM steps while it holds requests), so the scheduler pauses
# this long; text arriving meanwhile waits at most that.
PAUSED_IDLE_SLEEP_S = 0.002


class TextStreamsMixin:
    """Mixed into the speech scheduler (a vLLM `Scheduler` with `streams`, `clock` and `chunk_schedule`)."""

    def _init_text_streams(self) -> None:
        from vllm.platforms import current_platform

        route_rpc_through_scheduler(TEXT_RPC_METHOD, handle_text_call)  # this is the engine-core process
        self.texts = TextArrivals()  # text streams' text so far, and their requests
        # The inline codec (CPU) decodes a finished request's audio in the step that finishes it; the codec lanes
        # (GPU) deliver it at later steps' pumps, so there the engine must keep stepping.
        self.wait_for_text_on_input = current_platform.is_cpu()

    def has_requests(self) -> bool:
        """vLLM's engine core steps while this holds. When every request it holds waits for text (and nothing
        finished is left to report, nor audio of another request to deliver) a step would do nothing: then it is
        false, and the engine core waits on its input queue, where text (or anything else) wakes it at once."""
        return super().has_requests() and not (self.wait_for_text_on_input and self._only_waiting_for_text())

    def _only_waiting_for_text(self) -> bool:
        if self.finished_req_ids or not self.texts.request_ids():
            return False
        held = [*self.running, *self.waiting]
        if len(held) != self.get_num_unfinished_requests() or not all(self._paused(r) for r in held):
            return False
        return self.audio_streams <= {r.request_id for r in held}

    def _add_text_stream(self, request: Request) -> None:
        job = ((request.sampling_params.extra_args if request.sampling_params else None) or {}).get(JOB_KEY)
        if isinstance(job, dict) and job.get("text_stream"):
            self.texts.add_request(request.request_id, job["stream_key"], len(job["prompt"]["text_ids"]))

    def on_text(self, stream_key: str, start: int, count: int, state: str) -> None:
        """Text of a text stream arrived (`contract.TEXT_RPC_METHOD`); TEXT_CLOSED ends its request if it runs."""
        if state != TEXT_CLOSED:
            self.texts.arrived(stream_key, start + count, state == TEXT_ENDED)
            return
        live = [r for r in self.texts.requests_of(stream_key)
                if r in self.requests and not self.requests[r].is_finished()]
        for request_id in self.texts.requests_of(stream_key):
            self.texts.forget_request(request_id)
        self.texts.drop(stream_key)
        if live:
            self.finish_requests(live, RequestStatus.FINISHED_ABORTED)

    def _hold_paused(self) -> tuple[list[Request], list[Request]]:
        """Take the requests waiting for text out of `running` and `waiting` (vLLM schedules without them), and
        pause or resume their streams' deadlines."""
        if not self.texts.request_ids():
            return [], []
        for request_id in [r for r in self.texts.request_ids()
                           if r not in self.requests or self.requests[r].is_finished()]:
            self.texts.forget_request(request_id)
        running = [r for r in self.running if self._paused(r)]
        waiting = [r for r in self.waiting if self._paused(r)]
        paused = {r.request_id for r in running + waiting}
        now = self.clock()
        for request_id in self.texts.request_ids():
            stream = self.streams.get(request_id)
            if stream is not None and request_id in paused:
                stream.pause(now)
            elif stream is not None:
                stream.resume(now, self.chunk_schedule)
        if running:
            self.running = [r for r in self.running if r.request_id not in paused]
        if waiting:
            self.waiting.remove_requests(waiting)
        return running, waiting

    def _release_paused(self, paused: tuple[list[Request], list[Request]]) -> None:
        running, waiting = paused
        self.running.extend(running)
        for request in waiting:
            self.waiting.add_request(request)

    def _idle_while_paused(self, paused: tuple[list[Request], list[Request]], output) -> None:
        if paused[0] and not output.total_num_scheduled_tokens:
            time.sleep(PAUSED_IDLE_SLEEP_S)

    def _paused(self, request: Request) -> bool:
        # the step it runs next: its newest token's (a preempted request recomputes up to it)
        next_step = max(request.num_computed_tokens, request.num_tokens - 1) - request.num_prompt_tokens
        return self.texts.paused(request.request_id, next_step)


def handle_text_call(scheduler: TextStreamsMixin, args: tuple, forward) -> list[dict]:
    """`contract.TEXT_RPC_METHOD` in the engine core: the scheduler learns of the text, then the workers get it."""
    if len(args) != 4 or args[3] not in TEXT_STATES:
        return [{"status": 400, "error": f"text call takes (stream key, start, ids, state), got {args!r}"}]
    stream_key, start, ids, state = args
    scheduler.on_text(stream_key, int(start), len(ids), state)
    return forward(args)
