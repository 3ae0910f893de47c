"""`POST /v1/audio/voices` (upload a voice to a Base checkpoint) and `DELETE /v1/audio/voices/{name}`.

The upload is multipart: `audio` (a file soundfile reads, resampled to 24 kHz mono), `name`, `ref_text` (the clip's
transcript; may be left out with `x_vector_only_mode=true`) and `consent=true`, the uploader's statement that the
speaker agreed to have their voice cloned. The clip is encoded once, here, on the reference encoder's thread; requests
then name the voice in `voice`. The /v1 prefix is vLLM's: its API key guards these routes like the others.
"""

from __future__ import annotations

import asyncio
import math

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser

from .request_guard import RequestRejected, read_capped_body
from .speech_request import MAX_INPUT_CHARS, check_text, read_reference_clip

router = APIRouter()

SAMPLES_PER_FRAME = 1920
FIELDS = {"audio", "name", "ref_text", "consent", "x_vector_only_mode"}


def _error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {"message": message, "type": kind, "code": status}})


async def _form(raw: Request, limit: int) -> dict:
    """The multipart form, its body capped at `limit` bytes (413) before it is parsed."""
    media = (raw.headers.get("content-type") or "").split(";", 1)[0].strip().lower()
    if media != "multipart/form-data":
        raise RequestRejected(415, f"Content-Type must be multipart/form-data, got {media or 'none'!r}")
    body = await read_capped_body(raw.headers, raw.stream(), limit)

    async def once():
        yield body

    try:
        form = await MultiPartParser(raw.headers, once(), max_files=1, max_fields=len(FIELDS),
                                     max_part_size=MAX_INPUT_CHARS * 4).parse()
    except MultiPartException as exc:
        raise RequestRejected(400, f"request body is not a valid multipart form: {exc.message}") from None
    fields = {key: value for key, value in form.multi_items()}
    unknown = sorted(set(fields) - FIELDS)
    if unknown:
        raise RequestRejected(400, f"{unknown[0]}: not a field of a voice upload; fields: {sorted(FIELDS)}")
    return fields


def _text(fields: dict, name: str, required: bool = True) -> str:
    value = fields.get(name)
    if value is None:
        if required:
            raise RequestRejected(400, f"{name}: Field required")
        return ""
    if not isinstance(value, str):
        raise RequestRejected(400, f"{name}: must be text, not a file")
    return value


@router.post("/v1/audio/voices")
async def upload_voice(raw: Request):
    service = getattr(raw.app.state, "voxserve_speech", None)
    if service is None:
        return _error(503, "speech synthesis is not available on this server", "service_unavailable")
    if service.voice_store is None:
        why = ("this server serves a " + service.tables.model_type + " checkpoint; voices are uploaded to Base "
               "checkpoints" if service.references is None else "uploads are off: set voxserve.voices_dir")
        return _error(404, f"not found: {why}", "not_found_error")
    config = service.config
    try:
        fields = await _form(raw, config.max_ref_audio_bytes + 64 * 1024)
        name = _text(fields, "name")
        service.voice_store.check_new(name, set(service.tables.speakers))
        if _text(fields, "consent", required=False).strip().lower() != "true":
            raise RequestRejected(400, "consent: must be true, stating that the speaker agreed to have their voice "
                                       "cloned and served")
        mode = _text(fields, "x_vector_only_mode", required=False).strip().lower() or "false"
        if mode not in ("true", "false"):
            raise RequestRejected(400, f"x_vector_only_mode: must be true or false, got {mode[:20]!r}")
        x_vector_only = mode == "true"
        ref_text = _text(fields, "ref_text", required=False)
        if len(ref_text) > config.max_input_chars:
            raise RequestRejected(400, f"ref_text is {len(ref_text)} characters; at most {config.max_input_chars}")
        check_text("ref_text", ref_text)
        if not x_vector_only and not ref_text.strip():
            raise RequestRejected(400, "ref_text: the clip's transcript is needed, or x_vector_only_mode=true")
        upload = fields.get("audio")
        if not isinstance(upload, UploadFile):
            raise RequestRejected(400, "audio: Field required (a file part)")
        data = await upload.read()
        if len(data) > config.max_ref_audio_bytes:
            raise RequestRejected(413, f"audio is {len(data)} bytes; at most {config.max_ref_audio_bytes} "
                                       "(voxserve.max_ref_audio_bytes)")
        clip = await asyncio.to_thread(read_reference_clip, data, 24000, config.max_ref_audio_seconds, "audio")
    except RequestRejected as exc:
        return _error(exc.status, exc.message)
    except ValueError as exc:
        return _error(400, str(exc))
    try:
        x_vector, codes = await service.references.encode_clip(clip.tobytes(), x_vector_only)
    except ValueError as exc:
        return _error(400, f"audio: {exc}")
    frames = 0 if x_vector_only else math.ceil(len(clip) / SAMPLES_PER_FRAME)
    try:
        voice = await asyncio.to_thread(service.voice_store.add, name, ref_text, x_vector, codes, frames,
                                        set(service.tables.speakers))
    except ValueError as exc:  # a concurrent upload took the name or the last place
        return _error(409, str(exc), "conflict")
    return voice.describe()


@router.delete("/v1/audio/voices/{name}")
async def delete_voice(raw: Request, name: str):
    service = getattr(raw.app.state, "voxserve_speech", None)
    store = getattr(service, "voice_store", None)
    if store is None or not await asyncio.to_thread(store.delete, name):
        return _error(404, f"name {name[:80]!r} is not an uploaded voice", "not_found_error")
    return {"name": name, "deleted": True}
