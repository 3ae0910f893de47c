"""The speech socket's messages and their order, without a socket."""

from __future__ import annotations

import json

import pytest

from vllm_voxserve.entrypoints.speech_socket_protocol import (
    CLOSE_POLICY,
    CLOSE_UNSUPPORTED_DATA,
    Action,
    Cancel,
    Config,
    End,
    Flush,
    ProtocolError,
    Session,
    State,
    Text,
    parse_message,
)

LIMIT = 1 << 20


def parse(body) -> object:
    return parse_message(json.dumps(body), LIMIT)


def refused(data, limit: int = LIMIT) -> ProtocolError:
    with pytest.raises(ProtocolError) as caught:
        parse_message(data, limit)
    return caught.value


def test_config_takes_the_http_fields_and_defaults_to_pcm():
    message = parse({"type": "config", "voice": "ryan", "language": "English", "seed": 7, "temperature": 0.5,
                     "top_k": 20, "top_p": 0.9, "max_new_tokens": 64, "ignore_eos": True, "ttfa_slo_ms": 300,
                     "instructions": "calm", "task_type": "CustomVoice"})
    assert isinstance(message, Config)
    request = message.request
    assert (request.voice, request.seed, request.max_new_tokens, request.ignore_eos) == ("ryan", 7, 64, True)
    assert request.response_format == "pcm" and request.streaming and request.input == ""
    assert parse({"type": "config", "response_format": "opus"}).request.response_format == "opus"


@pytest.mark.parametrize("fields, named", [
    ({"input": "hi"}, "input"), ({"stream": True}, "stream"), ({"speed": 2}, "speed"),
    ({"stream_format": "sse"}, "stream_format"), ({"temperature": 5}, "temperature"),
    ({"seed": "x"}, "seed"), ({"max_new_tokens": 1}, "max_new_tokens"), ({"voise": "ryan"}, "voise"),
    ({"response_format": "flac"}, "response_format"), ({"ttfa_slo_ms": 0}, "ttfa_slo_ms"),
])
def test_a_bad_config_names_its_field(fields, named):
    error = refused(json.dumps({"type": "config", **fields}))
    assert error.message.startswith(named) and error.close_code == CLOSE_POLICY


def test_the_other_messages():
    assert parse({"type": "text", "text": "Hello "}) == Text("Hello ")
    assert parse({"type": "text", "text": ""}) == Text("")
    assert parse({"type": "flush"}) == Flush()
    assert parse({"type": "end"}) == End()
    assert parse({"type": "cancel"}) == Cancel()


@pytest.mark.parametrize("data, named", [
    ("not json", "message is not valid JSON"), ("[1]", "message must be a JSON object"),
    ('{"type": "txt"}', "type"), ('{"text": "hi"}', "type"), ('{"type": "text"}', "text"),
    ('{"type": "text", "text": 3}', "text"), ('{"type": "text", "text": "a\\u0000"}', "text contains"),
    ('{"type": "text", "text": "\\ud800"}', "text: is not valid Unicode"),
    ('{"type": "end", "now": true}', "now"), ('{"type": "config", "top_p": NaN}', "top_p"),
])
def test_a_malformed_message_is_refused_naming_what_is_wrong(data, named):
    error = refused(data)
    assert error.message.startswith(named), error.message
    assert error.close_code == CLOSE_POLICY


def test_binary_and_oversized_messages_are_refused():
    assert refused(None).close_code == CLOSE_UNSUPPORTED_DATA
    assert "at most 100" in refused(json.dumps({"type": "text", "text": "x" * 200}), limit=100).message


def config(**fields) -> Config:
    return Config(parse_message(json.dumps({"type": "config", **fields}), LIMIT).request)


def test_a_session_speaks_utterances_until_end():
    session = Session(max_input_chars=100)
    assert session.accept(config(voice="ryan")) is Action.NOTHING and session.state is State.READY
    assert session.accept(Flush()) is Action.NOTHING  # nothing open yet
    assert session.accept(Text("Hello ")) is Action.OPEN and session.utterances == 1
    assert session.accept(Text("there.")) is Action.APPEND
    assert session.accept(Flush()) is Action.FLUSH and session.state is State.OPEN
    assert session.accept(End()) is Action.END and session.state is State.ENDING
    assert session.utterance_done() is True


def test_cancel_keeps_the_config_for_the_next_utterance_or_takes_a_new_one():
    session = Session(max_input_chars=100)
    session.accept(config(voice="ryan"))
    session.accept(Text("One"))
    assert session.accept(Cancel()) is Action.CANCEL and session.state is State.READY
    assert session.accept(Cancel()) is Action.NOTHING
    assert session.accept(Text("Two")) is Action.OPEN and session.config.voice == "ryan"
    session.accept(Cancel())
    assert session.accept(config(voice="vivian")) is Action.NOTHING
    assert session.accept(Text("Three")) is Action.OPEN and session.config.voice == "vivian"
    assert session.utterances == 3
    session.accept(End())
    assert session.accept(Cancel()) is Action.CANCEL  # cancel still stops an ending utterance


def test_an_utterance_that_runs_out_leaves_the_socket_open():
    session = Session(max_input_chars=100)
    session.accept(config())
    session.accept(Text("a"))
    assert session.utterance_done() is False and session.state is State.READY
    assert session.accept(End()) is Action.CLOSE


@pytest.mark.parametrize("steps, message", [
    ([], Text("hi")),
    ([], End()),
    ([config(), Text("a")], config()),
    ([config(), Text("a"), End()], Text("b")),
    ([config(), Text("a"), End()], Flush()),
])
def test_messages_out_of_order_are_refused(steps, message):
    session = Session(max_input_chars=100)
    for step in steps:
        session.accept(step)
    with pytest.raises(ProtocolError) as caught:
        session.accept(message)
    assert caught.value.message.startswith("type:")


def test_an_utterance_holds_at_most_max_input_chars():
    session = Session(max_input_chars=10)
    session.accept(config())
    session.accept(Text("12345"))
    session.accept(Text("67890"))
    with pytest.raises(ProtocolError) as caught:
        session.accept(Text("!"))
    assert caught.value.message.startswith("text:") and "11 characters" in caught.value.message
    session = Session(max_input_chars=10)
    session.accept(config())
    session.accept(Text("12345678"))
    session.accept(Cancel())
    assert session.accept(Text("12345678")) is Action.OPEN  # counted per utterance
