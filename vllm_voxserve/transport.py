"""The audio channel from the vLLM worker (where the codec runs) to the API server (where HTTP streams are).

vLLM's own output path cannot carry audio for generate requests (its pooling output is dropped or asserted on),
so audio travels on a ZeroMQ PUSH -> PULL socket beside it. Each API server binds one PULL socket and puts its
address and a fresh stream key into every request it sends; the worker pushes that request's audio there, in
order, and finishes with an END (or ERROR) message. `generate()` still carries the request's lifecycle: finish,
abort and backpressure.

Message = [stream key, header, payload]: header is kind (1 byte), sequence number (uint32); payload is float32
mono PCM for AUDIO, UTF-8 text for ERROR, empty for END.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import struct
import tempfile
import uuid

import numpy as np
import zmq
import zmq.asyncio

AUDIO, END, ERROR = 0, 1, 2
_HEADER = struct.Struct("<BI")


def new_stream_key() -> str:
    return uuid.uuid4().hex


class AudioSender:
    """Worker side: pushes each request's audio to the API server that owns it. Never blocks on a slow reader."""

    def __init__(self) -> None:
        self._context = zmq.Context.instance()
        self._sockets: dict[str, zmq.Socket] = {}

    def _socket(self, address: str) -> zmq.Socket:
        sock = self._sockets.get(address)
        if sock is None:
            sock = self._context.socket(zmq.PUSH)
            sock.setsockopt(zmq.SNDHWM, 0)  # queue rather than drop audio
            sock.setsockopt(zmq.LINGER, 1000)
            sock.connect(address)
            self._sockets[address] = sock
        return sock

    def send_audio(self, address: str, stream_key: str, seq: int, pcm: np.ndarray) -> None:
        """Queues `pcm` without copying it when it is contiguous float32 (the codec's rows are): the caller must not
        change it afterwards (the codec lanes hand over a copy of each batch; inline decodes return fresh arrays)."""
        payload = np.ascontiguousarray(pcm, dtype=np.float32)
        self._socket(address).send_multipart([stream_key.encode(), _HEADER.pack(AUDIO, seq), payload], copy=False)

    def send_end(self, address: str, stream_key: str, seq: int) -> None:
        self._socket(address).send_multipart([stream_key.encode(), _HEADER.pack(END, seq), b""])

    def send_error(self, address: str, stream_key: str, seq: int, message: str) -> None:
        self._socket(address).send_multipart([stream_key.encode(), _HEADER.pack(ERROR, seq), message.encode()])

    def close(self) -> None:
        for sock in self._sockets.values():
            sock.close()
        self._sockets.clear()


class StreamClosed(Exception):
    """The worker reported an error for this stream."""


class AudioReceiver:
    """API-server side: one PULL socket; routes messages to per-request asyncio queues, checking their order."""

    def __init__(self, address: str | None = None) -> None:
        if address is None:
            path = os.path.join(tempfile.gettempdir(), f"voxserve-audio-{os.getpid()}-{uuid.uuid4().hex[:8]}")
            address = f"ipc://{path}"
        self.address = address
        self._context = zmq.asyncio.Context.instance()
        self._socket = self._context.socket(zmq.PULL)
        self._socket.setsockopt(zmq.RCVHWM, 0)
        self._socket.bind(address)
        self._queues: dict[str, asyncio.Queue] = {}
        self._next_seq: dict[str, int] = {}
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._pump())

    def open(self, stream_key: str) -> asyncio.Queue:
        """Queue of (kind, payload) for one request; open it before the request is sent to the engine."""
        queue: asyncio.Queue = asyncio.Queue()
        self._queues[stream_key] = queue
        self._next_seq[stream_key] = 0
        return queue

    def close(self, stream_key: str) -> None:
        """Forget a stream; late messages for it are dropped."""
        self._queues.pop(stream_key, None)
        self._next_seq.pop(stream_key, None)

    async def _pump(self) -> None:
        while True:
            key_bytes, header, payload = await self._socket.recv_multipart()
            key = key_bytes.decode()
            queue = self._queues.get(key)
            if queue is None:
                continue
            kind, seq = _HEADER.unpack(header)
            expected = self._next_seq[key]
            if seq != expected:  # ZeroMQ keeps order per sender; a gap means a bug, never silent corruption
                queue.put_nowait((ERROR, f"audio out of order: got chunk {seq}, expected {expected}"))
                continue
            self._next_seq[key] = expected + 1
            if kind == AUDIO:
                queue.put_nowait((AUDIO, np.frombuffer(payload, dtype=np.float32)))
            elif kind == END:
                queue.put_nowait((END, None))
            else:
                queue.put_nowait((ERROR, bytes(payload).decode(errors="replace")))

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._socket.close(linger=0)
        if self.address.startswith("ipc://"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.address[len("ipc://") :])
