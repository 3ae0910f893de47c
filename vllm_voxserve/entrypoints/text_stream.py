"""One utterance whose text arrives in pieces (a voice agent's LLM output), spoken as one engine request.

The request runs in streaming-text mode (the official `non_streaming_mode=False`): each generated frame reads one
text token. It starts once the first token is certain; later tokens go to the engine with `contract.TEXT_RPC_METHOD`,
and a frame whose token has not arrived waits there (the request pauses) until more text, `flush` or `end`.
Tokens are sent only where tokenizing the whole text could not change them: the trailing word is held back until a
space follows it, or `flush` / `end`, so the codes equal those of the whole text sent at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Callable

import numpy as np

from vllm_voxserve.contract import PLAN_KEY, TEXT_CLOSED, TEXT_ENDED, TEXT_OPEN, TEXT_RPC_METHOD
from vllm_voxserve.models.qwen3_tts.prompt import build_plan

from .speech_request import SpeechRequest
from .speech_outcomes import InvalidSpeechRequest, SpeechUsage

logger = logging.getLogger(__name__)

_PROBE_INPUT = "a"  # stands in for an empty first input while the request's other fields are validated
_DONE = object()  # the audio queue's last item


class TextTokens:
    """The text so far and the target-text token ids that are final. `tokenize(text)` gives the ids of a text as the
    target prompt holds them (`tokenizer.target_text_ids`).

    Final ids come from whole segments: a segment ends before a space that a non-space follows, once its ids are a
    prefix of the ids of all the text after the previous segment (Qwen2's pre-tokenizer starts a piece there, and
    BPE never merges across pieces). A flush makes the text so far a segment, wherever it ends."""

    def __init__(self, tokenize: Callable[[str], list[int]], max_chars: int):
        self.tokenize = tokenize
        self.max_chars = max_chars
        self.text = ""
        self.ids: list[int] = []
        self._segment_start = 0  # characters before it are tokenized into `ids`

    def add(self, text: str) -> None:
        if len(self.text) + len(text) > self.max_chars:
            raise ValueError(f"the text would be {len(self.text) + len(text)} characters; at most "
                             f"{self.max_chars} are accepted")
        self.text += text

    def take_words(self) -> list[int]:
        """Ids that became final, up to the last whole word."""
        pending = self.text[self._segment_start:]
        cut = _last_word_start(pending)
        while cut > 0:
            head = self.tokenize(pending[:cut])
            if self.tokenize(pending)[: len(head)] == head:
                return self._take(cut, head)
            cut = _last_word_start(pending[:cut])
        return []

    def take_all(self) -> list[int]:
        """Ids of all the text so far, a trailing partial word included."""
        pending = self.text[self._segment_start:]
        return self._take(len(pending), self.tokenize(pending)) if pending else []

    def _take(self, chars: int, ids: list[int]) -> list[int]:
        self._segment_start += chars
        self.ids.extend(ids)
        return ids


def _last_word_start(text: str) -> int:
    """Index of the last space that a non-space follows, 0 if none (only spaces: a newline could merge with the
    prompt's own newline before the text)."""
    for i in range(len(text) - 2, 0, -1):
        if text[i] == " " and not text[i + 1].isspace():
            return i
    return 0


class TextStream:
    """One utterance whose text arrives in pieces, on a `SpeechService`. `usage` holds its input/output tokens once
    its audio has ended.
    Text methods raise InvalidSpeechRequest for text the request cannot take; `audio()` raises like
    `SpeechService.synthesize` (Overloaded, InvalidSpeechRequest, SynthesisError)."""

    def __init__(self, service, request: SpeechRequest, job, params):
        self.service = service
        self.usage = SpeechUsage()
        self._job, self._params = job, params
        self._tokens = TextTokens(lambda text: service_tokens(service, text), service.config.max_input_chars)
        self._audio: asyncio.Queue = asyncio.Queue()
        self._engine: asyncio.Task | None = None  # runs the request (`SpeechService.synthesize`) once it starts
        self._sent = 0  # ids the engine has (in the job, then through TEXT_RPC_METHOD)
        self._rpc = asyncio.Lock()  # text calls leave in order
        self._ended = self._cancelled = False
        self._over = False  # the request has ended (its audio is out, or it failed): later text goes nowhere
        if request.input:
            self._tokens.add(request.input)

    @property
    def stream_key(self) -> str:
        return self._job.stream_key

    async def append(self, text: str) -> None:
        self._check_open("append")
        try:
            self._tokens.add(text)
        except ValueError as exc:
            raise InvalidSpeechRequest(str(exc)) from exc
        await self._push(self._tokens.take_words(), TEXT_OPEN)

    async def flush(self) -> None:
        """Send all text that has arrived, a trailing partial word included, to be spoken; more may follow. The
        request then runs until a frame needs a token past it (each frame reads one token, and the speech of a token
        comes some frames after it is read: the rest of it follows more text or `end`); a partial word flushed is
        tokenized alone, so its ids may differ from those of the word completed later."""
        self._check_open("flush")
        await self._push(self._tokens.take_all(), TEXT_OPEN)

    async def end(self) -> None:
        """No more text: the request speaks the rest, then the audio iterator ends."""
        self._check_open("end")
        self._ended = True
        await self._push(self._tokens.take_all(), TEXT_ENDED)
        if self._engine is None:  # no text at all: nothing to speak
            self._audio.put_nowait(_DONE)

    async def cancel(self) -> None:
        """Stop now: the engine request is aborted and its audio dropped; the audio iterator ends."""
        if self._cancelled:
            return
        self._cancelled = True
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.cancel()  # `synthesize` leaves early: its request is aborted and its audio cancelled
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await engine
            await self._send_text(self._sent, [], TEXT_CLOSED)
        self._audio.put_nowait(_DONE)

    async def audio(self) -> AsyncIterator[np.ndarray]:
        """float32 mono 24 kHz chunks in order, until the text has ended and been spoken (or `cancel`)."""
        finished = False
        try:
            while True:
                item = await self._audio.get()
                if item is _DONE:
                    finished = True
                    return
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                yield item
        finally:
            if not finished and not self._cancelled:  # the listener left: nobody hears the rest
                await self.cancel()

    def _check_open(self, action: str) -> None:
        if self._cancelled:
            raise InvalidSpeechRequest(f"cannot {action}: the utterance was cancelled")
        if self._ended:
            raise InvalidSpeechRequest(f"cannot {action}: the utterance's text has ended")

    async def _push(self, ids: list[int], state: str) -> None:
        if self._engine is None:
            if self._tokens.ids:
                self._start(state)
            return
        if self._over:  # e.g. the model ended the utterance (EOS) before its text did
            return
        if ids or state != TEXT_OPEN:
            start, self._sent = self._sent, self._sent + len(ids)
            await self._send_text(start, ids, state)

    def _start(self, state: str) -> None:
        job = self._job
        prompt = dataclasses.replace(job.prompt, text_ids=tuple(self._tokens.ids), non_streaming=False)
        job = dataclasses.replace(job, prompt=prompt, text_stream=state == TEXT_OPEN)
        plan = build_plan(self.service.tables, prompt)
        params = self._params
        params.extra_args = {k: v for k, v in params.extra_args.items() if k != PLAN_KEY}  # its length is unknown
        params.extra_args.update(job.to_extra_args())
        self._sent = len(prompt.text_ids)
        prompt_ids = [self.service.tables.codec_pad] * len(plan)
        self._engine = asyncio.get_running_loop().create_task(self._run(job, prompt_ids, params, job.text_stream))

    async def _run(self, job, prompt_ids: list[int], params, text_stream: bool) -> None:
        try:
            async for chunk in self.service.synthesize(job, prompt_ids, params, self.usage):
                self._audio.put_nowait(chunk)
            self.usage.input_tokens += self._sent - len(job.prompt.text_ids)  # text read after the prompt
            self._audio.put_nowait(_DONE)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the listener gets it from `audio()`
            self._audio.put_nowait(exc)
        self._over = True
        if text_stream:  # every rank drops the stream's text (a rank may hold it without running the request)
            await self._send_text(self._sent, [], TEXT_CLOSED)

    async def _send_text(self, start: int, ids: list[int], state: str) -> None:
        async with self._rpc:
            try:
                await self.service.engine_client.collective_rpc(TEXT_RPC_METHOD,
                                                                args=(self.stream_key, start, list(ids), state))
            except Exception:  # noqa: BLE001 - the engine is gone: the audio ends with it
                logger.exception("sending text of stream %s failed", self.stream_key)


def service_tokens(service, text: str) -> list[int]:
    from vllm_voxserve.models.qwen3_tts.tokenizer import target_text_ids

    return target_text_ids(service.tokenizer, text)


def open_text_stream(service, request: SpeechRequest) -> TextStream:
    """On a `SpeechService`: validate the request like its `prepare` and open its stream; raises ValueError for the
    client. Its `input` (may be empty) is the first text, taken up with the first append, flush or end. It runs in
    streaming-text mode; Base checkpoints clone with `x_vector_only_mode` only (ICL places the text in the prompt).
    The model may end the utterance (EOS) before its text ends: `audio()` then ends, and later text is dropped."""
    if request.non_streaming_mode:
        raise ValueError("non_streaming_mode needs the whole text at once; a text stream reads it as it arrives")
    if service.tables.model_type == "base" and not request.x_vector_only_mode:
        raise ValueError("voice cloning with ref_text places the text in the prompt, so it needs the whole text; "
                         "a text stream clones with x_vector_only_mode=true")
    probe = request if request.input.strip() else request.model_copy(update={"input": _PROBE_INPUT})
    job, _, params = service.prepare(probe.model_copy(update={"non_streaming_mode": False}))
    return TextStream(service, request, job, params)
