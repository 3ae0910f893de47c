"""What every JSON body and admin call passes before a route looks at it: the body's size (before it is read), JSON
that is one object of bounded depth with finite numbers and valid Unicode, and the API key.

Each refusal is a `RequestRejected(status, message)`, the message naming the field or the limit, for the routes to
answer as `{"error": {...}}`. No vLLM, no torch.
"""

from __future__ import annotations

import hashlib
import json
import math
import secrets
from collections.abc import AsyncIterable, Iterable

MAX_JSON_DEPTH = 32  # nesting of objects and arrays; the speech request needs 1


class RequestRejected(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


async def read_capped_body(headers, chunks: AsyncIterable[bytes], limit: int,
                           setting: str = "voxserve.max_request_bytes") -> bytes:
    """The body, refused with 413 as soon as it is known to be over `limit` bytes (`setting` names where the limit
    is set): from Content-Length before any of it is read, else (chunked transfer) once the bytes read so far pass
    the limit."""
    declared = headers.get("content-length")
    if declared is not None:
        if not declared.strip().isdigit():
            raise RequestRejected(400, f"Content-Length {declared[:40]!r} is not a byte count")
        if int(declared) > limit:
            raise RequestRejected(413, _too_large(int(declared), limit, setting))
    parts, size = [], 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise RequestRejected(413, _too_large(size, limit, setting, at_least=True))
        parts.append(chunk)
    return b"".join(parts)


def _too_large(size: int, limit: int, setting: str, at_least: bool = False) -> str:
    where = f" ({setting})" if setting else ""
    return f"request body is {'over ' if at_least else ''}{size} bytes; at most {limit} are accepted{where}"


class _NonFinite:
    """Stands for NaN / Infinity / -Infinity in the parsed body until the field holding it is known."""

    def __init__(self, text: str):
        self.text = text


def parse_json_object(body: bytes, max_depth: int = MAX_JSON_DEPTH) -> dict:
    """The body as a JSON object; 400 for anything else, naming the field where one is at fault."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RequestRejected(400, f"request body is not valid UTF-8 (byte {exc.start})") from None
    try:
        value = json.loads(text, parse_constant=_NonFinite)
    except RecursionError:
        raise RequestRejected(400, f"request body is nested deeper than {max_depth} levels") from None
    except ValueError as exc:  # JSONDecodeError, or an integer literal past Python's 4300 digits
        raise RequestRejected(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise RequestRejected(400, f"request body must be a JSON object, got {_json_kind(value)}")
    check_json_values(value, max_depth)
    return value


def check_json_values(root: dict, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Walk the parsed body without recursion: depth, non-finite numbers, strings that are not valid Unicode."""
    stack: list[tuple[object, str, int]] = [(root, "", 1)]
    while stack:
        value, path, depth = stack.pop()
        if isinstance(value, (dict, list)):
            if depth > max_depth:
                raise RequestRejected(400, f"request body is nested deeper than {max_depth} levels "
                                           f"(at {path or 'the top'})")
            items: Iterable = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                if isinstance(key, str):
                    _check_unicode(key, f"{path}.{key}" if path else "a field name")
                stack.append((item, f"{path}.{key}" if path else str(key), depth + 1))
        elif isinstance(value, _NonFinite) or (isinstance(value, float) and not math.isfinite(value)):
            shown = value.text if isinstance(value, _NonFinite) else ("Infinity" if value > 0 else "-Infinity")
            raise RequestRejected(400, f"{path}: {shown} is not allowed; numbers must be finite")
        elif isinstance(value, str):
            _check_unicode(value, path)


def _check_unicode(text: str, field: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(text[exc.start])
        raise RequestRejected(400, f"{field}: is not valid Unicode (a lone surrogate \\u{code:04x} at character "
                                   f"{exc.start}); send UTF-8 text") from None


def _json_kind(value) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return "a number"


def api_key_hashes(args_api_key, env_api_key: str | None) -> list[bytes]:
    """vLLM 0.26's key rule: `--api-key` (a list) wins over VLLM_API_KEY; empty keys are none. Kept as hashes so
    that comparing them takes the same time whatever the offered key."""
    keys = [key for key in (args_api_key or [env_api_key]) if key]
    return [hashlib.sha256(key.encode("utf-8")).digest() for key in keys]


def check_api_key(authorization: str | None, key_hashes: list[bytes]) -> None:
    """401 unless `Authorization: Bearer KEY` names one of the keys (none set: anyone passes)."""
    if not key_hashes:
        return
    scheme, _, offered = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not offered:
        raise RequestRejected(401, "this route needs the server's API key: send 'Authorization: Bearer KEY'")
    digest = hashlib.sha256(offered.strip().encode("utf-8")).digest()
    matched = False
    for key_hash in key_hashes:
        matched |= secrets.compare_digest(digest, key_hash)
    if not matched:
        raise RequestRejected(401, "the API key in the Authorization header is not valid")


def check_json_content_type(content_type: str | None) -> None:
    """415 unless the body is declared `application/json` (a form post from a web page cannot declare it without a
    CORS preflight)."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media != "application/json":
        raise RequestRejected(415, f"Content-Type must be application/json, got {media or 'none'!r}")
