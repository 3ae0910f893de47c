"""What the scheduler knows of text streams' text (streaming text in): per stream key, how many of the target text's
tokens have arrived and whether the text has ended. In streaming-text mode decode step k reads token k + 1 (token 0
rides in the prefill), so a step whose token has not arrived cannot run: its request is paused until it does."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class TextArrival:
    tokens: int = 0  # tokens 0 .. tokens-1 have arrived
    ended: bool = False


class TextArrivals:
    def __init__(self) -> None:
        self._by_key: dict[str, TextArrival] = {}
        self._requests: dict[str, str] = {}  # request id -> stream key (a retried stream's requests share one)

    def arrived(self, stream_key: str, end: int, ended: bool = False) -> None:
        """Tokens up to index `end` (exclusive) have arrived, in order; `ended`: none follow."""
        arrival = self._by_key.setdefault(stream_key, TextArrival())
        arrival.tokens = max(arrival.tokens, end)
        arrival.ended |= ended

    def drop(self, stream_key: str) -> None:
        self._by_key.pop(stream_key, None)

    def runnable(self, stream_key: str, next_step: int) -> bool:
        """Whether decode step `next_step` (negative: still in the prefill) has its text token."""
        if next_step < 0:
            return True
        arrival = self._by_key.get(stream_key)
        return arrival is not None and (arrival.ended or arrival.tokens >= next_step + 2)

    def __contains__(self, stream_key: str) -> bool:
        return stream_key in self._by_key

    def __len__(self) -> int:
        return len(self._by_key)

    # --- the requests that run text streams ---

    def add_request(self, request_id: str, stream_key: str, tokens: int) -> None:
        """A text stream's request, with the tokens its job carries."""
        self._requests[request_id] = stream_key
        self.arrived(stream_key, tokens)

    def forget_request(self, request_id: str) -> None:
        key = self._requests.pop(request_id, None)
        if key is not None and key not in self._requests.values():
            self.drop(key)

    def requests_of(self, stream_key: str) -> list[str]:
        return [r for r, key in self._requests.items() if key == stream_key]

    def request_ids(self) -> list[str]:
        return list(self._requests)

    def paused(self, request_id: str, next_step: int) -> bool:
        """Whether this request (a text stream's, else never) must wait for text before decode step `next_step`."""
        key = self._requests.get(request_id)
        return key is not None and not self.runnable(key, next_step)
