"""How a speech request ends for its caller: its usage, or the errors the routes answer with their status codes."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SpeechUsage:
    """OpenAI's usage of a speech request: prompt positions the model read, codec tokens it generated."""

    input_tokens: int = 0
    output_tokens: int = 0

    def as_dict(self) -> dict:
        return {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                "total_tokens": self.input_tokens + self.output_tokens}


class SynthesisError(RuntimeError):
    """The engine or the worker failed this request after it was accepted."""


class InvalidSpeechRequest(SynthesisError):
    """vLLM refused the request's inputs (the client's to fix: HTTP 400)."""


class Overloaded(SynthesisError):
    """The scheduler rejected the request before it started (overload_mode "reject"): answer 503 + Retry-After."""

    def __init__(self, reason: str, retry_after_s: float):
        super().__init__(reason)
        self.retry_after_s = retry_after_s
