"""A tiny streaming speech server on 127.0.0.1 for the benchmark tests, run in a background thread.

Texts steer it: "REJECT" -> 503 with Retry-After, "FAIL" -> 500, "JSONERR" -> a JSON error with status 200,
"STALL" -> a long gap before the third chunk.
With response_format=wav it sends the WAV header as its own network chunk, `header_gap_s` before the first PCM.
It also offers GET /voxserve/modes and POST /voxserve/mode (a mode sets the delay to first audio) and GET /metrics
with vLLM's running / waiting gauges.

WS /v1/audio/speech/stream speaks each word once it is complete (a space after it, or `end`): one `audio` event and
`word_audio_s` of PCM per word, the first after `first_audio_delay_s`; a word "STALL" delays the chunk after it by
`stall_gap_s`, "REJECT" in the text gets an overload error and close 1013.
"""

from __future__ import annotations

import asyncio
import json
import struct
import threading
from dataclasses import dataclass, field

from aiohttp import web

SAMPLE_RATE = 24000


def wav_header(sample_rate: int = SAMPLE_RATE, channels: int = 1, bits: int = 16) -> bytes:
    byte_rate = sample_rate * channels * bits // 8
    fmt = struct.pack("<HHIIHH", 1, channels, sample_rate, byte_rate, channels * bits // 8, bits)
    return (b"RIFF" + struct.pack("<I", 0xFFFFFFFF) + b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt
            + b"data" + struct.pack("<I", 0xFFFFFFFF))


@dataclass
class FakeBehavior:
    first_audio_delay_s: float = 0.02
    header_gap_s: float = 0.0
    chunk_audio_s: float = 0.2
    chunk_interval_s: float = 0.04
    num_chunks: int = 3
    stall_gap_s: float = 0.6
    delay_per_active_s: float = 0.0  # extra first-audio delay per request in flight: a server that saturates
    modes: dict[str, float] = field(default_factory=lambda: {"fast": 0.02, "slow": 0.4})  # first-audio delay
    broken_modes: tuple[str, ...] = ()  # offered, but switching to them fails (HTTP 500), as a mode whose build fails
    metrics: bool = True  # GET /metrics with vLLM's running / waiting gauges (False: 404, as a server without them)
    word_audio_s: float = 0.2  # the socket's audio per word


class FakeSpeechServer:
    def __init__(self, behavior: FakeBehavior | None = None, lifetime_s: float = 120.0):
        self.behavior = behavior or FakeBehavior()
        self.lifetime_s = lifetime_s  # bounded in time even if a test forgets to stop it
        self.payloads: list[dict] = []
        self.socket_messages: list[list[dict]] = []  # each socket's messages, in order
        self.mode = "fast"
        self.active = 0
        self.backlog_until = 0.0  # loop time until which /metrics reports one more request running (a drain)
        self.port: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> FakeSpeechServer:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("fake server did not start")
        return self

    def __exit__(self, *exc) -> None:
        if self._loop is not None and self._stopped is not None:
            self._loop.call_soon_threadsafe(self._stopped.set)
        self._thread.join(10)

    def _serve(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        app = web.Application()
        app.router.add_post("/v1/audio/speech", self._speech)
        app.router.add_get("/v1/audio/speech/stream", self._socket)
        app.router.add_get("/voxserve/modes", self._modes)
        app.router.add_post("/voxserve/mode", self._set_mode)
        if self.behavior.metrics:
            app.router.add_get("/metrics", self._metrics)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = runner.addresses[0][1]
        self._ready.set()
        try:
            await asyncio.wait_for(self._stopped.wait(), self.lifetime_s)
        except asyncio.TimeoutError:
            pass
        await runner.cleanup()

    async def _metrics(self, request: web.Request) -> web.Response:
        running = self.active + (asyncio.get_running_loop().time() < self.backlog_until)
        return web.Response(text=f'# HELP vllm:num_requests_running running\n'
                                 f'vllm:num_requests_running{{model_name="fake"}} {float(running)}\n'
                                 f'vllm:num_requests_waiting{{model_name="fake"}} 0.0\n')

    def drain_for(self, seconds: float) -> None:
        """From now on, /metrics reports a request still running for this long (thread-safe)."""
        loop = self._loop
        loop.call_soon_threadsafe(lambda: setattr(self, "backlog_until", loop.time() + seconds))

    async def _modes(self, request: web.Request) -> web.Response:
        return web.json_response({"modes": sorted(self.behavior.modes), "current": self.mode})

    async def _set_mode(self, request: web.Request) -> web.Response:
        mode = (await request.json()).get("mode")
        if mode in self.behavior.broken_modes:
            return web.json_response({"error": {"message": f"switching to {mode!r} failed"}}, status=500)
        if mode not in self.behavior.modes:
            return web.json_response({"error": f"unknown mode {mode}"}, status=400)
        self.mode = mode
        return web.json_response({"mode": mode})

    async def _speech(self, request: web.Request) -> web.StreamResponse:
        payload = await request.json()
        self.payloads.append(payload)
        text = payload.get("input", "")
        if "REJECT" in text:
            return web.Response(status=503, headers={"Retry-After": "1"}, text="queue full")
        if "FAIL" in text:
            return web.Response(status=500, text="boom")
        if "JSONERR" in text:
            return web.json_response({"error": "bad voice"})  # status 200, but no audio
        self.active += 1
        try:
            return await self._stream(request, payload, text)
        except ConnectionResetError:  # the client cancelled the request (a probe that ended early)
            return web.Response(status=499)
        finally:
            self.active -= 1

    async def _stream(self, request: web.Request, payload: dict, text: str) -> web.StreamResponse:
        b = self.behavior
        response = web.StreamResponse(headers={"Content-Type": "audio/wav"})
        await response.prepare(request)
        if payload.get("response_format") == "wav":
            await response.write(wav_header())
            await asyncio.sleep(b.header_gap_s)
        await asyncio.sleep(b.modes.get(self.mode, b.first_audio_delay_s) + b.delay_per_active_s * self.active)
        chunk = bytes(int(b.chunk_audio_s * SAMPLE_RATE) * 2)
        for i in range(b.num_chunks):
            if i > 0:
                await asyncio.sleep(b.stall_gap_s if ("STALL" in text and i == 2) else b.chunk_interval_s)
            await response.write(chunk)
        await response.write_eof()
        return response

    async def _socket(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        messages: list[dict] = []
        self.socket_messages.append(messages)
        self.active += 1
        text, spoken, chunks, ended = "", 0, 0, False
        try:
            async for message in ws:
                event = json.loads(message.data)
                messages.append(event)
                if event["type"] == "text":
                    text += event["text"]
                    if "REJECT" in text:
                        await ws.send_json({"type": "error", "error": {"message": "server at capacity",
                                                                       "type": "service_unavailable",
                                                                       "retry_after_s": 1.0}})
                        await ws.close(code=1013)
                        break
                ended = event["type"] == "end"
                words = text.split() if ended else text.split()[: text.count(" ")]
                for word in words[spoken:]:
                    await asyncio.sleep(self.behavior.first_audio_delay_s if chunks == 0 else 0.0)
                    if spoken > 0 and words[spoken - 1] == "STALL":
                        await asyncio.sleep(self.behavior.stall_gap_s)
                    await ws.send_json({"type": "audio", "index": chunks, "duration_s": self.behavior.word_audio_s})
                    await ws.send_bytes(bytes(int(self.behavior.word_audio_s * SAMPLE_RATE) * 2))
                    spoken, chunks = spoken + 1, chunks + 1
                if ended:
                    await ws.send_json({"type": "done", "utterance": 1, "reason": "end", "usage": {}})
                    await ws.close()
                    break
        finally:
            self.active -= 1
        return ws
