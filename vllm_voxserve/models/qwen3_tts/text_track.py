"""The text track of a request whose text arrives while it runs (streaming text in), in plain Python.

In streaming-text mode (notes §1.3 (a)) the prefill holds the target text's first token, and decode step k adds
`P(text[k + 1])`; after the last token one `P(tts_eos)`, then `P(tts_pad)`. With the whole text known that is
`InputPlan.trailing_text_ids`; here the tokens arrive in pieces (`contract.TEXT_RPC_METHOD`), possibly before the
request starts or out of order across its start, and tts_eos follows only once the text has ended.
"""

from __future__ import annotations


class TextNotArrived(ValueError):
    """A decode step needs a text token that has not arrived (the scheduler runs only steps whose token has)."""


class TextTrack:
    def __init__(self, tts_eos: int, tts_pad: int):
        self.tts_eos, self.tts_pad = tts_eos, tts_pad
        self.ids: list[int] = []  # the target text's token ids from index 0, without gaps
        self.ended = False
        self._early: dict[int, tuple[list[int], bool]] = {}  # pieces past a gap, by start index

    def merge(self, start: int, ids: list[int] | tuple[int, ...], ended: bool = False) -> None:
        """Tokens `ids` at index `start` of the target text; `ended`: none follow them. Idempotent."""
        if start < 0:
            raise ValueError(f"text piece starts at {start}")
        if start > len(self.ids):
            self._early[start] = (list(ids), ended)
            return
        self.ids.extend(ids[len(self.ids) - start:])
        self.ended |= ended and start + len(ids) >= len(self.ids)
        for early in sorted(s for s in self._early if s <= len(self.ids)):
            self.merge(early, *self._early.pop(early))

    def decode_text_id(self, step: int) -> int:
        """The text id decode step `step` adds (0 = the step that feeds frame 0 back)."""
        index = step + 1
        if index < len(self.ids):
            return self.ids[index]
        if not self.ended:
            raise TextNotArrived(f"decode step {step} needs text token {index}; {len(self.ids)} have arrived")
        return self.tts_eos if index == len(self.ids) else self.tts_pad
