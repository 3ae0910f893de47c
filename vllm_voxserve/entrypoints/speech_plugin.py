"""vLLM endpoint plugin: `POST /v1/audio/speech` (OpenAI-compatible, streaming) and `GET /v1/audio/voices`.

Loaded by vLLM in the API-server process when `VLLM_PLUGINS` names `voxserve` (or the command line has
`--plugin voxserve`). Routes attach while vLLM builds its app, so they appear in its OpenAPI schema.
"""

from __future__ import annotations

import json
import logging
import math
from argparse import Namespace

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from vllm_voxserve.config import VoxServeConfig
from vllm_voxserve.models.qwen3_tts.model_files import resolve_model_dir

from . import audio_format
from .speech_request import SpeechRequest
from .speech_service import InvalidSpeechRequest, Overloaded, SpeechService, SynthesisError

logger = logging.getLogger(__name__)
router = APIRouter()

MEDIA_TYPES = {"wav": "audio/wav", "pcm": "audio/pcm"}
SAMPLE_RATE = 24000


def _error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {"message": message, "type": kind, "code": status}})


def _overloaded(exc: Overloaded) -> JSONResponse:
    response = _error(503, str(exc), "service_unavailable")
    response.headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after_s)))
    return response


def _service(request: Request) -> SpeechService | None:
    return getattr(request.app.state, "voxserve_speech", None)


_REQUEST_BODY = {"required": True, "content": {"application/json": {"schema": SpeechRequest.model_json_schema()}}}


@router.post("/v1/audio/speech", openapi_extra={"requestBody": _REQUEST_BODY},
             responses={200: {"content": {"audio/wav": {}, "audio/pcm": {}}}})
async def create_speech(raw: Request):
    """Synthesize speech; `stream: true` sends audio as each chunk is decoded."""
    service = _service(raw)
    if service is None:
        return _error(503, "speech synthesis is not available on this server", "service_unavailable")
    try:
        body = json.loads(await raw.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return _error(400, f"request body is not valid JSON: {exc}")
    if not isinstance(body, dict):
        return _error(400, "request body must be a JSON object")
    try:
        request = SpeechRequest.model_validate(body)
        job, prompt_ids, params = service.prepare(request)
    except ValidationError as exc:
        return _error(400, "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()))
    except ValueError as exc:
        return _error(400, str(exc))
    chunks = service.synthesize(job, prompt_ids, params)
    fmt = request.response_format
    pieces = []
    try:
        # The first chunk (or the scheduler's rejection) comes before any header: an overloaded server answers 503.
        async for chunk in chunks:
            pieces.append(chunk)
            if request.streaming:
                break
    except Overloaded as exc:
        return _overloaded(exc)
    except InvalidSpeechRequest as exc:
        return _error(400, str(exc))
    except SynthesisError as exc:
        return _error(500, str(exc), "server_error")
    if request.streaming:
        return StreamingResponse(_stream_bytes(pieces, chunks, fmt), media_type=MEDIA_TYPES[fmt])
    audio = audio_format.concat(pieces)
    data = audio_format.wav_bytes(audio, SAMPLE_RATE) if fmt == "wav" else audio_format.pcm16_bytes(audio)
    return Response(content=data, media_type=MEDIA_TYPES[fmt])


async def _stream_bytes(first: list, chunks, fmt: str):
    if fmt == "wav":
        yield audio_format.streaming_wav_header(SAMPLE_RATE)
    for chunk in first:
        yield audio_format.pcm16_bytes(chunk)
    try:
        async for chunk in chunks:
            yield audio_format.pcm16_bytes(chunk)
    except SynthesisError as exc:
        # Headers are gone: end the stream early; the client sees a short body.
        logger.error("speech stream failed: %s", exc)
    finally:
        await chunks.aclose()  # a client gone mid-stream aborts the request now


@router.get("/v1/audio/voices")
async def list_voices(raw: Request):
    service = _service(raw)
    if service is None:
        return _error(503, "speech synthesis is not available on this server", "service_unavailable")
    return {"voices": service.voices(), "task_type": service.tables.model_type,
            "languages": service.tables.supported_languages}


_MODE_RPC = "voxserve_codec_mode"  # worker method, see vllm_voxserve/worker/rpc.py


async def _codec_mode_rpc(raw: Request, mode: str | None):
    """Ask every worker (one per GPU of the engine) through vLLM's collective_rpc; all must agree."""
    service = _service(raw)
    if service is None:
        return _error(503, "speech synthesis is not available on this server", "service_unavailable")
    try:
        replies = await service.engine_client.collective_rpc(_MODE_RPC, args=(mode,))
    except Exception as exc:  # the engine died or a worker raised: report it, keep the API server up
        logger.exception("codec mode rpc failed")
        return _error(500, f"codec mode rpc failed: {exc}", "server_error")
    worst = max(replies, key=lambda r: r.get("status", 500))
    if worst.get("status") != 200:
        kind = {400: "invalid_request_error", 409: "conflict"}.get(worst.get("status"), "server_error")
        return _error(worst.get("status", 500), worst.get("error", "codec mode rpc failed"), kind)
    currents = {r["current"] for r in replies}
    if len(currents) != 1:
        return _error(500, f"workers disagree on the codec mode: {sorted(currents)}", "server_error")
    return {"modes": replies[0]["modes"], "current": replies[0]["current"]}


@router.get("/voxserve/modes")
async def list_codec_modes(raw: Request):
    """The codec modes this server can switch between, and the current one."""
    return await _codec_mode_rpc(raw, None)


@router.post("/voxserve/mode")
async def set_codec_mode(raw: Request):
    """Switch the codec mode (`{"mode": "inline" | "lanes"}`) without a restart; 409 while requests are running."""
    try:
        body = json.loads(await raw.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return _error(400, f"request body is not valid JSON: {exc}")
    if not isinstance(body, dict) or not isinstance(body.get("mode"), str):
        return _error(400, 'request body must be {"mode": NAME}')
    return await _codec_mode_rpc(raw, body["mode"])


class SpeechEndpointPlugin:
    name = "voxserve"
    required_tasks = ("generate",)

    def attach_router(self, app: FastAPI) -> None:
        app.include_router(router)

    async def init_state(self, engine_client, state, args: Namespace) -> None:
        if engine_client is None:
            return
        vllm_config = getattr(engine_client, "vllm_config", None)
        additional = getattr(vllm_config, "additional_config", None)
        config = VoxServeConfig.from_additional_config(additional or _parse_json(getattr(args, "additional_config", None)))
        served = list(args.served_model_name or [args.model])
        # vLLM's model (its snapshot folder of a hub id when offline), else the command line's
        model = getattr(getattr(vllm_config, "model_config", None), "model", None) or args.model
        model_dir = resolve_model_dir(model, getattr(args, "revision", None), getattr(args, "download_dir", None))
        service = SpeechService(engine_client, str(model_dir), served, config)
        service.start()
        state.voxserve_speech = service
        logger.info("voxserve: /v1/audio/speech ready for %s (%s)", served, service.tables.model_type)


def _parse_json(value):
    if value is None or isinstance(value, dict):
        return value
    return json.loads(value)
