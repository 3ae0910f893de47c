"""A speech service with `open_text_stream` and no engine: each flush or end turns the text appended since the last
into one chunk of a tone per word, so tests can tell which text became which audio."""

from __future__ import annotations

import asyncio

import numpy as np

from vllm_voxserve.config import VoxServeConfig
from vllm_voxserve.entrypoints.speech_service import InvalidSpeechRequest, SpeechUsage

FRAME = 1920  # samples of one 80 ms frame at 24 kHz
FRAMES_PER_WORD = 2


class FakeTextStream:
    def __init__(self, request, fail_after_chunks: int | None = None, error: Exception | None = None):
        self.request = request
        self.usage = SpeechUsage(input_tokens=5)
        self.text: list[str] = []
        self.calls: list[str] = []
        self.cancelled = asyncio.Event()
        self.audio_closed = False
        self._spoken = 0  # pieces of text already turned into audio
        self._wake = asyncio.Queue()
        self.fail_after_chunks, self.error = fail_after_chunks, error

    async def append(self, text: str) -> None:
        if "forbidden" in text:
            raise InvalidSpeechRequest("text: 'forbidden' is not spoken here")
        self.calls.append("append")
        self.text.append(text)

    async def flush(self) -> None:
        self.calls.append("flush")
        self._wake.put_nowait("flush")

    async def end(self) -> None:
        self.calls.append("end")
        self._wake.put_nowait("end")

    async def cancel(self) -> None:
        self.calls.append("cancel")
        self.cancelled.set()
        self._wake.put_nowait("cancel")

    async def run_out(self) -> None:
        """End the audio without end or cancel, as a stream that reached its max_new_tokens."""
        self._wake.put_nowait("cancel")

    async def audio(self):
        sent = 0
        try:
            while True:
                kind = await self._wake.get()
                if kind == "cancel":
                    return
                words = "".join(self.text[self._spoken:]).split()
                self._spoken = len(self.text)
                for _ in words:
                    if self.fail_after_chunks is not None and sent >= self.fail_after_chunks:
                        raise self.error
                    self.usage.output_tokens += FRAMES_PER_WORD
                    sent += 1
                    yield tone(FRAMES_PER_WORD * FRAME)
                if kind == "end":
                    return
        finally:
            self.audio_closed = True


def tone(samples: int) -> np.ndarray:
    t = np.arange(samples) / 24000
    return (0.3 * np.sin(2 * np.pi * 330 * t)).astype(np.float32)


class FakeTextService:
    """`open_text_stream(request)` of SpeechService. voice "nobody" is refused as an unknown voice."""

    def __init__(self, **stream_args):
        self.config = VoxServeConfig()
        self.served_models = ["tiny"]
        self.streams: list[FakeTextStream] = []
        self.stream_args = stream_args
        self.engine_full: tuple[str, float] | None = None  # what `refusal_at_arrival` answers

    def refusal_at_arrival(self, now: float) -> tuple[str, float] | None:
        return self.engine_full

    def open_text_stream(self, request) -> FakeTextStream:
        if request.voice == "nobody":
            raise ValueError("voice 'nobody' is not a speaker of this checkpoint; choose one of ['ryan']")
        stream = FakeTextStream(request, **self.stream_args)
        self.streams.append(stream)
        return stream
