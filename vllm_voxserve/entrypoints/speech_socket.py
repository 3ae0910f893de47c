"""`WS /v1/audio/speech/stream`: text in as it is written, audio out as it is decoded (protocol in
`speech_socket_protocol.py`).

Three tasks serve a socket: a reader queues the client's messages, the handler takes them in order (and the audio
task's end), and for an open utterance an audio task sends its chunks as they come. The handler alone changes the
session; sends are serialized, so an `audio` event is always followed by its own binary message. A client that
leaves cancels its utterance at once; every refusal is an `error` event and a close code, never an exception out of
the route.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from fastapi import APIRouter, WebSocket

from vllm_voxserve.contract import SAMPLE_RATE

from .audio_encoding import AudioEncoder, encode_off_loop
from .edge_admission import EdgeGuard, EdgeRefusal
from .request_guard import RequestRejected, check_api_key
from .speech_metrics import SpeechMetrics
from .speech_service import InvalidSpeechRequest, Overloaded, SynthesisError
from .speech_socket_protocol import (
    CLOSE_INTERNAL,
    CLOSE_NORMAL,
    CLOSE_POLICY,
    CLOSE_TRY_AGAIN_LATER,
    CONFIG_TIMEOUT_S,
    IDLE_TIMEOUT_S,
    Action,
    ProtocolError,
    Session,
    State,
    Text,
    error_event,
    parse_message,
)

logger = logging.getLogger(__name__)
router = APIRouter()

_GONE = ("gone",)  # the client closed the socket
# Messages read ahead of the handler: past this the reader waits, and TCP holds back a client that floods.
MAX_QUEUED_MESSAGES = 256
MAX_CLOSE_REASON_BYTES = 123  # RFC 6455: a close frame's payload is at most 125 bytes, 2 of them the code
_MESSAGE, _AUDIO_ENDED = "message", "audio_ended"


class _Gone(Exception):
    """A send failed: the client has left."""


@router.websocket("/v1/audio/speech/stream")
async def speech_stream(ws: WebSocket) -> None:
    await ws.accept()
    service = getattr(ws.app.state, "voxserve_speech", None)
    try:  # vLLM's middleware checks the key on /v1 already; this route holds to it wherever it is mounted
        check_api_key(ws.headers.get("authorization"), getattr(ws.app.state, "voxserve_api_keys", []))
    except RequestRejected as exc:
        await _refuse(ws, ProtocolError(exc.message, CLOSE_POLICY, "authentication_error"))
        return
    if service is None:
        await _refuse(ws, ProtocolError("speech synthesis is not available on this server", CLOSE_INTERNAL,
                                        "service_unavailable"))
        return
    await SpeechSocket(ws, service, ws.app.state.voxserve_edge).serve()


async def _refuse(ws: WebSocket, error: ProtocolError) -> None:
    with contextlib.suppress(Exception):  # the client may be gone already
        await ws.send_json(error.event())
        reason = error.message.encode("utf-8")[:MAX_CLOSE_REASON_BYTES].decode("utf-8", "ignore")
        await ws.close(error.close_code, reason)


class SpeechSocket:
    def __init__(self, ws: WebSocket, service, edge: EdgeGuard) -> None:
        self.ws, self.service, self.edge = ws, service, edge
        self.metrics = SpeechMetrics.get((getattr(service, "served_models", None) or [""])[0])
        self.session = Session(service.config.max_input_chars)
        self.max_message_bytes = service.config.max_request_bytes
        self.inbox: asyncio.Queue = asyncio.Queue(MAX_QUEUED_MESSAGES)
        self.sending = asyncio.Lock()
        self.last_activity = time.monotonic()
        # the open utterance
        self.stream = None
        self.audio_task: asyncio.Task | None = None
        self.encoder: AudioEncoder | None = None
        self.ticket = None

    async def serve(self) -> None:
        reader = asyncio.get_running_loop().create_task(self._read())
        try:
            await self._handle()
        except ProtocolError as exc:
            await self._stop_utterance()
            await _refuse(self.ws, exc)
        except _Gone:
            pass
        except Exception as exc:  # noqa: BLE001 - reported to the client, never out of the route
            logger.exception("speech socket failed")
            await self._stop_utterance()
            await _refuse(self.ws, ProtocolError(f"internal error: {type(exc).__name__}", CLOSE_INTERNAL,
                                                 "server_error"))
        finally:
            reader.cancel()
            await self._stop_utterance()  # a client gone mid-utterance frees it here, at once

    async def _read(self) -> None:
        try:
            while True:
                message = await self.ws.receive()
                if message["type"] == "websocket.disconnect":
                    break
                await self.inbox.put((_MESSAGE, message.get("text")))  # None for a binary message
        except Exception:  # noqa: BLE001 - a broken connection is a departure
            pass
        await self.inbox.put(_GONE)

    async def _next(self) -> tuple:
        """The next thing to handle; ProtocolError when the client keeps the socket open without using it."""
        while True:
            state = self.session.state
            if state is State.ENDING:  # the audio task ends it (the engine bounds its own waits)
                return await self.inbox.get()
            if state is State.AWAITING_CONFIG:
                limit, why = CONFIG_TIMEOUT_S, "no config message came"
            else:
                limit, why = IDLE_TIMEOUT_S, "no message came and no audio was sent"
            wait = self.last_activity + limit - time.monotonic()
            if wait <= 0:
                raise ProtocolError(f"{why} in {limit:g} s; closing", CLOSE_POLICY)
            with contextlib.suppress(asyncio.TimeoutError):
                return await asyncio.wait_for(self.inbox.get(), wait)

    async def _handle(self) -> None:
        while True:
            item = await self._next()
            if item is _GONE:
                return
            if item[0] == _AUDIO_ENDED:
                _, task, error = item
                if task is not self.audio_task:  # a cancelled utterance's
                    continue
                self._finish_utterance()
                if error is not None:
                    raise error
                if self.session.utterance_done():
                    await self._close(CLOSE_NORMAL)
                    return
                continue
            self.last_activity = time.monotonic()
            message = parse_message(item[1], self.max_message_bytes)
            action = self.session.accept(message)
            if action is Action.CLOSE:
                await self._close(CLOSE_NORMAL)
                return
            await self._act(action, message)

    async def _act(self, action: Action, message) -> None:
        try:
            if action is Action.OPEN:
                await self._open()
            if action in (Action.OPEN, Action.APPEND) and isinstance(message, Text):
                await self.stream.append(message.text)
            elif action is Action.FLUSH:
                await self.stream.flush()
            elif action is Action.END:
                await self.stream.end()
            elif action is Action.CANCEL:
                usage = self.stream.usage.as_dict()
                ended = self.audio_task is not None and self.audio_task.done()  # its `done` is out already
                await self._stop_utterance(hold_sends=True)
                if not ended:
                    await self._send_json({"type": "done", "utterance": self.session.utterances,
                                           "reason": "cancelled", "usage": usage})
        except (InvalidSpeechRequest, ValueError) as exc:
            self.metrics.refuse("invalid")
            raise ProtocolError(str(exc)) from None

    async def _open(self) -> None:
        # The utterance counts among this API server's requests in progress. Its first audio waits on the client's
        # text as much as on the server, so neither the edge's first-audio view nor the TTFA histogram hears of it.
        now = time.monotonic()
        ticket = self.edge.admit(now, self.service.refusal_at_arrival(now))
        if isinstance(ticket, EdgeRefusal):
            self.metrics.refuse("api_server_limit")
            raise ProtocolError(ticket.reason, CLOSE_TRY_AGAIN_LATER, "service_unavailable", ticket.retry_after_s)
        request = self.session.config
        if request.ttfa_slo_ms is not None:
            ticket.target_s = request.ttfa_slo_ms / 1000.0
        try:
            self.stream = self.service.open_text_stream(request)
        except BaseException:
            ticket.done(time.monotonic())
            raise
        self.ticket = ticket
        self.encoder = AudioEncoder(request.response_format, SAMPLE_RATE, streaming=True)
        self.metrics.stream_started()
        await self._send_json({"type": "started", "utterance": self.session.utterances,
                               "response_format": request.response_format, "sample_rate": SAMPLE_RATE})
        self.audio_task = asyncio.get_running_loop().create_task(self._send_audio(self.stream, self.encoder))

    async def _send_audio(self, stream, encoder: AudioEncoder) -> None:
        """The utterance's audio, each piece an `audio` event and its binary message, then `done`; its end (with
        the error, if any) is queued for the handler."""
        task = asyncio.current_task()
        error: ProtocolError | None = None
        index, unsent_s = 0, 0.0
        audio = stream.audio()
        try:
            async for chunk in audio:
                unsent_s += len(chunk) / SAMPLE_RATE
                self.metrics.audio(len(chunk) / SAMPLE_RATE)
                if data := await encode_off_loop(encoder, chunk):
                    await self._send_piece(index, unsent_s, data)
                    index, unsent_s = index + 1, 0.0
            if data := await encode_off_loop(encoder, None):
                await self._send_piece(index, unsent_s, data)
            reason = "end" if self.session.state is State.ENDING else "stopped"
            await self._send_json({"type": "done", "utterance": self.session.utterances, "reason": reason,
                                   "usage": stream.usage.as_dict()})
        except Overloaded as exc:
            self.metrics.refuse("overloaded")
            error = ProtocolError(str(exc), CLOSE_TRY_AGAIN_LATER, "service_unavailable", exc.retry_after_s)
        except InvalidSpeechRequest as exc:
            self.metrics.refuse("invalid")
            error = ProtocolError(str(exc))
        except SynthesisError as exc:
            self.metrics.refuse("failed")
            error = ProtocolError(str(exc), CLOSE_INTERNAL, "server_error")
        except _Gone:
            return  # the reader queues the departure
        finally:
            await audio.aclose()
        await self.inbox.put((_AUDIO_ENDED, task, error))

    async def _send_piece(self, index: int, duration_s: float, data: bytes) -> None:
        async with self.sending:
            try:
                await self.ws.send_json({"type": "audio", "index": index, "duration_s": round(duration_s, 6)})
                await self.ws.send_bytes(data)
            except Exception as exc:  # noqa: BLE001 - starlette and uvicorn raise several kinds for a closed socket
                raise _Gone from exc
        self.last_activity = time.monotonic()

    async def _send_json(self, event: dict) -> None:
        async with self.sending:
            try:
                await self.ws.send_json(event)
            except Exception as exc:  # noqa: BLE001
                raise _Gone from exc

    async def _close(self, code: int) -> None:
        with contextlib.suppress(Exception):
            await self.ws.close(code)

    def _finish_utterance(self) -> None:
        """Forget the utterance whose audio ended (its encoder has finished)."""
        self.audio_task = self.stream = None
        self._release()

    async def _stop_utterance(self, hold_sends: bool = False) -> None:
        """Cancel the open utterance, if any: its audio task, its engine request, its encoder. `hold_sends`: wait
        until no piece is being sent, so the client never sees an `audio` event without its bytes."""
        task, stream = self.audio_task, self.stream
        self.audio_task = self.stream = None
        if task is not None and not task.done():
            if hold_sends:
                async with self.sending:
                    task.cancel()
            else:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if stream is not None:
            try:
                await stream.cancel()
            except Exception:  # noqa: BLE001 - the request is being dropped either way
                logger.exception("cancelling a text stream failed")
        self._release()

    def _release(self) -> None:
        if self.encoder is not None:
            self.encoder.close()
            self.encoder = None
        if self.ticket is not None:
            self.ticket.done(time.monotonic())
            self.ticket = None
            self.metrics.stream_ended()
