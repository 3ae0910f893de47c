"""The worker ends of our `collective_rpc` calls from the API server: `GET /voxserve/modes` and `POST /voxserve/mode`
(`codec_mode_call`), streams whose listeners left (`cancel_audio_call`), and the engine's speech metrics
(`stats_call`), and the text of text streams (`text_call`). Our worker classes expose them as
methods through `SpeechRpcTargets` (0.26 resolves a string method with `getattr(worker, name)` on each worker and runs it on the thread that runs
the worker's steps: the worker process's busy loop on CPU, the engine core's loop on GPU; so it never runs while a
step touches the audio pipeline).

The method names and the replies' shapes are part of the cross-process contract (`vllm_voxserve.contract`).
"""

from __future__ import annotations

import logging

from vllm_voxserve.worker.audio_pipeline import CodecModeBusy, CodecModeUnavailable

logger = logging.getLogger(__name__)


def speech_runtime(model_runner):
    """The runner's `SpeechRuntime`: on the V1 runners (CPU, GPU fallback) or in Model Runner V2's model state."""
    speech = getattr(model_runner, "speech", None)
    if speech is None:
        speech = getattr(getattr(model_runner, "model_state", None), "speech", None)
    return speech


def codec_mode_call(model_runner, mode: str | None) -> dict:
    """Report the codec modes; with `mode`, switch to it first (only while no request is open)."""
    runtime = speech_runtime(model_runner)
    if runtime is None:
        return {"status": 503, "error": "this worker has no speech runtime (model not loaded yet?)"}
    pipeline = runtime.pipeline
    if mode is not None:
        try:
            pipeline.set_codec_mode(mode)
        except CodecModeBusy as exc:
            return {"status": 409, "error": str(exc), **pipeline.codec_modes()}
        except ValueError as exc:
            return {"status": 400, "error": str(exc), **pipeline.codec_modes()}
        except CodecModeUnavailable as exc:  # refused, not failed: the previous mode still serves, unchanged
            return {"status": 503 if exc.out_of_memory else 500, "error": str(exc), **pipeline.codec_modes()}
        except Exception as exc:  # e.g. building the lanes failed: answer, and keep the worker serving
            logger.exception("switching the codec mode to %r failed", mode)
            return {"status": 500, "error": f"switching to {mode!r} failed: {exc}", **pipeline.codec_modes()}
    return {"status": 200, **pipeline.codec_modes()}


def cancel_audio_call(model_runner, stream_keys: list[str]) -> dict:
    """End the audio of these streams now (their listeners left): nothing more is decoded or sent for them."""
    runtime = speech_runtime(model_runner)
    if runtime is None:
        return {"status": 503, "error": "this worker has no speech runtime (model not loaded yet?)"}
    cancelled = runtime.pipeline.cancel(list(stream_keys))
    if cancelled:
        logger.info("voxserve: ended the audio of %d stream(s) whose listeners left", cancelled)
    return {"status": 200, "cancelled": cancelled}


def stats_call(model_runner) -> dict:
    """The engine's cumulative speech counters (`speech_stats.EngineSpeechStats`) for the API server's /metrics."""
    runtime = speech_runtime(model_runner)
    if runtime is None:
        return {"status": 503, "error": "this worker has no speech runtime (model not loaded yet?)"}
    runtime.speech_stats.backbone_frames = runtime.pipeline.frames_pushed
    return {"status": 200, "stats": runtime.speech_stats.snapshot()}


def text_call(model_runner, stream_key: str, start: int, ids: list[int], state: str) -> dict:
    """Text of a text stream (`contract.TEXT_RPC_METHOD`): token ids `ids` at index `start` of its target text."""
    runtime = speech_runtime(model_runner)
    if runtime is None:
        return {"status": 503, "error": "this worker has no speech runtime (model not loaded yet?)"}
    try:
        runtime.merge_text(stream_key, int(start), [int(i) for i in ids], state)
    except (TypeError, ValueError) as exc:
        return {"status": 400, "error": str(exc)}
    # what this worker still holds: its requests and their open audio streams (codec slots)
    return {"status": 200, "requests": len(runtime.model.requests), "audio_streams": len(runtime.pipeline.streams)}


class SpeechRpcTargets:
    """The `collective_rpc` targets of our workers (a mixin before vLLM's worker class; `self.model_runner` is the
    worker's runner)."""

    model_runner: object

    def voxserve_codec_mode(self, mode: str | None = None) -> dict:
        """contract.MODE_RPC_METHOD: report, and with `mode` switch, the codec mode."""
        return codec_mode_call(self.model_runner, mode)

    def voxserve_cancel_audio(self, stream_keys: list[str]) -> dict:
        """contract.CANCEL_RPC_METHOD: end these streams' audio, their listeners left."""
        return cancel_audio_call(self.model_runner, stream_keys)

    def voxserve_text(self, stream_key: str, start: int, ids: list[int], state: str) -> dict:
        """contract.TEXT_RPC_METHOD: text of a text stream, in order."""
        return text_call(self.model_runner, stream_key, start, ids, state)

    def voxserve_stats(self) -> dict:
        """contract.STATS_RPC_METHOD: the engine's speech counters for /metrics."""
        return stats_call(self.model_runner)
