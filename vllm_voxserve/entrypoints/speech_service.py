"""Turns a validated speech request into a vLLM `generate()` call and the request's audio stream.

`generate()` carries the request's lifecycle (admission, finish, abort on client disconnect); the audio arrives on
the worker -> API-server audio channel (`vllm_voxserve.transport`) under the request's stream key.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np

from vllm_voxserve.compat import data_parallel_ranks, steers_every_engine
from vllm_voxserve.config import VoxServeConfig
from vllm_voxserve.contract import (
    CANCEL_RPC_METHOD,
    SAMPLES_PER_FRAME,
    EngineRejection,
    decode_failure,
    decode_rejection,
    plan_hints,
)
from vllm_voxserve.models.qwen3_tts.configuration import Qwen3TTSConfig
from vllm_voxserve.models.qwen3_tts.job import (
    MAX_CODE_PREDICTOR_TOP_K,
    CodePredictorSampling,
    SpeechJob,
    TalkerSampling,
)
from vllm_voxserve.models.qwen3_tts.prompt import PromptTables, SpeechPrompt, build_plan
from vllm_voxserve.models.qwen3_tts.tokenizer import (
    encode_instruct,
    encode_ref_text,
    load_text_tokenizer,
    target_text_ids,
)
from vllm_voxserve.transport import AUDIO, END, ERROR, AudioReceiver, new_stream_key

from .rank_choice import RankChoice
from .reference_encoding import ReferenceEncoder
from .speech_metrics import SpeechMetrics
from .speech_outcomes import InvalidSpeechRequest, Overloaded, SpeechUsage, SynthesisError
from .speech_request import SpeechRequest, decode_reference_audio
from .voice_store import VoiceStore

logger = logging.getLogger(__name__)

# After vLLM reports the request finished, its last audio must follow within this time.
AUDIO_END_TIMEOUT_S = 60.0
# The audio's END follows the engine's final output (the worker ends a stream at the step after the request
# finished), but the two travel on different sockets: at END the usage waits this long at most for that output.
FINAL_OUTPUT_WAIT_S = 5.0
# The scheduling hint (`contract.PLAN_KEY`) estimates the audio frames a text will take from its words.
FRAMES_PER_WORD = 5.2  # ≈ 80 ms frames per English word in LibriTTS-like speech
REJECTED = "rejected"  # queue item kinds beside transport.AUDIO / END / ERROR
INVALID = "invalid"


class SpeechService:
    def __init__(self, engine_client, model_path: str, served_models: list[str], config: VoxServeConfig):
        self.engine_client = engine_client
        model_config = getattr(getattr(engine_client, "vllm_config", None), "model_config", None)
        self.max_model_len: int | None = getattr(model_config, "max_model_len", None)
        self.served_models = served_models
        self.config = config
        self.tokenizer = load_text_tokenizer(model_path)
        self.model_config = Qwen3TTSConfig.from_pretrained(model_path)
        self.tables = PromptTables.from_config(self.model_config)
        gen_path = Path(model_path) / "generation_config.json"
        self.generation_defaults = json.loads(gen_path.read_text()) if gen_path.exists() else {}
        self.receiver = AudioReceiver()
        # the data-parallel ranks this server steers requests to (1: vLLM routes, or there is one engine)
        self.ranks = RankChoice(data_parallel_ranks(engine_client), refuse_at_limit=steers_every_engine(engine_client))
        self.cancels = AudioCancels(engine_client)
        # Base: reference clips are encoded here, off the engine's step loop (reference_encoding.py)
        self.references = ReferenceEncoder(model_path) if self.tables.model_type == "base" else None
        # Base: voices uploaded once, encoded (voice_store.py); None when voxserve.voices_dir is unset
        self.voice_store = (VoiceStore(config.voices_dir, config.max_voices)
                            if self.references is not None and config.voices_dir else None)

    def start(self) -> None:
        self.receiver.start()

    def refusal_at_arrival(self, now: float) -> tuple[str, float] | None:
        """(reason, retry_after_s) while every rank's in-progress limit refused a request at as many streams open
        here as now (`RankChoice.at_limit`): an arrival is refused before it is read, else None."""
        full = self.ranks.at_limit(now)
        if full is None:
            return None
        open_here, retry_after_s = full
        return (f"server at capacity: {open_here} requests in progress at this API server, as many as when the "
                f"engine last refused one for its requests in progress", retry_after_s)

    def voices(self) -> list[str]:
        """The names `voice` takes: the checkpoint's speakers (CustomVoice) or the uploaded voices (Base)."""
        uploaded = [v.name for v in self.voice_store.list()] if self.voice_store is not None else []
        return sorted(self.tables.speakers) + uploaded

    def prepare(self, request: SpeechRequest):
        """Validate and build (job, prompt ids, sampling params); raises ValueError for the client."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        config = self.config
        request.check(self.served_models, self.tables.model_type, config.max_input_chars, config.max_instructions_chars)
        kind = self.tables.model_type
        instruct = request.instructions or ""
        if kind == "voice_design" and not instruct.strip():
            raise ValueError("VoiceDesign needs `instructions` describing the voice")
        ref_audio = b""
        if request.ref_audio:
            ref_audio = decode_reference_audio(request.ref_audio, max_bytes=config.max_ref_audio_bytes,
                                               max_seconds=config.max_ref_audio_seconds).tobytes()
        ref_text_ids: tuple[int, ...] = ()
        stored = None
        if kind == "base" and request.voice is not None and not request.ref_audio:
            # without a clip, `voice` names an uploaded voice (with one, the clip is the voice, as before)
            stored = self.voice_store.get(request.voice) if self.voice_store is not None else None
            if stored is None:
                raise ValueError(f"voice {request.voice!r} is not an uploaded voice; uploaded: {self.voices()}, "
                                 "or send ref_audio")
            if request.ref_text:
                raise ValueError("ref_text is for ref_audio; voice names an uploaded voice, which has its own")
            if not stored.x_vector_only:
                ref_text_ids = tuple(encode_ref_text(self.tokenizer, stored.ref_text)[3:-2])
        elif kind == "base":
            if not ref_audio:
                raise ValueError("Base (voice cloning) needs `ref_audio`: base64 or a data URL of an audio clip")
            if not request.x_vector_only_mode:
                if not (request.ref_text or "").strip():
                    raise ValueError("voice cloning needs `ref_text` (the transcript of ref_audio), "
                                     "or x_vector_only_mode=true")
                ref_text_ids = tuple(encode_ref_text(self.tokenizer, request.ref_text)[3:-2])
        elif request.ref_audio or request.ref_text:
            raise ValueError(f"ref_audio/ref_text are only for Base checkpoints; this one is {kind}")
        speaker = request.voice if kind == "custom_voice" else None
        if kind == "custom_voice" and not speaker:
            raise ValueError(f"voice is required; choose one of {self.voices()}")
        prompt = SpeechPrompt(
            text_ids=tuple(target_text_ids(self.tokenizer, request.input)),
            language=request.language.lower(),
            speaker=speaker.lower() if speaker else None,
            instruct_ids=tuple(encode_instruct(self.tokenizer, instruct)) if instruct.strip() else (),
            x_vector_only=(stored.x_vector_only if stored is not None else request.x_vector_only_mode)
            if kind == "base" else False,
            ref_text_ids=ref_text_ids,
            num_ref_frames=(stored.num_ref_frames if stored is not None
                            else math.ceil(len(ref_audio) / 4 / SAMPLES_PER_FRAME)) if ref_text_ids else 0,
            non_streaming=request.non_streaming_mode,
        )
        gen = self.generation_defaults
        cp_sampling = CodePredictorSampling(
            temperature=_pick(request.subtalker_temperature, gen.get("subtalker_temperature"), 0.9),
            top_k=_pick(request.subtalker_top_k, gen.get("subtalker_top_k"), 50),
            top_p=_pick(request.subtalker_top_p, gen.get("subtalker_top_p"), 1.0),
        )
        if cp_sampling.temperature > 0 and not 1 <= cp_sampling.top_k <= MAX_CODE_PREDICTOR_TOP_K:
            raise ValueError(f"subtalker_top_k must be between 1 and {MAX_CODE_PREDICTOR_TOP_K} when the code "
                             f"predictor samples (subtalker_temperature > 0), got {cp_sampling.top_k}")
        talker_sampling = TalkerSampling(
            temperature=_pick(request.temperature, gen.get("temperature") if gen.get("do_sample", True) else 0.0,
                              0.9),
            top_k=_pick(request.top_k, gen.get("top_k"), 50),
            top_p=_pick(request.top_p, gen.get("top_p"), 1.0),
            repetition_penalty=_pick(request.repetition_penalty, gen.get("repetition_penalty"), 1.05),
        )
        job = SpeechJob(
            stream_key=new_stream_key(),
            audio_address=self.receiver.address,
            prompt=prompt,
            ref_audio=ref_audio,
            **({"x_vector": stored.x_vector, "ref_codes": stored.ref_codes} if stored is not None else {}),
            fixed_length=request.ignore_eos,
            seed=request.seed,
            code_predictor=cp_sampling,
            talker=talker_sampling,
            ttfa_slo_ms=request.ttfa_slo_ms,
        )
        plan = build_plan(self.tables, prompt)  # raises ValueError naming the valid speakers, languages ...
        max_tokens = request.max_new_tokens
        room = None if self.max_model_len is None else self.max_model_len - len(plan)
        if room is not None and room < 2:
            raise ValueError(f"input is too long: its prompt takes {len(plan)} of the server's max_model_len "
                             f"({self.max_model_len}) positions, leaving no room for audio")
        if room is not None and max_tokens > room:
            if request.ignore_eos:  # a fixed length is honoured exactly or refused, never cut short silently
                raise ValueError(f"max_new_tokens {max_tokens} does not fit: with this input the server's "
                                 f"max_model_len ({self.max_model_len}) leaves room for {max(room, 0)}")
            max_tokens = room  # an open-ended request simply may not run past the context
        params = SamplingParams(
            max_tokens=max_tokens,
            min_tokens=2,
            stop_token_ids=[self.tables.codec_eos],
            ignore_eos=request.ignore_eos,
            # Codebook 0 is drawn in the model (`Qwen3TTSForVllm.compute_logits`) with the request's counter noise
            # and handed to vLLM as the only finite logit, which its sampler keeps whatever it is set to: greedy
            # here spares it the random path and per-request generators.
            temperature=0.0,
            detokenize=False,
            # One output, when the request finishes (its usage, a rejection or a failure): no output object per
            # step for every running request, nor a wake-up of its task, in this process.
            output_kind=RequestOutputKind.FINAL_ONLY,
            extra_args={**job.to_extra_args(), **plan_hints(expected_frames(request))},
        )
        # vLLM sees placeholder ids (codec_pad) of the plan's length; the worker embeds the real prompt.
        prompt_ids = [self.tables.codec_pad] * len(plan)
        return job, prompt_ids, params

    def open_text_stream(self, request: SpeechRequest):
        """A `text_stream.TextStream`: one utterance whose text arrives in pieces, validated like `prepare`."""
        from .text_stream import open_text_stream

        return open_text_stream(self, request)

    async def synthesize(self, job: SpeechJob, prompt_ids: list[int], params,
                         usage: SpeechUsage | None = None) -> AsyncIterator[np.ndarray]:
        """Yields float32 mono 24 kHz chunks in order; leaving early (client gone) aborts the request. `usage`, when
        given, holds the request's tokens once the stream has ended."""
        usage = usage if usage is not None else SpeechUsage()
        usage.input_tokens = len(prompt_ids)
        if job.ref_audio:  # the engine gets the request once its reference is encoded: it never waits for it
            job = await self._encode_reference(job)
            params.extra_args = {**params.extra_args, **job.to_extra_args()}
        queue = self.receiver.open(job.stream_key)
        request_id = f"speech-{job.stream_key}"
        final = asyncio.Event()  # set when the engine's final output is in (and with it the usage)
        engine = asyncio.get_running_loop().create_task(self._run_engine(prompt_ids, params, request_id, queue,
                                                                         usage, final))
        kind = None
        try:
            while True:
                kind, payload = await queue.get()
                if kind == AUDIO:
                    yield payload
                elif kind == END:
                    if not final.is_set():
                        with contextlib.suppress(asyncio.TimeoutError):
                            await asyncio.wait_for(final.wait(), FINAL_OUTPUT_WAIT_S)
                    return
                elif kind == REJECTED:
                    raise Overloaded(*payload)
                elif kind == INVALID:
                    raise InvalidSpeechRequest(payload)
                else:
                    raise SynthesisError(payload)
        finally:
            self.receiver.close(job.stream_key)
            if kind in (AUDIO, None):  # left before the worker ended the stream: its audio is nobody's now
                self.cancels.add(job.stream_key)
            if not engine.done():
                engine.cancel()  # cancelling generate() aborts the request in the engine
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await engine

    async def _encode_reference(self, job: SpeechJob) -> SpeechJob:
        if self.references is None:
            raise InvalidSpeechRequest(f"ref_audio is only for Base checkpoints; this one is {self.tables.model_type}")
        try:
            return await self.references.encode(job)
        except ValueError as exc:
            raise InvalidSpeechRequest(f"ref_audio: {exc}") from exc
        except Exception as exc:
            logger.exception("encoding a reference clip failed")
            raise SynthesisError(f"reference encoding failed: {type(exc).__name__}: {exc}") from exc

    async def _run_engine(self, prompt_ids: list[int], params, request_id: str, queue: asyncio.Queue,
                          usage: SpeechUsage, final: asyncio.Event) -> None:
        """The request on the rank `self.ranks` picks; a rank's refusal sends it to the next untried rank, and only
        the last rank's refusal reaches the client (`REJECTED`, with the soonest Retry-After of all)."""
        tried: set[int] = set()
        soonest_retry_s = math.inf
        rank = self.ranks.pick(time.monotonic())
        while True:
            self.ranks.opened(rank)
            refused = False
            try:
                rejection = await self._generate(prompt_ids, params, request_id if not tried else
                                                 f"{request_id}-rank{rank}", rank, queue, usage, final)
                if rejection is None:
                    return
                refused = True
                self.ranks.refused(rank, time.monotonic(), rejection.retry_after_s, rejection.by_limit)
            finally:
                if not refused:
                    self.ranks.closed(rank)
            tried.add(rank)
            soonest_retry_s = min(soonest_retry_s, rejection.retry_after_s)
            rank = self.ranks.pick(time.monotonic(), tried)
            if rank is None:
                queue.put_nowait((REJECTED, (rejection.reason, soonest_retry_s)))
                return
            SpeechMetrics.get(self.served_models[0]).retried_on_another_rank()
            params = params.clone()  # one SamplingParams per engine request

    async def _generate(self, prompt_ids: list[int], params, request_id: str, rank: int, queue: asyncio.Queue,
                        usage: SpeechUsage, final: asyncio.Event) -> EngineRejection | None:
        """One engine request on `rank`: its scheduler's rejection, or None when it ran (its
        end, failure or error is in `queue`); returns only once its audio has had time to end."""
        steer = {"data_parallel_rank": rank} if self.ranks.num_ranks > 1 else {}
        try:
            async for output in self.engine_client.generate({"prompt_token_ids": prompt_ids}, params, request_id,
                                                            **steer):
                rejection = _rejection(output)
                if rejection is not None:  # finished by the scheduler before it started: no audio will come
                    return rejection
                if output.finished:  # FINAL_ONLY: the one output, with every token generated
                    if output.outputs:
                        usage.output_tokens = len(output.outputs[0].token_ids)
                    final.set()
                failure = _failure(output)
                if failure is not None:  # the worker failed it (its audio stream usually says so first)
                    queue.put_nowait((ERROR, failure))
                    return None
        except asyncio.CancelledError:
            raise
        except ValueError as exc:  # vLLM's input checks (e.g. prompt + max_new_tokens past --max-model-len)
            queue.put_nowait((INVALID, str(exc)))
            return None
        except Exception as exc:  # the engine's own errors reach the client as a failed synthesis
            queue.put_nowait((ERROR, f"engine error: {type(exc).__name__}: {exc}"))
            return None
        finished = time.monotonic()
        await asyncio.sleep(AUDIO_END_TIMEOUT_S)
        queue.put_nowait((ERROR, f"audio did not finish {time.monotonic() - finished:.0f} s after the request did"))
        return None


