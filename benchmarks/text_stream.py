"""Streaming text in: each request sends its text word by word over `WS /v1/audio/speech/stream` at a fixed rate,
with the sweep's open-loop Poisson arrivals of requests (`sweep.LoadGenerator`, one socket per request).

- TTFA counts from the first text message (the socket is open and configured before it).
- A stall is the server's only where the text was there: a player starting at the first audio pauses whenever the
  next chunk has not come; of each pause, only the part after all the text that chunk speaks had been sent counts
  (`metrics.playback_pause_s`, `metrics.text_ready_times`: words spread evenly over the audio, the last chunk also
  waiting for the `end` message). A request stalls when those parts add up to the stall threshold.
- Every binary message is one recorded chunk (arrival time, audio bytes), as the sweep records network chunks, with
  the `audio` events' durations and each word's send time beside them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from dataclasses import dataclass, field

import aiohttp

from benchmarks.client import AudioStreamParser, RequestRecord, build_payload
from benchmarks.metrics import COMPLETED, FAILED, REJECTED, TIMED_OUT, Timeline, text_ready_times
from benchmarks.sweep import LoadConfig, LoadGenerator

SOCKET_PATH = "/v1/audio/speech/stream"
DEFAULT_WORDS_PER_S = 30.0
# fields of an HTTP request body that a socket's config does not take
_NOT_IN_CONFIG = ("input", "stream", "stream_format", "speed")


@dataclass(slots=True)
class TextStreamRecord(RequestRecord):
    """A request record (`sent_s`: the first text message) with its text's timeline."""

    connected_s: float | None = None  # the socket was open
    word_sent_s: list[float] = field(default_factory=list)  # each word's text message
    end_sent_s: float | None = None
    event_audio_s: list[float] = field(default_factory=list)  # `duration_s` of each `audio` event
    close_code: int | None = None
    lookahead_words: int = 0

    def timeline(self) -> Timeline:
        base = RequestRecord.timeline(self)
        ready = text_ready_times(base.chunk_audio_s, self.word_sent_s, self.end_sent_s, self.lookahead_words)
        return dataclasses.replace(base, chunk_text_ready_s=ready)

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def socket_url(base_url: str) -> str:
    return "ws" + base_url.rstrip("/").removeprefix("http") + SOCKET_PATH


def config_message(payload: dict) -> dict:
    """The socket's config message from an HTTP request body (`client.build_payload`)."""
    return {"type": "config", **{k: v for k, v in payload.items() if k not in _NOT_IN_CONFIG}}


def word_messages(text: str) -> list[str]:
    """The text's pieces, one word each, spaces kept so that the pieces join back into the text's words."""
    words = text.split()
    return [word + " " for word in words[:-1]] + words[-1:]


async def stream_text(session: aiohttp.ClientSession, url: str, payload: dict, words_per_s: float,
                      record: TextStreamRecord, origin: float, timeout_s: float) -> TextStreamRecord:
    """One utterance over one socket; fills `record` and never raises for the server's trouble."""
    parser = AudioStreamParser(48000, expect_wav=payload.get("response_format") == "wav")
    try:
        await asyncio.wait_for(_converse(session, url, payload, words_per_s, parser, record, origin), timeout_s)
    except asyncio.TimeoutError:
        record.outcome, record.error = TIMED_OUT, f"no done within {timeout_s} s"
    except aiohttp.WSServerHandshakeError as exc:
        record.status = exc.status
        record.outcome = REJECTED if exc.status in (429, 503) else FAILED
        record.error = f"handshake refused: {exc.status} {exc.message}"
    except (aiohttp.ClientError, ValueError, OSError) as exc:
        record.outcome, record.error = FAILED, f"{type(exc).__name__}: {exc}"
    finally:
        record.finished_s = time.perf_counter() - origin
        record.header_bytes, record.bytes_per_second = parser.header_bytes, parser.bytes_per_second
    return record


async def _converse(session, url, payload, words_per_s, parser, record: TextStreamRecord, origin: float) -> None:
    async with session.ws_connect(url, max_msg_size=0, autoping=True) as ws:
        record.connected_s = time.perf_counter() - origin
        await ws.send_json(config_message(payload))
        sender = asyncio.get_running_loop().create_task(_send_words(ws, payload["input"], words_per_s, record, origin))
        try:
            await _receive(ws, parser, record, origin)
        finally:
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
        record.close_code = ws.close_code
        record.status = ws.close_code


async def _send_words(ws, text: str, words_per_s: float, record: TextStreamRecord, origin: float) -> None:
    start = time.perf_counter()
    for i, piece in enumerate(word_messages(text)):
        delay = start + i / words_per_s - time.perf_counter()  # an absolute schedule: sending never drifts
        if delay > 0:
            await asyncio.sleep(delay)
        await ws.send_json({"type": "text", "text": piece})
        record.word_sent_s.append(time.perf_counter() - origin)
        if i == 0:
            record.sent_s = record.word_sent_s[0]
    await ws.send_json({"type": "end"})
    record.end_sent_s = time.perf_counter() - origin


async def _receive(ws, parser: AudioStreamParser, record: TextStreamRecord, origin: float) -> None:
    async for message in ws:
        if message.type == aiohttp.WSMsgType.BINARY:
            record.chunk_times_s.append(time.perf_counter() - origin)
            record.chunk_audio_bytes.append(parser.feed(message.data))
            continue
        if message.type != aiohttp.WSMsgType.TEXT:
            break
        event = json.loads(message.data)
        if event.get("type") == "audio":
            record.event_audio_s.append(float(event.get("duration_s", 0.0)))
        elif event.get("type") == "error":
            error = event.get("error", {})
            record.error = str(error.get("message", event))[:300]
            record.outcome = REJECTED if error.get("type") == "service_unavailable" else FAILED
            if error.get("retry_after_s") is not None:
                record.retry_after = str(error["retry_after_s"])
            continue  # the close (and its code) follows
        elif event.get("type") == "done":
            if sum(record.chunk_audio_bytes) == 0:
                record.outcome, record.error = FAILED, "done without audio"
            else:
                record.outcome = COMPLETED
            await ws.close()
            return
    if record.outcome is None:
        record.outcome, record.error = FAILED, f"socket closed ({ws.close_code}) before done"


class TextStreamGenerator(LoadGenerator):
    """The sweep's load generator, each request a socket that sends its text at `words_per_s`."""

    def __init__(self, config: LoadConfig, session: aiohttp.ClientSession, words_per_s: float = DEFAULT_WORDS_PER_S,
                 lookahead_words: int = 0):
        if not words_per_s > 0:
            raise ValueError(f"words_per_s must be > 0, got {words_per_s}")
        if lookahead_words < 0:
            raise ValueError(f"lookahead_words must be >= 0, got {lookahead_words}")
        super().__init__(config, session)
        self.words_per_s, self.lookahead_words = words_per_s, lookahead_words
        self.url = socket_url(config.base_url)

    def _record(self, index: int, offset_s: float, text: str, num_frames: int | None) -> TextStreamRecord:
        return TextStreamRecord(index=index, text=text, num_words=len(text.split()), num_frames=num_frames,
                                scheduled_s=offset_s, lookahead_words=self.lookahead_words)

    async def _send(self, record: TextStreamRecord, origin: float, seed: int) -> TextStreamRecord:
        payload = build_payload(self.config.profile, record.text, record.num_frames, seed)
        return await stream_text(self.session, self.url, payload, self.words_per_s, record, origin,
                                 self.config.request_timeout_s)
