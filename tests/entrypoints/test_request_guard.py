"""The checks every body and admin call passes first: size before reading, JSON shape, depth, numbers, Unicode, key."""

from __future__ import annotations

import asyncio

import pytest

from vllm_voxserve.entrypoints.request_guard import (
    RequestRejected,
    api_key_hashes,
    check_api_key,
    check_json_content_type,
    parse_json_object,
    read_capped_body,
)


class Chunks:
    """A body arriving in pieces; counts how many were read."""

    def __init__(self, pieces: list[bytes]):
        self.pieces, self.read = pieces, 0

    async def __aiter__(self):
        for piece in self.pieces:
            self.read += 1
            yield piece


def read(headers: dict, chunks: Chunks, limit: int) -> bytes:
    return asyncio.run(read_capped_body(headers, chunks, limit))


def rejected(call, *args) -> RequestRejected:
    with pytest.raises(RequestRejected) as info:
        call(*args)
    return info.value


def test_a_declared_length_over_the_cap_is_refused_before_any_byte_is_read():
    chunks = Chunks([b"x" * 100] * 10)
    error = rejected(read, {"content-length": "1000"}, chunks, 999)
    assert error.status == 413 and "max_request_bytes" in error.message and chunks.read == 0


def test_a_chunked_body_stops_at_the_cap():
    chunks = Chunks([b"x" * 100] * 10)
    error = rejected(read, {}, chunks, 250)
    assert error.status == 413 and chunks.read == 3
    assert read({}, Chunks([b"ab", b"cd"]), 4) == b"abcd"
    assert read({"content-length": "4"}, Chunks([b"ab", b"cd"]), 4) == b"abcd"


def test_a_content_length_that_is_not_a_number_is_400():
    assert rejected(read, {"content-length": "-5"}, Chunks([]), 10).status == 400


@pytest.mark.parametrize("body, status, words", [
    (b"[" * 100_000 + b"]" * 100_000, 400, "nested deeper than 32"),
    (b'{"a":' * 50_000 + b"1" + b"}" * 50_000, 400, "nested deeper than 32"),
    (b'{"a": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}', 400, "at a.0.0"),
    (b'{"temperature": NaN}', 400, "temperature: NaN is not allowed; numbers must be finite"),
    (b'{"ttfa_slo_ms": Infinity}', 400, "ttfa_slo_ms: Infinity"),
    (b'{"top_p": -Infinity}', 400, "top_p: -Infinity"),
    (b'{"speed": 1e999}', 400, "speed: Infinity"),
    (b'{"input": "a\\ud800b"}', 400, "input: is not valid Unicode (a lone surrogate \\ud800 at character 1)"),
    (b'{"\\udfff": 1}', 400, "a field name: is not valid Unicode"),
    (b'{"input": "\xff"}', 400, "not valid UTF-8"),
    (b"[1, 2]", 400, "must be a JSON object, got an array"),
    (b'"text"', 400, "got a string"),
    (b"null", 400, "got null"),
    (b"{", 400, "not valid JSON"),
    (b"", 400, "not valid JSON"),
    (b'{"seed": ' + b"9" * 5000 + b"}", 400, "not valid JSON"),
])
def test_bodies_that_are_refused(body, status, words):
    error = rejected(parse_json_object, body)
    assert error.status == status and words in error.message


def test_a_body_within_the_rules_parses():
    assert parse_json_object(b'{"input": "Hi \\u00e9", "a": [{"b": [1.5]}], "seed": -9223372036854775808}') == {
        "input": "Hi é", "a": [{"b": [1.5]}], "seed": -(2**63)}


def test_api_key_rule_follows_vllm_cli_first_then_env():
    assert api_key_hashes(None, None) == [] and api_key_hashes(None, "") == []
    assert api_key_hashes(["cli"], "env") == api_key_hashes(["cli"], None) != api_key_hashes(None, "env")
    keys = api_key_hashes(["one", "two"], None)
    check_api_key("Bearer two", keys)
    check_api_key("bearer one", keys)
    check_api_key(None, [])  # no key set: open
    for header in (None, "", "Bearer", "Bearer three", "Basic one", "one"):
        assert rejected(check_api_key, header, keys).status == 401


def test_admin_posts_take_only_json():
    check_json_content_type("application/json")
    check_json_content_type("Application/JSON; charset=utf-8")
    for content_type in (None, "application/x-www-form-urlencoded", "text/plain", "multipart/form-data; b=x"):
        error = rejected(check_json_content_type, content_type)
        assert error.status == 415 and "Content-Type must be application/json" in error.message