class AudioCancels:
    """Streams whose listeners left, sent to the workers (`collective_rpc`), which then stop decoding their audio.
    vLLM's abort alone stops only a request still generating; one that finished generating can have seconds of audio
    left to decode. Keys gather while one call is in flight: a burst of departures costs a few calls."""

    def __init__(self, engine_client) -> None:
        self.engine_client = engine_client
        self._pending: set[str] = set()
        self._sender: asyncio.Task | None = None

    def add(self, stream_key: str) -> None:
        self._pending.add(stream_key)
        if self._sender is None or self._sender.done():
            self._sender = asyncio.get_running_loop().create_task(self._send())

    async def _send(self) -> None:
        while self._pending:
            keys, self._pending = sorted(self._pending), set()
            try:
                await self.engine_client.collective_rpc(CANCEL_RPC_METHOD, args=(keys,))
            except Exception:  # the engine is gone or a worker raised: the audio stops with it, or at END
                logger.exception("cancelling the audio of %d stream(s) failed", len(keys))


def expected_frames(request: SpeechRequest) -> int:
    """Frames the request will probably take (exact with ignore_eos): the scheduler's demand estimate."""
    limit = request.max_new_tokens - 1  # N tokens give N-1 frames
    if request.ignore_eos:
        return limit
    words = max(len(request.input.split()), len(request.input) // 4)  # texts without spaces: ≈ 4 chars a word
    return max(1, min(limit, round(words * FRAMES_PER_WORD)))


def _rejection(output) -> EngineRejection | None:
    """What the engine's scheduler said when it rejected the request, else None."""
    if not getattr(output, "finished", False) or not output.outputs:
        return None
    return decode_rejection(output.outputs[0].stop_reason)


def _failure(output) -> str | None:
    """The worker's error when the engine ended the request as failed (`contract.encode_failure`)."""
    if not getattr(output, "finished", False) or not output.outputs:
        return None
    completion = output.outputs[0]
    if completion.finish_reason != "error":
        return None
    error = decode_failure(completion.stop_reason)
    return error if error is not None else "the engine failed this request"


def _pick(value, default, fallback):
    if value is not None:
        return value
    return default if default is not None else fallback
