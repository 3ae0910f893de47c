"""The speech side of a vLLM worker: request lifecycle, per-step layout, and frames -> audio.

Both runner adapters (V1 on CPU, Model Runner V2 on GPU) call exactly these methods, so CI on CPU runs the code
that serves on the GPU; only the few lines that read each runner's batch state differ.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import torch

from vllm_voxserve.config import VoxServeConfig
from vllm_voxserve.contract import (
    FRAME_DURATION_S,
    TEXT_CLOSED,
    TEXT_ENDED,
    CostSample,
    RequestProgress,
    StepReport,
)
from vllm_voxserve.fault_injection import FaultPlan
from vllm_voxserve.models.qwen3_tts.codec.checkpoint import load_codec_decoder
from vllm_voxserve.models.qwen3_tts.codec_program import Qwen3CodecProgram
from vllm_voxserve.models.qwen3_tts.job import SpeechJob
from vllm_voxserve.models.qwen3_tts.text_track import TextTrack
from vllm_voxserve.models.step_layout import StepLayout
from vllm_voxserve.scheduler.timeline import ChunkSchedule
from vllm_voxserve.speech_stats import EngineSpeechStats
from vllm_voxserve.step_host_times import StepHostTimes
from vllm_voxserve.transport import AudioSender
from vllm_voxserve.worker.audio_pipeline import AudioPipeline
from vllm_voxserve.gc_pauses import process_gc_pauses
from vllm_voxserve.worker.step_timing import DeviceStepTimer
from vllm_voxserve.thread_cpu import MachineCpu, ThreadCpu, thread_preemptions

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def held_device_bytes(device: torch.device) -> int:
    """Device memory torch's allocator holds, its unused cache released first (0 off CUDA). A CUDA graph's private
    pool stays held, as the graph replays into it."""
    if device.type != "cuda":
        return 0
    torch.cuda.empty_cache()
    return torch.cuda.memory_reserved(device)


class SpeechRuntime:
    def __init__(self, model, config: VoxServeConfig, device: torch.device):
        self.model, self.config, self.device = model, config, device
        held_before = held_device_bytes(device)
        dtype = _DTYPES[config.codec_dtype if config.codec_dtype != "auto" else
                        "bfloat16" if device.type == "cuda" else "float32"]
        decoder = load_codec_decoder(Path(model.model_path) / "speech_tokenizer", dtype, device)
        program = Qwen3CodecProgram(decoder, dtype, compile=config.codec_compile and device.type == "cuda")
        self.fault = FaultPlan.from_env()  # tests only: None unless the server's environment asks for a fault
        self.pipeline = AudioPipeline(program, config, AudioSender(), device, fault=self.fault)
        # Device memory built here (codec weights, state slots, the lanes' executables and CUDA graphs): vLLM's memory
        # profile counts the weights it loaded and what its profile run allocates, neither of which holds this, so
        # the worker takes it off the KV cache (`VoxServeGPUWorker.determine_available_memory`).
        self.device_bytes = held_device_bytes(device) - held_before
        # Requests this worker failed (or that carry no job) -> the error sent on their audio stream (None: no job).
        # They keep their rows until vLLM finishes them; the scheduler finishes them at once (`step_report`).
        self._failed: dict[str, str | None] = {}
        self._init_report()

    def _reference(self, job: SpeechJob) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The x-vector [H] and ICL reference codes [F, 16] the API server encoded (Base), on the device."""
        if job.ref_audio:
            raise ValueError("the reference clip reached the worker unencoded")
        if not job.x_vector:
            return None, None
        x_vector = torch.from_numpy(np.frombuffer(job.x_vector, dtype=np.float32).copy()).to(self.device)
        ref_codes = None
        if job.ref_codes:
            codes = np.frombuffer(job.ref_codes, dtype=np.int32)
            if codes.size % 16:
                raise ValueError(f"reference codes hold {codes.size} values, not whole frames of 16")
            ref_codes = torch.from_numpy(codes.reshape(-1, 16).astype(np.int64)).to(self.device)
        return x_vector, ref_codes

    def start(self, req_id: str, prompt_len: int, extra_args: dict | None) -> None:
        if req_id in self._suspended:  # back after a preemption: same stream, same state, recomputed by vLLM
            self._suspended.discard(req_id)
            self.model.resume_request(req_id)
            return
        try:
            job = SpeechJob.from_extra_args(extra_args)
        except (TypeError, ValueError) as exc:
            # Without a job there is no audio address to report to; the API server only sends well-formed jobs.
            # vLLM's own start-up warm-up requests carry none either: they just run on zeros.
            log = logger.debug if req_id.startswith("_warmup") else logger.error
            log("request %s has no valid voxserve job: %s", req_id, exc)
            self.model.add_placeholder_request(req_id, prompt_len)
            self._failed[req_id] = None
            return
        try:
            if self.fault is not None:
                self.fault.check("start", job.seed)
            x_vector, ref_codes = self._reference(job)
            # ICL continues the reference: its frames go through the codec first, unheard, as the official
            # decode of cat(reference, generated) minus the reference part does.
            self.pipeline.open(req_id, job.stream_key, job.audio_address, warmup_codes=ref_codes, seed=job.seed)
            if job.text_stream:
                self.model.add_request(req_id, prompt_len, job, x_vector, ref_codes, self._text_track(req_id, job))
            else:
                self.model.add_request(req_id, prompt_len, job, x_vector, ref_codes)
        except Exception as exc:  # noqa: BLE001 - any failure here ends this request alone
            if not isinstance(exc, ValueError | RuntimeError):
                logger.exception("request %s failed to start", req_id)
            self._fail_start(req_id, prompt_len, job, _describe(exc))

    def _text_track(self, req_id: str, job: SpeechJob) -> TextTrack:
        """The track a text stream's text arrives on (its tokens may have come before the request)."""
        self._text_keys[req_id] = job.stream_key
        return self.texts.setdefault(job.stream_key, TextTrack(self.model.tables.tts_eos, self.model.tables.tts_pad))

    def merge_text(self, stream_key: str, start: int, ids: list[int], state: str) -> None:
        """Text of a text stream (`contract.TEXT_RPC_METHOD`), before or while its request runs."""
        if state == TEXT_CLOSED:
            self.texts.pop(stream_key, None)  # its request, if still here, is being finished by the scheduler
            return
        track = self.texts.get(stream_key)
        if track is None:
            track = self.texts[stream_key] = TextTrack(self.model.tables.tts_eos, self.model.tables.tts_pad)
        track.merge(start, list(ids), state == TEXT_ENDED)

    def _fail_start(self, req_id: str, prompt_len: int, job: SpeechJob, message: str) -> None:
        """End a request that could not start: its rows run on zeros (harmless to the batch) until it is finished."""
        if req_id not in self.model.requests:
            self.model.add_placeholder_request(req_id, prompt_len)
        if req_id in self.pipeline.streams:
            self._fail(req_id, message)
            return
        self._failed[req_id] = message
        try:
            self.pipeline.sender.send_error(job.audio_address, job.stream_key, 0, message)
        except Exception:  # noqa: BLE001 - the scheduler still finishes it with the error (step_report)
            logger.exception("could not send the error of request %s", req_id)

    def prepare_step(self, layout: StepLayout) -> None:
        started = time.perf_counter()
        self._layout, self._step_started, self._codec_s, self._codec_chunks = layout, time.monotonic(), 0.0, 0
        try:
            # the fault hook costs the hot path nothing when it is off
            self.model.prepare_step(layout, self._row_check if self.fault is not None else None)
        except Exception as exc:  # past the per-request parts (StepBuffers.fill): end this step's requests, not all
            logger.exception("step set-up failed")
            for req_id in layout.req_ids:
                req = self.model.requests.get(req_id)
                if req is not None and req.failed is None:
                    req.failed = f"step set-up failed: {_describe(exc)}"
            self.model.prepare_step(layout)  # now every row is a failed request's: it keeps nothing
        if self.device_steps is not None and layout.req_ids:
            self.device_steps.start(_step_kind(layout))
        self.host_times.add("prepare", time.perf_counter() - started)
        buffers = getattr(self.model, "buffers", None)
        if buffers is not None:  # where prepare's time goes (not summed into the total: parts of prepare)
            self.host_times.add_gauge("prepare staging wait us", round(buffers.last_wait_s * 1e6))
            self.host_times.add_gauge("prepare copies us", round(buffers.last_copies_s * 1e6))

    def after_forward(self) -> None:
        started = time.perf_counter()
        self._after_forward()
        self.host_times.add("after_forward", time.perf_counter() - started)
        # levels that bound admission and show a codec backlog (p50/p99/max in the periodic line)
        self.host_times.add_gauge("open audio streams", len(self.pipeline.streams))
        draw_s = getattr(self.model, "last_draw_s", None)  # the model's codebook-0 draw, eager on this thread
        if draw_s is not None:
            self.host_times.add_gauge("codebook0 draw us", round(draw_s * 1e6))
            self.host_times.add_count("codebook0 draw host us", round(draw_s * 1e6))
            self.model.last_draw_s = None
        for frames_s, codec_s, steps in self.pipeline.first_audio_paths:  # requests that heard their first audio
            self.host_times.add_gauge("first chunk ms after prefill", round(frames_s * 1e3, 1))
            self.host_times.add_gauge("first chunk steps after prefill", steps)
            self.host_times.add_gauge("first audio ms after cut", round(codec_s * 1e3, 1))
            self._handovers.append(codec_s)  # and for the scheduler, which predicts first audio with it
        self.pipeline.first_audio_paths.clear()
        lanes = self.pipeline.lanes
        if lanes is not None:
            self.host_times.add_gauge("chunks waiting for a lane", lanes.queued_chunks)
            # every pump since the last step (most run in after_forward), whole and by part
            pump_us = round(sum(lanes.pump_seconds.values()) * 1e6)
            self.host_times.add_gauge("lanes pump us", pump_us)
            # and as a rate over the window (its mean share of the thread): a per-step median says how the work is
            # spread over steps (a background batch every step, or one in three), not how much there is
            self.host_times.add_count("lanes pump host us", pump_us)
            for part, seconds in lanes.pump_seconds.items():
                self.host_times.add_gauge(f"lanes {part} us", round(seconds * 1e6))
                lanes.pump_seconds[part] = 0.0
            for cost in lanes.harvested:
                self.host_times.add_batch(f"{cost.lane.value} lane", cost.size, cost.seconds, cost.rows)
            lanes.harvested.clear()
        if self.host_times.end_step() is not None:  # a window's line: which threads took the CPU meanwhile, and
            threads = self.thread_cpu.report()  # how long Python's collections stopped them all
            if threads is not None:
                machine = self.machine_cpu.report()  # and how busy (or shared) the whole machine was
                logger.info("voxserve threads, share of a CPU: %s%s", threads,
                            f"; machine: {machine}" if machine is not None else "")
            logger.info("voxserve gc collections: %s", self.gc_pauses.report())

    def _after_forward(self) -> None:
        if self.device_steps is not None:
            self.device_steps.stop()  # before the inline codec's work is queued
        codes, rows = self.model.take_frames()
        live = [i for i, r in enumerate(rows) if r.req_id not in self._failed]
        if len(live) != len(rows):
            codes = codes[live]
            rows = [rows[i] for i in live]
        self.host_times.add_count("backbone frames", len(rows))  # the LM's frame rate, beside the codec's load
        if rows or self.pipeline.codec_mode != "inline":  # the lanes are pumped every step, frames or not
            sent_before = self.pipeline.chunks_sent
            started = time.monotonic()
            try:
                self.pipeline.push(codes, [r.req_id for r in rows])
            except Exception as exc:  # one bad chunk must not take down the engine and every other stream
                logger.exception("codec step failed")
                for req_id in {r.req_id for r in rows}:
                    self._fail(req_id, f"codec failed: {type(exc).__name__}: {exc}")
            self._codec_chunks += self.pipeline.chunks_sent - sent_before
            self._codec_s += time.monotonic() - started
        for req in self.model.requests.values():
            if req.failed and req.req_id not in self._failed:
                self._fail(req.req_id, req.failed)
        for req_id, message in self.pipeline.take_failures():  # e.g. its audio could not be handed over
            if req_id not in self._failed and req_id in self.model.requests:
                self._failed[req_id] = message

    def _row_check(self, req, frames: int) -> None:
        self.fault.check("step", req.seed, frames)

    def _init_report(self) -> None:
        # For the scheduler's step report: this step's layout and timings, and the chunk sizes (audio sent so far).
        self._chunk_schedule = ChunkSchedule(self.config.first_chunk_frames, self.config.chunk_frames)
        self._layout: StepLayout | None = None
        self._step_started = 0.0
        self._codec_s = 0.0
        self._codec_chunks = 0
        self._handovers: list[float] = []  # first chunks' cut to audio since the last report
        self.host_times = StepHostTimes()  # our share of the host gap between backbone steps, logged periodically
        # with each of its lines: the process's busy threads (GIL contenders), how often each lost its CPU
        self.thread_cpu = ThreadCpu(preemptions=thread_preemptions)
        self.machine_cpu = MachineCpu()
        self.gc_pauses = process_gc_pauses()  # and the garbage collector's pauses
        self.speech_stats = EngineSpeechStats()  # what /metrics shows of the engine (rpc.stats_call reads it)
        self._suspended: set[str] = set()  # preempted requests Model Runner V2 removed and will re-add
        self.texts: dict[str, TextTrack] = {}  # text streams' text by stream key, from before their start to finish
        self._text_keys: dict[str, str] = {}  # request id -> its stream key, for text streams
        # GPU: the scheduler's cost model learns each step's device time (host timings of async steps mislead)
        self.device_steps = (DeviceStepTimer(lambda: torch.cuda.Event(enable_timing=True))
                             if getattr(self, "device", None) is not None and self.device.type == "cuda" else None)

    def step_report(self, costs: bool = True) -> StepReport:
        """For the scheduler after a step: each open stream's progress (cumulative), and what steps cost. On GPU the
        costs are device times of finished steps (CUDA events, `DeviceStepTimer`); on CPU, with `costs`, host timings
        of this step (true there: the step is synchronous)."""
        now = time.monotonic()
        schedule = self._chunk_schedule
        progress = []
        for req_id, stream in self.pipeline.streams.items():
            in_flight = stream.chunks_cut > stream.chunks_sent  # lanes mode: cut, not yet decoded and sent
            progress.append(RequestProgress(req_id, stream.frames, False, stream.chunks_sent,
                                            schedule.start_frame(stream.chunks_sent) * FRAME_DURATION_S,
                                            stream.first_audio_at, in_flight))
        samples = []
        layout, self._layout = self._layout, None
        if self.device_steps is not None:
            for (kind, size, decode_rows), seconds in self.device_steps.harvest():
                samples.append(CostSample(kind, size, seconds, decode_rows))
                self.host_times.add_device_step(kind, size, seconds)
            for gap in self.device_steps.gaps:
                self.host_times.add_device_gap(gap)
            self.device_steps.gaps.clear()
        elif costs and layout is not None and layout.req_ids:
            kind, size, decode_rows = _step_kind(layout)
            samples.append(CostSample(kind, size, max(now - self._step_started - self._codec_s, 0.0), decode_rows))
            # Inline codec calls are timed here; the lanes mode's run asynchronously and are timed by the lanes.
            if self._codec_chunks and self.pipeline.codec_mode == "inline":
                samples.append(CostSample("urgent_codec", self._codec_chunks, self._codec_s))
        lanes = self.pipeline.lanes
        if lanes is not None:  # the codec lanes' batches, timed by the lanes in either case
            samples.extend(lanes.take_cost_samples())
        self.speech_stats.observe(samples)
        # cumulative like the progress: every failed request vLLM has not finished yet, so the scheduler ends it
        failed = {r: m for r, m in self._failed.items() if m is not None and r in self.model.requests}
        handovers, self._handovers = self._handovers, []
        return StepReport(now, progress, costs=samples, failed=failed, first_audio_handovers=handovers)

    def finish(self, req_id: str) -> None:
        if req_id in self._suspended:  # preempted, not finished: it will be re-added (see `preempt`)
            return
        self.model.remove_request(req_id)
        self.texts.pop(self._text_keys.pop(req_id, None), None)
        if req_id in self._failed:
            del self._failed[req_id]
            self.pipeline.close(req_id, "request ended")  # a stream still open (e.g. failed after it opened)
            return
        self.pipeline.close(req_id)

    def preempt(self, preempted, finished) -> None:
        """Model Runner V2 removes a preempted request like a finished one and re-adds it later with its generated
        tokens: keep its stream and state through the removal that follows (`finish`) until it returns (`start`).
        One finished by vLLM meanwhile (e.g. aborted) never comes back: end it here."""
        for req_id in preempted or ():
            if req_id in self.pipeline.streams and req_id not in self._failed:
                self._suspended.add(req_id)
        for req_id in finished or ():
            if req_id in self._suspended:
                self._suspended.discard(req_id)
                self.finish(req_id)

    def _fail(self, req_id: str, message: str) -> None:
        self._failed[req_id] = message
        self.pipeline.fail(req_id, message)


def _describe(exc: Exception) -> str:
    return str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"


def _step_kind(layout: StepLayout) -> tuple[str, int, int]:
    """The cost-model kind and size of a step, and its rows that decode beside a prefill: a prefill (its prompt
    tokens) if it has one, else a decode batch."""
    prefill_tokens = sum(n for n in layout.num_tokens if n > 1)
    if not prefill_tokens:
        return "decode", len(layout.req_ids), 0
    return "prefill", prefill_tokens, sum(1 for n in layout.num_tokens if n == 1)
