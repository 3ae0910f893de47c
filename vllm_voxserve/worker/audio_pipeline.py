"""From frames to audio on the worker: per-request chunking, the codec, and the audio channel.

Frames are cut into chunks per request (`first_chunk_frames`, then `chunk_frames`; a finished request's last chunk
may be shorter). The codec mode's `CodecRunner` decides where a cut chunk goes (`codec_runners`: `inline` decodes it
in the step, `lanes` hands it to the codec lanes). Either way a request's audio leaves in chunk order, then END (or
ERROR). The mode can be switched while no request is open (`set_codec_mode`, reached from the API server through
`collective_rpc`, see `worker.rpc`).
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import torch

from vllm_voxserve.config import CodecMode, VoxServeConfig
from vllm_voxserve.fault_injection import FaultPlan
from vllm_voxserve.models.program import CodecProgram
from vllm_voxserve.transport import AudioSender
from vllm_voxserve.worker.chunk_dispatch import LaneDispatch
from vllm_voxserve.worker.codec_runners import CodecRunner, InlineCodec, LaneCodec
from vllm_voxserve.worker.frame_store import FrameStore

logger = logging.getLogger(__name__)

MAX_CODE = 2047  # codes past the codebook (never produced by a healthy talker) are clamped, as the reference does


class CodecModeBusy(RuntimeError):
    """The codec mode cannot change while requests are open."""


class CodecModeUnavailable(RuntimeError):
    """The new codec mode could not be built (`out_of_memory`: the device had no memory for it); nothing changed."""

    def __init__(self, message: str, out_of_memory: bool):
        super().__init__(message)
        self.out_of_memory = out_of_memory


def is_out_of_memory(exc: BaseException) -> bool:
    """torch's OutOfMemoryError, or a RuntimeError saying so (CUDA graph capture and some allocators raise those)."""
    oom_type = getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None)
    if oom_type is not None and isinstance(exc, oom_type):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def release_device_memory(device: torch.device) -> None:
    """Return what a failed build left to the allocator's cache to the device (unreferenced by now)."""
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


@dataclass(slots=True)
class _Stream:
    stream_key: str
    address: str
    store_slot: int  # its place in the frame store (frames not yet cut into a chunk)
    pending: int = 0  # frames in the store, not yet cut into a chunk
    frames: int = 0  # frames received so far
    chunks_cut: int = 0  # index of the next chunk to cut (its size comes from the config's schedule)
    chunks_sent: int = 0  # chunks whose audio has been sent (lanes mode: may trail chunks_cut)
    first_audio_at: float | None = None  # when its first audio left (the pipeline's clock)
    opened_at: float = 0.0  # when the worker took it up (its prefill), for the first-audio path
    opened_push: int = 0  # the pipeline's pushes before it was taken up
    first_cut_at: float | None = None  # when its first chunk was cut (all of its frames existed)
    first_cut_pushes: int = 0  # pushes from its taking up to its first cut (see `first_audio_paths`)
    seq: int = 0  # next message number on the audio channel
    closing: bool = False  # finished: END follows its last audio
    seed: int | None = None  # the request's seed (names it to the tests' fault injection)


