"""vLLM endpoint plugin: `POST /v1/audio/speech` (OpenAI-compatible, streaming) and `GET /v1/audio/voices`.

Loaded by vLLM in the API-server process when `VLLM_PLUGINS` names `voxserve` (or the command line has
`--plugin voxserve`). Routes attach while vLLM builds its app, so they appear in its OpenAPI schema.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import math
import time
from argparse import Namespace

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from vllm_voxserve.compat import collective_rpc_per_rank
from vllm_voxserve.config import process_config
from vllm_voxserve.contract import MODE_RPC_METHOD, SAMPLE_RATE
from vllm_voxserve.models.qwen3_tts.model_files import resolve_model_dir

from . import audio_format
from .audio_encoding import MEDIA_TYPES, AudioEncoder, encode_off_loop, time_stretch
from .edge_admission import AdmissionTicket, EdgeGuard, EdgeRefusal
from .engine_metrics import start_engine_metrics
from .request_guard import (
    RequestRejected,
    api_key_hashes,
    check_api_key,
    check_json_content_type,
    parse_json_object,
    read_capped_body,
)
from .server_load import log_server_load
from .speech_metrics import SpeechMetrics, metered
from .speech_request import SpeechRequest
from .speech_service import InvalidSpeechRequest, Overloaded, SpeechService, SpeechUsage, SynthesisError
from .speech_socket import router as socket_router
from .voice_routes import router as voice_router

logger = logging.getLogger(__name__)
router = APIRouter()


def _error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {"message": message, "type": kind, "code": status}})


def _overloaded(message: str, retry_after_s: float) -> JSONResponse:
    response = _error(503, message, "service_unavailable")
    response.headers["Retry-After"] = str(max(1, math.ceil(retry_after_s)))
    return response


def _service(request: Request) -> SpeechService | None:
    return getattr(request.app.state, "voxserve_speech", None)


_REQUEST_BODY = {"required": True, "content": {"application/json": {"schema": SpeechRequest.model_json_schema()}}}


@router.post("/v1/audio/speech", openapi_extra={"requestBody": _REQUEST_BODY},
             responses={200: {"content": {media: {} for media in MEDIA_TYPES.values()}}})
async def create_speech(raw: Request):
    """Synthesize speech; `stream: true` (or `stream_format`) sends audio as each chunk is decoded."""
    arrived_at = time.monotonic()
    service = _service(raw)
    if service is None:
        return _error(503, "speech synthesis is not available on this server", "service_unavailable")
    metrics = SpeechMetrics.get((getattr(service, "served_models", None) or [""])[0])
    # Past what this API server keeps on time, or while the engine would refuse it, refused before the body is read
    # and without the engine hearing of it.
    edge: EdgeGuard = raw.app.state.voxserve_edge
    ticket = edge.admit(arrived_at, service.refusal_at_arrival(arrived_at))
    if isinstance(ticket, EdgeRefusal):
        metrics.refuse("api_server_limit")
        return _overloaded(ticket.reason, ticket.retry_after_s)
    try:
        response = await _speech(raw, service, metrics, ticket)
    except BaseException:
        ticket.done(time.monotonic())
        raise
    if not isinstance(response, StreamingResponse):  # a stream ends when its body does (`metered`)
        ticket.done(time.monotonic())
    return response


async def _speech(raw: Request, service: SpeechService, metrics: SpeechMetrics, ticket: AdmissionTicket):
    try:  # the size before the body is read; then one JSON object of bounded depth, finite numbers, valid Unicode
        body = parse_json_object(await read_capped_body(raw.headers, raw.stream(), service.config.max_request_bytes))
    except RequestRejected as exc:
        metrics.refuse("too_large" if exc.status == 413 else "invalid")
        return _error(exc.status, exc.message)
    try:
        request = SpeechRequest.model_validate(body)
        job, prompt_ids, params = service.prepare(request)
    except ValidationError as exc:
        metrics.refuse("invalid")
        return _error(400, "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()))
    except ValueError as exc:
        metrics.refuse("invalid")
        return _error(400, str(exc))
    if request.ttfa_slo_ms is not None:
        ticket.target_s = request.ttfa_slo_ms / 1000.0
    usage = SpeechUsage()
    chunks = metered(service.synthesize(job, prompt_ids, params, usage), metrics, ticket, request.streaming,
                     SAMPLE_RATE)
    fmt = request.response_format
    pieces = []
    try:
        # The first chunk (or the scheduler's rejection) comes before any header: an overloaded server answers 503.
        # A client that leaves meanwhile (all of a non-streaming request's audio comes before the answer) ends it.
        if not await _collect_unless_disconnected(raw, chunks, pieces, first_only=request.streaming):
            return Response(status_code=499)  # nobody reads it
    except Overloaded as exc:
        metrics.refuse("overloaded")
        return _overloaded(str(exc), exc.retry_after_s)
    except InvalidSpeechRequest as exc:
        metrics.refuse("invalid")
        return _error(400, str(exc))
    except SynthesisError as exc:
        metrics.refuse("failed")
        return _error(500, str(exc), "server_error")
    if request.streaming:
        encoder = AudioEncoder(fmt, SAMPLE_RATE, streaming=True)
        failure: list[str] = []
        body = _stream_bytes(pieces, chunks, encoder, failure, ticket)
        if request.sse:
            return StreamingResponse(_sse_events(body, usage, failure), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return StreamingResponse(body, media_type=MEDIA_TYPES[fmt])
    data = await asyncio.to_thread(_whole_file, audio_format.concat(pieces), fmt, request.speed)
    return Response(content=data, media_type=MEDIA_TYPES[fmt])


def _whole_file(audio, fmt: str, speed: float) -> bytes:
    """The complete response body (a worker thread's work: stretching and encoding a long text takes a while)."""
    encoder = AudioEncoder(fmt, SAMPLE_RATE, streaming=False)
    encoder.encode(time_stretch(audio, speed, SAMPLE_RATE))
    return encoder.finish()


async def _collect_unless_disconnected(raw: Request, chunks, pieces: list, first_only: bool) -> bool:
    """Gather `chunks` (only the first with `first_only`) into `pieces`; False, with the request aborted (`chunks`
    closed), when the client disconnects first. Errors of `chunks` propagate."""

    async def collect():
        async for chunk in chunks:
            pieces.append(chunk)
            if first_only:
                return

    async def disconnected():
        while (await raw.receive())["type"] != "http.disconnect":  # the body is read: only the disconnect is left
            pass

    collecting = asyncio.ensure_future(collect())
    watching = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait((collecting, watching), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watching.cancel()
        if not collecting.done():  # the client left (or this handler was cancelled): abort the request at once
            collecting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await collecting
            await chunks.aclose()
    if collecting.cancelled():
        return False
    collecting.result()  # the synthesis's own error, if any
    return True


async def _stream_bytes(first: list, chunks, encoder: AudioEncoder, failure: list[str], ticket: AdmissionTicket):
    """The encoded bytes of each chunk as it comes (a codec may hold a few ms of audio back until the next one); the
    first bytes handed to the response are the request's first audio for its ticket. A synthesis that fails midway
    ends the bytes early, its error appended to `failure`."""
    try:
        for chunk in first:
            if data := await encode_off_loop(encoder, chunk):
                ticket.first_audio(time.monotonic())
                yield data
        async for chunk in chunks:
            if data := await encode_off_loop(encoder, chunk):
                ticket.first_audio(time.monotonic())
                yield data
        if data := await encode_off_loop(encoder, None):
            ticket.first_audio(time.monotonic())
            yield data
    except SynthesisError as exc:
        # Headers are gone: end the stream early; the client sees a short body.
        logger.error("speech stream failed: %s", exc)
        failure.append(str(exc))
    finally:
        encoder.close()
        await chunks.aclose()  # a client gone mid-stream aborts the request now


def _sse(event: dict) -> bytes:
    return b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"


async def _sse_events(body, usage: SpeechUsage, failure: list[str]):
    """OpenAI's speech events: `speech.audio.delta` with each piece of the encoded audio in base64, then
    `speech.audio.done` with the usage; a synthesis that fails midway ends with an `error` event instead."""
    try:
        async for data in body:
            yield _sse({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode("ascii")})
    finally:
        await body.aclose()
    if failure:
        yield _sse({"type": "error", "error": {"message": failure[0], "type": "server_error", "code": 500}})
    else:
        yield _sse({"type": "speech.audio.done", "usage": usage.as_dict()})


@router.get("/v1/audio/voices")
async def list_voices(raw: Request):
    service = _service(raw)
    if service is None:
        return _error(503, "speech synthesis is not available on this server", "service_unavailable")
    store = service.voice_store
    details = [{"name": name, "kind": "speaker"} for name in sorted(service.tables.speakers)]
    details += [voice.describe() for voice in store.list()] if store is not None else []
    return {"voices": service.voices(), "details": details, "task_type": service.tables.model_type,
            "languages": service.tables.supported_languages, "uploads": store is not None}


MAX_ADMIN_BODY_BYTES = 4096  # {"mode": NAME}
_ADMIN_OFF = ("not found: the admin routes are off; enable them with --additional-config "
              '\'{"voxserve": {"admin_routes": true}}\'')


async def _admin_gate(raw: Request, with_body: bool) -> dict | JSONResponse | None:
    """The admin routes' checks, in order: on (else 404), the API key when one is set (401), then for a POST a JSON
    Content-Type (415) and a small JSON object (413 / 400). Returns the parsed body, an error response, or None."""
    service = _service(raw)
    if service is None or not service.config.admin_routes:
        return _error(404, _ADMIN_OFF, "not_found_error")
    try:
        check_api_key(raw.headers.get("authorization"), getattr(raw.app.state, "voxserve_api_keys", []))
        if not with_body:
            return None
        check_json_content_type(raw.headers.get("content-type"))
        return parse_json_object(await read_capped_body(raw.headers, raw.stream(), MAX_ADMIN_BODY_BYTES, setting=""))
    except RequestRejected as exc:
        kind = {401: "authentication_error", 404: "not_found_error"}.get(exc.status, "invalid_request_error")
        return _error(exc.status, exc.message, kind)


async def _codec_mode_rpc(raw: Request, mode: str | None):
    """Ask every worker (one per GPU of each data-parallel rank's engine) through vLLM's collective_rpc; all must
    agree. A rank that refuses a switch (409 while it serves) keeps its mode while the others switch: the answer says
    so, and the same call again switches the rest once they are idle."""
    service = _service(raw)
    if service is None:
        return _error(503, "speech synthesis is not available on this server", "service_unavailable")
    try:
        per_rank = await collective_rpc_per_rank(service.engine_client, MODE_RPC_METHOD, args=(mode,))
        replies = [reply for rank_replies in per_rank for reply in rank_replies]
    except Exception as exc:  # the engine died or a worker raised: report it, keep the API server up
        logger.exception("codec mode rpc failed")
        return _error(500, f"codec mode rpc failed: {exc}", "server_error")
    worst = max(replies, key=lambda r: r.get("status", 500))
    if worst.get("status") != 200:
        kind = {400: "invalid_request_error", 409: "conflict", 503: "service_unavailable"}.get(
            worst.get("status"), "server_error")
        return _error(worst.get("status", 500), worst.get("error", "codec mode rpc failed"), kind)
    currents = {r["current"] for r in replies}
    if len(currents) != 1:
        return _error(500, f"workers disagree on the codec mode: {sorted(currents)}", "server_error")
    return {"modes": replies[0]["modes"], "current": replies[0]["current"], "ranks": len(per_rank)}


@router.get("/voxserve/modes")
async def list_codec_modes(raw: Request):
    """The codec modes this server can switch between, and the current one (admin route: `voxserve.admin_routes`)."""
    refused = await _admin_gate(raw, with_body=False)
    if refused is not None:
        return refused
    return await _codec_mode_rpc(raw, None)


@router.post("/voxserve/mode")
async def set_codec_mode(raw: Request):
    """Switch the serving mode (`{"mode": NAME}`, names from GET /voxserve/modes) without a restart; 409 while
    requests are running, 503 when the device has no memory for the new mode (the old one keeps serving)."""
    body = await _admin_gate(raw, with_body=True)
    if isinstance(body, JSONResponse):
        return body
    if set(body) != {"mode"} or not isinstance(body["mode"], str):
        return _error(400, 'mode: the request body must be {"mode": NAME}, NAME a string')
    return await _codec_mode_rpc(raw, body["mode"])


class SpeechEndpointPlugin:
    name = "voxserve"
    required_tasks = ("generate",)

    def attach_router(self, app: FastAPI) -> None:
        app.include_router(router)
        app.include_router(voice_router)
        app.include_router(socket_router)

    async def init_state(self, engine_client, state, args: Namespace) -> None:
        if engine_client is None:
            return
        vllm_config = getattr(engine_client, "vllm_config", None)
        additional = getattr(vllm_config, "additional_config", None)
        config = process_config(additional or _parse_json(getattr(args, "additional_config", None)))
        served = list(args.served_model_name or [args.model])
        # vLLM's model (its snapshot folder of a hub id when offline), else the command line's
        model = getattr(getattr(vllm_config, "model_config", None), "model", None) or args.model
        model_dir = resolve_model_dir(model, getattr(args, "revision", None), getattr(args, "download_dir", None))
        service = SpeechService(engine_client, str(model_dir), served, config)
        service.start()
        state.voxserve_engine_metrics = start_engine_metrics(engine_client, served[0])
        state.voxserve_api_keys = _api_keys(args)
        state.voxserve_edge = EdgeGuard.from_policy(config.scheduler_policy())
        state.voxserve_speech = service
        state.voxserve_load_log = asyncio.get_running_loop().create_task(
            log_server_load(first_audio_s=state.voxserve_edge.take_first_audio_s))
        logger.info("voxserve: /v1/audio/speech ready for %s (%s)", served, service.tables.model_type)


def _api_keys(args: Namespace) -> list[bytes]:
    """vLLM's own API keys (`--api-key`, else VLLM_API_KEY), which guard only its /v1 routes: ours check them too."""
    import vllm.envs as envs

    return api_key_hashes(getattr(args, "api_key", None), envs.VLLM_API_KEY)


def _parse_json(value):
    if value is None or isinstance(value, dict):
        return value
    return json.loads(value)
