"""Stalls of audio whose text is sent in pieces: only the part of a pause after the text had been sent counts."""

import math

import pytest

from benchmarks.metrics import COMPLETED, SloSpec, Timeline, meets_slo, playback_pause_s, text_ready_times

SLO = SloSpec(ttfa_target_s=0.200, stall_threshold_s=0.010)


def timeline(times, audio, ready):
    return Timeline(sent_s=0.0, outcome=COMPLETED, chunk_times_s=tuple(times), chunk_audio_s=tuple(audio),
                    chunk_text_ready_s=tuple(ready))


def test_a_pause_while_the_text_was_not_yet_sent_is_not_the_servers():
    # The buffer runs dry at 0.5 s; the second chunk's text was all sent only at 0.9 s and it came at 0.95 s.
    tl = timeline((0.1, 0.95), (0.4, 0.4), (0.0, 0.9))
    assert playback_pause_s(tl) == pytest.approx(0.05)  # 0.9 -> 0.95 only
    same_without_text = Timeline(sent_s=0.0, outcome=COMPLETED, chunk_times_s=(0.1, 0.95), chunk_audio_s=(0.4, 0.4))
    assert playback_pause_s(same_without_text) == pytest.approx(0.45)
    assert not meets_slo(tl, SLO)
    assert meets_slo(timeline((0.1, 0.905), (0.4, 0.4), (0.0, 0.9)), SLO)  # 5 ms: under the 10 ms threshold


def test_text_ready_before_the_buffer_ran_dry_leaves_the_whole_pause_to_the_server():
    tl = timeline((0.1, 0.7, 1.5), (0.4, 0.4, 0.4), (0.0, 0.2, 0.3))
    assert playback_pause_s(tl) == pytest.approx(0.2 + 0.4)  # dry at 0.5 (came 0.7), then at 1.1 (came 1.5)


def test_text_ready_times_spread_the_words_evenly_over_the_audio():
    words = [0.0, 0.1, 0.2, 0.3]  # word i sent at i / 10 s
    # four chunks of equal audio: each needs one more word; the last needs the end message too
    assert text_ready_times([1, 1, 1, 1], words, end_sent_s=0.35) == (0.0, 0.1, 0.2, 0.35)
    # with one word of lookahead each chunk needs the next word as well (never past the last)
    assert text_ready_times([1, 1, 1, 1], words, 0.35, lookahead_words=1) == (0.1, 0.2, 0.3, 0.35)
    # a chunk ending at 3/8 of the audio needs ceil(1.5) = 2 words; a header-only chunk needs none
    assert text_ready_times([0, 3, 5], words, None) == (-math.inf, 0.1, 0.3)
    assert text_ready_times([1, 1], [], 0.2) == (-math.inf, -math.inf)


def test_ready_times_must_match_the_chunks():
    with pytest.raises(ValueError):
        timeline((0.1, 0.2), (0.1, 0.1), (0.0,))