class AudioPipeline:
    MODES = (CodecMode.INLINE.value, CodecMode.LANES.value)

    def __init__(self, program: CodecProgram, config: VoxServeConfig, sender: AudioSender, device: torch.device,
                 clock: Callable[[], float] = time.monotonic, fault: FaultPlan | None = None):
        self.program, self.config, self.sender, self.device, self.clock = program, config, sender, device, clock
        self.fault = fault  # tests only (`fault_injection`)
        self.streams: dict[str, _Stream] = {}
        self._failures: dict[str, str] = {}  # streams ended by an error here, for the runtime (`take_failures`)
        self.frame_store = FrameStore(config.max_codec_slots, max(config.first_chunk_frames, config.chunk_frames),
                                      program.codes_per_frame, device)
        self.chunks_sent = 0  # over all requests, since start-up
        self.frames_pushed = 0  # backbone frames handed over, since start-up (the speech metrics' frame rate)
        # per request, at its first audio: (first chunk cut - taken up, first audio - first chunk cut) in seconds, the
        # worker's share of its time to first audio, and the steps (pushes) from its taking up to that cut: about
        # the first chunk's frames when every step decoded it, more when steps left it out; the runtime drains it
        # into the step log
        self.first_audio_paths: list[tuple[float, float, int]] = []
        self.pushes = 0  # push calls since start-up: one a step (in inline mode, a step with frames)
        self.codecs: dict[CodecMode, CodecRunner] = {}  # each mode's runner, built on first use and kept
        mode = CodecMode(config.codec_mode)
        if mode is CodecMode.AUTO:
            mode = CodecMode.INLINE
            if device.type == "cuda":
                try:
                    self._prepare(CodecMode.LANES)
                    mode = CodecMode.LANES
                except Exception:  # e.g. no green contexts on this GPU or driver: still serve, time-sharing
                    logger.exception("codec lanes could not be built; serving with the inline codec")
        self.codec: CodecRunner = self._prepare(mode)

    # mode --------------------------------------------------------------------------------------------------------

    @property
    def mode(self) -> CodecMode:
        return self.codec.mode

    @property
    def codec_mode(self) -> str:
        return self.codec.mode.value

    @property
    def lanes(self) -> LaneDispatch | None:
        """The codec lanes' dispatcher once lanes mode was built (kept across switches), for the step log."""
        lanes = self.codecs.get(CodecMode.LANES)
        return lanes.dispatch if lanes is not None else None

    @property
    def inline(self) -> InlineCodec | None:
        return self.codecs.get(CodecMode.INLINE)

    def set_codec_mode(self, mode: str) -> None:
        """Switch between `inline` and `lanes`; ValueError for another name, CodecModeBusy while a request is open,
        CodecModeUnavailable when the new mode cannot be built (e.g. no device memory for it): then nothing changed,
        the current mode still serves and what was built for the new one is released."""
        if mode not in self.MODES:
            raise ValueError(f"unknown codec mode {mode!r}; modes: {list(self.MODES)}")
        new = CodecMode(mode)
        if self.streams:
            raise CodecModeBusy(f"{len(self.streams)} request(s) are running; switch the codec mode when idle")
        for built in self.codecs.values():
            built.quiesce()  # e.g. a lanes batch of an aborted request may still be in flight
        failure = None
        try:
            codec = self._prepare(new)
        except Exception as exc:
            failure = (is_out_of_memory(exc), f"{type(exc).__name__}: {exc}")
            # the traceback as text: a log record holding the exception would keep the half-built parts alive
            logger.error("building the %s codec failed; still serving in %s\n%s", new.value, self.mode.value,
                         traceback.format_exc())
        if failure is not None:  # outside the handler: its traceback, which holds what was built, is gone now
            release_device_memory(self.device)
            out_of_memory, detail = failure
            why = "not enough device memory" if out_of_memory else "it could not be built"
            raise CodecModeUnavailable(f"cannot switch the codec to {new.value!r}: {why} ({detail}); still serving "
                                       f"in {self.mode.value!r}", out_of_memory)
        if new is not self.mode:
            logger.info("codec mode: %s -> %s", self.mode.value, new.value)
        self.codec = codec

    def _prepare(self, mode: CodecMode) -> CodecRunner:
        """`mode`'s runner, built if it is not there yet. Transactional: the pipeline keeps a runner only once it is
        built, so a failure part-way leaves it exactly as it was."""
        codec = self.codecs.get(mode)
        if codec is None:
            # The inline codec ends a stream in the call that finished it (`_end`: END, even after a failed send of
            # its last chunk, which `take_failures` reports); the lanes end it later, by then maybe failed (`_ended`).
            if mode is CodecMode.INLINE:
                codec = InlineCodec(self.program, self.config, self.device, self._send, self._end)
            else:
                codec = LaneCodec(self.program, self.config, self.device, self._send, self._ended, self.clock)
            self.codecs[mode] = codec
        return codec

    # requests ----------------------------------------------------------------------------------------------------

    def open(self, req_id: str, stream_key: str, address: str, warmup_codes: torch.Tensor | None = None,
             seed: int | None = None) -> None:
        if warmup_codes is not None:  # codes enter clamped, here and in `_store`: nothing after clamps again
            warmup_codes = warmup_codes.clamp(0, MAX_CODE)
        # Warm-up: reference frames decoded into the state, unheard (Base voice cloning continues them).
        self.codec.open(req_id, warmup_codes)  # RuntimeError when no state slot is free
        # as many store slots as codec slots, so one is free here
        self.streams[req_id] = _Stream(stream_key, address, self.frame_store.open(), opened_at=self.clock(),
                                       opened_push=self.pushes, seed=seed)

    def push(self, codes: torch.Tensor, req_ids: list[str]) -> None:
        """codes [n, 16]: one finished frame per entry of req_ids (in frame order per request)."""
        self.frames_pushed += len(req_ids)
        self.pushes += 1
        try:
            self._push(codes, req_ids)
        finally:
            self._end_failed_sends()

    def _push(self, codes: torch.Tensor, req_ids: list[str]) -> None:
        ready: list[tuple[str, int, torch.Tensor]] = []
        streams, width, add_frames = self.streams, self.frame_store.width, self.codec.add_frames
        rows: list[int] = []
        places: list[int] = []
        cut: list[str] = []
        cut_set: set[str] = set()
        first, later = self.config.first_chunk_frames, self.config.chunk_frames
        for i, req_id in enumerate(req_ids):  # the per-row host loop of every step: keep it lean
            stream = streams.get(req_id)
            if stream is None or stream.closing:
                continue
            if req_id in cut_set:  # a second frame of a request cut in this call: store and cut the first part
                self._store(codes, rows, places, cut, ready)
                rows, places, cut, cut_set = [], [], [], set()
            rows.append(i)
            places.append(stream.store_slot * width + stream.pending)
            stream.pending += 1
            stream.frames += 1
            add_frames(req_id, 1)
            if stream.pending >= (later if stream.chunks_cut else first):
                cut.append(req_id)
                cut_set.add(req_id)
        self._store(codes, rows, places, cut, ready)
        self.codec.decode(ready)

    def _store(self, codes: torch.Tensor, rows: list[int], places: list[int], cut: list[str],
               ready: list[tuple[str, int, torch.Tensor]]) -> None:
        """Scatter `codes[rows]` into the frame store, then cut the chunks of the streams in `cut`."""
        if rows:  # the store holds clamped codes, so every chunk cut from it is
            self.frame_store.write((codes if len(rows) == len(codes) else codes[rows]).clamp(0, MAX_CODE), places)
        if not cut:
            return
        streams = [self.streams[req_id] for req_id in cut]
        _, chunks = self.frame_store.take_many([(stream.store_slot, stream.pending) for stream in streams])
        for req_id, stream, frames in zip(cut, streams, chunks, strict=True):
            stream.pending = 0
            ready.append((req_id, stream.chunks_cut, frames))
            if stream.chunks_cut == 0:
                self._mark_first_cut(stream)
            stream.chunks_cut += 1

    def _mark_first_cut(self, stream: _Stream) -> None:
        """Its first chunk is cut now: when, and after how many pushes since it was taken up (`first_audio_paths`)."""
        stream.first_cut_at = self.clock()
        stream.first_cut_pushes = self.pushes - stream.opened_push

    def _take_pending(self, stream: _Stream) -> torch.Tensor:
        frames = self.frame_store.take(stream.store_slot, stream.pending)
        stream.pending = 0
        return frames

    def close(self, req_id: str, error: str | None = None) -> None:
        """The request finished (or failed): decode what is left, then END (or ERROR) and free its slot.

        END follows once the codec has delivered the last chunk: here for the inline codec; for the lanes at a later
        step's pump, or here, by draining the lanes, when no other request is generating (the engine may take no
        further step)."""
        try:
            self._close(req_id, error)
        finally:
            self._end_failed_sends()

    def _close(self, req_id: str, error: str | None) -> None:
        stream = self.streams.get(req_id)
        if stream is None:
            return
        if error is not None:
            self._end(req_id, error)
            return
        if stream.closing:
            return
        if stream.pending and stream.chunks_cut == 0:  # shorter than a first chunk
            self._mark_first_cut(stream)
        stream.closing = True
        last = None
        if stream.pending:
            last = (stream.chunks_cut, self._take_pending(stream))
            stream.chunks_cut += 1
        self.codec.finish(req_id, last)

    def fail(self, req_id: str, error: str) -> None:
        self.close(req_id, error)

    def cancel(self, stream_keys: list[str]) -> int:
        """The listeners of these streams left (the API server closed them): end each now, dropping its frames and
        chunks not yet decoded, and send nothing more. vLLM's abort stops the backbone, but a request that finished
        generating before its listener left still has its audio to decode: in run 2026-12-01_21d5739 on the H200,
        ~1,500 chunks of
        the requests of a probe cut short kept the codec lanes and all 256 codec slots busy into the next window.
        Returns how many streams were open here."""
        wanted = set(stream_keys)
        found = [req_id for req_id, stream in self.streams.items() if stream.stream_key in wanted]
        for req_id in found:
            self._end(req_id, None, notify=False)
        if found:
            self.codec.settle()  # the others' audio must not wait for a step that may never come
            self._end_failed_sends()
        return len(found)

    # audio out ---------------------------------------------------------------------------------------------------

    def _end(self, req_id: str, error: str | None, notify: bool = True) -> None:
        """Send END (or ERROR) and forget the request; after an error, or when nobody listens (`notify` false), in
        codec also drop whatever of it is left there."""
        stream = self.streams.pop(req_id)
        self.frame_store.close(stream.store_slot)
        self.codec.release(req_id, drop=error is not None or not notify)
        if not notify:
            return
        try:
            if error is None:
                self.sender.send_end(stream.address, stream.stream_key, stream.seq)
            else:
                self.sender.send_error(stream.address, stream.stream_key, stream.seq, error)
        except Exception as exc:  # noqa: BLE001 - the scheduler finishes it with the error instead
            logger.exception("ending the audio of %s failed", req_id)
            self._failures.setdefault(req_id, error or f"audio channel failed: {type(exc).__name__}: {exc}")

    def _end_failed_sends(self) -> None:
        """Streams whose audio could not be handed over end with an error (after the batch that found it)."""
        for req_id in [r for r in self._failures if r in self.streams]:
            self._end(req_id, self._failures[req_id])

    def _ended(self, req_id: str, error: str | None) -> None:
        """Lanes callback: the request's last audio left (or its chunks cannot be decoded)."""
        if req_id in self.streams:
            self._end(req_id, error or self._failures.get(req_id))

    def take_failures(self) -> list[tuple[str, str]]:
        """Requests whose stream this pipeline ended with an error since the last call (request id, message)."""
        failures, self._failures = list(self._failures.items()), {}
        return failures

    def _send(self, req_id: str, audio) -> None:
        stream = self.streams.get(req_id)
        if stream is None or req_id in self._failures:  # ended meanwhile (its audio could not be handed over)
            return
        try:
            if self.fault is not None:
                self.fault.check("send", stream.seed, stream.chunks_sent)
            self.sender.send_audio(stream.address, stream.stream_key, stream.seq, audio)
        except Exception as exc:  # noqa: BLE001 - one stream's channel must not fail the batch's other streams
            logger.exception("sending audio of %s failed", req_id)
            self._failures[req_id] = f"audio channel failed: {type(exc).__name__}: {exc}"
            return
        if stream.first_audio_at is None:
            stream.first_audio_at = self.clock()
            if stream.first_cut_at is not None:  # audio follows a cut chunk; guarded all the same
                self.first_audio_paths.append((stream.first_cut_at - stream.opened_at,
                                               stream.first_audio_at - stream.first_cut_at, stream.first_cut_pushes))
        stream.seq += 1
        stream.chunks_sent += 1
        self.chunks_sent += 1

    def codec_modes(self) -> dict:
        """What `GET /voxserve/modes` reports."""
        return {"modes": list(self.MODES), "current": self.codec_mode}
