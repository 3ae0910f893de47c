"""The messages of `WS /v1/audio/speech/stream` (text in as it is written, audio out as it is decoded) and the rules
of their order. Pure: no vLLM, no sockets; the route (`speech_socket.py`) does the I/O.

Client -> server, JSON text messages:
- `{"type": "config", ...}` first: the fields of `POST /v1/audio/speech` but `input`, `stream`, `stream_format` and
  `speed` (the text comes in `text` messages; audio is always streamed at speed 1); `response_format` defaults to
  `pcm`. It holds for every utterance of the socket until another config replaces it (between utterances only).
- `{"type": "text", "text": "..."}`: the next piece of the text, appended as is (send the spaces between words). The
  first text after the config, or after an utterance ended, opens an utterance (the server answers `started`).
- `{"type": "flush"}`: speak what has arrived without waiting for more; the utterance stays open.
- `{"type": "end"}`: no more text; the server sends the rest of the audio, `done`, and closes (1000).
- `{"type": "cancel"}`: stop now; the server answers `done` with `"reason": "cancelled"` and keeps the socket and
  the config: a `text` message starts the next utterance with the same config, a `config` message first sets a new
  one. An utterance whose audio ends without `end` (the model stopped: EOS or `max_new_tokens`) also ends with `done`
  (`"reason": "stopped"`); the socket stays open the same way.

Server -> client: JSON events and binary audio. `started` when an utterance opens (at its first text message);
before each binary message an `audio` event (`index` from 0 within the utterance, `duration_s` of audio the bytes
complete); `done` with the usage when the utterance ends; `error`, then the socket closes with the code of
`ProtocolError`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from pydantic import ValidationError

from .request_guard import RequestRejected, parse_json_object
from .speech_request import STREAMED_FORMATS, SpeechRequest, check_text

# Bounded waits of a socket, none of them open-ended.
CONFIG_TIMEOUT_S = 30.0  # from the handshake to the first message
IDLE_TIMEOUT_S = 120.0  # no message from the client and no audio to it for this long: the socket is closed

# WebSocket close codes (RFC 6455 7.4.1, and IANA's 1013)
CLOSE_NORMAL = 1000
CLOSE_UNSUPPORTED_DATA = 1003  # a binary message: this route takes JSON text only
CLOSE_POLICY = 1008  # a malformed message, a bad field, a message out of order, no API key, idle too long
CLOSE_INTERNAL = 1011  # the synthesis failed
CLOSE_TRY_AGAIN_LATER = 1013  # the server is at capacity

# SpeechRequest fields a config may not carry, and why
_NOT_IN_CONFIG = {
    "input": "the text comes in text messages",
    "stream": "audio is always streamed",
    "stream_format": "audio comes as binary messages",
    "speed": "a stream plays at speed 1.0",
}
MESSAGE_TYPES = ("config", "text", "flush", "end", "cancel")


class ProtocolError(Exception):
    """A message the session cannot take: sent to the client as an `error` event, then the socket closes."""

    def __init__(self, message: str, close_code: int = CLOSE_POLICY, kind: str = "invalid_request_error",
                 retry_after_s: float | None = None):
        super().__init__(message)
        self.message, self.close_code, self.kind, self.retry_after_s = message, close_code, kind, retry_after_s

    def event(self) -> dict:
        return error_event(self.message, self.kind, self.retry_after_s)


@dataclass(frozen=True, slots=True)
class Config:
    request: SpeechRequest  # its `input` is empty: the text arrives in `Text` messages


@dataclass(frozen=True, slots=True)
class Text:
    text: str


@dataclass(frozen=True, slots=True)
class Flush:
    pass


@dataclass(frozen=True, slots=True)
class End:
    pass


@dataclass(frozen=True, slots=True)
class Cancel:
    pass


Message = Config | Text | Flush | End | Cancel


def parse_message(data: str | bytes | None, max_bytes: int) -> Message:
    """One client message; ProtocolError naming the field for anything else. `data` None: a binary message."""
    if data is None:
        raise ProtocolError("binary messages are not accepted: send JSON text messages", CLOSE_UNSUPPORTED_DATA)
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    if len(raw) > max_bytes:
        raise ProtocolError(f"message is {len(raw)} bytes; at most {max_bytes} are accepted "
                            "(voxserve.max_request_bytes)")
    try:
        body = parse_json_object(raw)
    except RequestRejected as exc:
        raise ProtocolError(exc.message.replace("request body", "message")) from None
    kind = body.get("type")
    if kind not in MESSAGE_TYPES:
        raise ProtocolError(f"type: {kind!r} is not a message type; use one of {list(MESSAGE_TYPES)}")
    if kind == "config":
        return Config(parse_config({k: v for k, v in body.items() if k != "type"}))
    if kind == "text":
        _only(body, {"type", "text"})
        text = body.get("text")
        if not isinstance(text, str):
            raise ProtocolError("text: a text message needs a string `text`")
        try:
            check_text("text", text)
        except ValueError as exc:
            raise ProtocolError(str(exc)) from None
        return Text(text)
    _only(body, {"type"})
    return {"flush": Flush, "end": End, "cancel": Cancel}[kind]()


def _only(body: dict, allowed: set[str]) -> None:
    extra = sorted(set(body) - allowed)
    if extra:
        raise ProtocolError(f"{extra[0]}: not a field of a {body['type']} message")


def parse_config(fields: dict) -> SpeechRequest:
    """The request an utterance is synthesized with: `SpeechRequest`'s own checks, each error naming its field."""
    for name, why in _NOT_IN_CONFIG.items():
        if name in fields:
            raise ProtocolError(f"{name}: not a config field; {why}")
    fields = {"response_format": "pcm", **fields}  # mp3, the HTTP default, costs a codec delay for nothing here
    try:
        request = SpeechRequest.model_validate({**fields, "input": "", "stream": True})
    except ValidationError as exc:
        raise ProtocolError("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())) from None
    if request.response_format not in STREAMED_FORMATS:
        raise ProtocolError(f"response_format: {request.response_format!r} does not stream; use one of "
                            f"{list(STREAMED_FORMATS)}")
    return request


class State(enum.Enum):
    AWAITING_CONFIG = "awaiting_config"  # nothing yet: only a config may come
    READY = "ready"  # a config is set and no utterance is open: text opens one
    OPEN = "open"  # an utterance takes text
    ENDING = "ending"  # `end` came: its audio finishes, then the socket closes


class Action(enum.Enum):
    OPEN = "open"  # open an utterance with the session's config, then append the message's text
    APPEND = "append"
    FLUSH = "flush"
    END = "end"
    CANCEL = "cancel"
    CLOSE = "close"  # close the socket normally: nothing is open
    NOTHING = "nothing"


class Session:
    """Which message may come when, and what it asks of the route. The route reports an utterance whose audio ended
    (`utterance_done`)."""

    def __init__(self, max_input_chars: int) -> None:
        self.state = State.AWAITING_CONFIG
        self.config: SpeechRequest | None = None
        self.max_input_chars = max_input_chars
        self.chars = 0  # text of the open utterance so far
        self.utterances = 0  # opened so far

    def accept(self, message: Message) -> Action:
        state = self.state
        if state is State.AWAITING_CONFIG and not isinstance(message, Config):
            raise ProtocolError("type: the first message must be a config message")
        if isinstance(message, Config):
            if state in (State.OPEN, State.ENDING):
                raise ProtocolError("type: a config message cannot come while an utterance is open; cancel it first")
            self.config, self.state = message.request, State.READY
            return Action.NOTHING
        if isinstance(message, Cancel):
            if state in (State.OPEN, State.ENDING):
                self.state = State.READY
                return Action.CANCEL
            return Action.NOTHING
        if state is State.ENDING:
            raise ProtocolError(f"type: a {_name(message)} message cannot follow end; only cancel can")
        if isinstance(message, Text):
            action = Action.APPEND
            if state is State.READY:
                self.state, self.chars, action = State.OPEN, 0, Action.OPEN
                self.utterances += 1
            self.chars += len(message.text)
            if self.chars > self.max_input_chars:
                raise ProtocolError(f"text: the utterance's text is {self.chars} characters; at most "
                                    f"{self.max_input_chars} are accepted (voxserve.max_input_chars)")
            return action
        if isinstance(message, Flush):
            return Action.FLUSH if state is State.OPEN else Action.NOTHING
        if state is State.READY:  # end with nothing open
            return Action.CLOSE
        self.state = State.ENDING
        return Action.END

    def utterance_done(self) -> bool:
        """The open utterance's audio ended; True when the socket should now close (the client had sent end)."""
        ending = self.state is State.ENDING
        self.state = State.READY
        return ending


def _name(message: Message) -> str:
    return type(message).__name__.lower()


def error_event(message: str, kind: str = "invalid_request_error", retry_after_s: float | None = None) -> dict:
    event = {"type": "error", "error": {"message": message, "type": kind}}
    if retry_after_s is not None:
        event["error"]["retry_after_s"] = retry_after_s
    return event
