"""Encoders of the speech response body: float32 mono chunks in, the bytes of one response format out.

Every format but FLAC streams, each in the form players read from the first bytes on:
- mp3: MPEG-2 Layer III frames (no Xing header when streamed; a whole file carries one, so its length is exact).
- opus: Ogg pages of Opus packets at 24 kHz (a rate libopus encodes natively: no resampling); pages are cut every
  20 ms of audio so a chunk's audio leaves with the chunk instead of waiting for a full page.
- aac: ADTS frames (AAC-LC), each with its own header.
- flac: whole files only. A FLAC stream would start with a STREAMINFO whose length and checksum are unknown (0),
  which common decoders (libsndfile among them) refuse; wav and pcm are the lossless streams.
- wav: a header of unknown length, then 16-bit PCM (`audio_format`); a whole file has the real length.
- pcm: raw 16-bit little-endian PCM.

The compressed formats go through PyAV (FFmpeg's encoders and muxers). One `AudioEncoder` serves one response; its
calls are made one at a time (from a worker thread for the compressed formats: see `encode_off_loop`).
"""

from __future__ import annotations

import asyncio
import io
import threading

import numpy as np

from . import audio_format

RESPONSE_FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
STREAMED_FORMATS = ("mp3", "opus", "aac", "wav", "pcm")
MEDIA_TYPES = {"mp3": "audio/mpeg", "opus": "audio/ogg", "aac": "audio/aac", "flac": "audio/flac",
               "wav": "audio/wav", "pcm": "audio/pcm"}
# format -> (FFmpeg muxer, encoder, bit rate in bit/s or None for lossless, muxer options)
_FFMPEG = {
    "mp3": ("mp3", "libmp3lame", 64_000, {}),
    "opus": ("ogg", "libopus", 32_000, {"page_duration": "20000"}),  # µs of audio per Ogg page at most
    "aac": ("adts", "aac", 64_000, {}),
    "flac": ("flac", "flac", None, {}),
}


class _Collector:
    """A write-only file for a streamed response: without `seek` FFmpeg writes headers it never goes back to."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def write(self, data) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        data, self._parts = b"".join(self._parts), []
        return data


class AudioEncoder:
    """One response in `fmt`: `encode(chunk)` returns the bytes ready to send, `finish()` the rest. `streaming`
    False: the bytes come at `finish()` only, as a complete file with its length in its header."""

    def __init__(self, fmt: str, sample_rate: int = audio_format.SAMPLE_RATE, streaming: bool = True):
        if fmt not in RESPONSE_FORMATS:
            raise ValueError(f"response_format {fmt!r} is not supported; use one of {list(RESPONSE_FORMATS)}")
        self.fmt, self.sample_rate, self.streaming = fmt, sample_rate, streaming
        self._pcm: list[bytes] = []  # whole-file wav: samples until the length is known
        self._header_sent = False
        self._container = self._stream = self._out = None
        # A stream cancelled while a worker thread encodes its chunk closes the encoder from the event loop: the
        # close waits for that encode (milliseconds) rather than freeing FFmpeg's state under it.
        self._lock = threading.Lock()
        self.compressed = fmt in _FFMPEG
        if self.compressed:
            import av

            muxer, codec, bit_rate, options = _FFMPEG[fmt]
            self._out = _Collector() if streaming else io.BytesIO()
            self._container = av.open(self._out, mode="w", format=muxer, options=options)
            self._stream = self._container.add_stream(codec, rate=sample_rate, layout="mono")
            if bit_rate:
                self._stream.bit_rate = bit_rate

    def encode(self, chunk: np.ndarray) -> bytes:
        with self._lock:
            return self._encode(chunk)

    def finish(self) -> bytes:
        """The rest of the response (the whole file when not streaming); the encoder is closed after."""
        with self._lock:
            return self._finish()

    def close(self) -> None:
        """Free the encoder without finishing the response (the client left)."""
        with self._lock:
            if self._container is not None:
                try:
                    self._container.close()
                except Exception:  # noqa: BLE001 - a half-written stream may fail its trailer; nobody reads it
                    pass
                self._container = None

    def _encode(self, chunk: np.ndarray) -> bytes:
        audio = np.ascontiguousarray(np.asarray(chunk, dtype=np.float32).reshape(-1))
        if not self.compressed:
            pcm = audio_format.pcm16_bytes(audio)
            if not self.streaming:
                self._pcm.append(pcm)
                return b""
            if self.fmt == "wav" and not self._header_sent:
                self._header_sent = True
                return audio_format.streaming_wav_header(self.sample_rate) + pcm
            return pcm
        if self._container is None:  # closed: the response was abandoned
            return b""
        if audio.size:
            self._mux(self._frame(np.clip(np.nan_to_num(audio), -1.0, 1.0)))
        return self._out.take() if self.streaming else b""

    def _finish(self) -> bytes:
        if not self.compressed:
            if self.streaming:
                return b"" if self._header_sent or self.fmt == "pcm" else audio_format.streaming_wav_header(
                    self.sample_rate)
            pcm = b"".join(self._pcm)
            return audio_format.wav_header(self.sample_rate, len(pcm)) + pcm if self.fmt == "wav" else pcm
        if self._container is None:
            return b""
        self._mux(None)
        self._container.close()
        self._container = None
        return self._out.take() if self.streaming else self._out.getvalue()

    def _frame(self, audio: np.ndarray):
        import av

        frame = av.AudioFrame.from_ndarray(audio[None, :], format="flt", layout="mono")
        frame.sample_rate = self.sample_rate
        return frame

    def _mux(self, frame) -> None:
        for packet in self._stream.encode(frame):  # PyAV converts the sample format and cuts codec frames
            self._container.mux(packet)


async def encode_off_loop(encoder: AudioEncoder, chunk: np.ndarray | None) -> bytes:
    """`encoder.encode(chunk)` (`finish()` for None) off the event loop when the format is compressed: an FFmpeg
    encode of a chunk takes milliseconds, a whole file's more, and other streams' chunks must not wait on it."""
    call = encoder.finish if chunk is None else (lambda: encoder.encode(chunk))
    if not encoder.compressed:
        return call()
    return await asyncio.to_thread(call)


def time_stretch(audio: np.ndarray, speed: float, sample_rate: int = audio_format.SAMPLE_RATE) -> np.ndarray:
    """`audio` played `speed` times as fast at the same pitch (FFmpeg's atempo, WSOLA). atempo takes factors in
    [0.5, 100]; slower ones are a chain of 0.5 steps and a remainder."""
    if speed == 1.0 or audio.size == 0:
        return audio
    import av

    factors = []
    while speed < 0.5:
        factors.append(0.5)
        speed /= 0.5
    factors.append(speed)
    graph = av.filter.Graph()
    node = graph.add_abuffer(format="flt", sample_rate=sample_rate, layout="mono", time_base=f"1/{sample_rate}")
    source = node
    for factor in factors:
        step = graph.add("atempo", f"{factor:.6f}")
        node.link_to(step)
        node = step
    sink = graph.add("abuffersink")
    node.link_to(sink)
    graph.configure()
    frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(audio, dtype=np.float32)[None, :], format="flt",
                                       layout="mono")
    frame.sample_rate, frame.pts = sample_rate, 0
    source.push(frame)
    source.push(None)
    pieces = []
    while True:
        try:
            out = sink.pull()
        except (av.BlockingIOError, av.EOFError):
            break
        pieces.append(out.to_ndarray().reshape(-1))
    return np.concatenate(pieces).astype(np.float32) if pieces else np.zeros(0, np.float32)
