"""A text stream's text track gives each decode step the text id the whole text's plan gives it, whatever pieces and
order the text arrives in, and refuses a step whose token has not arrived."""

from __future__ import annotations

import pytest

from vllm_voxserve.models.qwen3_tts.prompt import PromptTables, plan_custom_voice
from vllm_voxserve.models.qwen3_tts.text_track import TextNotArrived, TextTrack

TABLES = PromptTables("custom_voice", "1b7", 3072, {"english": 2050}, {"ryan": 3061}, {"ryan": False})
TEXT = (9707, 11, 1879, 0, 1096, 374, 264, 1273, 13)


def whole_text_ids(steps: int) -> list[int]:
    plan = plan_custom_voice(TABLES, TEXT, "ryan", "english", non_streaming=False)
    return [plan.decode_text_id(k) for k in range(steps)]


@pytest.mark.parametrize("pieces", [
    [(0, TEXT, True)],
    [(0, TEXT[:1], False), (1, TEXT[1:4], False), (4, TEXT[4:], False), (len(TEXT), (), True)],
    [(4, TEXT[4:], True), (1, TEXT[1:4], False), (0, TEXT[:1], False)],  # before the start, out of order
    [(0, TEXT[:3], False), (0, TEXT[:3], False), (3, TEXT[3:], True), (3, TEXT[3:], True)],  # repeated
])
def test_the_track_gives_the_whole_texts_decode_ids(pieces):
    track = TextTrack(TABLES.tts_eos, TABLES.tts_pad)
    for start, ids, ended in pieces:
        track.merge(start, ids, ended)
    assert track.ended
    assert [track.decode_text_id(k) for k in range(len(TEXT) + 3)] == whole_text_ids(len(TEXT) + 3)


def test_a_step_whose_token_has_not_arrived_is_refused_until_it_does():
    track = TextTrack(TABLES.tts_eos, TABLES.tts_pad)
    track.merge(0, TEXT[:3])
    assert track.decode_text_id(1) == TEXT[2]  # steps 0 and 1 read tokens 1 and 2
    with pytest.raises(TextNotArrived):
        track.decode_text_id(2)  # no tts_eos while the text is open
    track.merge(3, TEXT[3:4])
    assert track.decode_text_id(2) == TEXT[3]
    track.merge(4, (), ended=True)
    assert track.decode_text_id(3) == TABLES.tts_eos and track.decode_text_id(4) == TABLES.tts_pad
